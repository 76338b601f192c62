"""The FP8 format table agrees with torch's own dtypes byte for byte, and devices map to the family
their matrix cores compute in."""
from __future__ import annotations

import pytest

from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.quant.formats import FORMATS, device_fp8_formats, native_fp8_family

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_table_matches_what_torch_decodes(name: str) -> None:
    fmt = FORMATS[name]
    dt = fmt.dtype()
    assert dt is getattr(torch, fmt.dtype_name)
    info = torch.finfo(dt)
    assert (fmt.max, fmt.min_normal) == (info.max, info.smallest_normal)
    assert 1 + fmt.exponent_bits + fmt.mantissa_bits == info.bits == 8
    every = torch.arange(256, dtype=torch.uint8).view(dt).double()
    assert tuple(i for i in range(256) if every[i].isnan()) == fmt.nan_bytes
    assert bool(every.isinf().any()) == fmt.has_inf
    assert every[1].item() == fmt.min_subnormal
    assert every[every.isfinite()].max().item() == fmt.max
    negative_zero = every[0x80].item() == 0 and torch.signbit(every[0x80]).item()
    assert negative_zero == fmt.has_negative_zero
    # the smallest normal is 2**(1 - bias): the bias is what makes the same byte half as large in FNUZ
    assert fmt.min_normal == 2.0 ** (1 - fmt.exponent_bias)


def test_fnuz_bytes_mean_half_the_ocp_value() -> None:
    """Why an OCP checkpoint on MI300 needs its scales doubled: the bias is one higher."""
    for ocp in ("e4m3fn", "e5m2"):
        fnuz = FORMATS[ocp].counterpart
        assert fnuz.family == "fnuz" and fnuz.counterpart.name == ocp
        bits = torch.arange(1, 0x7C, dtype=torch.uint8)     # positive finite in both
        a, b = bits.view(FORMATS[ocp].dtype()).double(), bits.view(fnuz.dtype()).double()
        assert torch.equal(b * 2, a)


@pytest.mark.parametrize(("arch", "family"), [
    ("gfx942", "fnuz"), ("gfx942:sramecc+:xnack-", "fnuz"), ("gfx940", "fnuz"), ("GFX942", "fnuz"),
    ("gfx950", "ocp"), ("gfx1201", "ocp"),
    ("gfx90a", None), ("gfx908", None), ("gfx1100", None),
    ("sm_89", "ocp"), ("sm_90a", "ocp"), ("sm_100", "ocp"), ("9.0", "ocp"), ("8.9", "ocp"), ("12.0", "ocp"),
    ("sm_80", None), ("8.6", None), ("7.0", None),
])
def test_device_families(arch: str, family: str | None) -> None:
    assert native_fp8_family(arch) == family
    formats = device_fp8_formats(arch)
    assert formats == (tuple(n for n, f in FORMATS.items() if f.family == family) if family else ())


@pytest.mark.parametrize("arch", ["cpu", "", "gfx", "sm_9", "mi300", "9"])
def test_unknown_arch_names_the_accepted_forms(arch: str) -> None:
    with pytest.raises(InvalidArgument, match=r"arch=.*gfx942.*sm_90"):
        native_fp8_family(arch)


def test_product_names_map_to_their_family() -> None:
    from pytest_rocm_parity.quant.formats import native_fp8_family

    assert native_fp8_family("MI300X") == "fnuz"
    assert native_fp8_family("AMD Instinct MI355X") == "ocp"
    assert native_fp8_family("NVIDIA H200") == "ocp"
    assert native_fp8_family("NVIDIA A100-SXM4-80GB") is None
