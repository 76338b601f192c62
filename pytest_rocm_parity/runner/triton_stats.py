"""The Triton statistics kernel (see kernels.py); imported only where Triton is installed.

It computes the per-block sums of judging.columns.Stat and nothing else: the judging formulas run
on the host (compare.metric_columns). Its output rows are Stat's columns, in that order (_terms),
NCOLS wide (kernels.kernel_constants passes len(Stat); the kernel asserts it holds a term for each).

The kernel is kept undecorated: kernels.py wraps it with triton.jit when first used, for a GPU
or (TRITON_INTERPRET=1 set before Triton loads) for Triton's CPU interpreter, which needs ``tl``
as a module global. The small device functions it calls are decorated here, at import, which
is as late: this module is imported only by that wrapper. Tests: the interpreter checks the
arithmetic against kernels.block_stats_torch (tests/runner/test_stats_kernel.py); Triton's compilers
for sm_90, gfx942 and gfx90a check what compiles and how it loads (tests/runner/test_kernel_codegen.py).
"""
import triton
import triton.language as tl


@triton.jit
def _load3(pc, pr, pe, offs, mask, acc_t: tl.constexpr):  # noqa: ANN001, ANN202
    c = tl.load(pc + offs, mask=mask, other=0.0).to(acc_t)
    r = tl.load(pr + offs, mask=mask, other=0.0).to(acc_t)
    e = tl.load(pe + offs, mask=mask, other=0.0).to(acc_t)
    return c, r, e


@triton.jit
def _terms(c, r, e):  # noqa: ANN001, ANN202
    """The per-element terms of Stat, in its order: CAND_ERR2, REF_ERR2, TRUTH2, REF2,
    DIFF2, CAND_FARTHER, CAND_CLOSER (summed) and MAX_ABS_DIFF (a maximum)."""
    d = c - r            # candidate - reference
    ec = d - e           # candidate - truth (truth = reference + residual)
    t = r + e
    ac = tl.abs(ec)
    ar = tl.abs(e)
    return (ec * ec, e * e, t * t, r * r, d * d, (ac > ar).to(tl.float32), (ac < ar).to(tl.float32),
            tl.abs(d))


@triton.jit
def _store8(o, v0, v1, v2, v3, v4, v5, v6, v7):  # noqa: ANN001, ANN202
    """One row of Stat's columns (the eight _terms) to o[0:8]."""
    tl.store(o + 0, v0)
    tl.store(o + 1, v1)
    tl.store(o + 2, v2)
    tl.store(o + 3, v3)
    tl.store(o + 4, v4)
    tl.store(o + 5, v5)
    tl.store(o + 6, v6)
    tl.store(o + 7, v7)


@triton.jit
def _pointer(P, leaf, code: tl.constexpr, ALIGNED: tl.constexpr):  # noqa: N803, ANN001, ANN202
    """Leaf ``leaf``'s data pointer from the table P. ALIGNED: the host checked that it is 16-byte
    aligned, and the hint lets the compiler vectorise the loads (checked in the PTX for sm_90:
    without it every lane loads 2 bytes at a time; tests/runner/test_kernel_codegen.py)."""
    a = tl.load(P + leaf)
    if code == 0:
        p = a.to(tl.pointer_type(tl.bfloat16))
    elif code == 1:
        p = a.to(tl.pointer_type(tl.float16))
    elif code == 2:
        p = a.to(tl.pointer_type(tl.float32))
    else:
        p = a.to(tl.pointer_type(tl.float64))
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p


def stats_many_kernel(PC, PR, PE, WORK, OUT, CC: tl.constexpr, CR: tl.constexpr,  # noqa: N803
                      CE: tl.constexpr, F64: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr,
                      NCOLS: tl.constexpr):
    """One chunk of one jackknife block of one of many leaves: its Stat partial sums into a row of
    OUT (NCOLS float64 each).

    WORK holds (leaf, start, end, output row) per program; PC/PR/PE the leaves' data pointers as
    int64. Leaves of one launch share their dtypes (codes: 0 bfloat16, 1 float16, 2 float32,
    3 float64), so a replay judges every module of a pass with one launch per dtype combination. A
    block of a large leaf (a 4 x 512 x 128k logits tensor has 4M elements per block) is split on
    the host into chunks (kernels.CHUNK elements), one program each, so the GPU is filled; sums are
    kept per lane and reduced once at the end of the chunk.

    ALIGNED (every pointer 16-byte aligned, checked on the host): the loop runs over the chunk's
    16-element-aligned middle, whose bounds the compiler can prove aligned, so loads are
    vectorised; the at most 15 + 15 elements before and after it go through one masked step.
    Without it a bound loaded from memory defeats that proof and each lane loads one element.
    """
    tl.static_assert(NCOLS == 8, "the kernel computes eight terms (_terms): one per Stat column")
    w = tl.program_id(0)
    leaf = tl.load(WORK + w * 4)
    start = tl.load(WORK + w * 4 + 1)
    end = tl.load(WORK + w * 4 + 2)
    pc = _pointer(PC, leaf, CC, ALIGNED)
    pr = _pointer(PR, leaf, CR, ALIGNED)
    pe = _pointer(PE, leaf, CE, ALIGNED)
    acc_t = tl.float64 if F64 else tl.float32
    a0 = tl.zeros((BLOCK,), dtype=acc_t)
    a1 = tl.zeros((BLOCK,), dtype=acc_t)
    a2 = tl.zeros((BLOCK,), dtype=acc_t)
    a3 = tl.zeros((BLOCK,), dtype=acc_t)
    a4 = tl.zeros((BLOCK,), dtype=acc_t)
    a5 = tl.zeros((BLOCK,), dtype=tl.float32)
    a6 = tl.zeros((BLOCK,), dtype=tl.float32)
    a7 = tl.zeros((BLOCK,), dtype=acc_t)
    if ALIGNED:
        lo0 = ((start + 15) // 16) * 16     # multiples of 16 by construction: provably aligned
        hi0 = (end // 16) * 16
        head_end = tl.minimum(lo0, end)
        tail_lo = tl.maximum(hi0, head_end)
        lanes = tl.arange(0, 32)            # head [start, head_end) and tail [tail_lo, end)
        eoffs = tl.where(lanes < 16, start + lanes, tail_lo + lanes - 16)
        emask = tl.where(lanes < 16, eoffs < head_end, eoffs < end)
        ce, re, ee = _load3(pc, pr, pe, eoffs, emask, acc_t)   # own names: not loop-carried below
        u0, u1, u2, u3, u4, u5, u6, u7 = _terms(ce, re, ee)
    else:
        lo0 = start
        hi0 = end
    for lo in range(lo0, hi0, BLOCK):
        offs = lo + tl.arange(0, BLOCK)
        c, r, e = _load3(pc, pr, pe, offs, offs < hi0, acc_t)
        t0, t1, t2, t3, t4, t5, t6, t7 = _terms(c, r, e)
        a0 += t0
        a1 += t1
        a2 += t2
        a3 += t3
        a4 += t4
        a5 += t5
        a6 += t6
        a7 = tl.maximum(a7, t7)
    s0 = tl.sum(a0.to(tl.float64), axis=0)
    s1 = tl.sum(a1.to(tl.float64), axis=0)
    s2 = tl.sum(a2.to(tl.float64), axis=0)
    s3 = tl.sum(a3.to(tl.float64), axis=0)
    s4 = tl.sum(a4.to(tl.float64), axis=0)
    s5 = tl.sum(a5.to(tl.float64), axis=0)
    s6 = tl.sum(a6.to(tl.float64), axis=0)
    s7 = tl.max(a7.to(tl.float64), axis=0)
    if ALIGNED:
        s0 += tl.sum(u0.to(tl.float64), axis=0)
        s1 += tl.sum(u1.to(tl.float64), axis=0)
        s2 += tl.sum(u2.to(tl.float64), axis=0)
        s3 += tl.sum(u3.to(tl.float64), axis=0)
        s4 += tl.sum(u4.to(tl.float64), axis=0)
        s5 += tl.sum(u5.to(tl.float64), axis=0)
        s6 += tl.sum(u6.to(tl.float64), axis=0)
        s7 = tl.maximum(s7, tl.max(u7.to(tl.float64), axis=0))
    _store8(OUT + tl.load(WORK + w * 4 + 3) * NCOLS, s0, s1, s2, s3, s4, s5, s6, s7)
