"""Uploads to an fsspec store never touch a file already in force: real file:// and memory:// stores,
and a real write failure (RLIMIT_FSIZE: the kernel refuses the write, or kills the writer) mid-upload."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

fsspec = pytest.importorskip("fsspec")

from memory_store import memory_url  # noqa: E402
from pytest_rocm_parity.golden.remote import RemoteGoldenStore  # noqa: E402
from pytest_rocm_parity.runner.capture import capture  # noqa: E402
from pytest_rocm_parity.runner.engine import CheckSpec  # noqa: E402
from pytest_rocm_parity.runner.replay import replay  # noqa: E402


def _model(shift: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    with torch.no_grad():
        m[2].bias.add_(shift)
    return m


X = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
SPEC = CheckSpec(name="mlp", dtypes=["float32"])


@pytest.fixture(params=["file", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "file":
        yield f"file://{tmp_path}/store"
        return
    with memory_url("commit", request.node.name) as u:
        yield u


def _golden(url: str) -> tuple[Any, list[str]]:
    """The store's filesystem and the paths of its golden 'mlp''s files."""
    protocol, path = url.split("://", 1)
    fs = fsspec.filesystem(protocol)
    return fs, [str(p) for p in fs.ls(f"{path}/mlp", detail=False)]


def _remote_files(url: str) -> dict[str, Any]:
    """Each file of the store's golden 'mlp' by name, with what tells a rewrite of it: a file's inode and
    modification time (set in the past beforehand by _age), a memory store's file object."""
    fs, paths = _golden(url)
    out: dict[str, Any] = {}
    for p in paths:
        if url.startswith("file://"):
            st = os.stat(p)
            out[p.rsplit("/", 1)[-1]] = (st.st_ino, st.st_mtime_ns, st.st_size)
        else:
            out[p.rsplit("/", 1)[-1]] = id(fs.store[p])
    return out


def _age(url: str) -> None:
    """Date a file store's files an hour back, so a rewrite shows in their modification time."""
    if url.startswith("file://"):
        for p in _golden(url)[1]:
            t = os.stat(p).st_mtime - 3600
            os.utime(p, (t, t))


@pytest.mark.parametrize("cache", ["same", "fresh"])
def test_an_unchanged_regeneration_uploads_nothing(url: str, tmp_path: Path, cache: str) -> None:
    """The store's files stay the very files they were (a reader elsewhere may be fetching them), and
    the store says the golden is unchanged, whether or not this machine's cache held it."""
    writer = RemoteGoldenStore(url, cache_dir=tmp_path / "cache-a")
    capture(_model(), X, SPEC, writer, "cpu", env={})
    _age(url)
    before = _remote_files(url)
    again = writer if cache == "same" else RemoteGoldenStore(url, cache_dir=tmp_path / "cache-b")
    capture(_model(), X, SPEC, again, "cpu", overwrite=True, env={})
    assert _remote_files(url) == before
    assert "mlp" in again.unchanged


def test_a_changed_regeneration_uploads_only_the_new_file(url: str, tmp_path: Path) -> None:
    """The old tensor file stays untouched; the new one and the manifest arrive whole, under their names."""
    writer = RemoteGoldenStore(url, cache_dir=tmp_path / "cache-a")
    capture(_model(), X, SPEC, writer, "cpu", env={})
    _age(url)
    before = _remote_files(url)
    capture(_model(0.5), X, SPEC, writer, "cpu", overwrite=True, env={})
    after = _remote_files(url)
    old_tensor = next(n for n in before if n.endswith(".safetensors"))
    assert after[old_tensor] == before[old_tensor]
    assert after["manifest.json"] != before["manifest.json"]
    assert "mlp" not in writer.unchanged
    assert not [n for n in after if n.startswith(".tmp-")]
    (res,) = replay(_model(0.5), X, SPEC, RemoteGoldenStore(url, cache_dir=tmp_path / "cache-c"), "cpu", env={})
    assert res.passed


def test_a_capture_never_replaces_a_golden_another_machine_uploaded(url: str, tmp_path: Path) -> None:
    """Without --parity-regen the store's golden wins even where this machine's cache never saw it."""
    from pytest_rocm_parity.errors import GoldenExists

    capture(_model(), X, SPEC, RemoteGoldenStore(url, cache_dir=tmp_path / "a"), "cpu", env={})
    other = RemoteGoldenStore(url, cache_dir=tmp_path / "b")
    before = _remote_files(url)
    with pytest.raises(GoldenExists, match="--parity-regen='mlp'"):
        capture(_model(0.5), X, SPEC, other, "cpu", overwrite=False, env={})
    assert _remote_files(url) == before


LIMITED = """
import os, resource, signal, torch

def test_big(parity):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    with torch.no_grad():
        m[2].bias.add_(float(os.environ.get("SHIFT", "0")))
    parity.check(m, torch.randn(256, 64, generator=torch.Generator().manual_seed(3)), name="big", dtypes=["float32"])
    limit = os.environ.get("FSIZE_LIMIT")
    if limit:   # from here on (the commit after the test), no file of this process grows past the limit
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN if os.environ["ON_LIMIT"] == "raise" else signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as Linux has them")
@pytest.mark.parametrize("on_limit", ["raise", "die"])
@pytest.mark.parametrize("shift", ["0", "0.5"])
def test_an_upload_stopped_midway_leaves_the_golden_in_force_whole(pytester: pytest.Pytester, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch, on_limit: str,
                                                                   shift: str) -> None:
    """The kernel refuses the upload's write past 64 KiB (EFBIG), or kills the writer there (SIGXFSZ):
    the golden in force is still whole in the store, no file under a golden's name is partial, and
    a fresh machine replays the old golden."""
    store = tmp_path / "store"
    args = ("-p", "no:cacheprovider", "--rocm-parity", f"--parity-golden-dir=file://{store}")
    pytester.makepyfile(test_big=LIMITED)
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    pytester.runpytest_subprocess(*args, "--parity-mode=capture").assert_outcomes(passed=1)
    old = {p.name: p.read_bytes() for p in (store / "big").iterdir()}
    assert max(len(b) for b in old.values()) > 1 << 16   # the upload is cut short, not refused whole

    monkeypatch.setenv("SHIFT", shift)
    monkeypatch.setenv("FSIZE_LIMIT", str(1 << 16))
    monkeypatch.setenv("ON_LIMIT", on_limit)
    regen = pytester.runpytest_subprocess(*args, "--parity-regen=big")
    if on_limit == "raise" and shift != "0":
        regen.stdout.fnmatch_lines(["*GoldenWriteError*uploading the golden for 'big' failed*the golden in the "
                                    "store is as it was*"])
    now = {p.name: p for p in (store / "big").iterdir() if not p.name.startswith(".tmp-")}
    assert {n: p.read_bytes() for n, p in now.items() if n in old} == old
    assert set(now) == set(old)   # nothing new under a golden's name: a cut file is only ever a .tmp-*
    if on_limit == "raise":
        assert not [p for p in (store / "big").iterdir() if p.name.startswith(".tmp-")]

    for var in ("SHIFT", "FSIZE_LIMIT", "ON_LIMIT"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "another-machine"))
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=1)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as Linux has them")
def test_a_killed_uploads_file_is_listed_once_old_and_pruned(pytester: pytest.Pytester, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel kills an upload midway: its temporary file stays in the store. A young one may be
    another machine's live upload and is left alone; once it is an hour old the summary lists it and
    --parity-prune-obsolete deletes it, leaving the golden in force as it was."""
    store = tmp_path / "store"
    args = ("-p", "no:cacheprovider", "--rocm-parity", f"--parity-golden-dir=file://{store}")
    pytester.makepyfile(test_big=LIMITED)
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    pytester.runpytest_subprocess(*args, "--parity-mode=capture").assert_outcomes(passed=1)
    with monkeypatch.context() as m:
        m.setenv("SHIFT", "0.5")
        m.setenv("FSIZE_LIMIT", str(1 << 16))
        m.setenv("ON_LIMIT", "die")
        pytester.runpytest_subprocess(*args, "--parity-regen=big")
    (cut,) = [p for p in (store / "big").iterdir() if p.name.startswith(".tmp-")]
    golden = {p.name: p.read_bytes() for p in (store / "big").iterdir() if p != cut}

    young = pytester.runpytest_subprocess(*args, "--parity-prune-obsolete")
    young.assert_outcomes(passed=1)
    assert cut.exists() and "leftover files in the store" not in young.stdout.str()

    t = cut.stat().st_mtime - 2 * 3600
    os.utime(cut, (t, t))
    listed = pytester.runpytest_subprocess(*args)
    listed.stdout.fnmatch_lines([f"leftover files in the store (uploads stopped over an hour ago*): *{cut.name}*"])
    assert cut.exists()
    pruned = pytester.runpytest_subprocess(*args, "--parity-prune-obsolete")
    pruned.stdout.fnmatch_lines([f"rocm-parity: deleted *{cut.name} in file://{store} (an upload that was stopped*"])
    assert not cut.exists()
    assert {p.name: p.read_bytes() for p in (store / "big").iterdir()} == golden
