"""Parsers on recorded rocminfo / rocm-smi / amd-smi outputs, and the runner on real binaries."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from pytest_rocm_parity.migration import rocm_tools as rt

REC = Path(__file__).resolve().parents[1] / "data" / "recorded"


def read(name: str) -> str:
    return (REC / name).read_text()


def test_rocminfo_mi300x_agents_and_isa() -> None:
    agents = rt.parse_rocminfo(read("rocminfo_mi300x.txt"))
    assert [a["Device Type"] for a in agents] == ["CPU", "GPU", "GPU"]
    gpus = rt.rocminfo_gpus(read("rocminfo_mi300x.txt"))
    assert len(gpus) == 2
    g = gpus[0]
    assert (g.name, g.gfx, g.compute_units, g.wavefront_size) == ("AMD Instinct MI300X", "gfx942", 304, 64)
    assert agents[1]["isa"][1].endswith("gfx9-4-generic:sramecc+:xnack-")
    assert agents[1]["Chip ID"] == "29857(0x74a1)"


def test_rocminfo_mi250x() -> None:
    (g,) = rt.rocminfo_gpus(read("rocminfo_mi250x.txt"))
    assert (g.name, g.gfx, g.compute_units) == ("AMD Instinct MI250X/MI250", "gfx90a", 110)


def test_rocminfo_no_driver_output_has_no_gpus() -> None:
    text = read("rocminfo_no_driver.txt")
    assert rt.rocminfo_gpus(text) == []
    assert rt._complaint(text, "") == "ROCk module is NOT loaded, possibly no GPU devices"


@pytest.mark.parametrize("name", ["rocm_smi_showproductname_mi300x.txt", "rocm_smi_showproductname_mi300x.json"])
def test_rocm_smi_product_name_text_and_json(name: str) -> None:
    cards = rt.parse_rocm_smi(read(name))
    assert sorted(cards) == [0, 1]
    assert cards[0]["card series"] == "AMD Instinct MI300X"
    assert cards[1]["gfx version"] == "gfx942"
    assert cards[0]["card vendor"] == "Advanced Micro Devices, Inc. [AMD/ATI]"


def test_rocm_smi_csv_key_case_differs() -> None:
    cards = rt.parse_rocm_smi(read("rocm_smi_showproductname_mi100.csv"))
    assert cards[0]["card series"] == "Arcturus GL-XL [AMD Instinct MI100]"


@pytest.mark.parametrize("suffix", ["txt", "json"])
def test_rocm_smi_merges_product_and_memory(suffix: str) -> None:
    gpus = rt.rocm_smi_gpus(read(f"rocm_smi_showproductname_mi300x.{suffix}"), read(f"rocm_smi_showmeminfo_vram_mi300x.{suffix}"))
    assert [g.gfx for g in gpus] == ["gfx942", "gfx942"]
    assert gpus[1].vram_total == 206141652992 and gpus[1].vram_used == 165356601344


@pytest.mark.parametrize("name", ["amd_smi_static_asic_mi350x.json", "amd_smi_static_asic_wrapped.json", "amd_smi_static_asic_mi350x.txt"])
def test_amd_smi_static_asic_forms(name: str) -> None:
    gpus = rt.amd_smi_gpus(read(name))
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].name == "AMD Instinct MI350X" and gpus[0].gfx == "gfx950" and gpus[0].compute_units == 256


def test_amd_smi_version() -> None:
    v = rt.parse_amd_smi_version(read("amd_smi_version.txt"))
    assert v["ROCm version"] == "6.4.0" and v["AMDSMI Tool"] == "25.3.0+ede62f2"


@pytest.mark.parametrize("garbage", ["", "not json {", "[1, 2]", "{\"system\": {}}", "\x00\x01binary"])
def test_parsers_are_total(garbage: str) -> None:
    assert rt.parse_rocm_smi(garbage) == {}
    assert rt.rocminfo_gpus(garbage) == []
    assert rt.amd_smi_gpus(garbage) == []


def _fake_tool(tmp: Path, name: str, body: str) -> None:
    path = tmp / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_probe_tools_with_fake_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tool(tmp_path, "rocminfo", f"cat '{REC / 'rocminfo_mi300x.txt'}'")
    _fake_tool(tmp_path, "rocm-smi", f"""case "$*" in *showmeminfo*) cat '{REC / "rocm_smi_showmeminfo_vram_mi300x.json"}';;
  *) cat '{REC / "rocm_smi_showproductname_mi300x.json"}';; esac""")
    _fake_tool(tmp_path, "amd-smi", f"""case "$1" in version) cat '{REC / "amd_smi_version.txt"}';;
  *) cat '{REC / "amd_smi_static_asic_mi350x.json"}';; esac""")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    report = rt.probe_tools(timeout=5)
    assert all(r.ok for r in report.runs), [r.error for r in report.runs]
    assert [g.gfx for g in report.gpus_from("rocminfo")] == ["gfx942", "gfx942"]
    assert report.gpus_from("rocm-smi")[0].vram_total == 206141652992
    assert report.rocm_version == "6.4.0"


def test_run_tool_missing_timeout_and_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tool(tmp_path, "slow-tool", "sleep 5")
    _fake_tool(tmp_path, "bad-tool", "echo 'hsa api call failure at: rocminfo.cc' >&2; exit 1")
    _fake_tool(tmp_path, "silent-tool", "echo 'ERROR:root:Driver not initialized (amdgpu not found in modules)' >&2")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert rt.run_tool(["nope"]).error == "not found on PATH"
    assert rt.run_tool(["slow-tool"], timeout=0.3).error == "timed out after 0.3s"
    assert "hsa api call failure" in (rt.run_tool(["bad-tool"]).error or "")
    silent = rt.run_tool(["silent-tool"])
    assert silent.returncode == 0 and silent.error is not None and "Driver not initialized" in silent.error


REAL = shutil.which("rocminfo") and shutil.which("rocm-smi")


@pytest.mark.skipif(not REAL, reason="rocminfo/rocm-smi not installed (CI: apt-get install -y rocminfo rocm-smi)")
@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="an AMD GPU driver is present: this test covers the GPU-less path")
def test_real_binaries_without_gpu_are_handled() -> None:
    """Debian's rocminfo/rocm-smi on a machine with no amdgpu driver: a clear error, no GPUs, no crash."""
    report = rt.probe_tools(timeout=20)
    rocminfo = report.runs[0]
    assert rocminfo.found and rocminfo.error is not None
    assert "ROCk module is NOT loaded" in rocminfo.error or "exit" in rocminfo.error
    smi = [r for r in report.runs if r.argv[0] == "rocm-smi"]
    assert smi and all(r.error for r in smi)
    assert report.gpus == []
