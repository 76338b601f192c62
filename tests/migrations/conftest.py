"""Each test compiles with its own backend: Dynamo's caches (keyed by code object, shared by every
nn.Module's _call_impl) must not carry one test's compiled graphs into the next."""
from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
