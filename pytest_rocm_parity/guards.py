"""How the fixture turns the plugin's own errors into a clean test failure, and checks the model
argument: shared by every check (api, llm) without importing them."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_rocm_parity.errors import GoldenExists, InvalidArgument, ParityError


@contextlib.contextmanager
def clean_errors() -> Iterator[None]:
    """Show the plugin's own errors as a clean failure message, not a traceback into the core."""
    __tracebackhide__ = True
    try:
        yield
    except GoldenExists:
        raise
    except ParityError as exc:
        fail_once(exc)


def fail_once(exc: BaseException) -> None:
    """Fail the test with the error's message once: without the chained original printed above it."""
    __tracebackhide__ = True
    raise pytest.fail.Exception(f"{type(exc).__name__}: {exc}", pytrace=False) from None


def require_model(model: Any) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise InvalidArgument(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    on_meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if on_meta:
        raise InvalidArgument(
            f"model: {len(on_meta)} parameter(s) or buffer(s) are on the meta device (first: {on_meta[0]}), "
            f"which holds shapes but no values, so there is nothing to run or compare. Materialize the "
            f"weights first: model.to_empty(device='cpu') then model.load_state_dict(state_dict), or load "
            f"the model without init_empty_weights / device_map='meta'")
