"""What a preload holds must be what a lazy read returns, bit for bit, for every dtype a golden
stores, on the CPU (where replay preloads a small golden) and on a GPU."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_rocm_parity.errors import GoldenCorrupt
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import GoldenStore

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs a CUDA or ROCm GPU")])


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 37, generator=g, dtype=torch.float64)
    out = {f"f/{d}": base.to(getattr(torch, d)) for d in ("bfloat16", "float16", "float32", "float64")}
    out.update({
        "i/int64": torch.randint(-9, 9, (5, 3), generator=g), "i/int32": torch.randint(-9, 9, (4,), generator=g,
                                                                                          dtype=torch.int32),
        "i/bool": torch.rand(11, generator=g) > 0.5, "i/uint8": torch.randint(0, 255, (6,), generator=g,
                                                                                dtype=torch.uint8),
        "c/complex64": torch.randn(4, generator=g, dtype=torch.complex64),
        "c/complex128": torch.randn(4, generator=g, dtype=torch.complex128),
        "q/e4m3": torch.randint(0, 256, (7,), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn),
        "q/e8m0": torch.randint(0, 256, (7,), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu),
        "s/scalar": torch.tensor(2.5), "s/empty": torch.zeros(0, 4),
        "f/large": torch.randn(1 << 20, generator=g),
    })
    return out


def _same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    a, b = got.cpu(), want
    if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _golden(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = _tensors()
    store = GoldenStore(tmp_path)
    manifest = {"format": 1, "name": "all", "dtypes": ["float32"],
                "rungs": {"float32": {"outputs": {"out": {}}, "layers": [], "order": []}}, "layers": []}
    store.write("all", manifest, {"float32": tensors}, overwrite=True)
    return store.rung_file("all", store.read_manifest("all"), "float32"), tensors


@pytest.mark.parametrize("background", [False, True], ids=["now", "background"])
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_preload_holds_what_a_lazy_read_returns_for_every_stored_dtype(tmp_path: Path, device: str,
                                                                         background: bool) -> None:
    _held_as_read(tmp_path, device, background)


@pytest.mark.parametrize("device", [CUDA])
def test_a_gpu_background_load_through_buffers_smaller_than_its_tensors_holds_the_same(
        tmp_path: Path, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's background load reads the file through two pinned buffers (golden.reader.STREAM_CHUNK
    bytes): a tensor split across as many fills as it needs and several small ones sharing one."""
    from pytest_rocm_parity.golden import reader

    monkeypatch.setattr(reader, "STREAM_CHUNK", 4096)
    _held_as_read(tmp_path, device, True)


def _held_as_read(tmp_path: Path, device: str, background: bool) -> None:
    path, tensors = _golden(tmp_path)
    held = RungReader(path, device)
    keys = sorted(tensors)
    # loaded in reverse order, asked for in order: the first asked for is the last loaded
    assert held.preload(reversed(keys), 1 << 40, background=background) == sum(held.nbytes(k) for k in keys)
    lazy = RungReader(path, device)
    for key in keys:
        assert held.holds(key), key
        got, want = held.get(key), lazy.get(key)
        assert (got.dtype, tuple(got.shape), got.device.type) == (want.dtype, tuple(want.shape), want.device.type), key
        assert _same_bytes(got, tensors[key]), key


@pytest.mark.parametrize("background", [False, True], ids=["now", "background"])
def test_a_preload_within_a_budget_loads_a_prefix_and_leaves_the_rest_lazy(tmp_path: Path, background: bool) -> None:
    path, tensors = _golden(tmp_path)
    r = RungReader(path, "cpu")
    keys = sorted(tensors)
    budget = r.nbytes(keys[0]) + r.nbytes(keys[1])
    assert r.preload(keys, budget, background=background) == budget
    assert [k for k in keys if r.holds(k)] == keys[:2]
    assert torch.equal(r.get(keys[2]), tensors[keys[2]]) and not r.holds(keys[2])   # read when asked


def test_a_file_cut_short_after_opening_is_named_corrupt_by_the_preload(tmp_path: Path) -> None:
    path, tensors = _golden(tmp_path)
    r = RungReader(path, "cpu")
    raw = path.read_bytes()
    path.write_bytes(raw[:-100])   # the header still read, the last tensor's bytes gone
    with pytest.raises(GoldenCorrupt, match="cut short") as e:
        r.preload(sorted(tensors), 1 << 40)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_file_cut_short_is_named_corrupt_by_a_background_load_for_every_tensor_it_did_not_load(
        tmp_path: Path, device: str) -> None:
    """A tensor the load never reached is named corrupt when asked for, and again when asked again
    (the replay's thread does not wait on a load that stopped); one loaded before the damage is served."""
    path, tensors = _golden(tmp_path)
    r = RungReader(path, device)
    header_len = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    last = max(tensors, key=lambda k: r.header[k]["data_offsets"][1])
    first = min((k for k in tensors if r.nbytes(k)), key=lambda k: r.header[k]["data_offsets"][0])
    raw = path.read_bytes()
    path.write_bytes(raw[:header_len + r.header[last]["data_offsets"][0] + 1])   # the last tensor's bytes cut
    r.preload([first, last], 1 << 40, background=True)
    assert torch.equal(r.get(first).cpu().reshape(-1).view(torch.uint8),
                       tensors[first].contiguous().reshape(-1).view(torch.uint8))
    with pytest.raises(GoldenCorrupt, match="cut short") as e:
        r.get(last)
    assert str(path) in str(e.value)
    with pytest.raises(GoldenCorrupt, match="cut short"):   # asked again: the same error, no hang
        r.get(last)
    r.release()


def test_a_reader_released_while_it_loads_stops_and_holds_nothing(tmp_path: Path) -> None:
    path, tensors = _golden(tmp_path)
    r = RungReader(path, "cpu")
    r.preload(sorted(tensors), 1 << 40, background=True)
    r.release()
    assert not any(r.holds(k) for k in tensors)
    assert torch.equal(r.get("f/large"), tensors["f/large"])   # read when asked again


def test_a_background_load_that_fails_for_want_of_memory_leaves_its_tensors_to_be_read_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only damage to the file is the golden's fault: an allocation that fails in the loading thread
    (a GPU's memory taken by the forward beside it) is no reason to call the golden corrupt."""
    import threading

    path, tensors = _golden(tmp_path)
    read = RungReader._read_cpu

    def short_of_memory(self: RungReader, key: str) -> Any:
        if threading.current_thread().name == "parity-load" and key == "f/large":
            raise RuntimeError("out of memory")
        return read(self, key)
    monkeypatch.setattr(RungReader, "_read_cpu", short_of_memory)
    r = RungReader(path, "cpu")
    keys = sorted(tensors)
    r.preload(keys, 1 << 40, background=True)
    assert all(_same_bytes(r.get(key), tensors[key]) for key in keys)
    r.release()
