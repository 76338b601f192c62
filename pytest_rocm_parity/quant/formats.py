"""The four FP8 formats torch knows and which devices compute in which family.

OCP (float8_e4m3fn, float8_e5m2) is what NVIDIA sm_89+ and AMD gfx950 (MI350/MI355) and gfx12
(RDNA4) multiply in; FNUZ (float8_e4m3fnuz, float8_e5m2fnuz) is what gfx94x (MI300/MI325) does.
The same byte means half the value in FNUZ (exponent bias one higher), so an OCP checkpoint served
on MI300 needs its scales doubled. Pure data: no torch import at module level, so the doctor, the
scanner and the quantized runner can all read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pytest_rocm_parity.errors import InvalidArgument

Family = Literal["ocp", "fnuz"]


@dataclass(frozen=True)
class Fp8Format:
    """One FP8 encoding: its range, its special values and its family."""

    name: str                  # "e4m3fn"
    dtype_name: str            # the torch attribute: "float8_e4m3fn"
    family: Family
    exponent_bits: int
    mantissa_bits: int
    exponent_bias: int
    max: float                 # largest finite value
    min_normal: float
    min_subnormal: float
    has_negative_zero: bool
    has_inf: bool
    nan_bytes: tuple[int, ...]  # every byte that decodes to NaN

    def dtype(self) -> Any:
        """The torch dtype (torch imported here, so reading the table stays torch-free)."""
        import torch

        dt = getattr(torch, self.dtype_name, None)
        if dt is None:
            raise InvalidArgument(f"Fp8Format.dtype: this torch ({torch.__version__}) has no "
                                  f"torch.{self.dtype_name}; upgrade torch (2.1 or later has all four FP8 dtypes)")
        return dt

    @property
    def counterpart(self) -> Fp8Format:
        """The same layout in the other family (e4m3fn <-> e4m3fnuz): what a conversion targets."""
        return FORMATS[_COUNTERPART[self.name]]


_COUNTERPART = {"e4m3fn": "e4m3fnuz", "e5m2": "e5m2fnuz", "e4m3fnuz": "e4m3fn", "e5m2fnuz": "e5m2"}

FORMATS: dict[str, Fp8Format] = {f.name: f for f in (
    Fp8Format("e4m3fn", "float8_e4m3fn", "ocp", 4, 3, 7, 448.0, 2.0**-6, 2.0**-9,
              has_negative_zero=True, has_inf=False, nan_bytes=(0x7F, 0xFF)),
    Fp8Format("e5m2", "float8_e5m2", "ocp", 5, 2, 15, 57344.0, 2.0**-14, 2.0**-16,
              has_negative_zero=True, has_inf=True, nan_bytes=(0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF)),
    Fp8Format("e4m3fnuz", "float8_e4m3fnuz", "fnuz", 4, 3, 8, 240.0, 2.0**-7, 2.0**-10,
              has_negative_zero=False, has_inf=False, nan_bytes=(0x80,)),
    Fp8Format("e5m2fnuz", "float8_e5m2fnuz", "fnuz", 5, 2, 16, 57344.0, 2.0**-15, 2.0**-17,
              has_negative_zero=False, has_inf=False, nan_bytes=(0x80,)),
)}

FAMILY_FORMATS: dict[str, tuple[str, ...]] = {"ocp": ("e4m3fn", "e5m2"), "fnuz": ("e4m3fnuz", "e5m2fnuz")}

_GFX = re.compile(r"gfx(\d+)([0-9a-f])(?::.*)?")            # gfx942, gfx90a, gfx1100, gfx942:sramecc+:xnack-
_SM = re.compile(r"(?:sm_?|compute_)?(\d{2,3})[af]?")        # sm_90, sm90a, sm_100, compute_89
_CAPABILITY = re.compile(r"(\d+)\.(\d+)")                   # torch.cuda.get_device_capability as "9.0"


# Product names a user may pass instead of the architecture (matched as a word, case-insensitive).
PRODUCTS = {"mi300x": "gfx942", "mi300a": "gfx942", "mi308x": "gfx942", "mi325x": "gfx942",
            "mi350x": "gfx950", "mi355x": "gfx950", "mi250x": "gfx90a", "mi250": "gfx90a", "mi210": "gfx90a",
            "mi100": "gfx908", "a100": "8.0", "a10": "8.6", "l4": "8.9", "l40s": "8.9", "h100": "9.0",
            "h200": "9.0", "h800": "9.0", "gh200": "9.0", "b200": "10.0", "gb200": "10.0"}


def native_fp8_family(arch: str) -> Family | None:
    """The FP8 family the device's matrix cores compute in; None where FP8 is only emulated.

    ``arch`` is a ROCm gfx name (``gfx942``, ``gfx950``, ``gfx90a``, ``gfx1100``, with or without
    ``:sramecc+:xnack-``) or a CUDA capability (``sm_89``, ``sm_90a``, ``"9.0"``).
    """
    key = str(arch).strip().lower()
    product = next((a for p, a in PRODUCTS.items() if re.search(rf"(^|[^a-z0-9]){p}($|[^a-z0-9])", key)), None)
    key = product or key
    if (m := _GFX.fullmatch(key)) is not None:
        digits = m.group(1) + m.group(2)
        if digits.startswith("94"):      # MI300A/X, MI308, MI325: FNUZ in hardware
            return "fnuz"
        if digits.startswith("95") or (len(digits) == 4 and digits.startswith("12")):   # MI350/MI355, RDNA4
            return "ocp"
        return None                      # gfx90a (MI200), gfx908, gfx11xx: no FP8 matrix instructions
    if (m := _CAPABILITY.fullmatch(key)) is not None:
        major, minor = int(m.group(1)), int(m.group(2))
    elif (m := _SM.fullmatch(key)) is not None:
        major, minor = divmod(int(m.group(1)), 10)
    else:
        raise InvalidArgument(f"native_fp8_family: arch={arch!r} is neither a gfx name (gfx942, gfx950, "
                              "gfx90a), a CUDA capability (sm_90, '9.0') nor a known product (MI300X, H100); pass "
                              "the device's gcnArchName or its major.minor capability")
    return "ocp" if (major, minor) >= (8, 9) else None    # Ada (sm_89) and Hopper (sm_90) onward


def device_fp8_formats(arch: str) -> tuple[str, ...]:
    """Names in FORMATS the device computes natively (empty where FP8 is only emulated)."""
    family = native_fp8_family(arch)
    return FAMILY_FORMATS[family] if family else ()
