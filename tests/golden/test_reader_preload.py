"""A rung reader's preload: in the caller's thread, or by a thread while the caller goes on."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pytest_rocm_parity.errors import GoldenCorrupt
from pytest_rocm_parity.golden.store import RungReader


def _loaders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "parity-golden-load"]


@pytest.fixture
def golden(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(1000 + i, generator=g) for i in range(6)}
    path = tmp_path / "rung.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def test_a_background_preload_serves_the_same_tensors_and_stops_at_the_budget(golden: tuple[Path, dict]) -> None:
    path, tensors = golden
    reader = RungReader(path, "cpu")
    order = ["t3", "t0", "t5", "t1"]
    budget = sum(reader.nbytes(k) for k in order[:3])
    assert reader.preload(order + ["absent"], budget, background=True) == budget
    for k in order + ["t2", "t4"]:   # t1 and the rest: beyond the budget, read on demand
        assert torch.equal(reader.get(k), tensors[k]), k
    reader.release()
    assert not _loaders()


def test_a_tensor_the_background_load_cannot_read_is_named_by_get(golden: tuple[Path, dict]) -> None:
    path, tensors = golden
    reader = RungReader(path, "cpu")
    # the file cut short after it was opened (another writer): the last tensor's bytes are gone
    os.truncate(path, path.stat().st_size - 400)
    last = max(tensors, key=lambda k: reader.header[k]["data_offsets"][1])
    keys = sorted(tensors, key=lambda k: reader.header[k]["data_offsets"][0])
    reader.preload(keys, 1 << 30, background=True)
    for k in keys:
        if k == last:
            with pytest.raises(GoldenCorrupt, match=f"{last}.*cut short"):
                reader.get(k)
        else:
            assert torch.equal(reader.get(k), tensors[k])
    reader.release()


def test_release_stops_a_background_load(golden: tuple[Path, dict]) -> None:
    path, _ = golden
    reader = RungReader(path, "cpu")
    reader.preload(sorted(reader.keys) * 1, 1 << 30, background=True)
    reader.release()
    assert not _loaders()
    assert reader.get("t0").numel() == 1000   # read on demand after the release
