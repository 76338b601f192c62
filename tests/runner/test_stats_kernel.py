"""The per-block statistics (compare.block_stats): Triton kernel, torch fallback and the metrics built on them."""
from __future__ import annotations

import math
import textwrap

import pytest
import torch

from pytest_rocm_parity.judging import compare

from pytest_rocm_parity.runner import kernels
from pytest_rocm_parity.judging.compare import Stat, block_layout, block_stats, float_metrics, residual_metrics
from interpreted import run_interpreted

pytestmark = pytest.mark.triton

RES_DTYPE = {torch.bfloat16: torch.bfloat16, torch.float16: torch.bfloat16, torch.float32: torch.float32,
             torch.float64: torch.float64}


def _case(dtype: torch.dtype, n: int, seed: int = 0, rel: float = 1e-3) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    truth = torch.randn(n, dtype=torch.float64, generator=g)
    ref = truth.to(dtype)
    cand = (truth * (1 + rel * torch.randn(n, dtype=torch.float64, generator=g))).to(dtype)
    res = (truth - ref.double()).to(RES_DTYPE[dtype])
    return cand, ref, res, truth


def _naive(c: torch.Tensor, r: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """The definition, element by element in float64: what both implementations must compute."""
    nb, size = block_layout(c.numel())
    out = torch.zeros((nb, len(Stat)), dtype=torch.float64)
    for b in range(nb):
        cc, rr, ee = (x[b * size:(b + 1) * size].double() for x in (c, r, e))
        d = cc - rr
        ec = d - ee
        row = out[b]
        row[Stat.CAND_ERR2] = (ec * ec).sum()
        row[Stat.REF_ERR2] = (ee * ee).sum()
        row[Stat.TRUTH2] = ((rr + ee) ** 2).sum()
        row[Stat.REF2] = (rr * rr).sum()
        row[Stat.DIFF2] = (d * d).sum()
        row[Stat.CAND_FARTHER] = (ec.abs() > ee.abs()).sum()
        row[Stat.CAND_CLOSER] = (ec.abs() < ee.abs()).sum()
        row[Stat.MAX_ABS_DIFF] = d.abs().max()
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 3, 63, 64, 65, 4097, 70001])
def test_torch_fallback_matches_the_definition(dtype: torch.dtype, n: int) -> None:
    c, r, e, _ = _case(dtype, n)
    got = kernels.block_stats_torch(c, r, e, *block_layout(n), chunk=1000)   # small chunks: many spans
    want = _naive(c, r, e)
    assert got.shape == (block_layout(n)[0], len(Stat))
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-30)


def test_torch_statistics_of_many_leaves_equal_one_by_one() -> None:
    """Like-shaped leaves summed together (concatenated up to a chunk) give each leaf's own rows."""
    cases = [(torch.bfloat16, 64 * 100), (torch.bfloat16, 64 * 100), (torch.bfloat16, 70001),
             (torch.float32, 64 * 100), (torch.bfloat16, 64 * 100), (torch.bfloat16, 3), (torch.bfloat16, 64 * 100)]
    leaves = [_case(dtype, n, seed=i)[:3] for i, (dtype, n) in enumerate(cases)]
    lays = [block_layout(c.numel()) for c, _, _ in leaves]
    want = torch.cat([kernels.block_stats_torch(*leaf, *lay, chunk=6400 * 2) for leaf, lay in zip(leaves, lays)])
    got = kernels.block_stats_torch_many(leaves, lays, chunk=6400 * 2)   # two like leaves per step
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_torch_statistics_of_a_leaf_of_many_dims_larger_than_a_chunk() -> None:
    """A replay hands the outputs as they are shaped ((batch, seq, vocab) logits); blocks run over the
    flattened leaf, whether it is summed alone (larger than a chunk) or beside like leaves."""
    c, r, e, _ = _case(torch.bfloat16, 4 * 25 * 70)
    shaped = [x.view(4, 25, 70) for x in (c, r, e)]
    lay = block_layout(c.numel())
    want = _naive(c, r, e)
    for chunk in (1000, 10 ** 6):   # alone (the leaf exceeds the chunk), then grouped
        got = kernels.block_stats_torch_many([tuple(shaped)], [lay], chunk=chunk)
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-30)


def test_statistics_take_torch_ops_until_they_have_read_what_the_kernel_start_up_is_worth() -> None:
    route = kernels.RentOrBuy(after=1000)
    assert [route.kernel(400) for _ in range(3)] == [False, False, True]
    assert route.kernel(1) and route.read == 1200   # bought: the kernel for good, nothing more counted
    assert kernels.RentOrBuy(after=10 ** 30).kernel(10 ** 12) is False


KERNEL_SCRIPT = textwrap.dedent('''
    import json, sys, torch
    from pytest_rocm_parity.runner import kernels
    from pytest_rocm_parity.judging.compare import block_layout
    out, leaves, lays, torch_rows = [], [], [], []
    for dtype, rdt, n in [(torch.bfloat16, torch.bfloat16, 70001), (torch.float16, torch.bfloat16, 65),
                          (torch.float32, torch.float32, 4097), (torch.float64, torch.float64, 3),
                          (torch.bfloat16, torch.bfloat16, 1)]:
        g = torch.Generator().manual_seed(n)
        t = torch.randn(n, dtype=torch.float64, generator=g)
        r = t.to(dtype); c = (t * (1 + 1e-3 * torch.randn(n, dtype=torch.float64, generator=g))).to(dtype)
        e = (t - r.double()).to(rdt)
        nb, size = block_layout(n)
        a = kernels.block_stats_many([(c, r, e)], [(nb, size)])
        b = kernels.block_stats_torch(c, r, e, nb, size)
        out.append([str(dtype), n, float(((a - b).abs() / b.abs().clamp(min=1e-300)).max()), list(a.shape)])
        leaves.append((c, r, e)); lays.append((nb, size)); torch_rows.append(b)
    want = torch.cat(torch_rows)
    for chunk in (kernels.CHUNK, 1024):   # 1024: the 70001-element leaf's blocks span two chunks
        many = kernels.block_stats_many(leaves, lays, chunk=chunk)   # the replay's one launch per dtype combination
        out.append(["many", int(want.shape[0]), float(((many - want).abs() / want.abs().clamp(min=1e-300)).max()),
                    list(many.shape)])
    # the leaves above are aligned (the vectorised loop); misaligned views (one element into their
    # storage) take the plain loop and give the same sums
    rel = lambda a, b: float(((a - b).abs() / b.abs().clamp(min=1e-300)).max())
    moved = [tuple(torch.cat([x.new_zeros(1), x])[1:] for x in leaf) for leaf in leaves]
    mis = kernels.block_stats_many(moved, lays, chunk=1024)
    ptrs = lambda ls: [x.data_ptr() for leaf in ls for x in leaf]
    out.append(["aligned", kernels.aligned(ptrs(leaves)), kernels.aligned(ptrs(moved)), rel(mis, want)])
    # a repeat gives the same sums; another order, and new values at the same addresses, their own
    first = kernels.block_stats_many(leaves, lays)
    same = torch.equal(kernels.block_stats_many(leaves, lays), first)
    rev = kernels.block_stats_many(leaves[::-1], lays[::-1])
    want_rev = torch.cat(torch_rows[::-1])
    leaves[0][0].mul_(1.5)
    changed = kernels.block_stats_many(leaves, lays)
    want0 = kernels.block_stats_torch(*leaves[0], *lays[0])
    out.append(["repeat", same, rel(rev, want_rev), rel(changed[:lays[0][0]], want0)])
    print(json.dumps(out))
''')


def test_triton_kernel_in_the_interpreter_matches_the_fallback() -> None:
    """Real Triton, run by its CPU interpreter (TRITON_INTERPRET=1 must be set before Triton loads)."""
    pytest.importorskip("triton")
    rows = run_interpreted(KERNEL_SCRIPT)
    assert len(rows) == 9
    _, same, rel_rev, rel_changed = rows.pop()
    assert same and rel_rev < 1e-5 and rel_changed < 1e-5
    _, leaves_aligned, moved_aligned, rel_misaligned = rows.pop()
    assert leaves_aligned and not moved_aligned
    assert rel_misaligned < 1e-5, rel_misaligned
    for dtype, n, rel, shape in rows[:5]:
        assert shape == [block_layout(n)[0], len(Stat)]
        assert rel < 1e-5, (dtype, n, rel)
    for _, total, rel, shape in rows[5:]:
        assert shape == [total, len(Stat)] and total == sum(block_layout(n)[0] for _, n, _, _ in rows[:5])
        assert rel < 1e-5, rel


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_residual_metrics_equal_truth_metrics(dtype: torch.dtype) -> None:
    c, r, e, _ = _case(dtype, 30011, seed=3)
    truth = r.double() + e.double()      # the truth the residual encodes exactly
    u = 2.0**-8
    a = float_metrics("x", c, r, truth, u)
    b = residual_metrics("x", c, r, e, u)
    for f in ("ratio", "ratio_lo", "err_cand", "err_ref", "rms_truth", "rel_to_ref", "max_abs_to_ref"):
        assert math.isclose(getattr(a, f), getattr(b, f), rel_tol=1e-5), f
    assert a.z == pytest.approx(b.z, abs=1e-9)


def test_residual_metrics_detect_a_bias_and_pass_a_correct_candidate() -> None:
    c, r, e, truth = _case(torch.bfloat16, 65536, seed=1, rel=0.0)
    ok = residual_metrics("x", (truth + 1e-6 * truth).to(torch.bfloat16), r, e, 2.0**-8)
    bad = residual_metrics("x", (truth * 1.02).to(torch.bfloat16), r, e, 2.0**-8)
    assert ok.ratio < 1.5 and bad.ratio_lo > 5 and bad.z > 10


def test_non_finite_values_take_the_masked_path() -> None:
    c, r, e, _ = _case(torch.float32, 1000)
    c[17] = float("nan")
    m = residual_metrics("x", c, r, e, 2.0**-24)
    assert m.nonfinite == 1 and m.first_nonfinite == [17] and "non-finite" in m.note


def test_stats_are_precomputable_and_reused() -> None:
    """The replay queues block_stats on the device and passes the host copy back in."""
    c, r, e, _ = _case(torch.float32, 5000)
    host = compare.host_stats(block_stats(c, r, e))
    a = residual_metrics("x", c, r, e, 2.0**-24, stats=host)
    host[:, Stat.CAND_ERR2] *= 4   # a tampered sum changes the verdict: the passed stats are what is used
    b = residual_metrics("x", c, r, e, 2.0**-24, stats=host)
    assert b.ratio == pytest.approx(2 * a.ratio, rel=1e-9)


def test_shape_mismatch_is_reported_not_raised() -> None:
    c, r, e, _ = _case(torch.float32, 100)
    m = residual_metrics("x", c[:50], r, e, 2.0**-24)
    assert m.note.startswith("shape") and m.ratio == math.inf


def test_metrics_match_the_definition() -> None:
    """The judging quantities of docs/judging.md, computed here directly in float64 from the tensors."""
    c, r, e, _ = _case(torch.bfloat16, 40000, seed=5, rel=3e-3)
    u = 2.0**-8
    m = residual_metrics("x", c, r, e, u)
    t = r.double() + e.double()
    ec, er = c.double() - t, r.double() - t
    err_c, err_r = float(ec.square().mean().sqrt()), float(er.square().mean().sqrt())
    plus, minus = int((ec.abs() > er.abs()).sum()), int((ec.abs() < er.abs()).sum())
    d = c.double() - r.double()
    assert m.err_cand == pytest.approx(err_c, rel=1e-5) and m.err_ref == pytest.approx(err_r, rel=1e-5)
    assert m.ratio == pytest.approx(err_c / err_r, rel=1e-5)
    assert m.z == pytest.approx((plus - minus) / math.sqrt(plus + minus), rel=1e-9)
    assert m.rms_truth == pytest.approx(float(t.square().mean().sqrt()), rel=1e-6)
    assert m.rel_to_ref == pytest.approx(float(d.square().mean().sqrt() / r.double().square().mean().sqrt()), rel=1e-5)
    assert m.max_abs_to_ref == pytest.approx(float(d.abs().max()), rel=1e-9)
    # the jackknife bound over 64 contiguous blocks, written out
    nb, size = block_layout(c.numel())
    blocks = [(ec[b * size:(b + 1) * size].square().sum(), er[b * size:(b + 1) * size].square().sum()) for b in range(nb)]
    tc, tr = sum(float(a) for a, _ in blocks), sum(float(b) for _, b in blocks)
    thetas = [0.5 * (math.log(tc - float(a)) - math.log(tr - float(b))) for a, b in blocks]
    mean = sum(thetas) / nb
    var = (nb - 1) / nb * sum((x - mean) ** 2 for x in thetas)
    assert m.ratio_lo == pytest.approx(math.exp(0.5 * (math.log(tc) - math.log(tr)) - 3.0 * math.sqrt(var)), rel=1e-5)


def test_batched_metrics_equal_one_by_one() -> None:
    """Many leaves of different sizes judged in one call give each leaf's own figures (grouping, order)."""
    cases = [_case(dt, n, seed=i, rel=rel) for i, (dt, n, rel) in enumerate(
        [(torch.bfloat16, 30011, 1e-3), (torch.float32, 64, 0.0), (torch.float16, 5, 1e-2), (torch.float32, 1, 1e-3),
         (torch.bfloat16, 70000, 0.05), (torch.float32, 4096, 1e-6)])]
    items, singles = [], []
    for k, (c, r, e, _) in enumerate(cases):
        host = compare.host_stats(block_stats(c, r, e))
        items.append((f"leaf{k}", int(r.numel()), host, 3.0))
        singles.append(residual_metrics(f"leaf{k}", c, r, e, 2.0**-8, stats=host))
    c, r, e, _ = cases[0]
    c = c.clone()
    c[3] = float("inf")
    items.append(("bad", int(r.numel()), compare.host_stats(block_stats(c, r, e)), 3.0))
    many = compare.metrics_many(items, 2.0**-8)
    assert many[-1] is None          # non-finite: left to the masked path
    for a, b in zip(many[:-1], singles):
        assert a is not None and a.leaf == b.leaf
        for f in ("ratio", "ratio_lo", "err_cand", "err_ref", "rms_truth", "rel_to_ref", "max_abs_to_ref", "z"):
            assert getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-9, abs=1e-12), (a.leaf, f)
