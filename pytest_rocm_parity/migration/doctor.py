"""``rocm-parity doctor``: catch the environment mistakes that sink a CUDA-to-ROCm migration.

A migration usually fails before any number is compared: a visible-devices variable
that hides every GPU, PYTORCH_ROCM_ARCH missing the device's gfx, a Triton that does
not match torch.  Each check here is ``ok``, ``warn`` or ``fail`` with a one-line fix, or
``skip`` with why it could not run here (a CPU build has no ROCm arch list to read).
Facts are gathered once (:func:`gather_facts`); checks are pure functions of them so
tests can feed recorded facts.  Exit code: 0 when no check fails, 1 otherwise
(``--strict``: warnings fail too); 2 for usage errors (from the CLI).
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.migration import compat
from pytest_rocm_parity.migration.backend import BackendInfo, backend_info, wheel_rocm_tag
from pytest_rocm_parity.migration.rocm_tools import ToolsReport, probe_tools
from pytest_rocm_parity.quant.formats import FAMILY_FORMATS, FORMATS, native_fp8_family
from pytest_rocm_parity.tables import text_table

Status = Literal["ok", "warn", "fail", "skip"]
_RANK = {"ok": 0, "warn": 1, "fail": 2}
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")
GIB = 1024**3
VISIBLE_VARS = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
ARCH_VARS = ("GPU_ARCHS", "HIP_ARCHITECTURES", "FX_GFX_ARCHS")  # flash-attn, mamba/xformers, vLLM
TRITON_DISTS = ("pytorch-triton-rocm", "pytorch_triton_rocm", "triton", "pytorch-triton")
# vLLM's default --gpu-memory-utilization; below this free fraction the default cannot start.
VLLM_DEFAULT_UTIL = 0.9


@dataclass(frozen=True)
class Check:
    """One doctor verdict: ``fix`` is a single line a user can act on (empty when ok)."""

    name: str
    status: Status
    detail: str
    fix: str = ""


def _skipped(names: tuple[str, ...] | list[str], why: str) -> list[Check]:
    """A row per check that could not run here, saying why: a report that leaves a check out
    silently reads as if it had passed."""
    return [Check(n, "skip", f"not checked: {why}") for n in names]


_BUILD_NAMES = {"cpu": "CPU", "cuda": "CUDA", "rocm": "ROCm"}
NO_TORCH = "torch is not importable"   # why a check of the torch build was not made


def _build(info: BackendInfo) -> str:
    return f"{_BUILD_NAMES.get(info.backend, info.backend)} build of torch"


def _no_gpu_reason(info: BackendInfo) -> str:
    if info.torch_version is None:
        return NO_TORCH
    if info.backend == "cpu":
        return "CPU build of torch, no GPU to query"
    return f"{_build(info)} sees no GPU"


def _no_rocm_reason(info: BackendInfo) -> str:
    if info.torch_version is None:
        return NO_TORCH
    return f"{_build(info)}, not a ROCm build"


@dataclass
class Facts:
    """Everything the checks look at, gathered once."""

    info: BackendInfo
    env: Mapping[str, str]
    tools: ToolsReport | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    memory: list[tuple[int, int, int]] = field(default_factory=list)  # (index, free, total) bytes
    kernels: bool = True   # compile the statistics kernel for each visible arch (seconds each)


# --------------------------------------------------------------------------- gathering


def _dist_version(name: str) -> str | None:
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


_TRITON_NAMES = frozenset({"triton", "pytorch-triton", "pytorch-triton-rocm"})


def _torch_triton_pin() -> str | None:
    """The triton version torch's wheel metadata requires (GPU wheels pin one; CPU wheels none)."""
    from importlib import metadata  # noqa: PLC0415

    try:
        requires = metadata.requires("torch") or []
    except metadata.PackageNotFoundError:
        return None
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) in _TRITON_NAMES:
            pins = [spec.version for spec in req.specifier if spec.operator in ("==", "===")]
            if pins:
                return pins[0]
    return None


def _packages() -> dict[str, str | None]:
    names = (*TRITON_DISTS, "vllm", "pynvml", "nvidia-ml-py", "amdsmi")
    found = {n: _dist_version(n) for n in names}
    found["torch:triton-pin"] = _torch_triton_pin()
    return found


def _memory(info: BackendInfo) -> list[tuple[int, int, int]]:
    if not info.devices:
        return []
    import torch  # noqa: PLC0415

    out = []
    for dev in info.devices:
        try:
            free, total = torch.cuda.mem_get_info(dev.index)
        except Exception:  # noqa: BLE001 - unknown memory is reported as such, not raised
            continue
        out.append((dev.index, int(free), int(total)))
    return out


def gather_facts(*, run_tools: bool = True, timeout: float = 10.0, env: Mapping[str, str] | None = None,
                 kernels: bool = True) -> Facts:
    """Query torch, installed packages and (optionally) the ROCm system tools; ``kernels``: the
    triton-kernels check compiles for each visible arch."""
    info = backend_info()
    return Facts(
        info=info,
        env=dict(os.environ if env is None else env),
        tools=probe_tools(timeout) if run_tools else None,
        packages=_packages(),
        memory=_memory(info),
        kernels=kernels,
    )


# --------------------------------------------------------------------------- checks


def check_backend(f: Facts) -> list[Check]:
    info = f.info
    amd_seen = bool(f.tools and f.tools.gpus)
    if info.torch_version is None:
        return [Check("backend", "fail", info.error or NO_TORCH,
                      "pip install torch --index-url https://download.pytorch.org/whl/rocm6.4 (pick your ROCm)")]
    versions = f"torch {info.torch_version}, " + (
        f"HIP {info.hip_version}" if info.backend == "rocm" else
        f"CUDA {info.cuda_version}" if info.backend == "cuda" else "no GPU runtime")
    if info.error:
        fix = ("pip install amdsmi (or uninstall pynvml/nvidia-ml-py), see pytorch #133259"
               if "amdsmi" in info.error else "reinstall the torch wheel that matches this machine's GPU stack")
        return [Check("backend", "fail", f"{info.backend} build ({versions}); device query failed: {info.error}", fix)]
    if info.backend == "cpu":
        if amd_seen:
            return [Check("backend", "fail", f"AMD GPUs present (system tools) but torch is a CPU-only build ({versions})",
                          "pip install torch --index-url https://download.pytorch.org/whl/rocmX.Y (match your ROCm)")]
        return [Check("backend", "warn", f"CPU-only torch build ({versions}); only CPU can be a candidate",
                      "install a ROCm (or CUDA) torch wheel to compare on a GPU")]
    if info.backend == "cuda" and amd_seen:
        return [Check("backend", "fail", f"AMD GPUs present but torch is a CUDA build ({versions})",
                      "pip install torch --index-url https://download.pytorch.org/whl/rocmX.Y; with extensions use --no-build-isolation")]
    if not info.gpu_available:
        return [Check("backend", "fail", f"{info.backend} build ({versions}) but torch.cuda.is_available() is False",
                      "check the visible-devices variables, the driver, and access to /dev/kfd and /dev/dri (render, video groups)")]
    tag = wheel_rocm_tag(info.torch_version)
    if info.backend == "rocm" and tag and compat.major_minor(tag) != info.hip_short:
        return [Check("backend", "warn", f"rocm build but wheel tag +rocm{tag} disagrees with HIP {info.hip_version}",
                      "reinstall torch from a single ROCm index; a mixed install was likely patched in place")]
    return [Check("backend", "ok", f"{info.backend} build via torch.version.{'hip' if info.backend == 'rocm' else 'cuda'} ({versions})")]


def check_devices(f: Facts) -> list[Check]:
    info = f.info
    if not info.devices:
        return _skipped(["devices"], _no_gpu_reason(info))
    out = []
    for d in info.devices:
        cc = f"cc {d.capability[0]}.{d.capability[1]}" + (" (gfx-derived: CUDA-style gates misfire)" if info.backend == "rocm" else "")
        suffix = f" ({d.arch_full})" if d.arch_full != d.arch else ""
        detail = (f"{d.name or '<empty name>'}: {d.arch}{suffix}, warp {d.warp_size}"
                  f"{'' if d.warp_size_source == 'props' else ' (inferred)'}, {d.multi_processor_count} CUs/SMs,"
                  f" {d.total_memory / GIB:.0f} GiB, {cc}")
        if not d.name:
            out.append(Check(f"device[{d.index}]", "warn", detail,
                             "empty device name (ROCm 5.2-5.7 on MI100/MI200): match devices by arch, not name"))
        else:
            out.append(Check(f"device[{d.index}]", "ok", detail))
    if len(info.archs) > 1:
        out.append(Check("devices", "warn", f"mixed archs {', '.join(info.archs)}: BLAS defaults and numerics differ per device",
                         "set HIP_VISIBLE_DEVICES to devices of one arch for parity runs"))
    return out


def _tool_archs(f: Facts) -> tuple[list[str], str]:
    """The gfx archs the system tools report (without feature suffixes), and the tool that reported them."""
    gpus = [g for g in (f.tools.gpus if f.tools else []) if g.gfx]
    return list(dict.fromkeys(g.gfx.split(":")[0] for g in gpus if g.gfx)), (gpus[0].source if gpus else "")


def _fp8_archs(f: Facts) -> tuple[list[str], str]:
    """The archs whose FP8 formats to report, and where they came from: torch's devices, else the tools'."""
    if f.info.archs:
        return list(f.info.archs), ""
    archs, source = _tool_archs(f)
    return archs, (f"arch from {source}; torch sees no GPU" if archs else "")


def _amd_archs(f: Facts) -> tuple[list[str], str]:
    """The AMD GPU archs present, and where they came from ("" for torch): a ROCm torch's devices, else
    the system tools' (a CPU or CUDA torch on an AMD machine, or a ROCm torch that sees no GPU)."""
    if f.info.backend == "rocm" and f.info.archs:
        return list(f.info.archs), ""
    return _tool_archs(f)


def _formats_text(family: str) -> str:
    return ", ".join(f"{FORMATS[n].dtype_name} (max {FORMATS[n].max:g})" for n in FAMILY_FORMATS[family])


def check_fp8(f: Facts) -> list[Check]:
    """The FP8 format each GPU computes in: FNUZ on gfx94x (MI300), OCP on gfx950, gfx12 and sm_89+.

    Why: an OCP checkpoint (float8_e4m3fn, max 448) served on MI300 must be converted; read as
    FNUZ its bytes mean half the value (exponent bias 8, not 7). A missed conversion shifts the
    model's numbers without crashing it, so the engineer should know the target's format first.
    """
    info = f.info
    if info.torch_version is None:
        return []
    archs, source = _fp8_archs(f)
    have = set(info.fp8_dtypes)
    if not archs:
        lacking = [fmt.dtype_name for fmt in FORMATS.values() if fmt.dtype_name not in have]
        if lacking:
            return [Check("fp8", "warn", f"no GPU visible; this torch lacks {', '.join(lacking)}: FP8 goldens in "
                          "those formats cannot be replayed here", "upgrade torch (2.1 or later has all four float8 dtypes)")]
        return [Check("fp8", "ok", "no GPU visible: the CPU has no FP8 matrix cores and emulates both families "
                      "(torch has float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz)")]
    out = []
    for arch in archs:
        name, where = f"fp8[{arch}]", f" ({source})" if source else ""
        try:
            family = native_fp8_family(arch)
        except InvalidArgument:    # an arch string we cannot read ("unknown" when gcnArchName is empty)
            out.append(Check(name, "ok", f"{arch}: FP8 format unknown (not a gfx name or sm_XY capability){where}"))
            continue
        if family is None:
            out.append(Check(name, "ok", f"{arch}: no FP8 matrix cores; FP8 models run emulated (upcast before "
                             f"the matmul), so their numbers are not an FP8 GEMM's{where}"))
            continue
        other = "OCP" if family == "fnuz" else "FNUZ"
        conversion = ("same bytes mean half the value here, so double the scales (vLLM: normalize_e4m3fn_to_e4m3fnuz)"
                      if family == "fnuz" else "same bytes mean twice the value here, so halve the scales")
        detail = (f"{arch}: FP8 matrix cores in {family.upper()}: {_formats_text(family)}; "
                  f"{other} checkpoints need converting: {conversion}{where}")
        lacking = [FORMATS[n].dtype_name for n in FAMILY_FORMATS[family] if FORMATS[n].dtype_name not in have]
        if lacking:
            out.append(Check(name, "warn", f"{detail}; this torch lacks {', '.join(lacking)}",
                             "upgrade torch (2.1 or later has all four float8 dtypes)"))
        else:
            out.append(Check(name, "ok", detail))
    return out


def _tokens(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


# What CUDA accepts besides an index: a GPU UUID ("GPU-<uuid>", as nvidia-smi -L prints it) and a MIG
# instance in either form nvidia-smi -L prints, depending on the driver: "MIG-<uuid>" and the older
# "MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>".
_DEVICE_UUID = re.compile(r"GPU-[0-9A-Za-z-]+|MIG-GPU-[0-9A-Za-z-]+/\d+/\d+|MIG-(?!GPU-)[0-9A-Za-z-]+")


# Each variable as the runtime that reads it parses it. ROCclr (ROCm/clr rocclr/device/rocm/rocdevice.cpp,
# Device::init) reads HIP_VISIBLE_DEVICES, else CUDA_VISIBLE_DEVICES, and GPU_DEVICE_ORDINAL: an entry
# counts only where it is written exactly as the index it names (no space, no empty entry, no leading
# zero) or holds a GPU- UUID, and the first that does not ends the list. ROCr (ROCm/ROCR-Runtime
# amd_filter_device.cpp, RvdFilter) trims each ROCR_VISIBLE_DEVICES entry, as CUDA trims its own.
_HIDE_ALL = ("-1", "none", "NoDevFiles")


def _read_exactly(k: str, backend: str) -> bool:
    """Whether k is read by ROCclr, which takes each entry exactly as written, on this build (a
    variable no runtime of this build reads is judged as a ROCm build would read it)."""
    return k in ("HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL") or (k == "CUDA_VISIBLE_DEVICES" and backend == "rocm")


def _read_by(k: str, backend: str) -> bool:
    """Whether this build of torch reads the visible-devices variable k (a CPU build reads none)."""
    return backend == "rocm" or (backend == "cuda" and k == "CUDA_VISIBLE_DEVICES")


def _entries(v: str) -> list[str]:
    """The entries as every runtime splits them: at commas, one trailing comma ending the list."""
    parts = v.split(",")
    return parts[:-1] if len(parts) > 1 and parts[-1] == "" else parts


def _is_device(entry: str, exact: bool) -> bool:
    t = entry if exact else entry.strip()
    if re.fullmatch(r"[0-9]+", t):
        return not exact or t == str(int(t))
    return bool(_DEVICE_UUID.fullmatch(t))


def _variable_problem(k: str, v: str, backend: str) -> Check | None:
    """What is wrong with one visible-devices variable on its own, or None."""
    exact = _read_exactly(k, backend)
    if exact and v == "":
        return None
    entries = _entries(v)
    if v.strip() in _HIDE_ALL or not v.strip():
        return Check("visible-devices", "fail", f"{k}={v!r} hides every GPU", f"unset {k} or list device indices, e.g. {k}=0")
    cut = next((i for i, t in enumerate(entries) if not _is_device(t, exact)), None)
    if cut is not None:
        reader = ("ROCclr, the HIP runtime, takes each entry exactly as written (no spaces, no empty entries, "
                  "no leading zeros) and stops at the first that is not a device" if exact else
                  "the runtime stops at the first entry that is not a device")
        left = "no GPU is visible" if cut == 0 else f"only {','.join(t.strip() for t in entries[:cut])} stays visible"
        cleaned = [t.strip() for t in entries if _is_device(t, False)]
        example = ",".join(str(int(t)) if t.isdigit() else t for t in cleaned) or "0"
        what = "an empty entry" if not entries[cut].strip() else repr(entries[cut])
        return Check("visible-devices", "fail", f"{k}={v!r}: {what} is neither an index, a GPU-UUID nor a "
                     f"MIG-UUID; {reader}, so it and later entries are dropped: {left}",
                     f"write {k} as comma-separated indices, GPU-UUIDs or MIG-UUIDs without spaces or empty entries, "
                     f"e.g. {k}={example}")
    if len(set(_tokens(v))) != len(_tokens(v)):
        return Check("visible-devices", "warn", f"{k}={v!r} lists a device twice", f"remove the duplicate from {k}")
    return None


def _empty_read_as_unset(present: dict[str, str]) -> list[Check]:
    """On a ROCm build: the list torch reads (HIP_VISIBLE_DEVICES where set, else CUDA_VISIBLE_DEVICES) is
    empty. ROCclr reads an empty value as unset, but torch.cuda._parse_visible_devices reads no device."""
    hip, cuda = present.get("HIP_VISIBLE_DEVICES"), present.get("CUDA_VISIBLE_DEVICES")
    k = "HIP_VISIBLE_DEVICES" if hip is not None else "CUDA_VISIBLE_DEVICES"
    if present.get(k) != "":
        return []
    runtime = (f"falls back to CUDA_VISIBLE_DEVICES={cuda!r}" if k == "HIP_VISIBLE_DEVICES" and cuda
               else "shows every GPU")
    return [Check("visible-devices", "warn", f"{k}='' is read as unset by the HIP runtime (ROCclr), which {runtime}; "
                  "but torch.cuda.device_count() counts 0 devices until CUDA is initialized (torch parses '' as an "
                  "empty list), so code that checks the count first sees no GPU",
                  f"unset {k}, or list the devices, e.g. {k}=0")]


def _combination_problems(present: dict[str, str], shown: str, backend: str, build: str) -> list[Check]:
    """What the variables that are readable on their own do together, as a ROCm build reads them.

    On a CPU or CUDA build (``build`` names it) the ROCm runtime's reading is judged too, since the same
    environment may run a ROCm torch next, as a single variable is judged: its rows say the variables are
    unused by this build. What only torch's own ROCm parsing (an empty list) or only an AMD device (a MIG
    UUID) makes a problem, and what a CUDA build's own warning covers, is left to those builds."""
    rocm = backend == "rocm"
    out = _empty_read_as_unset(present) if rocm else []
    hip, cuda, rocr = present.get("HIP_VISIBLE_DEVICES"), present.get("CUDA_VISIBLE_DEVICES"), present.get("ROCR_VISIBLE_DEVICES")
    hip = hip or None
    effective = hip if hip is not None else cuda or None
    unused = "" if rocm else f" (unused by this {build}; a ROCm torch in this environment would read them)"

    def add(status: Status, detail: str, fix: str) -> None:
        out.append(Check("visible-devices", status, detail + unused, fix))

    if rocr is not None and effective is not None:
        r, h = _tokens(rocr), _tokens(effective)
        if any(t.startswith("GPU-") for t in r) and any(t.startswith("GPU-") for t in h):
            add("fail", f"{shown}: torch rejects UUIDs in both ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES",
                "select by UUID in ROCR_VISIBLE_DEVICES only and use indices (relative to it) in HIP_VISIBLE_DEVICES")
        out_of_range = [t for t in h if t.isdigit() and int(t) >= len(r)]
        if out_of_range:
            what = "leaves no device" if len(out_of_range) == len(h) else "drops some devices"
            add("fail", f"{shown}: HIP indices are relative to ROCR's {len(r)} device(s); index {out_of_range[0]} is out of range, {what}",
                f"use HIP_VISIBLE_DEVICES={','.join(str(i) for i in range(min(len(r), len(h))))} or unset one of the two")
    mig = [(k, t) for k, v in present.items() for t in _tokens(v) if t.startswith("MIG-")]
    if mig and rocm:
        add("warn", f"{shown}: {mig[0][1]!r} in {mig[0][0]} is an NVIDIA MIG instance; "
            "AMD GPUs have none, so it matches no device here", "use indices or GPU-UUIDs on AMD machines")
    if backend == "cuda":
        return out   # the CUDA build's own row says the HIP and ROCr variables are ignored there
    if hip is not None and cuda is not None and _tokens(hip) != _tokens(cuda):
        add("warn", f"{shown}: HIP_VISIBLE_DEVICES wins on ROCm, CUDA_VISIBLE_DEVICES is ignored",
            "set both to the same list or unset CUDA_VISIBLE_DEVICES")
    if "GPU_DEVICE_ORDINAL" in present and effective is not None:
        add("warn", f"{shown}: GPU_DEVICE_ORDINAL filters again on top of HIP's list", "keep one visible-devices variable")
    return out


def check_visible_devices(f: Facts) -> list[Check]:
    """Every visible-devices problem, each with its fix: each variable on its own, then (among the
    variables readable on their own) what they do together. Both are judged on every build: a
    variable this build does not read is judged as a ROCm build reads it. One ok row when none."""
    env, backend = f.env, f.info.backend
    present = {k: env[k] for k in VISIBLE_VARS if k in env}
    if not present:
        if not f.info.devices:
            return [Check("visible-devices", "ok", f"no visible-devices variable set, so none hides a GPU "
                          f"({_no_gpu_reason(f.info)})")]
        return [Check("visible-devices", "ok", f"no visible-devices variable set: all GPUs visible "
                      f"(torch sees {len(f.info.devices)})")]
    shown = ", ".join(f"{k}={v!r}" for k, v in present.items())
    out: list[Check] = []
    readable: dict[str, str] = {}
    build = "torch (not importable)" if f.info.torch_version is None else _build(f.info)
    for k, v in present.items():
        problem = _variable_problem(k, v, backend)
        if problem is not None and not _read_by(k, backend):
            reader = "a ROCm or CUDA torch" if k == "CUDA_VISIBLE_DEVICES" else "a ROCm torch"
            problem = replace(problem, detail=f"{problem.detail} (unused by this {build}; {reader} in this "
                                              "environment would read it)")
        if problem is not None:
            out.append(problem)
        if problem is None or problem.status != "fail":
            readable[k] = v
    if backend == "cuda":
        ignored = [k for k in present if not _read_by(k, backend)]
        if ignored:
            out.append(Check("visible-devices", "warn", f"{shown}: {', '.join(ignored)} are ignored by a CUDA build",
                             "use CUDA_VISIBLE_DEVICES on NVIDIA machines"))
    out += _combination_problems(readable, shown, backend, build)
    if out:
        return out
    if backend != "rocm":
        return [Check("visible-devices", "ok", shown)]
    return [Check("visible-devices", "ok", f"{shown}; torch sees {len(f.info.devices)} device(s)")]


# LLVM's AMDGPU processors (AMDGPUUsage "Processors"; the processor table of the LLVM that Triton 3.9
# bundles), plus gfx940 and gfx941, which LLVM 20 dropped but the ROCm 6 compilers still accept. A name
# outside it is a typo or a target newer than this list; either way clang rejects it as --offload-arch.
KNOWN_GFX = frozenset("""
    gfx600 gfx601 gfx602 gfx700 gfx701 gfx702 gfx703 gfx704 gfx705 gfx801 gfx802 gfx803 gfx805 gfx810
    gfx900 gfx902 gfx904 gfx906 gfx908 gfx909 gfx90a gfx90c gfx940 gfx941 gfx942 gfx950
    gfx1010 gfx1011 gfx1012 gfx1013 gfx1030 gfx1031 gfx1032 gfx1033 gfx1034 gfx1035 gfx1036
    gfx1100 gfx1101 gfx1102 gfx1103 gfx1150 gfx1151 gfx1152 gfx1153 gfx1154 gfx1170 gfx1171 gfx1172
    gfx1200 gfx1201 gfx1250 gfx1251 gfx1310
    gfx9-generic gfx9-4-generic gfx10-1-generic gfx10-3-generic gfx11-generic gfx11-7-generic
    gfx12-generic gfx12-5-generic gfx13-generic
""".split())
# a gfx target as PYTORCH_ROCM_ARCH takes it: gfx942, gfx11-generic, gfx9-4-generic, gfx90a:xnack+
_GFX = re.compile(r"(gfx[0-9a-f]+(?:-[0-9]+)?(?:-generic)?)((?::[a-z]+[+-])*)")


def _arch_tokens(value: str) -> list[str]:
    """The entries as torch splits PYTORCH_ROCM_ARCH: at ';' and spaces only (torch.utils.cpp_extension
    ._get_rocm_arch_flags: value.replace(' ', ';').split(';'); LoadHIP.cmake torch_hip_get_arch_list)."""
    return [t for t in re.split(r"[;\s]+", value.strip()) if t]


def _arch_names(value: str) -> set[str]:
    """The gfx names a value means, without feature suffixes, a comma-joined entry read as the names it joins."""
    return {n.split(":")[0] for t in _arch_tokens(value) for n in t.split(",") if n}


def _unknown_gfx(name: str) -> bool:
    """A name of gfx form (feature suffixes allowed) that no AMDGPU processor has."""
    m = _GFX.fullmatch(name)
    return m is not None and m.group(1) not in KNOWN_GFX


def _arch_value_problem(value: str) -> tuple[str, str] | None:
    """What is wrong with the form of a PYTORCH_ROCM_ARCH value a ROCm build reads, as (why, fix), or None.
    `native` is a target: clang's --offload-arch=native builds for the GPUs of the machine that compiles."""
    toks = _arch_tokens(value)
    if not toks:
        return ("is set but empty: a ROCm build's extensions fail with LoadHIP's 'No GPU arch specified'",
                "use ';'- or space-separated gfx names such as gfx90a;gfx942, or unset it")
    joined = [t for t in toks if "," in t]
    if joined:
        return (f"joins {joined[0]!r} with commas, but torch splits PYTORCH_ROCM_ARCH only at ';' and spaces "
                f"(cpp_extension, LoadHIP.cmake): the compiler gets --offload-arch={joined[0]}, not one flag per arch",
                f"export PYTORCH_ROCM_ARCH=\"{' '.join(n for t in toks for n in t.split(',') if n)}\" (';' or spaces, not commas)")
    bad = [t for t in toks if not (_GFX.fullmatch(t) or t == "native")]
    if bad:
        return f"names {bad[0]!r}, not a gfx target", "use ';'- or space-separated gfx names such as gfx90a;gfx942"
    unknown = [t for t in toks if _unknown_gfx(t)]
    if unknown:
        base = unknown[0].split(":")[0]
        close = difflib.get_close_matches(base, sorted(KNOWN_GFX), n=3, cutoff=0.75)
        hint = f" (close: {', '.join(close)})" if close else ""
        return (f"names {unknown[0]!r}, which is no AMDGPU processor{hint}: clang rejects it as --offload-arch, "
                "so extension builds fail",
                "use the gfx names rocminfo prints for your GPUs (e.g. gfx90a for MI200, gfx942 for MI300)")
    return None


def _pytorch_rocm_arch(value: str | None, need: list[str], source: str, unused_by: str,
                       none: str = "torch sees no GPU") -> list[Check]:
    """PYTORCH_ROCM_ARCH against the AMD archs present (``need``, reported by ``source``; "" for torch;
    ``none`` says why there are none to compare with).

    ``unused_by`` names the build of torch where that is not a ROCm build: there the value is still
    judged against the GPUs present, since a ROCm torch in the same environment would read it, but a
    build-breaking value is a warning, as the build at hand compiles nothing for ROCm."""
    def row(status: Status, detail: str, fix: str = "") -> Check:
        if unused_by:
            status = "warn" if status == "fail" else status
            detail += f" (unused by this {unused_by}; a ROCm torch in this environment would read it)"
        return Check("pytorch-rocm-arch", status, detail, fix)

    where = f", reported by {source}" if source else ""
    if value is None:
        detected = " ".join(need) or "none visible"
        return [row("ok", f"PYTORCH_ROCM_ARCH unset: extensions build for the visible archs ({detected}{where})")]
    names = _arch_names(value)
    problem = _arch_value_problem(value)
    if not _arch_tokens(value):
        return [row("fail", "PYTORCH_ROCM_ARCH is set but empty (LoadHIP: 'No GPU arch specified')",
                    f"export PYTORCH_ROCM_ARCH={' '.join(need) or 'gfx942'!r} or unset it")]
    out = []
    missing = [] if "native" in names else [a for a in need if a not in names]
    if missing:
        kept = {n for n in names if n in KNOWN_GFX}   # the fix leaves out names no compiler takes
        out.append(row("fail", f"PYTORCH_ROCM_ARCH={value!r} lacks detected {', '.join(missing)} (GPUs present: "
                       f"{' '.join(need)}{where}): extensions built with it will not run here ('invalid device function')",
                       f"export PYTORCH_ROCM_ARCH=\"{' '.join(sorted(kept | set(missing)))}\""))
    if problem is not None:
        out.append(row("warn", f"PYTORCH_ROCM_ARCH={value!r} {problem[0]}", problem[1]))
    if out:
        return out
    if "native" in names:
        return [row("ok", f"PYTORCH_ROCM_ARCH={value!r}: clang builds for the GPUs of the machine that compiles "
                    f"({' '.join(need) or 'none visible here'}{where}); a build on another machine targets its GPUs")]
    if not need:
        return [row("ok", f"PYTORCH_ROCM_ARCH={value!r}: no GPU arch to compare it with ({none})")]
    return [row("ok", f"PYTORCH_ROCM_ARCH={value!r} covers {' '.join(need)}{where}")]


def check_rocm_arch(f: Facts) -> list[Check]:
    """The arch lists against the GPUs present: torch's own (ROCm builds), PYTORCH_ROCM_ARCH (every build)
    and the extension projects' arch variables (ROCm builds)."""
    info, env = f.info, f.env
    need, source = _amd_archs(f)
    if info.backend != "rocm" or info.torch_version is None:
        out = _skipped(["arch-list", "arch-rocm"], _no_rocm_reason(info))
        if "PYTORCH_ROCM_ARCH" in env:
            build = "torch (not importable)" if info.torch_version is None else _build(info)
            none = ("--no-tools, so no system tool was asked for the GPUs" if f.tools is None
                    else "the system tools report no AMD GPU")
            out += _pytorch_rocm_arch(env["PYTORCH_ROCM_ARCH"], need, source, build, none)
        return out
    out = []
    if not info.archs:
        out += _skipped(["arch-list", "arch-rocm"], _no_gpu_reason(info))
    built = {a.split(":")[0] for a in info.arch_list}
    for arch in info.archs:
        if built and arch not in built:
            out.append(Check("arch-list", "fail", f"{arch} is not in torch.cuda.get_arch_list() {sorted(built)}: kernels fail with 'invalid device function'",
                             f"install a torch wheel built for {arch} (check: roc-obj-ls libtorch_hip.so | grep {arch})"))
        else:
            out.append(Check("arch-list", "ok" if built else "warn",
                             f"{arch} in torch.cuda.get_arch_list()" if built else "torch.cuda.get_arch_list() is empty",
                             "" if built else "reinstall torch: the arch list could not be read"))
        v = compat.check_arch_rocm(arch, info.hip_version)
        if v is not None and v.status != "ok":
            out.append(Check("arch-rocm", v.status, v.detail, v.fix))
    out += _pytorch_rocm_arch(env.get("PYTORCH_ROCM_ARCH"), need, source, "")
    for var in ARCH_VARS:
        if var in env:
            var_toks = _arch_names(env[var])
            lacking = [a for a in need if a not in var_toks and "native" not in var_toks]
            if lacking:
                out.append(Check(var.lower().replace("_", "-"), "warn", f"{var}={env[var]!r} lacks detected {', '.join(lacking)}",
                                 f"export {var}=\"{';'.join(sorted(var_toks | set(lacking)))}\" (or native)"))
    return out


def _override_arch(value: str) -> str | None:
    """The gfx target HSA_OVERRIDE_GFX_VERSION names ("11.0.0" -> gfx1100, "9.0.10" -> gfx90a)."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value)
    return f"gfx{int(m.group(1))}{int(m.group(2))}{int(m.group(3)):x}" if m else None


def check_hsa_override(f: Facts) -> list[Check]:
    """HSA_OVERRIDE_GFX_VERSION, reported on every build.

    Why: on ROCm it makes the runtime load code objects built for another ISA on this GPU, a classic
    cause of wrong results and crashes; a CPU or CUDA build ignores it, but the same environment
    (a container, a CI job's variables) running a ROCm torch does not.
    """
    value = f.env.get("HSA_OVERRIDE_GFX_VERSION")
    if value is None:
        return [Check("hsa-override", "ok", "HSA_OVERRIDE_GFX_VERSION unset: the runtime uses each GPU's own ISA")]
    arch = _override_arch(value)
    target = f"code built for {arch}" if arch else "code built for another gfx"
    fix = ("unset HSA_OVERRIDE_GFX_VERSION for parity runs; it is a consumer-GPU workaround, not a production setting")
    if f.info.backend == "rocm":
        on = f" on {', '.join(f.info.archs)}" if f.info.archs else ""
        return [Check("hsa-override", "warn", f"HSA_OVERRIDE_GFX_VERSION={value!r} runs {target}{on}: wrong results or "
                      "crashes where the ISAs differ", fix)]
    build = "torch (not importable)" if f.info.torch_version is None else _build(f.info)
    return [Check("hsa-override", "warn", f"HSA_OVERRIDE_GFX_VERSION={value!r} is set: unused by this {build}, but "
                  f"under a ROCm build it runs {target} on every GPU (wrong results or crashes where the ISAs differ)",
                  fix)]


def _triton(f: Facts) -> tuple[str | None, str | None]:
    for dist in TRITON_DISTS:  # the ROCm distribution first: both may be installed
        v = f.packages.get(dist)
        if v:
            return dist, v
    return None, None


def check_versions(f: Facts) -> list[Check]:
    info = f.info
    out = []
    if info.backend == "rocm" and info.torch_version is not None:
        v = compat.check_torch_rocm(info.torch_version, info.hip_version)
        out.append(Check("torch-rocm", v.status, v.detail, v.fix))
    else:
        out += _skipped(["torch-rocm"], _no_rocm_reason(info))
    dist, tv = _triton(f)
    pin = f.packages.get("torch:triton-pin")
    if info.backend == "cpu" and not pin:
        if tv:
            out.append(Check("triton", "ok", f"{dist} {tv} (a CPU torch build pins no triton)"))
    elif info.torch_version is not None:
        v = compat.check_triton(info.torch_version, tv, dist, pinned=pin)
        out.append(Check("triton", v.status, v.detail, v.fix))
    v = compat.check_vllm(f.packages.get("vllm"), info.hip_version, info.backend)
    out.append(Check("vllm", v.status, v.detail, v.fix))
    nvml = f.packages.get("pynvml") or f.packages.get("nvidia-ml-py")
    if info.backend == "rocm" and nvml and not f.packages.get("amdsmi"):
        out.append(Check("nvml", "warn", f"pynvml/nvidia-ml-py {nvml} installed without amdsmi: some torch versions fail device_count()",
                         "pip uninstall pynvml nvidia-ml-py, or pip install amdsmi (pytorch #133259)"))
    elif info.backend != "rocm":
        out += _skipped(["nvml"], _no_rocm_reason(info))
    return out


def check_tools(f: Facts) -> list[Check]:
    if f.tools is None:
        return _skipped(["tools"], "--no-tools, so rocminfo, rocm-smi and amd-smi were not run")
    out = []
    for run in f.tools.runs:
        name = " ".join(run.argv[:2]) if run.argv[0] == "amd-smi" else run.argv[0]
        if not run.found:
            continue
        if run.error:
            fix = ("load the amdgpu driver and check /dev/kfd access (render, video groups)"
                   if any(s in run.error for s in ("ROCk", "Driver", "kfd")) else f"run `{' '.join(run.argv)}` by hand to see why")
            status: Status = "warn"
            out.append(Check(f"tool:{name}", status, f"{' '.join(run.argv)}: {run.error}", fix))
    seen = {c.name for c in out}
    for source in ("rocminfo", "rocm-smi", "amd-smi"):
        gpus = f.tools.gpus_from(source)
        if not gpus:
            continue
        key = f"tool:{'amd-smi static' if source == 'amd-smi' else source}"
        if key in seen:
            continue
        desc = "; ".join(f"{g.index}: {g.name or '?'} {g.gfx or ''}".strip() for g in gpus[:4])
        tool_archs = {g.gfx for g in gpus if g.gfx}
        torch_archs = set(f.info.archs) if f.info.backend == "rocm" else set()
        if tool_archs and torch_archs and not torch_archs <= tool_archs:
            out.append(Check(key, "warn", f"{len(gpus)} GPU(s) [{desc}] but torch reports {sorted(torch_archs)}",
                             "torch and the system see different GPUs: check HSA_OVERRIDE_GFX_VERSION and the torch install"))
        else:
            out.append(Check(key, "ok", f"{len(gpus)} GPU(s): {desc}"))
    if not any(r.found for r in f.tools.runs):
        hint = "apt-get install rocminfo rocm-smi (or use the ROCm install) for cross-checks" if f.info.backend == "rocm" else ""
        out.append(Check("tools", "ok", "rocminfo, rocm-smi and amd-smi not on PATH", hint))
    if f.tools.rocm_version:
        out.append(Check("rocm-runtime", "ok", f"amd-smi reports ROCm {f.tools.rocm_version}; torch bundles HIP {f.info.hip_version}"))
    return out


def recommend_utilization(free: int, total: int, margin: float = 0.02) -> float:
    """Largest ``--gpu-memory-utilization`` that fits in free memory (2-point margin, cap 0.95)."""
    if total <= 0:
        return 0.0
    return max(0.0, min(0.95, math.floor((free / total - margin) * 100) / 100))


def check_memory(f: Facts) -> list[Check]:
    out = []
    mem = list(f.memory)
    if not mem and f.tools is not None:
        mem = [(g.index, g.vram_total - g.vram_used, g.vram_total) for g in f.tools.gpus_from("rocm-smi")
               if g.vram_total and g.vram_used is not None]
    for idx, free, total in mem:
        frac = free / total if total else 0.0
        util = recommend_utilization(free, total)
        detail = f"{free / GIB:.1f} of {total / GIB:.1f} GiB free ({frac:.0%})"
        name = f"memory[{idx}]"
        if frac >= VLLM_DEFAULT_UTIL:
            out.append(Check(name, "ok", f"{detail}; vLLM's default --gpu-memory-utilization {VLLM_DEFAULT_UTIL} fits"))
        elif frac >= 0.1:
            out.append(Check(name, "warn", f"{detail}: other processes hold {(total - free) / GIB:.1f} GiB",
                             f"pass --gpu-memory-utilization {util:.2f} (or lower) to vLLM, or free the GPU"))
        else:
            out.append(Check(name, "fail", f"{detail}: too little headroom for a parity run",
                             "stop the processes holding this GPU (rocm-smi --showpids) or pick another device"))
    if not mem:
        why = (_no_gpu_reason(f.info) if not f.info.devices else "torch.cuda.mem_get_info failed")
        out += _skipped(["memory"], why + ("" if f.tools is not None else "; rocm-smi not run: --no-tools"))
    for var in ("PYTORCH_NO_HIP_MEMORY_CACHING", "PYTORCH_NO_CUDA_MEMORY_CACHING"):
        if f.env.get(var, "0") not in ("", "0"):
            out.append(Check("memory-caching", "warn", f"{var}={f.env[var]!r} disables the caching allocator (slow)",
                             f"unset {var} unless debugging memory"))
    return out


def check_numerics(f: Facts) -> list[Check]:
    info, env, s = f.info, f.env, f.info.settings
    gpu_only = ["blas", "fp16-alt-impl", "attention", "determinism", "debug-env"]
    if info.torch_version is None or not s:
        return _skipped(["tf32", *gpu_only], NO_TORCH if info.torch_version is None
                        else "torch's numerics settings could not be read")
    out = []
    rocm = info.backend == "rocm"
    tf32 = bool(s.get("tf32_matmul")) or s.get("float32_matmul_precision") not in (None, "highest")
    cudnn = "; cudnn/MIOpen allow_tf32=" + str(s.get("tf32_cudnn"))
    if tf32:
        why = "MI300 TF32 runs as XF32 (less accurate than NVIDIA TF32)" if rocm else "the reference side rounds fp32 matmuls to TF32"
        out.append(Check("tf32", "warn", f"fp32 matmuls use TF32 (allow_tf32={s.get('tf32_matmul')}, precision={s.get('float32_matmul_precision')!r}): {why}{cudnn}",
                         "torch.backends.cuda.matmul.allow_tf32 = False; torch.set_float32_matmul_precision('highest') on both sides"))
    else:
        out.append(Check("tf32", "ok", f"fp32 matmuls in full fp32 (precision 'highest'){cudnn}"))
    if info.backend not in ("cuda", "rocm"):
        # the GPU BLAS, SDPA, cuDNN and launch settings mean nothing to a CPU candidate (torch
        # reports cublas and every SDPA backend enabled there too); the matmul precision does
        return out + _skipped(gpu_only, "CPU build of torch; these settings are read by GPU runs only")
    blas = s.get("blas_library")
    detail = f"preferred_blas_library={blas}"
    for var in ("TORCH_BLAS_PREFER_HIPBLASLT", "TORCH_BLAS_PREFER_CUBLASLT"):
        if var in env:
            detail += f", {var}={env[var]!r}"
    detail += f"; fp16/bf16 reduced-precision reduction {s.get('fp16_reduced_precision_reduction')}/{s.get('bf16_reduced_precision_reduction')}"
    hipblaslt = blas in ("cublaslt", "hipblaslt") or env.get("TORCH_BLAS_PREFER_HIPBLASLT", "") not in ("", "0")
    if rocm and hipblaslt and "gfx90a" in info.archs:
        out.append(Check("blas", "warn", f"{detail}: hipBLASLt on gfx90a flushes fp16 backward denormals (pytorch #182952)",
                         "torch.backends.cuda.preferred_blas_library('cublas') (rocBLAS) for fp16 training parity"))
    else:
        out.append(Check("blas", "ok", detail))
    alt = {k: env[k] for k in ("ROCBLAS_INTERNAL_FP16_ALT_IMPL", "MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL") if k in env}
    if alt:
        out.append(Check("fp16-alt-impl", "warn", ", ".join(f"{k}={v!r}" for k, v in alt.items()) + " changes MI200 fp16 GEMM/conv rounding",
                         "unset these unless the reference was produced with the same values"))
    sdpa = s.get("sdpa") or {}
    on = [k for k, v in sdpa.items() if v]
    off = [k for k, v in sdpa.items() if v is False]
    fa = s.get("rocm_fa_library")
    sd = f"SDPA enabled: {', '.join(on) or 'none'}" + (f"; disabled: {', '.join(off)}" if off else "")
    if rocm:
        sd += f"; ROCm flash library {fa or 'default (AOTriton)'}"
    if rocm and (env.get("TORCH_ROCM_FA_PREFER_CK", "") not in ("", "0") or fa == "ck"):
        out.append(Check("attention", "warn", sd + ": CK flash attention instead of the AOTriton default",
                         "unset TORCH_ROCM_FA_PREFER_CK unless the tolerances were set for CK"))
    elif "math" in off and not on:
        out.append(Check("attention", "fail", sd, "torch.backends.cuda.enable_math_sdp(True)"))
    else:
        out.append(Check("attention", "ok", sd))
    if s.get("cudnn_benchmark"):
        lib = "MIOpen exhaustive find" if rocm else "cuDNN autotuning"
        out.append(Check("determinism", "warn", f"cudnn.benchmark=True: {lib} picks solvers per shape, numerics vary run to run",
                         "torch.backends.cudnn.benchmark = False for parity runs"))
    else:
        out.append(Check("determinism", "ok", f"cudnn.benchmark=False, deterministic algorithms={s.get('deterministic')}"))
    blocking = [k for k in ("HIP_LAUNCH_BLOCKING", "AMD_SERIALIZE_KERNEL", "CUDA_LAUNCH_BLOCKING") if env.get(k, "0") not in ("", "0")]
    if blocking:
        out.append(Check("debug-env", "warn", f"{', '.join(blocking)} set: every kernel launch is serialized (slow)",
                         f"unset {' '.join(blocking)} outside debugging"))
    return out


def check_triton_kernels(f: Facts) -> list[Check]:
    """Whether this Triton builds the replay's statistics kernel for each visible GPU's arch.

    Why: a Triton whose compiler does not know the GPU (a wheel older than the arch, a ROCm
    Triton without its LLVM) fails only at the first replay, which then judges with torch ops:
    same verdicts, tens of times slower at 1.1B (docs/performance.md). Compiled here (triton_targets, in a
    subprocess: seconds per arch, docs/doctor.md), it is a line of the checklist instead.
    """
    if not f.kernels:
        return _skipped(["triton-kernels"], "--no-kernels")
    if not f.info.archs:
        return _skipped(["triton-kernels"], _no_gpu_reason(f.info))
    return [Check(f"triton-kernels[{arch}]", *stats_kernel_build(arch)) for arch in f.info.archs]


def stats_kernel_build(arch: str) -> tuple[Status, str, str]:
    """(status, detail, fix) of compiling the statistics kernel for ``arch``; once per arch and process."""
    got = _BUILDS.get(arch)
    if got is None:
        got = _BUILDS[arch] = _build_stats_kernel(arch)
    return got


_BUILDS: dict[str, tuple[Status, str, str]] = {}


def _build_stats_kernel(arch: str) -> tuple[Status, str, str]:
    fix = ("install the triton your torch build pins (the `triton` check); until then replays judge with "
           "torch ops: same verdicts, slower")
    try:
        import torch
        import triton
    except ImportError:
        return "warn", "triton is not importable: the replay's statistics kernel cannot be built", fix
    from pytest_rocm_parity.runner import kernels, triton_stats
    from pytest_rocm_parity.fuzz import triton_targets

    table = torch.zeros(4, dtype=torch.int64)   # sample arguments: only their dtypes matter to a compile
    try:
        (build,) = triton_targets.compile_for(
            triton_stats.stats_many_kernel, table, table, table, table, torch.zeros(4, dtype=torch.float64),
            targets=(arch,), num_warps=kernels.MANY_WARPS, **kernels.kernel_constants((0, 0, 0), True), timeout=300)
    except Exception as exc:  # noqa: BLE001 - the worker itself failed: say so, do not crash the doctor
        return "warn", f"could not run Triton's compiler for {arch}: {type(exc).__name__}: {str(exc)[:300]}", fix
    if not build.ok:
        return "warn", f"triton {triton.__version__} cannot build the replay's statistics kernel for {arch}: " \
                       f"{build.error[:400]}", fix
    r = build.resources
    used = f" ({r['vgprs']} VGPRs, {r.get('vgpr_spills', 0)} spills)" if "vgprs" in r else ""
    return "ok", f"triton {triton.__version__} builds the replay's statistics kernel for {arch}{used}", ""


CHECKS: tuple[Callable[[Facts], list[Check]], ...] = (
    check_backend, check_devices, check_fp8, check_visible_devices, check_rocm_arch, check_hsa_override,
    check_versions, check_triton_kernels, check_tools, check_memory, check_numerics,
)


def run_checks(facts: Facts) -> list[Check]:
    """All checks in a fixed order; a crashing check becomes a warning, never a traceback."""
    out: list[Check] = []
    for fn in CHECKS:
        try:
            out += fn(facts)
        except Exception as exc:  # noqa: BLE001 - a doctor must not die on an odd environment
            out.append(Check(fn.__name__.removeprefix("check_"), "warn", f"check crashed: {type(exc).__name__}: {exc}",
                             "please report this with `rocm-parity doctor --json`"))
    return out


def worst(checks: list[Check]) -> Status:
    """The worst verdict; a skipped check is no verdict."""
    return max((c.status for c in checks if c.status != "skip"), key=_RANK.__getitem__, default="ok")


def _summary(checks: list[Check]) -> dict[str, int]:
    return {s: sum(c.status == s for c in checks) for s in STATUSES}


# --------------------------------------------------------------------------- output


def format_table(checks: list[Check]) -> str:
    """Fixed-width text table; a ``fix:`` line under each non-ok row; the skipped checks at the end,
    one row per reason, and counted in the summary line."""
    rows: list[tuple[str, str, str]] = []
    for c in checks:
        if c.status == "skip":
            continue
        rows.append((c.status.upper(), c.name, c.detail))
        if c.fix and c.status != "ok":
            rows.append(("", "", f"fix: {c.fix}"))
    skipped: dict[str, list[str]] = {}
    for c in checks:
        if c.status == "skip":
            skipped.setdefault(c.detail, []).append(c.name)
    lines = text_table(rows, ("STATUS", "CHECK", "DETAIL"), widths=(6, None, None))
    lines += [f"{'SKIP':<6}  not checked: {', '.join(names)}; why: {detail.removeprefix('not checked: ')}"
              for detail, names in skipped.items()]
    counts = _summary(checks)
    lines.append(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail"
                 + (f", {counts['skip']} not checked" if counts["skip"] else ""))
    return "\n".join(lines)


def to_json(checks: list[Check], facts: Facts) -> dict[str, Any]:
    return {
        "status": worst(checks),
        "summary": _summary(checks),
        "checks": [asdict(c) for c in checks],
        "backend": facts.info.to_dict(),
        "packages": facts.packages,
        "tools": None if facts.tools is None else {
            "runs": [{"argv": list(r.argv), "found": r.found, "returncode": r.returncode, "error": r.error} for r in facts.tools.runs],
            "gpus": [asdict(g) for g in facts.tools.gpus],
            "rocm_version": facts.tools.rocm_version,
        },
    }


def exit_code(checks: list[Check], strict: bool = False) -> int:
    """0 when nothing fails (with ``strict``, nothing warns either), else 1."""
    return int(_RANK[worst(checks)] >= (1 if strict else 2))


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks and facts as JSON")
    parser.add_argument("--no-tools", action="store_true", help="do not run rocminfo, rocm-smi or amd-smi")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="time limit for each system tool (default: 10)")
    parser.add_argument("--no-kernels", action="store_true",
                        help="do not compile the replay's statistics kernel for each GPU (seconds per arch)")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")


def run_doctor(args: argparse.Namespace) -> int:
    if not 0 < args.timeout < float("inf"):   # NaN too, which compares false with everything
        raise InvalidArgument(f"--timeout must be a positive number of seconds, got {args.timeout!r}")
    facts = gather_facts(run_tools=not args.no_tools, timeout=args.timeout, kernels=not args.no_kernels)
    checks = run_checks(facts)
    if args.json:
        print(json.dumps(to_json(checks, facts), indent=2, default=str))
    else:
        print(format_table(checks))
    return exit_code(checks, args.strict)


def header_lines() -> list[str]:
    """Short pytest report header: the backend in one line, problems in a second.

    Runs no external tool and compiles nothing (pytest start-up must stay fast), and never raises.
    """
    try:
        facts = gather_facts(run_tools=False, kernels=False)
        info = facts.info
        lines = [f"rocm-parity: {info.backend} build, torch {info.torch_version}"
                 + (f", HIP {info.hip_version}" if info.hip_version else "")
                 + (f", CUDA {info.cuda_version}" if info.cuda_version else "")]
        if info.devices:
            d = info.devices[0]
            lines[0] += f"; {len(info.devices)} x {d.name or '<unnamed>'} [{', '.join(info.archs)}, warp {d.warp_size}]"
        checks = run_checks(facts)
        bad = [c for c in checks if c.status in ("warn", "fail")]
        if bad:
            fails = sum(c.status == "fail" for c in bad)
            names = ", ".join(dict.fromkeys(c.name for c in bad))
            # the counts leave out the tools' checks, so a full doctor run may count more: say so
            lines.append(f"rocm-parity doctor: {fails} fail, {len(bad) - fails} warn ({names}) without running "
                         f"rocminfo/rocm-smi or compiling kernels; run `rocm-parity doctor` for those and the fixes")
        return lines
    except Exception as exc:  # noqa: BLE001 - a header must never break a test session
        return [f"rocm-parity: environment check failed: {type(exc).__name__}: {exc}"]
