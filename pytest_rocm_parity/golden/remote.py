"""Goldens in an artifact store: any fsspec URL (s3://, gs://, file://, memory://) with a local cache.

The remote holds the same layout as a local golden directory.  Reading fetches a golden's
manifest and the tensor files it names into a cache directory keyed by the URL, then every
local check applies (framing validation, SHA-256 against the manifest, no pickle). Writing
commits locally first, then uploads tensor files before the manifest, so a reader of the remote
never sees a manifest naming a file that is not there yet.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_rocm_parity.atomic import TMP_PREFIX, commit, temp_beside
from pytest_rocm_parity.errors import (BackendUnavailable, GoldenCorrupt, GoldenError, GoldenExists, GoldenMissing,
                                        GoldenStale, GoldenWriteError, ParityError)
from pytest_rocm_parity.golden.store import (MANIFEST, MAX_MANIFEST_BYTES, REMOTE_PROJECT_KINDS, GoldenStore, Staged, meaningful,
                                             digest_matches, expected_digest, load_manifest, safe_name, verify_sha)


# How a damaged file in the store is replaced: a commit uploads only what the store lacks, and takes a
# file of the right name and size for those bytes (its name is their hash)
REUPLOAD = "delete the damaged file from the store, then regenerate the golden there, which uploads what the store lacks"


def is_url(path: object) -> bool:
    return isinstance(path, str) and "://" in path


def default_cache_dir() -> Path:
    base = os.environ.get("PARITY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pytest-rocm-parity")
    return Path(base)


@functools.lru_cache(maxsize=8)
def remote_project(rootdir: Path) -> str:
    """The project as every checkout of it names it, for a remote store's manifests: ``git <host/path>``
    from the checkout's ``origin`` (credentials and scheme dropped, so a token never reaches a
    manifest, and an SSH and an HTTPS clone agree), else ``folder <rootdir's name>``."""
    try:
        url = subprocess.run(["git", "-C", str(rootdir), "config", "--get", "remote.origin.url"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        url = ""
    if url:
        m = re.match(r"^[a-z][a-z0-9+.-]*://(?:[^/]*@)?([^/:@]*)(?::\d+)?(/.*)?$", url)   # scheme://user@host:port/path
        if m is None:
            m = re.match(r"^(?:[^/]*@)?([^/:@]+):(.*)$", url)                              # scp-like git@host:org/repo
        host, path = (m.group(1), m.group(2) or "") if m else ("", url)                   # else a local path
        path = re.sub(r"\.git/?$", "", path.strip("/"))
        if path:
            return f"git {host}/{path}"
    return f"folder {Path(rootdir).resolve().name}"


# An upload's temporary file older than this is a stopped upload's, not a live one of another machine
# (the 1.14 GB golden of docs/performance.md uploads in seconds to minutes)
UPLOAD_LEFTOVER_AGE_S = 3600.0


class RemoteGoldenStore(GoldenStore):
    """A GoldenStore whose root is a local cache mirroring ``url``."""

    def __init__(self, url: str, cache_dir: str | os.PathLike[str] | None = None) -> None:
        try:
            import fsspec
        except ImportError:
            raise BackendUnavailable(f"golden directory {url!r} is a URL, which needs fsspec: "
                                     f"pip install 'pytest-rocm-parity[all]' (or pip install fsspec s3fs)") from None
        self.url = url.rstrip("/")
        try:
            self.fs, self.remote_root = fsspec.core.url_to_fs(self.url)
        except ImportError as exc:   # fsspec knows the protocol, its implementation is not installed
            raise BackendUnavailable(f"golden directory {url!r}: {exc}. Install it beside this plugin "
                                     f"(pip install s3fs for s3://, gcsfs for gs://, aiohttp for http(s)://)") from None
        except ValueError as exc:   # a protocol fsspec does not know
            raise BackendUnavailable(f"golden directory {url!r}: {exc}; use a local directory or an fsspec URL "
                                     f"(s3://, gs://, file://, memory://)") from None
        key = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        super().__init__(Path(cache_dir or default_cache_dir()) / key)

    def _remote(self, name: str, fname: str = "") -> str:
        base = f"{self.remote_root.rstrip('/')}/{safe_name(name)}"
        return f"{base}/{fname}" if fname else base

    def _plain_file(self, rpath: str, where: str, max_bytes: int | None = None, listed: bool = False) -> int:
        """The size of the remote ``rpath``, refused unless it is a plain file (never a FIFO, device or
        directory, which could block a read forever) of at most ``max_bytes``. ``listed``: a file a
        manifest names, whose absence makes the golden incomplete (corrupt), as on a local disk."""
        try:
            info = self.fs.info(rpath)
        except (OSError, ValueError) as exc:
            if listed and isinstance(exc, FileNotFoundError):
                raise _missing_from_store(where, rpath) from exc
            raise GoldenError(f"{where}: cannot read ({exc}); check the URL and credentials", rpath) from exc
        kind, size = info.get("type"), info.get("size")
        if kind != "file" or not isinstance(size, int):
            raise GoldenCorrupt(f"{where}: not a plain file ({kind}); a golden is plain files only. Remove it "
                                f"from the store and upload the golden again", rpath)
        if max_bytes is not None and size > max_bytes:
            raise GoldenCorrupt(f"{where}: manifest of {size} bytes exceeds {max_bytes}; it is not a "
                                f"pytest-rocm-parity manifest. Recapture and upload this golden", rpath)
        return size

    def _read_manifest_bytes(self, rpath: str, where: str) -> bytes:
        """A remote manifest's bytes, read within the local reader's bound."""
        self._plain_file(rpath, where, MAX_MANIFEST_BYTES)
        try:
            with self.fs.open(rpath, "rb") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
        except OSError as exc:
            raise GoldenError(f"{where}: cannot read ({exc}); check the URL and credentials", rpath) from exc
        if not isinstance(raw, bytes) or len(raw) > MAX_MANIFEST_BYTES:
            raise GoldenCorrupt(f"{where}: manifest exceeds {MAX_MANIFEST_BYTES} bytes; it is not a "
                                f"pytest-rocm-parity manifest. Recapture and upload this golden", rpath)
        return raw

    def _validated(self, raw: bytes, tmp: Path, where: str) -> dict[str, Any]:
        """``raw`` written to ``tmp`` and checked by the local manifest reader; errors name ``where``."""
        tmp.write_bytes(raw)
        try:
            return load_manifest(tmp, restore=f"upload it again from the reference machine ({REUPLOAD})")
        except GoldenError as exc:
            tmp.unlink(missing_ok=True)
            raise type(exc)(str(exc).replace(str(tmp), where), where) from None

    def _fetch(self, name: str) -> None:
        """Bring the remote manifest and any tensor file missing or different in the cache."""
        rm = self._remote(name, MANIFEST)
        where = f"{self.url}/{safe_name(name)}/{MANIFEST}"
        try:
            if not self.fs.exists(rm):
                return
        except OSError as exc:
            raise GoldenError(f"{where}: cannot read ({exc}); check the URL and credentials", rm) from exc
        raw = self._read_manifest_bytes(rm, where)
        d = self.dir_for(name)
        d.mkdir(parents=True, exist_ok=True)
        # a temporary name of its own: two processes fetching the same golden never share one
        tmp = temp_beside(d, Path(MANIFEST).suffix)
        try:
            manifest = self._validated(raw, tmp, where)
            for r in manifest["rungs"].values():
                fname, expected = Path(str(r["file"])).name, expected_digest(r)
                local = d / fname
                if local.exists() and expected and digest_matches(local, expected):
                    continue  # cached and verified
                size = self._plain_file(self._remote(name, fname), f"{self.url}/{safe_name(name)}/{fname}",
                                        listed=True)
                if isinstance(r.get("bytes"), int) and size != r["bytes"]:
                    raise GoldenCorrupt(f"{self.url}/{safe_name(name)}/{fname}: holds {size} bytes where its manifest "
                                        f"records {r['bytes']} (truncated or replaced in the store); regenerate the "
                                        f"golden on the reference machine, which uploads it again", rm)
                tmp_file = temp_beside(d, Path(fname).suffix)
                try:
                    self.fs.get_file(self._remote(name, fname), str(tmp_file))
                except OSError as exc:
                    tmp_file.unlink(missing_ok=True)
                    # gone from the store: the golden is incomplete; any other failure is the way to it
                    where = f"{self.url}/{safe_name(name)}/{fname}"
                    if isinstance(exc, FileNotFoundError):
                        raise _missing_from_store(where, rm) from exc
                    raise GoldenError(f"{where}: named by the manifest but cannot be fetched ({exc}); check the URL, "
                                      f"the credentials and the network, and run again", rm) from exc
                commit(tmp_file, local)
                if expected:
                    self._verify_fetched(local, expected, f"{self.url}/{safe_name(name)}/{fname}")
            commit(tmp, d / MANIFEST)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @staticmethod
    def _verify_fetched(local: Path, expected: str, where: str) -> None:
        """The digest check of a file just fetched, its damage named by its URL (the cache path is a
        copy): the replay's own check would name only the copy. A verified file is not hashed again."""
        try:
            verify_sha(local, expected)
        except GoldenCorrupt:
            local.unlink(missing_ok=True)   # the next run fetches it again
            raise GoldenCorrupt(f"{where}: content hash differs from the manifest's (edited or damaged in the "
                                f"store; its copy fetched to {local} is removed); {REUPLOAD}", where) from None

    def exists(self, name: str) -> bool:
        try:
            return bool(self.fs.exists(self._remote(name, MANIFEST)))
        except OSError:
            return super().exists(name)

    def missing_root(self, capture: str) -> str:
        try:
            if self.fs.isdir(self.remote_root):
                return ""
        except OSError as exc:
            return f"the golden directory {self.url} cannot be read ({exc}); check the URL and credentials"
        return (f"the golden directory {self.url} does not exist: point --parity-golden-dir (or the "
                f"parity_golden_dir ini key) at the URL holding the goldens, or create it by capturing on the "
                f"reference machine: {capture}")

    def read_manifest(self, name: str) -> dict[str, Any]:
        self._fetch(name)
        if not super().exists(name):
            raise GoldenMissing(f"no golden for {name!r} at {self._remote(name, MANIFEST)} ({self.url})",
                                self._remote(name, MANIFEST))
        return super().read_manifest(name)

    def _remote_manifest(self, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(whether the store holds a manifest of ``name``, that manifest as the local reader reads it,
        None where it cannot be trusted: a regeneration replaces it, as a local damaged one is replaced)."""
        rm, where = self._remote(name, MANIFEST), f"{self.url}/{safe_name(name)}/{MANIFEST}"
        if not self.fs.exists(rm):
            return False, None
        d = self.dir_for(name)
        d.mkdir(parents=True, exist_ok=True)
        tmp = temp_beside(d, Path(MANIFEST).suffix)
        try:
            return True, self._validated(self._read_manifest_bytes(rm, where), tmp, where)
        except (GoldenCorrupt, GoldenStale):
            return True, None
        finally:
            tmp.unlink(missing_ok=True)

    def _holds(self, rpath: str, size: Any) -> bool:
        """Whether the store holds ``rpath`` whole: a tensor file's name is its content's hash, so a
        plain file of that name and the recorded size is those bytes (an upload that stopped left a
        shorter one, or none: _upload writes under a temporary name)."""
        try:
            info = self.fs.info(rpath)
        except FileNotFoundError:
            return False
        return info.get("type") == "file" and isinstance(size, int) and info.get("size") == size

    def _upload(self, local: Path, name: str, fname: str) -> None:
        """Put ``local`` in the store as ``fname`` of golden ``name`` without a reader ever seeing a
        part of it: written under a temporary name, then moved into place (a rename on a file system,
        a whole-object copy on an object store). A failed upload leaves the store as it was."""
        target = self._remote(name, fname)
        tmp = self._remote(name, f"{TMP_PREFIX}{secrets.token_hex(8)}-{fname}")
        try:
            self.fs.put_file(str(local), tmp)
            try:
                self.fs.mv(tmp, target)
            except NotImplementedError:
                if fname == MANIFEST:
                    raise GoldenWriteError(
                        f"{self.url}: this store cannot move a file into place, so the manifest of {name!r} "
                        f"cannot be replaced atomically and was not uploaded (the golden in the store is as "
                        f"it was); keep goldens in a store fsspec can move files in (file://, s3://, gs://, "
                        f"memory://) or in a local directory", target) from None
                # a tensor file no manifest names yet: nobody reads it, and _holds tells a cut one
                self.fs.put_file(str(local), target)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self.fs.rm_file(tmp)
            if isinstance(exc, OSError) and not isinstance(exc, GoldenWriteError):
                raise GoldenWriteError(
                    f"{self.url}/{safe_name(name)}/{fname}: uploading the golden for {name!r} failed ({exc}); "
                    f"the golden in the store is as it was. Check the store's free space, the URL and the "
                    f"credentials, and capture again", target) from exc
            raise

    def commit(self, staged: Staged) -> Path:
        """Commit in the local cache, then upload what the store lacks: tensor files first, the
        manifest last. A file the store holds already is never written again (a reader on another
        machine may be fetching it), so a regeneration that changes nothing uploads nothing."""
        name = staged.name
        try:
            there, old = self._remote_manifest(name)
            if there and not staged.overwrite:
                raise GoldenExists(f"{self._remote(name, MANIFEST)} ({self.url}): golden for {name!r} exists; "
                                   f"capture never overwrites it (rerun with --parity-regen='{name}' to "
                                   f"rewrite it)", self._remote(name, MANIFEST))
        except BaseException as exc:
            self.abandon(staged)
            if isinstance(exc, OSError):
                raise GoldenWriteError(f"{self.url}: cannot read the store before uploading the golden for "
                                       f"{name!r} ({exc}); nothing was uploaded. Check the URL and the "
                                       f"credentials, and capture again", self.url) from exc
            raise
        mpath = super().commit(staged)
        d = self.dir_for(name)
        m = json.loads(mpath.read_text("utf-8"))
        files = [(str(r["file"]), r.get("bytes")) for r in m.get("rungs", {}).values()]
        try:
            missing = [f for f, size in files if not self._holds(self._remote(name, f), size)]
        except OSError as exc:
            raise GoldenWriteError(f"{self.url}: cannot read the store to upload the golden for {name!r} ({exc}); "
                                   f"the golden in the store is as it was. Check the URL and the credentials, "
                                   f"and capture again", self.url) from exc
        same = old is not None and meaningful(old) == meaningful(m)
        if same and not missing:
            self.unchanged.add(name)   # the store holds this golden already: nothing is written
            return mpath
        self.unchanged.discard(name)
        self.fs.makedirs(self._remote(name), exist_ok=True)   # a file:// store does not create parents itself
        for fname in missing:
            self._upload(d / fname, name, fname)
        if not same:
            self._upload(mpath, name, MANIFEST)   # the commit point, last
        return mpath

    def upload_leftovers(self, min_age_s: float = UPLOAD_LEFTOVER_AGE_S) -> list[str]:
        """The store's files of uploads that stopped before moving them into place (``_upload``'s
        temporary names, a killed run's), older than ``min_age_s``: a younger one may be a live upload
        of another machine, whose move would fail without it. Paths in the store's own form."""
        found: list[str] = []
        try:
            dirs = [str(e) for e in self.fs.ls(self.remote_root, detail=False)]
        except (OSError, FileNotFoundError):
            return found
        now = time.time()
        for d in sorted(dirs):
            try:
                entries = self.fs.ls(d, detail=True)
            except (OSError, FileNotFoundError, NotADirectoryError):
                continue
            for info in entries:
                rpath = str(info.get("name", ""))
                if info.get("type") != "file" or not rpath.rstrip("/").rsplit("/", 1)[-1].startswith(TMP_PREFIX):
                    continue
                made = _modified(info)
                if made is not None and now - made >= min_age_s:
                    found.append(rpath)
        return found

    def remove_upload_leftovers(self, rpaths: list[str]) -> list[str]:
        """Delete ``rpaths`` (upload_leftovers()); returns what was deleted."""
        done = []
        for r in rpaths:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(r)
                done.append(r)
        return done

    def restore_hint(self, name: str) -> str:
        """A remote golden's files in this machine are a cache, not a checkout: fetch again, or replace
        the store's copy."""
        return (f"run again where the store's files are whole (a download cut short): each run fetches "
                f"from {self.url} again any file of {self.dir_for(name)} (a cache) that differs from its manifest; "
                f"where the store's own file is damaged, {REUPLOAD}")

    def no_manifest(self, name: str, capture_it: str) -> str:
        return ""   # the store, not this machine's cache, holds the golden: its manifest is there or not

    def names_on_disk(self) -> Iterator[tuple[str, Path]]:
        try:
            entries = self.fs.ls(self.remote_root, detail=False)
        except (OSError, FileNotFoundError):
            return
        for entry in sorted(entries):
            base = str(entry).rstrip("/").rsplit("/", 1)[-1]
            rpath = f"{str(entry).rstrip('/')}/{MANIFEST}"
            try:
                if not self.fs.exists(rpath):
                    continue
            except OSError:
                continue
            try:   # a damaged manifest is listed by its directory's name, as a local one is
                raw = self._read_manifest_bytes(rpath, f"{self.url}/{base}/{MANIFEST}")
                self.root.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=self.root, prefix=".tmp-") as scratch:
                    name = self._validated(raw, Path(scratch) / MANIFEST, rpath).get("name", base)
            except ParityError:
                name = base
            yield name if isinstance(name, str) else base, self.root / base


def _modified(info: dict[str, Any]) -> float | None:
    """When a store's file was last written, in seconds since the epoch, from the fields fsspec's
    file systems give (local ``mtime``, memory ``created``, S3 ``LastModified``, GCS ``updated``);
    None where none is there."""
    import datetime

    for key in ("mtime", "LastModified", "updated", "created"):
        v = info.get(key)
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):
            try:
                v = datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                continue
        if isinstance(v, datetime.datetime):
            return (v if v.tzinfo else v.replace(tzinfo=datetime.timezone.utc)).timestamp()
    return None


def _missing_from_store(where: str, path: Any) -> GoldenCorrupt:
    """A file its manifest names that the store no longer holds: the golden is incomplete, as a
    local one missing a tensor file is."""
    return GoldenCorrupt(f"{where}: named by the manifest but missing from the store; recapture and upload this "
                         f"golden", path)


def open_store(location: str | os.PathLike[str]) -> GoldenStore:
    """A local GoldenStore for paths, a RemoteGoldenStore for URLs (file:// included)."""
    if is_url(location):
        return RemoteGoldenStore(str(location))
    return GoldenStore(location)
