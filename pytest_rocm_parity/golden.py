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

import hashlib
import json
import os
import re
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_rocm_parity.errors import (
    GoldenCorrupt, GoldenExists, GoldenMissing, GoldenStale, GoldenWriteError,
)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024      # safetensors' own bound
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
SAFETENSORS_DTYPES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "U16": 2, "U32": 4,
    "U64": 8, "C64": 8,
}
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_NAME = 96


def safe_name(name: str) -> str:
    """A file-system-safe directory name for any check name, distinct for distinct names.

    Names already safe are kept (so `a.b` and `a_b` stay apart); anything
    altered or shortened gets a hash of the exact original appended.
    """
    cleaned = _SAFE.sub("_", name).strip("._") or "golden"
    cleaned = cleaned.replace("..", "_")
    if cleaned == name and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{cleaned[:MAX_NAME]}-{digest}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


class GoldenStore:
    """Goldens under one root directory; every path it hands out stays inside the root."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

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
            if d.is_dir() and m.is_file():
                try:
                    yield str(json.loads(m.read_text("utf-8")).get("name", d.name)), d
                except (OSError, ValueError):
                    yield d.name, d

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
        return load_manifest(path)

    def rung_file(self, name: str, manifest: dict[str, Any], dtype: str) -> Path:
        rung = manifest["rungs"].get(dtype)
        if rung is None:
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
        return path

    # -- writing ---------------------------------------------------------------------------
    def write(self, name: str, manifest: dict[str, Any], rungs: dict[str, dict[str, Any]],
              overwrite: bool) -> Path:
        """Write all rungs, then commit by replacing the manifest; the old golden survives any failure."""
        d = self.dir_for(name)
        mpath = d / MANIFEST
        if mpath.exists() and not overwrite:
            raise GoldenExists(f"{mpath}: golden for {name!r} exists; capture never overwrites it", mpath)
        written: list[Path] = []
        try:
            d.mkdir(parents=True, exist_ok=True)
            for dtype, tensors in rungs.items():
                tmp = _write_tensors_tmp(d, tensors, {"format": str(FORMAT_VERSION), "name": name, "dtype": dtype})
                digest = sha256_file(tmp)
                final = d / f"{dtype}-{digest[:12]}.safetensors"
                os.replace(tmp, final)
                written.append(final)
                manifest["rungs"][dtype]["file"] = final.name
                manifest["rungs"][dtype]["sha256"] = digest
                manifest["rungs"][dtype]["bytes"] = final.stat().st_size
            _atomic_write_text(mpath, json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n")
        except OSError as exc:
            keep = _referenced(mpath)
            for p in written:
                if p.name not in keep:
                    p.unlink(missing_ok=True)
            raise GoldenWriteError(
                f"{d}: writing the golden for {name!r} failed ({exc.strerror or exc}); the previous golden, "
                f"if any, is intact. Free disk space or fix permissions on {d} and capture again.", d) from exc
        self.collect_garbage(d)
        return mpath

    def collect_garbage(self, d: Path) -> None:
        keep = _referenced(d / MANIFEST)
        for p in d.iterdir():
            if p.name == MANIFEST or p.name in keep:
                continue
            if p.suffix == ".safetensors" or p.name.startswith(".tmp-"):
                p.unlink(missing_ok=True)


def _referenced(mpath: Path) -> set[str]:
    try:
        m = json.loads(mpath.read_text("utf-8"))
        return {str(r.get("file")) for r in m.get("rungs", {}).values()}
    except (OSError, ValueError, AttributeError):
        return set()


def _write_tensors_tmp(d: Path, tensors: dict[str, Any], metadata: dict[str, str]) -> Path:
    from safetensors.torch import save_file

    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=d)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_manifest(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size == 0:
            raise GoldenCorrupt(f"{path}: empty manifest; recapture this golden", path)
        if size > MAX_MANIFEST_BYTES:
            raise GoldenCorrupt(f"{path}: manifest of {size} bytes exceeds {MAX_MANIFEST_BYTES}", path)
        raw = path.read_bytes()
    except OSError as exc:
        raise GoldenCorrupt(f"{path}: cannot read manifest ({exc.strerror or exc})", path) from exc
    if raw[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05") or raw[:4] == b"PK\x03\x04":
        raise GoldenCorrupt(f"{path}: this is a pickle/torch.save file, not a JSON manifest; it was not "
                            f"loaded (pickles can run code). Recapture the golden.", path)
    try:
        m = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise GoldenCorrupt(f"{path}: manifest is not valid JSON ({exc}); recapture this golden", path) from None
    if not isinstance(m, dict) or "format" not in m or not isinstance(m.get("rungs"), dict):
        raise GoldenCorrupt(f"{path}: manifest lacks 'format'/'rungs'; not a pytest-rocm-parity golden", path)
    fmt = m["format"]
    if not isinstance(fmt, int):
        raise GoldenCorrupt(f"{path}: manifest format {fmt!r} is not an integer", path)
    if fmt > FORMAT_VERSION:
        raise GoldenCorrupt(
            f"{path}: golden format {fmt} is newer than this pytest-rocm-parity understands "
            f"({FORMAT_VERSION}); upgrade with `pip install -U pytest-rocm-parity`", path)
    if fmt < FORMAT_VERSION:
        raise GoldenStale(f"{path}: golden format {fmt} is older than {FORMAT_VERSION}; regenerate it", path)
    return m


def check_safetensors(path: Path, expected_sha: str | None = None) -> dict[str, Any]:
    """Validate a tensor file's framing before any library parses it; returns its header."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if size == 0:
                raise GoldenCorrupt(f"{path}: empty tensor file; recapture this golden", path)
            if head[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05") or head[:4] == b"PK\x03\x04":
                raise GoldenCorrupt(f"{path}: pickle/torch.save data where a safetensors file belongs; "
                                    f"it was not loaded (pickles can run code). Recapture the golden.", path)
            if len(head) < 8:
                raise GoldenCorrupt(f"{path}: truncated ({size} bytes); recapture this golden", path)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise GoldenCorrupt(f"{path}: safetensors header length {n} is impossible for a {size}-byte "
                                    f"file (corrupt or truncated); recapture this golden", path)
            raw = f.read(n)
    except OSError as exc:
        raise GoldenCorrupt(f"{path}: cannot read ({exc.strerror or exc})", path) from exc
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise GoldenCorrupt(f"{path}: corrupt safetensors header ({exc}); recapture this golden", path) from None
    data_len = size - 8 - n
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise GoldenCorrupt(f"{path}: bad entry for tensor {key!r} in header", path) from None
        if dtype not in SAFETENSORS_DTYPES:
            raise GoldenCorrupt(f"{path}: tensor {key!r} has unknown dtype {dtype!r}; this golden needs a "
                                f"newer pytest-rocm-parity or is corrupt", path)
        numel = 1
        for s in shape:
            if not isinstance(s, int) or s < 0:
                raise GoldenCorrupt(f"{path}: tensor {key!r} has bad shape {shape!r}", path)
            numel *= s
        if not (isinstance(start, int) and isinstance(end, int)) or not 0 <= start <= end <= data_len \
                or end - start != numel * SAFETENSORS_DTYPES[dtype]:
            raise GoldenCorrupt(f"{path}: tensor {key!r} lies outside the file's data (truncated or "
                                f"corrupt); recapture this golden", path)
    if expected_sha is not None and sha256_file(path) != expected_sha:
        raise GoldenCorrupt(f"{path}: content hash differs from the manifest's (edited or damaged); "
                            f"recapture this golden", path)
    return header


class RungReader:
    """Lazy per-key access to one rung's tensors, loaded straight onto ``device``."""

    def __init__(self, path: Path, device: str, expected_sha: str | None = None) -> None:
        from safetensors import safe_open

        self.path = path
        self.header = check_safetensors(path, expected_sha)
        try:
            self._f = safe_open(str(path), framework="pt", device=str(device))
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise GoldenCorrupt(f"{path}: safetensors refused the file ({exc}); recapture this golden", path) from None
        self.keys = set(self._f.keys())

    def get(self, key: str) -> Any:
        if key not in self.keys:
            raise GoldenCorrupt(f"{self.path}: manifest names tensor {key!r} that the file lacks "
                                f"(manifest and tensors do not match); recapture this golden", self.path)
        try:
            return self._f.get_tensor(key)
        except Exception as exc:
            raise GoldenCorrupt(f"{self.path}: cannot read tensor {key!r} ({exc})", self.path) from None
