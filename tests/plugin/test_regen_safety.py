"""Regeneration never replaces a golden silently: reference changes, bad globs, no-op rewrites, duplicate names;
and a forgotten --rocm-parity is said out loud."""
from __future__ import annotations

import json

import pytest

from pytest_rocm_parity.options import ALLOW_REFERENCE_CHANGE, REGEN
from manifest_edits import rewrite_manifest

TWO_TESTS_ONE_NAME = '''
from conftest import make_model, make_inputs

def test_first(parity):
    parity.check(make_model(), make_inputs(), name="same", dtypes=["float32"])

def test_second(parity):
    parity.check(make_model(), make_inputs(), name="same", dtypes=["float32"])
'''


def manifest(p: pytest.Pytester, name: str = "tiny") -> dict:
    return json.loads((p.path / "goldens" / name / "manifest.json").read_text())


def edit_reference(p: pytest.Pytester, **env: str) -> None:
    path = p.path / "goldens" / "tiny" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["reference_env"].update(env)
    rewrite_manifest(path, doc, indent=1, sort_keys=True)


@pytest.mark.parametrize("env, says", [
    ({"backend": "cuda", "device_name": "NVIDIA H200"}, "device kind cuda -> cpu"),
    ({"backend": "rocm", "device_name": "AMD Instinct MI300X"}, "device kind rocm -> cpu"),
    ({"torch": "1.13.1"}, "torch major version 1.13.1 -> 2."),
])
def test_regen_refuses_a_reference_change(project: pytest.Pytester, env: dict, says: str) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    edit_reference(project, **env)
    before = (project.path / "goldens" / "tiny" / "manifest.json").read_text()
    result = project.runpytest("--rocm-parity", f"{REGEN}=tiny")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*ReferenceChange: regenerating 'tiny' would replace the golden*{says}*"
                                 f"{ALLOW_REFERENCE_CHANGE}*"])
    assert (project.path / "goldens" / "tiny" / "manifest.json").read_text() == before
    project.runpytest("--rocm-parity", f"{REGEN}=tiny", ALLOW_REFERENCE_CHANGE).assert_outcomes(passed=1)
    assert manifest(project)["reference_env"]["backend"] == "cpu"


def test_regen_on_the_same_kind_of_machine_is_allowed(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    edit_reference(project, device_name="another CPU", torch="2.0.0")   # same kind, same major version
    monkeypatch.setenv("BUG", "1")
    project.runpytest("--rocm-parity", f"{REGEN}=tiny").assert_outcomes(passed=1)


def test_regen_glob_matching_nothing_is_a_usage_error(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    result = project.runpytest("--rocm-parity", f"{REGEN}=tyni")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {REGEN}='tyni' matched none of the 1 checks this run reached (tiny)*"])
    assert "rocm-parity summary" not in result.stdout.str() and "goldens kept" not in result.stdout.str()


def test_regen_given_a_path_is_a_usage_error(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    before = manifest(project)
    result = project.runpytest("--rocm-parity", REGEN, "test_tiny.py")   # a space where '=' was meant
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {REGEN} took 'test_tiny.py' as the glob*it is a path*"
                                 f"pytest test_tiny.py --rocm-parity {REGEN}*"])
    assert manifest(project) == before


@pytest.mark.parametrize("glob", ["", " "])
def test_an_empty_regen_glob_is_a_usage_error_saying_so(project: pytest.Pytester, glob: str) -> None:
    """``--parity-regen=$MODEL`` with MODEL unset: the glob is empty, not a path; the error names the
    fixes (a name or glob, or the bare flag for every check) and writes nothing."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    before = manifest(project)
    result = project.runpytest("--rocm-parity", f"{REGEN}={glob}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {REGEN}={glob!r}: the glob of check names to regenerate is empty*"
                                 f"{REGEN}='NAME_GLOB', or {REGEN} alone to regenerate the golden of every check*"])
    assert "is a path" not in result.stderr.str() and "  " not in result.stderr.str().strip()
    assert manifest(project) == before


def test_unchanged_golden_is_not_rewritten(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    d = project.path / "goldens" / "tiny"
    files = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in d.iterdir()}
    created = manifest(project)["created"]
    result = project.runpytest("--rocm-parity", f"{REGEN}=tiny")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["goldens unchanged (*): tiny"])
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in d.iterdir()} == files
    assert manifest(project)["created"] == created
    monkeypatch.setenv("BUG", "1")   # a changed model: its golden is rewritten
    result = project.runpytest("--rocm-parity", f"{REGEN}=tiny")
    result.stdout.fnmatch_lines(["goldens updated: tiny"])
    assert {p.name for p in d.iterdir()} != set(files)


def test_regen_over_a_damaged_golden_says_it_rewrote_it(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    rung = next((project.path / "goldens" / "tiny").glob("*.safetensors"))
    size = rung.stat().st_size
    with open(rung, "r+b") as f:   # truncated: its bytes no longer match its content-addressed name
        f.truncate(size // 2)
    result = project.runpytest("--rocm-parity", f"{REGEN}=tiny")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["goldens updated: tiny"])
    assert "unchanged" not in result.stdout.str() and rung.stat().st_size == size


def test_a_damaged_golden_gives_the_command_that_replaces_it(project: pytest.Pytester) -> None:
    """Replay names the damaged file and the regenerate command; capture keeps it (it may be a
    git-lfs pointer whose real file is safe elsewhere), lists it as corrupt and gives that command."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    rung = next((project.path / "goldens" / "tiny").glob("*.safetensors"))
    with open(rung, "r+b") as f:
        f.truncate(rung.stat().st_size // 2)
    replayed = project.runpytest("--rocm-parity")
    replayed.assert_outcomes(failed=1)
    replayed.stdout.fnmatch_lines([f"*GoldenCorrupt: *{rung.name}*restore the committed file (git checkout, or "
                                   f"`git lfs pull`*recapture this golden. On the reference machine: pytest "
                                   f"--rocm-parity --parity-regen='tiny' 'test_tiny.py::test_tiny'"])
    truncated = project.runpytest("--rocm-parity", "--parity-mode=capture", "-rs")   # sizes are checked, not hashes
    truncated.assert_outcomes(skipped=1)
    truncated.stdout.fnmatch_lines(["goldens corrupt (*): tiny", f"*golden for 'tiny' exists but is corrupt (*{rung.name}*"])
    manifest_file = project.path / "goldens" / "tiny" / "manifest.json"
    manifest_file.write_text('{"broken')
    kept = project.runpytest("--rocm-parity", "--parity-mode=capture", "-rs")
    kept.assert_outcomes(skipped=1)
    kept.stdout.fnmatch_lines(["goldens corrupt (*): tiny",
                               "*golden for 'tiny' exists but is corrupt (*manifest is not valid JSON*); capture never "
                               "overwrites: replace it with pytest --rocm-parity --parity-regen='tiny' *"])
    assert manifest_file.read_text() == '{"broken'
    project.runpytest("--rocm-parity", f"{REGEN}=tiny").assert_outcomes(passed=1)
    project.runpytest("--rocm-parity").assert_outcomes(passed=1)


def test_a_shallower_drill_than_the_golden_is_named_as_a_setting_not_a_stale_golden(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    drill = manifest(project)["drill"]
    assert drill > 0
    result = project.runpytest("--rocm-parity", "--parity-drill=0")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*GoldenStale: golden *tiny* was captured at drill {drill}; this run asks for drill 0*"
                                 f"rocm-parity golden derive *{project.path / 'goldens'}* 'tiny' --to NEW_NAME --drill 0 "
                                 "--test *test_tiny.py::test_tiny*, then name the check NEW_NAME (name=)*"])
    assert "layer list changed" not in result.stdout.str()
    project.runpytest("--rocm-parity", f"--parity-drill={drill}").assert_outcomes(passed=1)


def test_a_deeper_drill_than_the_golden_is_captured_by_regeneration_not_derived(project: pytest.Pytester) -> None:
    """derive makes shallower goldens only: a deeper drill's modules were never recorded."""
    project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-drill=0").assert_outcomes(passed=1)
    result = project.runpytest("--rocm-parity", "--parity-drill=1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GoldenStale: golden *tiny* was captured at drill 0; this run asks for drill 1*"
                                 "Replay at drill 0, or capture drill 1 on the reference machine: pytest --rocm-parity "
                                 "--parity-drill=1 --parity-regen='tiny' 'test_tiny.py::test_tiny'"])
    assert "golden derive" not in result.stdout.str()


def test_two_checks_of_one_name_name_both_tests(project: pytest.Pytester) -> None:
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_dup=TWO_TESTS_ONE_NAME)
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*DuplicateCheckName: check name 'same' is used by test_dup.py::test_first and "
                                 "again by test_dup.py::test_second*name=*"])
    # the refused check is in the summary too: no run that failed one reads all-green there
    result.stdout.fnmatch_lines(["ERROR same [[]float32[]]*", "1 check: 0 passed, 0 failed, 1 error*"])


VARIANTS = '''
import pytest
from conftest import make_model, make_inputs

@pytest.mark.parametrize("variant", ["reference", "tanh-gelu"])
def test_port(parity, variant):
    m = make_model()
    if variant == "tanh-gelu":
        m.blocks[1].act.approximate = "tanh"
    parity.check(m, make_inputs(), name="port", dtypes=["float32"])
'''


def test_candidate_variants_replay_one_golden_and_capture_it_once(project: pytest.Pytester) -> None:
    """A migration's variants parametrized over one check name: a replay run judges each against the
    one golden (the buggy one named), within one process and across xdist workers; a capture run
    captures it once and says how to."""
    project.makepyfile(test_port=VARIANTS)
    both = project.runpytest("--rocm-parity", "--parity-mode=capture", "test_port.py")
    both.assert_outcomes(passed=1, failed=1)
    both.stdout.fnmatch_lines(["*DuplicateCheckName: check name 'port' is used by test_port.py::test_port[[]reference[]] "
                               "and again by test_port.py::test_port[[]tanh-gelu[]] in this capture run*"
                               "Capture it from one of the tests (select it with -k*"])
    assert manifest(project, "port")["test"] == "test_port.py::test_port[reference]"   # the first test captured it
    replayed = project.runpytest("--rocm-parity", "test_port.py")
    replayed.assert_outcomes(passed=1, failed=1)
    replayed.stdout.fnmatch_lines(["*culprit: blocks.1.act*"])
    assert "DuplicateCheckName" not in replayed.stdout.str()
    # the failing variant's regenerate line names the test that captured the golden: its own would
    # write the buggy variant's outputs for both
    replayed.stdout.fnmatch_lines(["*regenerate with pytest --rocm-parity --parity-regen='port' "
                                   "'test_port.py::test_port[[]reference[]]'*"])
    # the summary tells the variants' lines apart by their tests
    replayed.stdout.fnmatch_lines(["FAIL port (test_port[[]tanh-gelu[]]) [[]float32[]]*culprit blocks.1.act*",
                                   "PASS port (test_port[[]reference[]]) [[]float32[]]"])
    pytest.importorskip("xdist")
    spread = project.runpytest_subprocess("-n", "2", "--rocm-parity", "test_port.py")
    spread.assert_outcomes(passed=1, failed=1)
    assert "is used by" not in spread.stdout.str()


def test_variants_keep_their_existing_golden_in_later_capture_and_regen_runs(project: pytest.Pytester) -> None:
    """Once the variants' golden exists, a capture run keeps it for each of them, and a regen of another
    name leaves it alone: neither writes it, so no duplicate-name error; a regen that asks for it
    writes it, and is refused as a second writer."""
    project.makepyfile(test_port=VARIANTS)
    project.runpytest("--rocm-parity", "--parity-mode=capture", "-k", "reference").assert_outcomes(passed=1,
                                                                                                 deselected=2)
    before = (project.path / "goldens" / "port" / "manifest.json").read_bytes()
    for args in (["--parity-mode=capture"], [f"{REGEN}=tiny"]):
        result = project.runpytest("--rocm-parity", *args)
        assert "DuplicateCheckName" not in result.stdout.str(), args
        assert result.ret == pytest.ExitCode.OK, args
        result.stdout.fnmatch_lines(["goldens kept (*): *port"])
        assert "port, port" not in result.stdout.str()   # listed once, however many tests kept it
    assert (project.path / "goldens" / "port" / "manifest.json").read_bytes() == before
    both = project.runpytest("--rocm-parity", f"{REGEN}=port")
    both.assert_outcomes(passed=1, failed=1, skipped=1)
    both.stdout.fnmatch_lines(["*DuplicateCheckName: check name 'port' is used by test_port.py::test_port[[]reference[]] "
                               "and again by test_port.py::test_port[[]tanh-gelu[]] in this capture run, which writes*"])
    pytest.importorskip("xdist")
    spread = project.runpytest_subprocess("-n", "2", "--rocm-parity", "--parity-mode=capture", "test_port.py")
    assert spread.ret == pytest.ExitCode.OK
    assert "is used by" not in spread.stdout.str()


RENAMED_VARIANT = '''
import pytest
from conftest import make_model, make_inputs

@pytest.mark.parametrize("variant", ["a", "b"])
def test_port(parity, variant):
    parity.check(make_model(), make_inputs(), name={names}[variant], dtypes=["float32"])
'''


def test_a_test_that_replays_a_shared_golden_made_a_check(project: pytest.Pytester) -> None:
    """Variant b captured 'old', then was changed to replay 'port' beside variant a: b made a check,
    so 'old' is obsolete (its test checks other names), not 'unchecked' (a test that ran without a check)."""
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_port=RENAMED_VARIANT.format(names='{"a": "port", "b": "old"}'))
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=2)
    project.makepyfile(test_port=RENAMED_VARIANT.format(names='{"a": "port", "b": "port"}'))
    replayed = project.runpytest("--rocm-parity")
    replayed.assert_outcomes(passed=2)
    replayed.stdout.fnmatch_lines(["goldens obsolete (*): old"])
    assert "unchecked" not in replayed.stdout.str()


def test_a_check_refused_over_its_arguments_is_an_error_of_the_summary_and_report(project: pytest.Pytester) -> None:
    """A model on the meta device is refused before the check has a spec: it is listed as an error
    in the summary and the JSON report beside the check that ran, named as the check would be."""
    project.makepyfile(test_meta='''
import torch
from conftest import make_inputs

def test_meta(parity):
    with torch.device("meta"):
        m = torch.nn.Linear(8, 8)
    parity.check(m, make_inputs(), name="on-meta", dtypes=["float32"])
''')
    result = project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-report=rep")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["ERROR on-meta [[]float32[]]*", "1 check: 0 passed, 0 failed, 1 error*"])
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    refused = [c for c in doc["checks"] if c["name"] == "on-meta"]
    assert len(refused) == 1 and refused[0]["test"] == "test_meta.py::test_meta" and refused[0]["error"]["kind"] == "error"


def test_a_capture_that_raises_is_an_error_of_the_summary_and_report(project: pytest.Pytester) -> None:
    """A check whose capture raises (the model's forward, or check_lm's own checks of its arguments
    against the model) reached no golden: an error entry, as a replay that raises is."""
    project.makepyfile(test_raises='''
import torch
from conftest import make_inputs

class Broken(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("the forward failed")

def test_raises(parity):
    parity.check(Broken(), make_inputs(), name="broken", dtypes=["float32"])
''')
    result = project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-report=rep")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["ERROR broken [[]float32[]]", "*RuntimeError: the forward failed",
                                 "1 check: 0 passed, 0 failed, 1 error*"])
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    (entry,) = [c for c in doc["checks"] if c["name"] == "broken"]
    assert entry["test"] == "test_raises.py::test_raises" and entry["error"]["kind"] == "error"


def test_two_test_files_of_one_name_in_two_directories_are_told_apart(project: pytest.Pytester) -> None:
    """The default name leaves the directory out: two tests/<dir>/test_model.py clash, and the message
    says why and what to write; replaying one against the other's golden says whose golden it is."""
    (project.path / "test_tiny.py").unlink()
    for d, seed in (("a", 0), ("b", 1)):
        (project.path / d).mkdir()
        (project.path / d / "__init__.py").write_text("")   # packages: pytest collects both files
        (project.path / d / "test_model.py").write_text(f'''
import torch
from conftest import make_model, make_inputs

def test_model(parity):
    torch.manual_seed({seed})
    m = make_model()
    with torch.no_grad():
        m.blocks[0].fc1.weight.add_({seed})
    parity.check(m, make_inputs(), dtypes=["float32"])
''')
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*DuplicateCheckName: check name 'test_model.py::test_model' is used by "
                                 "a/test_model.py::test_model and again by b/test_model.py::test_model*Both tests "
                                 "default to this name*name='b/test_model.py::test_model'*"])
    replayed = project.runpytest("--rocm-parity", "b")
    replayed.assert_outcomes(failed=1)
    replayed.stdout.fnmatch_lines(["*GoldenStale: stale golden*the model's weights changed* It was captured by "
                                   "a/test_model.py::test_model, and this check runs in b/test_model.py::test_model*"
                                   "own name= instead of regenerating. Regenerate*"])


def test_a_regen_from_one_folder_does_not_take_over_a_golden_another_folder_s_test_replays(
        project: pytest.Pytester) -> None:
    """CI jobs run per folder: b's test, whose inputs differ from a's, finds a's golden stale and is
    told whose it is; regenerating from b alone would replace a's golden, so it is refused with the
    fix, unless the reference change is asked for."""
    (project.path / "test_tiny.py").unlink()
    for d, n in (("a", 2), ("b", 3)):
        (project.path / d).mkdir()
        (project.path / d / "__init__.py").write_text("")
        (project.path / d / "test_model.py").write_text(f'''
import torch
from conftest import make_model

def test_model(parity):
    parity.check(make_model(), torch.randint(0, 40, ({n}, 8), generator=torch.Generator().manual_seed(0)),
                 dtypes=["float32"])
''')
    project.runpytest("--rocm-parity", "--parity-mode=capture", "a").assert_outcomes(passed=1)
    (golden,) = (project.path / "goldens").iterdir()
    before = {f.name: f.read_bytes() for f in golden.iterdir()}
    replayed = project.runpytest("--rocm-parity", "b")
    replayed.assert_outcomes(failed=1)
    replayed.stdout.fnmatch_lines(["*GoldenStale: stale golden*input args.0: shape (3, 8) vs stored (2, 8). It was "
                                   "captured by a/test_model.py::test_model, and this check runs in "
                                   "b/test_model.py::test_model*own name= instead of regenerating*"])
    regen = project.runpytest("b", "--rocm-parity", REGEN)
    regen.assert_outcomes(failed=1)
    regen.stdout.fnmatch_lines(["*ReferenceChange: regenerating 'test_model.py::test_model' from "
                                "b/test_model.py::test_model would replace the golden at*, which "
                                "a/test_model.py::test_model captured and which that test still replays*"
                                "(the default leaves the directory out). Regenerate it from a/test_model.py::test_model "
                                "(pytest --rocm-parity --parity-regen='test_model.py::test_model' "
                                "'a/test_model.py::test_model')*"])
    # a refused write is a check without a verdict: the summary lists it as an error, not as nothing
    regen.stdout.fnmatch_lines(["ERROR test_model.py::test_model [[]float32[]]*", "*1 error*"])
    assert {f.name: f.read_bytes() for f in golden.iterdir()} == before
    project.runpytest("--rocm-parity", "a").assert_outcomes(passed=1)
    moved = project.runpytest("b", "--rocm-parity", "--parity-allow-reference-change", REGEN)
    moved.assert_outcomes(passed=1)
    assert json.loads((golden / "manifest.json").read_text())["test"] == "b/test_model.py::test_model"


def test_one_regen_command_rewrites_every_stale_check_of_a_test(project: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A test with two checks of default names, whose inputs changed: the replay stops at the first
    stale one and gives its command, which regenerates the test's second check (NAME#2) too."""
    project.makepyfile(test_two='''
import os
import torch
from conftest import make_model

def test_two(parity):
    n = int(os.environ.get("TOKENS", "8"))
    x = torch.randint(0, 40, (2, n), generator=torch.Generator().manual_seed(0))
    parity.check(make_model(), x, dtypes=["float32"])
    parity.check(make_model(), x[:1], dtypes=["float32"])
''')
    project.runpytest("--rocm-parity", "--parity-mode=capture", "test_two.py").assert_outcomes(passed=1)
    monkeypatch.setenv("TOKENS", "6")
    stale = project.runpytest("--rocm-parity", "test_two.py")
    stale.assert_outcomes(failed=1)
    line = next(l for l in stale.stdout.lines if "--parity-regen=" in l)
    glob = line[line.index("--parity-regen="):].split()[0]
    assert glob == "--parity-regen='test_two.py::test_two'", line
    regen = project.runpytest("test_two.py", "--rocm-parity", "--parity-regen=test_two.py::test_two")
    regen.assert_outcomes(passed=1)
    regen.stdout.fnmatch_lines(["goldens updated: test_two.py::test_two, test_two.py::test_two#2"])
    project.runpytest("--rocm-parity", "test_two.py").assert_outcomes(passed=1)


def test_one_test_reusing_a_name_is_refused(project: pytest.Pytester) -> None:
    project.makepyfile(test_tiny='''
from conftest import make_model, make_inputs

def test_tiny(parity):
    for _ in range(2):
        parity.check(make_model(), make_inputs(), name="tiny", dtypes=["float32"])
''')
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*DuplicateCheckName: check name 'tiny' is used twice by test_tiny.py::test_tiny*"])


@pytest.mark.parametrize("flag", ["--parity-mode=replay", "--parity-golden-dir=goldens", "--parity-regen",
                                  "--parity-drill=0", "--parity-golden-size-limit=0"])
def test_parity_options_without_enable_warn(project: pytest.Pytester, flag: str) -> None:
    result = project.runpytest(flag)
    result.assert_outcomes(skipped=1, warnings=1)
    result.stdout.fnmatch_lines([f"*PytestWarning: rocm-parity: {flag.split('=')[0]} given without --rocm-parity: "
                                 f"ignored*Add --rocm-parity*"])


def test_parity_options_without_enable_fail_under_ci(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = project.runpytest("--parity-mode=replay")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: rocm-parity: --parity-mode given without --rocm-parity*CI=true*the parity "
                                 "tests would be skipped*(counted at collection: 1, *request.getfixturevalue*)"])
    project.runpytest().assert_outcomes(skipped=1)   # no parity option given: the plain skip
    # --parity-device alone is not warned about (parity_ops honours it), but under CI=true it skips
    # the parity tests a job that names a candidate device meant to run
    device = project.runpytest("--parity-device=cpu")
    assert device.ret == pytest.ExitCode.USAGE_ERROR
    device.stderr.fnmatch_lines(["ERROR: rocm-parity: --parity-device given without --rocm-parity*the parity tests "
                                 "would be skipped*"])


DYNAMIC_ONLY = '''
from conftest import make_model, make_inputs

def test_dynamic(request):
    parity = request.getfixturevalue("parity")
    parity.check(make_model(), make_inputs(), name="tiny", dtypes=["float32"])
'''


def test_a_test_that_takes_parity_through_getfixturevalue_fails_under_ci_without_enable(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Collection cannot see request.getfixturevalue("parity"): such a test, skipped, would let a CI job
    with --parity-* options but without --rocm-parity pass; it fails when it asks for the fixture."""
    project.makepyfile(test_tiny=DYNAMIC_ONLY)
    monkeypatch.setenv("CI", "true")
    result = project.runpytest("--parity-mode=replay")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*rocm-parity: --parity-mode given without --rocm-parity*Under CI=true this fails "
                                 "the test*"])
    project.runpytest().assert_outcomes(skipped=1)   # no parity option given: the plain skip


def test_parity_device_alone_is_for_parity_ops(project: pytest.Pytester) -> None:
    result = project.runpytest("--parity-device=cpu")
    result.assert_outcomes(skipped=1)
    assert "given without --rocm-parity" not in result.stdout.str()
