"""Input substitution for the isolated pass: the fast path for plain containers equals the generic walk."""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from pytest_rocm_parity.runner.engine import substitute
from pytest_rocm_parity.runner.tree import map_tensors, tensor_leaves

Pair = namedtuple("Pair", "a b")


@dataclass
class Box:
    x: torch.Tensor


CASES = {
    "hf-decoder-layer": ((torch.ones(2, 3),), {"attention_mask": None, "position_ids": torch.arange(3),
                                               "position_embeddings": (torch.ones(3, 4), torch.zeros(3, 4)),
                                               "use_cache": False}),
    "lists-and-dicts": ([torch.ones(2), {"k": [torch.zeros(1), 3]}], {"w": {"v": torch.full((2,), 2.0)}}),
    "namedtuple": ((Pair(torch.ones(1), torch.zeros(1)),), {}),
    "dataclass": ((Box(torch.ones(2)),), {"b": Box(torch.zeros(2))}),
    "int-keys": ((), {"d": {0: torch.ones(1)}}),
}


def _generic(args: Any, kwargs: Any, keys: dict[str, str], fetch: Any) -> tuple[Any, Any]:
    new = map_tensors({"args": args, "kwargs": kwargs}, lambda p, t: fetch(keys[p]).to(t.device) if p in keys else t)
    return tuple(new["args"]), new["kwargs"]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("which", ["all", "some"])
def test_fast_substitution_equals_the_generic_walk(case: str, which: str) -> None:
    args, kwargs = CASES[case]
    leaves = tensor_leaves({"args": args, "kwargs": kwargs})
    paths = sorted(leaves) if which == "all" else sorted(leaves)[::2]
    keys = {p: f"g/{i}" for i, p in enumerate(paths)}
    goldens = {k: torch.full_like(leaves[p], 100.0 + i) for i, (p, k) in enumerate(keys.items())}
    fast = substitute(args, kwargs, keys, goldens.__getitem__, None, None)
    slow = _generic(args, kwargs, keys, goldens.__getitem__)
    got, want = tensor_leaves({"args": fast[0], "kwargs": fast[1]}), tensor_leaves({"args": slow[0], "kwargs": slow[1]})
    assert got.keys() == want.keys() == leaves.keys()
    for p in got:
        assert torch.equal(got[p], want[p]), p
        assert (got[p] is leaves[p]) == (p not in keys)        # untouched leaves are the same objects
    # the caller's containers are not modified
    assert all(t is leaves[p] for p, t in tensor_leaves({"args": args, "kwargs": kwargs}).items())
    assert type(fast[1].get("position_embeddings", ())) is tuple
