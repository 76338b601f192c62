"""The replay's statistics queue (replay._StatsQueue), the path a GPU replay takes, run on the CPU.

On a GPU every module's statistics are queued behind the forward and judged after one
synchronisation; here DEFER_ON_CPU forces that path so it is tested in CI, against the immediate
path the CPU normally takes.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch import nn

from pytest_rocm_parity import replay as replay_mod
from pytest_rocm_parity.capture import capture
from pytest_rocm_parity.engine import CheckSpec
from pytest_rocm_parity.golden import GoldenStore, RungReader
from pytest_rocm_parity.replay import replay


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(48, 48), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def _setup(tmp_path: Any) -> tuple[Net, torch.Tensor, CheckSpec, GoldenStore]:
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(4, 32, 48, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="q", dtypes=["bfloat16", "float32"], drill=1)
    store = GoldenStore(tmp_path / "g")
    capture(model, x, spec, store, "cpu")
    return model, x, spec, store


def _summary(results: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for r in results:
        for l in r.layers + r.outputs:
            for m in (l.iso, l.prop):
                if m is not None:
                    out.append((r.dtype, l.name, l.passed, round(m.ratio, 9), round(m.ratio_lo, 9), round(m.z, 9),
                                m.nonfinite))
    return out


# hold 1 byte: flush after every leaf. launch: the bytes that start a part's statistics during the
# pass (0: all at the flush; 1: one part per leaf; 20000: parts of a few leaves, a 48-wide float32
# output of 4 x 32 rows being 24576 bytes and a bfloat16 one 12288)
@pytest.mark.parametrize("hold, launch", [(2 << 30, 0), (2 << 30, 1), (2 << 30, 20000), (1, 0)])
def test_queued_path_equals_immediate_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, hold: int,
                                           launch: int) -> None:
    model, x, spec, store = _setup(tmp_path)
    model.blocks[1][1].approximate = "tanh"        # a seeded bug, so failing layers are compared too
    immediate = replay(model, x, spec, store, "cpu")
    flushes: list[int] = []
    parts: list[int] = []
    real_flush, real_launch = replay_mod._StatsQueue.flush, replay_mod._StatsQueue._launch

    def counting_flush(self: Any, **kw: Any) -> None:
        flushes.append(len(self.items))
        real_flush(self, **kw)

    def counting_launch(self: Any, items: list[Any], *rest: Any) -> Any:
        parts.append(len(items))
        return real_launch(self, items, *rest)

    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    monkeypatch.setattr(replay_mod._StatsQueue, "HOLD_BYTES", hold)
    monkeypatch.setattr(replay_mod._StatsQueue, "LAUNCH_BYTES", launch)
    monkeypatch.setattr(replay_mod._StatsQueue, "flush", counting_flush)
    monkeypatch.setattr(replay_mod._StatsQueue, "_launch", counting_launch)
    queued = replay(model, x, spec, store, "cpu")
    assert _summary(queued) == _summary(immediate)
    assert any(not r.passed for r in queued) and queued[-1].culprit == "blocks.1.1"
    if hold == 1:
        assert max(flushes) == 1                    # early flushes: never more than one leaf waiting
    else:
        assert max(flushes) > 3                     # one flush per pass: every module queued
    if launch == 0:
        assert len(parts) == sum(1 for n in flushes if n)   # one part per flush with leaves, started by it
    elif launch == 1:
        assert set(parts) == {1} and sum(parts) == sum(flushes)
    else:
        assert len(parts) > len(flushes) and max(parts) > 1 and sum(parts) == sum(flushes)


def test_queued_path_masks_non_finite_and_exports_failing_tensors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, spec, store = _setup(tmp_path)

    def poison(_m: Any, _a: Any, out: torch.Tensor) -> torch.Tensor:   # a kernel writing one inf
        out = out.clone()
        out[0, 3, 5] = float("inf")
        return out

    model.blocks[2][0].register_forward_hook(poison)
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    spec.report_dir = tmp_path / "rep"
    results = replay(model, x, spec, store, "cpu")
    bad = [r for r in results if not r.passed]
    assert bad
    rec = next(l for l in bad[0].layers if l.name == "blocks.2.0")
    assert rec.iso.nonfinite == 1 and rec.iso.first_nonfinite == [0, 3, 5]
    files = list((tmp_path / "rep" / "tensors").glob("*.safetensors"))
    assert files, "failing tensors were not exported from the queued path"
    from safetensors import safe_open

    with safe_open(str(files[0]), "pt") as f:
        keys = list(f.keys())
        meta = f.metadata()
    assert any(k.startswith("blocks.2.0/") for k in keys), keys
    assert meta["check"] == "q" and "blocks.2.0" in json.loads(meta["failing_layers"])


def test_a_failing_triton_kernel_falls_back_to_torch_with_one_warning(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU whose Triton cannot compile the kernel still gets a replay (torch ops), and is told once."""
    from pytest_rocm_parity import compare, kernels

    calls: list[int] = []

    def broken(*_a: Any, **_k: Any) -> Any:
        calls.append(1)
        raise RuntimeError("no kernel for you")

    monkeypatch.setattr(kernels, "_DISABLED", [])
    monkeypatch.setattr(kernels, "triton_usable", _usable := (lambda: not kernels._DISABLED))
    _usable.cache_clear = lambda: None   # type: ignore[attr-defined]
    monkeypatch.setattr(kernels, "block_stats_triton", broken)
    monkeypatch.setattr(compare, "_on_gpu", lambda t: True)   # dispatch as for a GPU tensor
    c, r, e = (torch.randn(1000) for _ in range(3))
    with pytest.warns(RuntimeWarning, match="Triton statistics kernel failed"):
        got = compare.block_stats(c, r, e)
    assert calls == [1] and kernels._DISABLED
    want = kernels.block_stats_torch(c, r, e, *compare.block_layout(1000))
    assert torch.equal(got, want)
    compare.block_stats(c, r, e)        # disabled now: no second attempt, no second warning
    assert calls == [1]


@pytest.mark.parametrize("launch_leaves", [1, 2])   # a part per leaf; a part over the kept and a discarded leaf
def test_discard_forgets_started_parts_of_a_repeated_pass(monkeypatch: pytest.MonkeyPatch, launch_leaves: int) -> None:
    """A pass repeated (a golden written in place) discards what it queued, though parts of it may
    have started already: the flush then gives each kept and each new leaf its own metrics."""
    from pytest_rocm_parity.compare import residual_metrics
    from pytest_rocm_parity.tolerance import Tolerance

    g = torch.Generator().manual_seed(0)
    truth = torch.randn(4, 4096, dtype=torch.float64, generator=g)
    ref = truth.float()
    res = (truth - ref.double()).float()

    def cand(i: int, scale: float) -> torch.Tensor:
        return (truth[i] * (1 + scale * torch.randn(4096, dtype=torch.float64, generator=g))).float()

    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    monkeypatch.setattr(replay_mod._StatsQueue, "LAUNCH_BYTES", launch_leaves * 4096 * 4)
    tol = Tolerance()
    q = replay_mod._StatsQueue("float32", 2.0**-24, None)
    kept, old, new = cand(0, 1e-7), cand(1, 1e-2), cand(1, 1e-7)
    sinks: dict[str, list[Any]] = {k: [] for k in "abc"}
    q.add(sinks["a"], "a", kept, ref[0], res[0], tol, True, "a")
    mark = len(q.items)
    q.add(sinks["b"], "b", old, ref[1], res[1], tol, True, "b")          # the pass to repeat
    q.add(sinks["c"], "c", cand(2, 1e-2), ref[2], res[2], tol, True, "c")
    assert q.parts                                                       # started before the repeat
    q.discard(mark)
    sinks["b"], sinks["c"] = [], []
    q.add(sinks["b"], "b", new, ref[1], res[1], tol, True, "b")          # the repeat
    q.flush()
    want_a = residual_metrics("a", kept, ref[0], res[0], 2.0**-24, tol.confidence)
    want_b = residual_metrics("b", new, ref[1], res[1], 2.0**-24, tol.confidence)
    assert sinks["a"][0].ratio == pytest.approx(want_a.ratio, rel=1e-9)
    assert sinks["b"][0].ratio == pytest.approx(want_b.ratio, rel=1e-9)
    assert sinks["b"][0].ratio < 10 < residual_metrics("b", old, ref[1], res[1], 2.0**-24).ratio
    assert sinks["c"] == [] and not q.items and not q.parts


def test_what_a_queue_knows_of_a_golden_is_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The facts a replay keeps per golden tensor across passes (its block layout) belong to that
    tensor: an entry left by another tensor under the same id (a golden freed and its id reused)
    is worked out again, not trusted."""
    from pytest_rocm_parity.compare import block_layout, residual_metrics
    from pytest_rocm_parity.tolerance import Tolerance

    g = torch.Generator().manual_seed(1)
    truth = torch.randn(70001, dtype=torch.float64, generator=g)
    ref = truth.float()
    res = (truth - ref.double()).float()
    cand = (truth * (1 + 1e-3 * torch.randn(70001, dtype=torch.float64, generator=g))).float()
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    stale = torch.zeros(5)
    known: dict[int, Any] = {id(ref): (stale, stale, block_layout(5), True)}
    tol = Tolerance()
    for _ in range(2):         # two passes: the second uses what the first learned
        q = replay_mod._StatsQueue("float32", 2.0**-24, None, known)
        sink: list[Any] = []
        q.add(sink, "x", cand, ref, res, tol, True, "x")
        q.flush()
        want = residual_metrics("x", cand, ref, res, 2.0**-24, tol.confidence)
        assert sink[0].ratio == pytest.approx(want.ratio, rel=1e-9)
        assert known[id(ref)][0] is ref and known[id(ref)][2] == block_layout(70001)


def test_direct_calls_queued_through_their_slots_judge_as_the_general_walk(tmp_path: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """From a rung's second pass on, a direct call's output is queued through the slot made from its
    first (replay._slot, _StatsQueue.add_slots), deferred to the level's end (DEFER_SLOTS) or as the
    call returns; every verdict and metric is the general walk's."""
    from pytest_rocm_parity.replay import prepare_rung

    model, x, spec, store = _setup(tmp_path)
    model.blocks[1][1].approximate = "tanh"        # a seeded bug: failing layers are compared too
    spec.replay = "fast"
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    manifest = store.read_manifest("q")
    taken: list[int] = []    # per add_slots call: how many outputs it queued (-1 per output refused)
    real = replay_mod._StatsQueue.add_slots

    def counted(self: Any, sink: Any, batch: Any, *a: Any) -> Any:
        missed = real(self, sink, batch, *a)
        taken.append(len(batch) - len(missed) if not missed else -len(missed))
        return missed
    monkeypatch.setattr(replay_mod._StatsQueue, "add_slots", counted)
    got = {}
    for slots, defer in ((True, True), (True, False), (False, True)):
        monkeypatch.setattr(replay_mod, "SLOTS", slots)
        monkeypatch.setattr(replay_mod, "DEFER_SLOTS", defer)
        rung = "float32"
        reader = RungReader(store.rung_file("q", manifest, rung), "cpu")
        run = prepare_rung(model, spec, manifest, manifest["rungs"][rung], reader, rung, "cpu",
                           {"args": (x,), "kwargs": {}}, keep_loaded=True)
        taken.clear()
        passes = [run() for _ in range(3)]
        got[slots, defer] = [_summary([p]) for p in passes]
        if not slots:
            assert taken == []
        elif defer:   # the first pass makes the slots; each later one queues a level's outputs at once
            levels = len(taken) // 2
            assert levels >= 2 and min(taken) >= 2 and taken[:levels] == taken[levels:], taken
            assert not passes[0].passed and str(passes[-1].culprit).startswith("blocks.1")
        else:         # one by one
            calls = len(taken) // 2
            assert calls >= 4 and taken == [1] * (2 * calls), taken
    assert got[True, True] == got[True, False] == got[False, True]
    assert got[True, True][0] == got[True, True][2]


def test_deferred_outputs_still_flush_early_past_the_hold_limit(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs deferred to a level's end (DEFER_SLOTS) are queued as soon as what waits would pass
    HOLD_BYTES, so the queue's early flush frees them as it did call by call: with a limit of one
    byte no flush judges more than one leaf, on the passes through slots too; the verdicts are those
    of the default limit."""
    from pytest_rocm_parity.replay import prepare_rung

    model, x, spec, store = _setup(tmp_path)
    model.blocks[1][1].approximate = "tanh"
    spec.replay = "fast"
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    manifest = store.read_manifest("q")
    flushes: list[int] = []
    real_flush = replay_mod._StatsQueue.flush

    def counting_flush(self: Any, **kw: Any) -> None:
        flushes.append(len(self.items))
        real_flush(self, **kw)
    monkeypatch.setattr(replay_mod._StatsQueue, "flush", counting_flush)
    got = {}
    for hold in (1, replay_mod._StatsQueue.HOLD_BYTES):
        monkeypatch.setattr(replay_mod._StatsQueue, "HOLD_BYTES", hold)
        reader = RungReader(store.rung_file("q", manifest, "float32"), "cpu")
        run = prepare_rung(model, spec, manifest, manifest["rungs"]["float32"], reader, "float32", "cpu",
                           {"args": (x,), "kwargs": {}}, keep_loaded=True)
        run()
        flushes.clear()
        got[hold] = [_summary([run()]) for _ in range(2)]
        assert (max(flushes) == 1) == (hold == 1), flushes
    assert got[1] == got[replay_mod._StatsQueue.HOLD_BYTES]


def test_a_slot_refuses_an_output_it_was_not_made_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """An output of another shape, dtype or layout than its slot's is not queued through it (the
    general walk takes it): nothing is queued and the sink is untouched."""
    from pytest_rocm_parity.tolerance import Tolerance

    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    ref = torch.randn(6, 8)
    res = torch.zeros(6, 8)
    q = replay_mod._StatsQueue("float32", 2.0**-24, None)
    first = ref + 1e-3
    slot = replay_mod._slot(first, [("0", "r", "t", "k/0/isolated")], _Reader({"r": ref, "t": res}),  # type: ignore[arg-type]
                            Tolerance(), q)
    assert slot is not None
    sink: dict[str, Any] = {}
    for bad in (ref[:3], ref.double(), ref.t().contiguous().t(), (ref,), [ref], ref.unsqueeze(0)):
        assert not q.add_slot(sink, "k", bad, slot, False)
    assert sink == {} and q.items == [] and q.held == 0
    assert q.add_slot(sink, "k", first, slot, False)
    q.flush()
    assert sink["k"][0].numel == 48 and sink["k"][0].ratio > 1


class _Reader:
    def __init__(self, d: dict[str, torch.Tensor]) -> None:
        self.d = d

    def get(self, k: str) -> torch.Tensor:
        return self.d[k]
