"""Backend detection with torch patched to look like ROCm (MI300X, MI250X) and CUDA builds."""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from fake_torch import patch_torch  # noqa: E402

from pytest_rocm_parity.migration import backend

torch = pytest.importorskip("torch")

MI300X = dict(name="AMD Instinct MI300X", major=9, minor=4, gcnArchName="gfx942:sramecc+:xnack-",
              total_memory=192 * 1024**3, multi_processor_count=304, warp_size=64)
MI250X = dict(name="AMD Instinct MI250X/MI250", major=9, minor=0, gcnArchName="gfx90a:sramecc+:xnack-",
              total_memory=64 * 1024**3, multi_processor_count=110)  # torch < 2.5: no warp_size
H100 = dict(name="NVIDIA H100 80GB HBM3", major=9, minor=0, gcnArchName="NVIDIA H100 80GB HBM3",
            total_memory=80 * 1024**3, multi_processor_count=132, warp_size=32)


def fake_gpus(mp: pytest.MonkeyPatch, props: dict[str, Any], *, hip: str | None = None,
              archs: list[str] | None = None, **kw: Any) -> None:
    patch_torch(mp, props, hip=hip, archs=archs or [], **kw)


def test_rocm_detected_from_version_hip_and_arch_stripped(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, MI300X, n=8, hip="6.2.41133-dd7f95766", archs=["gfx90a", "gfx942"])
    info = backend.backend_info()
    assert info.backend == "rocm"
    assert info.hip_short == "6.2"
    assert len(info.devices) == 8
    dev = info.devices[0]
    assert (dev.arch, dev.arch_full, dev.warp_size, dev.warp_size_source) == ("gfx942", "gfx942:sramecc+:xnack-", 64, "props")


def test_fp8_dtypes_are_the_ones_this_torch_defines(monkeypatch: pytest.MonkeyPatch) -> None:
    assert backend.backend_info().fp8_dtypes == ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    monkeypatch.delattr(torch, "float8_e5m2fnuz")
    assert backend.backend_info().fp8_dtypes == ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz")


def test_cuda_build_with_gcnarchname_is_not_rocm(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA builds expose gcnArchName (the device name): presence must not mean ROCm."""
    fake_gpus(monkeypatch, H100, hip=None, cuda="12.4", version="2.6.0+cu124")
    info = backend.backend_info()
    assert info.backend == "cuda"
    assert info.devices[0].arch == "sm_90"
    assert info.devices[0].warp_size == 32


def test_warp_size_inferred_when_props_lack_it(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, MI250X, hip="6.1.40091-a8dbc0c19")
    dev = backend.backend_info().devices[0]
    assert (dev.arch, dev.warp_size, dev.warp_size_source) == ("gfx90a", 64, "inferred")
    assert backend.infer_warp_size("rocm", "gfx1100") == 32
    assert backend.infer_warp_size("cuda", "sm_80") == 32


def test_device_query_failure_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, MI300X, hip="6.1.40091")

    def boom() -> int:
        raise NameError("name 'amdsmi' is not defined")

    monkeypatch.setattr(torch.cuda, "device_count", boom)
    info = backend.backend_info()
    assert info.error is not None and "amdsmi" in info.error


@pytest.mark.parametrize(("raw", "want"), [("gfx942:sramecc+:xnack-", "gfx942"), ("gfx1100", "gfx1100"), (" gfx90a:xnack+ ", "gfx90a")])
def test_strip_arch(raw: str, want: str) -> None:
    assert backend.strip_arch(raw) == want


def test_version_helpers() -> None:
    assert backend.parse_hip_version("6.3.42131-fa1d09cbd") == "6.3.42131"
    assert backend.short_version("7.2.26015") == "7.2"
    assert backend.wheel_rocm_tag("2.10.0.dev20250929+rocm7.0") == "7.0"
    assert backend.wheel_rocm_tag("2.6.0+cu124") is None
    assert backend.wheel_rocm_tag("2.7.1+rocm6.3.4") == "6.3.4"
    assert backend.wheel_rocm_tag("not a version") is None
    assert backend.short_version("6.3.42131-fa1d09cbd") == "6.3"
    assert backend.short_version("2.10.0.dev20250929+rocm7.0") == "2.10"
    assert backend.short_version("") is None


def test_collect_env_rocm_device_is_json_able(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, MI300X, n=2, hip="6.3.42131-fa1d09cbd", version="2.7.1+rocm6.3")
    env = backend.collect_env("cuda:1")
    json.dumps(env)
    assert env["backend"] == "rocm" and env["device"] == "cuda:1"
    assert env["device_name"] == "AMD Instinct MI300X" and env["arch"] == "gfx942"
    assert env["hip"] == "6.3.42131-fa1d09cbd" and env["cuda"] is None and env["gpu_count"] == 2
    for key in ("torch", "tf32_matmul", "tf32_cudnn", "float32_matmul_precision", "deterministic", "python", "platform"):
        assert key in env
    assert set(env["sdpa"]) >= {"flash", "mem_efficient", "math", "cudnn"}  # type: ignore[arg-type]


def test_collect_env_cpu_device_on_rocm_build(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, MI300X, hip="6.3.42131")
    env = backend.collect_env("cpu")
    assert env["backend"] == "cpu" and env["hip"] == "6.3.42131"


def test_tf32_setting_is_reported(set_torch_flag: Any) -> None:
    set_torch_flag(torch.backends.cuda.matmul, "allow_tf32", True)
    assert backend.collect_env("cpu")["tf32_matmul"] is True


def test_importing_modules_does_not_import_torch() -> None:
    code = ("import sys; import pytest_rocm_parity.migration.backend, pytest_rocm_parity.migration.doctor, "
            "pytest_rocm_parity.migration.scan, pytest_rocm_parity.migration.compat, pytest_rocm_parity.migration.rocm_tools; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
