"""What a damaged or half-written golden's message tells the user to do fits where the golden lives: a
remote store's files on this machine are a cache (no git advice), and a first capture stopped before
it wrote a tensor file left nothing to restore."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from killed_writes import killed_writer_test

pytest.importorskip("fsspec")

TEST = killed_writer_test("m")


def test_a_damaged_remote_golden_gets_no_git_advice(pytester: pytest.Pytester, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A bit flipped in the store's tensor file, replayed on a machine with an empty cache: the message
    says to fetch again or replace the store's file, never to git checkout the cache; following it
    (delete the file from the store, regenerate) makes the golden whole again."""
    store = tmp_path / "store"
    args = ("-p", "no:cacheprovider", "--rocm-parity", f"--parity-golden-dir=file://{store}")
    pytester.makepyfile(test_m=TEST)
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache-a"))
    pytester.runpytest(*args, "--parity-mode=capture").assert_outcomes(passed=1)
    (tensor,) = (store / "m").glob("float32-*.safetensors")
    data = bytearray(tensor.read_bytes())
    data[-10] ^= 0xFF
    tensor.write_bytes(bytes(data))

    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache-b"))
    damaged = pytester.runpytest(*args)
    damaged.assert_outcomes(failed=1)
    out = "\n".join(damaged.outlines)
    assert "GoldenCorrupt" in out and "git checkout" not in out and "git lfs" not in out
    damaged.stdout.fnmatch_lines([f"*GoldenCorrupt: file://{tensor}: content hash differs*delete the damaged file "
                                  f"from the store, then regenerate the golden there*; or run again where the store's "
                                  f"files are whole*fetches from file://{store} again*"])

    tensor.unlink()   # as the message says
    pytester.runpytest(*args, "--parity-regen=m").assert_outcomes(passed=1)
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache-c"))
    pytester.runpytest(*args).assert_outcomes(passed=1)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as Linux has them")
def test_a_first_capture_killed_midway_is_named_so_with_nothing_to_restore(pytester: pytest.Pytester,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel kills the first capture while it writes the tensor file: the next run says a stopped
    first capture left only temporary files, what to delete, and how to capture; no git advice."""
    pytester.makepyfile(test_m=TEST)
    monkeypatch.setenv("FSIZE_LIMIT", str(1 << 16))
    killed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rocm-parity", "--parity-mode=capture")
    assert killed.ret != 0
    monkeypatch.delenv("FSIZE_LIMIT")
    d = pytester.path / "goldens" / "m"
    assert d.is_dir() and all(p.name.startswith(".tmp") for p in d.iterdir())

    replayed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rocm-parity")
    replayed.assert_outcomes(failed=1)
    out = "\n".join(replayed.outlines)
    assert "Restore it from version control" not in out and "holds its tensor files" not in out
    replayed.stdout.fnmatch_lines([f"*GoldenMissing: no golden for 'm': {d} holds only the temporary files of a first "
                                   f"capture that was stopped before it finished (.tmp*); no golden was written there, "
                                   f"so there is nothing to restore. Delete {d} (or run with --parity-prune-obsolete*) "
                                   f"and capture it again: pytest --rocm-parity*"])
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rocm-parity", "--parity-mode=capture",
                                  "--parity-prune-obsolete").assert_outcomes(passed=1)
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".tmp")) == []
