"""The golden bundle on disk: safetensors tensors beside a JSON manifest.

Layout (docs/golden-format.md)::

    <golden_dir>/<safe name>/manifest.json
    <golden_dir>/<safe name>/<dtype>-<sha12>.safetensors   one file per dtype rung

The manifest is the commit point: tensor files are written first under
content-addressed names, then the manifest is replaced atomically, then files no
manifest refers to are removed.  A capture that dies at any moment leaves the
previous golden whole, as git does with its refs.  Nothing here ever unpickles.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pytest_rocm_parity.atomic import TMP_PREFIX, atomic_write, commit, sync, temp_beside
from pytest_rocm_parity.errors import (
    GoldenCorrupt, GoldenExists, GoldenMissing, GoldenStale, GoldenTooNew, GoldenWriteError, InvalidArgument,
)
from pytest_rocm_parity.judging.dtypes import FLOAT_NAMES
from pytest_rocm_parity.progress import megabytes, progress
from pytest_rocm_parity.runner.tree import CONTAINER_KINDS

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024      # safetensors' own bound
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
# complex128 has no safetensors dtype: such tensors are stored as their float64 real view and
# listed under this metadata key, and RungReader turns them back into complex128.
COMPLEX128_KEY = "complex128"
# Dtypes safetensors has no code for (MX scales in float8_e8m0fnu, packed float4) are stored as
# their uint8 bytes; this metadata key maps each such tensor to its dtype, restored on read.
BYTE_VIEWS_KEY = "byte_views"
BYTE_VIEW_DTYPES = ("float8_e8m0fnu", "float4_e2m1fn_x2")
TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                 "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "C64": "complex64"}
PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
ZIP_MAGIC = b"PK\x03\x04"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_HASHED = re.compile(r"-[0-9a-f]{12}$")
# Names Windows refuses as file names whatever the extension (goldens are checked out everywhere).
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
MAX_NAME = 96
ALIGN = 64   # bytes; what torch's CPU allocator guarantees
# The marker of a golden this tool wrote: prune deletes only directories whose manifest holds it.
TOOL_KEY = "tool"
TOOL = "pytest-rocm-parity"
# The project that captured a golden: its pytest rootdir relative to the golden directory. Prune
# calls obsolete only the goldens of the project that runs it (a golden directory may be shared).
PROJECT_KEY = "project"
# How a remote golden's manifest names the project that captured it (golden.remote.remote_project):
# its git remote, else its folder's name; a local golden's is a path relative to the golden directory
REMOTE_PROJECT_KINDS = ("git ", "folder ")
# Manifest keys that change on every capture without saying anything about the golden: a regen
# that changes nothing else leaves the golden as it was (no diff for git).
# the hash a manifest records of its own content (manifest_digest): a hand edit, or a merge that
# mixes two captures, changes what the replay judges by without any tensor file changing
MANIFEST_DIGEST_KEY = "manifest_sha256"
VOLATILE_KEYS = ("created", "tool_version", MANIFEST_DIGEST_KEY)
# Goldens one store keeps pinned at a time (see GoldenStore.read_manifest).
PINNED_GOLDENS = 8
# A tensor file of ours: <dtype>-<12 hex digits of its SHA-256>.safetensors
_TENSOR_FILE = re.compile(r"^[a-z0-9_]+-[0-9a-f]{12}\.safetensors$")
# safetensors' save_file writes through a temporary file of its own beside the target (Rust's tempfile
# crate: ".tmp" and six random characters, no dash), renamed over our .tmp-* once whole: a writer
# killed meanwhile leaves a full-size one that no manifest will ever name
_SAFETENSORS_TMP = re.compile(r"^\.tmp[A-Za-z0-9]{6}$")


def is_temp_file(name: str) -> bool:
    """Whether ``name`` is a golden writer's temporary file: ours (.tmp-*) or safetensors' own."""
    return name.startswith(TMP_PREFIX) or bool(_SAFETENSORS_TMP.match(name))


def safe_name(name: str) -> str:
    """A file-system-safe directory name for any check name, distinct for distinct names.

    Names already safe are kept (so `a.b` and `a_b` stay apart); anything altered or
    shortened gets a hash of the exact original appended.  So do names that would
    collide on a case-insensitive file system (any upper-case letter), Windows device
    names, and names that already end like a hash, so a kept name never equals a hashed one.
    """
    cleaned = _SAFE.sub("_", name).strip("._-") or "golden"
    cleaned = cleaned.replace("..", "_")
    if (cleaned == name and len(name) <= MAX_NAME and name == name.lower()
            and not _HASHED.search(name) and name.split(".")[0] not in _RESERVED):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    if cleaned.split(".")[0].lower() in _RESERVED:
        cleaned = f"_{cleaned}"   # "nul.txt-<hash>" is still the NUL device to Windows
    return f"{cleaned[:MAX_NAME]}-{digest}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


# The digest a replay checks every read against: XXH3-128 where the xxhash package is installed (a
# dependency; about 10x SHA-256's speed, so the check of a 1 GB golden costs about what reading it
# does: docs/performance.md), SHA-256 otherwise and for goldens written before it was recorded.
# Corruption, not an adversary, is what it guards against; the file names stay SHA-256's.
FAST_DIGEST = "xxh3_128"


@dataclass
class Staged:
    """A golden whose tensor files are written and whose manifest is not (GoldenStore.stage)."""

    name: str
    manifest: dict[str, Any]
    overwrite: bool
    written: list[Path] = field(default_factory=list)
    # shared locks on its tensor files until it is committed or abandoned: another writer's
    # commit of the same golden collects unreferenced files, and must leave these alone
    pins: list[int] = field(default_factory=list)
    # files that held other bytes than their name says (a damaged golden) and were written again:
    # the golden changed on disk even when its manifest did not
    repaired: list[Path] = field(default_factory=list)

    def unpin(self) -> None:
        for fd in self.pins:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pins.clear()


def _fast_hasher() -> Any:
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash.xxh3_128()


def file_digests(path: Path) -> tuple[str, str | None]:
    """(SHA-256, XXH3-128 or None without xxhash) of the file, in one read."""
    sha, fast = hashlib.sha256(), _fast_hasher()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            sha.update(chunk)
            if fast is not None:
                fast.update(chunk)
    return sha.hexdigest(), (fast.hexdigest() if fast is not None else None)


def expected_digest(rung: dict[str, Any]) -> str | None:
    """What a rung's file is checked against: "xxh3_128:<hex>" when the manifest records it and xxhash
    is installed, else its SHA-256 (verify_sha reads either)."""
    fast = rung.get(FAST_DIGEST)
    if isinstance(fast, str) and _fast_hasher() is not None:
        return f"{FAST_DIGEST}:{fast}"
    sha = rung.get("sha256")
    return sha if isinstance(sha, str) else None


def digest_matches(path: Path, expected: str) -> bool:
    """Whether the file has the digest ``expected`` (as expected_digest gives it), read now."""
    if expected.startswith(FAST_DIGEST + ":"):
        h = _fast_hasher()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        return bool(h.hexdigest() == expected.split(":", 1)[1])
    return sha256_file(path) == expected


class GoldenStore:
    """Goldens under one root directory; every path it hands out stays inside the root."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        # name -> open, share-locked descriptors of the tensor files its last-read manifest names
        self._pins: dict[str, list[int]] = {}
        # names whose last write found the golden unchanged and left it untouched
        self.unchanged: set[str] = set()

    def dir_for(self, name: str) -> Path:
        return self.root / safe_name(name)

    def manifest_path(self, name: str) -> Path:
        return self.dir_for(name) / MANIFEST

    def exists(self, name: str) -> bool:
        return self.manifest_path(name).exists()

    def names_on_disk(self) -> Iterator[tuple[str, Path]]:
        """(name, dir) of every golden under the root, names read from their manifests."""
        if not self.root.is_dir():
            return
        for d in sorted(self.root.iterdir()):
            m = d / MANIFEST
            if d.is_dir() and not d.is_symlink() and m.is_file():
                try:
                    name = load_manifest(m).get("name", d.name)
                    yield name if isinstance(name, str) else d.name, d
                except (GoldenCorrupt, GoldenStale, GoldenTooNew):
                    yield d.name, d

    def close_names(self, name: str, n: int = 3) -> list[str]:
        """Names of goldens on disk close to ``name`` (a typo, a renamed check), closest first."""
        import difflib

        return difflib.get_close_matches(name, [g for g, _ in self.names_on_disk()], n=n, cutoff=0.6)

    # -- reading ---------------------------------------------------------------------------
    def _inside(self, path: Path) -> Path:
        real = path.resolve()
        root = self.root.resolve()
        if real != root and root not in real.parents:
            raise GoldenCorrupt(
                f"{path}: resolves to {real}, outside the golden directory {root}; goldens are never "
                f"read through links that leave it. Replace the link with the file itself.", path)
        return real

    def read_manifest(self, name: str) -> dict[str, Any]:
        path = self.manifest_path(name)
        if not path.exists() and not path.is_symlink():
            raise GoldenMissing(f"no golden for {name!r} at {path}", path)
        self._inside(path)
        with _locked(path.parent, shared=True):   # never between a writer's commit and its clean-up
            m = load_manifest(path)
            self._pin(name, path.parent, m)
        if "name" in m and m["name"] != name:
            raise GoldenCorrupt(
                f"{path}: this golden was captured for {m['name']!r}, not {name!r} (a copied or renamed "
                f"directory); recapture it with --parity-regen", path)
        return m

    def rung_file(self, name: str, manifest: dict[str, Any], dtype: str) -> Path:
        rung = manifest["rungs"].get(dtype)
        if not isinstance(rung, dict):
            raise GoldenStale(
                f"{self.manifest_path(name)}: golden has no {dtype} rung (it holds {', '.join(manifest['rungs'])})",
                self.manifest_path(name))
        fname = str(rung.get("file", ""))
        if not fname or "/" in fname or "\\" in fname or fname.startswith("."):
            raise GoldenCorrupt(f"{self.manifest_path(name)}: bad tensor file name {fname!r} in manifest", self.manifest_path(name))
        path = self.dir_for(name) / fname
        if not path.exists():
            raise GoldenCorrupt(
                f"{path}: tensor file named by {self.manifest_path(name)} is missing; recapture this model",
                path)
        self._inside(path)
        check_size(path, rung)
        check_listed(path, manifest, dtype, self.manifest_path(name))
        return path

    def missing_root(self, capture: str) -> str:
        """'' when the golden directory exists, else a sentence naming it and how to point or create it
        (``capture``: the command that captures into it, the golden directory's flag included)."""
        if self.root.is_dir():
            return ""
        what = "is not a directory" if self.root.exists() else "does not exist"
        return (f"the golden directory {self.root} {what}: point --parity-golden-dir (or the parity_golden_dir "
                f"ini key) at the directory holding the goldens, or create it by capturing on the reference "
                f"machine: {capture}")

    # -- pins: a replay racing a regeneration reads the old golden whole -------------------------
    def _pin(self, name: str, d: Path, manifest: dict[str, Any]) -> None:
        """Hold a shared lock on each tensor file ``manifest`` names, until this name is read again.

        Why: the replay reads the manifest, then each rung's file by name, seconds apart. A
        regeneration committing in between would delete the files the old manifest names; a
        writer's clean-up leaves a file alone while anyone holds such a lock (collect_garbage),
        so the replay reads the old golden whole and the next write collects the file.
        """
        self.unpin(name)
        try:
            import fcntl
        except ImportError:
            return
        fds: list[int] = []
        for rung in manifest.get("rungs", {}).values():
            fname = str(rung.get("file", "")) if isinstance(rung, dict) else ""
            if _TENSOR_FILE.match(fname):
                fd = _pin_file(d / fname)   # missing: rung_file names it when the replay gets there
                if fd is not None:
                    fds.append(fd)
        self._pins[name] = fds
        while len(self._pins) > PINNED_GOLDENS:
            self.unpin(next(iter(self._pins)))

    def unpin(self, name: str | None = None) -> None:
        """Release the pins of ``name`` (of every golden without it)."""
        for n in [name] if name is not None else list(self._pins):
            for fd in self._pins.pop(n, []):
                with contextlib.suppress(OSError):
                    os.close(fd)

    # -- pruning ---------------------------------------------------------------------------
    def goldens_on_disk(self) -> Iterator[tuple[str, Path, dict[str, Any] | None]]:
        """(name, directory, manifest or None when unreadable) of every golden directly under the root."""
        if not self.root.is_dir():
            return
        for d in sorted(self.root.iterdir()):
            m = d / MANIFEST
            if d.is_dir() and not d.is_symlink() and m.is_file() and not m.is_symlink():
                try:
                    manifest = load_manifest(m)
                except (GoldenCorrupt, GoldenStale, GoldenTooNew):
                    yield d.name, d, None
                    continue
                name = manifest.get("name")
                yield (name if isinstance(name, str) else d.name), d, manifest

    def projects(self) -> set[Path]:
        """The folders of the projects whose captures the goldens under the root record (each manifest's
        ``project``, resolved against the root); goldens captured before it was recorded add none."""
        found: set[Path] = set()
        for _name, _d, manifest in self.goldens_on_disk():
            owner = manifest.get(PROJECT_KEY) if manifest is not None else None
            if isinstance(owner, str) and not owner.startswith(REMOTE_PROJECT_KINDS):   # a remote one names no folder
                found.add((self.root / owner).resolve())
        return found

    def leftovers(self) -> list[Path]:
        """Files a capture stopped without cleaning up left under the root (a SIGTERM or SIGKILL
        between staging and commit): tensor files of ours that no manifest names, in a golden's
        directory or in one that has no manifest yet, and temporary files. Files a live writer still
        holds (GoldenStore.stage pins them) are not leftovers; nor is anything in a directory whose
        manifest cannot be read, where the tensor files are what there is to restore."""
        if not self.root.is_dir():
            return []
        return [p for d in sorted(self.root.iterdir()) if d.is_dir() and not d.is_symlink() for p in _listed_leftovers(d)]

    def leftovers_of(self, name: str) -> list[Path]:
        """leftovers() in ``name``'s directory. Where it has no manifest these are the tensor files a
        deleted manifest named, or a first capture that stopped left."""
        d = self.dir_for(name)
        return _listed_leftovers(d) if d.is_dir() and not d.is_symlink() else []

    def restore_hint(self, name: str) -> str:
        """How to get ``name``'s files back as they were committed: a golden directory is a checkout."""
        return f"restore the committed files (git checkout {self.dir_for(name)}, git lfs pull)"

    def no_manifest(self, name: str, capture_it: str) -> str:
        """Why ``name`` has a directory but no manifest, and the fix ('' when it has no such directory):
        tensor files of ours there are a golden whose manifest is gone (restore it); temporary files
        alone are a first capture stopped before it wrote a tensor file (nothing to restore).
        ``capture_it``: the command that captures it."""
        left = self.leftovers_of(name)
        tensors = [p.name for p in left if _TENSOR_FILE.match(p.name)]
        d = self.dir_for(name)
        if tensors:
            return (f"{d} holds its tensor files ({_few(tensors)}) but no {MANIFEST}, which names and hashes them "
                    f"(deleted, or a capture stopped before writing it). Restore it from version control (git "
                    f"checkout {self.manifest_path(name)}), or capture it again: {capture_it}")
        temps = [p.name for p in left if is_temp_file(p.name)]
        if temps:
            return (f"{d} holds only the temporary files of a first capture that was stopped before it finished "
                    f"({_few(temps)}); no golden was written there, so there is nothing to restore. Delete {d} "
                    f"(or run with --parity-prune-obsolete, which deletes such leftovers) and capture it again: "
                    f"{capture_it}")
        return ""

    def remove_leftovers(self, paths: list[Path]) -> list[Path]:
        """Delete ``paths`` (leftovers()), each checked again under its directory's lock; a directory
        left empty with no manifest goes too. Returns what was deleted."""
        deleted: list[Path] = []
        for d in sorted({p.parent for p in paths}):
            with _locked(d):
                still = set(_leftovers_in(d))
                for p in paths:
                    if p.parent == d and p in still:
                        p.unlink(missing_ok=True)
                        deleted.append(p)
            if not (d / MANIFEST).exists():
                with contextlib.suppress(OSError):
                    d.rmdir()
                    deleted.append(d)
        return deleted

    def ours(self, d: Path, manifest: dict[str, Any] | None) -> bool:
        """True when this tool wrote the golden at ``d``: its manifest is valid, carries our marker,
        and the directory is the one the manifest's name maps to. Prune deletes nothing else."""
        return (manifest is not None and manifest.get(TOOL_KEY) == TOOL and isinstance(manifest.get("name"), str)
                and d.parent == self.root and d.name == safe_name(manifest["name"]) and not d.is_symlink())

    def delete(self, d: Path, dry_run: bool = False) -> list[Path]:
        """Delete the golden at ``d``: its manifest first (after that no reader sees a golden), then
        the tensor and temporary files of ours; the directory too once empty. Files of any other
        name are left where they are. Returns the paths deleted (``dry_run``: that would be)."""
        deleted: list[Path] = []
        with _locked(d):
            entries = sorted(d.iterdir())
            for p in [d / MANIFEST] + [p for p in entries if p.name != MANIFEST]:
                if p.is_symlink() or not p.is_file():
                    continue
                if p.name == MANIFEST or _TENSOR_FILE.match(p.name) or is_temp_file(p.name):
                    if not dry_run:
                        p.unlink(missing_ok=True)
                    deleted.append(p)
        if dry_run:
            if len(deleted) == len(entries):
                deleted.append(d)
            return deleted
        with contextlib.suppress(OSError):
            d.rmdir()
            deleted.append(d)
        return deleted

    # -- writing ---------------------------------------------------------------------------
    def write(self, name: str, manifest: dict[str, Any], rungs: dict[str, Any],
              overwrite: bool) -> Path:
        """Write all rungs, then commit by replacing the manifest; the old golden survives any failure.

        ``rungs`` maps dtype -> tensors, or dtype -> a callable producing them (called in turn).
        """
        return self.commit(self.stage(name, manifest, rungs, overwrite))

    def stage(self, name: str, manifest: dict[str, Any], rungs: dict[str, Any], overwrite: bool) -> Staged:
        """Write a golden's tensor files beside the golden it replaces, not its manifest: until
        ``commit``, readers see the old golden (its manifest names its own files), and ``abandon``
        removes what this wrote. A capture stages while its test runs and commits once it passed."""
        d = self.dir_for(name)
        mpath = d / MANIFEST
        if d.is_symlink() or d.exists():
            self._inside(d)   # never write (or collect garbage) through a link that leaves the root
        staged = Staged(name, manifest, overwrite)
        manifest[TOOL_KEY] = TOOL
        created = not d.exists()
        try:
            d.mkdir(parents=True, exist_ok=True)
            with _locked(d):   # concurrent writers of one golden (xdist workers) take turns
                self._refuse_existing(name, mpath, overwrite)
                for dtype, tensors in rungs.items():
                    # A rung may be produced lazily: the capture streams one rung at a time to disk
                    # instead of holding every rung's tensors in host memory at once.
                    started = time.monotonic()
                    if callable(tensors):
                        progress(f"{dtype}: reference run, float64 truth ...", verbose=1)
                        tensors = tensors()
                    meta = {"format": str(FORMAT_VERSION), "name": name, "dtype": dtype}
                    unwritable: OSError | None = None
                    try:
                        tmp = write_tensors_tmp(d, tensors, meta)
                    except OSError as exc:
                        # a directory this process cannot write (a read-only mount or checkout): a
                        # rung whose bytes are there already needs no write, so learn its name
                        # from a copy written elsewhere
                        unwritable = exc
                        tmp = write_tensors_tmp(Path(tempfile.gettempdir()), tensors, meta)
                    del tensors
                    staged.written.append(tmp)
                    digest, fast = file_digests(tmp)
                    final = d / f"{dtype}-{digest[:12]}.safetensors"
                    if _same_file(final, digest):
                        # the bytes are there already: replacing them would only touch the file
                        tmp.unlink()
                        staged.written.pop()
                    elif unwritable is not None:
                        raise unwritable
                    else:
                        if final.exists():
                            staged.repaired.append(final)
                        commit(tmp, final)
                        staged.written[-1] = final
                    fd = _pin_file(final)
                    if fd is not None:
                        staged.pins.append(fd)
                    size = final.stat().st_size
                    manifest["rungs"][dtype]["file"] = final.name
                    manifest["rungs"][dtype]["sha256"] = digest
                    if fast is not None:
                        manifest["rungs"][dtype][FAST_DIGEST] = fast
                    manifest["rungs"][dtype]["bytes"] = size
                    progress(f"{dtype}: reference run, float64 truth, wrote {megabytes(size)} "
                             f"in {time.monotonic() - started:.1f} s")
        except BaseException as exc:
            self._abandon_files(staged)
            if created:   # a first capture that failed leaves no empty golden directory behind
                with contextlib.suppress(OSError):
                    d.rmdir()
            self._raise_write_error(name, d, exc)
        return staged

    def commit(self, staged: Staged) -> Path:
        """Make a staged golden the golden: its manifest replaces the old one (an unchanged golden is
        left as it was), then files no manifest names go."""
        name = staged.name
        d = self.dir_for(name)
        mpath = d / MANIFEST
        self.unpin(name)   # this store's own reads must not keep the files it replaces
        self.unchanged.discard(name)
        try:
            with _locked(d):
                self._refuse_existing(name, mpath, staged.overwrite)
                manifest = {**staged.manifest, MANIFEST_DIGEST_KEY: manifest_digest(staged.manifest)}
                text = json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n"
                if not staged.repaired and meaningful(_old_manifest(mpath)) == meaningful(json.loads(text)):
                    self.unchanged.add(name)   # same tensors, same description: keep the file and its time
                else:
                    _atomic_write_text(mpath, text)
                staged.written.clear()
                staged.unpin()
                with contextlib.suppress(OSError):   # committed: leftovers are only disk space
                    self.collect_garbage(d)
        except BaseException as exc:
            self._abandon_files(staged)
            self._raise_write_error(name, d, exc)
        return mpath

    def abandon(self, staged: Staged) -> None:
        """Remove a staged golden's files; the golden on disk, if any, stays as it was (a first
        capture's directory goes too, once empty)."""
        d = self.dir_for(staged.name)
        with contextlib.suppress(OSError):
            with _locked(d):
                self._abandon_files(staged)
            d.rmdir()

    def _abandon_files(self, staged: Staged) -> None:
        # the manifest on disk names the previous golden's files: only the files this stage wrote go
        staged.unpin()
        keep = _referenced(self.dir_for(staged.name) / MANIFEST)
        for p in staged.written:
            if p.name not in keep:
                with contextlib.suppress(OSError):
                    p.unlink(missing_ok=True)
        staged.written.clear()

    @staticmethod
    def _refuse_existing(name: str, mpath: Path, overwrite: bool) -> None:
        if mpath.exists() and not overwrite:
            raise GoldenExists(f"{mpath}: golden for {name!r} exists; capture never overwrites it "
                               f"(rerun with --parity-regen='{name}' to rewrite it)", mpath)

    @staticmethod
    def _raise_write_error(name: str, d: Path, exc: BaseException) -> NoReturn:
        """Disk and permission errors as GoldenWriteError; anything else (KeyboardInterrupt) as it is."""
        from safetensors import SafetensorError

        if isinstance(exc, (OSError, SafetensorError)):
            why = getattr(exc, "strerror", None) or exc
            raise GoldenWriteError(
                f"{d}: writing the golden for {name!r} failed ({why}); the previous golden, if any, is "
                f"intact. Free disk space or fix permissions on {d} and capture again.", d) from exc
        raise exc

    def collect_garbage(self, d: Path) -> None:
        """Remove the files of ours no manifest names, the temp files of dead writers among them
        (_leftovers_in; call under _locked)."""
        for p in _leftovers_in(d):
            p.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(d: Path, shared: bool = False) -> Iterator[None]:
    """An advisory lock on the golden's directory itself (no lock file to commit): exclusive for
    writers, shared for a reader of the manifest, so it never reads between a writer's commit and
    its clean-up.

    Released by the kernel when the holder dies, so a killed capture never wedges the next.
    Without fcntl (Windows) writers are not serialized; each write is still atomic.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(d, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _same_file(path: Path, digest: str) -> bool:
    """True when ``path`` is a plain file holding exactly the bytes of SHA-256 ``digest``."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        return sha256_file(path) == digest
    except OSError:
        return False


def _old_manifest(mpath: Path) -> dict[str, Any] | None:
    try:
        return load_manifest(mpath) if mpath.is_file() else None
    except (GoldenCorrupt, GoldenStale):
        return None


def meaningful(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest less what changes on every capture; None stays None (never equal to a manifest)."""
    if manifest is None:
        return None
    return {k: v for k, v in manifest.items() if k not in VOLATILE_KEYS}


def _open_plain(path: Path) -> int | None:
    """A read-only descriptor of ``path`` that follows no link and never blocks (a FIFO); None if it cannot be had."""
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None


def _pin_file(path: Path) -> int | None:
    """An open descriptor holding a shared lock on ``path`` (None where it cannot be had): while it is
    open, collect_garbage leaves the file alone (_in_use)."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = _open_plain(path)
    if fd is None:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _in_use(path: Path) -> bool:
    """True while a reader holds the file pinned (GoldenStore._pin): it may not be deleted yet."""
    try:
        import fcntl
    except ImportError:
        return False
    fd = _open_plain(path)
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:   # a file system without flock: nobody can pin there
        return False
    finally:
        os.close(fd)


def _leftovers_in(d: Path) -> list[Path]:
    """GoldenStore.leftovers of one directory."""
    m = d / MANIFEST
    keep: set[str] = set()
    if m.exists():
        try:
            keep = {str(r.get("file")) for r in load_manifest(m).get("rungs", {}).values()}
        except (GoldenCorrupt, GoldenStale, GoldenTooNew, AttributeError, TypeError):
            return []
    return [p for p in sorted(d.iterdir())
            if p.name not in keep and not p.is_symlink() and p.is_file()
            and (is_temp_file(p.name) or _TENSOR_FILE.match(p.name)) and not _in_use(p)]


def _listed_leftovers(d: Path) -> list[Path]:
    """_leftovers_in(d) for a listing, under a shared lock on the directory: no writer commits between
    the manifest's read and the files' check (the file it just committed is no leftover). A directory
    a writer holds right now is skipped: its files there (a .tmp-* being written, one being committed)
    are a live capture's work, not a stopped one's; the next listing sees what it left."""
    try:
        import fcntl
    except ImportError:
        return _leftovers_in(d)
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return []
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return []
    except OSError:   # a file system without flock: nobody can lock there
        pass
    try:
        return _leftovers_in(d)
    finally:
        os.close(fd)


def _referenced(mpath: Path) -> set[str]:
    try:
        m = json.loads(mpath.read_text("utf-8"))
        return {str(r.get("file")) for r in m.get("rungs", {}).values()}
    except (OSError, ValueError, AttributeError, RecursionError):
        return set()


def storable(tensors: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """Tensors safetensors can hold: complex128 becomes its float64 real view (listed), a dtype in
    BYTE_VIEW_DTYPES its uint8 bytes (mapped to the dtype's name), others refused."""
    import torch

    ok = {getattr(torch, n, None) for n in (
        "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
        "complex64", "uint16", "uint32", "uint64",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")} - {None}
    out: dict[str, Any] = {}
    complex128: list[str] = []
    byte_views: dict[str, str] = {}
    as_bytes = {getattr(torch, n): n for n in BYTE_VIEW_DTYPES if hasattr(torch, n)}
    storages: set[int] = set()
    for k, v in tensors.items():
        if v.dtype == torch.complex128:
            complex128.append(k)
            v = torch.view_as_real(v.resolve_conj())
        elif v.dtype in as_bytes:
            byte_views[k] = as_bytes[v.dtype]
            v = v.contiguous().view(torch.uint8)
        elif v.dtype not in ok:
            raise InvalidArgument(
                f"tensor {k!r} has dtype {v.dtype}, which a golden cannot store; return a supported dtype "
                f"from the model (float, int, bool, complex64/128) or cast it in the test")
        v = v.contiguous()
        # safetensors refuses tensors that share memory (outputs that are views of one storage, a
        # parent's output that is its child's): each shared one is written as its own copy
        ptr = v.untyped_storage().data_ptr()
        if ptr and ptr in storages:
            v = v.clone()
        storages.add(v.untyped_storage().data_ptr())
        out[k] = v
    return out, complex128, byte_views


def write_tensors_tmp(d: Path, tensors: dict[str, Any], metadata: dict[str, str]) -> Path:
    from safetensors.torch import save_file

    tensors, complex128, byte_views = storable(tensors)
    if complex128:
        metadata = {**metadata, COMPLEX128_KEY: json.dumps(sorted(complex128))}
    if byte_views:
        metadata = {**metadata, BYTE_VIEWS_KEY: json.dumps(byte_views, sort_keys=True)}
    tmp = temp_beside(d, ".safetensors")
    try:
        save_file(tensors, tmp, metadata=metadata)
        _canonicalize_header(tmp)
        sync(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _canonicalize_header(path: Path) -> None:
    """Rewrite the header with sorted keys, in place and at the same length.

    safetensors writes the metadata map in Rust hash order, which changes from process to
    process; sorted, the same tensors always give the same bytes, so the content-addressed
    file name is stable and recapturing an unchanged model leaves git with nothing to commit.
    """
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) <= n:
            f.seek(8)
            f.write(text + b" " * (n - len(text)))


def _atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, text, durable=True)


def _open_regular(path: Path) -> tuple[Any, int]:
    """Open a regular file for reading (never a FIFO or device, which could block forever)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise GoldenCorrupt(f"{path}: not a regular file; a golden is plain files only. Remove it and "
                                f"recapture this golden", path)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def _is_pickle(head: bytes) -> bool:
    return head[:2] in PICKLE_MAGIC or head[:4] == ZIP_MAGIC


def _is_pickle_not_safetensors(head: bytes, size: int) -> bool:
    """Pickle/zip magic, unless the bytes frame a safetensors header: a header of 640 bytes starts
    the file with 80 02, pickle protocol 2's magic, and must not be refused for it."""
    if not _is_pickle(head):
        return False
    if len(head) >= 9 and head[8:9] == b"{":
        (n,) = struct.unpack("<Q", head[:8])
        return not n <= size - 8
    return True


def parse_json(raw: bytes) -> Any:
    """Parse JSON bytes; ValueError for anything that is not (RecursionError on deep nesting too)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


def check_format(path: Path | str, fmt: Any, current: int, recapture: str) -> None:
    """The format rule of every golden, model or operator: newer than this version is GoldenTooNew
    (rewriting it here would downgrade it for everyone), older is GoldenStale (``recapture`` says how)."""
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise GoldenCorrupt(f"{path}: manifest format {fmt!r} is not an integer", path)
    if fmt > current:
        raise GoldenTooNew(
            f"{path}: golden format {fmt} is newer than this pytest-rocm-parity understands "
            f"({current}); upgrade with `pip install -U pytest-rocm-parity` (regenerating it with "
            f"this version would write an older format for everyone)", path)
    if fmt < current:
        raise GoldenStale(f"{path}: golden format {fmt} is older than {current}; {recapture}", path)

def load_manifest(path: Path, restore: str = "") -> dict[str, Any]:
    """The manifest at ``path``, checked; GoldenCorrupt (or Stale, TooNew) saying what is wrong.
    ``restore``: how to get the committed manifest back (default: from version control)."""
    try:
        f, size = _open_regular(path)
        with f:
            if size == 0:
                raise GoldenCorrupt(f"{path}: empty manifest; recapture this golden", path)
            if size > MAX_MANIFEST_BYTES:
                raise GoldenCorrupt(f"{path}: manifest of {size} bytes exceeds {MAX_MANIFEST_BYTES}; it is not "
                                    f"a pytest-rocm-parity manifest. Recapture this golden", path)
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise GoldenCorrupt(f"{path}: cannot read manifest ({exc.strerror or exc})", path) from exc
    if _is_pickle(raw):
        raise GoldenCorrupt(f"{path}: this is a pickle/torch.save file, not a JSON manifest; it was not "
                            f"loaded (pickles can run code); recapture this golden", path)
    try:
        m = parse_json(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise GoldenCorrupt(f"{path}: manifest is not valid JSON ({exc}); recapture this golden", path) from None
    if not isinstance(m, dict) or "format" not in m or not isinstance(m.get("rungs"), dict):
        raise GoldenCorrupt(f"{path}: manifest lacks 'format'/'rungs'; not a pytest-rocm-parity golden", path)
    check_format(path, m["format"], FORMAT_VERSION, "regenerate it")
    # the edit named before what it broke: restoring the file is the fix
    recorded = m.get(MANIFEST_DIGEST_KEY)
    if recorded is not None and recorded != manifest_digest(m):
        raise GoldenCorrupt(f"{path}: the manifest was changed after its capture (its content no longer has the "
                            f"hash {MANIFEST_DIGEST_KEY} records: edited by hand, or merged from two captures); "
                            f"{restore or f'restore it from version control (git checkout {path})'}, or recapture "
                            f"this golden", path)
    problem = _manifest_problem(m)
    if problem:
        raise GoldenCorrupt(f"{path}: manifest does not describe a golden: {problem} (edited or damaged); "
                            f"recapture this golden", path)
    return m


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The hash of a manifest's content as its JSON file holds it, less the hash itself: one
    canonical serialization (sorted keys, no spaces), so the file's indentation does not count."""
    body = json.loads(json.dumps({k: v for k, v in manifest.items() if k != MANIFEST_DIGEST_KEY}, default=str))
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:16]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _str_map(x: Any) -> bool:
    return isinstance(x, dict) and all(isinstance(v, str) for v in x.values())


def _manifest_problem(m: dict[str, Any]) -> str:
    """'' when every field the replay reads has the type it expects, else what is wrong.

    Replay indexes into these fields without checks, so a bad type here would surface as
    an internal TypeError/KeyError deep in the engine instead of this one clear error.
    """
    if "name" in m and not isinstance(m["name"], str):
        return "'name' is not a string"
    if TOOL_KEY in m and not isinstance(m[TOOL_KEY], str):
        return f"{TOOL_KEY!r} is not a string"
    if PROJECT_KEY in m and not isinstance(m[PROJECT_KEY], str):
        return f"{PROJECT_KEY!r} is not a string"
    if not _str_map(m.get("fingerprint", {})):
        return "'fingerprint' is not a mapping of strings"
    if "layers" not in m:   # read as "no layers", every layer of the model would look added: stale, not corrupt
        return "'layers' (the modules it recorded) is missing"
    layers = m["layers"]
    if not isinstance(layers, list) or not all(isinstance(x, dict) and isinstance(x.get("name"), str)
                                               and _is_int(x.get("level")) and isinstance(x.get("primary"), str)
                                               for x in layers):
        return "'layers' is not a list of {name: str, level: int, primary: str}"
    dtypes = m.get("dtypes")
    if not isinstance(dtypes, list) or not all(isinstance(d, str) for d in dtypes):
        return "'dtypes' (the precisions it holds) is missing or not a list of names"
    unknown = [d for d in [*dtypes, *m["rungs"]] if d not in FLOAT_NAMES]
    if unknown:
        return f"'dtypes' or 'rungs' names {unknown[0]!r}, not a precision (one of {', '.join(FLOAT_NAMES)})"
    if sorted(dtypes) != sorted(m["rungs"]):
        return f"'dtypes' lists {', '.join(dtypes) or 'none'}, but 'rungs' holds {', '.join(m['rungs']) or 'none'}"
    for key in ("sketch", "drill"):
        v = m.get(key)
        if v is not None and (not _is_int(v) or v < 0):
            return f"{key!r} is not a non-negative integer"
    for key in ("reference_env", "lm"):
        if not isinstance(m.get(key, {}), dict):
            return f"{key!r} is not a mapping"
    lm = m.get("lm", {})
    if not all(_is_int(lm.get(k, 0)) for k in ("generate", "prompt_len")) or \
            not (isinstance(lm.get("continuation") or [], list)
                 and all(isinstance(row, list) and all(_is_int(t) for t in row) for row in lm.get("continuation") or [])):
        return "'lm' holds values of the wrong type"
    for rung, r in m["rungs"].items():
        where = f"rung {rung!r}"
        if not isinstance(r, dict):
            return f"{where} is not a mapping"
        if not isinstance(r.get("file"), str):
            return f"{where} names no tensor file"
        if not isinstance(r.get("sha256"), (str, type(None))) or not _is_int(r.get("bytes", 0)) \
                or not isinstance(r.get(FAST_DIGEST), (str, type(None))):
            return f"{where} has a bad 'sha256', '{FAST_DIGEST}' or 'bytes'"
        outs = r.get("outputs")
        if not isinstance(outs, dict) or not _str_map(outs.get("out")):
            return f"{where} has no 'outputs.out' mapping of leaf -> tensor key"
        if not _str_list(outs.get("fields", [])):
            return f"{where} has an 'outputs.fields' that is not a list of names"
        if not isinstance(r.get("layers"), list):
            return f"{where} has no 'layers' list"
        for e in r["layers"]:
            if not (isinstance(e, dict) and isinstance(e.get("key"), str) and isinstance(e.get("name"), str)
                    and _is_int(e.get("level")) and isinstance(e.get("primary"), str)
                    and _str_map(e.get("in")) and _str_map(e.get("out"))):
                return f"{where} has a layer entry without key/name/level/primary/in/out"
            if not isinstance(e.get("const_in", {}), dict):
                return f"{where} has a layer entry whose 'const_in' is not a mapping of path -> constant"
            tree = e.get("in_tree", {})
            if not (_str_map(tree) and all(v in CONTAINER_KINDS for v in tree.values())):
                return f"{where} has a layer entry whose 'in_tree' is not a mapping of path -> {'/'.join(CONTAINER_KINDS)}"
            act = e.get("act", [])
            if not (isinstance(act, list) and all(isinstance(p, str) and p in e["in"] for p in act)):
                return f"{where} has a layer entry whose 'act' is not a list of its input paths"
            if not isinstance(e.get("decides", False), bool):
                return f"{where} has a layer entry whose 'decides' is not true or false"
            if not _str_list(e.get("fields", [])):
                return f"{where} has a layer entry whose 'fields' is not a list of names"
        watch = r.get("watch", [])
        if not (isinstance(watch, list) and all(
                isinstance(e, dict) and isinstance(e.get("key"), str) and isinstance(e.get("name"), str)
                and _is_int(e.get("level")) and isinstance(e.get("primary"), str) and _str_map(e.get("out"))
                and _str_list(e.get("fields", [])) for e in watch)):
            return f"{where} has a 'watch' that is not a list of {{key, name, level, primary, out}} entries"
        order = r.get("order", [])
        if not isinstance(order, list) or not all(isinstance(k, str) for k in order):
            return f"{where} has an 'order' that is not a list of layer keys"
        ordered = set(order)
        unordered = [e["key"] for e in r["layers"] if e["key"] not in ordered] if "order" in r else []
        if unordered:   # a replay judges the calls 'order' lists: the others would pass unjudged
            return (f"{where} has an 'order' that leaves out {len(unordered)} of its layer entries "
                    f"({', '.join(unordered[:3])}{' ...' if len(unordered) > 3 else ''})")
        keys = {e["key"] for e in r["layers"]}
        lacking = [k for k in order if k not in keys]
        if lacking:   # a capture writes an entry for every call it orders: the replay would skip these
            return (f"{where} has an 'order' that names {len(lacking)} module call(s) without a layer entry "
                    f"({_few([repr(k) for k in lacking])}), which a replay would leave unjudged")
        if not isinstance(r.get("extra", {}), dict):
            return f"{where} has an 'extra' that is not a mapping"
        if r.get("sketch") is not None and (not _is_int(r["sketch"]) or r["sketch"] < 1):
            return f"{where} has a 'sketch' that is not a positive integer"
        if r.get("whole_below") is not None and (not _is_int(r["whole_below"]) or r["whole_below"] < 0):
            return f"{where} has a 'whole_below' that is not a non-negative integer"
        inputs = r.get("inputs", {})
        if not isinstance(inputs, dict) or not isinstance(inputs.get("const", {}), dict):
            return f"{where} has an 'inputs' that is not a mapping with a 'const' mapping"
        if not _str_list(inputs.get("unread", [])):
            return f"{where} has an 'inputs.unread' that is not a list of input paths"
    return ""


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _few(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (" ..." if len(items) > n else "")


# Tensor-key prefixes of a forward golden that hold a module call's (or the model output's) values:
# <prefix>/<call key>/<leaf>, or <prefix>/<output>/<leaf> for the model's outputs
_CALL_PREFIXES = ("truth/", "gtruth/", "sk/", "skt/", "x/")


def unlisted(header: dict[str, Any], manifest: dict[str, Any], dtype: str) -> str:
    """What a rung's tensor file holds that its manifest entry does not list ('' when nothing): a
    module call's truth without a layer entry, or a model output's without an ``outputs.out`` leaf.

    A capture lists every call and output it stores, so such a tensor means an edited manifest (or
    one that belongs to other tensors), whose calls a replay would leave unjudged and still pass.
    Training goldens name their tensors otherwise and are not checked here.
    """
    if manifest.get("kind", "forward") != "forward":
        return ""
    from pytest_rocm_parity.runner.engine import OUTPUT

    rung = manifest["rungs"][dtype]
    calls = {e["key"] for e in rung["layers"]}
    outs = set(rung["outputs"]["out"])
    no_entry: dict[str, None] = {}
    no_leaf: dict[str, None] = {}
    for k in header:
        prefix = next((p for p in _CALL_PREFIXES if k.startswith(p)), None)
        if prefix is None:
            continue
        rest = k[len(prefix):]
        if rest.startswith(OUTPUT + "/"):
            if rest[len(OUTPUT) + 1:] not in outs:
                no_leaf[rest[len(OUTPUT) + 1:]] = None
        elif not any(rest[:i] in calls for i, c in enumerate(rest) if c == "/"):   # a module name may hold '/'
            no_entry[rest.rsplit("/", 1)[0]] = None
    problems = []
    if no_entry:
        problems.append(f"module call(s) {_few([repr(k) for k in no_entry])} with no entry in rungs.{dtype}.layers")
    if no_leaf:
        problems.append(f"model output(s) {_few([repr(k) for k in no_leaf])} missing from rungs.{dtype}.outputs.out"
                        + (" (which is empty)" if not outs else ""))
    return "; ".join(problems)


def check_listed(path: Path, manifest: dict[str, Any], dtype: str, mpath: Path) -> None:
    """GoldenCorrupt naming the file and the manifest where the tensor file holds values the manifest
    does not list (``unlisted``); damaged bytes are named as such first."""
    header, _ = _framing(path)
    problem = unlisted(header, manifest, dtype)
    if not problem:
        return
    expected = expected_digest(manifest["rungs"][dtype])
    if expected is not None:
        verify_sha(path, expected)   # a damaged file: say that, not what the damage looks like
    raise GoldenCorrupt(
        f"{path}: holds the recorded values of {problem}, so the manifest {mpath} does not describe this file "
        f"(edited, or copied from another golden); a replay would leave them unjudged. Restore the committed "
        f"manifest (git checkout), else recapture this golden", mpath)


def check_safetensors(path: Path, expected_sha: str | None = None) -> dict[str, Any]:
    """Check a tensor file before using it; returns its header (each tensor's dtype, shape and offsets).

    The damage a user can act on is named first, in words (_framing); everything else about the
    file (dtypes, shapes, offsets inside the data) is safetensors' own validation, whose refusal is
    a GoldenCorrupt naming the file; then the content digest, where one is given.
    """
    header, data_len = _framing(path)
    _safetensors_validates(path, _cut_short(header, data_len))
    if expected_sha is not None:
        verify_sha(path, expected_sha)
    return header


def _framing(path: Path) -> tuple[dict[str, Any], int]:
    """(header, bytes after it) of a tensor file, or GoldenCorrupt naming what it is instead: not a
    regular file, empty, a git-lfs pointer, a pickle (never loaded: pickles can run code), a cut
    header. Memory is bounded by MAX_HEADER_BYTES: the header is the only part read."""
    try:
        f, size = _open_regular(path)
        with f:
            head = f.read(9)
            if size == 0:
                raise GoldenCorrupt(f"{path}: empty tensor file; recapture this golden", path)
            if head.startswith(b"version ") and b"git-lfs" in head + f.read(120):
                raise GoldenCorrupt(
                    f"{path}: a git-lfs pointer ({size} bytes of text), not the golden's tensors: the checkout "
                    f"did not fetch the git-lfs files. Run `git lfs pull` (in CI: actions/checkout with "
                    f"`lfs: true`, docs/ci.md)", path)
            if _is_pickle_not_safetensors(head, size):
                raise GoldenCorrupt(f"{path}: pickle/torch.save data where a safetensors file belongs; "
                                    f"it was not loaded (pickles can run code); recapture this golden", path)
            if len(head) < 8:
                raise GoldenCorrupt(f"{path}: truncated ({size} bytes); recapture this golden", path)
            (n,) = struct.unpack("<Q", head[:8])
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise GoldenCorrupt(f"{path}: safetensors header length {n} is impossible for a {size}-byte "
                                    f"file (corrupt or truncated); recapture this golden", path)
            f.seek(8)
            raw = f.read(n)
    except OSError as exc:
        raise GoldenCorrupt(f"{path}: cannot read ({exc.strerror or exc})", path) from exc
    try:
        header = parse_json(raw)
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise GoldenCorrupt(f"{path}: corrupt safetensors header ({exc}); recapture this golden", path) from None
    return header, size - 8 - n


def _cut_short(header: dict[str, Any], data_len: int) -> bool:
    """Whether a tensor of the header ends past the file's data: the file was truncated (the usual
    damage, worth saying in words where safetensors' refusal does not)."""
    for key, info in header.items():
        try:
            if key != "__metadata__" and int(info["data_offsets"][1]) > data_len:
                return True
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return False


def _safetensors_validates(path: Path, cut_short: bool = False) -> None:
    """safetensors' validation of the framing (opened, nothing read): GoldenCorrupt where it refuses."""
    from safetensors import safe_open

    with safetensors_refusal(path, cut_short):
        with safe_open(str(path), framework="numpy"):
            pass


@contextlib.contextmanager
def safetensors_refusal(path: Path, cut_short: bool = False) -> Iterator[None]:
    """safetensors refusing ``path`` (a SafetensorError, or a Rust panic) as GoldenCorrupt naming it;
    ``cut_short``: the file is shorter than its header says, which the message adds."""
    try:
        yield
    except BaseException as exc:
        if not (isinstance(exc, Exception) or is_panic(exc)):
            raise
        cut = ": the file is shorter than its header says (truncated: an interrupted copy or download)" \
            if cut_short else ""
        raise GoldenCorrupt(f"{path}: safetensors refused the file ({exc}){cut}; recapture this golden",
                            path) from None


def check_size(path: Path, rung: dict[str, Any]) -> None:
    """Raise GoldenCorrupt unless the file holds as many bytes as its manifest entry records.

    The recorded ``bytes`` is compared with the file itself, so a manifest cannot vouch for a file
    of another size (a truncated copy, a git-lfs pointer that was never pulled).
    """
    expected = rung.get("bytes")
    if not _is_int(expected):
        return
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise GoldenCorrupt(f"{path}: cannot read ({exc.strerror or exc})", path) from exc
    if size != expected:
        _framing(path)   # damage the framing shows (empty, pickle, a git-lfs pointer, cut header) named as such
        raise GoldenCorrupt(
            f"{path}: holds {size} bytes where its manifest records {expected} (truncated, replaced, or a "
            f"git-lfs pointer that was not pulled); restore the committed file (git checkout, or `git lfs pull` "
            f"where the goldens are in git-lfs), else recapture this golden", path)


# (real path, size, mtime_ns, inode, expected sha) of files this process has hashed already: a suite
# that replays one golden in several checks reads its bytes for the hash once, as git trusts its index.
_VERIFIED: set[tuple[str, int, int, int, str]] = set()


def _stamp(path: Path, expected_sha: str) -> tuple[str, int, int, int, str]:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino, expected_sha)


def verify_sha(path: Path, expected_sha: str) -> None:
    """Raise GoldenCorrupt unless the file's digest is the manifest's (expected_digest: XXH3-128 or
    SHA-256; skipped if this process verified the same file already)."""
    try:
        stamp = _stamp(path, expected_sha)
        if stamp in _VERIFIED:
            return
        ok = digest_matches(path, expected_sha)
    except OSError as exc:
        raise GoldenCorrupt(f"{path}: cannot read ({exc.strerror or exc})", path) from exc
    if not ok:
        raise GoldenCorrupt(f"{path}: content hash differs from the manifest's (this file or the manifest "
                            f"beside it was edited or damaged); recapture this golden", path)
    _VERIFIED.add(stamp)


class BackgroundVerify:
    """verify_sha in a thread (hashlib releases the GIL), so hashing overlaps the replay's forwards.

    result() re-raises the thread's GoldenCorrupt; the replay calls it before it reports anything,
    and first when the replay itself failed, so damage is named instead of its symptoms.
    """

    def __init__(self, path: Path, expected_sha: str | None) -> None:
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if expected_sha is None:
            return
        try:
            if _stamp(path, expected_sha) in _VERIFIED:
                return
        except OSError:
            pass     # verify_sha reports it
        self._thread = threading.Thread(target=self._run, args=(path, expected_sha), daemon=True,
                                        name="parity-verify")
        self._thread.start()

    def _run(self, path: Path, expected_sha: str) -> None:
        try:
            verify_sha(path, expected_sha)
        except BaseException as exc:  # handed to the caller's thread by result()
            self.error = exc

    def result(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.error is not None:
            raise self.error


def is_panic(exc: BaseException) -> bool:
    # pyo3 turns a Rust panic into PanicException, which derives from BaseException.
    return type(exc).__name__ == "PanicException"
