"""The Triton statistics kernel (see kernels.py); imported only where Triton is installed.

Kept undecorated at module level: kernels.py wraps it with triton.jit for a GPU or with Triton's
interpreter for CPU tests, and the interpreter needs ``tl`` as a module global.
"""
import triton.language as tl


def stats_kernel(C, R, E, OUT, n, size, tiles, F64: tl.constexpr, BLOCK: tl.constexpr):  # noqa: N803
    """One tile of one jackknife block: eight partial sums into OUT[block, tile, :]."""
    b = tl.program_id(0)
    j = tl.program_id(1)
    start = b * size + j * BLOCK
    end = tl.minimum((b + 1) * size, n)
    offs = start + tl.arange(0, BLOCK)
    mask = offs < end
    if F64:
        c = tl.load(C + offs, mask=mask, other=0.0).to(tl.float64)
        r = tl.load(R + offs, mask=mask, other=0.0).to(tl.float64)
        e = tl.load(E + offs, mask=mask, other=0.0).to(tl.float64)
    else:
        c = tl.load(C + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
        e = tl.load(E + offs, mask=mask, other=0.0).to(tl.float32)
    d = c - r            # candidate - reference
    ec = d - e           # candidate - truth (truth = reference + residual)
    t = r + e
    o = OUT + (b * tiles + j) * 8
    tl.store(o + 0, tl.sum(ec * ec, axis=0).to(tl.float64))
    tl.store(o + 1, tl.sum(e * e, axis=0).to(tl.float64))
    tl.store(o + 2, tl.sum(t * t, axis=0).to(tl.float64))
    tl.store(o + 3, tl.sum(r * r, axis=0).to(tl.float64))
    tl.store(o + 4, tl.sum(d * d, axis=0).to(tl.float64))
    ac = tl.abs(ec)
    ar = tl.abs(e)
    tl.store(o + 5, tl.sum((ac > ar).to(tl.float32), axis=0).to(tl.float64))
    tl.store(o + 6, tl.sum((ac < ar).to(tl.float32), axis=0).to(tl.float64))
    tl.store(o + 7, tl.max(tl.abs(d), axis=0).to(tl.float64))
