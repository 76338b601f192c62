"""Facts about the running backend: CUDA or ROCm build, devices, arch, numerics settings.

ROCm builds of PyTorch reuse ``torch.cuda`` (the device type stays ``"cuda"``), so the
backend must be read from ``torch.version.hip`` / ``torch.version.cuda``, never from the
presence of ``gcnArchName`` (CUDA builds have it too and return the device name there).
torch is imported inside functions only: loading the plugin must stay cheap.
"""
from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_rocm_parity.quant.formats import FORMATS

# RDNA (gfx10/11/12) and CDNA5 gfx1250 run wave32; CDNA/GCN (gfx9xx) run wave64.
_WAVE32_PREFIXES = ("gfx10", "gfx11", "gfx12")


@dataclass(frozen=True)
class DeviceInfo:
    """One visible GPU as torch sees it."""

    index: int
    name: str
    arch: str  # "gfx942" or "sm_90"; feature suffixes stripped
    arch_full: str  # "gfx942:sramecc+:xnack-" as reported
    warp_size: int
    warp_size_source: str  # "props" when torch reported it, "inferred" otherwise
    capability: tuple[int, int]
    total_memory: int
    multi_processor_count: int


@dataclass(frozen=True)
class BackendInfo:
    """What the running torch build and its devices are; built once by :func:`backend_info`."""

    backend: str  # "rocm" | "cuda" | "cpu" (torch build, not a device string)
    torch_version: str | None
    cuda_version: str | None
    hip_version: str | None
    gpu_available: bool
    devices: tuple[DeviceInfo, ...] = ()
    arch_list: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why torch could not be queried, when it could not
    fp8_dtypes: tuple[str, ...] = ()  # the float8 dtypes this torch defines ("float8_e4m3fnuz", ...)

    @property
    def archs(self) -> tuple[str, ...]:
        """Distinct device archs, in device order."""
        return tuple(dict.fromkeys(d.arch for d in self.devices))

    @property
    def hip_short(self) -> str | None:
        """``'6.3.42131-fa1d09cbd'`` -> ``'6.3'``."""
        return short_version(self.hip_version)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (tuples become lists)."""
        return asdict(self)


def strip_arch(gcn_arch_name: str) -> str:
    """``'gfx90a:sramecc+:xnack-'`` -> ``'gfx90a'``, as PyTorch's own cpp_extension does."""
    return gcn_arch_name.strip().split(":")[0]


def parse_hip_version(hip: str | None) -> str | None:
    """``'6.3.42131-fa1d09cbd'`` -> ``'6.3.42131'``; None stays None."""
    if not hip:
        return None
    return str(hip).strip().split("-")[0]


def short_version(version: str | None) -> str | None:
    """``'6.3.42131-fa1d'`` or ``'2.7.1+rocm6.3'`` -> ``'6.3'`` / ``'2.7'`` (major.minor)."""
    from pytest_rocm_parity.migration.compat import major_minor

    return major_minor(version)


def wheel_rocm_tag(torch_version: str | None) -> str | None:
    """``'2.7.1+rocm6.3'`` -> ``'6.3'``: the ROCm the wheel was built for, from its local version label."""
    from pytest_rocm_parity.migration.compat import parse_version

    v = parse_version(torch_version)
    local = v.local if v is not None else None
    return local[len("rocm"):] if local and local.startswith("rocm") else None


def infer_warp_size(backend: str, arch: str) -> int:
    """Warp size when ``props.warp_size`` is missing (torch < 2.5)."""
    if backend != "rocm":
        return 32
    return 32 if arch.startswith(_WAVE32_PREFIXES) else 64


def _torch() -> Any:
    import torch  # noqa: PLC0415 - lazy on purpose: the plugin loads without torch

    return torch


def detect_backend(torch_mod: Any | None = None) -> str:
    """``'cuda'``, ``'rocm'`` or ``'cpu'`` for the torch *build*.

    Order follows the tvm-ffi review: ``version.cuda`` first, then ``version.hip``;
    /opt/rocm and gcnArchName are deliberately not consulted.
    """
    if torch_mod is None:
        torch_mod = _torch()
    version = getattr(torch_mod, "version", None)
    if getattr(version, "cuda", None) is not None:
        return "cuda"
    if getattr(version, "hip", None) is not None:
        return "rocm"
    return "cpu"


def _device_info(torch_mod: Any, backend: str, index: int) -> DeviceInfo:
    props = torch_mod.cuda.get_device_properties(index)
    name = str(getattr(props, "name", "") or "")
    major = int(getattr(props, "major", 0) or 0)
    minor = int(getattr(props, "minor", 0) or 0)
    if backend == "rocm":
        arch_full = str(getattr(props, "gcnArchName", "") or "")
        arch = strip_arch(arch_full) if arch_full else "unknown"
    else:
        arch = f"sm_{major}{minor}"
        arch_full = arch
    ws = getattr(props, "warp_size", None)
    if isinstance(ws, int) and ws > 0:
        warp, source = ws, "props"
    else:
        warp, source = infer_warp_size(backend, arch), "inferred"
    return DeviceInfo(
        index=index,
        name=name,
        arch=arch,
        arch_full=arch_full,
        warp_size=warp,
        warp_size_source=source,
        capability=(major, minor),
        total_memory=int(getattr(props, "total_memory", 0) or 0),
        multi_processor_count=int(getattr(props, "multi_processor_count", 0) or 0),
    )


def _safe(fn: Any, default: Any = None) -> Any:
    """Call a torch query that may not exist on this version or build."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - any failure means "unknown" here
        return default


def numerics_settings(torch_mod: Any | None = None) -> dict[str, Any]:
    """The BLAS, attention, TF32 and determinism settings that change numerics."""
    if torch_mod is None:
        torch_mod = _torch()
    b = torch_mod.backends
    cm = b.cuda.matmul
    blas = _safe(lambda: b.cuda.preferred_blas_library())
    fa = _safe(lambda: b.cuda.preferred_rocm_fa_library()) if hasattr(b.cuda, "preferred_rocm_fa_library") else None
    return {
        "tf32_matmul": bool(_safe(lambda: cm.allow_tf32, False)),
        "tf32_cudnn": bool(_safe(lambda: b.cudnn.allow_tf32, False)),
        "float32_matmul_precision": _safe(torch_mod.get_float32_matmul_precision, "highest"),
        "fp16_reduced_precision_reduction": _safe(lambda: bool(cm.allow_fp16_reduced_precision_reduction)),
        "bf16_reduced_precision_reduction": _safe(lambda: bool(cm.allow_bf16_reduced_precision_reduction)),
        "sdpa": {
            "flash": _safe(b.cuda.flash_sdp_enabled),
            "mem_efficient": _safe(b.cuda.mem_efficient_sdp_enabled),
            "math": _safe(b.cuda.math_sdp_enabled),
            "cudnn": _safe(b.cuda.cudnn_sdp_enabled) if hasattr(b.cuda, "cudnn_sdp_enabled") else None,
        },
        "blas_library": _enum_name(blas),
        "rocm_fa_library": _enum_name(fa),
        "cudnn_benchmark": bool(_safe(lambda: b.cudnn.benchmark, False)),
        "cudnn_deterministic": bool(_safe(lambda: b.cudnn.deterministic, False)),
        "deterministic": bool(_safe(torch_mod.are_deterministic_algorithms_enabled, False)),
    }


def _enum_name(value: Any) -> str | None:
    """``_BlasBackend.Cublas`` -> ``'cublas'``; strings pass through lower-cased."""
    if value is None:
        return None
    name = getattr(value, "name", None) or str(value).rsplit(".", 1)[-1]
    return str(name).lower()


def backend_info() -> BackendInfo:
    """Query torch once; never raises (a broken torch is reported in ``error``)."""
    try:
        import torch  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken install
        return BackendInfo("cpu", None, None, None, False, error=f"import torch failed: {exc}")
    backend = detect_backend(torch)
    error = None
    devices: list[DeviceInfo] = []
    available = False
    try:
        available = bool(torch.cuda.is_available())
        if available:
            devices = [_device_info(torch, backend, i) for i in range(torch.cuda.device_count())]
    except Exception as exc:  # noqa: BLE001 - e.g. NameError: amdsmi (pytorch #133259)
        error = f"{type(exc).__name__}: {exc}"
    arch_list = tuple(_safe(torch.cuda.get_arch_list, []) or [])
    return BackendInfo(
        backend=backend,
        torch_version=str(torch.__version__),
        cuda_version=getattr(torch.version, "cuda", None),
        hip_version=getattr(torch.version, "hip", None),
        gpu_available=available,
        devices=tuple(devices),
        arch_list=arch_list,
        settings=numerics_settings(torch),
        error=error,
        fp8_dtypes=tuple(f.dtype_name for f in FORMATS.values() if hasattr(torch, f.dtype_name)),
    )


def _device_index(device: str) -> int:
    _, _, idx = device.partition(":")
    return int(idx) if idx.isdigit() else 0


def collect_env(device: str) -> dict[str, object]:
    """JSON-able description of where a golden or a report was produced.

    ``backend`` describes the *device*: ``'cpu'`` for a CPU device even on a ROCm
    build, otherwise ``'rocm'``/``'cuda'`` from the torch build.
    """
    info = backend_info()
    kind = device.split(":", 1)[0]
    if kind == "cuda":
        backend = info.backend if info.backend != "cpu" else "cuda"
    else:
        backend = kind
    dev: DeviceInfo | None = None
    if kind == "cuda":
        idx = _device_index(device)
        dev = next((d for d in info.devices if d.index == idx), None)
    if dev is not None:
        device_name, arch, warp = dev.name, dev.arch, dev.warp_size
    elif kind == "cpu":
        device_name, arch, warp = platform.processor() or platform.machine(), platform.machine(), None
    else:
        device_name, arch, warp = "", "unknown", None
    s = info.settings
    return {
        "backend": backend,
        "device": device,
        "device_name": device_name,
        "arch": arch,
        "warp_size": warp,
        "torch": info.torch_version,
        "cuda": info.cuda_version,
        "hip": info.hip_version,
        "tf32_matmul": s.get("tf32_matmul"),
        "tf32_cudnn": s.get("tf32_cudnn"),
        "sdpa": dict(s.get("sdpa") or {}),
        "float32_matmul_precision": s.get("float32_matmul_precision"),
        # the GPU BLAS choice means nothing for a CPU candidate (torch reports cublas there too)
        "blas_library": s.get("blas_library") if backend in ("cuda", "rocm") else None,
        "deterministic": s.get("deterministic"),
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "gpu_count": len(info.devices),
        "visible_devices": {
            k: os.environ[k]
            for k in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
            if k in os.environ
        },
    }
