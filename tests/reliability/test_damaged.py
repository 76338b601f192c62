"""A damaged or hostile golden is a GoldenCorrupt naming the file and the fix; never a
crash, never silently accepted, never executed, and the replay changes nothing on disk."""
from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest
import torch

from pytest_rocm_parity.errors import GoldenCorrupt, GoldenMissing, GoldenStale, GoldenTooNew, ParityError
from pytest_rocm_parity.golden.store import MAX_HEADER_BYTES, FORMAT_VERSION, check_safetensors, load_manifest
from reliability_helpers import Golden, message_names, read_header, write_with_header
from manifest_edits import rewrite_manifest

RECAPTURE = "recapture"


def corrupt(golden: Golden, match: str) -> GoldenCorrupt:
    """Replay must raise GoldenCorrupt matching ``match`` and leave every file as it was."""
    before = golden.snapshot()
    with pytest.raises(GoldenCorrupt, match=match) as info:
        golden.replay()
    assert golden.snapshot() == before, "a failed replay changed the golden"
    return info.value


# -- tensor file ----------------------------------------------------------------------------------

@pytest.mark.parametrize("keep", [0.5, 0.99, 12, 5])
def test_truncated_tensor_file(golden: Golden, keep: float) -> None:
    p = golden.tensor_file()
    raw = p.read_bytes()
    p.write_bytes(raw[: int(len(raw) * keep) if keep < 1 else int(keep)])
    exc = corrupt(golden, "truncated|outside the file's data|impossible")
    message_names(exc, p, RECAPTURE)


def test_truncated_tensor_file_caught_without_manifest_hash(golden: Golden) -> None:
    """The framing check alone (no digest or bytes in the manifest) still refuses a truncated file:
    safetensors' validation, named as ours."""
    m = golden.manifest_json()
    del m["rungs"]["float32"]["sha256"], m["rungs"]["float32"]["bytes"]
    golden.write_manifest(m)
    p = golden.tensor_file()
    p.write_bytes(p.read_bytes()[:-4])
    message_names(corrupt(golden, "safetensors refused the file .*shorter than its header says .truncated"), p, RECAPTURE)


def test_corrupted_header_json(golden: Golden) -> None:
    p = golden.tensor_file()
    raw = bytearray(p.read_bytes())
    raw[8] = ord("[")           # the header's opening brace
    raw[9:12] = b"\xff\xfe\x00"  # and invalid UTF-8
    p.write_bytes(bytes(raw))
    message_names(corrupt(golden, "corrupt safetensors header"), p, RECAPTURE)


@pytest.mark.parametrize("n", [2**64 - 1, 2**40, MAX_HEADER_BYTES + 1])
def test_oversized_header_length(golden: Golden, n: int) -> None:
    p = golden.tensor_file()
    raw = p.read_bytes()
    p.write_bytes(struct.pack("<Q", n) + raw[8:])
    message_names(corrupt(golden, "header length .* is impossible"), p, RECAPTURE)


def test_header_larger_than_limit_is_refused_before_reading(tmp_path: Path) -> None:
    """A sparse 200 MB file claiming a 150 MB header: refused by size, nothing read."""
    p = tmp_path / "big.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", MAX_HEADER_BYTES + 8))
        f.truncate(MAX_HEADER_BYTES * 2)
    with pytest.raises(GoldenCorrupt, match="impossible") as info:
        check_safetensors(p)
    message_names(info.value, p)


@pytest.mark.parametrize("dtype", ["F7", "C128", "Q4_K", ["F32"], None, 3])
def test_unknown_dtype(golden: Golden, dtype: object) -> None:
    p = golden.tensor_file()
    header, data = read_header(p)
    key = next(k for k in header if k != "__metadata__")
    header[key]["dtype"] = dtype
    write_with_header(p, header, data)
    golden.reseal()   # the manifest agrees with the file: only the dtype is wrong
    exc = corrupt(golden, "safetensors refused the file")
    message_names(exc, p)


def test_a_null_header_metadata_replays_as_none(golden: Golden) -> None:
    """safetensors reads a null __metadata__ as none (the reader's fuzzing found it crashing the
    replay): the golden replays as one without metadata would."""
    p = golden.tensor_file()
    header, data = read_header(p)
    header["__metadata__"] = None
    write_with_header(p, header, data)
    golden.reseal()
    assert golden.replay()[0].passed


@pytest.mark.parametrize("field,value", [("shape", 7), ("shape", [-1]), ("shape", [True, 2]),
                                         ("data_offsets", [5]), ("data_offsets", [0, 10**30]),
                                         ("data_offsets", ["0", "4"])])
def test_bad_tensor_entry(golden: Golden, field: str, value: object) -> None:
    p = golden.tensor_file()
    header, data = read_header(p)
    key = next(k for k in header if k != "__metadata__")
    header[key][field] = value
    write_with_header(p, header, data)
    golden.reseal()
    message_names(corrupt(golden, "safetensors refused the file"), p, RECAPTURE)


def test_overlapping_tensors_refused_by_safetensors(golden: Golden) -> None:
    """Tensors that overlap in the data: safetensors refuses them, as GoldenCorrupt."""
    p = golden.tensor_file()
    header, data = read_header(p)
    keys = [k for k in header if k != "__metadata__" and header[k]["dtype"] == "F32"
            and header[k]["shape"] == [3, 4]]
    header[keys[1]]["data_offsets"] = header[keys[0]]["data_offsets"]
    write_with_header(p, header, data)
    golden.reseal()
    message_names(corrupt(golden, "safetensors refused"), p, RECAPTURE)


# -- manifest ------------------------------------------------------------------------------------

def test_manifest_format_newer_than_tool(golden: Golden) -> None:
    """Not corrupt: a newer plugin wrote it. The fix is an upgrade, never a regeneration, which would
    write the older format over it."""
    m = golden.manifest_json()
    m["format"] = FORMAT_VERSION + 1
    golden.write_manifest(m)
    before = golden.snapshot()
    with pytest.raises(GoldenTooNew, match="newer than this pytest-rocm-parity") as info:
        golden.replay()
    assert not isinstance(info.value, GoldenCorrupt) and golden.snapshot() == before
    message_names(info.value, golden.manifest, "pip install -U pytest-rocm-parity")


def test_manifest_format_older_is_stale(golden: Golden) -> None:
    m = golden.manifest_json()
    m["format"] = FORMAT_VERSION - 1
    golden.write_manifest(m)
    with pytest.raises(GoldenStale, match="older") as info:
        golden.replay()
    message_names(info.value, golden.manifest, "regenerate")


@pytest.mark.parametrize("fmt", ["1", 1.0, True, None])
def test_manifest_format_not_an_integer(golden: Golden, fmt: object) -> None:
    m = golden.manifest_json()
    m["format"] = fmt
    golden.write_manifest(m)
    message_names(corrupt(golden, "not an integer"), golden.manifest)


def test_manifest_hash_differs_from_tensors(golden: Golden, tmp_path: Path) -> None:
    """Another golden's tensor file under this golden's name: the content hash gives it away."""
    from parity_models import tiny
    from reliability_helpers import make_golden

    other = make_golden(tmp_path / "other", model=tiny(seed=1))
    p = golden.tensor_file()
    p.write_bytes(other.tensor_file().read_bytes())
    message_names(corrupt(golden, "content hash differs"), p, RECAPTURE)


def test_manifest_names_tensor_the_file_lacks(golden: Golden) -> None:
    m = golden.manifest_json()
    m["rungs"]["float32"]["outputs"]["out"]["0"] = "t/999"
    golden.write_manifest(m)
    message_names(corrupt(golden, "manifest and tensors do not match"), golden.tensor_file(), RECAPTURE)


def test_manifest_names_missing_tensor_file(golden: Golden) -> None:
    p = golden.tensor_file()
    p.unlink()
    message_names(corrupt(golden, "is missing"), p, RECAPTURE)


@pytest.mark.parametrize("fname", ["../../etc/passwd", "/etc/passwd", ".hidden", "a\\b", ""])
def test_manifest_tensor_file_name_escaping(golden: Golden, fname: str) -> None:
    m = golden.manifest_json()
    m["rungs"]["float32"]["file"] = fname
    golden.write_manifest(m)
    message_names(corrupt(golden, "bad tensor file name"), golden.manifest)


@pytest.mark.parametrize("path,value", [
    (("rungs", "float32"), []), (("rungs", "float32", "layers"), {}), (("rungs", "float32", "layers", 0, "in"), []),
    (("rungs", "float32", "layers", 0, "out", "0"), ["t/1"]), (("rungs", "float32", "layers", 0, "level"), "0"),
    (("rungs", "float32", "outputs"), None), (("rungs", "float32", "order"), [[1]]), (("rungs", "float32", "bytes"), "x"),
    (("fingerprint",), [1]), (("layers",), [{"nom": "fc1"}]), (("reference_env",), "cuda"), (("name",), 5),
    (("rungs", "float32", "file"), None), (("lm",), {"generate": "3"}),
    (("rungs", "float32", "layers", 0, "const_in"), ["x"]), (("rungs", "float32", "layers", 0, "in_tree"), []),
    (("rungs", "float32", "layers", 0, "in_tree"), {"args": "set"}), (("rungs", "float32", "layers", 0, "decides"), "no"),
])
def test_manifest_fields_of_wrong_type(golden: Golden, path: tuple[object, ...], value: object) -> None:
    """Every field the replay indexes is type-checked at load: GoldenCorrupt, not a TypeError."""
    m = golden.manifest_json()
    node = m
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    golden.write_manifest(m)
    message_names(corrupt(golden, "manifest does not describe a golden|bad tensor file|not a string|names no"),
                  golden.manifest)


def test_manifest_whose_order_leaves_out_recorded_calls(golden: Golden) -> None:
    """A bad merge that cut a rung's 'order' down would leave the calls it dropped unjudged, and the
    check would pass: the manifest is refused instead."""
    m = golden.manifest_json()
    rung = m["rungs"]["float32"]
    dropped = [e["key"] for e in rung["layers"]][1:]
    rung["order"] = rung["order"][:1]
    golden.write_manifest(m)
    message_names(corrupt(golden, f"'order' that leaves out {len(dropped)} of its layer entries"), golden.manifest)


def test_manifest_without_an_ordered_calls_entry(golden: Golden) -> None:
    """The last call's layer entry and the model outputs cut from the manifest, 'order', 'selected' and
    the top-level 'layers' still naming it: a fault there would pass unjudged, so the manifest is refused."""
    m = golden.manifest_json()
    rung = m["rungs"]["float32"]
    rung["layers"] = [e for e in rung["layers"] if e["key"] != "fc2"]
    rung["outputs"]["out"] = {}
    golden.write_manifest(m)
    message_names(corrupt(golden, "'order' that names 1 module call.s. without a layer entry .'fc2'."),
                  golden.manifest, RECAPTURE)


def test_manifest_without_a_calls_entry_its_tensor_file_holds(golden: Golden) -> None:
    """The call dropped from 'order' too: the tensor file still holds its recorded values, which the
    manifest no longer lists."""
    m = golden.manifest_json()
    rung = m["rungs"]["float32"]
    rung["layers"] = [e for e in rung["layers"] if e["key"] != "fc2"]
    rung["order"] = [k for k in rung["order"] if k != "fc2"]
    golden.write_manifest(m)
    exc = corrupt(golden, "module call.s. 'fc2' with no entry in rungs.float32.layers")
    message_names(exc, golden.tensor_file(), str(golden.manifest), RECAPTURE)


def test_manifest_with_its_model_outputs_emptied(golden: Golden) -> None:
    """A capture lists every output it records the truth of: an emptied outputs.out is corrupt, not
    an output left unjudged."""
    m = golden.manifest_json()
    m["rungs"]["float32"]["outputs"]["out"] = {}
    golden.write_manifest(m)
    exc = corrupt(golden, r"model output.s. '0' missing from rungs.float32.outputs.out \(which is empty\)")
    message_names(exc, golden.tensor_file(), str(golden.manifest), RECAPTURE)


@pytest.mark.parametrize("edit", [
    lambda m: m["rungs"]["float32"].update(tf32=True),
    lambda m: m["fingerprint"].update(structure="deadbeef"),
    lambda m: m["rungs"]["float32"]["layers"].pop(0),
    lambda m: m.update(test="elsewhere.py::test_x"),
], ids=["tf32", "structure", "a-layer-deleted", "test"])
def test_a_manifest_edited_after_capture_is_corrupt_naming_it_and_the_restore(golden: Golden, edit: Any) -> None:
    """A hand edit (or a merge of two captures) changes what the replay judges by while every tensor
    file still matches: the manifest's own hash finds it, and the error says how to restore it."""
    m = golden.manifest_json()
    edit(m)
    golden.manifest.write_text(json.dumps(m), "utf-8")   # not signed again, as an editor leaves it
    exc = corrupt(golden, "the manifest was changed after its capture")
    message_names(exc, golden.manifest, f"git checkout {golden.manifest}")


def test_a_manifest_that_records_no_hash_is_read_as_before(golden: Golden) -> None:
    """A golden written before the manifest recorded its own hash replays as it did."""
    m = golden.manifest_json()
    del m["manifest_sha256"]
    golden.manifest.write_text(json.dumps(m), "utf-8")
    assert golden.replay()[0].passed


def test_manifest_of_another_golden(golden: Golden) -> None:
    m = golden.manifest_json()
    m["name"] = "someone-else"
    golden.write_manifest(m)
    message_names(corrupt(golden, "captured for 'someone-else', not 'tiny'"), golden.manifest, "--parity-regen")


@pytest.mark.parametrize("text", ["[" * 100_000, '{"format": 1, "rungs": ' + "[" * 100_000, "not json", "{}", "[]",
                                  '{"format": 1}', '"format"', "\ufeff{}"],
                         ids=["deep-array", "deep-rungs", "text", "empty-object", "array", "no-rungs", "string", "bom"])
def test_manifest_not_a_manifest(golden: Golden, text: str) -> None:
    golden.manifest.write_text(text, "utf-8")
    message_names(corrupt(golden, "not valid JSON|lacks 'format'/'rungs'"), golden.manifest)


def test_manifest_is_a_fifo_does_not_hang(golden: Golden) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    golden.manifest.unlink()
    os.mkfifo(golden.manifest)
    with pytest.raises(GoldenCorrupt, match="not a regular file") as info:
        golden.replay()
    message_names(info.value, golden.manifest)


def test_manifest_is_a_directory(golden: Golden) -> None:
    golden.manifest.unlink()
    golden.manifest.mkdir()
    message_names(corrupt(golden, "not a regular file|cannot read"), golden.manifest)


# -- empty files ---------------------------------------------------------------------------------

def test_empty_manifest(golden: Golden) -> None:
    golden.manifest.write_bytes(b"")
    message_names(corrupt(golden, "empty manifest"), golden.manifest, RECAPTURE)


def test_empty_tensor_file(golden: Golden) -> None:
    p = golden.tensor_file()
    p.write_bytes(b"")
    message_names(corrupt(golden, "empty tensor file"), p, RECAPTURE)


# -- links leaving the golden directory ----------------------------------------------------------

def test_manifest_symlink_outside(golden: Golden, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes(golden.manifest.read_bytes())   # a perfectly valid manifest, but outside
    golden.manifest.unlink()
    golden.manifest.symlink_to(outside)
    message_names(corrupt(golden, "outside the golden directory"), golden.manifest, "Replace the link")


def test_tensor_file_symlink_outside(golden: Golden, tmp_path: Path) -> None:
    p = golden.tensor_file()
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(p.read_bytes())
    p.unlink()
    p.symlink_to(outside)
    message_names(corrupt(golden, "outside the golden directory"), p, "Replace the link")


def test_golden_directory_symlink_outside_is_not_read_or_written(golden: Golden, tmp_path: Path) -> None:
    """Neither replay nor a regenerating capture goes through a directory link that leaves the root;
    the files out there are neither read, overwritten nor garbage-collected."""
    outside = tmp_path / "outside"
    golden.dir.rename(outside)
    (outside / "victim.safetensors").write_bytes(b"not ours")
    golden.dir.symlink_to(outside, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    with pytest.raises(GoldenCorrupt, match="outside the golden directory"):
        golden.replay()
    with pytest.raises(GoldenCorrupt, match="outside the golden directory") as info:
        golden.capture(overwrite=True)
    message_names(info.value, golden.dir)
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before


def test_symlink_inside_the_root_is_followed(golden: Golden) -> None:
    """Links are fine while they stay inside the golden directory (e.g. a shared tensor file)."""
    p = golden.tensor_file()
    real = golden.store.root / "shared.safetensors"
    p.rename(real)
    p.symlink_to(real)
    assert golden.replay()[0].passed


def test_dangling_manifest_link_is_missing(golden: Golden) -> None:
    golden.manifest.unlink()
    golden.manifest.symlink_to(golden.dir / "nowhere.json")
    with pytest.raises((GoldenMissing, GoldenCorrupt)):
        golden.replay()


# -- pickles are never loaded --------------------------------------------------------------------

class _Bomb:
    """Unpickling this creates ``marker``: proof that the file was (or was not) loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (self.marker, "pwned"))  # type: ignore[return-value]


@pytest.mark.parametrize("protocol", [0, 2, 4, 5, "torch.save"])
@pytest.mark.parametrize("where", ["manifest", "tensor"])
def test_pickle_where_a_golden_belongs_is_never_loaded(golden: Golden, tmp_path: Path,
                                                       protocol: object, where: str) -> None:
    marker = tmp_path / "MARKER"
    bomb = _Bomb(marker)
    target = golden.manifest if where == "manifest" else golden.tensor_file()
    if protocol == "torch.save":
        torch.save({"bomb": bomb}, target)
    else:
        target.write_bytes(pickle.dumps(bomb, protocol=int(protocol)))  # type: ignore[call-overload]
    pickle.loads(pickle.dumps(_Bomb(tmp_path / "control")))  # the bomb is live
    assert (tmp_path / "control").exists()
    with pytest.raises(GoldenCorrupt) as info:
        golden.replay()
    assert not marker.exists(), "the pickle was executed"
    message_names(info.value, target)
    if protocol != 0:   # protocol 0 is ASCII: it is simply not JSON / not safetensors framing
        assert "pickle" in str(info.value)


# -- what the user sees through the fixture ------------------------------------------------------

DAMAGES = {
    "truncate": lambda d: _truncate(d),
    "newer": lambda d: _newer(d),
    "pickle": lambda d: (d / "manifest.json").write_bytes(pickle.dumps({"x": 1}, protocol=4)),
}


def _truncate(d: Path) -> None:
    p = next(d.glob("*.safetensors"))
    p.write_bytes(p.read_bytes()[:100])


def _newer(d: Path) -> None:
    m = json.loads((d / "manifest.json").read_text())
    m["format"] = 99
    rewrite_manifest(d / "manifest.json", m)


def test_fixture_shows_one_clean_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `parity.check`: a one-line GoldenCorrupt naming the file, no traceback into the plugin."""
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_m='''
        import pytest, torch
        @pytest.mark.parametrize("dmg", ["truncate", "newer", "pickle"])
        def test_m(parity, dmg):
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
            parity.check(m, torch.ones(2, 4), name=dmg, dtypes="float32")
    ''')
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=3)
    for name, damage in DAMAGES.items():
        damage(pytester.path / "goldens" / name)
    result = pytester.runpytest("--rocm-parity")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines([
        "*GoldenCorrupt: */goldens/truncate/float32-*.safetensors: *recapture this golden*",
        "*GoldenTooNew: */goldens/newer/manifest.json: golden format 99 is newer*pip install -U*",
        "*GoldenCorrupt: */goldens/pickle/manifest.json: this is a pickle*not loaded*",
    ], consecutive=False)
    out = result.stdout.str()
    assert "Traceback" not in out and "golden.py:" not in out and "engine.py:" not in out
    # the store's words and the command that replaces the golden read as two sentences, one full stop
    assert "(pickles can run code); recapture this golden. On the reference machine: pytest" in out
    assert ".. On the reference machine" not in out
    newer = [l for l in out.splitlines() if "golden format 99 is newer" in l]
    assert newer and not [l for l in newer if "--parity-regen" in l]   # an upgrade, never a downgrade


def test_every_error_is_a_parity_error() -> None:
    """What the tests above catch is the plugin's own hierarchy (users can catch ParityError)."""
    assert issubclass(GoldenCorrupt, ParityError) and issubclass(GoldenStale, ParityError)
    assert issubclass(GoldenCorrupt, ValueError)


def test_load_manifest_rejects_bool_format(tmp_path: Path) -> None:
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps({"format": True, "rungs": {}}))
    with pytest.raises(GoldenCorrupt, match="not an integer"):
        load_manifest(p)


@pytest.mark.parametrize("digest", ["xxh3_128", "sha256 only"])
def test_a_flipped_byte_is_found_by_either_digest(golden: Golden, digest: str) -> None:
    """Goldens record XXH3-128 beside SHA-256 and a replay checks the fast one; a golden written
    before (SHA-256 only) is checked by SHA-256. Either finds one flipped byte in the data."""
    m = golden.manifest_json()
    rung = m["rungs"]["float32"]
    assert isinstance(rung.get("xxh3_128"), str)
    if digest == "sha256 only":
        del rung["xxh3_128"]
        golden.write_manifest(m)
    p = golden.tensor_file()
    raw = bytearray(p.read_bytes())
    raw[-3] ^= 0x01
    p.write_bytes(bytes(raw))
    message_names(corrupt(golden, "content hash differs"), p, RECAPTURE)


def test_the_fast_digest_is_the_one_checked(golden: Golden) -> None:
    """An intact file whose manifest records another XXH3-128: the replay checks that digest, not
    only SHA-256 (which still matches)."""
    m = golden.manifest_json()
    m["rungs"]["float32"]["xxh3_128"] = "0" * 32
    golden.write_manifest(m)
    # the edit is the manifest's here, so the message may not blame the tensor file alone
    message_names(corrupt(golden, "content hash differs.*or the manifest beside it"), golden.tensor_file(), RECAPTURE)


def test_a_corrupt_rung_leaves_the_intact_ones_judged_and_says_what_they_found(tmp_path: Path) -> None:
    """The bfloat16 file has a flipped byte; the float32 rung is intact, judged, and its verdict is
    in the error, which still names the damaged file."""
    from reliability_helpers import make_golden

    g = make_golden(tmp_path, dtypes=("bfloat16", "float32"))
    p = g.tensor_file("bfloat16")
    raw = bytearray(p.read_bytes())
    raw[-3] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(GoldenCorrupt) as info:
        g.replay()
    message_names(info.value, p)
    assert str(info.value).endswith("The intact rungs were judged: float32 passed"), str(info.value)
