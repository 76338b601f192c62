"""Goldens from an fsspec URL with a local cache, on fsspec's real memory filesystem."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

fsspec = pytest.importorskip("fsspec")

from pytest_rocm_parity.capture import capture

from pytest_rocm_parity.engine import CheckSpec

from pytest_rocm_parity.replay import replay  # noqa: E402
from pytest_rocm_parity.errors import GoldenCorrupt, GoldenMissing  # noqa: E402
from pytest_rocm_parity.remote import RemoteGoldenStore, open_store  # noqa: E402


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


@pytest.fixture
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    u = f"memory://parity-{request.node.name}/goldens"
    yield u
    fs = fsspec.filesystem("memory")
    top = "/" + u.split("://", 1)[1].split("/")[0]
    if fs.exists(top):
        fs.rm(top, recursive=True)


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


def test_tampered_remote_tensor_is_refused(url: str, tmp_path: Path) -> None:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    capture(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), RemoteGoldenStore(url, cache_dir=tmp_path / "a"),
            "cpu", env={})
    fs = fsspec.filesystem("memory")
    root = url.split("://", 1)[1] + "/mlp"
    tensor = next(p for p in fs.ls(root, detail=False) if p.endswith(".safetensors"))
    data = bytearray(fs.cat_file(tensor))
    data[-1] ^= 0xFF
    fs.pipe_file(tensor, bytes(data))
    with pytest.raises(GoldenCorrupt, match="hash"):
        replay(_model(), x, CheckSpec(name="mlp", dtypes=["float32"]), RemoteGoldenStore(url, cache_dir=tmp_path / "b"),
               "cpu", env={})


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
    pytester.runpytest("--rocm-parity", "--parity-mode=capture", f"--parity-golden-dir={u}").assert_outcomes(passed=1)
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "other-cache"))
    pytester.runpytest("--rocm-parity", f"--parity-golden-dir={u}").assert_outcomes(passed=1)
    manifest = json.loads(fsspec.filesystem("memory").cat_file("/plugin-url/goldens/url-model/manifest.json"))
    assert manifest["name"] == "url-model"
    fsspec.filesystem("memory").rm("/plugin-url", recursive=True)
