"""Leftover files are a stopped capture's, never a live writer's: a golden directory a capture holds
locked right now (writing a rung, committing) is not listed, so a replay or regeneration running
beside it does not call its files leftovers of a stopped capture."""
from __future__ import annotations

from pathlib import Path

import pytest

from pytest_rocm_parity.golden.store import GoldenStore, _locked

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
