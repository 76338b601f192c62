"""Goldens from an fsspec URL with a local cache, on fsspec's real memory filesystem."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

fsspec = pytest.importorskip("fsspec")

from pytest_rocm_parity.runner.capture import capture

from pytest_rocm_parity.runner.engine import CheckSpec

from memory_store import memory_url  # noqa: E402
from pytest_rocm_parity.runner.replay import replay  # noqa: E402
from pytest_rocm_parity.errors import GoldenCorrupt, GoldenMissing  # noqa: E402
from pytest_rocm_parity.golden.remote import RemoteGoldenStore, open_store  # noqa: E402


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


@pytest.fixture
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    with memory_url("parity", request.node.name) as u:
        yield u


def test_capture_uploads_and_replay_downloads(url: str, tmp_path: Path) -> None:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    writer = RemoteGoldenStore(url, cache_dir=tmp_path / "cache-a")
    capture(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), writer, "cpu", env={})
    fs = fsspec.filesystem("memory")
    remote_files = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(url.split("://", 1)[1] + "/mlp", detail=False))
    assert remote_files[-1] == "manifest.json" and remote_files[0].startswith("float32-")
    # a second machine with an empty cache
    reader = RemoteGoldenStore(url, cache_dir=tmp_path / "cache-b")
    (res,) = replay(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), reader, "cpu", env={})
    assert res.passed
    assert (tmp_path / "cache-b").rglob("manifest.json")
    assert [n for n, _ in reader.names_on_disk()] == ["mlp"]


def test_missing_remote_golden(url: str, tmp_path: Path) -> None:
    store = RemoteGoldenStore(url, cache_dir=tmp_path)
    assert not store.exists("nope")
    with pytest.raises(GoldenMissing, match="no golden for 'nope'"):
        store.read_manifest("nope")


def _remote_tensor(url: str) -> tuple[Any, str]:
    """The memory filesystem and the path of the golden 'mlp''s tensor file in it."""
    fs = fsspec.filesystem("memory")
    root = url.split("://", 1)[1] + "/mlp"
    return fs, next(p for p in fs.ls(root, detail=False) if p.endswith(".safetensors"))


def test_tampered_remote_tensor_is_refused(url: str, tmp_path: Path) -> None:
    x = _captured(url, tmp_path)
    fs, tensor = _remote_tensor(url)
    data = bytearray(fs.cat_file(tensor))
    data[-1] ^= 0xFF
    fs.pipe_file(tensor, bytes(data))
    with pytest.raises(GoldenCorrupt, match="hash"):
        replay(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), RemoteGoldenStore(url, cache_dir=tmp_path / "b"),
               "cpu", env={})


def test_a_remote_tensor_file_with_a_bad_hash_is_named_by_its_url(tmp_path: Path) -> None:
    """A file:// store whose tensor file was damaged in place (its size unchanged): the error names the
    file's URL and the cache copy, which is removed so that the next run fetches it again."""
    url = f"file://{tmp_path / 'remote'}"
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    capture(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), RemoteGoldenStore(url, cache_dir=tmp_path / "a"),
            "cpu", env={})
    (tensor,) = (tmp_path / "remote" / "mlp").glob("*.safetensors")
    data = bytearray(tensor.read_bytes())
    data[-1] ^= 0xFF
    tensor.write_bytes(bytes(data))
    reader = RemoteGoldenStore(url, cache_dir=tmp_path / "b")
    with pytest.raises(GoldenCorrupt, match="content hash differs") as info:
        replay(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), reader, "cpu", env={})
    cached = reader.dir_for("mlp") / tensor.name
    assert str(info.value).startswith(f"{url}/mlp/{tensor.name}: ") and str(cached) in str(info.value)
    assert info.value.path == f"{url}/mlp/{tensor.name}" and not cached.exists()


def test_open_store_dispatch(tmp_path: Path) -> None:
    assert isinstance(open_store("memory://x/y"), RemoteGoldenStore)
    assert not isinstance(open_store(tmp_path), RemoteGoldenStore)


def test_plugin_with_url_golden_dir(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    pytester.makepyfile(test_url='''
import torch
from torch import nn

def test_m(parity):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    parity.check(m, torch.ones(2, 8), name="url-model", dtypes=["float32"])
''')
    u = "memory://plugin-url/goldens"
    captured = pytester.runpytest("--rocm-parity", "--parity-mode=capture", f"--parity-golden-dir={u}")
    captured.assert_outcomes(passed=1, warnings=1)   # an in-memory store lives as long as the process
    captured.stdout.fnmatch_lines(["*an in-memory store lives only as long as this pytest process*"])
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "other-cache"))
    pytester.runpytest("--rocm-parity", f"--parity-golden-dir={u}").assert_outcomes(passed=1)
    manifest = json.loads(fsspec.filesystem("memory").cat_file("/plugin-url/goldens/url-model/manifest.json"))
    assert manifest["name"] == "url-model"
    fsspec.filesystem("memory").rm("/plugin-url", recursive=True)


@pytest.mark.parametrize("url, says", [("zzz://bucket/goldens", "Protocol not known: zzz"),
                                       ("s3://bucket/goldens", "pip install s3fs")])
def test_a_url_this_machine_cannot_open_is_a_usage_error(pytester: pytest.Pytester, url: str, says: str) -> None:
    """A protocol fsspec does not know, or whose package is not installed (s3fs), stops the run with
    what to install: not an INTERNALERROR traceback."""
    if says == "pip install s3fs":
        try:
            fsspec.core.url_to_fs(url)
            pytest.skip("s3fs is installed here")
        except ImportError:
            pass
    pytester.makepyfile(test_url="def test_m(parity):\n    pass\n")
    result = pytester.runpytest("--rocm-parity", f"--parity-golden-dir={url}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: rocm-parity: --parity-golden-dir: golden directory {url!r}*{says}*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


# -- remote manifests go through the local reader's bounds and checks --------------------------------

def _captured(url: str, tmp_path: Path) -> torch.Tensor:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    capture(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), RemoteGoldenStore(url, cache_dir=tmp_path / "w"),
            "cpu", env={})
    return x


def _replay(url: str, tmp_path: Path, x: torch.Tensor) -> None:
    replay(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), RemoteGoldenStore(url, cache_dir=tmp_path / "r"),
           "cpu", env={})


@pytest.mark.parametrize("body", ["[" * 100_000 + "]" * 100_000, '{"format": 1, "rungs": {"float32": 3}}',
                                  "not json", '{"format": 1, "rungs": {}, "fingerprint": ' + "[" * 5000 + "]" * 5000 + "}"],
                         ids=["deep", "bad-rung", "not-json", "deep-field"])
def test_damaged_remote_manifest_is_a_golden_corrupt_naming_the_url(url: str, tmp_path: Path, body: str) -> None:
    x = _captured(url, tmp_path)
    fsspec.filesystem("memory").pipe_file(url.split("://", 1)[1] + "/mlp/manifest.json", body.encode())
    with pytest.raises(GoldenCorrupt) as exc:
        _replay(url, tmp_path, x)
    assert f"{url}/mlp/manifest.json" in str(exc.value) and "recapture" in str(exc.value)
    assert not list((tmp_path / "r").rglob("manifest.json")), "a refused manifest reached the cache"


def test_remote_manifest_over_the_bound_is_refused_before_it_is_read(url: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_rocm_parity.golden.remote as remote

    x = _captured(url, tmp_path)
    monkeypatch.setattr(remote, "MAX_MANIFEST_BYTES", 64)
    opened: list[str] = []
    monkeypatch.setattr(fsspec.filesystem("memory"), "open", lambda *a, **k: opened.append(a[0]))
    with pytest.raises(GoldenCorrupt, match="exceeds 64"):
        _replay(url, tmp_path, x)
    assert not opened


def test_remote_tensor_file_of_another_size_is_refused_before_download(url: str, tmp_path: Path) -> None:
    x = _captured(url, tmp_path)
    fs = fsspec.filesystem("memory")
    tensor = next(p for p in fs.ls(url.split("://", 1)[1] + "/mlp", detail=False) if p.endswith(".safetensors"))
    fs.pipe_file(tensor, fs.cat_file(tensor)[:-8])
    with pytest.raises(GoldenCorrupt, match="where its manifest records"):
        _replay(url, tmp_path, x)


@pytest.mark.parametrize("which", ["manifest", "tensor"])
def test_fifo_in_a_file_url_store_is_refused_without_hanging(tmp_path: Path, which: str) -> None:
    import os
    import signal

    url = f"file://{tmp_path / 'remote'}"
    x = _captured(url, tmp_path)
    d = tmp_path / "remote" / "mlp"
    target = d / "manifest.json" if which == "manifest" else next(d.glob("*.safetensors"))
    target.unlink()
    os.mkfifo(target)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("reading a FIFO hung"))
    signal.alarm(20)
    try:
        with pytest.raises(GoldenCorrupt, match="not a plain file") as exc:
            _replay(url, tmp_path, x)
    finally:
        signal.alarm(0)
    assert target.name in str(exc.value)


def test_a_bad_unrelated_remote_manifest_is_listed_by_name_and_breaks_nothing(url: str, tmp_path: Path) -> None:
    x = _captured(url, tmp_path)
    fs = fsspec.filesystem("memory")
    root = url.split("://", 1)[1]
    fs.pipe_file(f"{root}/deep/manifest.json", ("[" * 100_000 + "]" * 100_000).encode())
    fs.pipe_file(f"{root}/junk/manifest.json", b"\x80\x04pickle")
    store = RemoteGoldenStore(url, cache_dir=tmp_path / "r")
    assert sorted(n for n, _ in store.names_on_disk()) == ["deep", "junk", "mlp"]
    (res,) = replay(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), store, "cpu", env={})
    assert res.passed


def test_plugin_run_with_a_bad_remote_manifest_passes_with_its_summary(pytester: pytest.Pytester, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_url='''
import torch
from torch import nn

def test_m(parity):
    torch.manual_seed(0)
    parity.check(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.ones(2, 8), name="ok", dtypes=["float32"])
''')
    u = "memory://plugin-bad/goldens"
    try:
        pytester.runpytest("--rocm-parity", "--parity-mode=capture", f"--parity-golden-dir={u}").assert_outcomes(passed=1)
        fsspec.filesystem("memory").pipe_file("/plugin-bad/goldens/other/manifest.json", b"[" * 100_000)
        rep = pytester.runpytest("--rocm-parity", f"--parity-golden-dir={u}", "--parity-prune-obsolete")
        rep.assert_outcomes(passed=1)
        assert "rocm-parity summary" in rep.stdout.str() and rep.ret == 0
    finally:
        fsspec.filesystem("memory").rm("/plugin-bad", recursive=True)


def test_missing_remote_golden_directory_is_named(pytester: pytest.Pytester, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    pytester.makepyfile(test_url='''
import torch
from torch import nn

def test_m(parity):
    parity.check(nn.Linear(4, 4), torch.ones(2, 4), name="m", dtypes=["float32"])
''')
    rep = pytester.runpytest("--rocm-parity", "--parity-golden-dir=memory://nowhere-at-all/goldens")
    rep.assert_outcomes(failed=1)
    rep.stdout.fnmatch_lines(["*golden directory memory://nowhere-at-all/goldens does not exist*--parity-golden-dir*"])


def test_an_unreachable_store_says_so_without_a_capture_command(pytester: pytest.Pytester, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that refuses every call (a network down): the check's error says the URL cannot be
    read, and ends there; the test id belongs only after a capture command."""
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    pytester.makeconftest('''
import fsspec
from fsspec.implementations.memory import MemoryFileSystem


class Down(MemoryFileSystem):
    protocol = "down"

    def isdir(self, path):
        raise OSError("connection refused")

    def exists(self, path, **kwargs):
        raise OSError("connection refused")


fsspec.register_implementation("down", Down, clobber=True)
''')
    pytester.makepyfile(test_url="import torch\n\ndef test_m(parity):\n"
                                 "    parity.check(torch.nn.Linear(2, 2), torch.ones(1, 2), name='m', dtypes=['float32'])\n")
    result = pytester.runpytest("--rocm-parity", "--parity-golden-dir=down://store/goldens")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GoldenMissing: no golden for 'm': the golden directory down://store/goldens cannot "
                                 "be read (connection refused); check the URL and credentials"])


@pytest.mark.parametrize("failure, says", [(ConnectionResetError("connection reset by peer"), "check the URL, the "
                                            "credentials and the network"),
                                           (FileNotFoundError("no such key"), "missing from the store; recapture "
                                            "and upload this golden")])
def test_a_tensor_file_the_store_cannot_send_says_what_to_do(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             failure: OSError, says: str) -> None:
    """A file gone from the store makes the golden incomplete; any other failure is the way to it."""
    from pytest_rocm_parity.errors import GoldenError

    _captured(url, tmp_path)
    reader = RemoteGoldenStore(url, cache_dir=tmp_path / "b")

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise failure
    monkeypatch.setattr(reader.fs, "get_file", refuse)   # the manifest comes through, the tensors do not
    with pytest.raises(GoldenError, match=says):
        reader.read_manifest("mlp")
    assert [p.name for p in (tmp_path / "b").rglob("*") if p.is_file()] == []   # no manifest, no temporary left


def test_a_tensor_file_deleted_from_the_store_makes_the_golden_corrupt(url: str, tmp_path: Path) -> None:
    """As on a local disk: the manifest names a file the store no longer holds."""
    _captured(url, tmp_path)
    fs, tensor = _remote_tensor(url)
    fs.rm(tensor)
    with pytest.raises(GoldenCorrupt, match="named by the manifest but missing from the store"):
        RemoteGoldenStore(url, cache_dir=tmp_path / "b").read_manifest("mlp")
