"""--parity-prune-obsolete: only goldens a complete, passing run proves obsolete; only directories of ours."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_rocm_parity.options import ALLOW_WRITE, PRUNE, PRUNE_DRY_RUN
from manifest_edits import rewrite_manifest

TEST_A = '''
from conftest import make_model, make_inputs

def test_alpha(parity):
    parity.check(make_model(), make_inputs(), name="{name}", dtypes=["float32"])

def test_other(parity):
    parity.check(make_model(), make_inputs(), name="other", dtypes=["float32"])
'''

TEST_B = '''
from conftest import make_model, make_inputs

def test_beta(parity):
    parity.check(make_model(), make_inputs(), name="beta", dtypes=["float32"])
'''


@pytest.fixture
def renamed(project: pytest.Pytester) -> pytest.Pytester:
    """Goldens alpha, other (test_a.py) and beta (test_b.py); then test_a's check renamed to alpha2.

    So 'alpha' is obsolete, which only a run that completes test_a.py can know.
    """
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_a=TEST_A.format(name="alpha"), test_b=TEST_B)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=3)
    project.makepyfile(test_a=TEST_A.format(name="alpha2"))
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1, skipped=2)
    return project


def goldens(p: pytest.Pytester) -> set[str]:
    return {d.name for d in (p.path / "goldens").iterdir()}


def test_prune_deletes_the_obsolete_golden_and_prints_its_paths(renamed: pytest.Pytester) -> None:
    result = renamed.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=3)
    assert goldens(renamed) == {"alpha2", "other", "beta"}
    d = renamed.path / "goldens" / "alpha"
    result.stdout.fnmatch_lines([f"rocm-parity: deleted {d / 'manifest.json'}",
                                 f"rocm-parity: deleted {d}/float32-*.safetensors",
                                 f"rocm-parity: deleted {d}"])


def test_subset_of_files_never_touches_the_others(renamed: pytest.Pytester) -> None:
    result = renamed.runpytest("--rocm-parity", PRUNE, "test_b.py")
    result.assert_outcomes(passed=1)
    assert "alpha" in goldens(renamed)
    assert "goldens obsolete" not in result.stdout.str()   # alpha's file did not run: nothing proves it obsolete


def test_a_subset_of_files_prunes_within_them(renamed: pytest.Pytester) -> None:
    result = renamed.runpytest("--rocm-parity", PRUNE, "test_a.py")
    result.assert_outcomes(passed=2)
    assert goldens(renamed) == {"alpha2", "other", "beta"}


@pytest.mark.parametrize("args", [["-k", "alpha"], ["-k", "not beta"], ["test_a.py::test_alpha", "test_a.py::test_other"],
                                  ["--lf"], ["--deselect", "test_b.py::test_beta"]],
                         ids=["k", "k-other-file", "node-ids", "lf", "deselect"])
def test_partial_selection_prunes_nothing(renamed: pytest.Pytester, args: list[str]) -> None:
    result = renamed.runpytest("--rocm-parity", PRUNE, *args)
    assert "alpha" in goldens(renamed)
    assert "rocm-parity: deleted" not in result.stdout.str()
    if "goldens obsolete" in result.stdout.str():
        result.stdout.fnmatch_lines([f"*{PRUNE} deleted no obsolete golden: this run was a partial selection*"])


def test_failed_run_prunes_nothing_and_a_failing_file_is_not_obsolete(renamed: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    renamed.makepyfile(test_b=TEST_B + '''

def test_plain_failure():
    assert False
''')
    result = renamed.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=3, failed=1)
    assert "alpha" in goldens(renamed)
    result.stdout.fnmatch_lines([f"*{PRUNE} deleted no obsolete golden: the run did not pass (exit status 1)*"])
    dry = renamed.runpytest("--rocm-parity", PRUNE, "--parity-prune-dry-run")
    dry.stdout.fnmatch_lines([f"*{PRUNE} would delete no obsolete golden: the run did not pass (exit status 1)*"])
    # a parity test that fails may not have reached every check of its test: its file proves nothing
    monkeypatch.setenv("BUG", "1")
    result = renamed.runpytest("--rocm-parity", PRUNE, "test_a.py")
    result.assert_outcomes(failed=2)
    assert "goldens obsolete" not in result.stdout.str()


def test_stopped_run_prunes_nothing(renamed: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUG", "1")
    result = renamed.runpytest("--rocm-parity", PRUNE, "-x")
    result.assert_outcomes(failed=1)
    assert "alpha" in goldens(renamed)


def test_interrupted_run_prunes_nothing(renamed: pytest.Pytester) -> None:
    renamed.makepyfile(test_c='''
def test_interrupt():
    raise KeyboardInterrupt
''')
    result = renamed.runpytest("--rocm-parity", PRUNE, no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "alpha" in goldens(renamed)


def test_skipped_parity_test_makes_its_file_incomplete(renamed: pytest.Pytester) -> None:
    renamed.makepyfile(test_a=TEST_A.format(name="alpha2").replace(
        "def test_other(parity):", "import pytest\n\n@pytest.mark.skip(reason='no GPU here')\ndef test_other(parity):"))
    result = renamed.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=2, skipped=1)
    assert goldens(renamed) == {"alpha", "alpha2", "other", "beta"}


DYNAMIC = '''
import os
import pytest
from conftest import make_model, make_inputs

def test_static(parity):
    parity.check(make_model(), make_inputs(), name="static", dtypes=["float32"])

def test_dynamic(request):
    if os.environ.get("SKIP_DYNAMIC"):
        pytest.skip("GPU only")
    parity = request.getfixturevalue("parity")
    parity.check(make_model(), make_inputs(), name="dynamic", dtypes=["float32"])
'''


def test_a_skipped_test_that_takes_parity_through_getfixturevalue_keeps_its_golden(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """No collection-time look sees request.getfixturevalue("parity"): the skipped test still makes its
    file prove nothing, and its golden is neither listed obsolete nor pruned."""
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_dyn=DYNAMIC)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=2)
    monkeypatch.setenv("SKIP_DYNAMIC", "1")
    result = project.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=1, skipped=1)
    assert goldens(project) == {"static", "dynamic"}
    assert "goldens obsolete" not in result.stdout.str() and "rocm-parity: deleted" not in result.stdout.str()
    monkeypatch.delenv("SKIP_DYNAMIC")
    project.runpytest("--rocm-parity", PRUNE).assert_outcomes(passed=2)
    assert goldens(project) == {"static", "dynamic"}


def test_prune_only_deletes_directories_with_our_marker(renamed: pytest.Pytester) -> None:
    g = renamed.path / "goldens"
    m = g / "alpha" / "manifest.json"
    doc = json.loads(m.read_text())
    assert doc["tool"] == "pytest-rocm-parity"      # every golden written carries the marker
    del doc["tool"]
    rewrite_manifest(m, doc)
    # a directory that merely holds a manifest.json naming a test of a complete file
    stranger = g / "notes"
    stranger.mkdir()
    rewrite_manifest(stranger / "manifest.json", {**doc, "name": "something-else"})
    result = renamed.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=3)
    assert {"alpha", "notes"} <= goldens(renamed)
    assert m.exists() and (stranger / "manifest.json").exists()
    result.stdout.fnmatch_lines([f"*not deleted: {g / 'alpha'}: its manifest lacks*"])


def test_prune_leaves_files_it_did_not_write(renamed: pytest.Pytester) -> None:
    notes = renamed.path / "goldens" / "alpha" / "README.txt"
    notes.write_text("kept by hand")
    renamed.runpytest("--rocm-parity", PRUNE).assert_outcomes(passed=3)
    assert notes.read_text() == "kept by hand"
    assert sorted(p.name for p in notes.parent.iterdir()) == ["README.txt"]


def test_prune_obeys_the_ci_write_guard(renamed: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = renamed.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=3)
    assert "alpha" in goldens(renamed)
    result.stdout.fnmatch_lines([f"*deleted no obsolete golden: CI=true*{ALLOW_WRITE}*"])
    renamed.runpytest("--rocm-parity", PRUNE, ALLOW_WRITE).assert_outcomes(passed=3)
    assert "alpha" not in goldens(renamed)


def test_dry_run_lists_and_keeps(renamed: pytest.Pytester) -> None:
    d = renamed.path / "goldens" / "alpha"
    result = renamed.runpytest("--rocm-parity", PRUNE, PRUNE_DRY_RUN)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"rocm-parity: would delete {d / 'manifest.json'}",
                                 f"rocm-parity: would delete {d}/float32-*.safetensors"])
    assert "alpha" in goldens(renamed)


def test_a_run_that_collected_no_tests_says_so_instead_of_no_obsolete_goldens(renamed: pytest.Pytester) -> None:
    """Run from a folder of no tests (inside goldens/, say), prune proves nothing: it must not report
    a clean directory while 'alpha' is obsolete."""
    (renamed.path / "empty").mkdir()
    result = renamed.runpytest("--rocm-parity", PRUNE, PRUNE_DRY_RUN, "empty")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines([f"rocm-parity: {PRUNE} would delete no obsolete golden: the run ran no tests*rootdir*"])
    assert "no obsolete goldens" not in result.stdout.str() and "alpha" in goldens(renamed)


def test_obsolete_line_names_only_proven_goldens(renamed: pytest.Pytester) -> None:
    result = renamed.runpytest("--rocm-parity")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["goldens obsolete (*): alpha"])
    report = renamed.runpytest("--rocm-parity", "test_b.py", "--parity-report=rep")
    assert "goldens obsolete" not in report.stdout.str()
    assert json.loads((renamed.path / "rep" / "parity-report.json").read_text())["goldens"]["obsolete"] == []


def test_cli_golden_prune_dry_run(renamed: pytest.Pytester) -> None:
    """`rocm-parity golden prune --dry-run GOLDEN_DIR` runs the suite and lists what it would delete."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    env.pop("CI", None)
    cmd = [sys.executable, "-c", "import sys; from pytest_rocm_parity.cli import main; sys.exit(main())",
           "golden", "prune", "--dry-run", "goldens", "--", "-p", "no:cacheprovider", "-q"]
    proc = subprocess.run(cmd, cwd=renamed.path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = renamed.path / "goldens" / "alpha"
    assert f"rocm-parity: would delete {d / 'manifest.json'}" in proc.stdout
    assert "alpha" in goldens(renamed)
    assert "beta" not in proc.stdout.split("would delete", 1)[1]


def test_goldens_of_a_deleted_test_file_are_obsolete(renamed: pytest.Pytester) -> None:
    """A whole-suite run proves a golden of a test file that no longer exists obsolete; a run of named
    files does not, and says why it kept it."""
    (renamed.path / "test_b.py").unlink()
    result = renamed.runpytest("--rocm-parity", PRUNE, PRUNE_DRY_RUN, "test_a.py")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["rocm-parity: kept 'beta': its test file test_b.py is gone, but this run did not "
                                 "run the whole suite unfiltered*"])
    (line,) = [l for l in result.outlines if l.startswith("goldens obsolete")]
    assert line.endswith(": alpha"), line   # test_a.py was collected whole; beta's file was not
    result = renamed.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["goldens obsolete (*): alpha, beta",
                                 f"rocm-parity: deleted {renamed.path / 'goldens' / 'beta' / 'manifest.json'}"])
    assert goldens(renamed) == {"alpha2", "other"}


def test_a_deleted_file_does_not_make_an_existing_incomplete_file_obsolete(renamed: pytest.Pytester,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (renamed.path / "test_b.py").unlink()
    monkeypatch.setenv("BUG", "1")   # test_a.py's parity tests fail: its goldens prove nothing
    result = renamed.runpytest("--rocm-parity")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["goldens obsolete (*): beta"])


KILLED_AFTER_CAPTURE = '''
import os, signal
from conftest import make_model, make_inputs

def test_{name}(parity):
    parity.check(make_model(), make_inputs(), name="{name}", dtypes=["float32"])
    if os.environ.get("KILL"):
        os.kill(os.getpid(), signal.SIGKILL)   # staged, never committed: no handler runs
'''


def test_files_a_killed_capture_left_are_listed_and_pruned(project: pytest.Pytester) -> None:
    """SIGKILL between staging and commit: no manifest names the staged tensor files. The golden that
    was there stays intact; the next run lists the files, prune deletes them (and the directory a first
    capture made), even after a run that proves nothing obsolete."""
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_kept=KILLED_AFTER_CAPTURE.format(name="kept"),
                       test_fresh=KILLED_AFTER_CAPTURE.format(name="fresh"))
    project.runpytest("--rocm-parity", "--parity-mode=capture", "test_kept.py").assert_outcomes(passed=1)
    kept = project.path / "goldens" / "kept"
    before = {p.name: p.read_bytes() for p in kept.iterdir()}
    env = {**os.environ, "KILL": "1", "BUG": "1", "PYTHONPATH": str(project.path)}
    for args in (["--parity-regen=kept", "test_kept.py"], ["test_fresh.py"]):
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rocm-parity",
                        "--parity-mode=capture", *args], cwd=project.path, env=env, capture_output=True)
    orphans = sorted(p for p in (project.path / "goldens").rglob("*.safetensors") if p.name not in before)
    assert len(orphans) == 2 and not (project.path / "goldens" / "fresh" / "manifest.json").exists()
    assert {p.name: p.read_bytes() for p in kept.iterdir() if p.name in before} == before   # intact
    listed = project.runpytest("--rocm-parity", "test_kept.py")
    listed.assert_outcomes(passed=1)
    listed.stdout.fnmatch_lines(["leftover files (no manifest names them: a stopped capture's, a file a regeneration replaced while "
                                 "another run was reading it, or a golden's whose "
                                 "manifest.json is gone, which git checkout restores; --parity-prune-obsolete "
                                 "deletes): *"])
    dry = project.runpytest("--rocm-parity", PRUNE, PRUNE_DRY_RUN, "test_kept.py")
    dry.stdout.fnmatch_lines([f"rocm-parity: would delete {orphans[0]} (left by a capture that was stopped*"])
    assert all(p.exists() for p in orphans)
    pruned = project.runpytest("--rocm-parity", PRUNE, "test_kept.py")   # a partial run: nothing proven obsolete
    pruned.stdout.fnmatch_lines([f"rocm-parity: deleted {orphans[0]} (left by*"])
    assert not any(p.exists() for p in orphans) and not (project.path / "goldens" / "fresh").exists()
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == before
    assert "leftover files" not in project.runpytest("--rocm-parity", "test_kept.py").stdout.str()


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    env.pop("CI", None)
    cmd = [sys.executable, "-c", "import sys; from pytest_rocm_parity.cli import main; sys.exit(main())", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_prune_from_another_projects_folder_deletes_nothing(renamed: pytest.Pytester) -> None:
    """`rocm-parity golden prune DIR` run from a folder whose suite passes but has none of these
    goldens' test files: a run with no check of them proves no test file deleted."""
    other = renamed.path / "otherproj"
    other.mkdir()
    (other / "pytest.ini").write_text("[pytest]\n")
    (other / "test_trivial.py").write_text("def test_ok():\n    assert True\n")
    before = goldens(renamed)
    proc = _cli(other, "golden", "prune", str(renamed.path / "goldens"), "--", "-p", "no:cacheprovider", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert goldens(renamed) == before and "rocm-parity: deleted" not in proc.stdout, proc.stdout


def test_prune_from_a_folder_of_no_tests_says_only_that(renamed: pytest.Pytester, tmp_path: Path) -> None:
    """Run from a folder with no tests, whose rootdir holds none of the goldens' test files: one line
    says the run proves nothing and where to run it, not a line per golden calling its test file gone."""
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    before = goldens(renamed)
    proc = _cli(empty, "golden", "prune", "--dry-run", str(renamed.path / "goldens"), "--", "-p", "no:cacheprovider")
    assert goldens(renamed) == before
    assert "the run ran no tests" in proc.stdout and "rootdir" in proc.stdout, proc.stdout
    assert "is gone" not in proc.stdout, proc.stdout


def test_ignored_paths_make_no_missing_test_file_a_deleted_one(renamed: pytest.Pytester) -> None:
    """test_b.py moved under an ignored folder: its golden still names the old path, which is gone
    from the rootdir; --ignore narrowed the suite, so that proves nothing."""
    (renamed.path / "slow").mkdir()
    (renamed.path / "test_b.py").rename(renamed.path / "slow" / "test_b.py")
    result = renamed.runpytest("--rocm-parity", PRUNE, "--ignore=slow")
    result.assert_outcomes(passed=2)
    assert "beta" in goldens(renamed) and "alpha" not in goldens(renamed)


def test_tests_a_conftest_drops_without_deselecting_make_their_file_partial(renamed: pytest.Pytester) -> None:
    """A sharding plugin or an environment filter that removes items from the list: test_other's
    golden is not obsolete because its test did not run here."""
    with (renamed.path / "conftest.py").open("a") as f:
        f.write("\n\ndef pytest_collection_modifyitems(items):\n"
                "    items[:] = [i for i in items if i.name != 'test_other']\n")
    result = renamed.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=2)
    assert "other" in goldens(renamed) and "alpha" in goldens(renamed)
    result.stdout.fnmatch_lines(["*partial selection (tests removed from the collection by a plugin or conftest)*"])


def test_a_golden_directory_that_cannot_be_written_is_a_line_not_a_traceback(renamed: pytest.Pytester,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only golden directory (a mount, a checkout without write permission)."""
    from pytest_rocm_parity.golden.store import GoldenStore

    def read_only(self: GoldenStore, d: Path, dry_run: bool = False) -> list[Path]:
        raise OSError(30, "Read-only file system", str(d / "manifest.json"))
    monkeypatch.setattr(GoldenStore, "delete", read_only)
    result = renamed.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=3)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["rocm-parity: could not delete */goldens/alpha: *Read-only file system*"])
    assert "alpha" in goldens(renamed)


def test_a_regen_run_says_why_it_kept_the_goldens_it_did_not_match(renamed: pytest.Pytester) -> None:
    result = renamed.runpytest("--rocm-parity", "--parity-regen=beta", "--parity-mode=capture")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["goldens kept (exists; --parity-regen=beta does not match them): alpha2, other"])
    plain = renamed.runpytest("--rocm-parity", "--parity-mode=capture")
    plain.stdout.fnmatch_lines(["goldens kept (exists; use --parity-regen): *"])


TEST_C = '''
from conftest import make_model, make_inputs

def test_gamma(parity):
    parity.check(make_model(), make_inputs(), name="alpha-lean", dtypes=["float32"], drill=0)
'''


@pytest.mark.parametrize("owner", [None, "test_c.py::test_gamma"])
def test_a_derived_golden_another_file_uses_survives_a_prune_of_its_sources_file(
        project: pytest.Pytester, owner: str | None) -> None:
    """A golden derived from test_a's and used by test_c.py: a complete run of test_a.py does not
    prove it obsolete (derive records the owner named by --test, or none; never the source's test);
    a run of test_c.py that no longer uses it does, when it has that owner."""
    from pytest_rocm_parity.cli import main as cli_main

    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_a=TEST_A.format(name="alpha"))
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=2)
    argv = ["golden", "derive", str(project.path / "goldens"), "alpha", "--to", "alpha-lean", "--drill", "0"]
    assert cli_main(argv + (["--test", owner] if owner else [])) == 0
    project.makepyfile(test_c=TEST_C)
    project.runpytest("--rocm-parity", "test_c.py").assert_outcomes(passed=1)
    project.runpytest("--rocm-parity", PRUNE, "test_a.py").assert_outcomes(passed=2)
    assert "alpha-lean" in goldens(project)
    project.runpytest("--rocm-parity", "test_c.py").assert_outcomes(passed=1)
    project.makepyfile(test_c=TEST_C.replace('name="alpha-lean", ', 'name="alpha", ').replace(", drill=0", ""))
    project.runpytest("--rocm-parity", PRUNE, "test_c.py").assert_outcomes(passed=1)
    assert ("alpha-lean" in goldens(project)) is (owner is None)


TEST_WEIGHTS_CHANGED = '''
import torch
from conftest import make_model, make_inputs

def test_tiny(parity):
    model = make_model()
    with torch.no_grad():
        model.head.weight.mul_(1.01)
    parity.check(model, make_inputs(), name="tiny", dtypes=["float32"])
'''


def test_a_capture_run_says_which_kept_goldens_no_longer_match_their_check(project: pytest.Pytester) -> None:
    """Capture never overwrites; a golden it keeps that a replay would refuse as stale (the model's
    weights changed) is listed as stale with the reason and the regen command, not as merely kept."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    same = project.runpytest("--rocm-parity", "--parity-mode=capture", "-rs")
    same.stdout.fnmatch_lines(["goldens kept (exists; use --parity-regen): tiny"])
    project.makepyfile(test_tiny=TEST_WEIGHTS_CHANGED)
    changed = project.runpytest("--rocm-parity", "--parity-mode=capture", "-rs")
    changed.assert_outcomes(skipped=1)
    changed.stdout.fnmatch_lines(["*kept, and no longer matches this check: stale golden */tiny/manifest.json for "
                                  "'tiny': the model's weights changed: *Regenerate *--parity-regen='tiny'*"])
    changed.stdout.fnmatch_lines(["goldens stale (*--parity-regen rewrites them): tiny"])
    assert "goldens kept" not in changed.stdout.str()


TEST_INPUTS_CHANGED = '''
import torch
from conftest import make_model

def test_tiny(parity):
    ids = torch.randint(0, 40, {shape}, generator=torch.Generator().manual_seed({seed}))
    parity.check(make_model(), ids, name="tiny", dtypes=["float32"])
'''


@pytest.mark.parametrize("shape,seed,why", [("(2, 9)", 0, "input args.0: shape (2, 9) vs stored (2, 8)"),
                                            ("(2, 8)", 5, "input args.0: values differ from the stored inputs")],
                         ids=["shape", "values"])
def test_a_capture_run_says_a_kept_golden_was_captured_on_other_inputs(project: pytest.Pytester, shape: str,
                                                                       seed: int, why: str) -> None:
    """The test now builds other inputs: a replay would refuse the golden as stale, so the capture
    run that keeps it lists it as stale and says why, not as merely kept."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.makepyfile(test_tiny=TEST_INPUTS_CHANGED.format(shape=shape, seed=seed))
    changed = project.runpytest("--rocm-parity", "--parity-mode=capture", "-rs")
    changed.assert_outcomes(skipped=1)
    changed.stdout.fnmatch_lines([f"*kept, and no longer matches this check: stale golden */tiny/manifest.json for "
                                  f"'tiny': {why}*--parity-regen='tiny'*"])
    changed.stdout.fnmatch_lines(["goldens stale (*--parity-regen rewrites them): tiny"])


SHARED_TEST = '''
import torch

def test_{name}(parity):
    torch.manual_seed(0)
    parity.check(torch.nn.Linear(4, 3), torch.ones(2, 4), name="{name}", dtypes=["float32"])
'''


def test_a_golden_dir_shared_by_two_projects_keeps_the_other_projects_goldens(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Projects a and b (both with tests/) capture into one golden directory outside both. A whole,
    passing run of a with prune deletes a's obsolete golden and none of b's, whose test file is not in
    a, and says why it kept them; so too for a golden of b's that records no project."""
    shared = pytester.path / "shared"
    for project, name in (("a", "alpha"), ("b", "beta")):
        (pytester.path / project / "tests").mkdir(parents=True)
        (pytester.path / project / "pytest.ini").write_text(f"[pytest]\nparity_golden_dir = {shared}\n")
        (pytester.path / project / "tests" / f"test_{name}.py").write_text(SHARED_TEST.format(name=name))
        monkeypatch.chdir(pytester.path / project)
        pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    assert json.loads((shared / "beta" / "manifest.json").read_text())["project"] == "../b"
    monkeypatch.chdir(pytester.path / "a")
    (pytester.path / "a" / "tests" / "test_alpha.py").write_text(SHARED_TEST.format(name="alpha2"))
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    result = pytester.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=1)
    assert {d.name for d in shared.iterdir()} == {"alpha2", "beta"}
    result.stdout.fnmatch_lines(["goldens obsolete (*): alpha",
                                 "rocm-parity: kept 'beta': its manifest records the project at '../b'*, and this "
                                 "run's is at '../a': a golden directory shared with another project*"])
    m = shared / "beta" / "manifest.json"
    rewrite_manifest(m, {k: v for k, v in json.loads(m.read_text()).items() if k != "project"})
    result = pytester.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=1)
    assert m.exists()
    result.stdout.fnmatch_lines(["rocm-parity: kept 'beta': its manifest does not record which project captured it "
                                 "*outside this project's rootdir*"])


FLAGGED = '''
import os
from conftest import make_model, make_inputs

def test_flagged(parity):
    if os.environ.get("SKIP_CHECK"):
        return   # a feature flag: the check is off for now
    parity.check(make_model(), make_inputs(), name="flagged", dtypes=["float32"])

def test_other(parity):
    parity.check(make_model(), make_inputs(), name="other", dtypes=["float32"])
'''


def test_a_golden_whose_test_returned_early_is_kept_and_said_unchecked(project: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Its test was collected and passed without any check (a return behind a feature flag): the golden
    is not obsolete, prune keeps it and says why; once the test checks another name, it is obsolete."""
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_flagged=FLAGGED)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=2)
    monkeypatch.setenv("SKIP_CHECK", "1")
    result = project.runpytest("--rocm-parity", PRUNE, "--parity-report=rep")
    result.assert_outcomes(passed=2)
    assert (project.path / "goldens" / "flagged" / "manifest.json").exists()
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    assert doc["goldens"]["unchecked"] == ["flagged"] and doc["goldens"]["obsolete"] == []
    assert "<tr><td>unchecked</td><td>flagged</td></tr>" in (project.path / "rep" / "parity-report.html").read_text()
    out = result.stdout.str()
    assert "goldens obsolete" not in out and "deleted" not in out.replace("deleted no", "")
    result.stdout.fnmatch_lines([
        "goldens unchecked (their test ran and passed without checking them: it made no check*): flagged",
        "rocm-parity: kept 'flagged': its test test_flagged.py::test_flagged ran and passed without checking it*"])
    monkeypatch.delenv("SKIP_CHECK")
    project.makepyfile(test_flagged=FLAGGED.replace('name="flagged"', 'name="flagged2"'))
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1, skipped=1)
    result = project.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["goldens obsolete (*their test is gone or checks other names*): flagged"])
    assert goldens(project) == {"flagged2", "other"}


NIGHTLY = '''
import os
from conftest import make_model, make_inputs

def test_model(parity):
    parity.check(make_model(), make_inputs(), name="base", dtypes=["float32"])
    if os.environ.get("NIGHTLY"):   # a longer check only the nightly job makes
        parity.check(make_model(), make_inputs(), name="long", dtypes=["float32"])
'''


def test_a_check_behind_a_condition_is_kept_when_its_test_checks_another(project: pytest.Pytester,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that always checks one name and, in the nightly job, a second: a run without the
    nightly variable does not make the second check, yet its file still names it, so its golden is
    unchecked and kept, not obsolete and pruned."""
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_nightly=NIGHTLY)
    monkeypatch.setenv("NIGHTLY", "1")
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.delenv("NIGHTLY")
    result = project.runpytest("--rocm-parity", PRUNE)
    result.assert_outcomes(passed=1)
    assert goldens(project) == {"base", "long"}
    out = result.stdout.str()
    assert "goldens obsolete" not in out, out
    result.stdout.fnmatch_lines([
        "goldens unchecked (*): long",
        "rocm-parity: kept 'long': its test test_nightly.py::test_model ran and passed without checking it, and "
        "test_nightly.py still names 'long'*"])


def test_a_run_that_names_the_testpaths_is_the_whole_suite(renamed: pytest.Pytester) -> None:
    """``pytest tests`` where the ini's testpaths is ``tests`` collects what a bare ``pytest`` does:
    a golden of a deleted test file there is obsolete; naming one file of it is not the whole suite."""
    tests = renamed.path / "tests"
    tests.mkdir()
    for f in ("test_a.py", "test_b.py"):
        (renamed.path / f).rename(tests / f)
    (renamed.path / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    for d in ("alpha", "other", "beta", "alpha2"):   # the owners' node ids moved with the files
        m = renamed.path / "goldens" / d / "manifest.json"
        rewrite_manifest(m, json.loads(m.read_text().replace('"test_a.py::', '"tests/test_a.py::')
                                       .replace('"test_b.py::', '"tests/test_b.py::')))
    (tests / "test_b.py").unlink()
    result = renamed.runpytest("--rocm-parity", PRUNE, PRUNE_DRY_RUN, "tests/test_a.py")
    result.stdout.fnmatch_lines(["rocm-parity: kept 'beta': its test file tests/test_b.py is gone*"])
    result = renamed.runpytest("--rocm-parity", PRUNE, PRUNE_DRY_RUN, "tests")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["goldens obsolete (*): alpha, beta"])


def test_a_renamed_tests_golden_kept_by_a_run_of_its_file_says_why(renamed: pytest.Pytester) -> None:
    """test_beta renamed inside test_b.py: a run of that file alone keeps its golden (the check may have
    moved, name and all, to a file the run did not collect) and says so; the whole suite prunes it."""
    renamed.makepyfile(test_b=TEST_B.replace("def test_beta", "def test_gamma").replace('name="beta"', 'name="gamma"'))
    renamed.runpytest("--rocm-parity", "--parity-mode=capture", "test_b.py").assert_outcomes(passed=1)
    result = renamed.runpytest("--rocm-parity", PRUNE, "test_b.py")
    assert "beta" in goldens(renamed)
    result.stdout.fnmatch_lines(["rocm-parity: kept 'beta': its test test_b.py::test_beta is gone from test_b.py, "
                                 "which ran whole, but this run did not run the whole suite unfiltered*"])
    renamed.runpytest("--rocm-parity", PRUNE)
    assert "beta" not in goldens(renamed)
