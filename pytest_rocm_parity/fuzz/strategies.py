"""Hypothesis strategies for fuzzing tensor operators across backends.

Built on ``hypothesis.extra.numpy`` rather than the third-party ``hypothesis-torch``
(see docs/fuzzing.md): that package never produces non-contiguous or strided
views, draws sparse layouts and ``requires_grad`` by default, and registers global
type strategies on import.  Views are where hand-written kernels break, so every
tensor strategy here can return transposed, strided and storage-offset views.

Everything shrinks towards the simplest case: contiguous layout, size 1, float32,
ordinary values.  A shrunk failure therefore names the one property that matters
(an odd size, a large value, a view) and nothing else.

Importing this module imports torch; the plugin never imports it on load.
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytest_rocm_parity.errors import InvalidArgument

__all__ = [
    "DEFAULT_BLOCKS",
    "FLOAT_DTYPES",
    "LAYOUTS",
    "LONG_BLOCKS",
    "OpArgs",
    "REGIMES",
    "ROTARY_COS_LAYOUTS",
    "ROTARY_HEAD_DIMS",
    "abs_magnitude",
    "binary_args",
    "dtypes",
    "embedding_args",
    "index_add_args",
    "layer_norm_args",
    "linear_args",
    "matmul_args",
    "matmul_magnitude",
    "reduction_args",
    "reduction_shapes",
    "resolve_dtype",
    "rms_norm_args",
    "rotary_args",
    "scatter_add_args",
    "sdpa_args",
    "shapes",
    "sizes",
    "softmax_args",
    "tensors",
    "unary_args",
    "values",
]

DtypeLike = Union[str, torch.dtype]
DtypeArg = Union[DtypeLike, st.SearchStrategy[torch.dtype], None]

# Order matters: sampled_from shrinks towards the first entry.
FLOAT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
# Tile sizes common in Triton/HIP kernels; sizes next to them hit tail-block code.
DEFAULT_BLOCKS: tuple[int, ...] = (16, 32, 64, 128)
# the element budget of every drawn shape, long rows included: a long row takes the room of the leading dims
_MAX_NUMEL = 2048
LAYOUTS: tuple[str, ...] = ("contiguous", "transposed", "strided", "offset")
REGIMES: tuple[str, ...] = ("ordinary", "large", "subnormal", "zero")

_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")
# numpy has no bfloat16: draw float32 values and round them once on the way in.
_NUMPY_DTYPE = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": np.float32}
_WIDTH: dict[str, Literal[16, 32, 64]] = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 32}


def resolve_dtype(dtype: DtypeLike) -> torch.dtype:
    """Turn ``"float16"``/``torch.float16`` into a floating torch dtype, or explain the choices."""
    if isinstance(dtype, torch.dtype):
        if dtype.is_floating_point and str(dtype).removeprefix("torch.") in _DTYPE_NAMES:
            return dtype
        raise InvalidArgument(f"dtype={dtype!r} is not supported for fuzzing; use one of {_DTYPE_NAMES}")
    name = str(dtype).removeprefix("torch.")
    aliases = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32",
               "fp64": "float64", "double": "float64"}
    name = aliases.get(name, name)
    if name not in _DTYPE_NAMES:
        close = difflib.get_close_matches(name, _DTYPE_NAMES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise InvalidArgument(f"dtype={dtype!r} is not a fuzzable dtype; use one of {_DTYPE_NAMES}.{hint}")
    resolved = getattr(torch, name, None)
    if resolved is None:  # pragma: no cover - every supported torch has these four
        raise InvalidArgument(f"this torch build lacks {name}")
    return resolved


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtypes(allowed: Sequence[DtypeLike] = FLOAT_DTYPES) -> st.SearchStrategy[torch.dtype]:
    """Floating dtypes, shrinking towards the first one given."""
    if not allowed:
        raise InvalidArgument("dtypes(allowed=()) is empty; pass at least one dtype such as 'float16'")
    return st.sampled_from([resolve_dtype(d) for d in allowed])


def _dtype_strategy(dtype: DtypeArg) -> st.SearchStrategy[torch.dtype]:
    if dtype is None:
        return dtypes()
    if isinstance(dtype, st.SearchStrategy):
        return dtype
    return st.just(resolve_dtype(dtype))


# --------------------------------------------------------------------------- shapes


def sizes(min_size: int = 1, max_size: int = 64, blocks: Sequence[int] = DEFAULT_BLOCKS) -> st.SearchStrategy[int]:
    """One dimension: any size in range, with half the draws at ``block - 1``, ``block``, ``block + 1``.

    Uniform sizes almost never land on ``N % BLOCK == 1``; the boundary branch makes
    tail blocks and exact multiples common.  Shrinks towards the smallest failing size,
    whichever branch found the failure (``_sized``).
    """
    if min_size < 0 or max_size < min_size:
        raise InvalidArgument(f"sizes(min_size={min_size!r}, max_size={max_size!r}) needs 0 <= min_size <= max_size")
    near = tuple(sorted({b for b in blocks if min_size <= b + 1 and b - 1 <= max_size}))
    return _sized(min_size, max_size, near) if near else st.integers(min_size, max_size)


_OFFSETS = (-1, 0, 1)


@st.composite
def _sized(draw: st.DrawFn, min_size: int, max_size: int, near: tuple[int, ...]) -> int:
    """A size drawn as (on a boundary?, block, offset, plain size), the same four choices either way.

    A ``one_of(integers, sampled_from(boundaries))`` cannot shrink across its branches: a failure found
    at a boundary (15) stays there although 3 fails too, because the plain branch reads the boundary's
    list index as its size.  Here the plain size is always the fourth choice, and on a boundary it is
    drawn at or above the boundary value and ignored; Hypothesis shrinks it to the boundary value, so
    switching the first choice to "plain" keeps the same size, which then shrinks freely.  Block and
    offset are separate choices, so a tail-block failure at 33 shrinks to 17 by lowering the block alone.
    """
    on_boundary = draw(st.booleans())
    block = near[draw(st.integers(0, len(near) - 1))]
    value = min(max(block + _OFFSETS[draw(st.integers(0, len(_OFFSETS) - 1))], min_size), max_size)
    plain = draw(st.integers(value if on_boundary else min_size, max_size))
    return value if on_boundary else plain


@st.composite
def shapes(
    draw: st.DrawFn,
    *,
    min_dims: int = 1,
    max_dims: int = 3,
    min_side: int = 1,
    max_side: int = 64,
    max_numel: int = _MAX_NUMEL,
    blocks: Sequence[int] = DEFAULT_BLOCKS,
) -> tuple[int, ...]:
    """Shapes whose innermost dimension gets the full (block-aware) range.

    Dimensions are drawn last to first and each is capped so the product stays
    under ``max_numel``; that keeps examples small without ``filter`` (which
    Hypothesis' health checks would count against us).
    """
    if not 0 <= min_dims <= max_dims:
        raise InvalidArgument(f"shapes(min_dims={min_dims!r}, max_dims={max_dims!r}) needs 0 <= min_dims <= max_dims")
    ndim = draw(st.integers(min_dims, max_dims))
    dims: list[int] = []
    budget = max(max_numel, 1)
    for i in range(ndim):
        hi = max(min_side, min(max_side, budget))
        side = draw(sizes(min_side, hi, blocks) if i == 0 else st.integers(min_side, min(hi, 8)))
        dims.append(side)
        budget = max(1, budget // max(side, 1))
    return tuple(reversed(dims))


def broadcastable_shapes(
    num_shapes: int = 2, *, max_dims: int = 3, max_side: int = 16
) -> st.SearchStrategy[tuple[tuple[int, ...], ...]]:
    """Shapes that broadcast together (size-1 and missing dims), from Hypothesis' own generator."""
    return hnp.mutually_broadcastable_shapes(num_shapes=num_shapes, min_dims=1, max_dims=max_dims,
                                             min_side=1, max_side=max_side).map(lambda b: b.input_shapes)


# Row lengths of the long-row regime land on these tiles' boundaries as often as the ordinary ones do on
# DEFAULT_BLOCKS: a kernel that walks a long row in 1024-wide tiles has its tail there.
LONG_BLOCKS: tuple[int, ...] = (256, 512, 1024, 2048)
def _check_long_side(strategy: str, long_side: int | None) -> None:
    if long_side is not None and (isinstance(long_side, bool) or not isinstance(long_side, int) or long_side < 1):
        raise InvalidArgument(f"{strategy}(long_side={long_side!r}) must be a positive int (the longest row of the "
                              f"long-row regime, e.g. 4096) or None to leave long rows out")


@st.composite
def reduction_shapes(draw: st.DrawFn, *, max_side: int = 160, long_side: int | None = 2048) -> tuple[int, ...]:
    """Shapes for a row-wise reduction: those of :func:`shapes`, and in one draw of four (where
    ``long_side > max_side``) a long innermost row of ``max_side + 1`` to ``long_side`` elements.

    An accumulator kept in bf16/fp16 (an online softmax's running sum) loses a bit per doubling of the
    row and shows only past a few hundred elements; ordinary draws seldom reach that.  The leading dims
    shrink to fit the same element budget, so a long draw costs what the largest ordinary one does.
    Shrinks to the ordinary regime.
    """
    if long_side is not None and long_side > max_side and draw(st.integers(0, 3)) == 3:
        n = draw(sizes(max_side + 1, long_side, LONG_BLOCKS))
        lead = draw(shapes(min_dims=0, max_dims=2, max_side=8, max_numel=max(1, _MAX_NUMEL // n), blocks=()))
        return (*lead, n)
    return draw(shapes(max_side=max_side))


# --------------------------------------------------------------------------- values


def _finfo(dtype: torch.dtype) -> torch.finfo:
    return torch.finfo(dtype)


def values(
    dtype: DtypeLike,
    *,
    regimes: Sequence[str] = REGIMES,
    ordinary: float = 8.0,
    max_magnitude: float | None = None,
    allow_nan: bool = False,
    allow_infinity: bool = False,
) -> st.SearchStrategy[float]:
    """Element values exactly representable in ``dtype`` (bfloat16 is rounded once, in ``tensors``).

    Regimes: ``ordinary`` (``|x| <= ordinary``), ``large`` (within 64x of
    ``max_magnitude``, default the dtype's max), ``subnormal`` (below the smallest
    normal), ``zero`` (+0.0 and -0.0).  NaN and infinities appear only when asked.
    Shrinks towards small ordinary values.
    """
    torch_dtype = resolve_dtype(dtype)
    name = _name(torch_dtype)
    unknown = sorted(set(regimes) - set(REGIMES))
    if unknown or not regimes:
        raise InvalidArgument(f"values(regimes={tuple(regimes)!r}): unknown {unknown}; choose from {REGIMES}")
    width = _WIDTH[name]
    info = _finfo(torch_dtype)
    top = float(info.max) if max_magnitude is None else min(float(max_magnitude), float(info.max))
    if top <= 0:
        raise InvalidArgument(f"max_magnitude={max_magnitude!r} must be positive")
    top = _representable(top, width, toward_zero=True)
    ordinary = _representable(min(ordinary, top), width, toward_zero=True)
    parts: list[st.SearchStrategy[float]] = []
    for regime in regimes:
        if regime == "ordinary":
            parts.append(st.floats(-ordinary, ordinary, width=width, allow_subnormal=False))
        elif regime == "large":
            lo = _representable(max(top / 64.0, ordinary), width, toward_zero=False)
            parts.append(st.floats(lo, top, width=width) | st.floats(-top, -lo, width=width))
        elif regime == "subnormal":
            tiny = float(info.tiny)
            # bf16 shares float32's exponent range, so float32 subnormals cover it.
            parts.append(st.floats(-tiny, tiny, width=width, allow_subnormal=True, exclude_min=True,
                                   exclude_max=True))
        elif regime == "zero":
            parts.append(st.sampled_from([0.0, -0.0]))
    if allow_nan:
        parts.append(st.just(math.nan))
    if allow_infinity:
        parts.append(st.sampled_from([math.inf, -math.inf]))
    return st.one_of(*parts)


def _representable(x: float, width: int, *, toward_zero: bool) -> float:
    """Round a bound to the float grid of ``width`` bits so ``st.floats`` accepts it."""
    np_type: Any = {16: np.float16, 32: np.float32, 64: np.float64}[width]
    with np.errstate(over="ignore"):
        v = np_type(x)
    if not np.isfinite(v):
        v = np_type(np.finfo(np_type).max)
    if toward_zero and abs(float(v)) > abs(x):
        v = np.nextafter(v, np_type(0))
    elif not toward_zero and abs(float(v)) < abs(x):
        v = np.nextafter(v, np_type(np.inf))
    return float(v)


# --------------------------------------------------------------------------- tensors


def _layouts_for(shape: tuple[int, ...], allowed: Sequence[str]) -> list[str]:
    numel = math.prod(shape)
    out = []
    for layout in allowed:
        if layout == "transposed" and (len(shape) < 2 or numel == 0):
            continue
        if layout in ("strided", "offset") and (len(shape) < 1 or numel == 0):
            continue
        out.append(layout)
    return out or ["contiguous"]


@st.composite
def tensors(
    draw: st.DrawFn,
    dtype: DtypeArg = None,
    shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    elements: st.SearchStrategy[float] | None = None,
    layouts: Sequence[str] = LAYOUTS,
) -> torch.Tensor:
    """A CPU tensor, possibly a transposed, strided (step 2-3) or storage-offset view.

    The view is built from a larger contiguous base exactly as user code makes one
    (``.t()``, ``[..., ::2]``, a slice of a flat buffer), so the kernel under test sees
    real strides.  Use :func:`pytest_rocm_parity.fuzz.harness.place` to move it to a device
    without losing the layout (``Tensor.to`` densifies strided views).
    """
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown:
        raise InvalidArgument(f"tensors(layouts=...): unknown {unknown}; choose from {LAYOUTS}")
    torch_dtype = draw(_dtype_strategy(dtype))
    name = _name(torch_dtype)
    shp = draw(shapes()) if shape is None else (draw(shape) if isinstance(shape, st.SearchStrategy) else shape)
    shp = tuple(int(s) for s in shp)
    layout = draw(st.sampled_from(_layouts_for(shp, layouts)))
    if elements is None:
        elements = values(torch_dtype)
    np_dtype = _NUMPY_DTYPE[name]

    def draw_array(shape: tuple[int, ...]) -> torch.Tensor:
        array = draw(hnp.arrays(np_dtype, shape, elements=elements))
        return torch.from_numpy(np.ascontiguousarray(array)).to(torch_dtype).clone()

    # The view's own elements are drawn first, with the shape the user sees, and the
    # storage gaps separately: shrinking the shape then shrinks both in step, so a
    # stride bug shrinks to a two-element view instead of sticking at a large one.
    if layout == "transposed":
        return draw_array((*shp[:-2], shp[-1], shp[-2])).transpose(-1, -2)
    if layout == "strided":
        step = draw(st.sampled_from([2, 3]))
        own = draw_array(shp)
        gaps = draw_array((*shp[:-1], shp[-1] * (step - 1)))
        base = torch.cat([own.unsqueeze(-1), gaps.reshape(*shp, step - 1)], dim=-1).reshape(*shp[:-1], -1)
        return base[..., ::step]
    if layout == "offset":
        offset = draw(st.integers(1, 3))
        base = torch.cat([draw_array((offset,)), draw_array(shp).reshape(-1)])
        return base[offset:].view(shp)
    return draw_array(shp)


# --------------------------------------------------------------------------- op arguments


Magnitude = Callable[..., Any]


@dataclass(frozen=True, repr=False)
class OpArgs:
    """Arguments for one operator call, plus what the error model needs to judge it.

    ``reduction_length`` is the longest sum behind any output element (rounding
    error grows with it).  ``magnitude`` maps the float64 arguments to the size of the
    terms behind each output element (``|A| @ |B|`` for a matmul), so cancellation is
    judged against the terms, not the possibly tiny result.
    """

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    reduction_length: int = 1
    magnitude: Magnitude | None = None
    names: tuple[str, ...] = ()
    # roundings in the output's own precision per element, when a kernel legitimately stores
    # partial results in it (a blocked prefix sum carries each block's total in the output dtype)
    inter: float | None = None

    def __repr__(self) -> str:
        from pytest_rocm_parity.fuzz.values import describe_value

        names = self.names or tuple(f"arg{i}" for i in range(len(self.args)))
        parts = [f"{n}={describe_value(a)}" for n, a in zip(names, self.args)]
        parts += [f"{k}={describe_value(v)}" for k, v in self.kwargs.items()]
        return f"OpArgs({', '.join(parts)}; K={self.reduction_length})"


def _scaled_max(dtype: torch.dtype, k: int, power: float = 0.5) -> float:
    """Largest magnitude whose products/squares summed ``k`` times stay finite in float32 accumulation."""
    acc_max = float(torch.finfo(torch.float32).max) if dtype != torch.float64 else float(torch.finfo(dtype).max)
    own_max = float(torch.finfo(dtype).max)
    return min(own_max, (acc_max / max(k, 1)) ** power / 4.0)


def _gemm_max(dtype: torch.dtype, k: int) -> float:
    """Element cap keeping ``|A| @ |B|`` inside the dtype's range as well as float32's.

    An unfused bias epilogue (the CPU's) rounds ``x @ W.T`` to the dtype before adding
    ``b``; inf there is a fusion difference, not a kernel bug.  Pass ``max_magnitude``
    to probe it deliberately.
    """
    return min(_scaled_max(dtype, k), math.sqrt(float(torch.finfo(dtype).max) / (2 * max(k, 1))))


@st.composite
def matmul_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_side: int = 48, batch: bool = True,
                max_magnitude: float | None = None, regimes: Sequence[str] = REGIMES) -> OpArgs:
    """``A @ B`` with block-boundary M/N/K, broadcast batch dims and (often) a transposed ``B``.

    Values are capped so that no product sum can overflow float32 accumulation: beyond
    that every backend overflows and there is no parity question to ask.
    """
    dt = draw(_dtype_strategy(dtype))
    m, k, n = (draw(sizes(1, max_side)) for _ in range(3))
    batch_a: tuple[int, ...] = ()
    batch_b: tuple[int, ...] = ()
    if batch and draw(st.booleans()):
        batch_a, batch_b = draw(broadcastable_shapes(2, max_dims=2, max_side=3))
    elems = values(dt, max_magnitude=max_magnitude or _gemm_max(dt, k), regimes=regimes)
    a = draw(tensors(dt, (*batch_a, m, k), elements=elems))
    b = draw(tensors(dt, (*batch_b, k, n), elements=elems))
    return OpArgs((a, b), reduction_length=k, magnitude=matmul_magnitude, names=("a", "b"))


def matmul_magnitude(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a| @ |b|: the scale of each output element's sum, which the tolerance of a matmul grows with;
    public because a failure's reproduction script names it."""
    return torch.matmul(a.abs(), b.abs())


@st.composite
def linear_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_side: int = 48,
                max_magnitude: float | None = None, regimes: Sequence[str] = REGIMES) -> OpArgs:
    """``F.linear(x, weight, bias)``: weight is ``(out, in)``, so the GEMM reads it transposed."""
    dt = draw(_dtype_strategy(dtype))
    k, n = draw(sizes(1, max_side)), draw(sizes(1, max_side))
    lead = draw(st.lists(st.integers(1, 4), min_size=1, max_size=2))
    elems = values(dt, max_magnitude=max_magnitude or _gemm_max(dt, k), regimes=regimes)
    x = draw(tensors(dt, (*lead, k), elements=elems))
    w = draw(tensors(dt, (n, k), elements=elems))
    bias = draw(st.none() | tensors(dt, (n,), elements=elems))
    return OpArgs((x, w, bias), reduction_length=k, magnitude=_linear_magnitude, names=("x", "weight", "bias"))


def _linear_magnitude(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    out = x.abs() @ w.abs().T
    return out if b is None else out + b.abs()


@st.composite
def sdpa_args(
    draw: st.DrawFn,
    dtype: DtypeArg = None,
    *,
    max_seq: int = 40,
    head_dims: Sequence[int] = (8, 16, 32, 64),
    gqa: bool = True,
    masks: bool = True,
    causal: bool = True,
    regimes: Sequence[str] = REGIMES,
) -> OpArgs:
    """``F.scaled_dot_product_attention`` with bool/additive masks, ``is_causal`` and GQA.

    No row is ever fully masked: backends legitimately disagree there (NaN versus
    zeros), which is a semantic choice, not a numerical one.
    """
    dt = draw(_dtype_strategy(dtype))
    b = draw(st.integers(1, 2))
    h_kv = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 4])) if gqa else 1
    h_q = h_kv * group
    l_q = draw(sizes(1, max_seq))
    s_kv = draw(sizes(1, max_seq))
    d = draw(st.sampled_from(list(head_dims)))
    elems = values(dt, ordinary=4.0, max_magnitude=16.0, regimes=regimes)
    q = draw(tensors(dt, (b, h_q, l_q, d), elements=elems))
    k = draw(tensors(dt, (b, h_kv, s_kv, d), elements=elems))
    v = draw(tensors(dt, (b, h_kv, s_kv, d), elements=elems))
    kwargs: dict[str, Any] = {}
    kind = draw(st.sampled_from(["none"] + (["bool", "float"] if masks else []) + (["causal"] if causal else [])))
    if kind == "causal":
        kwargs["is_causal"] = True
    elif kind == "bool":
        keep = draw(hnp.arrays(np.bool_, (l_q, s_kv)))
        keep[:, 0] = True
        kwargs["attn_mask"] = torch.from_numpy(keep.copy())
    elif kind == "float":
        add = draw(hnp.arrays(np.float32, (l_q, s_kv), elements=st.sampled_from([0.0, -1.0, -math.inf])))
        add[:, 0] = 0.0
        kwargs["attn_mask"] = torch.from_numpy(add.copy()).to(dt)
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.sampled_from([0.5, 1.0 / 3.0, 0.125]))
    if group > 1:
        kwargs["enable_gqa"] = True
    return OpArgs((q, k, v), kwargs, reduction_length=max(d, s_kv), magnitude=_sdpa_magnitude,
                  names=("query", "key", "value"))


def sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                   is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                   *, _weights: bool = False) -> torch.Tensor:
    """Attention written out (math path), independent of any fused kernel."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q @ k.transpose(-1, -2)) * scale
    l_q, s_kv = q.shape[-2], k.shape[-2]
    if is_causal:
        keep = torch.ones(l_q, s_kv, dtype=torch.bool).tril()
        logits = logits.masked_fill(~keep, -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, -math.inf)
        else:
            logits = logits + attn_mask.to(logits.dtype)
    weights = torch.softmax(logits, dim=-1)
    if _weights:
        return torch.stack([weights, logits.nan_to_num(posinf=0.0, neginf=0.0)])
    return weights @ v


def _sdpa_magnitude(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    # Error in the output = sum_j P_ij * |V_j| * (rounding of P + error of exp(s_j - max s)),
    # and exp's error grows with |s_j - max s| <= |s_j| + |max s|.
    weights, logits = sdpa_reference(q, k, v, **kwargs, _weights=True)
    logits = logits.abs() + logits.amax(-1, keepdim=True).abs()
    vv = v
    if kwargs.get("enable_gqa") and k.shape[-3] != q.shape[-3]:
        vv = v.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    return (weights * (1.0 + logits.abs())) @ vv.abs()


@st.composite
def softmax_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_side: int = 160, long_side: int | None = 2048,
                 regimes: Sequence[str] = REGIMES, dim: int | None = None) -> OpArgs:
    """``softmax(x, dim)``, usually over the last (block) dimension; large values included; a quarter of
    the rows up to ``long_side`` (:func:`reduction_shapes`). ``dim=-1`` always reduces the last
    dimension, for a kernel that only does (a row-wise Triton softmax); ``None`` draws any."""
    if dim not in (None, -1):
        raise InvalidArgument(f"softmax_args(dim={dim!r}) must be -1 (always the last dimension) or None (any "
                              f"dimension of the drawn shape)")
    _check_long_side("softmax_args", long_side)
    dt = draw(_dtype_strategy(dtype))
    shp = draw(reduction_shapes(max_side=max_side, long_side=long_side))
    x = draw(tensors(dt, shp, elements=values(dt, max_magnitude=1e4, regimes=regimes)))
    # a long row is drawn to be reduced: its leading dims are 1s, which test nothing
    if dim is None:
        dim = -1 if shp[-1] > max_side else draw(st.sampled_from([-1] + list(range(-len(shp), -1))))
    return OpArgs((x,), {"dim": dim}, reduction_length=shp[dim], names=("x",))


@st.composite
def layer_norm_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_side: int = 160,
                    long_side: int | None = 2048, regimes: Sequence[str] = REGIMES) -> OpArgs:
    """``F.layer_norm(x, (N,), weight, bias, eps)`` with optional affine parameters; a quarter of the rows
    up to ``long_side`` (:func:`reduction_shapes`)."""
    _check_long_side("layer_norm_args", long_side)
    dt = draw(_dtype_strategy(dtype))
    shp = draw(reduction_shapes(max_side=max_side, long_side=long_side))
    n = shp[-1]
    x = draw(tensors(dt, shp, elements=values(dt, max_magnitude=_scaled_max(dt, n), regimes=regimes)))
    w = draw(st.none() | tensors(dt, (n,), elements=values(dt, regimes=("ordinary",))))
    b = draw(st.none() | tensors(dt, (n,), elements=values(dt, regimes=("ordinary",))))
    eps = draw(st.sampled_from([1e-5, 1e-6]))
    if draw(st.booleans()):   # rows whose variance is eps: only there does the eps used (or where) show
        _rows_near_eps(x, eps, centred=True, regimes=regimes)
    return OpArgs((x, (n,), w, b, eps), reduction_length=n, magnitude=_layer_norm_magnitude,
                  names=("x", "normalized_shape", "weight", "bias", "eps"))


def _layer_norm_magnitude(x: torch.Tensor, shape: Any, w: torch.Tensor | None, b: torch.Tensor | None,
                          eps: float) -> torch.Tensor:
    # the mean's rounding scales with the terms summed into it, mean(|x|), not with |mean|: where
    # they cancel (x = [-3, 3, 0, ...]) a correct kernel's output at the zeros is the mean's rounding
    rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    out = (x.abs() + x.abs().mean(-1, keepdim=True)) * rstd
    if w is not None:
        out = out * w.abs()
    return out if b is None else out + b.abs()


@st.composite
def rms_norm_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_side: int = 160, long_side: int | None = 2048,
                  max_magnitude: float | None = None, layouts: Sequence[str] = LAYOUTS,
                  regimes: Sequence[str] = REGIMES, affine: bool | None = None,
                  weight_layouts: Sequence[str] | None = None) -> OpArgs:
    """``F.rms_norm(x, (N,), weight, eps)``; magnitudes up to what float32 can square and sum.

    ``layouts`` are x's; ``weight_layouts`` the weight's, ``layouts`` where None: ``("contiguous",)``
    fuzzes x's strides against a kernel that requires a contiguous weight (an nn.Parameter's).

    ``affine``: ``None`` draws the weight or ``weight=None`` (shrinking to None, the simpler call), so a
    kernel that breaks without a weight is found; ``True`` always draws one, for a kernel whose contract
    requires it (a Llama-style RMSNorm); ``False`` never does.  A quarter of the rows are up to
    ``long_side`` long (:func:`reduction_shapes`).
    """
    if affine not in (None, True, False):
        raise InvalidArgument(f"rms_norm_args(affine={affine!r}) must be True (always a weight), False (never) "
                              f"or None (sometimes)")
    _check_long_side("rms_norm_args", long_side)
    dt = draw(_dtype_strategy(dtype))
    shp = draw(reduction_shapes(max_side=max_side, long_side=long_side))
    n = shp[-1]
    top = _scaled_max(dt, n) if max_magnitude is None else max_magnitude
    x = draw(tensors(dt, shp, elements=values(dt, max_magnitude=top, regimes=regimes), layouts=layouts))
    weight = tensors(dt, (n,), elements=values(dt, regimes=("ordinary",)),
                     layouts=layouts if weight_layouts is None else weight_layouts)
    w = draw(weight if affine else st.none() if affine is False else st.none() | weight)
    eps = draw(st.sampled_from([1e-6, 1e-5]))
    if draw(st.booleans()):   # rows whose mean square is eps: only there does where eps is added show
        _rows_near_eps(x, eps, centred=False, regimes=regimes)
    return OpArgs((x, (n,), w, eps), reduction_length=n, names=("x", "normalized_shape", "weight", "eps"))


def _rows_near_eps(x: torch.Tensor, eps: float, *, centred: bool, regimes: Sequence[str]) -> None:
    """Scale each row of ``x``, in place and in its own layout, so that its variance (``centred``: a
    LayerNorm's) or mean square (an RMSNorm's) is ``eps``.

    An epsilon added after the square root, dropped, or hard-coded to another value changes such a
    row's output by a third or more, where in a row of ordinary magnitude it changes nothing a rounding
    would not.  The whole row is scaled, its mean too: shifting only the deviations would leave them
    below the rounding of a large mean in bf16/fp16.  Elements the scaling takes below the smallest
    normal become zero where ``regimes`` leaves subnormals out (Triton's interpreter misreads them).
    """
    wide = x.double()
    spread = wide.var(-1, unbiased=False, keepdim=True) if centred else wide.pow(2).mean(-1, keepdim=True)
    scaled = torch.where(spread > 0, wide * (eps / spread.clamp_min(1e-300)).sqrt(), wide)
    if "subnormal" not in regimes:
        scaled = torch.where(scaled.abs() < float(torch.finfo(x.dtype).tiny), 0.0, scaled)
    x.copy_(scaled.to(x.dtype))


# Llama's 128 and a non-power-of-two (96: Phi-2 style, 48 per half) beside the small ones
ROTARY_HEAD_DIMS: tuple[int, ...] = (2, 8, 16, 64, 128, 96)
ROTARY_COS_LAYOUTS: tuple[str, ...] = ("table", "batched")
# b*h*t*d of the largest case before head dims over 64 were drawn: a larger head takes fewer positions
_ROTARY_NUMEL = 2 * 3 * 40 * 64


@st.composite
def rotary_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_seq: int = 40,
                regimes: Sequence[str] = REGIMES, head_dims: Sequence[int] = ROTARY_HEAD_DIMS,
                cos_layout: str = "table") -> OpArgs:
    """``(x, cos, sin)`` for rotate-half rotary embedding, ``x`` of shape (B, H, T, D); positions up to
    ``max_seq``, base 10000.

    ``head_dims``: the D drawn, even numbers; the default holds 128 and 96, whose half (48) is not a
    power of two, which a kernel's ``tl.arange(0, D // 2)`` cannot take. ``cos_layout``: ``"table"``
    gives cos/sin of shape (T, D), one table for the batch; ``"batched"`` of shape (B, T, D), each
    sequence at its own positions, as Hugging Face's rotary embedding returns them (its
    ``apply_rotary_pos_emb`` unsqueezes dim 1, as :func:`apply_rotary` does).
    """
    if cos_layout not in ROTARY_COS_LAYOUTS:
        raise InvalidArgument(f"rotary_args(cos_layout={cos_layout!r}): choose from {ROTARY_COS_LAYOUTS}")
    bad = [d for d in head_dims if not isinstance(d, int) or d < 2 or d % 2]
    if bad or not head_dims:
        raise InvalidArgument(f"rotary_args(head_dims={tuple(head_dims)!r}): give even head dims >= 2 (rotate-half "
                              f"splits D in two halves)")
    dt = draw(_dtype_strategy(dtype))
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    t = draw(sizes(1, max_seq))
    d = draw(st.sampled_from(list(head_dims)))
    t = max(1, min(t, _ROTARY_NUMEL // (b * h * d))) if d > 64 else t
    x = draw(tensors(dt, (b, h, t, d), elements=values(dt, max_magnitude=1e3, regimes=regimes)))
    starts = [draw(st.integers(0, 4096)) for _ in range(b if cos_layout == "batched" else 1)]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.stack([torch.outer(torch.arange(s0, s0 + t, dtype=torch.float64), inv) for s0 in starts])
    emb = torch.cat([angles, angles], dim=-1)
    if cos_layout == "table":
        emb = emb[0]
    return OpArgs((x, emb.cos().to(dt), emb.sin().to(dt)), reduction_length=2,
                  magnitude=_rotary_magnitude, names=("x", "cos", "sin"))


def _rotary_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin broadcast against x (B, H, T, D): Hugging Face's (B, T, D) get the head dimension."""
    if x.dim() == 4 and cos.dim() == 3:
        return cos.unsqueeze(1), sin.unsqueeze(1)
    return cos, sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The Llama/NeoX rotary convention: ``[-x2, x1]``."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Eager rotary embedding, the operator fuzzed by :func:`rotary_args`; cos/sin of shape (T, D) or,
    with x of shape (B, H, T, D), Hugging Face's (B, T, D)."""
    cos, sin = _rotary_tables(x, cos, sin)
    return x * cos + rotate_half(x) * sin


def _rotary_magnitude(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = _rotary_tables(x, cos, sin)
    return x.abs() * cos.abs() + rotate_half(x).abs() * sin.abs()


@st.composite
def embedding_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_vocab: int = 300,
                   regimes: Sequence[str] = REGIMES) -> OpArgs:
    """``F.embedding(indices, weight)``: a gather, so the result must be exact."""
    dt = draw(_dtype_strategy(dtype))
    vocab = draw(sizes(1, max_vocab))
    dim = draw(sizes(1, 64))
    weight = draw(tensors(dt, (vocab, dim), elements=values(dt, regimes=regimes)))
    idx_shape = draw(shapes(min_dims=1, max_dims=2, max_side=16, blocks=()))
    idx = draw(hnp.arrays(np.int64, idx_shape, elements=st.integers(0, vocab - 1)))
    return OpArgs((torch.from_numpy(idx.copy()), weight), names=("indices", "weight"))


_REDUCTIONS = ("sum", "mean", "amax", "amin", "var", "norm", "logsumexp", "cumsum")


@st.composite
def reduction_args(draw: st.DrawFn, dtype: DtypeArg = None, *, op: str = "sum", max_side: int = 160,
                   long_side: int | None = 2048, regimes: Sequence[str] = REGIMES) -> OpArgs:
    """``x, dim, keepdim`` for ``torch.<op>``; ``op`` picks the matching error magnitude; a quarter of the
    innermost dims up to ``long_side`` (:func:`reduction_shapes`)."""
    if op not in _REDUCTIONS:
        raise InvalidArgument(f"reduction_args(op={op!r}); choose from {_REDUCTIONS}")
    _check_long_side("reduction_args", long_side)
    dt = draw(_dtype_strategy(dtype))
    shp = draw(reduction_shapes(max_side=max_side, long_side=long_side))
    # a long row is drawn to be reduced: its leading dims are 1s, which test nothing
    dim = -1 if shp[-1] > max_side else draw(st.sampled_from(list(range(-len(shp), 0))))
    k = shp[dim]
    power = 0.5 if op in ("var", "norm") else 1.0
    x = draw(tensors(dt, shp, elements=values(dt, max_magnitude=_scaled_max(dt, k, power), regimes=regimes)))
    kwargs: dict[str, Any] = {"dim": dim}
    if op != "cumsum":
        kwargs["keepdim"] = draw(st.booleans())
    if op == "var" and k == 1:
        kwargs["correction"] = 0  # the unbiased variance of one element is a division by zero
    # A parallel scan (CUDA's, measured on an H200) carries block totals in the output dtype:
    # about log2(K) extra roundings of the running sum, which a sequential CPU scan does not show.
    inter = 2.0 + math.ceil(math.log2(k)) if op == "cumsum" and k > 1 else None
    return OpArgs((x,), kwargs, reduction_length=k, magnitude=_REDUCTION_MAGNITUDE.get(op), names=("x",),
                  inter=inter)


def _abs_sum(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    return x.abs().sum(dim, keepdim=keepdim)


def _abs_mean(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    return x.abs().mean(dim, keepdim=keepdim)


def _var_mag(x: torch.Tensor, dim: int, keepdim: bool = False, correction: int = 1) -> torch.Tensor:
    # A one-pass or Welford variance loses digits in proportion to mean^2, not var.
    return (x * x).mean(dim, keepdim=keepdim) * 2.0


def _abs_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.abs().cumsum(dim)


_REDUCTION_MAGNITUDE: dict[str, Magnitude] = {"sum": _abs_sum, "mean": _abs_mean, "var": _var_mag,
                                              "cumsum": _abs_cumsum}


@st.composite
def _index_case(draw: st.DrawFn, dt: torch.dtype, max_rows: int, regimes: Sequence[str]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    rows = draw(sizes(1, max_rows))
    cols = draw(sizes(1, 40))
    n_src = draw(st.integers(1, max_rows))
    # partial sums (fp16/bf16 atomics) must stay in range: cap by the number of sources
    elems = values(dt, max_magnitude=float(torch.finfo(dt).max) / (2 * (n_src + 1)), regimes=regimes)
    target = draw(tensors(dt, (rows, cols), elements=elems))
    index = draw(hnp.arrays(np.int64, (n_src,), elements=st.integers(0, rows - 1)))
    source = draw(tensors(dt, (n_src, cols), elements=elems))
    dup = int(np.bincount(index, minlength=rows).max()) + 1
    return target, torch.from_numpy(index.copy()), source, dup


@st.composite
def index_add_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_rows: int = 24,
                   regimes: Sequence[str] = REGIMES) -> OpArgs:
    """``torch.index_add(target, 0, index, source)`` with repeated indices (atomics on GPUs)."""
    dt = draw(_dtype_strategy(dtype))
    target, index, source, dup = draw(_index_case(dt, max_rows, regimes))
    return OpArgs((target, 0, index, source), reduction_length=dup, magnitude=_index_add_magnitude,
                  names=("target", "dim", "index", "source"))


def _index_add_magnitude(t: torch.Tensor, dim: int, index: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.index_add(t.abs(), dim, index, s.abs())


@st.composite
def scatter_add_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_rows: int = 24,
                     regimes: Sequence[str] = REGIMES) -> OpArgs:
    """``torch.scatter_add(target, 0, index, source)`` with an index broadcast along columns."""
    dt = draw(_dtype_strategy(dtype))
    target, index, source, dup = draw(_index_case(dt, max_rows, regimes))
    index2d = index[:, None].expand(-1, source.shape[1]).contiguous()
    return OpArgs((target, 0, index2d, source), reduction_length=dup, magnitude=_scatter_add_magnitude,
                  names=("target", "dim", "index", "source"))


def _scatter_add_magnitude(t: torch.Tensor, dim: int, index: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.scatter_add(t.abs(), dim, index, s.abs())


@st.composite
def binary_args(draw: st.DrawFn, dtype: DtypeArg = None, *, regimes: Sequence[str] = REGIMES) -> OpArgs:
    """Two broadcastable tensors for elementwise ``add``/``mul``/``where``-style ops."""
    dt = draw(_dtype_strategy(dtype))
    sa, sb = draw(broadcastable_shapes(2, max_side=40))
    elems = values(dt, max_magnitude=math.sqrt(float(torch.finfo(dt).max)) / 2, regimes=regimes)
    return OpArgs((draw(tensors(dt, sa, elements=elems)), draw(tensors(dt, sb, elements=elems))),
                  magnitude=None, names=("a", "b"))


def abs_magnitude(x: torch.Tensor) -> torch.Tensor:
    """|x|: the scale to judge an activation's error against where its formula cancels, as
    ``x * 0.5 * (1 + erf(x / sqrt 2))`` (GELU) does for x << 0: its result is tiny, the rounding of the
    sum is not; public because a failure's reproduction script names it."""
    return x.abs()


@st.composite
def unary_args(draw: st.DrawFn, dtype: DtypeArg = None, *, max_magnitude: float | None = None,
               ordinary: float = 8.0, magnitude: Callable[..., torch.Tensor] | None = None,
               regimes: Sequence[str] = REGIMES) -> OpArgs:
    """One tensor for an elementwise op (activations); ``magnitude``: the scale its error is judged
    against (abs_magnitude for GELU-like activations), else the truth's own."""
    dt = draw(_dtype_strategy(dtype))
    x = draw(tensors(dt, elements=values(dt, ordinary=ordinary, max_magnitude=max_magnitude, regimes=regimes)))
    return OpArgs((x,), magnitude=magnitude, names=("x",))
