"""The torch / ROCm / Triton / vLLM compatibility matrix, kept as data with its sources.

The matrix lives in ``data/compat_matrix.json`` so it can be refreshed without code
changes; every verdict says the matrix date so a stale matrix is visible to users.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

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
    text = resources.files("pytest_rocm_parity").joinpath("data/compat_matrix.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def version_tuple(version: str | None) -> tuple[int, ...]:
    """``'2.7.1+rocm6.3'`` -> ``(2, 7, 1)``; ``'3.5.0+git1b0418a9'`` -> ``(3, 5, 0)``."""
    if not version:
        return ()
    m = re.match(r"\d+(?:\.\d+)*", str(version).strip())
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def major_minor(version: str | None) -> str | None:
    t = version_tuple(version)
    return f"{t[0]}.{t[1]}" if len(t) >= 2 else None


def _vt(version: str | None) -> tuple[int, ...]:
    return version_tuple(version)


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
    newest = max(known, key=_vt) if known else "?"
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
    vt, hip_t = _vt(vllm_version), _vt(hip_version)[:2]
    for row in load_matrix()["vllm"]:
        lo = _vt(row["min"])
        hi = _vt(row["max"]) if row.get("max") else None
        if vt[: len(lo)] < lo or (hi is not None and vt[: len(hi)] > hi):
            continue
        if "rocm_min" in row:
            good = hip_t >= _vt(row["rocm_min"])
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
    if _vt(hip_version)[:3] >= _vt(need):
        return Verdict("ok", f"{arch} needs ROCm >= {need}; HIP {hip_version}")
    return Verdict("fail", f"{arch} needs ROCm >= {need}; torch has HIP {hip_version}",
                   f"install a torch wheel built for ROCm {need} or newer")


def hipblaslt_default(archs: list[str] | tuple[str, ...], hip_version: str | None) -> bool:
    """Whether torch picks hipBLASLt by default: only if *all* visible archs qualify."""
    table = load_matrix()["hipblaslt_default_archs"]
    hv = _vt(hip_version)[:2]
    return bool(archs) and all(a in table and hv >= _vt(table[a]) for a in archs)
