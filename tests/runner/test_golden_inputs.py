"""The golden inputs a level's calls get: each call its own copy, equal bit for bit to the golden,
aligned as a fresh allocation, and the reader's tensors untouched by whatever a call writes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_rocm_parity.golden.store import GoldenStore, RungReader
from pytest_rocm_parity.runner.golden_inputs import GoldenInputs

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs a CUDA or ROCm GPU")])


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 37, generator=g, dtype=torch.float64)   # odd sizes: packed copies would be unaligned
    return {
        "in/a/bf16": base.to(torch.bfloat16), "in/b/bf16": base[:, :5].contiguous().to(torch.bfloat16),
        "in/c/f32": base.float(), "in/d/i64": torch.randint(-9, 9, (5, 3), generator=g),
        "in/e/bool": torch.rand(11, generator=g) > 0.5, "in/f/c64": torch.randn(4, generator=g, dtype=torch.complex64),
        "in/g/e4m3": torch.randint(0, 256, (7,), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn),
        "in/h/scalar": torch.tensor(2.5), "in/i/empty": torch.zeros(0, 4), "in/j/bf16": base.T.contiguous().bfloat16(),
    }


def _reader(tmp_path: Path, device: str, preload: bool = True) -> tuple[RungReader, dict[str, torch.Tensor]]:
    tensors = _inputs()
    store = GoldenStore(tmp_path)
    manifest = {"format": 1, "name": "ins", "dtypes": ["float32"],
                "rungs": {"float32": {"outputs": {"out": {}}, "layers": [], "order": []}}, "layers": []}
    store.write("ins", manifest, {"float32": tensors}, overwrite=True)
    reader = RungReader(store.rung_file("ins", store.read_manifest("ins"), "float32"), device)
    if preload:
        reader.preload(sorted(tensors), 1 << 40)
    return reader, tensors


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.contiguous().reshape(-1).view(torch.uint8)


def _calls(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    """One call per golden input, in the order of the dict (the call order)."""
    layers = {f"m{i}": {"in": {"args.0": k}} for i, k in enumerate(tensors)}
    return layers, [(f"m{i}", "args.0") for i in range(len(tensors))]


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_each_call_gets_its_own_aligned_copy_of_what_the_reader_holds(tmp_path: Path, device: str) -> None:
    reader, tensors = _reader(tmp_path, device)
    layers, pairs = _calls(tensors)
    inputs = GoldenInputs(reader, layers)
    inputs.plan(pairs)
    got = [inputs.take(*p) for p in pairs]
    for (key, path), t in zip(pairs, got):
        gk = layers[key]["in"][path]
        held = reader.get(gk)
        assert (t.dtype, t.shape, t.device.type) == (held.dtype, held.shape, held.device.type), gk
        assert torch.equal(_bits(t), _bits(tensors[gk])), gk
        if t.numel():
            assert t.data_ptr() != held.data_ptr(), gk
            assert t.data_ptr() % 64 == 0, f"{gk}: a copy at {t.data_ptr() % 512} bytes past an aligned address"
    # a call that writes its copy changes nothing another call or the reader sees
    for t in got:
        if t.numel() and t.dtype in (torch.bfloat16, torch.float32):
            t.fill_(7)
    for (key, path), t in zip(pairs, got):
        gk = layers[key]["in"][path]
        assert torch.equal(_bits(reader.get(gk)), _bits(tensors[gk])), gk


def test_a_level_larger_than_the_window_is_copied_in_pieces_in_call_order(tmp_path: Path) -> None:
    reader, tensors = _reader(tmp_path, "cpu")
    layers, pairs = _calls(tensors)
    window = 600   # bytes: a few inputs at a time
    inputs = GoldenInputs(reader, layers, ahead_bytes=window)
    inputs.plan(pairs)
    storages = set()
    for key, path in pairs:
        t = inputs.take(key, path)
        gk = layers[key]["in"][path]
        assert torch.equal(_bits(t), _bits(tensors[gk])), gk
        nbytes = t.numel() * t.element_size()
        if nbytes:
            storage = t.untyped_storage()
            assert storage.nbytes() <= max(window, nbytes) + 512 * len(tensors), gk
            storages.add(storage.data_ptr())
    assert len(storages) > 2   # several pieces, none holding the whole level


def test_an_input_taken_twice_or_read_lazily_is_a_copy_of_its_own(tmp_path: Path) -> None:
    reader, tensors = _reader(tmp_path, "cpu")
    layers, pairs = _calls(tensors)
    inputs = GoldenInputs(reader, layers)
    inputs.plan(pairs)
    first = inputs.take(*pairs[0])
    again = inputs.take(*pairs[0])   # the call made a second time
    assert torch.equal(first, again) and again.data_ptr() != first.data_ptr()
    assert again.data_ptr() != reader.get(layers[pairs[0][0]]["in"]["args.0"]).data_ptr()

    lazy, _ = _reader(tmp_path / "lazy", "cpu", preload=False)
    inputs = GoldenInputs(lazy, layers)
    inputs.plan(pairs)
    for key, path in pairs:
        gk = layers[key]["in"][path]
        assert not lazy.holds(gk) and torch.equal(_bits(inputs.take(key, path)), _bits(tensors[gk])), gk
