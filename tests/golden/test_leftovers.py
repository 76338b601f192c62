"""Leftover files are a stopped capture's, never a live writer's: a golden directory a capture holds
locked right now (writing a rung, committing) is not listed, so a replay or regeneration running
beside it does not call its files leftovers of a stopped capture."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pytest_rocm_parity.golden.store import GoldenStore, _locked
from killed_writes import killed_writer_test

fcntl = pytest.importorskip("fcntl")


def test_a_directory_a_writer_holds_lists_no_leftovers(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "goldens")
    d = store.dir_for("tiny")
    d.mkdir(parents=True)
    tmp = d / ".tmp-1234-abcd.safetensors"   # a rung being written: no manifest names it yet
    tmp.write_bytes(b"\0" * 16)
    with _locked(d):                          # the writer's lock, held while it stages or commits
        assert store.leftovers() == []
        assert store.leftovers_of("tiny") == []
    assert store.leftovers() == [tmp]         # the writer is gone: now it is a stopped capture's
    assert store.leftovers_of("tiny") == [tmp]
    assert store.remove_leftovers(store.leftovers()) == [tmp, d]


def test_a_reader_of_the_directory_does_not_hide_leftovers(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "goldens")
    d = store.dir_for("tiny")
    d.mkdir(parents=True)
    tmp = d / ".tmp-1234-abcd.safetensors"
    tmp.write_bytes(b"\0" * 16)
    with _locked(d, shared=True):             # a replay reading a manifest: no writer at work
        assert store.leftovers() == [tmp]


KILLED_WHILE_WRITING = killed_writer_test("big")


def _killed_inside_safetensors(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A golden 'big', then a regeneration the kernel kills while safetensors writes its tensor file:
    safetensors' own temporary file (.tmpXXXXXX, no dash) is left beside the golden. Returns its dir."""
    pytester.makepyfile(test_big=KILLED_WHILE_WRITING)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rocm-parity", "--parity-mode=capture").assert_outcomes(
        passed=1)
    monkeypatch.setenv("SHIFT", "0.5")
    monkeypatch.setenv("FSIZE_LIMIT", str(1 << 16))
    killed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rocm-parity", "--parity-regen=big")
    assert killed.ret != 0
    monkeypatch.delenv("FSIZE_LIMIT")
    d = pytester.path / "goldens" / "big"
    assert [p.name for p in d.iterdir() if re.fullmatch(r"\.tmp[A-Za-z0-9]{6}", p.name)]   # safetensors' own
    return d


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as Linux has them")
def test_safetensors_own_temporary_file_is_listed_and_pruned(pytester: pytest.Pytester,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    d = _killed_inside_safetensors(pytester, monkeypatch)
    left = sorted(p.name for p in d.iterdir() if p.name.startswith(".tmp"))
    monkeypatch.delenv("SHIFT")
    listed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rocm-parity")
    listed.assert_outcomes(passed=1)
    summary = "\n".join(listed.outlines)
    assert "leftover files" in summary and all(name in summary for name in left)
    pruned = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rocm-parity", "--parity-prune-obsolete")
    pruned.assert_outcomes(passed=1)
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".tmp")) == []
    assert len(list(d.glob("float32-*.safetensors"))) == 1


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as Linux has them")
def test_the_next_regeneration_collects_safetensors_own_temporary_file(pytester: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    d = _killed_inside_safetensors(pytester, monkeypatch)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rocm-parity", "--parity-regen=big").assert_outcomes(
        passed=1)
    assert sorted(p.name for p in d.iterdir()) == sorted(["manifest.json", *(p.name for p in d.glob("float32-*"))])
    assert len(list(d.glob("float32-*.safetensors"))) == 1
