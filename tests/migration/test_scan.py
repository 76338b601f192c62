"""The custom-kernel scanner: precision/recall on a hand-labelled corpus, walking rules, output formats."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from pytest_rocm_parity.migration import scan
from pytest_rocm_parity.errors import InvalidArgument

CORPUS = Path(__file__).resolve().parents[1] / "data" / "scan_corpus"


def expected() -> set[tuple[str, int, str]]:
    out: set[tuple[str, int, str]] = set()
    for line in (CORPUS / "EXPECTED").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            loc, rule = line.split()
            path, lineno = loc.rsplit(":", 1)
            out.add((path, int(lineno), rule))
    return out


def found(result: scan.ScanResult) -> set[tuple[str, int, str]]:
    return {(f.path, f.line, f.rule) for f in result.findings}


def test_precision_and_recall_on_corpus() -> None:
    want, got = expected(), found(scan.scan_path(CORPUS))
    tp = len(want & got)
    precision, recall = tp / len(got), tp / len(want)
    print(f"precision {precision:.3f} recall {recall:.3f} (tp {tp}, fp {len(got - want)}, fn {len(want - got)})")
    assert precision >= 0.95, sorted(got - want)
    assert recall >= 0.95, sorted(want - got)
    # The labelled misses are the documented limits, nothing else.
    assert want - got == {("csrc/reduce_kernels.cu", 29, "RP105"), ("csrc/utils.h", 7, "RP104")}
    assert got - want == set()


@pytest.mark.parametrize("fmt", ["text", "json", "sarif"])
def test_custom_kernel_definitions_are_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    """A plain __global__ kernel launched with <<<>>> is listed in every format, once per definition:
    a declaration, a launch and a __device__ helper are not definitions of a kernel."""
    (tmp_path / "add.cu").write_text(
        "#include <torch/extension.h>\n"
        "__global__ void add_kernel(const float* a, float* c, int n) {\n"
        "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) c[i] = a[i];\n}\n"
        "template <int B> __global__ __launch_bounds__(256) void scale_kernel(\n    float* x,\n    int n)\n{\n  x[0] = B;\n}\n"
        "__global__ void declared_only(float* x);\n"
        "__device__ float helper(float v) { return v; }\n"
        "void run(float* a, float* c, int n) { add_kernel<<<(n + 255) / 256, 256>>>(a, c, n); }\n")
    code, out = _run(capsys, str(tmp_path), "--format", fmt, "--no-hipify", "--fail-on", "never")
    assert code == 0
    if fmt == "text":
        assert "RP125  add.cu:2" in out and "RP125  add.cu:5" in out and out.count("custom-kernel  hipify") == 2, out
    elif fmt == "json":
        assert [(f["rule"], f["line"]) for f in json.loads(out)["findings"]] == [("RP125", 2), ("RP125", 5)]
    else:
        results = json.loads(out)["runs"][0]["results"]
        assert [(r["ruleId"], r["level"], r["locations"][0]["physicalLocation"]["region"]["startLine"])
                for r in results] == [("RP125", "note", 2), ("RP125", "note", 5)]


def test_sarif_short_descriptions_name_each_rule(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Each SARIF rule has a short description of its own, not its message cut at the first ':'
    (RP001's message starts with 'rocm-parity: ignore[...]')."""
    code, out = _run(capsys, str(tmp_path), "--format", "sarif", "--no-hipify")
    rules = json.loads(out)["runs"][0]["tool"]["driver"]["rules"]
    assert code == 0 and {r["id"] for r in rules} == set(scan.RULES_BY_ID)
    shorts = {r["id"]: r["shortDescription"]["text"] for r in rules}
    assert shorts["RP001"] == "Suppression comment names no rule"
    assert len(set(shorts.values())) == len(shorts), shorts
    for r in rules:
        assert 3 < len(r["shortDescription"]["text"]) <= 80 and r["shortDescription"]["text"] != "rocm-parity", r


@pytest.mark.parametrize(("line", "rules"), [
    ('subprocess.run(["/usr/bin/nvidia-smi", "-L"])', ["RP215"]),
    ("out = subprocess.check_output(['./bin/nvidia-smi'])", ["RP215"]),
    ('os.system("/usr/bin/nvidia-smi -q")', ["RP215"]),
    ('print("hint: run nvidia-smi to see your GPUs")', []),
    ('path = "/usr/bin/nvidia-smi-helper.sh"', []),
    ("import cupy", ["RP217"]),
    ("import cupy as cp", ["RP217"]),
    ("from cupy.cuda import runtime", ["RP217"]),
    ("import cupyx.scipy", ["RP217"]),
    ("import cupy_helpers", []),
    ("kernel = cp.RawKernel(src, 'k')", ["RP202"]),
])
def test_nvidia_smi_by_path_and_cupy_imports(line: str, rules: list[str]) -> None:
    assert [f.rule for f in scan.scan_text(line + "\n", "a.py", scan.P)] == rules


def test_every_rule_has_a_labelled_example() -> None:
    labelled = {rule for _, _, rule in expected()}
    # RP109 is checked below; RP001 (a comment's unknown rule) in test_unknown_rule_in_an_ignore_comment_is_reported;
    # RP218 (transformer_engine) in test_imports_in_list_form_and_after_a_bom; RP102 (the corpus's one named mask is
    # a 32-bit constant of its file, so RP101) in test_a_named_32_bit_mask_in_the_file_is_the_literal_error; the shell
    # rules (RP230-RP233) in test_shell_scripts_and_dockerfiles
    assert set(scan.RULES_BY_ID) - labelled == {"RP102", "RP109", "RP218", "RP230", "RP231", "RP232", "RP233",
                                                scan.UNKNOWN_SUPPRESSION}
    (f,) = scan.scan_text("#if __AMDGCN_WAVEFRONT_SIZE == 64\n#endif\n", "k.cu", scan.D)
    assert f.rule == "RP109"


def test_clean_files_have_no_findings() -> None:
    result = scan.scan_path(CORPUS)
    # lanes_doc.py: a docstring that names a __device__ helper is prose, not embedded device code
    assert not [f for f in result.findings if f.path in ("ops/clean.py", "ops/fp8_portable.py", "ops/lanes_doc.py")]
    # rocm_ready.cu: its only CUDA-isms are in the #else of #ifdef USE_ROCM, comments and 64-bit masks
    assert not [f for f in result.findings if f.path == "csrc/rocm_ready.cu"]


def test_comments_are_ignored() -> None:
    text = ("// __shfl_xor_sync(0xffffffff, v, 1)\n  /* asm volatile(\"mov.u32 %0, %%laneid;\") */\n"
            "/**\n * lane = tid & 31\n */\n")
    assert scan.scan_text(text, "a.cu", scan.D) == []
    assert scan.scan_text("# import pynvml\nx = 1  # torch.version.cuda\n", "a.py", scan.P) == []


@pytest.mark.parametrize("line", [
    'printf("see http://x.y/z"); v += __shfl_xor_sync(0xffffffff, v, 1);',
    'const char* s = "// x"; float v = __shfl_sync(0xffffffff, v, 0);',
    "char c = '\"'; const char* s = \"/*\"; v = __shfl_sync(0xffffffff, v, 0);",
    'auto s = R"x(a "// b)x"; v = __shfl_sync(0xffffffff, v, 0);',
    "int n = 1'000; const char* u = \"a://b\"; v = __shfl_sync(0xffffffff, v, 0);",
    "/* a */ v = __shfl_sync(0xffffffff, v, 0);",
])
def test_comment_markers_inside_literals_do_not_hide_code(line: str) -> None:
    assert [f.rule for f in scan.scan_text(line + "\n", "a.cu", scan.D)] == ["RP101"]


@pytest.mark.parametrize("line", [
    'puts("a // b"); // v = __shfl_sync(0xffffffff, v, 0);',
    "char c = '\\''; /* v = __shfl_sync(0xffffffff, v, 0); */",
    'puts("\\\\"); // v = __shfl_sync(0xffffffff, v, 0);',
])
def test_comments_after_literals_are_still_comments(line: str) -> None:
    assert scan.scan_text(line + "\n", "a.cu", scan.D) == []


def test_hash_in_a_python_string_does_not_hide_the_comment_after_it() -> None:
    assert scan.scan_text('x = "#"  # torch.version.cuda\n', "a.py", scan.P) == []
    assert [f.rule for f in scan.scan_text('x = "#"; v = torch.version.cuda\n', "a.py", scan.P)] == ["RP222"]


def test_vendored_and_build_dirs_are_skipped(tmp_path: Path) -> None:
    shutil.copytree(CORPUS, tmp_path / "c")
    result = scan.scan_path(tmp_path / "c")
    assert not any(f.path.startswith(("third_party/", "build/")) for f in result.findings)
    assert result.skipped["vendored_or_tool_dir"] == 2
    every = scan.scan_path(tmp_path / "c", include_vendored=True)
    assert any(f.path.startswith("third_party/") for f in every.findings)
    assert any(f.path.startswith("build/") for f in every.findings)


def test_symlinks_out_of_tree_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "k.cu").write_text("#define WARP_SIZE 32\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ok.py").write_text("x = 1\n")
    os.symlink(outside, tree / "linked_dir")
    os.symlink(outside / "k.cu", tree / "linked.cu")
    os.symlink(tree, tree / "loop")  # a cycle must not hang the walk
    result = scan.scan_path(tree)
    assert result.findings == [] and result.files == 1
    assert result.skipped["symlink"] == 3


def test_binary_large_and_hipified_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "blob.cu").write_bytes(b"\x7fELF\x00\x00#define WARP_SIZE 32\n")
    (tmp_path / "big.cu").write_text("#define WARP_SIZE 32\n" + "x\n" * 2000)
    (tmp_path / "done.cu").write_text(scan.HIPIFY_BREADCRUMB + "\n#define WARP_SIZE 32\n")
    (tmp_path / "latin1.cu").write_bytes(b"// caf\xe9\n#define WARP_SIZE 32\n")
    result = scan.scan_path(tmp_path, max_bytes=1000)
    assert dict(result.skipped) == {"binary": 1, "too_large": 1, "hipify_output": 1}
    assert [(f.path, f.line) for f in result.findings] == [("latin1.cu", 2)]


def test_single_file_and_missing_path(tmp_path: Path) -> None:
    result = scan.scan_path(CORPUS / "ops" / "numba_kernels.py")
    assert {f.rule for f in result.findings} == {"RP203", "RP204"}
    with pytest.raises(InvalidArgument, match="does not exist"):
        scan.scan_path(tmp_path / "nope")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    scan.add_scan_arguments(parser)
    code = scan.run_scan(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out


def test_exit_codes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _run(capsys, str(CORPUS), "--no-hipify")[0] == 1
    assert _run(capsys, str(CORPUS), "--no-hipify", "--fail-on", "never")[0] == 0
    (tmp_path / "t.py").write_text("import bitsandbytes\n")  # a note only
    assert _run(capsys, str(tmp_path), "--no-hipify")[0] == 0
    assert _run(capsys, str(tmp_path), "--no-hipify", "--fail-on", "note")[0] == 1


def test_text_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, str(CORPUS), "--no-hipify")
    assert out.splitlines()[0].split() == ["SEVERITY", "RULE", "LOCATION", "CONSTRUCT", "ROUTE"]
    assert "ERROR     RP101  csrc/reduce_kernels.cu:11" in out
    assert "suggested route: maintained ROCm fork" in out
    assert "lines/s" in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    _, out = _run(capsys, str(CORPUS), "--format", "json", "--no-hipify")
    data = json.loads(out)
    assert data["version"] == 1 and data["stats"]["files"] == 20
    first = data["findings"][0]
    assert set(first) >= {"rule", "severity", "path", "line", "column", "message", "suggestion", "suggested_path"}
    assert sum(data["summary"].values()) == len(data["findings"])


def test_sarif_2_1_0_structure(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "scan.sarif"
    _run(capsys, str(CORPUS), "--format", "sarif", "--no-hipify", "-o", str(out_file))
    log = json.loads(out_file.read_text())
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] and driver["rules"]
    ids = [r["id"] for r in driver["rules"]]
    assert len(ids) == len(set(ids))
    for rule in driver["rules"]:
        assert rule["defaultConfiguration"]["level"] in {"none", "note", "warning", "error"}
        assert rule["shortDescription"]["text"] and rule["help"]["text"].startswith("Suggested route:")
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"].startswith("file://")
    assert len(run["results"]) == len(expected()) - 2  # two misses
    for res in run["results"]:
        assert ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in {"note", "warning", "error"} and res["message"]["text"]
        loc = res["locations"][0]["physicalLocation"]
        assert not loc["artifactLocation"]["uri"].startswith("/") and loc["artifactLocation"]["uriBaseId"] == "SRCROOT"
        assert loc["region"]["startLine"] >= 1 and loc["region"]["startColumn"] >= 1


def _sarif_cli(path: Path, cwd: Path, env: dict[str, str] | None = None) -> dict:
    """The SARIF log of `rocm-parity scan PATH` run as a command from ``cwd``."""
    proc = subprocess.run([sys.executable, "-m", "pytest_rocm_parity.cli", "scan", str(path), "--no-hipify",
                           "--format", "sarif", "--fail-on", "never"], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _sub_folder_project(base: Path) -> Path:
    kernel = base / "src" / "my ext" / "csrc" / "reduce.cu"
    kernel.parent.mkdir(parents=True)
    kernel.write_text("__global__ void k(float* v) {\n  v[0] += __shfl_xor_sync(0xffffffff, v[0], 16);\n}\n")
    return kernel


def test_sarif_of_a_sub_folder_is_relative_to_the_git_repository_root(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _sub_folder_project(repo)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Run from outside the repository: the git top level of the scanned folder is the root, not the cwd.
    (run,) = _sarif_cli(repo / "src", cwd=elsewhere)["runs"]
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"] == repo.resolve().as_uri() + "/"
    assert run["results"]
    for res in run["results"]:
        loc = res["locations"][0]["physicalLocation"]["artifactLocation"]
        assert loc == {"uri": "src/my%20ext/csrc/reduce.cu", "uriBaseId": "SRCROOT"}
    # One file scanned: the same repository-relative location.
    (run,) = _sarif_cli(repo / "src" / "my ext" / "csrc" / "reduce.cu", cwd=repo / "src")["runs"]
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]} == {
        "src/my%20ext/csrc/reduce.cu"}


def test_sarif_outside_a_git_work_tree_is_relative_to_the_current_directory(tmp_path: Path) -> None:
    _sub_folder_project(tmp_path)
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp_path.parent))   # no enclosing repository counts
    (run,) = _sarif_cli(Path("src"), cwd=tmp_path, env=env)["runs"]
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"] == tmp_path.resolve().as_uri() + "/"
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]} == {
        "src/my%20ext/csrc/reduce.cu"}
    # A folder outside the current directory: absolute file URIs, no base id.
    (tmp_path / "other").mkdir()
    (run,) = _sarif_cli(tmp_path / "src", cwd=tmp_path / "other", env=env)["runs"]
    locs = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in run["results"]]
    assert locs and all(loc == {"uri": (tmp_path / "src" / "my ext" / "csrc" / "reduce.cu").resolve().as_uri()}
                        for loc in locs)


def test_hipify_report(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch.utils.hipify.hipify_python")
    _, out = _run(capsys, str(CORPUS), "--format", "json")
    report = json.loads(out)["hipify"]
    files = {f["path"]: f for f in report["files"]}
    kern = files["csrc/reduce_kernels.cu"]
    assert kern["hipified_path"] == "csrc/reduce_kernels.hip" and kern["kernel_launches"] == 1
    assert kern["renames"]["cudaStream_t => hipStream_t"] == 1
    assert not any(p.startswith("third_party/") for p in files)
    # the text shows ten of the renames and says they are a selection of how many
    _, text = _run(capsys, str(CORPUS))
    distinct = {name for f in report["files"] for name in f["renames"]}
    assert f"the most frequent of {len(distinct)} distinct rename(s) (every one: --format json):" in text
    # a file hipify renames is said to be written under its new name, with its reference count
    assert f"  csrc/reduce_kernels.cu (written as csrc/reduce_kernels.hip): {sum(kern['renames'].values())} API " \
           f"reference(s), 1 <<<>>> launch(es)" in text, text


def test_list_rules(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, ".", "--list-rules")
    assert code == 0 and len(out.splitlines()) == len(scan.RULES_BY_ID)


def test_throughput_floor(tmp_path: Path) -> None:
    """The bench measures the real rate (docs/scanner.md); this only guards against a collapse."""
    src = (CORPUS / "csrc" / "reduce_kernels.cu").read_text() + ("  float x = a[i] * b[i] + c;  // plain code\n" * 4000)
    for i in range(10):
        (tmp_path / f"k{i}.cu").write_text(src)
    t0 = time.process_time()  # CPU time: other jobs on a shared machine do not count
    result = scan.scan_path(tmp_path)
    rate = result.lines / max(time.process_time() - t0, 1e-6)
    assert rate > 20_000, f"{rate:,.0f} lines/s"


# FP8 code in the shapes serving stacks write it: hard-coded to the OCP format, or following the device.
OCP_ONLY = """\
import torch

FP8_MAX = 448.0
E4M3_MAX: float = 448


def quant(x, scale):
    q = (x / scale).clamp(min=-448.0, max=448.0)
    return q.to(torch.float8_e4m3fn), x.abs().amax() / torch.finfo(torch.float8_e4m3fn).max


def inverse(amax):
    return 448.0 / amax
"""


def _fp8_findings(text: str, name: str = "quant.py") -> list[tuple[int, str]]:
    return sorted((f.line, f.rule) for f in scan.scan_text(text, name, scan.kinds_for(name))
                  if f.rule in ("RP225", "RP227"))


def test_fp8_hard_coded_to_the_ocp_format() -> None:
    assert _fp8_findings(OCP_ONLY) == [(3, "RP227"), (4, "RP227"), (8, "RP227"), (9, "RP225"), (9, "RP227"),
                                       (13, "RP227")]
    (f,) = [f for f in scan.scan_text(OCP_ONLY, "quant.py", scan.P) if f.line == 3]
    assert "240" in f.message and "torch.finfo(dtype).max" in f.message
    kernel = "constexpr float kMax = 448.0f;\n__device__ float sat(float v) { return fminf(fmaxf(v, -448.f), 448.f); }\n"
    assert _fp8_findings("#include <cuda_fp8.h>\n" + kernel, "k.cu") == [(2, "RP227"), (3, "RP227")]


@pytest.mark.parametrize("branch", [
    "dtype = current_platform.fp8_dtype()\n",
    "dtype = torch.float8_e4m3fnuz if is_fnuz else torch.float8_e4m3fn\n",
    "if current_platform.is_fp8_fnuz():\n    w, s, _ = normalize_e4m3fn_to_e4m3fnuz(w, s)\n",
])
def test_an_fnuz_branch_in_the_file_clears_the_dtype(branch: str) -> None:
    text = "import torch\n" + branch + "q = x.to(torch.float8_e4m3fn)\ng = y.to(torch.float8_e5m2)\n"
    assert _fp8_findings(text) == []
    assert _fp8_findings(text.replace(branch, "")) == [(2, "RP225"), (3, "RP225")]


def test_a_platform_dtype_does_not_excuse_a_448_clamp() -> None:
    """The platform's dtype with the OCP maximum is the MI300 bug itself: 448 saturates e4m3fnuz."""
    text = "dtype = current_platform.fp8_dtype()\nq = x.clamp(-448.0, 448.0).to(dtype)\n"
    assert _fp8_findings(text) == [(2, "RP227")]


@pytest.mark.parametrize("text", [
    "FP8_MAX = 240.0 if current_platform.is_fp8_fnuz() else 448.0\n",
    "FP8_MAX = 448.0\nif is_fnuz:\n    FP8_MAX = torch.finfo(torch.float8_e4m3fnuz).max\n",
    "fp8_max = torch.finfo(current_platform.fp8_dtype()).max\nq = x.clamp(-fp8_max, fp8_max)\n",
])
def test_a_maximum_per_format_is_not_flagged(text: str) -> None:
    assert _fp8_findings(text) == []


@pytest.mark.parametrize("text", [
    "# fp8 vision tower\nimage_size = 448\nsize = (448, 448)\ngrid = 448 // 14\nx = F.interpolate(x, size=448)\n",
    "FP8_MAX = 4480.0\nscale = x / 448.5\n",
])
def test_448_that_is_not_an_fp8_maximum(text: str) -> None:
    assert _fp8_findings(text) == []


def test_448_outside_fp8_code_is_not_flagged() -> None:
    assert _fp8_findings("MAX_SIDE = 448\nx = img / 448.0\n") == []


def test_fp8_rules_are_suppressible() -> None:
    text = "import torch\nFP8_MAX = 448.0  # rocm-parity: ignore[fp8-max-448]\nq = x.to(torch.float8_e4m3fn)  # rocm-parity: ignore[RP225]\n"
    counts: Counter[str] = Counter()
    assert scan.scan_text(text, "quant.py", scan.P, suppressed=counts) == []
    assert counts == {"RP225": 1, "RP227": 1}


TRITON_ASM = '''import triton
import triton.language as tl


@triton.jit
def to_half(x_ptr, y_ptr):
    x = tl.load(x_ptr)
    y = tl.inline_asm_elementwise("cvt.rn.f16.f32 $0, $1;", "=h,r", [x], dtype=tl.float16, is_pure=True, pack=1)
    w = tl.inline_asm_elementwise(
        asm="""
        mov.b32 $0, $1;
        """, constraints="=r,r", args=[x], dtype=tl.int32, is_pure=True, pack=1)
    v = tl.inline_asm_elementwise(constraints="=r,r", args=(x,), asm="prmt.b32 $0, $1, 0, 0x0123;", dtype=tl.int32,
                                  is_pure=True, pack=1)
    z = tl.inline_asm_elementwise(asm="v_cvt_f16_f32 $0, $1", constraints="=v,v", args=[x], dtype=tl.float16,
                                  is_pure=True, pack=1)
'''


def test_triton_inline_ptx_is_flagged_and_amdgcn_asm_is_not() -> None:
    found = [(f.rule, f.line) for f in scan.scan_text(TRITON_ASM, "k.py", scan.P) if f.rule != "RP205"]
    assert found == [("RP110", 8), ("RP110", 9), ("RP110", 13)]
    (f, *_) = [f for f in scan.scan_text(TRITON_ASM, "k.py", scan.P) if f.rule == "RP110"]
    assert "AMD GPUs do not run PTX" in f.message and "tl op" in f.message and "AMDGCN" in f.message


@pytest.mark.parametrize(("call", "rules"), [
    ('c = tl.dot(a, b, input_precision="tf32")', ["RP228"]),
    ("c = tl.dot(a, b, input_precision='tf32x3')", ["RP228"]),
    ("c = tl.dot(a, b, allow_tf32=True)", ["RP228"]),
    ('c = tl.dot(a, b, input_precision="ieee")', []),
])
def test_triton_dot_in_tf32_is_the_tf32_rule(call: str, rules: list[str]) -> None:
    assert [f.rule for f in scan.scan_text(call + "\n", "k.py", scan.P)] == rules


def _scan_to(capsys: pytest.CaptureFixture[str], output: str) -> tuple[int, str]:
    from pytest_rocm_parity import cli

    code = cli.main(["scan", str(CORPUS / "ops"), "--no-hipify", "--format", "sarif", "-o", output])
    return code, capsys.readouterr().err


def test_output_in_a_missing_folder_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "nonexistent" / "dir" / "x.sarif"
    code, err = _scan_to(capsys, str(target))
    assert code == 2 and "Traceback" not in err, err
    assert f"--output {target}: the folder {target.parent} does not exist" in err and f"mkdir -p {target.parent}" in err


def test_output_that_is_a_directory_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = _scan_to(capsys, str(tmp_path))
    assert code == 2 and f"--output {tmp_path} is a directory" in err and f"-o {tmp_path / 'scan.sarif'}" in err, err


def test_output_in_a_read_only_folder_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "x.sarif"
    monkeypatch.setattr(scan.os, "access", lambda *a, **k: False)   # root may write in a 0555 folder
    code, err = _scan_to(capsys, str(target))
    assert code == 2 and f"the folder {tmp_path} is not writable" in err, err
    assert "-o DIR/scan.sarif" in err, err


def test_output_that_fails_at_write_time_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(scan, "atomic_write", refuse)
    code, err = _scan_to(capsys, str(tmp_path / "x.sarif"))
    assert code == 2 and "cannot be written there (Permission denied)" in err and "Traceback" not in err, err
    assert "-o DIR/scan.sarif" in err, err


def test_ignore_comments_take_rule_ids_and_names_in_any_case() -> None:
    text = ("v = __shfl_xor_sync(0xffffffff, v, 1);  // rocm-parity: ignore[rp101]\n"
            "// rocm-parity: ignore[Warp-Mask-32BIT]\n"
            "v = __shfl_xor_sync(0xffffffff, v, 2);\n")
    counts: Counter[str] = Counter()
    assert scan.scan_text(text, "k.cu", scan.D, suppressed=counts) == []
    assert counts == {"RP101": 2}
    assert scan.scan_text("import pycuda  # rocm-parity: ignore[rp204]\n", "m.py", scan.P) == []


def test_unknown_rule_in_an_ignore_comment_is_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text("v = __shfl_xor_sync(0xffffffff, v, 1);  // rocm-parity: ignore[RP1O1]\n"
                                   'const char* doc = "rocm-parity: ignore[RULE]";\n')
    (tmp_path / "m.py").write_text('x = 1  # rocm-parity: ignore[warp-size-23, *]\n"""rocm-parity: ignore[RULE]"""\n')
    found = [(f.rule, f.path, f.line, f.column) for f in scan.scan_path(tmp_path).findings]
    assert found == [("RP001", "k.cu", 1, 64), ("RP101", "k.cu", 1, 5), ("RP001", "m.py", 1, 30)]
    code, out = _run(capsys, str(tmp_path), "--no-hipify")
    assert "k.cu:1: ignore[RP1O1]: 'RP1O1' is no rule (did you mean RP101?), so this comment silences nothing" in out
    assert "m.py:1: ignore[warp-size-23]: 'warp-size-23' is no rule (did you mean warp-size-32?)" in out
    assert code == 1
    code, out = _run(capsys, str(tmp_path / "m.py"), "--no-hipify", "--ignore", "unknown-suppression")
    assert code == 0 and "No CUDA-only constructs found." in out


@pytest.mark.parametrize(("line", "rules"), [
    ("torch.backends.cudnn.allow_tf32 = True", []),                 # PyTorch's default; convolutions
    ("torch.backends.cudnn.conv.fp32_precision = 'tf32'", []),
    ("torch.backends.cudnn.rnn.fp32_precision = 'tf32'", []),
    ("torch.backends.cudnn.fp32_precision = 'tf32'", []),
    ("torch.backends.cuda.matmul.allow_tf32 = True", ["RP228"]),
    ("torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True", ["RP228"]),
    ("torch.backends.fp32_precision = 'tf32'", ["RP228"]),          # every backend, matmuls included
])
def test_the_tf32_rule_is_about_matmuls_not_cudnn(line: str, rules: list[str]) -> None:
    """cudnn.allow_tf32 = True is PyTorch's default and governs convolutions: the doctor shows it
    without warning, and the scan does not call it a TF32 matmul."""
    assert [f.rule for f in scan.scan_text(line + "\n", "m.py", scan.P)] == rules


@pytest.mark.parametrize(("text", "rules"), [
    ("v += __shfl_xor_sync(\n    0xffffffff, v, m);\n", ["RP101"]),
    ("v += __shfl_xor_sync(  // all lanes\n    0xffffffff, v, m);\n", ["RP101"]),
    ("v += __shfl_xor_sync( /* all */\n  ~0u, v, m);\n", ["RP101"]),
    ("v += __shfl_xor_sync(\n    mask, v, m);\n", ["RP102"]),
    ("v += __shfl_xor_sync(\n    0xffffffffffffffffull, v, m);\n", []),
    ("b = __ballot_sync(\n\n   __activemask(), p);\n", []),
])
def test_a_sync_call_with_its_mask_on_another_line_gets_one_finding(text: str, rules: list[str]) -> None:
    found = scan.scan_text(text, "k.cu", scan.D)
    assert [f.rule for f in found] == rules and all(f.line == 1 for f in found), found


PY_BRANCHES = """\
import torch
is_rocm = torch.version.hip is not None
cuda_ver = None if is_rocm else torch.version.cuda
major = torch.version.cuda if not is_rocm else None
if torch.version.hip:
    WARP_SIZE = 64
else:
    WARP_SIZE = 32
if torch.version.hip is None:
    import pynvml
elif True:
    pass
if not IS_HIP and torch.cuda.is_available():
    warp_size = 32
if current_platform.is_rocm() or FORCE:
    pass
else:
    THREADS_PER_WARP = 32
"""


def test_python_in_the_non_rocm_branch_of_a_rocm_check_is_not_flagged() -> None:
    assert scan.scan_text(PY_BRANCHES, "m.py", scan.P) == []


@pytest.mark.parametrize("text", [
    "v = torch.version.hip if is_rocm else torch.version.cuda\nx = None if is_rocm else 1\ny = torch.version.cuda\n",
    "if torch.version.hip:\n    WARP_SIZE = 32\n",                       # the ROCm branch itself
    "if is_rocm and FAST:\n    pass\nelse:\n    WARP_SIZE = 32\n",        # the else runs on ROCm without FAST
    "if torch.cuda.is_available():\n    pass\nelse:\n    WARP_SIZE = 32\n",
    "if is_rocm_unsupported:\n    pass\nelse:\n    WARP_SIZE = 32\n",     # not a ROCm check
])
def test_python_that_a_rocm_build_runs_is_still_flagged(text: str) -> None:
    assert [f.rule for f in scan.scan_text(text, "m.py", scan.P)] in (["RP222"], ["RP208"]), text


CU_BRANCHES = """\
#ifdef USE_ROCM
#define WARP_SIZE 64
#else
#define WARP_SIZE 32
#endif
#if defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM)
constexpr int kLanes = 64;
#elif CUDA_VERSION >= 12000
constexpr int kWarpSize = 32;
#endif
#if !defined(__HIPCC__) && !defined(USE_ROCM)
v = __shfl_sync(0xffffffff, v, 0);
#  ifdef ANY
int lane = threadIdx.x & 31;
#  endif
#endif
#ifndef USE_ROCM
#if CUDA_VERSION >= 11000
asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
#endif
#else
int ok = 1;
#endif
"""


def test_device_code_in_the_non_rocm_branch_of_a_preprocessor_check_is_not_flagged() -> None:
    assert scan.scan_text(CU_BRANCHES, "k.cu", scan.D) == []


@pytest.mark.parametrize(("text", "line"), [
    ("#ifdef USE_ROCM\n#define WARP_SIZE 32\n#endif\n", 2),                        # the ROCm branch itself
    ("#if defined(USE_ROCM) && FAST\n#else\n#define WARP_SIZE 32\n#endif\n", 3),  # runs on ROCm without FAST
    ("#ifdef USE_CUDA\n#else\n#define WARP_SIZE 32\n#endif\n", 3),
    ("#ifndef USE_ROCM\n#else\n#define WARP_SIZE 32\n#endif\n", 3),
    ("#ifdef USE_ROCM\n#endif\n#define WARP_SIZE 32\n", 3),
    ("#if defined(__HIP_PLATFORM_NVIDIA__)\n#else\n#define WARP_SIZE 32\n#endif\n", 3),   # HIP on NVIDIA
])
def test_device_code_that_a_rocm_build_compiles_is_still_flagged(text: str, line: int) -> None:
    assert [(f.rule, f.line) for f in scan.scan_text(text, "k.cu", scan.D)] == [("RP104", line)], text


@pytest.mark.parametrize(("line", "rules"), [
    ("WARP_SIZE = 32 if not is_rocm else 64\n", []),          # the 32 is the branch ROCm skips
    ("WARP_SIZE = 32 if is_rocm else 64\n", ["RP208"]),       # ROCm runs the 32
])
def test_a_match_that_ends_in_a_branch_rocm_skips_is_not_flagged(line: str, rules: list[str]) -> None:
    """The rule matches from the name; what decides is where its offending literal lies."""
    assert [f.rule for f in scan.scan_text(line, "m.py", scan.P)] == rules


def _line_hashes(root: Path) -> list[tuple[int, str]]:
    result = scan.scan_path(root)
    log = scan.to_sarif(result, srcroot=root)
    return [(r["locations"][0]["physicalLocation"]["region"]["startLine"],
             r["partialFingerprints"]["primaryLocationLineHash"]) for r in log["runs"][0]["results"]]


def test_sarif_line_hash_is_a_hash_with_an_occurrence_index(tmp_path: Path) -> None:
    """GitHub code scanning reads primaryLocationLineHash as ``<hex>:<n>``: two identical lines in a file
    must differ by their index (else their alerts merge), and moving unrelated lines must not change it."""
    body = ("__device__ float a(float v){\n  v += __shfl_xor_sync(0xffffffff, v, 1);\n  return v;\n}\n"
            "__device__ float b(float v){\n  v += __shfl_xor_sync(0xffffffff, v, 1);\n  return v;\n}\n")
    (tmp_path / "dup.cu").write_text(body)
    first = _line_hashes(tmp_path)
    assert [line for line, _ in first] == [2, 6]
    (h2, n2), (h6, n6) = (value.split(":") for _, value in first)
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in (h2, h6)), first
    assert (h2, n2, h6, n6) == (h2, "1", h2, "2")
    # Unrelated lines above, and different indentation: the same values at the new line numbers.
    (tmp_path / "dup.cu").write_text("// header\n#include <cstdio>\n\n" + body.replace("  v +=", "\tv  +="))
    moved = _line_hashes(tmp_path)
    assert [line for line, _ in moved] == [5, 9] and [v for _, v in moved] == [v for _, v in first]
    # A different rule or file on the same content hashes differently.
    (tmp_path / "other.cu").write_text(body)
    assert {v for _, v in _line_hashes(tmp_path)} > {v for _, v in first}
    assert len({v for _, v in _line_hashes(tmp_path)}) == 4


@pytest.mark.parametrize("text", [
    "/* disabled:\n   v = __ballot_sync(0xffffffff, p);\n*/\n",                       # continuation without '*'
    "int x; /* start\n   __shfl_sync(0xffffffff, v, 0)\n   still */ int y;\n",
    "// a line comment \\\n   __shfl_sync(0xffffffff, v, 0)\n",                        # continued by a backslash
    'const char* s = R"(/* not a comment\n)"; /*\n  __syncwarp();\n*/\n',
])
def test_block_comments_over_several_lines_are_not_code(text: str) -> None:
    assert scan.scan_text(text, "k.cu", scan.D) == []


@pytest.mark.parametrize(("text", "line"), [
    # a raw string over lines: its "/*" opens no comment, so the code after it is code
    ('const char* s = R"x(\n/* text\n)x";\nv = __shfl_sync(0xffffffff, v, 0);\n', 4),
    # a line of code that starts with '*' is code, outside a comment
    ("__device__ void f(float* out, float v) {\n  *out = __shfl_sync(0xffffffff, v, 0);\n}\n", 2),
    # code after a block comment closes on a later line
    ("/* one\n two */ v = __shfl_sync(0xffffffff, v, 0);\n", 2),
    ('printf("/*"); v = __shfl_sync(0xffffffff, v, 0);\nw = __shfl_sync(0xffffffff, w, 0);\n', 2),
])
def test_code_around_multi_line_comments_and_strings_is_scanned(text: str, line: int) -> None:
    assert line in {f.line for f in scan.scan_text(text, "k.cu", scan.D) if f.rule == "RP101"}


def test_an_unknown_rule_in_a_block_comment_continuation_is_reported() -> None:
    text = "/*\n   rocm-parity: ignore[RP1O1]\n*/\nint x;\n"
    assert [(f.rule, f.line) for f in scan.scan_text(text, "k.cu", scan.D)] == [("RP001", 2)]


@pytest.mark.parametrize("text", [
    'def f():\n    """Like `torch.cuda.get_device_capability()` but cached; see torch.version.cuda."""\n',
    's = "allow_tf32 = True"\n',
    'warnings.warn("Use `torch.version.cuda` for the CUDA runtime version.")\n',
    'msg = f"found {x} with compute capability"; doc = "num_warps=8 on A100"\n',
    '"""\nExample:\n    import flash_attn\n    WARP_SIZE = 32\n    torch.backends.cuda.matmul.allow_tf32 = True\n"""\n',
    'def g():\n    """Build with `TORCH_CUDA_ARCH_LIST=8.0 pip install x` or -gencode; weights in float8_e4m3fn."""\n',
    "x = '''\nprops = torch.cuda.get_device_properties(0)\nif props.major >= 9: pass\n'''\n",
    "cap = torch.xpu.get_device_capability()\n",
    'arch = torch.xpu.get_device_capability()["architecture"]\n',
])
def test_python_strings_and_docstrings_are_not_code(text: str) -> None:
    assert scan.scan_text(text, "m.py", scan.P) == []


@pytest.mark.parametrize(("text", "rules"), [
    # rules that look for a string's text keep finding it outside docstrings
    ('subprocess.run(["nvidia-smi", "-L"])\n', ["RP215"]),
    ('os.system("nvidia-smi -q")\n', ["RP215"]),
    ('os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0"\n', ["RP226"]),
    ('extra_compile_args = {"nvcc": ["-gencode", "arch=compute_80,code=sm_80"]}\n', ["RP226"]),
    ('torch.set_float32_matmul_precision("high")\n', ["RP228"]),
    ('torch.backends.fp32_precision = "bfx9"\n', ["RP224"]),
    ('if "H100" in name:\n    pass\n', ["RP221"]),
    ('dt = getattr(torch, "float8_e4m3fn")\n', ["RP225"]),
    ('y = tl.inline_asm_elementwise("cvt.rn.f16.f32 $0, $1;", "=r,r", [x], dtype=tl.float16, is_pure=True, pack=1)\n',
     ["RP110"]),
    # code beside a string on the same line is still code
    ('s = "a"; torch.backends.cuda.matmul.allow_tf32 = True\n', ["RP228"]),
    ('cap = torch.cuda.get_device_capability()  # "quoted"\n', ["RP220"]),
    ('v = torch.version.cuda or "none"\n', ["RP222"]),
    ('kernel[grid](x, num_warps=4)\n', ["RP207"]),
])
def test_python_rules_that_read_strings_still_do(text: str, rules: list[str]) -> None:
    assert [f.rule for f in scan.scan_text(text, "m.py", scan.P)] == rules


def test_cuda_source_embedded_in_a_python_string_is_still_scanned() -> None:
    text = ('src = """\n__global__ void k(float* v) {\n  asm volatile("mov.u32 %0, %%laneid;" : "=r"(v[0]));\n'
            '  v[0] = fminf(v[0], 448.f);  // fp8\n}\n"""\nmod = load_inline("m", cuda_sources=[src])\n')
    assert {"RP110", "RP125", "RP201", "RP227"} <= {f.rule for f in scan.scan_text(text, "m.py", scan.P)}


@pytest.mark.parametrize(("text", "lines"), [
    ("template <int WARP_SIZE = 32> __device__ float red(float v) { return v; }\n", [1]),
    ("template <int kWarpSize = 32, int kBlock = 128>\nstruct Reduce {};\n", [1]),
    ("template <typename T, int kWarpSize = 64>\nstruct Reduce {};\n", []),
    ("template <int kBlock = 32>\nstruct Reduce {};\n", []),
])
def test_a_warp_size_template_default_of_32_is_flagged(text: str, lines: list[int]) -> None:
    assert [f.line for f in scan.scan_text(text, "k.cuh", scan.D) if f.rule == "RP104"] == lines


@pytest.mark.parametrize(("definition", "rule"), [
    ("#define FULL_MASK 0xffffffff\n", "RP101"),
    ("#define FULL_MASK (0xffffffffu)  // all lanes\n", "RP101"),
    ("constexpr unsigned FULL_MASK = 0xffffffff;\n", "RP101"),
    ("static const uint32_t FULL_MASK{0xFFFFFFFF};\n", "RP101"),
    ("#define FULL_MASK 0xffffffffffffffffULL\n", "RP102"),
    ("", "RP102"),                                                          # not defined in the file
    # one definition per platform: the ROCm build reads the 64-bit one
    ("#ifdef USE_ROCM\n#define FULL_MASK 0xffffffffffffffffULL\n#else\n#define FULL_MASK 0xffffffff\n#endif\n", "RP102"),
    ("#ifdef USE_ROCM\n#define FULL_MASK __activemask()\n#else\n#define FULL_MASK 0xffffffff\n#endif\n", "RP102"),
])
def test_a_named_32_bit_mask_in_the_file_is_the_literal_error(definition: str, rule: str) -> None:
    text = definition + "__device__ float red(float v) {\n  return __shfl_xor_sync(FULL_MASK, v, 1);\n}\n"
    (f,) = scan.scan_text(text, "k.cu", scan.D)
    assert (f.rule, f.line) == (rule, text.count("\n") - 1)
    if rule == "RP101":
        assert f.severity == "error" and f.message.startswith("FULL_MASK is a 32-bit lane mask (defined at line")
    # ignoring RP101 leaves a named 32-bit mask unreported, as it does the literal
    rules = tuple(r for r in scan.RULES if r.id != "RP101")
    assert [x.rule for x in scan.scan_text(text, "k.cu", scan.D, rules)] == ([] if rule == "RP101" else ["RP102"])


@pytest.mark.parametrize(("text", "rules"), [
    ("import os, flash_attn\n", ["RP210"]),
    ("import numpy as np, xformers.ops as xops\n", ["RP212"]),
    ("import os; import apex\n", ["RP213"]),
    ("\ufeffimport flash_attn\n", ["RP210"]),
    ("from transformer_engine.pytorch import Linear\n", ["RP218"]),
    ("import transformer_engine as te\n", ["RP218"]),
    ("import os, flash_attn_helpers\n", []),
    ("from os import flash_attn\n", []),
])
def test_imports_in_list_form_and_after_a_bom(text: str, rules: list[str]) -> None:
    assert [f.rule for f in scan.scan_text(text, "m.py", scan.P)] == rules


def test_a_bom_file_on_disk_reports_line_one(tmp_path: Path) -> None:
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfimport flash_attn\n")
    assert [(f.rule, f.line, f.column) for f in scan.scan_path(tmp_path).findings] == [("RP210", 1, 1)]


@pytest.mark.parametrize(("text", "lines"), [
    ('name = torch.cuda.get_device_name(0)\nif name.startswith("NVIDIA"):\n    pass\n', [2]),
    ('def f():\n    name = torch.cuda.get_device_name()\n    x = 1\n    return "H100" in name\n', [4]),
    ('def f():\n    n = str(torch.cuda.get_device_name(0))\n    if n.lower().endswith(("a100", "h100")):\n        return 1\n', [3]),
    ('def f():\n    name = torch.cuda.get_device_name(0)\n    return name == "NVIDIA A100-SXM4-80GB"\n', [3]),
    ('def f():\n    name = torch.cuda.get_device_name(0)\n    return re.search("H100", name) is not None\n', [3]),
    # not a vendor test, or not the same function's variable
    ('def f():\n    name = torch.cuda.get_device_name(0)\n    return name.startswith("AMD")\n', []),
    ('def f():\n    name = torch.cuda.get_device_name(0)\n    return name\n'
     'def g(name):\n    return name.startswith("NVIDIA")\n', []),
    ('name = torch.cuda.get_device_name(0)\nif torch.version.hip:\n    pass\nelif name.startswith("NVIDIA"):\n    pass\n',
     []),
])
def test_a_vendor_test_of_a_device_name_variable(text: str, lines: list[int]) -> None:
    assert [f.line for f in scan.scan_text(text, "m.py", scan.P) if f.rule == "RP221"] == lines


@pytest.mark.parametrize(("name", "text", "found"), [
    ("check_gpu.sh", "#!/bin/bash\nnvidia-smi -L\nexport NCCL_DEBUG=INFO\n", [(2, "RP230")]),
    ("build.sh", "# nvidia-smi in a comment\n$CUDA_HOME/bin/nvcc -arch=sm_80 k.cu\napt-get install -y cuda-nvcc-12-1\n",
     [(2, "RP226"), (2, "RP231")]),
    ("run.bash", "export CUDA_VISIBLE_DEVICES=0,1\nTORCH_CUDA_ARCH_LIST='8.0' pip install .\n", [(1, "RP232"), (2, "RP226")]),
    ("Dockerfile", "FROM nvcr.io/nvidia/pytorch:24.01-py3\nENV TORCH_CUDA_ARCH_LIST=\"8.0 9.0\"\nRUN nvidia-smi\n",
     [(1, "RP233"), (2, "RP226"), (3, "RP230")]),
    ("Dockerfile.dev", "FROM nvidia/cuda:12.4.1-devel-ubuntu22.04\nRUN /usr/bin/nvidia-smi -q\n", [(1, "RP233"), (2, "RP230")]),
    ("gpu.dockerfile", "FROM rocm/pytorch:latest\nRUN amd-smi list\nENV PATH=/usr/local/nvidia/cuda/bin:$PATH\n", []),
])
def test_shell_scripts_and_dockerfiles(tmp_path: Path, name: str, text: str, found: list[tuple[int, str]]) -> None:
    (tmp_path / name).write_text(text)
    result = scan.scan_path(tmp_path)
    assert result.files == 1
    assert [(f.line, f.rule) for f in result.findings] == found
    if any(rule == "RP233" for _, rule in found):
        assert "rocm/pytorch" in scan.RULES_BY_ID["RP233"].message


def test_notebook_code_cells_are_scanned_by_cell_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notebook = {"cells": [
        {"cell_type": "markdown", "source": ["import flash_attn\n"]},
        {"cell_type": "code", "source": ["import torch\n", "import flash_attn\n", "!nvidia-smi\n",
                                         "torch.backends.cuda.matmul.allow_tf32 = True"]},
        {"cell_type": "code", "source": "%%bash\nnvcc -gencode arch=compute_80,code=sm_80 k.cu\n"},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "nb.ipynb").write_text(json.dumps(notebook, indent=1))
    raw_lines = (tmp_path / "nb.ipynb").read_text().splitlines()
    result = scan.scan_path(tmp_path)
    assert result.files == 1 and result.lines == 6
    got = [(f.cell, f.cell_line, f.rule) for f in result.findings]
    assert got == [(2, 2, "RP210"), (2, 3, "RP230"), (2, 4, "RP228"), (3, 2, "RP226"), (3, 2, "RP231")]
    # line: the .ipynb line that holds the source line, for SARIF and editors
    for f in result.findings[:3]:
        assert f.snippet in raw_lines[f.line - 1] or f.snippet.lstrip("!") in raw_lines[f.line - 1], f
    code, out = _run(capsys, str(tmp_path), "--no-hipify", "--fail-on", "never")
    assert "nb.ipynb:cell 2:line 2" in out and "nb.ipynb:cell 3:line 2" in out
    _, out = _run(capsys, str(tmp_path), "--no-hipify", "--format", "json")
    assert {(f["cell"], f["cell_line"]) for f in json.loads(out)["findings"]} >= {(2, 2), (3, 2)}


def test_a_broken_notebook_is_counted_not_scanned(tmp_path: Path) -> None:
    (tmp_path / "nb.ipynb").write_text("{not json")
    result = scan.scan_path(tmp_path)
    assert result.files == 0 and result.skipped["not_a_notebook"] == 1


def test_skipped_files_are_named_with_their_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "blob.cu").write_bytes(b"\x7fELF\x00\x00#define WARP_SIZE 32\n")
    (tmp_path / "big.cu").write_text("#define WARP_SIZE 32\n" + "x\n" * 2000)
    for i in range(6):
        (tmp_path / f"huge{i}.cu").write_text("x\n" * (600 + i))
    result = scan.scan_path(tmp_path, max_bytes=1000)
    assert {(e["path"], e["reason"]) for e in result.skipped_files} == {
        ("blob.cu", "binary"), ("big.cu", "too_large"), *((f"huge{i}.cu", "too_large") for i in range(6))}
    assert next(e for e in result.skipped_files if e["path"] == "big.cu")["bytes"] == (tmp_path / "big.cu").stat().st_size
    _, out = _run(capsys, str(tmp_path), "--no-hipify", "--max-bytes", "1000")
    big = (tmp_path / "big.cu").stat().st_size
    assert f"skipped 8 file(s): big.cu ({big:,} bytes, above --max-bytes 1,000), blob.cu (binary), huge0.cu" in out
    assert "and 3 more (--format json lists every one under stats.skipped_files)" in out
    assert f"to scan the 7 file(s) above the size limit: --max-bytes {big}" in out
    _, out = _run(capsys, str(tmp_path), "--no-hipify", "--max-bytes", "1000", "--format", "json")
    stats = json.loads(out)["stats"]
    assert stats["skipped"] == {"binary": 1, "too_large": 7} and len(stats["skipped_files"]) == 8
    assert stats["max_bytes"] == 1000


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_files_with_a_bom_are_text(tmp_path: Path, codec: str) -> None:
    text = "__device__ float f(float v){return __shfl_sync(0xffffffff,v,0);}\n"
    bom = {"utf-16": b"", "utf-16-be": b"\xfe\xff", "utf-32": b""}[codec]
    (tmp_path / "k.cu").write_bytes(bom + text.encode(codec))
    result = scan.scan_path(tmp_path)
    assert result.skipped_files == [] and [(f.rule, f.line) for f in result.findings] == [("RP101", 1)]


@pytest.mark.parametrize(("name", "text", "rule", "route"), [
    ("m.py", "WARP_SIZE = 32\n", "RP208", "manual-python"),
    ("m.py", "cap = torch.cuda.get_device_capability()\n", "RP220", "manual-python"),
    ("m.py", 'if torch.cuda.get_device_name(0).startswith("NVIDIA"):\n    pass\n', "RP221", "manual-python"),
    ("m.py", "v = torch.version.cuda\n", "RP222", "manual-python"),
    ("m.py", "torch.backends.cuda.matmul.allow_tf32 = True\n", "RP228", "manual-python"),
    ("m.py", "# fp8\nFP8_MAX = 448.0\n", "RP227", "manual-python"),
    ("k.cu", "#define WARP_SIZE 32\n", "RP104", "manual"),
    ("k.cu", "// fp8\nfloat m = fminf(x, 448.f);\n", "RP227", "manual"),
    # CUDA source embedded in a Python string is ported in CUDA: #ifdef USE_ROCM
    ("m.py", 'src = """\n__global__ void k(float* v) { v[0] = __shfl_sync(0xffffffff, v[0], 0); }\n"""\n', "RP101", "manual"),
    ("run.sh", "export CUDA_VISIBLE_DEVICES=0\n", "RP232", "manual-shell"),
])
def test_a_manual_port_is_spelled_for_the_language(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                                   text: str, rule: str, route: str) -> None:
    (tmp_path / name).write_text(text)
    (f,) = [x for x in scan.scan_path(tmp_path).findings if x.rule == rule]
    assert f.suggestion == route
    _, out = _run(capsys, str(tmp_path), "--no-hipify", "--format", "json", "--fail-on", "never")
    (j,) = [x for x in json.loads(out)["findings"] if x["rule"] == rule]
    if route == "manual-python":
        assert "if torch.version.hip:" in j["route"] and "#ifdef" not in j["route"]
    elif route == "manual":
        assert "#ifdef USE_ROCM" in j["route"]
    _, out = _run(capsys, str(tmp_path), "--no-hipify", "--fail-on", "never")
    assert f"suggested route: {scan.PATHS[route]}" in out
    (res,) = [r for r in json.loads(_run(capsys, str(tmp_path), "--no-hipify", "--format", "sarif")[1])["runs"][0]["results"]
              if r["ruleId"] == rule]
    assert res["message"]["text"].endswith(scan.PATHS[route])


def test_python_only_rules_suggest_the_python_branch_in_sarif_help(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    rules = json.loads(_run(capsys, str(tmp_path), "--format", "sarif", "--no-hipify")[1])["runs"][0]["tool"]["driver"]["rules"]
    helps = {r["id"]: r["help"]["text"] for r in rules}
    for rid in ("RP208", "RP220", "RP221", "RP222", "RP228"):
        assert "if torch.version.hip:" in helps[rid] and "#ifdef" not in helps[rid], rid
    assert "#ifdef USE_ROCM" in helps["RP104"]


def test_a_missing_hipify_is_said_in_text_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch the hipify section would vanish without a word; the report says why it is missing."""
    (tmp_path / "k.cu").write_text("cudaStream_t s;\n")
    monkeypatch.setitem(sys.modules, "torch.utils.hipify", None)
    monkeypatch.setitem(sys.modules, "torch.utils.hipify.hipify_python", None)
    _, out = _run(capsys, str(tmp_path))
    assert "hipify: no report: torch.utils.hipify cannot be imported (" in out
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in out and "--no-hipify" in out
    data = json.loads(_run(capsys, str(tmp_path), "--format", "json")[1])
    assert data["hipify"] is None and data["hipify_reason"].startswith("torch.utils.hipify cannot be imported")
    # asked to leave it out: JSON says so, and the text has no line about it
    data = json.loads(_run(capsys, str(tmp_path), "--format", "json", "--no-hipify")[1])
    assert data["hipify"] is None and data["hipify_reason"] == "left out by --no-hipify"
    assert "hipify" not in _run(capsys, str(tmp_path), "--no-hipify")[1]


def test_list_rules_in_json_and_sarif(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out = _run(capsys, "--list-rules", "--format", "json")
    rules = json.loads(out)
    assert code == 0 and [r["id"] for r in rules] == list(scan.RULES_BY_ID)
    by_id = {r["id"]: r for r in rules}
    assert by_id["RP104"] == {"id": "RP104", "name": "warp-size-32", "severity": "error",
                              "title": "Warp size hard-coded to 32", "message": scan.RULES_BY_ID["RP104"].message,
                              "route": "manual", "fix": scan.PATHS["manual"]}
    assert by_id["RP220"]["route"] == "manual-python"
    code, out = _run(capsys, "--list-rules", "--format", "sarif")
    (run,) = json.loads(out)["runs"]
    assert code == 0 and run["results"] == [] and len(run["tool"]["driver"]["rules"]) == len(scan.RULES_BY_ID)
    code, out = _run(capsys, "--list-rules", "--format", "json", "-o", str(tmp_path / "rules.json"))
    assert code == 0 and out == "" and json.loads((tmp_path / "rules.json").read_text()) == rules


@pytest.mark.parametrize("value", ["", " ", ",", " , "])
def test_an_empty_ignore_is_a_usage_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^--ignore .* names no rule; give a rule id or name"):
        _run(capsys, str(CORPUS), "--no-hipify", "--ignore", value)
    # an empty item beside a rule is a trailing comma, not a mistake
    assert _run(capsys, str(CORPUS), "--no-hipify", "--ignore", "RP104,", "--fail-on", "never")[0] == 0


def test_an_empty_ignore_exits_2_from_the_command_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest_rocm_parity.cli", "scan", str(tmp_path), "--no-hipify",
                           "--ignore", ""], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "--ignore '' names no rule" in proc.stderr


def _silenced(text: str, name: str) -> tuple[list[tuple[str, int]], dict[str, int]]:
    counts: Counter[str] = Counter()
    found = scan.scan_text(text, name, scan.kinds_for(name), suppressed=counts)
    return [(f.rule, f.line) for f in found], dict(counts)


@pytest.mark.parametrize(("name", "text"), [
    # a marker, then a comment saying why, then the code
    ("k.cu", "// rocm-parity: ignore[RP104]\n// the ROCm build defines its own, in rocm_defs.h\n#define WARP_SIZE 32\n"),
    ("k.cu", "/* rocm-parity: ignore[RP104]\n   the ROCm build defines its own\n*/\n#define WARP_SIZE 32\n"),
    ("m.py", "# rocm-parity: ignore[RP208]\n# the ROCm branch is in rocm_ops.py\n# (imported instead there)\nWARP_SIZE = 32\n"),
    # a call over several lines: the marker on the mask's line, the finding at the call's line
    ("k.cu", "__device__ float f(float v) {\n  v += __shfl_xor_sync(\n      0xffffffff,  // rocm-parity: ignore[RP101]\n"
             "      v, 1);\n  return v;\n}\n"),
    ("k.cu", "__device__ float f(float v) {\n  v += __shfl_xor_sync(\n      // rocm-parity: ignore[RP101]\n"
             "      0xffffffff, v, 1);\n  return v;\n}\n"),
    ("m.py", "cap = max(\n    torch.cuda.get_device_capability(),\n    (8, 0),  # rocm-parity: ignore[RP220]\n)\n"),
    ("m.py", "cap = max(  # rocm-parity: ignore[RP220]\n    torch.cuda.get_device_capability(),\n    (8, 0),\n)\n"),
])
def test_a_marker_reaches_the_next_code_line_and_its_whole_statement(name: str, text: str) -> None:
    found, counts = _silenced(text, name)
    assert found == [] and sum(counts.values()) == 1, (found, counts)


@pytest.mark.parametrize(("name", "text", "left"), [
    # a blank line ends the comment block the marker is in
    ("k.cu", "// rocm-parity: ignore[RP104]\n\n#define WARP_SIZE 32\n", [("RP104", 3)]),
    # a trailing marker belongs to its own statement, not the next one
    ("k.cu", "int x = 1;  // rocm-parity: ignore[RP104]\n#define WARP_SIZE 32\n", [("RP104", 2)]),
    ("k.cu", "#define A 1  // rocm-parity: ignore[RP104]\nconstexpr int kWarpSize = 32;\n", [("RP104", 2)]),
    ("m.py", "x = 1  # rocm-parity: ignore[RP208]\nWARP_SIZE = 32\n", [("RP208", 2)]),
    # two statements: the marker on the second call's line leaves the first call reported
    ("k.cu", "__device__ float f(float v) {\n  v += __shfl_xor_sync(0xffffffff, v, 1);\n"
             "  v += __shfl_xor_sync(\n      0xffffffff, v, 2);  // rocm-parity: ignore[RP101]\n  return v;\n}\n",
     [("RP101", 2)]),
    # a marker naming another rule
    ("k.cu", "v += __shfl_xor_sync(\n    0xffffffff, v, 1);  // rocm-parity: ignore[RP104]\n", [("RP101", 1)]),
])
def test_a_marker_does_not_reach_other_statements(name: str, text: str, left: list[tuple[str, int]]) -> None:
    assert _silenced(text, name)[0] == left


def test_shell_command_rules_take_linear_time_on_a_long_line() -> None:
    """A path character the look-behind let through ('{' after '{') would make every position a start
    and each start scan to the end of the line: quadratic in a 64 KiB line."""
    line = "echo " + "{" * 65536 + " nvidia-smi\n"
    t0 = time.process_time()
    found = scan.scan_text(line, "a.sh", scan.S)
    assert time.process_time() - t0 < 2.0
    assert [f.rule for f in found] == ["RP230"]


@pytest.mark.parametrize(("text", "kind", "rules"), [
    # the device name read through its properties is the same vendor check as get_device_name's
    ('ok = torch.cuda.get_device_properties(0).name.startswith("NVIDIA")\n', "P", ["RP221"]),
    ('if props.name == "NVIDIA H100":\n    pass\n', "P", ["RP221"]),
    # an AMD tool probed first, nvidia-smi only as the fallback, on one line
    ('smi = shutil.which("amd-smi") or shutil.which("nvidia-smi")\n', "P", []),
    ('smi = shutil.which("nvidia-smi")\n', "P", ["RP215"]),
    ("if command -v amd-smi >/dev/null; then amd-smi static; else nvidia-smi -L; fi\n", "S", []),
    ("nvidia-smi -L\n", "S", ["RP230"]),
    # a capability gate that only a CUDA build reaches
    ("if torch.version.hip is None and torch.cuda.get_device_capability()[0] >= 9:\n    pass\n", "P", []),
    ("if torch.cuda.get_device_capability()[0] >= 9:\n    pass\n", "P", ["RP220"]),
])
def test_vendor_probes_guarded_on_their_line_pass_and_property_name_checks_are_found(text: str, kind: str,
                                                                                     rules: list[str]) -> None:
    name = "m.py" if kind == "P" else "run.sh"
    assert [f.rule for f in scan.scan_text(text, name, getattr(scan, kind))] == rules


@pytest.mark.parametrize(("text", "lines"), [
    ("dev = torch.cuda.get_device_properties(0)\nif dev.major >= 9:\n    pass\n", [2]),
    ("def f():\n    d = get_device_properties(0)\n    return (d.major, d.minor) >= (9, 0)\n", [3]),
    ("props = torch.cuda.get_device_properties(0)\nif props.major >= 9:\n    pass\n", [2]),   # once, not twice
    ("dev = torch.cuda.get_device_properties(0)\nif torch.version.hip is None and dev.major >= 9:\n    pass\n", []),
    ("dev = torch.cuda.get_device_properties(0)\nprint(dev.total_memory)\n", []),
    ("dev = torch.device('cuda')\nv = sys.version_info.major\n", []),
])
def test_a_capability_read_through_any_variable_of_device_properties_is_a_gate(text: str, lines: list[int]) -> None:
    assert [f.line for f in scan.scan_text(text, "m.py", scan.P) if f.rule == "RP220"] == lines
