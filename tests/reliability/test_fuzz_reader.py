"""Fuzz the golden reader with random and mutated bytes of real golden files (tensor
files, their headers, manifests).  Whatever the bytes, reading a golden ends in success or one of the
plugin's own errors (ParityError), never another exception, never a hang, and reads at most what the
header limits allow.  ~200 examples per target in the normal run, 10,000 under -m slow."""
from __future__ import annotations

import contextlib
import functools
import json
import shutil
import signal
import struct
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_rocm_parity.errors import ParityError
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import MAX_HEADER_BYTES, MAX_MANIFEST_BYTES, check_safetensors, load_manifest
from reliability_helpers import Golden, make_golden, read_header, write_with_header

FAST = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
SOAK = settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
HANG_S = 20


class Hang(Exception):
    """Not a ParityError: a read that takes this long fails the fuzz."""


@contextlib.contextmanager
def no_hang(seconds: float = HANG_S) -> Iterator[None]:
    def fire(*_: Any) -> None:
        raise Hang(f"reading took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@functools.cache
def seed_golden() -> tuple[bytes, bytes, str]:
    """(tensor file, manifest, tensor file name) of a real two-layer golden."""
    root = Path(tempfile.mkdtemp(prefix="parity-fuzz-"))
    try:
        g = make_golden(root)
        return g.tensor_file().read_bytes(), g.manifest.read_bytes(), g.tensor_file().name
    finally:
        shutil.rmtree(root)


# -- strategies ------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=12)


def _paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


@st.composite
def mutated_json(draw: st.DrawFn, doc: Any) -> Any:
    """``doc`` with a few nodes replaced by random JSON, deleted, or their type swapped."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        if not path:
            doc = draw(json_values)
            continue
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            old = parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        op = draw(st.sampled_from(["replace", "delete", "retype"]))
        if op == "delete":
            del parent[path[-1]]
        elif op == "retype":
            parent[path[-1]] = draw(st.sampled_from([[old], {"x": old}, str(old), None, 0, -1, 2**64, 1.5, True]))
        else:
            parent[path[-1]] = draw(json_values)
    return doc


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "length", "splice"]))
        i = draw(st.integers(0, max(len(b) - 1, 0)))
        if op == "flip" and b:
            b[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and b:
            b[i] = draw(st.sampled_from([0, 0xFF, ord("{"), ord("}"), ord('"'), ord("["), 0x80]))
        elif op == "truncate":
            del b[i:]
        elif op == "insert":
            b[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del b[i:i + draw(st.integers(1, 64))]
        elif op == "length":
            b[0:8] = struct.pack("<Q", draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, len(b) + 8))))
        elif op == "splice":
            j = draw(st.integers(0, max(len(b) - 1, 0)))
            b[i:i] = b[j:j + draw(st.integers(1, 256))]
    return bytes(b)


@st.composite
def tensor_files(draw: st.DrawFn) -> bytes:
    tensors, _, _ = seed_golden()
    kind = draw(st.sampled_from(["random", "bytes", "header"]))
    if kind == "random":
        return draw(st.binary(max_size=2048))
    if kind == "bytes":
        return draw(mutated_bytes(tensors))
    n = struct.unpack("<Q", tensors[:8])[0]
    header = json.loads(tensors[8:8 + n])
    h = json.dumps(draw(mutated_json(header))).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + tensors[8 + n:]


@st.composite
def manifests(draw: st.DrawFn) -> bytes:
    _, manifest, _ = seed_golden()
    kind = draw(st.sampled_from(["random", "bytes", "json", "json"]))
    if kind == "random":
        return draw(st.binary(max_size=1024))
    if kind == "bytes":
        return draw(mutated_bytes(manifest))
    return json.dumps(draw(mutated_json(json.loads(manifest)))).encode()


# -- targets ---------------------------------------------------------------------------------------

def read_tensor_file(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    with no_hang():
        try:
            check_safetensors(path)
            reader = RungReader(path, "cpu")
            for key in sorted(reader.keys):
                reader.get(key)
        except ParityError:
            pass


def replay_with_manifest(g: Golden, data: bytes) -> None:
    g.manifest.write_bytes(data)
    with no_hang():
        try:
            load_manifest(g.manifest)
            g.replay()
        except ParityError:
            pass


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def fuzz_golden(tmp_path_factory: pytest.TempPathFactory) -> Golden:
    return make_golden(tmp_path_factory.mktemp("fuzz-golden"))


@FAST
@given(data=tensor_files())
def test_fuzz_tensor_file(fuzz_dir: Path, data: bytes) -> None:
    read_tensor_file(fuzz_dir / "x.safetensors", data)


@FAST
@given(data=manifests())
def test_fuzz_manifest_through_replay(fuzz_golden: Golden, data: bytes) -> None:
    replay_with_manifest(fuzz_golden, data)


@pytest.mark.slow
@SOAK
@given(data=tensor_files())
def test_fuzz_tensor_file_soak(fuzz_dir: Path, data: bytes) -> None:
    read_tensor_file(fuzz_dir / "x.safetensors", data)


@pytest.mark.slow
@SOAK
@given(data=manifests())
def test_fuzz_manifest_soak(fuzz_golden: Golden, data: bytes) -> None:
    replay_with_manifest(fuzz_golden, data)


def test_seed_golden_is_valid(golden: Golden) -> None:
    """The fuzz starts from real files that read and replay cleanly (so mutations are near misses)."""
    tensors, manifest, name = seed_golden()
    golden.manifest.write_bytes(manifest)
    (golden.dir / name).write_bytes(tensors)
    assert golden.replay()[0].passed
    header, _ = read_header(golden.tensor_file())
    assert len(header) > 5 and json.loads(manifest)["format"] == 1


# -- memory is bounded by the header limits --------------------------------------------------------

def _peak(fn: Any) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(ParityError):
            fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


MiB = 1 << 20


def test_header_over_the_limit_is_not_read(tmp_path: Path) -> None:
    p = tmp_path / "huge.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        f.truncate(MAX_HEADER_BYTES + 1 + 8 + MiB)   # sparse: large on paper, nothing on disk
    assert _peak(lambda: check_safetensors(p)) < MiB


def test_header_within_the_limit_costs_about_its_size(tmp_path: Path) -> None:
    n = 16 * MiB
    p = tmp_path / "big.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", n))
        f.truncate(8 + n)            # a header of zeros: read, then refused as JSON
    assert _peak(lambda: check_safetensors(p)) < 4 * n


def test_manifest_over_the_limit_is_not_read(tmp_path: Path) -> None:
    p = tmp_path / "manifest.json"
    with open(p, "wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)
    assert _peak(lambda: load_manifest(p)) < MiB


def test_header_claiming_huge_tensors_allocates_nothing(golden: Golden, tmp_path: Path) -> None:
    """Shapes that multiply to 2**80 elements are refused from the framing, before any allocation."""
    p = tmp_path / "x.safetensors"
    header, data = read_header(golden.tensor_file())
    key = next(k for k in header if k != "__metadata__")
    header[key]["shape"] = [2**40, 2**40]
    write_with_header(p, header, data)
    assert _peak(lambda: RungReader(p, "cpu")) < MiB
