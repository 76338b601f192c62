"""The command line's surface: --version, colour on a terminal only, scan's rule list, suppressions,
--ignore, the ROUTE column, long lines in linear time, and only the plugin's own errors from ops."""
from __future__ import annotations

import json
import os
import pty
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_rocm_parity import __version__, cli, colour

from pytest_rocm_parity.migration import scan
from pytest_rocm_parity.cli import main

ANSI = re.compile(r"\x1b\[[0-9;]*m")
KERNEL = textwrap.dedent("""\
    #define WARP_SIZE 32
    __device__ float warp_sum(float v) {
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
      return v;
    }
    """)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"rocm-parity {__version__} ")


def test_list_rules_needs_no_path(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "scan", "--list-rules")
    assert code == 0 and len(out.splitlines()) == len(scan.RULES_BY_ID) and "RP104" in out
    code, out, err = _cli(capsys, "scan")
    assert code == 2 and "PATH is missing" in err and "--list-rules" in err


def test_table_names_the_route_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "k.cu").write_text(KERNEL)
    code, out, _ = _cli(capsys, "scan", str(tmp_path), "--no-hipify")
    assert code == 1
    assert out.splitlines()[0].split() == ["SEVERITY", "RULE", "LOCATION", "CONSTRUCT", "ROUTE"]
    assert "suggested route: manual port" in out and "PATH" not in out.splitlines()[0]


def test_inline_suppressions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = KERNEL.replace("#define WARP_SIZE 32", "#define WARP_SIZE 32  // rocm-parity: ignore[RP104]")
    src = src.replace("  for (int o = 16", "  // rocm-parity: ignore[warp-reduce-from-16, RP101]\n  for (int o = 16")
    (tmp_path / "k.cu").write_text(src)
    (tmp_path / "m.py").write_text("import pycuda  # rocm-parity: ignore[RP204]\nimport flash_attn\n"
                                   "WARP_SIZE = 32  # rocm-parity: ignore[RP999]\n")
    result = scan.scan_path(tmp_path)
    rules = {(f.path, f.rule) for f in result.findings}
    assert ("k.cu", "RP104") not in rules and ("k.cu", "RP106") not in rules and ("k.cu", "RP101") not in rules
    assert ("m.py", "RP204") not in rules
    assert ("m.py", "RP210") in rules          # another line: not suppressed
    assert ("m.py", "RP208") in rules          # another rule named: not suppressed
    assert dict(result.suppressed) == {"RP104": 1, "RP106": 1, "RP101": 1, "RP204": 1}
    code, out, _ = _cli(capsys, "scan", str(tmp_path), "--no-hipify", "--format", "json")
    assert json.loads(out)["suppressed"] == {"RP101": 1, "RP104": 1, "RP106": 1, "RP204": 1}
    code, out, _ = _cli(capsys, "scan", str(tmp_path), "--no-hipify")
    assert "4 suppressed inline" in out
    # a suppression only counts on the finding's line or a comment-only line right above it
    assert scan.scan_text("x = 1  # rocm-parity: ignore[RP204]\nimport pycuda\n", "a.py", scan.P)[0].rule == "RP204"


def test_ignore_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "k.cu").write_text(KERNEL)
    code, out, _ = _cli(capsys, "scan", str(tmp_path), "--no-hipify", "--format", "json",
                        "--ignore", "RP104", "--ignore", "warp-mask-32bit,rp106")
    doc = json.loads(out)
    assert {f["rule"] for f in doc["findings"]}.isdisjoint({"RP104", "RP101", "RP106"})
    assert doc["ignored"] == ["RP101", "RP104", "RP106"]
    assert code == 0   # the errors were ignored: --fail-on error passes
    code, _, err = _cli(capsys, "scan", str(tmp_path), "--ignore", "RP000")
    assert code == 2 and "RP000: no such rule" in err and "--list-rules" in err


def _run_tty(args: list[str], env: dict[str, str]) -> str:
    """Run ``rocm-parity ARGS`` with its stdout on a pseudo-terminal; returns what it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pytest_rocm_parity.cli", *args], stdout=slave,
                            stderr=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:   # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    return b"".join(chunks).decode()


def test_colour_on_a_terminal_only_and_never_with_no_color(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text(KERNEL)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["TERM"] = "xterm"
    args = ["scan", str(tmp_path), "--no-hipify"]
    tty = _run_tty(args, env)
    assert "\x1b[31m" in tty and "ERROR" in ANSI.sub("", tty)   # errors in red on a terminal
    assert not ANSI.search(_run_tty(args, {**env, "NO_COLOR": "1"}))
    piped = subprocess.run([sys.executable, "-m", "pytest_rocm_parity.cli", *args], capture_output=True,
                           text=True, env=env, timeout=60)
    assert piped.stdout and not ANSI.search(piped.stdout)
    assert colour.paint("x", "red", False) == "x" and colour.paint("x", "red", True) == "\x1b[31mx\x1b[0m"


# ---------------------------------------------------------------------------------------------
# long lines: every rule linear in the line length (the time is measured by bench/bench_scan.py)

FUZZ = r'''
import random, re, sys
from pytest_rocm_parity.migration import scan

def fragments(rule):
    words = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]{2,}", rule.pattern.replace("(?i:", "(")))
    return sorted(set(rule.keywords) | words | {"const", "static", "#define", "warp_size"})

SEPS = ["", " ", "(", ",", " (", "(a", "a, ", '"', "{", "_", "32 ", "= 32", ")"]
rnd = random.Random(int(sys.argv[1]))
length = int(sys.argv[2])
checked = 0
for rule in scan.RULES:
    kinds = rule.kinds if "device" not in rule.kinds else scan.D
    frs = fragments(rule)
    units = [f + s for f in frs for s in (" ", " (")]          # repeated starts of the rule's anchors
    units += [rnd.choice(frs) + rnd.choice(SEPS) for _ in range(3)]
    units.append("".join(rnd.choice(frs) + rnd.choice(SEPS) for _ in range(8)))
    for unit in units:
        line = (unit * (length // len(unit) + 1))[:length]
        found = scan.scan_text("// " + rule.id + "\n" + line + "\n", "long", kinds, (rule,))
        for f in found:   # a finding on a long line points into it, at a real match of its rule
            assert f.line == 2 and f.rule == rule.id and 1 <= f.column <= length, f
        checked += 1
print("ok", checked)
'''

# the shapes that made a rule backtrack over the whole line (RP104: 36 s for a 100 KiB line)
PATHOLOGICAL = r'''
import sys
from pytest_rocm_parity.migration import scan
L = 512 * 1024
for rid, unit in [("RP104", "const ("), ("RP104", "const "), ("RP104", "#define warp_size"),
                  ("RP108", "static_assert(a"), ("RP108", "constexpr "), ("RP115", "cudaFuncSetAttribute("),
                  ("RP221", "get_device_name("), ("RP112", "wgmma "), ("RP124", "__ldg ("), ("RP123", "texture< ")]:
    rules = tuple(r for r in scan.RULES if r.id == rid)
    text = "MaxDynamicSharedMemorySize warpSize\n" + (unit * (L // len(unit) + 1))[:L] + "\n"
    scan.scan_text(text, "x", scan.P if rid == "RP221" else scan.D, rules)
print("ok")
'''


@pytest.mark.parametrize("seed", [0, 1])
def test_every_rule_on_long_fuzzed_lines(seed: int) -> None:
    """32 KiB lines repeating each rule's own anchors and tokens: findings stay on the line and in range."""
    proc = subprocess.run([sys.executable, "-c", FUZZ, str(seed), str(32 * 1024)], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok ")


def test_pathological_long_lines_finish() -> None:
    """Half-megabyte lines of the shapes that used to backtrack quadratically (minutes each before; about a
    second now, measured by bench/bench_scan.py --long-lines). The timeout only guards against a hang."""
    proc = subprocess.run([sys.executable, "-c", PATHOLOGICAL], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.parametrize("rule_id, snippet", [
    ("RP104", "static constexpr int kWarpSize = 32;"),
    ("RP104", "#define THREADS_PER_WARP 32"),
    ("RP108", "static_assert(warpSize == 32, \"x\");"),
    ("RP115", "cudaFuncSetAttribute(k,\n    cudaFuncAttributeMaxDynamicSharedMemorySize, smem);"),
    ("RP221", "if torch.cuda.get_device_name(0).startswith('NVIDIA'):"),
])
def test_bounded_rules_still_find_their_construct_far_into_a_long_line(rule_id: str, snippet: str) -> None:
    kinds = scan.P if rule_id == "RP221" else scan.D
    filler = "x" * 200_000 + "; "
    text = filler + snippet + "\n"
    found = [f for f in scan.scan_text(text, "f", kinds) if f.rule == rule_id]
    assert found and len(filler) < found[0].column <= len(filler) + 16


# ---------------------------------------------------------------------------------------------
# ops --replay: a FIFO or a malformed golden is a clean error, never a hang or a raw exception

@pytest.mark.parametrize("kind", ["fifo", "deep", "keys"])
def test_ops_replay_refuses_special_and_malformed_goldens(kind: str, tmp_path: Path) -> None:
    d = tmp_path / "ops"
    d.mkdir()
    manifest = d / "softmax-float32.json"
    if kind == "fifo":
        os.mkfifo(manifest)
    else:
        body = "[" * 100_000 + "]" * 100_000 if kind == "deep" else json.dumps({"kind": "rocm-parity-op-golden"})
        manifest.write_text(body)
    (d / "softmax-float32.safetensors").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "pytest_rocm_parity.cli", "ops", "--device", "cpu", "--ops",
                           "softmax", "--dtypes", "float32", "--max-examples", "1", "--replay", str(d)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and str(manifest) in proc.stderr


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_command_in_the_table_parses_its_own_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([name, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rocm-parity {name}") and cli.COMMANDS[name].help in out
    assert callable(cli.resolve(cli.COMMANDS[name].run))


def test_top_level_help_lists_the_table() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest_rocm_parity.cli", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for name, cmd in cli.COMMANDS.items():
        assert name in out and cmd.help.split(":")[0] in " ".join(out.split())


def test_output_cut_short_by_its_reader_is_not_a_traceback(tmp_path: Path) -> None:
    """``rocm-parity show GOLDEN --json | head -1``: the reader closes the pipe early; the command stops
    quietly."""
    from parity_models import llama, tokens
    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec

    store = GoldenStore(tmp_path)
    capture(llama(), tokens(), CheckSpec(name="m", dtypes=["float32"]), store, "cpu")
    cmd = [sys.executable, "-m", "pytest_rocm_parity.cli", "show", str(store.dir_for("m")), "--json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    p.stdout.close()   # gone before the command writes: its first write meets a closed pipe
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()[-2000:]


def test_ops_on_a_missing_gpu_names_the_flag_that_picks_the_cpu(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pytest_rocm_parity import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["ops", "--device", "cuda", "--ops", "silu"]) == 2
    err = capsys.readouterr().err
    assert "sees no CUDA/ROCm device" in err and "--device cpu" in err and "device='cpu'" not in err


@pytest.mark.parametrize(("device", "phrase"), [
    ("mps", "has no usable mps device"), ("xpu", "has no usable xpu device"), ("xpu:1", "has no usable xpu device"),
    ("meta", "holds shapes, not values"),
])
def test_ops_on_a_device_this_torch_lacks_is_a_usage_error(device: str, phrase: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before any operator runs: no 'every operator failed' table, no failing examples stored."""
    import torch

    from pytest_rocm_parity import cli

    for name in ("mps", "xpu"):
        monkeypatch.setattr(getattr(torch, name), "is_available", lambda: False)
    database = tmp_path / "db"
    assert cli.main(["ops", "--device", device, "--ops", "silu", "--max-examples", "2",
                     "--database", str(database)]) == 2
    out, err = capsys.readouterr()
    assert phrase in err and f"device={device!r}" in err and "cpu" in err, err
    assert "failed" not in out and not database.exists()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_doctor_refuses_a_timeout_that_is_no_positive_number_of_seconds(value: str,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_rocm_parity import cli

    assert cli.main(["doctor", "--timeout", value, "--no-tools"]) == 2
    assert "--timeout must be a positive number of seconds" in capsys.readouterr().err
