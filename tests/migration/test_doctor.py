"""Doctor checks on facts patched to look like ROCm (MI300X gfx942, MI250X gfx90a) and CUDA builds."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fake_torch import ROCM_ARCHS, patch_torch  # noqa: E402

from pytest_rocm_parity.migration import doctor, rocm_tools
from pytest_rocm_parity.migration.doctor import Check, Facts

torch = pytest.importorskip("torch")
REC = Path(__file__).resolve().parents[1] / "data" / "recorded"
GIB = 1024**3
MI300X = dict(name="AMD Instinct MI300X", major=9, minor=4, gcnArchName="gfx942:sramecc+:xnack-",
              total_memory=192 * GIB, multi_processor_count=304, warp_size=64)
MI250X = dict(name="AMD Instinct MI250X/MI250", major=9, minor=0, gcnArchName="gfx90a:sramecc+:xnack-",
              total_memory=64 * GIB, multi_processor_count=110, warp_size=64)
MI350X = dict(MI300X, name="AMD Instinct MI350X", major=9, minor=5, gcnArchName="gfx950:sramecc+:xnack-")
H100 = dict(name="NVIDIA H100 80GB HBM3", major=9, minor=0, gcnArchName="NVIDIA H100 80GB HBM3",
            total_memory=80 * GIB, multi_processor_count=132, warp_size=32)
NO_PKGS: dict[str, str | None] = {}


def facts(env: dict[str, str] | None = None, packages: dict[str, str | None] | None = None,
          tools: rocm_tools.ToolsReport | None = None, kernels: bool = False) -> Facts:
    """The facts of a patched torch; Triton's compiles only where a test asks (the triton marker's)."""
    f = doctor.gather_facts(run_tools=False, env=env or {}, kernels=kernels)
    f.packages = dict(NO_PKGS if packages is None else packages)
    f.tools = tools
    return f


def by_name(checks: list[Check], name: str) -> Check:
    found = [c for c in checks if c.name == name]
    assert found, f"no check {name!r} in {[c.name for c in checks]}"
    return found[0]


def test_healthy_mi300x(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI300X, n=8)
    checks = doctor.run_checks(facts())
    assert doctor.worst(checks) == "ok", doctor.format_table(checks)
    assert "rocm build via torch.version.hip" in by_name(checks, "backend").detail
    dev = by_name(checks, "device[0]").detail
    assert "gfx942 (gfx942:sramecc+:xnack-)" in dev and "warp 64" in dev and "gfx-derived" in dev
    assert doctor.exit_code(checks) == 0


@pytest.mark.triton
def test_triton_builds_the_statistics_kernel_for_each_visible_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real compiles (Triton's AMD and NVIDIA compilers, on this CPU) for the patched devices' archs."""
    pytest.importorskip("triton")
    patch_torch(monkeypatch, MI300X, n=8)
    assert [(c.name, c.status, c.detail) for c in doctor.run_checks(facts()) if c.name.startswith("triton-kernels")] == [
        ("triton-kernels", "skip", "not checked: --no-kernels")]
    (c,) = [c for c in doctor.run_checks(facts(kernels=True)) if c.name.startswith("triton-kernels")]
    assert c.name == "triton-kernels[gfx942]" and c.status == "ok" and "VGPRs, 0 spills" in c.detail, c
    patch_torch(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    assert by_name(doctor.run_checks(facts(kernels=True)), "triton-kernels[sm_90]").status == "ok"
    # an arch this Triton's compiler does not know: a warning with the compiler's words, not a crash
    patch_torch(monkeypatch, dict(MI300X, name="AMD future part", gcnArchName="gfx1999"), n=1)
    c = by_name(doctor.run_checks(facts(kernels=True)), "triton-kernels[gfx1999]")
    assert c.status == "warn" and "unsupported target: 'gfx1999'" in c.detail and "torch ops" in c.fix, c


@pytest.mark.parametrize(("props", "cuda", "name", "phrases"), [
    (MI300X, None, "fp8[gfx942]", ("FNUZ: float8_e4m3fnuz (max 240), float8_e5m2fnuz (max 57344)",
                                   "OCP checkpoints need converting", "double the scales")),
    (MI350X, None, "fp8[gfx950]", ("OCP: float8_e4m3fn (max 448), float8_e5m2 (max 57344)", "halve the scales")),
    (H100, "12.4", "fp8[sm_90]", ("OCP: float8_e4m3fn (max 448)",)),
    (dict(H100, name="NVIDIA L40S", major=8, minor=9), "12.4", "fp8[sm_89]", ("OCP",)),
    (MI250X, None, "fp8[gfx90a]", ("no FP8 matrix cores", "emulated")),
    (dict(H100, name="NVIDIA A100-SXM4-80GB", major=8, minor=0), "12.4", "fp8[sm_80]", ("no FP8 matrix cores",)),
])
def test_fp8_formats_of_the_device(monkeypatch: pytest.MonkeyPatch, props: dict[str, Any], cuda: str | None,
                                   name: str, phrases: tuple[str, ...]) -> None:
    if cuda:
        patch_torch(monkeypatch, props, hip=None, cuda=cuda, version="2.6.0+cu124")
    else:
        patch_torch(monkeypatch, props)
    c = by_name(doctor.check_fp8(facts()), name)
    assert c.status == "ok" and all(p in c.detail for p in phrases), c
    assert doctor.CHECKS.index(doctor.check_fp8) == doctor.CHECKS.index(doctor.check_devices) + 1   # under the devices


def test_fp8_warns_when_torch_lacks_the_devices_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI300X)
    monkeypatch.delattr(torch, "float8_e4m3fnuz")
    c = by_name(doctor.check_fp8(facts()), "fp8[gfx942]")
    assert c.status == "warn" and "lacks float8_e4m3fnuz" in c.detail and "upgrade torch" in c.fix, c
    # an OCP device does not need the FNUZ dtype
    patch_torch(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    assert by_name(doctor.check_fp8(facts()), "fp8[sm_90]").status == "ok"


def test_fp8_of_a_cpu_candidate() -> None:
    (c,) = [c for c in doctor.check_fp8(facts()) if c.name.startswith("fp8")]
    assert c.name == "fp8" and c.status == "ok" and "emulates both families" in c.detail, c


@pytest.mark.parametrize(("recording", "parse", "name", "family"), [
    ("rocminfo_mi300x.txt", rocm_tools.rocminfo_gpus, "fp8[gfx942]", "FNUZ"),
    ("rocminfo_mi250x.txt", rocm_tools.rocminfo_gpus, "fp8[gfx90a]", "no FP8 matrix cores"),
    ("amd_smi_static_asic_mi350x.json", rocm_tools.amd_smi_gpus, "fp8[gfx950]", "OCP"),
])
def test_fp8_from_the_system_tools_when_torch_sees_no_gpu(monkeypatch: pytest.MonkeyPatch, recording: str,
                                                          parse: Any, name: str, family: str) -> None:
    """A CPU torch on an AMD machine: the formats come from the tools' recorded output."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = rocm_tools.ToolsReport(gpus=parse((REC / recording).read_text()))
    (c,) = doctor.check_fp8(facts(tools=report))
    source = "amd-smi" if "amd_smi" in recording else "rocminfo"
    assert c.name == name and family in c.detail and f"arch from {source}; torch sees no GPU" in c.detail, c


def test_fp8_of_an_unreadable_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, dict(MI300X, gcnArchName=""))
    c = by_name(doctor.check_fp8(facts()), "fp8[unknown]")
    assert c.status == "ok" and "FP8 format unknown" in c.detail


def test_cuda_build_is_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    checks = doctor.run_checks(facts({"HIP_VISIBLE_DEVICES": "0"}))
    assert "cuda build via torch.version.cuda" in by_name(checks, "backend").detail
    assert "sm_90" in by_name(checks, "device[0]").detail
    vis = by_name(checks, "visible-devices")
    assert vis.status == "warn" and "ignored by a CUDA build" in vis.detail


@pytest.mark.parametrize(
    ("env", "status", "phrase"),
    [
        ({"HIP_VISIBLE_DEVICES": ""}, "warn", "read as unset by the HIP runtime"),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, "fail", "hides every GPU"),
        ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}, "fail", "leaves no device"),
        ({"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,3"}, "fail", "drops some devices"),
        ({"ROCR_VISIBLE_DEVICES": "GPU-aa", "HIP_VISIBLE_DEVICES": "GPU-bb"}, "fail", "UUIDs in both"),
        ({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2"}, "warn", "HIP_VISIBLE_DEVICES wins"),
        ({"HIP_VISIBLE_DEVICES": "0,0"}, "warn", "twice"),
        ({"HIP_VISIBLE_DEVICES": "0,gpu1"}, "fail", "neither an index"),
        ({"CUDA_VISIBLE_DEVICES": "MIG-GPU-aa/1/0"}, "warn", "AMD GPUs have none"),
        ({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, "ok", "torch sees"),
        ({}, "ok", "all GPUs visible"),
    ],
)
def test_visible_devices(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], status: str, phrase: str) -> None:
    patch_torch(monkeypatch, MI300X)
    c = by_name(doctor.check_visible_devices(facts(env)), "visible-devices")
    assert c.status == status and phrase in c.detail, c
    assert c.status == "ok" or c.fix


@pytest.mark.parametrize(
    ("value", "bad", "left", "example"),
    [("0, 1", "' 1'", "only 0 stays visible", "0,1"), ("0,,1", "an empty entry", "only 0 stays visible", "0,1"),
     ("01,1", "'01'", "no GPU is visible", "1,1"), (",0", "an empty entry", "no GPU is visible", "0")],
)
def test_hip_visible_devices_read_as_rocclr_reads_them(monkeypatch: pytest.MonkeyPatch, value: str, bad: str,
                                                        left: str, example: str) -> None:
    """ROCclr (rocdevice.cpp, Device::init) takes an entry only where it is written exactly as its index and
    stops at the first that is not: a space, an empty entry or a leading zero drops the entries from there."""
    patch_torch(monkeypatch, MI300X, n=2)
    (c,) = doctor.check_visible_devices(facts({"HIP_VISIBLE_DEVICES": value}))
    assert c.status == "fail" and f"{bad} is neither an index" in c.detail, c
    assert "later entries are dropped" in c.detail and c.detail.endswith(left), c
    assert c.fix.endswith(f"HIP_VISIBLE_DEVICES={example}"), c


def test_visible_devices_trailing_comma_and_cuda_spaces_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """One trailing comma ends the list in every runtime; CUDA (on a CUDA build) and ROCr trim spaces."""
    patch_torch(monkeypatch, MI300X, n=2)
    assert doctor.check_visible_devices(facts({"HIP_VISIBLE_DEVICES": "0,1,"}))[0].status == "ok"
    assert doctor.check_visible_devices(facts({"ROCR_VISIBLE_DEVICES": "0, 1"}))[0].status == "ok"
    (c,) = doctor.check_visible_devices(facts({"CUDA_VISIBLE_DEVICES": "0, 1"}))
    assert c.status == "fail" and "ROCclr" in c.detail, c
    patch_torch(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    assert doctor.check_visible_devices(facts({"CUDA_VISIBLE_DEVICES": "0, 1"})) == [
        Check("visible-devices", "ok", "CUDA_VISIBLE_DEVICES='0, 1'")]


@pytest.mark.parametrize(
    ("env", "runtime"),
    [({"HIP_VISIBLE_DEVICES": ""}, "shows every GPU"),
     ({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "1"}, "falls back to CUDA_VISIBLE_DEVICES='1'"),
     ({"CUDA_VISIBLE_DEVICES": ""}, "shows every GPU")],
)
def test_empty_visible_devices_is_unset_to_rocclr(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                  runtime: str) -> None:
    """ROCclr reads an empty HIP_VISIBLE_DEVICES as unset (then CUDA_VISIBLE_DEVICES, else every GPU), while
    torch.cuda.device_count() counts none before CUDA initializes: a warning, not a failure."""
    patch_torch(monkeypatch, MI300X, n=2)
    (c,) = doctor.check_visible_devices(facts(env))
    assert c.status == "warn" and f"is read as unset by the HIP runtime (ROCclr), which {runtime};" in c.detail, c
    assert "torch.cuda.device_count() counts 0 devices" in c.detail and c.fix.startswith("unset "), c


def test_empty_hip_visible_devices_on_builds_that_do_not_read_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU build reads no visible-devices variable, and a CUDA build hides every GPU only for an empty
    CUDA_VISIBLE_DEVICES: an empty HIP_VISIBLE_DEVICES fails neither."""
    assert doctor.check_visible_devices(facts({"HIP_VISIBLE_DEVICES": ""})) == [
        Check("visible-devices", "ok", "HIP_VISIBLE_DEVICES=''")]
    patch_torch(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    (c,) = doctor.check_visible_devices(facts({"HIP_VISIBLE_DEVICES": ""}))
    assert c.status == "warn" and "ignored by a CUDA build" in c.detail, c
    (c,) = doctor.check_visible_devices(facts({"CUDA_VISIBLE_DEVICES": ""}))
    assert c.status == "fail" and "hides every GPU" in c.detail, c


@pytest.mark.parametrize("entry", ["MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f",
                                   "MIG-GPU-5c3b2a1e-7f0d-4c2e-9b8a-1d2e3f4a5b6c/1/0",
                                   "0", "GPU-5c3b2a1e-7f0d-4c2e-9b8a-1d2e3f4a5b6c"])
def test_cuda_visible_devices_accepts_mig_uuids(monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """nvidia-smi -L prints MIG instances as MIG-<uuid> (older drivers: MIG-GPU-<uuid>/<gi>/<ci>); CUDA takes both."""
    patch_torch(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    assert doctor.check_visible_devices(facts({"CUDA_VISIBLE_DEVICES": entry})) == [
        Check("visible-devices", "ok", f"CUDA_VISIBLE_DEVICES={entry!r}")]


@pytest.mark.parametrize("entry", ["MIG-GPU-5c3b2a1e-7f0d", "MIG-", "MIG-GPU-aa/1"])
def test_cuda_visible_devices_rejects_malformed_mig_uuids(monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    patch_torch(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    (c,) = doctor.check_visible_devices(facts({"CUDA_VISIBLE_DEVICES": entry}))
    assert c.status == "fail" and "nor a MIG-UUID" in c.detail, c


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"HIP_VISIBLE_DEVICES": "-1", "CUDA_VISIBLE_DEVICES": "0,0"},
         [("fail", "HIP_VISIBLE_DEVICES='-1' hides every GPU"), ("warn", "CUDA_VISIBLE_DEVICES='0,0' lists a device twice")]),
        ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1,1", "CUDA_VISIBLE_DEVICES": "0", "GPU_DEVICE_ORDINAL": "x"},
         [("warn", "lists a device twice"), ("fail", "'x' is neither an index"), ("fail", "leaves no device"),
          ("warn", "HIP_VISIBLE_DEVICES wins")]),
    ],
)
def test_visible_devices_lists_every_problem(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                             want: list[tuple[str, str]]) -> None:
    patch_torch(monkeypatch, MI300X)
    checks = doctor.check_visible_devices(facts(env))
    assert len(checks) == len(want), checks
    for c, (status, phrase) in zip(checks, want):
        assert c.name == "visible-devices" and c.status == status and phrase in c.detail and c.fix, c


def test_doctor_command_lists_every_visible_devices_problem() -> None:
    """The installed torch, as `rocm-parity doctor --json` sees it: both variables' problems, each with its fix."""
    env = {k: v for k, v in os.environ.items() if k not in doctor.VISIBLE_VARS}
    env |= {"HIP_VISIBLE_DEVICES": "-1", "CUDA_VISIBLE_DEVICES": "0,0"}
    proc = subprocess.run([sys.executable, "-m", "pytest_rocm_parity.cli", "doctor", "--json", "--no-tools"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr
    rows = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "visible-devices"]
    unused = "(unused by this CPU build of torch; a {} torch in this environment would read it)"
    assert [(c["status"], c["detail"]) for c in rows][:2] == [
        ("fail", f"HIP_VISIBLE_DEVICES='-1' hides every GPU {unused.format('ROCm')}"),
        ("warn", f"CUDA_VISIBLE_DEVICES='0,0' lists a device twice {unused.format('ROCm or CUDA')}")]
    assert rows[0]["fix"].startswith("unset HIP_VISIBLE_DEVICES") and rows[1]["fix"] == "remove the duplicate from CUDA_VISIBLE_DEVICES"


def _build_of(monkeypatch: pytest.MonkeyPatch, build: str) -> None:
    if build == "cuda":
        patch_torch(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    elif build == "rocm":
        patch_torch(monkeypatch, MI300X, n=2)
    else:
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.version, "cuda", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("build", ["cpu", "cuda", "rocm"])
@pytest.mark.parametrize(("env", "status", "phrase"), [
    ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}, "fail", "index 1 is out of range, leaves no device"),
    ({"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,3"}, "fail", "drops some devices"),
    ({"ROCR_VISIBLE_DEVICES": "GPU-aa", "HIP_VISIBLE_DEVICES": "GPU-bb"}, "fail", "UUIDs in both"),
    ({"HIP_VISIBLE_DEVICES": "-1"}, "fail", "HIP_VISIBLE_DEVICES='-1' hides every GPU"),
])
def test_visible_devices_are_judged_alike_on_every_build(monkeypatch: pytest.MonkeyPatch, build: str,
                                                         env: dict[str, str], status: str, phrase: str) -> None:
    """A combination that leaves a ROCm torch no device fails on every build, as a single variable that
    hides every GPU does: the same environment may run a ROCm torch next. Off ROCm the row says the
    variables are unused by this build."""
    _build_of(monkeypatch, build)
    (c,) = [c for c in doctor.check_visible_devices(facts(env)) if phrase in c.detail]
    assert c.status == status and c.fix, c
    assert ("unused by this" in c.detail) == (build != "rocm"), c


@pytest.mark.parametrize(("build", "warns"), [("cpu", True), ("cuda", False), ("rocm", True)])
@pytest.mark.parametrize(("env", "phrase"), [
    ({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2"}, "HIP_VISIBLE_DEVICES wins on ROCm"),
    ({"HIP_VISIBLE_DEVICES": "0", "GPU_DEVICE_ORDINAL": "0"}, "GPU_DEVICE_ORDINAL filters again"),
])
def test_rocm_only_combinations_off_rocm(monkeypatch: pytest.MonkeyPatch, build: str, warns: bool,
                                         env: dict[str, str], phrase: str) -> None:
    """HIP beating CUDA and GPU_DEVICE_ORDINAL filtering again warn on a CPU build as on ROCm; a CUDA
    build says instead that it ignores the HIP variables and GPU_DEVICE_ORDINAL."""
    _build_of(monkeypatch, build)
    checks = doctor.check_visible_devices(facts(env))
    assert any(c.status == "warn" and phrase in c.detail for c in checks) == warns, checks
    if build == "cuda":
        ignored = [k for k in env if k != "CUDA_VISIBLE_DEVICES"]
        assert any(c.status == "warn" and f"{', '.join(ignored)} are ignored by a CUDA build" in c.detail
                   for c in checks), checks


def test_visible_devices_a_cpu_build_leaves_to_rocm(monkeypatch: pytest.MonkeyPatch) -> None:
    """What only torch's own ROCm parsing (an empty list) or an AMD device (a MIG UUID) makes a problem
    stays a ROCm build's row."""
    _build_of(monkeypatch, "cpu")
    for env in ({"HIP_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "MIG-GPU-aa/1/0"}):
        assert [c.status for c in doctor.check_visible_devices(facts(env))] == ["ok"], env


def test_rocm_arch_missing_from_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI300X)
    c = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": "gfx90a;gfx908"})), "pytorch-rocm-arch")
    assert c.status == "fail" and "lacks detected gfx942" in c.detail
    assert c.fix == 'export PYTORCH_ROCM_ARCH="gfx908 gfx90a gfx942"'
    ok = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": "gfx90a gfx942:xnack-"})), "pytorch-rocm-arch")
    assert ok.status == "ok"


def test_rocm_arch_joined_with_commas_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch splits PYTORCH_ROCM_ARCH at ';' and spaces only (cpp_extension, LoadHIP.cmake): a comma list
    reaches the compiler as one --offload-arch value, on a ROCm build and as read on a CPU build."""
    cpu = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": "gfx942,gfx90a"})), "pytorch-rocm-arch")
    assert cpu.status == "warn" and "splits PYTORCH_ROCM_ARCH only at ';' and spaces" in cpu.detail, cpu
    patch_torch(monkeypatch, MI300X)
    c = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": "gfx942,gfx90a"})), "pytorch-rocm-arch")
    assert c.status == "warn" and "--offload-arch=gfx942,gfx90a" in c.detail, c
    assert c.fix.startswith('export PYTORCH_ROCM_ARCH="gfx942 gfx90a"'), c


@pytest.mark.parametrize("value", ["native", "gfx90a;native"])
def test_rocm_arch_native_builds_for_this_machine(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """torch passes `native` on as --offload-arch=native, which clang resolves to the compiling machine's GPUs."""
    cpu = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": value})), "pytorch-rocm-arch")
    assert cpu.status == "ok", cpu
    patch_torch(monkeypatch, MI300X)
    c = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": value})), "pytorch-rocm-arch")
    assert c.status == "ok" and "clang builds for the GPUs of the machine that compiles (gfx942)" in c.detail, c


@pytest.mark.parametrize(("value", "status", "says"), [
    ("", "warn", "is set but empty"), ("gfx942;sm_90", "warn", "names 'sm_90', not a gfx target"),
    ("gfx90a;gfx942", "ok", "unused by this CPU build of torch")])
def test_rocm_arch_is_read_on_a_build_that_does_not_use_it(value: str, status: str, says: str) -> None:
    """This CPU build ignores PYTORCH_ROCM_ARCH, but a ROCm torch in the same environment would read
    it: an empty or malformed value is a warning, as HSA_OVERRIDE_GFX_VERSION is on every build."""
    c = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": value})), "pytorch-rocm-arch")
    assert c.status == status and says in c.detail, c
    assert bool(c.fix) == (status == "warn")


def _cpu_torch_on(monkeypatch: pytest.MonkeyPatch, recording: str) -> rocm_tools.ToolsReport:
    """A CPU build of torch on the machine whose rocminfo output was recorded: the archs come from the tool."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return rocm_tools.ToolsReport(gpus=rocm_tools.rocminfo_gpus((REC / recording).read_text()))


@pytest.mark.parametrize(("recording", "value", "lacking", "fix"), [
    ("rocminfo_mi300x.txt", "gfx90a", "gfx942", 'export PYTORCH_ROCM_ARCH="gfx90a gfx942"'),
    ("rocminfo_mi250x.txt", "gfx942;gfx908", "gfx90a", 'export PYTORCH_ROCM_ARCH="gfx908 gfx90a gfx942"'),
])
def test_rocm_arch_against_the_tools_archs_on_a_cpu_build(monkeypatch: pytest.MonkeyPatch, recording: str,
                                                          value: str, lacking: str, fix: str) -> None:
    """A CPU torch on an AMD machine ignores PYTORCH_ROCM_ARCH, but the ROCm torch this environment is being
    set up for would build extensions for the listed archs only: compared with rocminfo's archs, a list
    without the GPUs' arch warns, naming both and the corrected export."""
    report = _cpu_torch_on(monkeypatch, recording)
    (c,) = [c for c in doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": value}, tools=report))
            if c.name == "pytorch-rocm-arch"]
    assert c.status == "warn" and f"PYTORCH_ROCM_ARCH={value!r} lacks detected {lacking}" in c.detail, c
    assert "reported by rocminfo" in c.detail and "unused by this CPU build of torch" in c.detail, c
    assert c.fix == fix
    ok = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": f"{value} {lacking}"}, tools=report)),
                 "pytorch-rocm-arch")
    assert ok.status == "ok" and f"covers {lacking}, reported by rocminfo" in ok.detail, ok
    # without the tools there is nothing to compare with, and the row says so
    c = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": value})), "pytorch-rocm-arch")
    assert c.status == "ok" and "no GPU arch to compare it with (--no-tools" in c.detail, c


def test_rocm_arch_of_a_rocm_build_that_sees_no_gpu_uses_the_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ROCm torch whose runtime finds no GPU (a visible-devices variable, a driver): rocminfo still says
    which GPUs the machine has, and a list lacking their arch fails as it does with torch's devices."""
    patch_torch(monkeypatch, MI300X, n=0)
    report = rocm_tools.ToolsReport(gpus=rocm_tools.rocminfo_gpus((REC / "rocminfo_mi300x.txt").read_text()))
    c = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": "gfx90a"}, tools=report)), "pytorch-rocm-arch")
    assert c.status == "fail" and "lacks detected gfx942" in c.detail and "unused" not in c.detail, c


@pytest.mark.parametrize(("value", "unknown", "close"), [
    ("gfx9999", "gfx9999", "gfx909"), ("gfx942;gfx94", "gfx94", "gfx942"), ("gfx90a gfx8888:xnack-", "gfx8888:xnack-", "")])
def test_rocm_arch_names_no_amdgpu_processor(monkeypatch: pytest.MonkeyPatch, value: str, unknown: str,
                                             close: str) -> None:
    """A name of gfx form that no AMDGPU processor has (a typo) makes clang reject --offload-arch: flagged
    on every build, with the nearest real names where there are some."""
    for build in ("cpu", "rocm"):
        if build == "rocm":
            patch_torch(monkeypatch, MI300X if "gfx942" in value else MI250X)
        rows = [c for c in doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": value})) if c.name == "pytorch-rocm-arch"]
        (c,) = [c for c in rows if "no AMDGPU processor" in c.detail]
        assert c.status == "warn" and f"names {unknown!r}, which is no AMDGPU processor" in c.detail, (build, c)
        assert (f"close: {close}" in c.detail) if close else "close:" not in c.detail, c
        assert "gfx942 for MI300" in c.fix, c


@pytest.mark.parametrize("value", ["gfx942", "gfx90a:sramecc+:xnack-", "gfx9-4-generic", "gfx10-3-generic",
                                   "gfx12-5-generic", "gfx1151", "gfx950", "gfx940"])
def test_rocm_arch_accepts_every_amdgpu_processor_form(value: str) -> None:
    c = by_name(doctor.check_rocm_arch(facts({"PYTORCH_ROCM_ARCH": value})), "pytorch-rocm-arch")
    assert c.status == "ok", c


@pytest.mark.skipif(shutil.which("llc") is None, reason="llc (LLVM) is not installed: apt-get install llvm")
def test_known_gfx_holds_every_processor_the_installed_llvm_lists() -> None:
    """The real LLVM's processor table (`llc -mtriple=amdgcn-amd-amdhsa -mcpu=help`): each gfx name it takes
    is one the doctor knows, so no real arch is reported as a typo."""
    out = subprocess.run(["llc", "-mtriple=amdgcn-amd-amdhsa", "-mcpu=help"], capture_output=True, text=True,
                         timeout=60, check=False)
    listed = {m for m in re.findall(r"^\s+(gfx[0-9a-z-]+)\s+- Select", out.stdout + out.stderr, re.M)}
    assert len(listed) > 20, out.stdout[:2000] + out.stderr[:2000]
    assert listed <= doctor.KNOWN_GFX, sorted(listed - doctor.KNOWN_GFX)


def test_arch_not_in_torch_arch_list(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, dict(MI300X, gcnArchName="gfx1201"), archs=["gfx90a", "gfx942"])
    checks = doctor.run_checks(facts({"HSA_OVERRIDE_GFX_VERSION": "11.0.0", "GPU_ARCHS": "gfx90a"}))
    c = by_name(checks, "arch-list")
    assert c.status == "fail" and "invalid device function" in c.detail and "roc-obj-ls" in c.fix
    assert by_name(checks, "hsa-override").status == "warn"
    assert by_name(checks, "gpu-archs").status == "warn"


def test_gfx950_needs_rocm_7(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI350X, archs=ROCM_ARCHS + ["gfx950"], hip="6.4.43483-a187df25c", version="2.8.0+rocm6.4")
    assert by_name(doctor.check_rocm_arch(facts()), "arch-rocm").status == "fail"


@pytest.mark.parametrize(
    ("version", "hip", "pkgs", "name", "status"),
    [
        ("2.7.1+rocm6.3", "6.3.42131-fa1d09cbd", {}, "torch-rocm", "ok"),
        ("2.7.1+rocm6.3", "6.0.32830", {}, "torch-rocm", "warn"),
        ("2.6.0+rocm6.2.4", "6.2.41133", {"pytorch-triton-rocm": "3.2.0+git4b3bb1f8"}, "triton", "ok"),
        ("2.6.0+rocm6.2.4", "6.2.41133", {"pytorch-triton-rocm": "3.1.0"}, "triton", "fail"),
        ("2.8.0+rocm6.4", "6.4.43483", {"triton": "3.1.0"}, "triton", "warn"),  # pin marked unverified
        ("2.6.0+rocm6.2.4", "6.2.41133", {"vllm": "0.6.5"}, "vllm", "ok"),
        ("2.6.0+rocm6.2.4", "6.2.41133", {"vllm": "0.9.1"}, "vllm", "fail"),
        ("2.6.0+rocm6.2.4", "6.2.41133", {"vllm": "0.6.6.post1"}, "vllm", "ok"),   # within the 0.6.6 series
        ("2.6.0+rocm6.2.4", "6.2.41133", {"vllm": "0.6.5rc1+rocm"}, "vllm", "ok"),  # a pre-release of 0.6.5
        ("2.7.1+rocm6.3", "6.3.42131-fa1d09cbd", {"vllm": "0.8.0.dev12+g1a2b3c"}, "vllm", "ok"),
        ("2.6.0+rocm6.2.4", "6.2.41133", {"pynvml": "11.5.0"}, "nvml", "warn"),
        ("9.9.0+rocm9.9", "9.9.1", {}, "torch-rocm", "warn"),
    ],
)
def test_version_matrix(monkeypatch: pytest.MonkeyPatch, version: str, hip: str, pkgs: dict[str, str | None],
                        name: str, status: str) -> None:
    patch_torch(monkeypatch, MI300X, version=version, hip=hip)
    c = by_name(doctor.check_versions(facts(packages=pkgs)), name)
    assert c.status == status, c
    if status != "ok":
        assert c.fix


def test_torch_metadata_pin_beats_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI300X)
    c = by_name(doctor.check_versions(facts(packages={"triton": "3.2.0", "torch:triton-pin": "3.3.0"})), "triton")
    assert c.status == "fail" and "pins triton 3.3.x" in c.detail


@pytest.mark.parametrize("requirement", [
    "pytorch-triton-rocm==3.3.0; platform_system == 'Linux'",
    "Pytorch_Triton_ROCm ==3.3.0",
    "triton==3.3.0",
])
def test_triton_pin_read_from_torch_requirements(monkeypatch: pytest.MonkeyPatch, requirement: str) -> None:
    from importlib import metadata

    monkeypatch.setattr(metadata, "requires", lambda name: ["filelock", "not a requirement ((", requirement])
    assert doctor.gather_facts(run_tools=False, kernels=False).packages["torch:triton-pin"] == "3.3.0"


def test_no_triton_pin_in_a_cpu_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    monkeypatch.setattr(metadata, "requires", lambda name: ["filelock", "triton>=3.0; extra == 'opt'"])
    assert doctor.gather_facts(run_tools=False, kernels=False).packages["torch:triton-pin"] is None


def _tools(*names: str, error: str | None = None) -> rocm_tools.ToolsReport:
    report = rocm_tools.ToolsReport()
    for n in names:
        report.runs.append(rocm_tools.ToolRun((n,), True, 0 if error is None else 1, error=error))
    if error is None:
        report.gpus += rocm_tools.rocminfo_gpus((REC / "rocminfo_mi300x.txt").read_text())
        report.gpus += rocm_tools.rocm_smi_gpus((REC / "rocm_smi_showproductname_mi300x.json").read_text(),
                                                (REC / "rocm_smi_showmeminfo_vram_mi300x.json").read_text())
    return report


def test_tools_recorded_output_agrees_with_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI300X)
    checks = doctor.check_tools(facts(tools=_tools("rocminfo", "rocm-smi")))
    c = by_name(checks, "tool:rocminfo")
    assert c.status == "ok" and "AMD Instinct MI300X gfx942" in c.detail


def test_tools_disagree_with_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI250X)
    assert by_name(doctor.check_tools(facts(tools=_tools("rocminfo"))), "tool:rocminfo").status == "warn"


def test_amd_gpus_but_cpu_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    c = by_name(doctor.check_backend(facts(tools=_tools("rocminfo"))), "backend")
    assert c.status == "fail" and "CPU-only" in c.detail and "whl/rocm" in c.fix


def test_tool_failure_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI300X)
    checks = doctor.check_tools(facts(tools=_tools("rocminfo", error="ROCk module is NOT loaded, possibly no GPU devices")))
    c = by_name(checks, "tool:rocminfo")
    assert c.status == "warn" and "/dev/kfd" in c.fix


@pytest.mark.parametrize(("free", "status", "advice"), [(0.95, "ok", ""), (0.5, "warn", "--gpu-memory-utilization 0.48"), (0.05, "fail", "")])
def test_memory_headroom(monkeypatch: pytest.MonkeyPatch, free: float, status: str, advice: str) -> None:
    patch_torch(monkeypatch, MI300X, free_frac=free)
    c = by_name(doctor.check_memory(facts()), "memory[0]")
    assert c.status == status and advice in c.fix


def test_memory_from_rocm_smi_when_torch_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI300X)
    f = facts(tools=_tools("rocm-smi"))
    f.memory = []
    c = by_name(doctor.check_memory(f), "memory[1]")
    assert c.status == "warn" and "GiB free" in c.detail  # 165 of 192 GiB used in the recording


def test_recommend_utilization() -> None:
    assert doctor.recommend_utilization(100, 100) == 0.95
    assert doctor.recommend_utilization(50, 100) == 0.48
    assert doctor.recommend_utilization(1, 100) == 0.0


def test_a_cpu_build_gets_no_gpu_settings_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU build of torch: no BLAS, SDPA, cuDNN or launch lines, which would say OK about settings
    no CPU run reads; the matmul precision, which the CPU's matmuls read, stays."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    checks = doctor.run_checks(facts())
    assert by_name(checks, "tf32").status == "ok"
    for name in ("blas", "attention", "determinism", "debug-env", "fp16-alt-impl"):
        c = by_name(checks, name)
        assert c.status == "skip" and "read by GPU runs only" in c.detail, c


def test_numerics_settings(monkeypatch: pytest.MonkeyPatch, set_torch_flag: Any) -> None:
    patch_torch(monkeypatch, MI250X)
    set_torch_flag(torch.backends.cuda.matmul, "allow_tf32", True)
    set_torch_flag(torch.backends.cudnn, "benchmark", True)
    env = {"TORCH_BLAS_PREFER_HIPBLASLT": "1", "ROCBLAS_INTERNAL_FP16_ALT_IMPL": "1", "TORCH_ROCM_FA_PREFER_CK": "1",
           "AMD_SERIALIZE_KERNEL": "3"}
    checks = doctor.check_numerics(facts(env))
    assert "XF32" in by_name(checks, "tf32").detail
    assert "#182952" in by_name(checks, "blas").detail
    for name in ("tf32", "blas", "fp16-alt-impl", "attention", "determinism", "debug-env"):
        assert by_name(checks, name).status == "warn", name


def test_crashing_check_becomes_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI300X)

    def broken(f: Facts) -> list[Check]:
        raise RuntimeError("odd env")

    monkeypatch.setattr(doctor, "CHECKS", (broken,))
    (c,) = doctor.run_checks(facts())
    assert c.status == "warn" and "odd env" in c.detail


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    doctor.add_doctor_arguments(parser)
    return parser.parse_args(list(argv))


def test_run_doctor_json_and_exit_code(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    patch_torch(monkeypatch, MI300X)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "-1")
    assert doctor.run_doctor(_args("--json", "--no-tools", "--no-kernels")) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "fail" and data["summary"]["fail"] >= 1
    assert {"name", "status", "detail", "fix"} <= set(data["checks"][0])
    assert data["backend"]["backend"] == "rocm"
    monkeypatch.delenv("HIP_VISIBLE_DEVICES")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(doctor, "_packages", lambda: {})
    assert doctor.run_doctor(_args("--no-tools", "--no-kernels")) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["STATUS", "CHECK", "DETAIL"]
    assert "not checked: triton-kernels; why: --no-kernels" in out and "OK      triton-kernels" not in out


def _cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for var in (*doctor.VISIBLE_VARS, "HSA_OVERRIDE_GFX_VERSION", "PYTORCH_ROCM_ARCH"):
        monkeypatch.delenv(var, raising=False)


ROCM_ONLY = ("arch-list", "arch-rocm", "torch-rocm")
GPU_ONLY = ("devices", "triton-kernels", "memory", "blas", "attention", "fp16-alt-impl", "determinism", "debug-env")


def test_a_cpu_build_says_what_it_did_not_check_and_why(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The command on a CPU build of torch: every check it cannot run here is a skip row with its reason,
    in the JSON and in the table; skips neither fail --strict nor count as ok."""
    from pytest_rocm_parity import cli

    _cpu_build(monkeypatch)
    monkeypatch.setattr(doctor, "_packages", lambda: {})
    assert cli.main(["doctor", "--json", "--no-tools"]) == 0
    data = json.loads(capsys.readouterr().out)
    skipped = {c["name"]: c["detail"] for c in data["checks"] if c["status"] == "skip"}
    for name in ROCM_ONLY:
        assert skipped.get(name) == "not checked: CPU build of torch, not a ROCm build", (name, skipped)
    for name in GPU_ONLY:
        assert skipped.get(name, "").startswith("not checked: CPU build of torch"), (name, skipped)
    assert data["summary"]["skip"] == len(skipped) and data["status"] == "warn"       # the CPU-only backend
    assert [c["name"] for c in data["checks"] if c["status"] in ("warn", "fail")] == ["backend"]
    assert {"ok", "warn", "fail", "skip"} == set(data["summary"])
    assert cli.main(["doctor", "--no-tools", "--strict"]) == 1          # the CPU-only backend warns
    out = capsys.readouterr().out
    assert "not checked: arch-list, arch-rocm, torch-rocm, nvml; why: CPU build of torch, not a ROCm build" in out
    assert f"{len(skipped)} not checked" in out.splitlines()[-1], out


def test_visible_devices_does_not_claim_gpus_where_torch_sees_none(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu_build(monkeypatch)
    (c,) = doctor.check_visible_devices(facts())
    assert c.status == "ok" and "all GPUs visible" not in c.detail and "no GPU" in c.detail, c
    patch_torch(monkeypatch, MI300X, n=2)
    (c,) = doctor.check_visible_devices(facts())
    assert "all GPUs visible (torch sees 2)" in c.detail, c


@pytest.mark.parametrize("build", ["cpu", "cuda", "rocm"])
def test_hsa_override_is_reported_on_every_build(monkeypatch: pytest.MonkeyPatch, build: str) -> None:
    """HSA_OVERRIDE_GFX_VERSION makes ROCm run code for another ISA: the row names that ISA on every
    build, since the same environment may run a ROCm torch next."""
    if build == "cpu":
        _cpu_build(monkeypatch)
    elif build == "cuda":
        patch_torch(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    else:
        patch_torch(monkeypatch, MI300X)
    checks = doctor.run_checks(facts({"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}))
    c = by_name(checks, "hsa-override")
    assert c.status == "warn" and "gfx1100" in c.detail and "unset HSA_OVERRIDE_GFX_VERSION" in c.fix, c
    assert ("on gfx942" in c.detail) == (build == "rocm"), c
    assert by_name(doctor.run_checks(facts()), "hsa-override").status == "ok"


def test_strict_fails_on_warnings() -> None:
    checks = [Check("a", "ok", ""), Check("b", "warn", "x", "y")]
    assert doctor.exit_code(checks) == 0 and doctor.exit_code(checks, strict=True) == 1
    assert "fix: y" in doctor.format_table(checks)


def test_header_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch(monkeypatch, MI300X, n=8)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "")
    compiled: list[str] = []
    monkeypatch.setattr(doctor, "stats_kernel_build", lambda arch: compiled.append(arch) or ("ok", "", ""))
    lines = doctor.header_lines()
    assert not compiled   # pytest's start-up compiles no kernel: the doctor command does
    assert 1 <= len(lines) <= 4
    assert "rocm build" in lines[0] and "8 x AMD Instinct MI300X [gfx942, warp 64]" in lines[0]
    assert "visible-devices" in lines[1] and "rocm-parity doctor" in lines[1]
    # no external tool runs at pytest start-up, and the line says its counts leave them out
    assert "without running rocminfo/rocm-smi or compiling kernels" in lines[1]


def test_skipped_checks_neither_fail_strict_nor_reach_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = [Check("a", "ok", ""), *doctor._skipped(["b", "c"], "no GPU")]
    assert doctor.exit_code(checks) == 0 and doctor.exit_code(checks, strict=True) == 0
    monkeypatch.setattr(doctor, "run_checks", lambda _f: [Check("backend", "warn", "x", "y"),
                                                          *doctor._skipped(["devices"], "no GPU")])
    lines = doctor.header_lines()
    assert "(backend)" in lines[1] and "devices" not in lines[1], lines


def test_no_tools_is_a_skip_row_saying_so() -> None:
    row = by_name(doctor.run_checks(facts()), "tools")
    assert row.status == "skip" and "--no-tools" in row.detail, row


@pytest.mark.parametrize("value, arch", [("11.0.0", "gfx1100"), ("9.0.10", "gfx90a"), ("9.4.2", "gfx942")])
def test_the_override_names_its_isa_with_a_hex_stepping(value: str, arch: str) -> None:
    assert doctor._override_arch(value) == arch


def test_header_lines_never_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "gather_facts", lambda **kw: 1 / 0)
    assert doctor.header_lines()[0].startswith("rocm-parity: environment check failed")


@pytest.mark.skipif(not (shutil.which("rocminfo") and shutil.which("rocm-smi")),
                    reason="rocminfo/rocm-smi not installed (CI: apt-get install -y rocminfo rocm-smi)")
@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="an AMD GPU driver is present: this test covers the GPU-less path")
def test_doctor_with_real_binaries_on_gpu_less_machine(capsys: pytest.CaptureFixture[str]) -> None:
    """The real Debian tools fail without the amdgpu driver; the doctor reports it and does not crash."""
    code = doctor.run_doctor(_args("--json", "--timeout", "20"))
    data = json.loads(capsys.readouterr().out)
    runs = {r["argv"][0]: r for r in data["tools"]["runs"]}
    assert runs["rocminfo"]["found"] and runs["rocminfo"]["error"]
    tool_checks = [c for c in data["checks"] if c["name"].startswith("tool:")]
    assert tool_checks and all(c["status"] == "warn" for c in tool_checks)
    assert code in (0, 1)


def test_cli_dispatch(capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_rocm_parity import cli

    code = cli.main(["doctor", "--no-tools", "--json"])
    assert code in (0, 1)
    assert json.loads(capsys.readouterr().out)["checks"]
