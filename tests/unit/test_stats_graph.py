"""The device-side judgement (stats_graph.start): statistics and judging formulas computed
where the tensors are, against compare.metrics_many over the torch statistics on the host.

Real Triton, run by its CPU interpreter in a subprocess (TRITON_INTERPRET=1 must be set before
Triton loads); the CUDA graph replay of the same launch is tested on a GPU (tests/gpu).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from pytest_rocm_parity.compare import ArrayOps, NUMPY_OPS, block_layout, metric_columns, metrics_many

SCRIPT = textwrap.dedent('''
    import json, math, torch
    from pytest_rocm_parity import kernels, stats_graph
    from pytest_rocm_parity.compare import block_layout, metrics_many
    leaves, lays, confs, items = [], [], [], []
    # sizes with 64 blocks and fewer (two nb groups, interleaved: the gathered rows), dtypes in two
    # launch groups, a leaf with an infinity (its sums are not finite) and an exact candidate
    for k, (dtype, n) in enumerate([(torch.bfloat16, 70001), (torch.float32, 5), (torch.bfloat16, 4097),
                                    (torch.float32, 63), (torch.bfloat16, 300), (torch.bfloat16, 128)]):
        g = torch.Generator().manual_seed(k)
        t = torch.randn(n, dtype=torch.float64, generator=g)
        r = t.to(dtype)
        c = (t * (1 + 1e-2 * torch.randn(n, dtype=torch.float64, generator=g))).to(dtype)
        if k == 4:
            c[7] = math.inf
        if k == 5:
            c = r.clone()
        e = (t - r.double()).to(dtype)
        nb, size = block_layout(n)
        leaves.append((c, r, e)); lays.append((nb, size)); confs.append(2.0 + k / 2)
        items.append((f"l{k}", n, kernels.block_stats_torch(c, r, e, nb, size).numpy(), confs[-1]))
    u = 2.0 ** -8
    # two parts started before either is read (as a replay starts them during its pass)
    first = stats_graph.start(leaves[:3], lays[:3], confs[:3], u)
    second = stats_graph.start(leaves[3:], lays[3:], confs[3:], u)
    import numpy as np
    cols = np.concatenate([first.columns(), second.columns()])
    want = metrics_many(items, u)
    fields = ("rms_truth", "err_cand", "err_ref", "ratio", "ratio_lo", "rel_to_ref", "max_abs_to_ref", "z")
    rows = []
    for k, w in enumerate(want):
        finite = bool(cols[k, 8] > 0)
        if w is None:
            rows.append([k, finite, None])
            continue
        rel = max(abs(float(cols[k, j]) - getattr(w, f)) / max(abs(getattr(w, f)), 1e-300)
                  for j, f in enumerate(fields))
        rows.append([k, finite, rel])
    stats = kernels.block_stats_many(leaves, lays).numpy()
    torch_stats = torch.cat([torch.from_numpy(it[2]) for it in items])
    finite = torch.isfinite(torch_stats)
    stat_rel = float((((torch.from_numpy(stats) - torch_stats).abs() / torch_stats.abs().clamp(min=1e-300))[finite]).max())
    # a launch made for these leaves, pointed at other leaves of the same signature (other
    # addresses, other values): it computes theirs (what a graph replay does each pass)
    many = kernels.ManyLaunch(leaves, lays)
    other = [(c * 1.25, r.clone(), e.clone()) for c, r, e in leaves]
    many.point_at(other)
    moved = many.run()
    want_moved = torch.cat([kernels.block_stats_torch(*o, *lay) for o, lay in zip(other, lays)])
    ok = torch.isfinite(want_moved)
    moved_rel = float((((moved - want_moved).abs() / want_moved.abs().clamp(min=1e-300))[ok]).max())
    # the same with the addresses in a host table (what a CUDA graph reads from pinned memory),
    # pointed at the other leaves and back: each run reads the leaves of the last point_at
    hosted = kernels.ManyLaunch(leaves, lays, host_pointers=True)
    hosted.point_at(other)
    h_moved = hosted.run()
    hosted.point_at(leaves, [x.data_ptr() for leaf in leaves for x in leaf])
    h_back = hosted.run()
    want_back = torch.cat([kernels.block_stats_torch(*o, *lay) for o, lay in zip(leaves, lays)])
    okb = torch.isfinite(want_back)
    host_rel = max(float((((h_moved - want_moved).abs() / want_moved.abs().clamp(min=1e-300))[ok]).max()),
                   float((((h_back - want_back).abs() / want_back.abs().clamp(min=1e-300))[okb]).max()))
    host_table = all(g[5] is not None for g in hosted.groups)
    # a launch (what a cached graph holds) keeps no reference to the leaves it was made for
    import gc, weakref
    made_for = [(c.clone(), r.clone(), e.clone()) for c, r, e in leaves]
    launch = stats_graph._Launch(made_for, lays, confs, made_for[0][0].device, False)
    alive = weakref.ref(made_for[0][0])
    del made_for
    gc.collect()
    print(json.dumps({"rows": rows, "stats_rel": stat_rel, "shape": list(cols.shape), "moved_rel": moved_rel,
                      "host_rel": host_rel, "host_table": host_table,
                      "holds_leaves": alive() is not None,
                      "graphs": sum(isinstance(v, stats_graph._Graphed) for v in stats_graph._CACHE._d.values())}))
''')


def test_device_judgement_in_the_interpreter_equals_the_host_formulas() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["shape"] == [6, 9] and got["graphs"] == 0        # no graphs off a GPU
    assert got["stats_rel"] < 1e-5 and got["moved_rel"] < 1e-5
    assert got["host_table"] and got["host_rel"] < 1e-5
    assert not got["holds_leaves"]
    for k, finite, rel in got["rows"]:
        if k == 4:
            assert not finite and rel is None                   # the infinity: the masked path
        else:
            assert finite and rel is not None and rel < 1e-5, (k, rel)   # the kernel's float32 sums


COLUMNS_SCRIPT = textwrap.dedent('''
    import json, math, numpy as np, torch
    from pytest_rocm_parity import kernels, stats_graph
    from pytest_rocm_parity.compare import block_layout, columns_many
    rng = np.random.default_rng(0)
    # 64 blocks and fewer, one block, a short last block; an infinite sum; all zeros (exact
    # agreement); no reference error (the floor decides); a candidate without error
    sizes = [70001, 5, 4097, 1, 63, 300, 128, 65, 64]   # 65: a short last block (33 of 2)
    stats = []
    for k, n in enumerate(sizes):
        nb, _ = block_layout(n)
        st = np.abs(rng.standard_normal((nb, 8)))
        st[:, 5:7] = rng.integers(0, 50, (nb, 2))
        if k == 4:
            st[2, 0] = math.inf
        if k == 6:
            st[:] = 0.0
        if k == 7:
            st[:, 1] = 0.0
        if k == 8:
            st[:, 0] = 0.0
        stats.append(st)
    confs = [2.0 + k / 3 for k in range(len(sizes))]
    u = 2.0 ** -8
    want = columns_many(stats, sizes, confs, u)
    meta = kernels.columns_meta([(len(s), 0) for s in stats], sizes, confs, torch.device("cpu"))
    got = kernels.columns_launch(torch.from_numpy(np.concatenate(stats)), meta, u).numpy()
    same_nonfinite = bool(((~np.isfinite(got)) == (~np.isfinite(want))).all() and
                          (np.isnan(got) == np.isnan(want)).all())
    ok = np.isfinite(want)
    rel = float((np.abs(got - want)[ok] / np.maximum(np.abs(want[ok]), 1e-300)).max())
    # the eager judgement uses the kernel; with it switched off, numpy: the same columns
    c, r = torch.randn(5000, dtype=torch.float64), torch.randn(5000, dtype=torch.float64)
    leaves = [(c.float(), r.float(), (r - r.float().double()).float())]
    lay = [block_layout(5000)]
    with_kernel = stats_graph.start(leaves, lay, [3.0], 2.0 ** -24).columns()
    stats_graph.COLUMNS_KERNEL = False
    without = stats_graph.start(leaves, lay, [3.0], 2.0 ** -24).columns()
    errors_before = list(stats_graph.COLUMNS_ERRORS)
    # a kernel that fails (a Triton without float64 log/exp, say): the numpy formulas judge the
    # same, the failure is kept, and a launch made after it takes the torch formulas
    stats_graph.COLUMNS_KERNEL = True
    real = kernels.columns_launch
    def broken(*a, **k):
        raise RuntimeError("no float64 log here")
    kernels.columns_launch = broken
    failed = stats_graph.start(leaves, lay, [3.0], 2.0 ** -24).columns()
    kernels.columns_launch = real
    launch = stats_graph._Launch(leaves, lay, [3.0], leaves[0][0].device, False)
    print(json.dumps({"rel": rel, "same_nonfinite": same_nonfinite, "errors": errors_before,
                      "eager_rel": float(np.abs(with_kernel - without).max() / np.abs(without).max()),
                      "failed_rel": float(np.abs(failed - without).max() / np.abs(without).max()),
                      "failure_kept": stats_graph.COLUMNS_ERRORS, "launch_meta": launch.meta is not None,
                      "launch_groups": len(launch.groups), "finite_flags": got[:, 8].tolist()}))
''')


def test_judging_formulas_kernel_equals_numpy_in_the_interpreter() -> None:
    """kernels.columns_launch (triton_stats.columns_kernel): every column, edge rows included, as
    compare.columns_many computes it on the host, to float64 rounding; the flag of finite sums."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", COLUMNS_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["errors"] == []
    assert got["rel"] < 1e-12 and got["same_nonfinite"]
    assert got["eager_rel"] < 1e-12
    assert got["failed_rel"] < 1e-12 and got["failure_kept"] == ["RuntimeError: no float64 log here"]
    assert not got["launch_meta"] and got["launch_groups"] == 1     # the torch formulas from then on
    assert got["finite_flags"] == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_metric_columns_on_torch_equal_numpy() -> None:
    """The one formula on both array libraries (the device side runs it in torch), including the
    edge rows: exact agreement (all-zero sums), a leaf of one block, a zero reference error."""
    rng = np.random.default_rng(0)
    st = np.abs(rng.standard_normal((5, 64, 8)))
    st[1] = 0.0
    st[2, :, 1] = 0.0
    st[3, :, 0] = 0.0
    n = np.array([4096.0, 100.0, 64.0, 70001.0, 128.0])
    conf = np.array([3.0, 3.0, 2.0, 4.0, 3.0])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = metric_columns(st, n, conf, 2.0**-8, NUMPY_OPS)
    b = metric_columns(torch.from_numpy(st), torch.from_numpy(n), torch.from_numpy(conf), 2.0**-8,
                       ArrayOps(torch, torch=True)).numpy()
    assert a.shape == b.shape == (5, 8)
    np.testing.assert_allclose(b, a, rtol=1e-12, atol=0)
    one = np.abs(rng.standard_normal((2, 1, 8)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a1 = metric_columns(one, np.array([1.0, 1.0]), np.array([3.0, 3.0]), 2.0**-8, NUMPY_OPS)
    b1 = metric_columns(torch.from_numpy(one), torch.tensor([1.0, 1.0], dtype=torch.float64),
                        torch.tensor([3.0, 3.0], dtype=torch.float64), 2.0**-8, ArrayOps(torch, torch=True)).numpy()
    np.testing.assert_allclose(b1, a1, rtol=1e-12, atol=0)
    assert a[1, 3] == 0.0 and a[1, 4] == 0.0          # no error on either side: ratio 0, bound 0


def test_metrics_many_columns_match_one_leaf_at_a_time() -> None:
    rng = np.random.default_rng(1)
    items = [(f"l{k}", n, np.abs(rng.standard_normal((block_layout(n)[0], 8))), 3.0) for k, n in
             enumerate([70001, 5, 4097, 1])]
    together = metrics_many(items, 2.0**-8)
    alone = [metrics_many([it], 2.0**-8)[0] for it in items]
    assert together == alone


def test_host_tables_only_on_cuda_builds_and_off_after_a_failure(monkeypatch) -> None:
    """Pinned host memory as a graph's address table: a CUDA build's GPU only (ROCm's pinned memory
    is device-visible too, but not run there), and never again in the process once it failed."""
    from pytest_rocm_parity import kernels

    monkeypatch.setattr(kernels, "HOST_POINTERS", True)
    monkeypatch.setattr(kernels, "HOST_POINTER_ERRORS", [])
    monkeypatch.setattr(torch.version, "hip", None)
    cuda = torch.device("cuda", 0)
    assert kernels.host_pointers_usable(cuda)
    assert not kernels.host_pointers_usable(torch.device("cpu"))
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    assert not kernels.host_pointers_usable(cuda)
    monkeypatch.setattr(torch.version, "hip", None)
    kernels.host_pointers_failed(ValueError("Pointer argument cannot be accessed from Triton (cpu tensor?)"))
    assert not kernels.host_pointers_usable(cuda)
    assert "cpu tensor?" in kernels.HOST_POINTER_ERRORS[0]
    monkeypatch.setattr(kernels, "HOST_POINTER_ERRORS", [])
    monkeypatch.setattr(kernels, "HOST_POINTERS", False)
    assert not kernels.host_pointers_usable(cuda)
