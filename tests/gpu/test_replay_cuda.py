"""On a real GPU: the Triton statistics and the queued replay agree with the CPU's arithmetic.

Skipped without CUDA/ROCm; run on a GPU by scripts/gpu_bench.sh (docs/performance.md, docs/where-run.md).
"""
from __future__ import annotations

import pytest
import torch

from pytest_rocm_parity import kernels
from pytest_rocm_parity.capture import capture
from pytest_rocm_parity.compare import block_layout, residual_metrics
from pytest_rocm_parity.engine import CheckSpec
from pytest_rocm_parity.golden import GoldenStore
from pytest_rocm_parity.replay import replay

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_triton_stats_match_cpu(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    n = 4 * 512 * 2048 + 17
    t = torch.randn(n, dtype=torch.float64, generator=g)
    r = t.to(dtype)
    c = (t * (1 + 1e-3 * torch.randn(n, dtype=torch.float64, generator=g))).to(dtype)
    e = (t - r.double()).to(torch.bfloat16 if dtype in (torch.bfloat16, torch.float16) else dtype)
    nb, size = block_layout(n)
    cpu = kernels.block_stats_torch(c, r, e, nb, size)
    gpu = kernels.block_stats_triton(c.cuda(), r.cuda(), e.cuda(), nb, size).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-30)
    a = residual_metrics("x", c, r, e, 2.0**-8)
    b = residual_metrics("x", c.cuda(), r.cuda(), e.cuda(), 2.0**-8)
    assert b.ratio == pytest.approx(a.ratio, rel=1e-5) and b.z == pytest.approx(a.z, abs=1e-6)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU())
                                          for _ in range(4))
        self.head = torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


@pytest.mark.parametrize("kind", ["full", "fast"])
def test_queued_gpu_replay_equals_cpu_metrics(tmp_path, kind: str) -> None:
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="net", dtypes=["bfloat16", "float32"], drill=1, replay=kind)
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cuda")
    on_gpu = replay(model, x, spec, store, "cuda")
    kernels.triton_usable.cache_clear()
    try:
        kernels_off = pytest.MonkeyPatch()
        kernels_off.setattr(kernels, "triton_usable", lambda: False)
        torch_path = replay(model, x, spec, store, "cuda")
    finally:
        kernels_off.undo()
    for a, b in zip(on_gpu, torch_path):
        assert a.passed and b.passed
        for la, lb in zip(a.layers, b.layers):
            assert la.name == lb.name
            assert la.iso.ratio == pytest.approx(lb.iso.ratio, rel=1e-4)


@pytest.mark.parametrize("offset", [0, 1])
def test_many_leaves_one_launch_match_cpu(offset: int) -> None:
    """kernels.block_stats_many (the replay's flush) on the GPU against the CPU's per-leaf statistics;
    ``offset``: leaves as views that many elements into their storage (1: misaligned, the plain loop;
    0: the vectorised loop, whose chunk edges are not multiples of 16 in the odd-sized leaves)."""
    leaves, lays, want = [], [], []
    for i, (dtype, rdt, n) in enumerate([(torch.bfloat16, torch.bfloat16, 4 * 512 * 2048),
                                         (torch.bfloat16, torch.bfloat16, 4 * 512 * 32000 + 5),
                                         (torch.float32, torch.float32, 70001), (torch.float16, torch.bfloat16, 33)]):
        g = torch.Generator().manual_seed(i)
        t = torch.randn(n, dtype=torch.float64, generator=g)
        r = t.to(dtype)
        c = (t * (1 + 1e-3 * torch.randn(n, dtype=torch.float64, generator=g))).to(dtype)
        e = (t - r.double()).to(rdt)
        nb, size = block_layout(n)
        want.append(kernels.block_stats_torch(c, r, e, nb, size))
        leaves.append(tuple(torch.cat([x.new_zeros(offset), x]).cuda()[offset:] for x in (c, r, e)))
        lays.append((nb, size))
    assert kernels.aligned(x.data_ptr() for leaf in leaves for x in leaf) == (offset == 0)
    got = kernels.block_stats_many(leaves, lays).cpu()
    torch.testing.assert_close(got, torch.cat(want), rtol=1e-5, atol=1e-30)


class InplaceNet(torch.nn.Module):
    """fc1's output is rewritten by an inplace ReLU (which, isolated, also writes its golden input)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(256, 256)
        self.act = torch.nn.ReLU(inplace=True)
        self.fc2 = torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


@pytest.mark.parametrize("kind", ["full", "fast"])
def test_gpu_replay_of_an_inplace_model_equals_the_cpu_arithmetic(tmp_path, kind: str) -> None:
    """Preloaded goldens handed without copies and queued outputs judged after the pass: on CUDA the
    ratios stay at the same-GPU level; read from the live tensors, fc1's propagated ratio was 6.6e6."""
    torch.manual_seed(0)
    model = InplaceNet()
    x = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="inpl", dtypes=["float32"], drill=1, replay=kind)
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cuda")
    (gpu,) = replay(model.cuda(), x, spec, store, "cuda")
    assert gpu.passed, [(l.name, l.reason) for l in gpu.layers]
    for l in gpu.layers:
        for m in (l.iso, l.prop):
            if m is not None:
                assert m.ratio < 2.0, (l.name, m.ratio)   # the same GPU: ratio 1 up to the ulp floor


@pytest.mark.parametrize("replay_kind", ["fast", "full"])
def test_direct_calls_on_the_gpu_judge_as_the_hooked_forward(tmp_path, monkeypatch, replay_kind: str) -> None:
    """On the GPU the direct calls' outputs are queued without a snapshot (nothing else sees them):
    the verdicts equal the hooked forward's, which snapshots every output, on a HF Llama in bf16,
    and an activation bug is blamed on the same module by both."""
    transformers = pytest.importorskip("transformers")
    from pytest_rocm_parity import replay as replay_mod

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 512, (2, 128), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "use_cache": False}
    spec = CheckSpec(name="llama", dtypes=["bfloat16"], drill=2, replay=replay_kind)
    store = GoldenStore(tmp_path)
    capture(model, inputs, spec, store, "cuda")
    runs: list[int] = []
    real = replay_mod.run_level
    monkeypatch.setattr(replay_mod, "run_level", lambda *a, **k: runs.append(1) or real(*a, **k))
    (direct,) = replay(model, inputs, spec, store, "cuda")
    monkeypatch.setattr(replay_mod, "DIRECT", False)
    (hooked,) = replay(model, inputs, spec, store, "cuda")
    assert runs and direct.passed and hooked.passed
    ratios = lambda r: {l.name: l.iso.ratio for l in r.layers if l.iso}   # noqa: E731
    a, b = ratios(direct), ratios(hooked)
    assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-6) for k in a)
    act = model.model.layers[2].mlp.act_fn
    monkeypatch.setattr(act, "forward", lambda x: torch.nn.functional.silu(x) * 1.05)
    monkeypatch.setattr(replay_mod, "DIRECT", True)
    (bug,) = replay(model, inputs, spec, store, "cuda")
    assert not bug.passed and bug.culprit == "model.layers.2.mlp.act_fn"


def _leaves_two_groups() -> tuple[list[tuple[torch.Tensor, ...]], list[tuple[int, int]]]:
    leaves, lays = [], []
    for i, (dtype, n) in enumerate([(torch.bfloat16, 4 * 512 * 2048), (torch.float32, 70001),
                                    (torch.bfloat16, 4 * 512 * 2048 + 3)]):
        g = torch.Generator().manual_seed(10 + i)
        t = torch.randn(n, dtype=torch.float64, generator=g)
        r = t.to(dtype)
        c = (t * (1 + 1e-3 * torch.randn(n, dtype=torch.float64, generator=g))).to(dtype)
        leaves.append((c.cuda(), r.cuda(), (t - r.double()).to(dtype).cuda()))
        lays.append(block_layout(n))
    return leaves, lays


def _host_columns(leaves: list[tuple[torch.Tensor, ...]], lays: list[tuple[int, int]], confs: list[float]) -> list:
    from pytest_rocm_parity.compare import metrics_many

    items = [(f"l{k}", c.numel(), kernels.block_stats_torch(c.cpu(), r.cpu(), e.cpu(), *lay).numpy(), conf)
             for k, ((c, r, e), lay, conf) in enumerate(zip(leaves, lays, confs))]
    return [[m.rms_truth, m.err_cand, m.err_ref, m.ratio, m.ratio_lo, m.rel_to_ref, m.max_abs_to_ref, m.z]
            for m in metrics_many(items, 2.0**-8)]


@pytest.mark.parametrize("host_pointers", [True, False])
@pytest.mark.parametrize("columns_kernel", [True, False])
def test_graphed_judgement_reads_the_leaves_when_replayed(monkeypatch, columns_kernel, host_pointers) -> None:
    """stats_graph.start: eager the first time, captured the second, a graph from the
    third; the graph's columns are those of the values in the leaves at replay (written in place
    since capture), never those seen at capture. Two dtype groups, two block counts. The judging
    formulas as one Triton kernel (the default) and as torch ops (where that kernel failed); the
    addresses (and the kernel's columns) in pinned host memory (the default on CUDA) or on the device."""
    from pytest_rocm_parity import stats_graph

    monkeypatch.setattr(stats_graph, "_CACHE", kernels._TableCache(4))
    monkeypatch.setattr(stats_graph, "GRAPHS", True)
    monkeypatch.setattr(stats_graph, "COLUMNS_KERNEL", columns_kernel)
    monkeypatch.setattr(stats_graph, "COLUMNS_ERRORS", [])
    monkeypatch.setattr(kernels, "HOST_POINTERS", host_pointers)
    monkeypatch.setattr(kernels, "HOST_POINTER_ERRORS", [])
    leaves, lays = _leaves_two_groups()
    confs = [3.0, 2.0, 3.0]
    want = torch.tensor(_host_columns(leaves, lays, confs), dtype=torch.float64)
    for _ in range(3):
        cols = stats_graph.judge_on_device(leaves, lays, confs, 2.0**-8)
        torch.testing.assert_close(torch.from_numpy(cols[:, :8]), want, rtol=1e-5, atol=1e-30)
        assert (cols[:, 8] == 1.0).all()
    assert sum(isinstance(v, stats_graph._Graphed) for v in stats_graph._CACHE._d.values()) == 1
    for c, r, _e in leaves:   # new candidate values at the same addresses
        c.copy_(r.double().mul(1 - 3e-2).to(c.dtype))
    torch.cuda.synchronize()
    want2 = torch.tensor(_host_columns(leaves, lays, confs), dtype=torch.float64)
    assert not torch.allclose(want2, want)
    cols2 = stats_graph.judge_on_device(leaves, lays, confs, 2.0**-8)
    torch.testing.assert_close(torch.from_numpy(cols2[:, :8]), want2, rtol=1e-5, atol=1e-30)
    # other tensors of the same signature (as a next pass's outputs, at other addresses): the same
    # graph, pointed at them
    moved = [(r.double().mul(1 + 1e-2).to(c.dtype), r, e) for c, r, e in leaves]
    want3 = torch.tensor(_host_columns(moved, lays, confs), dtype=torch.float64)
    cols3 = stats_graph.judge_on_device(moved, lays, confs, 2.0**-8)
    torch.testing.assert_close(torch.from_numpy(cols3[:, :8]), want3, rtol=1e-5, atol=1e-30)
    assert sum(isinstance(v, stats_graph._Graphed) for v in stats_graph._CACHE._d.values()) == 1
    graphed = next(v for v in stats_graph._CACHE._d.values() if isinstance(v, stats_graph._Graphed))
    assert (graphed.launch.meta is not None) == columns_kernel and stats_graph.COLUMNS_ERRORS == []
    assert graphed.launch.host_side == host_pointers and kernels.HOST_POINTER_ERRORS == []
    assert (graphed.launch.host_out is not None) == (host_pointers and columns_kernel)


@pytest.mark.parametrize("host_pointers", [True, False])
def test_two_parts_of_one_signature_started_before_either_is_read(monkeypatch, host_pointers) -> None:
    """A replay starts a part of its statistics per few modules, and a run of identical blocks gives
    parts of one signature: the same graph replayed twice before the flush reads either. Each part
    must get its own leaves' columns (device tables: its own address staging and host buffer; host
    tables, which the second start rewrites: the first start's columns are read before it does)."""
    from pytest_rocm_parity import stats_graph

    monkeypatch.setattr(stats_graph, "_CACHE", kernels._TableCache(4))
    monkeypatch.setattr(stats_graph, "GRAPHS", True)
    monkeypatch.setattr(kernels, "HOST_POINTERS", host_pointers)
    monkeypatch.setattr(kernels, "HOST_POINTER_ERRORS", [])
    leaves, lays = _leaves_two_groups()
    confs = [3.0, 2.0, 3.0]
    for _ in range(2):                          # eager, then captured
        stats_graph.judge_on_device(leaves, lays, confs, 2.0**-8)
    other = [(r.double().mul(1 + 2e-2).to(c.dtype), r, e) for c, r, e in leaves]
    want1 = torch.tensor(_host_columns(leaves, lays, confs), dtype=torch.float64)
    want2 = torch.tensor(_host_columns(other, lays, confs), dtype=torch.float64)
    assert not torch.allclose(want1, want2)
    torch.cuda.synchronize()
    first = stats_graph.start(leaves, lays, confs, 2.0**-8)
    second = stats_graph.start(other, lays, confs, 2.0**-8)
    torch.testing.assert_close(torch.from_numpy(second.columns()[:, :8]), want2, rtol=1e-5, atol=1e-30)
    torch.testing.assert_close(torch.from_numpy(first.columns()[:, :8]), want1, rtol=1e-5, atol=1e-30)
    graphed = [v for v in stats_graph._CACHE._d.values() if isinstance(v, stats_graph._Graphed)]
    assert len(graphed) == 1 and graphed[0].launch.host_side == host_pointers
    # parts in other slots (a replay's part index) get graphs of their own: no wait between them
    for _ in range(2):
        stats_graph.start(other, lays, confs, 2.0**-8, slot=1).columns()
    third = stats_graph.start(leaves, lays, confs, 2.0**-8)
    fourth = stats_graph.start(other, lays, confs, 2.0**-8, slot=1)
    torch.testing.assert_close(torch.from_numpy(fourth.columns()[:, :8]), want2, rtol=1e-5, atol=1e-30)
    torch.testing.assert_close(torch.from_numpy(third.columns()[:, :8]), want1, rtol=1e-5, atol=1e-30)
    assert sum(isinstance(v, stats_graph._Graphed) for v in stats_graph._CACHE._d.values()) == 2


def test_a_failed_host_table_capture_falls_back_to_a_graph_the_next_start_uses(monkeypatch) -> None:
    """A capture with host tables that fails switches them off for the process and captures the
    launch again with device tables, under the key the next start looks for: that start replays
    the graph (not the eager path again) and gets the right columns."""
    from pytest_rocm_parity import stats_graph

    monkeypatch.setattr(stats_graph, "_CACHE", kernels._TableCache(4))
    monkeypatch.setattr(stats_graph, "GRAPHS", True)
    monkeypatch.setattr(kernels, "HOST_POINTERS", True)
    monkeypatch.setattr(kernels, "HOST_POINTER_ERRORS", [])
    real_run = stats_graph._Launch.run

    def run(self, unit_roundoff):   # a launcher that cannot take pinned host memory, say
        if self.host_side:
            raise ValueError("Pointer argument cannot be accessed from Triton (cpu tensor?)")
        return real_run(self, unit_roundoff)
    monkeypatch.setattr(stats_graph._Launch, "run", run)
    leaves, lays = _leaves_two_groups()
    confs = [3.0, 2.0, 3.0]
    for _ in range(2):                      # eager; eager and captured (host tables fail, then device)
        stats_graph.judge_on_device(leaves, lays, confs, 2.0**-8)
    assert kernels.HOST_POINTER_ERRORS and "cpu tensor?" in kernels.HOST_POINTER_ERRORS[0]
    other = [(r.double().mul(1 + 2e-2).to(c.dtype), r, e) for c, r, e in leaves]
    want = torch.tensor(_host_columns(other, lays, confs), dtype=torch.float64)
    cols = stats_graph.judge_on_device(other, lays, confs, 2.0**-8)
    torch.testing.assert_close(torch.from_numpy(cols[:, :8]), want, rtol=1e-5, atol=1e-30)
    graphed = [v for v in stats_graph._CACHE._d.values() if isinstance(v, stats_graph._Graphed)]
    assert len(graphed) == 1 and not graphed[0].launch.host_side
    assert graphed[0].last is not None      # the third start replayed it


def test_a_graph_made_inside_inference_mode_serves_starts_outside_it(monkeypatch) -> None:
    """A replay starts statistics inside its direct calls' torch.inference_mode and at the flush
    outside it. A graph seen and captured inside, then started outside, must rewrite its address
    table and judge (an inference tensor there raised, and the Triton kernel switched itself off)."""
    from pytest_rocm_parity import stats_graph

    monkeypatch.setattr(stats_graph, "_CACHE", kernels._TableCache(4))
    monkeypatch.setattr(stats_graph, "GRAPHS", True)
    monkeypatch.setattr(kernels, "_DISABLED", [])
    leaves, lays = _leaves_two_groups()
    confs = [3.0, 2.0, 3.0]
    with torch.inference_mode():
        for _ in range(3):                        # eager, captured, replayed: all inside
            stats_graph.judge_on_device(leaves, lays, confs, 2.0**-8)
    assert sum(isinstance(v, stats_graph._Graphed) for v in stats_graph._CACHE._d.values()) == 1
    other = [(r.double().mul(1 + 2e-2).to(c.dtype), r, e) for c, r, e in leaves]
    want = torch.tensor(_host_columns(other, lays, confs), dtype=torch.float64)
    cols = stats_graph.judge_on_device(other, lays, confs, 2.0**-8)   # outside
    torch.testing.assert_close(torch.from_numpy(cols[:, :8]), want, rtol=1e-5, atol=1e-30)
    assert not kernels._DISABLED


def test_a_graph_of_aligned_leaves_is_never_pointed_at_misaligned_ones(monkeypatch) -> None:
    """A graph made for aligned leaves runs the vectorised loop; the same signature's leaves at a
    misaligned address (a view one element in) must get their own launch, not that graph (whose
    vector loads would fault or read the wrong elements), and the right columns."""
    from pytest_rocm_parity import stats_graph

    monkeypatch.setattr(stats_graph, "_CACHE", kernels._TableCache(4))
    monkeypatch.setattr(stats_graph, "GRAPHS", True)
    monkeypatch.setattr(kernels, "_DISABLED", [])
    leaves, lays = _leaves_two_groups()
    confs = [3.0, 2.0, 3.0]
    for _ in range(3):
        stats_graph.judge_on_device(leaves, lays, confs, 2.0**-8)
    graphed = [v for v in stats_graph._CACHE._d.values() if isinstance(v, stats_graph._Graphed)]
    assert len(graphed) == 1 and graphed[0].launch.many.al
    moved = [tuple(torch.cat([x.new_zeros(1), x.mul(1.01) if x is c else x])[1:] for x in (c, r, e))
             for c, r, e in leaves]
    want = torch.tensor(_host_columns(moved, lays, confs), dtype=torch.float64)
    for _ in range(3):
        cols = stats_graph.judge_on_device(moved, lays, confs, 2.0**-8)
        torch.testing.assert_close(torch.from_numpy(cols[:, :8]), want, rtol=1e-5, atol=1e-30)
    graphed = [v for v in stats_graph._CACHE._d.values() if isinstance(v, stats_graph._Graphed)]
    assert sorted(g.launch.many.al for g in graphed) == [False, True]
    assert not kernels._DISABLED


def test_graphs_off_stay_eager(monkeypatch) -> None:
    from pytest_rocm_parity import stats_graph

    monkeypatch.setattr(stats_graph, "_CACHE", kernels._TableCache(4))
    monkeypatch.setattr(stats_graph, "GRAPHS", False)
    leaves, lays = _leaves_two_groups()
    for _ in range(3):
        stats_graph.judge_on_device(leaves, lays, [3.0] * 3, 2.0**-8)
    assert not any(isinstance(v, stats_graph._Graphed) for v in stats_graph._CACHE._d.values())


@pytest.mark.parametrize("launch,side,before,restarts", [
    (None, False, False, True), (300_000, False, False, True), (300_000, True, False, True), (None, True, True, True),
    (None, False, False, False)])
def test_repeated_passes_with_graphed_stats_still_blame_a_new_bug(tmp_path, monkeypatch, launch, side,
                                                                  before, restarts) -> None:
    """Passes 1-3 over one loaded golden (the third replays the captured statistics), then a weight
    changed in place: the next pass, at the same addresses, fails and blames that block. ``launch``
    300 kB: a part of the statistics started every two modules (256 kB outputs), graphs of one
    signature replayed several times a pass; ``side``: those parts on the side stream; ``before``:
    a part started before the repeated blocks (PART_BEFORE_BLOCKS), on the side stream;
    ``restarts``: graphed runs of slotted outputs started again through their Restart (the
    default) or by start()'s general path, with the same ratios."""
    from pytest_rocm_parity import replay as replay_mod
    from pytest_rocm_parity.replay import prepare_rung

    from pytest_rocm_parity import stats_graph

    monkeypatch.setattr(stats_graph, "_CACHE", kernels._TableCache(stats_graph.CACHE_SIZE))
    monkeypatch.setattr(stats_graph, "GRAPHS", True)
    monkeypatch.setattr(replay_mod._StatsQueue, "SIDE_STREAM", side)
    monkeypatch.setattr(replay_mod._StatsQueue, "RESTARTS", restarts)
    restarted: list[bool] = []
    real_restart = stats_graph.Restart.start
    monkeypatch.setattr(stats_graph.Restart, "start",
                        lambda self, cands: restarted.append(True) or real_restart(self, cands))
    monkeypatch.setattr(replay_mod._StatsQueue, "PART_BEFORE_BLOCKS", before)
    if launch is not None:
        monkeypatch.setattr(replay_mod._StatsQueue, "LAUNCH_BYTES", launch)
    torch.manual_seed(0)
    model = Net().to("cuda", torch.bfloat16)    # replayed in place (a model needing a cast is copied)
    x = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="net", dtypes=["bfloat16"], drill=1, replay="fast")
    store = GoldenStore(tmp_path)
    manifest = capture(model, x, spec, store, "cuda")
    from pytest_rocm_parity.golden import RungReader

    meta = manifest["rungs"]["bfloat16"]
    reader = RungReader(store.rung_file("net", manifest, "bfloat16"), "cuda")
    run = prepare_rung(model, spec, manifest, meta, reader, "bfloat16", "cuda", {"args": (x,), "kwargs": {}},
                       keep_loaded=True)
    monkeypatch.setattr(kernels, "_DISABLED", [])
    first = [run() for _ in range(3)]
    assert all(r.passed for r in first)
    # the statistics ran in Triton throughout: a failure there switches to torch ops, whose equal
    # verdicts would hide it (as they hid the inference-mode bug of session 6 until this check)
    assert not kernels._DISABLED, kernels._DISABLED
    assert any(isinstance(v, stats_graph._Graphed) for v in stats_graph._CACHE._d.values())
    assert [l.iso.ratio for l in first[2].layers] == [l.iso.ratio for l in first[0].layers]
    assert bool(restarted) == restarts, restarted
    with torch.no_grad():
        model.blocks[2][0].weight.mul_(1.01)
    bad = run()
    assert not bad.passed and bad.culprit.startswith("blocks.2")
    assert not kernels._DISABLED, kernels._DISABLED
    restarted.clear()
    assert [l.iso.ratio for l in run().layers] == [l.iso.ratio for l in bad.layers]
    assert bool(restarted) == restarts, restarted


@pytest.mark.parametrize("side", [True, False])
def test_a_part_started_during_the_pass_reads_what_the_stream_wrote_before_it(monkeypatch, side) -> None:
    """A part of the statistics started while the main stream is still busy (a 20 ms spin, then
    the write of the candidate) judges the written candidate, on the side stream as on the main
    one: the side stream must wait for the main stream's queue first. Three passes: eager, eager
    with the graph captured, the graph replayed."""
    from pytest_rocm_parity import replay as replay_mod
    from pytest_rocm_parity import stats_graph
    from pytest_rocm_parity.tolerance import Tolerance

    monkeypatch.setattr(stats_graph, "_CACHE", kernels._TableCache(stats_graph.CACHE_SIZE))
    monkeypatch.setattr(replay_mod._StatsQueue, "LAUNCH_BYTES", 1)    # every leaf starts a part
    monkeypatch.setattr(replay_mod._StatsQueue, "SIDE_STREAM", side)
    monkeypatch.setattr(replay_mod, "_SIDE_STREAMS", {})
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 1 << 22
    truth = torch.randn(n, device="cuda", dtype=torch.float64, generator=g)
    ref = truth.to(torch.bfloat16)
    res = (truth - ref.double()).to(torch.bfloat16)
    bug = (truth * 1.05).to(torch.bfloat16)
    want = residual_metrics("x", bug, ref, res, 2.0**-8)
    tol = Tolerance()
    for _ in range(3):
        c = torch.zeros_like(ref)
        torch.cuda.synchronize()
        torch.cuda._sleep(40_000_000)   # about 20 ms at 2 GHz
        c.copy_(bug)                      # queued behind the spin on the main stream
        q = replay_mod._StatsQueue("bfloat16", 2.0**-8, None)
        sink: list = []
        q.add(sink, "x", c, ref, res, tol, True, "x", snapshot=False)
        assert len(q.parts) == 1          # started at once, while the spin still runs
        q.flush()
        assert sink[0].ratio == pytest.approx(want.ratio, rel=1e-5)
        assert sink[0].z == pytest.approx(want.z, abs=1e-6)
    assert bool(replay_mod._SIDE_STREAMS) == side


def test_the_kept_stream_object_is_the_stream_torch_says_is_current() -> None:
    """kernels.current_stream keeps one Stream object per stream, yet follows a stream context."""
    dev = torch.device("cuda", torch.cuda.current_device())
    main = kernels.current_stream(dev)
    assert main == torch.cuda.current_stream(dev) and kernels.current_stream(dev) is main
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):
        assert kernels.current_stream(dev) == side != main
    assert kernels.current_stream(dev) is main
