"""The fast capture path writes the goldens the plain algorithm writes.

CPU tests pin the bytes: a rung file equals one built by a plain re-implementation (host clones
deduplicated by identity, a float64 copy of the model, residual ``(truth.double() - ref.double()).to(rdt)``),
and the recording pass reports every selected call in execution order. The ``gpu`` tests check the
CUDA machinery (pinned asynchronous copies, the float64 model built on the device, residuals
computed there) against synchronous host copies and the host route.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from parity_models import llama
from pytest_rocm_parity.runner import capture as cap
from pytest_rocm_parity.judging import dtypes as dt
from pytest_rocm_parity.runner.capture import RecordPool, residual, truth_model, capture, merge_repeats, recording_pass
from pytest_rocm_parity.runner.engine import OUTPUT, CheckSpec, cast_inputs, normalize_inputs, prepare_model
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.selection import select
from pytest_rocm_parity.runner.tree import map_tensors, tensor_leaves

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm device")


class Block(nn.Module):
    def __init__(self, d: int, inplace: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.ReLU(inplace=inplace)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x + scale * self.fc2(self.act(self.fc1(self.norm(x))))


class Net(nn.Module):
    """Blocks, a module called twice, a tied head, a non-contiguous and a constant output leaf."""

    def __init__(self, d: int = 16, n: int = 3, vocab: int = 40, inplace: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, inplace) for _ in range(n))
        self.shared = Block(d, inplace)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor, scale: float = 1.0) -> dict[str, Any]:
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h, scale=scale)
        h = self.shared(self.shared(h))
        return {"logits": self.head(h), "last": h.transpose(0, 1), "n": int(ids.shape[0])}


def _net(inplace: bool = False) -> Net:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return Net(inplace=inplace)


def _net_inputs() -> dict[str, Any]:
    return {"ids": torch.randint(0, 40, (3, 7), generator=torch.Generator().manual_seed(1)), "scale": 0.5}


def _llama() -> tuple[nn.Module, dict[str, Any]]:
    pytest.importorskip("transformers")
    with torch.random.fork_rng():
        model = llama(hidden_size=32, intermediate_size=64, vocab_size=61, max_position_embeddings=32)
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "use_cache": False}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (NaN payloads and -0.0 included), for exact comparison."""
    return t.reshape(-1).contiguous().view(torch.uint8)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _same_bits_but_nan_payload(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal except that a NaN may carry another payload (CUDA converts NaN to its canonical one)."""
    nan = torch.isnan(a)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(nan, torch.isnan(b)) \
        and _same_bits(a[~nan], b[~nan])


# ---------------------------------------------------------------------------------------------
# a plain re-implementation of one rung


class _Recorder:
    """Forward (pre-)hooks of its own: call keys, deduplicated host clones, each call's inputs."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        self.pool: dict[str, torch.Tensor] = {}
        self.key_of: dict[int, str] = {}
        self.alive: list[torch.Tensor] = []
        self.order: list[str] = []
        self.calls: dict[str, int] = {}
        self.stack: dict[str, list[str]] = {}
        self.ins: dict[str, dict[str, str]] = {}
        self.outs: dict[str, dict[str, str]] = {}
        self.inputs: dict[str, Any] = {}
        self.model_out: dict[str, str] = {}
        self.handles: list[Any] = []
        for name in names:
            mod = model.get_submodule(name)
            self.handles.append(mod.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self.handles.append(mod.register_forward_hook(self._post(name), with_kwargs=True))

    def put(self, t: torch.Tensor, fresh: bool = False) -> str:
        # one key per tensor object while its contents stay as recorded (a parent's `+=` on its
        # child's output, a reused buffer: a new key)
        k = self.key_of.get(id(t))
        if fresh or k is None or not _same_bits(self.pool[k], t.detach().cpu()):
            self.key_of[id(t)] = f"t/{len(self.pool)}"
            self.alive.append(t)
            self.pool[self.key_of[id(t)]] = t.detach().cpu().clone()   # synchronous, at hook time
        return self.key_of[id(t)]

    def _pre(self, name: str) -> Any:
        def hook(_m: Any, a: Any, kw: Any) -> None:
            k = self.calls.get(name, 0)
            self.calls[name] = k + 1
            key = name if k == 0 else f"{name}#{k}"
            self.stack.setdefault(name, []).append(key)
            self.order.append(key)
            tree = {"args": a, "kwargs": kw}
            self.ins[key] = {p: self.put(t) for p, t in tensor_leaves(tree).items()}
            self.inputs[key] = map_tensors(tree, lambda _p, t: t.detach().cpu().clone())
        return hook

    def _post(self, name: str) -> Any:
        def hook(_m: Any, _a: Any, _kw: Any, out: Any) -> None:
            key = self.stack[name].pop()
            # an output that is this call's own input object was changed in place: copied again
            self.outs[key] = {p: self.put(t, fresh=self.key_of.get(id(t)) in self.ins[key].values())
                              for p, t in tensor_leaves(out).items()}
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _record_plainly(model: nn.Module, selected: list[Any], args: Any, kwargs: Any) -> _Recorder:
    """The recording pass done the plain way: synchronous clones at hook time, model outputs last."""
    rec = _Recorder(model, [s.name for s in selected])
    with torch.inference_mode():
        out = model(*args, **kwargs)
    rec.remove()
    rec.model_out = {p: rec.put(t) for p, t in tensor_leaves(out).items()}
    return rec


def _up(tree: Any) -> Any:
    return map_tensors(tree, lambda _p, t: t.to(torch.float64) if t.is_floating_point() else t)


def _reference_rung(model: nn.Module, inputs: dict[str, Any], drill: int, rung: str) -> tuple[dict[str, torch.Tensor], _Recorder]:
    """Every tensor of the rung, computed the straightforward way on the CPU."""
    dtype = dt.to_torch(rung)
    rdt = dt.to_torch(dt.residual_dtype_name(rung))
    selected = select(model, None, drill)
    m = copy.deepcopy(model).to(dtype).eval()
    kwargs = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    tensors = {f"input/{p}": t.clone() for p, t in tensor_leaves({"args": (), "kwargs": kwargs}).items()}

    rec = _record_plainly(m, selected, (), kwargs)
    tensors.update(rec.pool)

    def residual(truth: torch.Tensor, ref_key: str) -> torch.Tensor:
        return (truth.double() - rec.pool[ref_key].double()).to(rdt)

    m64 = copy.deepcopy(m).to(torch.float64)
    top = [s.name for s in selected if s.level == 0]
    glob = _Recorder(m64, top)
    with torch.inference_mode():
        tout = m64(**_up(kwargs))
    glob.remove()
    for key, leaves in glob.outs.items():
        for p, k in leaves.items():
            if glob.pool[k].is_floating_point():
                tensors[f"gtruth/{key}/{p}"] = residual(glob.pool[k], rec.outs[key][p])
    for p, t in tensor_leaves(tout).items():
        if t.is_floating_point():
            tensors[f"gtruth/{OUTPUT}/{p}"] = residual(t, rec.model_out[p])
    for key in rec.order:   # local truth: each module call on its recorded inputs, in float64
        name = key.split("#")[0]
        a = _up(rec.inputs[key])
        with torch.inference_mode():
            lout = m64.get_submodule(name)(*a["args"], **a["kwargs"])
        for p, t in tensor_leaves(lout).items():
            if t.is_floating_point():
                tensors[f"truth/{key}/{p}"] = residual(t, rec.outs[key][p])
    return tensors, rec


def _rung_files(store: GoldenStore, name: str) -> dict[str, bytes]:
    m = store.read_manifest(name)
    return {r: store.rung_file(name, m, r).read_bytes() for r in m["rungs"]}


@pytest.mark.parametrize("which", ["net", "llama"])
def test_rung_files_equal_a_plain_reference(tmp_path: Path, which: str) -> None:
    model, inputs = _llama() if which == "llama" else (_net(), _net_inputs())
    rungs, drill = ["bfloat16", "float32"], 2
    store, ref_store = GoldenStore(tmp_path / "capture"), GoldenStore(tmp_path / "reference")
    capture(model, inputs, CheckSpec(name=which, dtypes=rungs, drill=drill), store, "cpu", env={})
    manifest = store.read_manifest(which)
    for rung in rungs:
        expected, rec = _reference_rung(model, inputs, drill, rung)
        got = RungReader(store.rung_file(which, manifest, rung), "cpu")
        assert got.keys == set(expected), sorted(got.keys ^ set(expected))[:10]
        differ = [k for k, t in expected.items() if not _same_bits(got.get(k), t)]
        assert not differ, f"{rung}: {differ[:10]}"
        layers = manifest["rungs"][rung]["layers"]
        assert manifest["rungs"][rung]["order"] == rec.order
        assert {e["key"]: (e["in"], e["out"]) for e in layers} == {k: (rec.ins[k], rec.outs[k]) for k in rec.order}
        # the same tensors written by the golden writer: the capture's file, byte for byte
        written: dict[str, Any] = {"rungs": {rung: {}}}
        ref_store.write(which, written, {rung: expected}, overwrite=True)
        ref_file = ref_store.dir_for(which) / written["rungs"][rung]["file"]
        assert ref_file.read_bytes() == store.rung_file(which, manifest, rung).read_bytes()
        assert ref_file.name == manifest["rungs"][rung]["file"]


def _unchanged(rec: Any) -> bool:
    """Whether no tensor handed on was written after it was recorded, as capture() asks."""
    rec.pool.check_repeats()
    return rec.pool.repeats_unchanged()


def test_recording_pass_reports_every_call_in_order_deduplicated() -> None:
    model = _net(inplace=True)   # ReLU(inplace=True) rewrites fc1's output after it was recorded
    selected = select(model, None, 2)
    args, kwargs = normalize_inputs(_net_inputs())
    ref = _record_plainly(model, selected, args, kwargs)
    rec = recording_pass(model, selected, args, kwargs)
    assert rec.order == ref.order
    # ReLU(inplace=True) wrote fc1's output after it was handed on: capture records again (resnap)
    assert not _unchanged(rec)
    assert _unchanged(recording_pass(_net(), selected, args, kwargs))
    rec = recording_pass(model, selected, args, kwargs, resnap=True)
    assert "shared#1" in rec.order and rec.order.index("blocks.2") < rec.order.index("shared")
    assert set(rec.entries) == set(rec.order)
    host = dict(rec.pool.tensors)
    merge_repeats(rec.pool, rec.entries, rec.outputs, host)   # as capture() does after the truth passes
    for key in rec.order:
        e = rec.entries[key]
        assert (e["in"], e["out"]) == (ref.ins[key], ref.outs[key]), key
    assert host.keys() == ref.pool.keys()   # one host copy per distinct tensor value
    assert len(host) < sum(len(e["in"]) + len(e["out"]) for e in rec.entries.values())
    differ = [k for k, t in ref.pool.items() if not _same_bits(host[k], t)]
    assert not differ   # the value at hook time, not after later in-place ops
    assert all(h.is_contiguous() and h.device.type == "cpu" for h in host.values())
    # a block's output is the next block's input, stored once
    assert rec.entries["blocks.0"]["out"]["0"] == rec.entries["blocks.1"]["in"]["args.0"]
    assert rec.entries["shared"]["out"]["0"] == rec.entries["shared#1"]["in"]["args.0"]
    assert rec.outputs["out"] == ref.model_out
    assert rec.outputs["out"]["logits"] == rec.entries["head"]["out"]["0"]
    assert rec.outputs["out"]["last"] not in {k for e in rec.entries.values() for k in e["out"].values()}
    assert rec.outputs["const"] == {"n": 3}
    assert rec.pool.alive == [] and rec.pool.by_id == {}


def test_pool_copies_cpu_tensors_at_add_time() -> None:
    pool = RecordPool()
    x = torch.arange(12.0).reshape(3, 4).t()
    k = pool.add(x)
    assert pool.add(x) == k and pool.add(x.clone()) != k
    x.add_(1)
    host = pool.tensors[k]
    assert torch.equal(host, torch.arange(12.0).reshape(3, 4).t()) and host.is_contiguous()
    assert host.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_truth_model_routes_give_the_same_float64_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _net()
    built = {}
    for route in (True, False):
        monkeypatch.setattr(cap, "TRUTH_ON_DEVICE", route)
        m = prepare_model(model, "cpu", torch.bfloat16)
        held = [m]
        tm, dev = truth_model(model, "cpu", torch.bfloat16, held)
        assert held == [] and dev == "cpu" and not tm.training
        assert tm.head.weight is tm.emb.weight   # tied weights stay tied
        assert all(p.dtype == torch.float64 for p in tm.parameters())
        assert m.emb.weight.dtype == torch.bfloat16   # the rung's model is untouched
        assert torch.equal(m.emb.weight.double(), tm.emb.weight)
        ptrs = {p.data_ptr() for p in m.parameters()}
        assert not ptrs & {p.data_ptr() for p in tm.parameters()}
        built[route] = tm.state_dict()
    assert built[True].keys() == built[False].keys()
    assert all(_same_bits(built[True][k], built[False][k]) for k in built[True])


def test_capture_routes_give_identical_goldens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {}
    for route in (True, False):
        monkeypatch.setattr(cap, "TRUTH_ON_DEVICE", route)
        store = GoldenStore(tmp_path / str(route))
        capture(_net(), _net_inputs(), CheckSpec(name="net", dtypes=["float16", "float32"], drill=1), store, "cpu", env={})
        files[route] = _rung_files(store, "net")
    assert files[True] == files[False]


@pytest.mark.parametrize("rdt", [torch.bfloat16, torch.float32, torch.float64])
def test_residual_is_the_float64_difference_rounded_once(rdt: torch.dtype) -> None:
    truth, ref = _residual_cases()
    assert _same_bits(residual(truth, ref, rdt), (truth.double() - ref.double()).to(rdt))
    z_truth = torch.complex(truth, -truth)
    z_ref = torch.complex(ref.float(), ref.float())
    narrow = torch.complex128 if rdt == torch.float64 else torch.complex64
    assert _same_bits(residual(z_truth, z_ref, rdt), (z_truth - z_ref.to(torch.complex128)).to(narrow))


def _residual_cases() -> tuple[torch.Tensor, torch.Tensor]:
    """float64 truths against bf16 references, with differences that sit on rounding boundaries."""
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(64, 33, dtype=torch.float64, generator=g)
    ref = truth.to(torch.bfloat16)
    edge = torch.tensor([1 + 2**-8 + 2**-40, 1 + 2**-24 + 2**-60, -(1 + 2**-8 - 2**-45), 2**-130, -0.0, 3e38 * 8,
                         float("inf"), float("nan")], dtype=torch.float64)
    truth[0, :edge.numel()] = edge
    ref[0, :edge.numel()] = 0
    return truth.t(), ref.t()   # non-contiguous, as a transposed output leaf is


# ---------------------------------------------------------------------------------------------
# CUDA (run on the reference GPU; skipped elsewhere)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("budget,hold", [(None, None), (None, 0), (0, 0), (None, 40_000)])
def test_pinned_pool_equals_synchronous_copies(monkeypatch: pytest.MonkeyPatch, budget: int | None,
                                               hold: int | None) -> None:
    if budget is not None:   # 0: every copy waits for the one before it (the throttle's path)
        monkeypatch.setattr(cap, "INFLIGHT_BYTES", budget)
    # hold None: every snapshot kept on the device and copied after; 0: all streamed during the
    # pass; 40,000 bytes: the first ones held, the rest streamed
    monkeypatch.setattr(cap, "DEVICE_HOLD_BYTES", hold)
    g = torch.Generator(device="cuda").manual_seed(0)
    tensors = [torch.randn(64, 1024, device="cuda", generator=g).to(dtype)
               for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64)]
    tensors += [torch.randn(33, 17, device="cuda", generator=g).t(),          # non-contiguous
                torch.randn(8, 8, device="cuda", generator=g, dtype=torch.complex64),
                torch.arange(100, device="cuda"), torch.arange(10, device="cuda") > 4,
                torch.tensor(2.5, device="cuda"), torch.empty(0, 5, device="cuda")]
    expected = [t.cpu().clone() for t in tensors]
    pool = RecordPool()
    keys = [pool.add(t) for t in tensors]
    assert pool.add(tensors[0]) == keys[0]   # seen again unwritten (its version counter says so): one key
    for t in tensors:   # queued after the copies on the compute stream: must not reach them
        if t.dtype == torch.bool:
            t.logical_not_()
        elif t.numel():
            t.mul_(3).add_(1)
    pool.release()
    del tensors
    # freed blocks, snapshots included, are up for reuse: without record_stream these would land there
    scratch = [torch.full((64, 1024), 7.0, device="cuda", dtype=dtype)
               for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64) for _ in range(4)]
    held = set(pool.device)
    assert (held == {k for k, t in zip(keys, expected) if t.numel()}) if hold is None else \
        (not held if hold == 0 else 0 < len(held) < len(keys))
    host = pool.tensors
    del scratch
    differ = [k for k, e in zip(keys, expected) if not _same_bits(host[k], e.contiguous())]
    assert all(_same_bits(pool.device[k].cpu(), host[k]) for k in held)   # the held snapshots too
    pool.drop_device()
    assert pool.device == {}
    assert not differ
    for k in keys:
        h = host[k]
        assert h.device.type == "cpu" and h.is_contiguous()
        assert h.is_pinned() or h.numel() == 0, k


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("hold", [None, 0])
def test_recording_pass_on_cuda_matches_synchronous_hooks(monkeypatch: pytest.MonkeyPatch, hold: int | None) -> None:
    """hold None: the tensors recorded again compared with their first record on the device; 0:
    every snapshot streamed to the host during the pass, compared there."""
    monkeypatch.setattr(cap, "DEVICE_HOLD_BYTES", hold)
    model = _net(inplace=True).to("cuda", torch.bfloat16).eval()
    selected = select(model, None, 2)
    args, kwargs = cast_inputs(*normalize_inputs(_net_inputs()), torch.bfloat16, "cuda")
    ref = _record_plainly(model, selected, args, kwargs)
    rec = recording_pass(model, selected, args, kwargs)
    assert rec.order == ref.order and not _unchanged(rec)   # ReLU(inplace=True): see the CPU test
    plain = _net().to("cuda", torch.bfloat16).eval()
    # held on the device, the repeats are compared there; streamed (hold 0), they count as changed
    assert _unchanged(recording_pass(plain, select(plain, None, 2), args, kwargs)) == (hold is None)
    rec.pool.drop_device()
    rec = recording_pass(model, selected, args, kwargs, resnap=True)
    host = dict(rec.pool.tensors)
    assert len(rec.pool.maybe) > 0
    merge_repeats(rec.pool, rec.entries, rec.outputs, host)
    assert {k: (e["in"], e["out"]) for k, e in rec.entries.items()} == {k: (ref.ins[k], ref.outs[k]) for k in ref.order}
    assert host.keys() == ref.pool.keys() and rec.outputs["out"] == ref.model_out
    differ = [k for k, t in ref.pool.items() if not _same_bits(host[k], t)]
    assert not differ
    assert all(h.is_pinned() or h.numel() == 0 for h in host.values())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("rdt", [torch.bfloat16, torch.float32, torch.float64])
def test_residual_on_cuda_has_the_host_bytes(rdt: torch.dtype) -> None:
    truth, ref = _residual_cases()
    host_formula = (truth.double() - ref.double()).to(rdt)
    copies = cap.HostCopies()
    on_device = residual(truth.to("cuda"), ref.contiguous().pin_memory(), rdt, copies)
    copies.finish()
    assert on_device.device.type == "cpu" and on_device.is_pinned()
    assert _same_bits_but_nan_payload(on_device, host_formula.contiguous())
    z_truth, z_ref = torch.complex(truth, -truth), torch.complex(ref.float(), ref.float()).contiguous()
    narrow = torch.complex128 if rdt == torch.float64 else torch.complex64
    z = residual(z_truth.to("cuda"), z_ref.pin_memory(), rdt, copies)
    copies.finish()
    assert _same_bits_but_nan_payload(z, (z_truth - z_ref.to(torch.complex128)).to(narrow).contiguous())


@pytest.mark.gpu
@needs_cuda
def test_truth_model_on_cuda_equals_the_host_route(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _net()
    built = {}
    for route in (True, False):
        monkeypatch.setattr(cap, "TRUTH_ON_DEVICE", route)
        tm, dev = truth_model(model, "cuda", torch.bfloat16, [prepare_model(model, "cuda", torch.bfloat16)])
        assert dev == "cuda" and tm.head.weight is tm.emb.weight
        assert all(p.device.type == "cuda" and p.dtype == torch.float64 for p in tm.parameters())
        built[route] = {k: v.cpu() for k, v in tm.state_dict().items()}
    assert all(_same_bits(built[True][k], built[False][k]) for k in built[True])
    monkeypatch.setattr(cap, "TRUTH_ON_DEVICE", None)
    assert cap.truth_on_device(model.to("cuda"), "cuda")   # a small model fits: built on the device


def _synchronous_copy(self: Any, t: torch.Tensor, snapshot: bool = True) -> torch.Tensor:
    return t.detach().to("cpu", copy=True).contiguous()


@pytest.mark.gpu
@needs_cuda
def test_cuda_capture_equals_the_host_routes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Auto (float64 model and residuals on the device, pinned async copies) against the host routes."""
    model, inputs = _net(), _net_inputs()
    spec = CheckSpec(name="net", dtypes=["bfloat16", "float32"], drill=2)
    residual = cap.residual
    files = {}
    for mode in ("auto", "streamed", "truth_via_host", "all_host"):
        with monkeypatch.context() as mp:
            if mode == "streamed":   # no snapshot held on the device: every copy during the forward
                mp.setattr(cap, "DEVICE_HOLD_BYTES", 0)
            elif mode != "auto":
                mp.setattr(cap, "TRUTH_ON_DEVICE", False)
            if mode == "all_host":   # what capture did before: synchronous copies, residuals on the host
                mp.setattr(cap, "DEVICE_HOLD_BYTES", 0)
                mp.setattr(cap.HostCopies, "copy", _synchronous_copy)
                mp.setattr(cap, "residual", lambda t, r, rdt, copies=None: residual(t, r, rdt))
            store = GoldenStore(tmp_path / mode)
            capture(model, inputs, spec, store, "cuda", env={})
            files[mode] = _rung_files(store, "net")
    assert files["auto"] == files["streamed"] == files["truth_via_host"] == files["all_host"]


class _NoByteView(torch.Tensor):
    """A tensor subclass whose bytes cannot be viewed (as some wrappers' cannot)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.view and any(isinstance(a, torch.dtype) for a in args[1:]):
            raise RuntimeError("no byte view here")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_seen_again_without_a_byte_view_is_recorded_again_not_an_error() -> None:
    with torch.inference_mode():
        t = torch.arange(6.0).as_subclass(_NoByteView)
    pool = RecordPool()
    assert pool.add(t) == pool.add(t)
    pool.check_repeats()
    assert not pool.repeats_unchanged()      # capture then records again, snapshotting repeats
    again = RecordPool(resnap=True)
    first, second = again.add(t), again.add(t)
    assert first != second and again.resolve() == {}    # kept as two keys
