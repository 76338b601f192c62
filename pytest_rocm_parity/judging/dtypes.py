"""Dtype names <-> torch dtypes, built with getattr so fp8 variants work where they exist."""
from __future__ import annotations

import functools
from typing import Any

from pytest_rocm_parity.errors import InvalidArgument

FLOAT_NAMES = ("float64", "float32", "bfloat16", "float16")
RUNGS = FLOAT_NAMES[1:]   # the precisions a check is judged at; float64 is the truth's
_FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
_ALIASES = {
    "fp64": "float64", "double": "float64", "fp32": "float32", "float": "float32",
    "bf16": "bfloat16", "fp16": "float16", "half": "float16",
}
# Unit roundoff (half an ulp at 1.0) of each float format: the scale of one rounding.
UNIT_ROUNDOFF = {
    "float64": 2.0**-53, "float32": 2.0**-24, "tf32": 2.0**-11, "bfloat16": 2.0**-8, "float16": 2.0**-11,
    "float8_e4m3fn": 2.0**-4, "float8_e4m3fnuz": 2.0**-4, "float8_e5m2": 2.0**-3, "float8_e5m2fnuz": 2.0**-3,
}


def canonical_name(name: str) -> str:
    """'bf16' -> 'bfloat16'; raises InvalidArgument naming the allowed values."""
    try:
        return _canonical_cached(name)   # the judgement asks for every leaf of every pass
    except TypeError:                    # unhashable: not a name, said by the uncached path
        return _canonical(name)


@functools.lru_cache(maxsize=64)
def _canonical_cached(name: str) -> str:
    return _canonical(name)


def dtype_alias(name: str) -> str:
    """The canonical spelling of a dtype alias ('bf16' -> 'bfloat16'); any other name as it is."""
    key = str(name).removeprefix("torch.")
    return _ALIASES.get(key, key)


def _canonical(name: str) -> str:
    key = dtype_alias(name)
    if key not in FLOAT_NAMES + _FP8:
        allowed = ", ".join(RUNGS)
        raise InvalidArgument(f"dtypes: unknown precision {name!r}; allowed: {allowed} (or fp32/bf16/fp16)")
    return key


def rung_name(name: str) -> str:
    """A precision a check may be judged at, canonical ('bf16' -> 'bfloat16'); raises InvalidArgument
    for float64 (the truth's own precision: a float64 candidate would be judged for bit-exactness
    against the reference) and for the fp8 formats (a rung is the precision activations run in)."""
    key = canonical_name(name)
    if key == "float64":
        raise InvalidArgument(f"dtypes: {name!r} is the precision of the truth every rung is judged against, not a "
                              f"rung (the reference would be exact and any other backend fail); allowed: "
                              f"{', '.join(RUNGS)} (or fp32/bf16/fp16)")
    if key not in RUNGS:
        raise InvalidArgument(f"dtypes: {name!r} is a storage format, not a rung: an fp8 model is judged at the "
                              f"precision its activations run in (docs/fp8.md); allowed: {', '.join(RUNGS)} "
                              f"(or fp32/bf16/fp16)")
    return key


def to_torch(name: str) -> Any:
    import torch

    dt = getattr(torch, canonical_name(name), None)
    if dt is None:
        raise InvalidArgument(f"this torch ({torch.__version__}) has no dtype {name!r}")
    return dt


def name_of(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def is_float_name(name: str) -> bool:
    return name in FLOAT_NAMES or name in _FP8


def residual_dtype_name(rung: str) -> str:
    """The dtype a rung's truth residual (truth - reference) is stored in.

    bfloat16 keeps float32's exponent range (fp16 residuals of small values would be subnormal)
    and 2^-9 relative precision of an error is ample for error statistics; the fp32 and fp64
    rungs keep their own precision.
    """
    return rung if rung in ("float32", "float64") else "bfloat16"


def truth_dtype_name(rung: str) -> str:
    """The dtype a rung's float64 truth is stored in.

    float32 keeps ~1e-7 relative precision, 10^4 below the error of a bf16/fp16 rung, so storing
    the truth in float32 there halves golden size at no cost; the fp32 rung keeps float64.
    """
    return "float64" if rung in ("float32", "float64") else "float32"
