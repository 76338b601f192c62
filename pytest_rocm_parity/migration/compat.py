"""The torch / ROCm / Triton / vLLM compatibility matrix, kept as data with its sources.

The matrix lives in ``data/compat_matrix.json`` so it can be refreshed without code
changes; every verdict says the matrix date so a stale matrix is visible to users.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Verdict:
    """One compatibility answer: status, what was found, and the fix."""

    status: Status
    detail: str
    fix: str = ""


@lru_cache(maxsize=1)
def load_matrix() -> dict[str, Any]:
    """The packaged matrix (cached: it never changes within a process)."""
    text = resources.files("pytest_rocm_parity.migration").joinpath("data/compat_matrix.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def parse_version(version: str | None) -> Version | None:
    """A version string as ``packaging`` reads it; None when it holds no version at all.

    HIP reports ``'6.3.42131-fa1d09cbd'``, which is not PEP 440: its build suffix is dropped.
    """
    text = str(version or "").strip()
    for candidate in (text, text.split("-")[0]):
        try:
            return Version(candidate)
        except InvalidVersion:
            continue
    return None


def release(version: str | None) -> tuple[int, ...]:
    """``'2.7.1+rocm6.3'`` -> ``(2, 7, 1)``; ``'3.5.0+git1b0418a9'`` -> ``(3, 5, 0)``; ``()`` for none."""
    v = parse_version(version)
    return v.release if v is not None else ()


def major_minor(version: str | None) -> str | None:
    t = release(version)
    return f"{t[0]}.{t[1]}" if len(t) >= 2 else None


def _base(version: str | None) -> Version | None:
    """The release alone: a pre-release, dev build or local build of 0.7.0 counts as 0.7.0."""
    v = parse_version(version)
    return Version(v.base_version) if v is not None else None


def at_least(version: str | None, minimum: str) -> bool:
    """Whether ``version`` is ``minimum`` or newer (False when there is no version)."""
    v = _base(version)
    return v is not None and v >= Version(minimum)


def in_series(version: str | None, low: str, high: str | None) -> bool:
    """``low <= version`` and, when ``high`` is given, ``version`` is no later than ``high``'s series
    (``high='0.5.2'`` admits 0.5.2 and 0.5.2.post1, not 0.5.3)."""
    v = _base(version)
    if v is None or v < Version(low):
        return False
    if high is None:
        return True
    return v in SpecifierSet(f"<={high}") or v in SpecifierSet(f"=={high}.*")


def torch_row(torch_version: str | None) -> dict[str, Any] | None:
    mm = major_minor(torch_version)
    row = load_matrix()["torch"].get(mm) if mm else None
    return row if isinstance(row, dict) else None


def _stamp() -> str:
    return f"compat matrix of {load_matrix()['updated']}"


def check_torch_rocm(torch_version: str | None, hip_version: str | None) -> Verdict:
    """Is this torch release published for this ROCm (HIP) version?"""
    row = torch_row(torch_version)
    hip_mm = major_minor(hip_version)
    if row is None:
        return Verdict("warn", f"torch {torch_version} is not in the {_stamp()}",
                       "check rocm.docs.amd.com 'PyTorch compatibility', then update data/compat_matrix.json")
    known = row.get("rocm") or []
    if hip_mm in known:
        tag = " [unverified]" if "rocm" in row.get("unverified", []) else ""
        return Verdict("ok", f"torch {torch_version} ships for ROCm {', '.join(known)}; HIP {hip_version}{tag}")
    newest = max(known, key=Version) if known else "?"
    return Verdict(
        "warn",
        f"torch {torch_version} with HIP {hip_version}: published wheels target ROCm {', '.join(known)} ({_stamp()})",
        f"pip install torch --index-url https://download.pytorch.org/whl/rocm{newest}",
    )


def expected_triton(torch_version: str | None) -> tuple[str | None, bool]:
    """(triton major.minor pinned by this torch release, whether that pin is verified)."""
    row = torch_row(torch_version)
    if row is None or not row.get("triton"):
        return None, False
    return str(row["triton"]), "triton" not in row.get("unverified", [])


def check_triton(
    torch_version: str | None, triton_version: str | None, dist: str | None = None, pinned: str | None = None
) -> Verdict:
    """Triton's major.minor must match the torch release's pin (torch.compile breaks otherwise).

    ``pinned`` is the version torch's own wheel metadata requires; it beats the matrix.
    """
    if triton_version is None:
        return Verdict("ok", "triton not installed (torch.compile/inductor GPU kernels unavailable)")
    want, verified = expected_triton(torch_version)
    if pinned:
        want, verified = major_minor(pinned), True
    got = major_minor(triton_version)
    label = f"{dist or 'triton'} {triton_version}"
    if want is None:
        return Verdict("ok", f"{label}; torch {torch_version} has no triton pin in the {_stamp()}")
    if got == want:
        return Verdict("ok", f"{label} matches torch {major_minor(torch_version)} pin {want}.x")
    fix = f"pip install 'pytorch-triton-rocm=={want}.*' --index-url https://download.pytorch.org/whl/triton-rocm/"
    if not verified:
        return Verdict("warn", f"{label}; torch {major_minor(torch_version)} pins triton {want}.x [unverified pin]", fix)
    return Verdict("fail", f"{label} but torch {major_minor(torch_version)} pins triton {want}.x", fix)


def check_vllm(vllm_version: str | None, hip_version: str | None, backend: str) -> Verdict:
    """vLLM releases support specific ROCm versions; a CUDA torch under vLLM on AMD is a fail."""
    if vllm_version is None:
        return Verdict("ok", "vllm not installed")
    if backend == "cuda":
        return Verdict("ok", f"vllm {vllm_version} on a CUDA build")
    if backend != "rocm" or hip_version is None:
        return Verdict("warn", f"vllm {vllm_version} installed but torch is not a ROCm build",
                       "use the torch bundled with the vLLM ROCm wheel (or build vLLM from source against ROCm torch)")
    for row in load_matrix()["vllm"]:
        if not in_series(vllm_version, row["min"], row.get("max")):
            continue
        if "rocm_min" in row:
            good = at_least(hip_version, row["rocm_min"])
            want = f"ROCm {row['rocm_min']} or above"
        else:
            good = major_minor(hip_version) in row["rocm"]
            want = "ROCm " + " or ".join(row["rocm"])
        if good:
            return Verdict("ok", f"vllm {vllm_version} supports HIP {hip_version} ({want})")
        return Verdict("fail", f"vllm {vllm_version} needs {want}; torch has HIP {hip_version}",
                       "install the vLLM release built for this ROCm, or the ROCm it requires")
    return Verdict("warn", f"vllm {vllm_version} is not in the {_stamp()}", "check vLLM's ROCm install docs")


def check_arch_rocm(arch: str, hip_version: str | None) -> Verdict | None:
    """Some archs need a minimum ROCm (gfx950: 7.0); None when no rule applies."""
    need = load_matrix()["arch_min_rocm"].get(arch)
    if need is None or hip_version is None:
        return None
    if at_least(hip_version, need):
        return Verdict("ok", f"{arch} needs ROCm >= {need}; HIP {hip_version}")
    return Verdict("fail", f"{arch} needs ROCm >= {need}; torch has HIP {hip_version}",
                   f"install a torch wheel built for ROCm {need} or newer")


def hipblaslt_default(archs: list[str] | tuple[str, ...], hip_version: str | None) -> bool:
    """Whether torch picks hipBLASLt by default: only if *all* visible archs qualify."""
    table = load_matrix()["hipblaslt_default_archs"]
    return bool(archs) and all(a in table and at_least(major_minor(hip_version), table[a]) for a in archs)
