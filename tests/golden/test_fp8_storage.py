"""FP8 codes and MX scales are stored dtype-exact: the four FP8 dtypes safetensors knows as
themselves, e8m0 scales as their bytes with the dtype in the header, read back bit for bit."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from pytest_rocm_parity.errors import GoldenCorrupt
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import GoldenStore

DTYPES = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]


def _write(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> tuple[GoldenStore, dict]:
    store = GoldenStore(tmp_path)
    manifest = {"format": 1, "name": "fp8", "dtypes": ["bfloat16"], "rungs": {"bfloat16": {"outputs": {"out": {}}, "layers": [], "order": []}}, "layers": []}
    store.write("fp8", manifest, {"bfloat16": tensors}, overwrite=True)
    return store, store.read_manifest("fp8")


def test_every_fp8_dtype_round_trips_bit_exact(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name in DTYPES:
        dtype = getattr(torch, name)
        bits = torch.randint(0, 256, (7, 5), dtype=torch.uint8, generator=g)
        tensors[f"t/{name}"] = bits.view(dtype)
    store, manifest = _write(tmp_path, tensors)
    reader = RungReader(store.rung_file("fp8", manifest, "bfloat16"), "cpu", manifest["rungs"]["bfloat16"]["sha256"])
    for key, want in tensors.items():
        got = reader.get(key)
        assert got.dtype == want.dtype, key
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), key


def test_a_byte_view_of_an_unknown_dtype_is_refused_as_corrupt(tmp_path: Path) -> None:
    store, manifest = _write(tmp_path, {"s": torch.ones(4).to(torch.float8_e8m0fnu)})
    path = store.rung_file("fp8", manifest, "bfloat16")
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["__metadata__"]["byte_views"] = json.dumps({"s": "int64"})
    text = json.dumps(header, separators=(",", ":")).encode()
    text = text + b" " * (n - len(text))
    assert len(text) == n
    path.write_bytes(raw[:8] + text + raw[8 + n:])
    with pytest.raises(GoldenCorrupt, match="byte_views"):
        RungReader(path, "cpu")
