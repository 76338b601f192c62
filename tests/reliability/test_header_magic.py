"""A safetensors header whose length begins with pickle's magic bytes is still a safetensors file.

A 640-byte header starts the file with 80 02 (pickle protocol 2); found when a capture's header
happened to have that length. Real pickles and zips are still refused.
"""
from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest
import torch

from pytest_rocm_parity.errors import GoldenCorrupt
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import check_safetensors


def _file_with_header_length(path: Path, n: int) -> Path:
    head = json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    head = head + b" " * (n - len(head))
    path.write_bytes(struct.pack("<Q", n) + head + struct.pack("<2f", 1.5, -2.0))
    return path


@pytest.mark.parametrize("n", [0x280, 0x380, 0x480, 0x580, 0x10280])
def test_header_lengths_that_look_like_pickle_magic(tmp_path: Path, n: int) -> None:
    p = _file_with_header_length(tmp_path / "g.safetensors", n)
    assert p.read_bytes()[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
    assert set(check_safetensors(p)) == {"x"}
    assert RungReader(p, "cpu").get("x").tolist() == [1.5, -2.0]


def test_real_pickle_still_refused(tmp_path: Path) -> None:
    p = tmp_path / "g.safetensors"
    p.write_bytes(pickle.dumps({"x": [1.0, 2.0]}, protocol=2))
    with pytest.raises(GoldenCorrupt, match="pickle"):
        check_safetensors(p)
    torch.save({"x": torch.ones(2)}, tmp_path / "t.safetensors")
    with pytest.raises(GoldenCorrupt, match="pickle"):
        check_safetensors(tmp_path / "t.safetensors")
