"""A replay's goldens load in a thread in the order the passes first read them, and only those a
passing replay reads (replay.preload_order): a pass that asks for a tensor behind one it reads later
waits for the load in between, and a tensor loaded but never read (a fast replay's logits truth is a
ninth of a 1.1B golden) is time the cold replay spends for nothing."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_rocm_parity.golden.reader import RungReader

from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import preload_order, replay
from tests.parity_models import llama, mixtral


def _judged_too(*args: Any) -> None:
    """An extra judge, as a language model's check adds: the replay runs the full passes for it."""


@pytest.mark.parametrize("mode", ["fast", "full", "fast with an extra judge"])
@pytest.mark.parametrize("family,drill", [("llama", 1), ("llama", 2), ("mixtral", 0), ("mixtral", 1),
                                          ("mixtral", 2)])
def test_a_replay_first_reads_the_loaded_goldens_in_the_order_they_are_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, family: str, drill: int) -> None:
    model = llama() if family == "llama" else mixtral()
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    spec = CheckSpec(name="m", dtypes=["float32"], drill=drill, replay=mode.split()[0])
    store = GoldenStore(tmp_path)
    manifest = capture(model, {"input_ids": ids}, spec, store, "cpu")
    meta = manifest["rungs"]["float32"]

    first: list[str] = []
    loaded: list[list[str]] = []
    get, preload = RungReader.get, RungReader.preload

    def spy_get(self: RungReader, key: str) -> Any:
        if key not in first:
            first.append(key)
        return get(self, key)

    def spy_preload(self: RungReader, keys: Any, max_bytes: int, background: bool = False) -> int:
        loaded.append(list(keys))
        return preload(self, keys, max_bytes, background)
    monkeypatch.setattr(RungReader, "get", spy_get)
    monkeypatch.setattr(RungReader, "preload", spy_preload)
    if "judge" in mode:
        spec.extra_judge = _judged_too
    (res,) = replay(model, {"input_ids": ids}, spec, store, "cpu")
    assert res.passed, res.summary()

    (order,) = loaded
    keys = set(order)
    assert order == preload_order(meta, sorted(RungReader(store.rung_file("m", manifest, "float32"), "cpu").keys),
                                  mode == "fast")
    assert not [k for k in first if k not in keys], "read but not loaded"
    assert not [k for k in keys if k not in first], ("loaded but never read", [k for k in keys if k not in first], mode)
    rank = {k: i for i, k in enumerate(order)}
    read = [k for k in first if k in keys]
    assert len(read) > 10
    behind = [(a, b) for a, b in zip(read, read[1:]) if rank[b] < rank[a]]
    assert not behind, f"read before a tensor loaded ahead of it: {behind[:3]}"
