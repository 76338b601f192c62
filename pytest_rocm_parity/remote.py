"""Goldens in an artifact store: any fsspec URL (s3://, gs://, file://, memory://) with a local cache.

The remote holds the same layout as a local golden directory.  Reading fetches a golden's
manifest and the tensor files it names into a cache directory keyed by the URL, then every
local check applies (framing validation, SHA-256 against the manifest, no pickle). Writing
commits locally first, then uploads tensor files before the manifest, so a reader of the remote
never sees a manifest naming a file that is not there yet.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_rocm_parity.errors import BackendUnavailable, GoldenError, GoldenMissing
from pytest_rocm_parity.golden import MANIFEST, GoldenStore, safe_name, sha256_file


def is_url(path: object) -> bool:
    return isinstance(path, str) and "://" in path


def default_cache_dir() -> Path:
    base = os.environ.get("PARITY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pytest-rocm-parity")
    return Path(base)


class RemoteGoldenStore(GoldenStore):
    """A GoldenStore whose root is a local cache mirroring ``url``."""

    def __init__(self, url: str, cache_dir: str | os.PathLike[str] | None = None) -> None:
        try:
            import fsspec
        except ImportError:
            raise BackendUnavailable(f"golden directory {url!r} is a URL, which needs fsspec: "
                                     f"pip install 'pytest-rocm-parity[all]' (or pip install fsspec s3fs)") from None
        self.url = url.rstrip("/")
        self.fs, self.remote_root = fsspec.core.url_to_fs(self.url)
        key = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        super().__init__(Path(cache_dir or default_cache_dir()) / key)

    def _remote(self, name: str, fname: str = "") -> str:
        base = f"{self.remote_root.rstrip('/')}/{safe_name(name)}"
        return f"{base}/{fname}" if fname else base

    def _fetch(self, name: str) -> None:
        """Bring the remote manifest and any tensor file missing or different in the cache."""
        rm = self._remote(name, MANIFEST)
        try:
            if not self.fs.exists(rm):
                return
            raw = self.fs.cat_file(rm)
        except OSError as exc:
            raise GoldenError(f"{self.url}/{safe_name(name)}/{MANIFEST}: cannot read ({exc}); check the URL and "
                              f"credentials", rm) from exc
        d = self.dir_for(name)
        d.mkdir(parents=True, exist_ok=True)
        try:
            files = {str(r.get("file")): r.get("sha256") for r in json.loads(raw).get("rungs", {}).values()}
        except (ValueError, AttributeError):
            files = {}
        for fname, sha in files.items():
            local = d / Path(fname).name
            if local.exists() and sha and sha256_file(local) == sha:
                continue  # cached and verified
            tmp = d / f".tmp-{Path(fname).name}"
            try:
                self.fs.get_file(self._remote(name, Path(fname).name), str(tmp))
            except (OSError, FileNotFoundError) as exc:
                tmp.unlink(missing_ok=True)
                raise GoldenError(f"{self.url}/{safe_name(name)}/{fname}: named by the manifest but cannot be "
                                  f"fetched ({exc}); recapture and upload this golden", rm) from exc
            os.replace(tmp, local)
        tmp = d / f".tmp-{MANIFEST}"
        tmp.write_bytes(raw)
        os.replace(tmp, d / MANIFEST)

    def exists(self, name: str) -> bool:
        try:
            return bool(self.fs.exists(self._remote(name, MANIFEST)))
        except OSError:
            return super().exists(name)

    def read_manifest(self, name: str) -> dict[str, Any]:
        self._fetch(name)
        if not super().exists(name):
            raise GoldenMissing(f"no golden for {name!r} at {self._remote(name, MANIFEST)} ({self.url})",
                                self._remote(name, MANIFEST))
        return super().read_manifest(name)

    def write(self, name: str, manifest: dict[str, Any], rungs: dict[str, dict[str, Any]],
              overwrite: bool) -> Path:
        mpath = super().write(name, manifest, rungs, overwrite)
        d = self.dir_for(name)
        m = json.loads(mpath.read_text("utf-8"))
        for r in m.get("rungs", {}).values():
            self.fs.put_file(str(d / r["file"]), self._remote(name, r["file"]))
        self.fs.put_file(str(mpath), self._remote(name, MANIFEST))  # the commit point, last
        return mpath

    def names_on_disk(self) -> Iterator[tuple[str, Path]]:
        try:
            entries = self.fs.ls(self.remote_root, detail=False)
        except (OSError, FileNotFoundError):
            return
        for entry in sorted(entries):
            base = str(entry).rstrip("/").rsplit("/", 1)[-1]
            try:
                raw = self.fs.cat_file(f"{str(entry).rstrip('/')}/{MANIFEST}")
                yield str(json.loads(raw).get("name", base)), self.root / base
            except (OSError, FileNotFoundError, ValueError):
                continue


def open_store(location: str | os.PathLike[str]) -> GoldenStore:
    """A local GoldenStore for paths, a RemoteGoldenStore for URLs (file:// included)."""
    if is_url(location):
        return RemoteGoldenStore(str(location))
    return GoldenStore(location)
