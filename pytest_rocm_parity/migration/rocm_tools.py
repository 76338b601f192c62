"""Parsers for rocminfo, rocm-smi and amd-smi output, and a runner with a timeout.

The doctor cross-checks torch's view of the GPUs against the system tools; these
parsers follow the formats documented in the tools' sources (see docs/doctor.md) and
are tested on recorded outputs, since no AMD GPU exists where the tests run.
Every parser is total: malformed input gives fewer facts, never an exception.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEC_HEX = re.compile(r"^\s*(\d+)\s*\(0x[0-9a-fA-F]+\)")


@dataclass(frozen=True)
class ToolGPU:
    """One GPU as a system tool reports it (fields the tool lacks are None)."""

    index: int
    source: str  # "rocminfo" | "rocm-smi" | "amd-smi"
    name: str | None = None
    gfx: str | None = None
    compute_units: int | None = None
    wavefront_size: int | None = None
    vram_total: int | None = None
    vram_used: int | None = None


@dataclass(frozen=True)
class ToolRun:
    """The outcome of running one tool: found on PATH, exit code, output, failure reason."""

    argv: tuple[str, ...]
    found: bool
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # "not found", "timed out after 10s", or the tool's own complaint

    @property
    def ok(self) -> bool:
        return self.found and self.error is None


@dataclass
class ToolsReport:
    """What the system tools said: runs, parsed GPUs, ROCm version when amd-smi gives it."""

    runs: list[ToolRun] = field(default_factory=list)
    gpus: list[ToolGPU] = field(default_factory=list)
    rocm_version: str | None = None

    def gpus_from(self, source: str) -> list[ToolGPU]:
        return [g for g in self.gpus if g.source == source]


# --------------------------------------------------------------------------- parsing


def _int(value: str | None) -> int | None:
    """``'304'``, ``'64(0x40)'``, ``'0x74a1'`` -> int; anything else -> None."""
    if value is None:
        return None
    v = value.strip()
    m = _DEC_HEX.match(v)
    if m:
        return int(m.group(1))
    try:
        return int(v, 0)
    except ValueError:
        return None


def parse_rocminfo(text: str) -> list[dict[str, Any]]:
    """All HSA agents (CPU and GPU) from ``rocminfo`` output.

    Each agent is framed by ``*******`` / ``Agent N`` / ``*******``; keys are the
    fixed-width ``Label:  value`` lines.  ISA names under ``ISA Info:`` go to ``isa``.
    """
    agents: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    in_isa = False
    for raw in _ANSI.sub("", text).splitlines():
        line = raw.strip()
        m = re.fullmatch(r"Agent\s+(\d+)", line)
        if m:
            current = {"agent": int(m.group(1)), "isa": []}
            agents.append(current)
            in_isa = False
            continue
        if current is None or ":" not in line:
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "ISA Info":
            in_isa = True
            continue
        if in_isa and key == "Name":
            current["isa"].append(value)
            continue
        if re.fullmatch(r"ISA \d+", key) or not key:
            continue
        # Only the first occurrence counts: pool sections repeat keys like "Size".
        current.setdefault(key, value)
    return agents


def rocminfo_gpus(text: str) -> list[ToolGPU]:
    """GPU agents of ``rocminfo``, numbered in order (0 = first GPU, as HIP counts)."""
    gpus: list[ToolGPU] = []
    for agent in parse_rocminfo(text):
        if agent.get("Device Type", "").upper() != "GPU":
            continue
        gfx = agent.get("Name")
        for isa in agent["isa"]:  # prefer the precise ISA over a generic one
            if "generic" not in isa:
                gfx = isa.rsplit("--", 1)[-1].split(":")[0]
                break
        gpus.append(
            ToolGPU(
                index=len(gpus),
                source="rocminfo",
                name=agent.get("Marketing Name") or None,
                gfx=gfx,
                compute_units=_int(agent.get("Compute Unit")),
                wavefront_size=_int(agent.get("Wavefront Size")),
            )
        )
    return gpus


def parse_rocm_smi_text(text: str) -> dict[int, dict[str, str]]:
    """``GPU[0]\\t\\t: Card Series: \\t\\tname`` lines -> ``{0: {'card series': 'name'}}``.

    Keys are lower-cased: their case differs across rocm-smi versions.
    """
    out: dict[int, dict[str, str]] = {}
    for line in _ANSI.sub("", text).splitlines():
        m = re.match(r"\s*GPU\[(\d+)\]\s*:\s*(.*)$", line)
        if not m:
            continue
        key, sep, value = m.group(2).partition(": ")
        if not sep:
            continue
        out.setdefault(int(m.group(1)), {})[key.strip().lower()] = value.strip()
    return out


def parse_rocm_smi_json(text: str) -> dict[int, dict[str, str]]:
    """``rocm-smi ... --json``: ``{"card0": {...}, "system": {...}}`` -> ``{0: {...}}``."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    out: dict[int, dict[str, str]] = {}
    if not isinstance(data, dict):
        return out
    for card, values in data.items():
        m = re.fullmatch(r"card(\d+)", str(card))
        if m and isinstance(values, dict):
            out[int(m.group(1))] = {str(k).strip().lower(): str(v).strip() for k, v in values.items()}
    return out


def parse_rocm_smi_csv(text: str) -> dict[int, dict[str, str]]:
    """``rocm-smi --csv``: header ``device,Card series,...`` then ``card0,...`` rows."""
    import csv  # noqa: PLC0415 - rarely needed

    rows = list(csv.reader(line for line in text.splitlines() if line.strip()))
    if not rows or rows[0][0].strip().lower() != "device":
        return {}
    header = [h.strip().lower() for h in rows[0]]
    out: dict[int, dict[str, str]] = {}
    for row in rows[1:]:
        m = re.fullmatch(r"card(\d+)", row[0].strip())
        if m:
            out[int(m.group(1))] = {h: v.strip() for h, v in zip(header[1:], row[1:])}
    return out


def parse_rocm_smi(text: str) -> dict[int, dict[str, str]]:
    """Any of the three rocm-smi output forms."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return parse_rocm_smi_json(stripped)
    if stripped.lower().startswith("device,"):
        return parse_rocm_smi_csv(stripped)
    return parse_rocm_smi_text(text)


def rocm_smi_gpus(*outputs: str) -> list[ToolGPU]:
    """Merge product-name and memory outputs of rocm-smi into one ToolGPU per card."""
    merged: dict[int, dict[str, str]] = {}
    for text in outputs:
        for idx, values in parse_rocm_smi(text).items():
            merged.setdefault(idx, {}).update(values)
    gpus = []
    for idx in sorted(merged):
        v = merged[idx]
        name = v.get("card series") or v.get("device name") or v.get("card model")
        gpus.append(
            ToolGPU(
                index=idx,
                source="rocm-smi",
                name=name or None,
                gfx=v.get("gfx version") or None,
                vram_total=_int(v.get("vram total memory (b)")),
                vram_used=_int(v.get("vram total used memory (b)")),
            )
        )
    return gpus


def parse_amd_smi_static(text: str) -> list[dict[str, Any]]:
    """``amd-smi static --asic`` in JSON (a list, or a dict wrapping one) or human form.

    Returns ``[{"gpu": 0, "asic": {"market_name": ..., ...}}, ...]`` with lower-case keys.
    """
    stripped = text.strip()
    if stripped[:1] in "[{":
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict):  # newer releases may wrap the list [unverified]
            data = next((v for v in data.values() if isinstance(v, list)), [data])
        if isinstance(data, list):
            return [d for d in data if isinstance(d, dict)]
    out: list[dict[str, Any]] = []
    section: dict[str, Any] | None = None
    for line in text.splitlines():
        m = re.match(r"\s*GPU:\s*(\d+)\s*$", line)
        if m:
            out.append({"gpu": int(m.group(1))})
            section = None
            continue
        if not out or ":" not in line:
            continue
        key, _, value = line.strip().partition(":")
        key, value = key.strip().lower(), value.strip()
        if not value:
            section = out[-1].setdefault(key, {})
        elif section is not None:
            section[key] = value
    return out


def amd_smi_gpus(text: str) -> list[ToolGPU]:
    gpus = []
    for pos, entry in enumerate(parse_amd_smi_static(text)):
        asic = entry.get("asic")
        if not isinstance(asic, dict):
            continue
        idx = entry.get("gpu", pos)
        gpus.append(
            ToolGPU(
                index=int(idx) if str(idx).isdigit() else pos,
                source="amd-smi",
                name=str(asic.get("market_name") or "") or None,
                gfx=str(asic.get("target_graphics_version") or "") or None,
                compute_units=_int(str(asic["num_compute_units"])) if "num_compute_units" in asic else None,
            )
        )
    return gpus


def parse_amd_smi_version(text: str) -> dict[str, str]:
    """``AMDSMI Tool: 25.3.0+ede62f2 | AMDSMI Library version: 25.3.0 | ROCm version: 6.4.0``."""
    out = {}
    for part in text.replace("\n", "|").split("|"):
        key, sep, value = part.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


# --------------------------------------------------------------------------- running


def _complaint(stdout: str, stderr: str) -> str | None:
    """The tool's own one-line reason for failing, if its output says it failed."""
    text = _ANSI.sub("", stdout + "\n" + stderr)
    for pattern in (
        r"ROCk module is NOT loaded[^\n]*",
        r"Driver not initialized[^\n]*",
        r"[^\n]*hsa api call failure[^\n]*",
        r"[^\n]*Unable to open /dev/kfd[^\n]*",
    ):
        m = re.search(pattern, text, re.IGNORECASE)
        if m:
            return m.group(0).strip()
    return None


def run_tool(argv: list[str], timeout: float = 10.0) -> ToolRun:
    """Run a tool if it is on PATH; a missing tool, a timeout or a failure is data, not an error."""
    exe = shutil.which(argv[0])
    if exe is None:
        return ToolRun(tuple(argv), found=False, error="not found on PATH")
    try:
        proc = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, errors="replace"
        )
    except subprocess.TimeoutExpired:
        return ToolRun(tuple(argv), found=True, error=f"timed out after {timeout:g}s")
    except OSError as exc:
        return ToolRun(tuple(argv), found=True, error=f"could not run: {exc}")
    error = _complaint(proc.stdout, proc.stderr)
    if error is None and proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        error = f"exit {proc.returncode}: {_ANSI.sub('', last)[:200]}"
    if error is None and not proc.stdout.strip():
        error = "no output"  # rocm-smi exits 0 with empty stdout when the driver is missing
    return ToolRun(tuple(argv), True, proc.returncode, proc.stdout, proc.stderr, error)


def probe_tools(timeout: float = 10.0) -> ToolsReport:
    """Run rocminfo, rocm-smi and amd-smi (those present) and parse what they print."""
    report = ToolsReport()
    r = run_tool(["rocminfo"], timeout)
    report.runs.append(r)
    if r.ok:
        report.gpus += rocminfo_gpus(r.stdout)
    smi_outputs = []
    for argv in (["rocm-smi", "--showproductname", "--json"], ["rocm-smi", "--showmeminfo", "vram", "--json"]):
        r = run_tool(argv, timeout)
        report.runs.append(r)
        if not r.found:
            break
        if r.ok:
            smi_outputs.append(r.stdout)
    if smi_outputs:
        report.gpus += rocm_smi_gpus(*smi_outputs)
    r = run_tool(["amd-smi", "static", "--asic", "--json"], timeout)
    report.runs.append(r)
    if r.found:
        if r.ok:
            report.gpus += amd_smi_gpus(r.stdout)
        v = run_tool(["amd-smi", "version"], timeout)
        report.runs.append(v)
        if v.ok:
            report.rocm_version = parse_amd_smi_version(v.stdout).get("ROCm version")
    return report
