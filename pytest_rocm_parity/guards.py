"""How the fixture turns the plugin's own errors into a clean test failure, and checks the model
and input arguments: shared by every check (api, llm) without importing them."""
from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import pytest

from pytest_rocm_parity.errors import GoldenExists, InputError, InvalidArgument, ParityError


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


F = TypeVar("F", bound=Callable[..., Any])


def known_keywords(fn: F) -> F:
    """``fn`` refusing a misspelt keyword with a clean failure that says what was meant: Python's own
    TypeError names the keyword but not the right one, and shows a traceback into the plugin."""
    params = inspect.signature(fn).parameters
    keywords = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        unknown = [k for k in kwargs if k not in params]
        if unknown:
            hints = [f"{k!r}: did you mean {m[0]!r}?" for k in unknown
                     if (m := difflib.get_close_matches(k, keywords, n=1))]
            fail_once(InvalidArgument(
                f"{fn.__name__}() got unknown keyword argument{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))}{' (' + '; '.join(hints) + ')' if hints else ''}; its keywords are "
                f"{', '.join(keywords)}"))
        return fn(*args, **kwargs)
    return cast(F, checked)


def require_model(model: Any) -> None:
    import torch

    from pytest_rocm_parity.runner.wrappers import refuse_graphs, unwrap

    if not isinstance(model, torch.nn.Module):
        raise InvalidArgument(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    refuse_graphs(unwrap(model))
    on_meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if on_meta:
        raise InvalidArgument(
            f"model: {len(on_meta)} parameter(s) or buffer(s) are on the meta device (first: {on_meta[0]}), "
            f"which holds shapes but no values, so there is nothing to run or compare. Materialize the "
            f"weights first: model.to_empty(device='cpu') then model.load_state_dict(state_dict), or load "
            f"the model without init_empty_weights / device_map='meta'")


def require_inputs(inputs: Any) -> None:
    """InvalidArgument for inputs of no supported form (a generator, a set), InputError for a tensor
    input on the meta device (shapes without values: nothing to run): before any golden is looked
    up, so that neither a capture nor a replay sends the user to the other first; and for an input
    object that holds tensors where no golden records them (a key/value cache)."""
    import torch

    from pytest_rocm_parity.runner.engine import normalize_inputs
    from pytest_rocm_parity.runner.tree import iter_leaves, tensor_leaves

    normalize_inputs(inputs)
    for path, leaf in iter_leaves(inputs):
        if not isinstance(leaf, torch.Tensor) and _holds_tensors(leaf):
            raise InvalidArgument(
                f"inputs: {path or 'the input'} is an object of type {type(leaf).__name__} that holds tensors (a "
                f"key/value cache, a mask object): a golden records the tensors of tuples, lists, dicts and "
                f"dataclasses only, so the replay could not feed it the captured values, and a capture runs the "
                f"model several times, each run changing a cache it is given. Pass what builds it instead: the "
                f"whole sequence (prefix and new tokens) with use_cache=False; for a decoder's cached decoding, "
                f"check_lm judges it (docs/lm.md)")

    on_meta = [p for p, t in tensor_leaves(inputs).items() if t.is_meta]
    if on_meta:
        raise InputError(f"inputs: {len(on_meta)} tensor(s) are on the meta device (first: {on_meta[0] or 'the input'}),"
                         f" which holds shapes but no values. Build the inputs on the CPU (a seeded torch.Generator "
                         f"keeps them the same on every machine)")


TOKEN_INPUTS = ("input_ids", "decoder_input_ids")


def require_token_ids(inputs: Any, vocab: int | None) -> None:
    """InputError for a token id outside [0, ``vocab``) in an input named as token ids: the embedding
    lookup would fail inside the model, first in the meta-device pass that sizes the default depth,
    whose error speaks of meta tensors."""
    import torch

    from pytest_rocm_parity.runner.tree import tensor_leaves

    if vocab is None:
        return
    for path, t in tensor_leaves(inputs).items():
        name = path.rpartition(".")[2]
        if name not in TOKEN_INPUTS or t.is_floating_point() or t.is_complex() or t.dtype is torch.bool:
            continue
        bad = (t < 0) | (t >= vocab)
        if bool(bad.any()):
            idx = tuple(int(i) for i in bad.nonzero()[0])
            raise InputError(f"{name}: token id {int(t[idx])} at index {idx} is outside the model's vocabulary "
                             f"[0, {vocab}); check the tokenizer matches the model")


def _holds_tensors(obj: Any, depth: int = 4) -> bool:
    """Whether an object the input walk keeps whole holds a tensor in its attributes, a few levels
    down (a transformers Cache keeps them in layer objects)."""
    if depth < 0 or obj is None or isinstance(obj, (bool, int, float, str, bytes, type)):
        return False
    import torch

    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
    else:
        items = list(getattr(obj, "__dict__", {}).values())
    return any(_holds_tensors(v, depth - 1) for v in items[:64])


def require_trainable(model: Any) -> None:
    """InvalidArgument for a model with no parameter that requires grad: a training check judges gradients."""
    if not any(p.requires_grad for p in model.parameters()):
        raise InvalidArgument("model: no parameter requires grad, so a training step changes nothing to judge. "
                              "Unfreeze the parameters it trains (p.requires_grad_(True); for an adapter, its own "
                              "parameters)")
