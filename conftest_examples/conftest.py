"""Example suite: the byte-level Llama of examples/bytellama, judged against goldens captured on an H200.

Copy this pattern for your own model: build it deterministically (committed or seeded weights),
build inputs on the CPU (backend RNG streams differ), and let `parity` do the rest.
    pytest --rocm-parity conftest_examples                       # replay (CI, candidate)
    pytest --rocm-parity --parity-regen='bytellama*' conftest_examples   # recapture (reference GPU)
"""
from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def bytellama() -> Any:
    import torch

    from bytellama import load_bytellama

    return load_bytellama(dtype=torch.float32)


@pytest.fixture(scope="session")
def heldout_batch() -> Any:
    from bytellama import eval_batch

    return eval_batch(batch=2, seq=96)
