"""--parity-regen[=GLOB]: rewrite the goldens of the models whose name matches, only those."""
from __future__ import annotations

import json

import pytest

TWO_MODELS = '''
from conftest import make_model, make_inputs

def test_alpha(parity):
    parity.check(make_model(), make_inputs(), name="alpha", dtypes=["float32"])

def test_beta(parity):
    parity.check(make_model(), make_inputs(), name="beta", dtypes=["float32"])
'''


def _created(p: pytest.Pytester, name: str) -> str:
    return str(json.loads((p.path / "goldens" / name / "manifest.json").read_text())["created"]) + \
        (p.path / "goldens" / name / "manifest.json").read_text()


def test_regen_glob_rewrites_only_matching(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_two=TWO_MODELS)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=2)
    beta_before = (project.path / "goldens" / "beta" / "manifest.json").stat().st_ino
    alpha_before = (project.path / "goldens" / "alpha" / "manifest.json").stat().st_ino
    monkeypatch.setenv("BUG", "1")   # the model changed: its regenerated golden differs
    result = project.runpytest("--rocm-parity", "--parity-regen=alp*", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*goldens updated: alpha*"])
    # an atomic rewrite replaces the file (new inode); an untouched golden keeps its inode
    assert (project.path / "goldens" / "beta" / "manifest.json").stat().st_ino == beta_before
    assert (project.path / "goldens" / "alpha" / "manifest.json").stat().st_ino != alpha_before


def test_regen_without_glob_rewrites_all(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_two=TWO_MODELS)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=2)
    monkeypatch.setenv("BUG", "1")
    result = project.runpytest("--rocm-parity", "--parity-regen")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*goldens updated: alpha, beta*"])


def test_stale_golden_names_regen_command(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.makeconftest((project.path / "conftest.py").read_text().replace("Tiny()", "Tiny(n=4)"))
    result = project.runpytest("--rocm-parity")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GoldenStale: stale golden*structure*--parity-regen='tiny'*"])


def test_regen_of_an_unchanged_golden_needs_no_write_access(project: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only golden directory (a mount, another user's checkout): regenerating an unchanged
    model writes nothing, so it passes and says unchanged; a changed one is a GoldenWriteError."""
    import os
    import tempfile

    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    goldens = project.path / "goldens"
    before = {p.name: (p.stat().st_ino, p.read_bytes()) for p in (goldens / "tiny").iterdir()}
    mkstemp = tempfile.mkstemp

    def read_only(*args: object, **kwargs: object) -> object:
        # what creating a file in a read-only directory does, whoever runs the test (root ignores mode bits)
        if str(kwargs.get("dir", "")).startswith(str(goldens)):
            raise PermissionError(13, "Permission denied", str(kwargs["dir"]))
        return mkstemp(*args, **kwargs)  # type: ignore[call-overload]
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    for d in (goldens / "tiny", goldens):
        os.chmod(d, 0o555)
    try:
        same = project.runpytest("--rocm-parity", "--parity-regen")
        same.assert_outcomes(passed=1)
        same.stdout.fnmatch_lines(["goldens unchanged (*): tiny"])
        assert {p.name: (p.stat().st_ino, p.read_bytes()) for p in (goldens / "tiny").iterdir()} == before
        monkeypatch.setenv("BUG", "1")
        changed = project.runpytest("--rocm-parity", "--parity-regen")
        changed.assert_outcomes(failed=1)
        changed.stdout.fnmatch_lines(["*GoldenWriteError*writing the golden for 'tiny' failed (Permission denied)*"])
        assert {p.name: (p.stat().st_ino, p.read_bytes()) for p in (goldens / "tiny").iterdir()} == before
    finally:
        for d in (goldens, goldens / "tiny"):
            os.chmod(d, 0o755)
