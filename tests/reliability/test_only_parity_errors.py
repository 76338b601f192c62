"""Damaged goldens fed to replay, show and diff: whatever the damage, only the plugin's own errors
(ParityError subclasses) come out, and damage that makes the golden untrustworthy is always refused.

The size recorded in the manifest is compared with the file and the content hash is checked
whatever size the manifest claims, so a flipped bit cannot pass by a large `bytes` claim.
"""
from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from pytest_rocm_parity.errors import GoldenCorrupt, GoldenError, ParityError
from pytest_rocm_parity.reports.inspect_cmd import diff_goldens, show_golden
from reliability_helpers import Golden, make_golden, read_header, write_with_header


def _flip_data_byte(g: Golden) -> None:
    p = g.tensor_file()
    raw = bytearray(p.read_bytes())
    raw[-3] ^= 0x01
    p.write_bytes(bytes(raw))


def _truncate(g: Golden) -> None:
    p = g.tensor_file()
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _truncate_resealed(g: Golden) -> None:
    _truncate(g)
    g.reseal()


def _grow(g: Golden) -> None:
    p = g.tensor_file()
    p.write_bytes(p.read_bytes() + b"\0" * 64)


def _large_bytes_claim(g: Golden) -> None:
    """A flipped bit under a manifest that claims a file too large to hash."""
    _flip_data_byte(g)
    m = g.manifest_json()
    m["rungs"]["float32"]["bytes"] = 2**40
    g.write_manifest(m)


def _garbage_header(g: Golden, reseal: bool) -> None:
    p = g.tensor_file()
    raw = bytearray(p.read_bytes())
    raw[8:72] = random.Random(7).randbytes(64)
    p.write_bytes(bytes(raw))
    if reseal:
        g.reseal()


def _header_names_other_key(g: Golden) -> None:
    """A valid file whose tensors are stored under other names than the manifest's."""
    p = g.tensor_file()
    header, data = read_header(p)
    renamed = {(k if k == "__metadata__" else f"x/{k}"): v for k, v in header.items()}
    write_with_header(p, renamed, data)
    g.reseal()


def _manifest_names_missing_tensor(g: Golden) -> None:
    m = g.manifest_json()
    m["rungs"]["float32"]["outputs"]["out"]["0"] = "t/999"
    g.write_manifest(m)


def _missing_file(g: Golden) -> None:
    g.tensor_file().unlink()


def _reshaped(g: Golden) -> None:
    """Every stored tensor flattened: a well-formed file whose shapes disagree with the model."""
    p = g.tensor_file()
    tensors = load_file(str(p))
    save_file({k: v.reshape(-1).contiguous() for k, v in tensors.items()}, str(p),
              metadata={"format": "1", "name": g.spec.name, "dtype": "float32"})
    g.reseal()


def _dropped_half(g: Golden) -> None:
    """Half the tensors gone from a well-formed, resealed file."""
    p = g.tensor_file()
    tensors = load_file(str(p))
    keep = sorted(tensors)[::2]
    save_file({k: tensors[k] for k in keep}, str(p), metadata={"format": "1", "name": g.spec.name, "dtype": "float32"})
    g.reseal()


# damage -> True when the golden must be refused (it is not a golden this tool wrote)
DAMAGES: dict[str, tuple[Callable[[Golden], None], bool]] = {
    "truncated": (_truncate, True),
    "truncated, hash and size resealed": (_truncate_resealed, True),
    "bytes appended": (_grow, True),
    "flipped bit": (_flip_data_byte, True),
    "flipped bit, large bytes claim": (_large_bytes_claim, True),
    "garbage header": (lambda g: _garbage_header(g, False), True),
    "garbage header, resealed": (lambda g: _garbage_header(g, True), True),
    "header names other tensors": (_header_names_other_key, True),
    "manifest names a missing tensor": (_manifest_names_missing_tensor, True),
    "tensor file missing": (_missing_file, True),
    "tensors reshaped": (_reshaped, False),
    "half the tensors dropped": (_dropped_half, True),
}


def _mutate_header(seed: int) -> Callable[[Golden], None]:
    """A few random bytes of the header overwritten, then resealed so the parsers see them."""

    def damage(g: Golden) -> None:
        rng = random.Random(seed)
        p = g.tensor_file()
        raw = bytearray(p.read_bytes())
        n = int.from_bytes(raw[:8], "little")
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(0, 8 + n)] = rng.choice(b'{}[]",:0123456789-e. \\x\xff')
        p.write_bytes(bytes(raw))
        g.reseal()

    return damage


def _only_ours(run: Callable[[], Any], must_refuse: bool) -> None:
    try:
        run()
    except ParityError:
        return
    except Exception as exc:  # the assertion of this test: nothing else may escape
        pytest.fail(f"{type(exc).__name__} escaped instead of a ParityError: {exc}")
    if must_refuse:
        pytest.fail("a damaged golden was accepted")


def _damaged(tmp_path: Path, damage: Callable[[Golden], None]) -> tuple[Golden, Path]:
    g = make_golden(tmp_path / "damaged")
    good = tmp_path / "good"
    shutil.copytree(g.dir, good)
    damage(g)
    return g, good


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_replay_show_and_diff_raise_only_parity_errors(kind: str, tmp_path: Path) -> None:
    damage, must_refuse = DAMAGES[kind]
    g, good = _damaged(tmp_path, damage)
    _only_ours(g.replay, must_refuse)
    _only_ours(lambda: show_golden(g.dir), must_refuse)
    _only_ours(lambda: diff_goldens(good, g.dir), must_refuse)


@pytest.mark.parametrize("seed", range(16))
def test_random_header_damage_raises_only_parity_errors(seed: int, tmp_path: Path) -> None:
    g, good = _damaged(tmp_path, _mutate_header(seed))
    _only_ours(g.replay, False)
    _only_ours(lambda: show_golden(g.dir), False)
    _only_ours(lambda: diff_goldens(good, g.dir), False)


def test_size_is_checked_against_the_manifest(golden: Golden) -> None:
    _grow(golden)
    with pytest.raises(GoldenCorrupt, match=r"holds \d+ bytes where its manifest records \d+.*git lfs pull") as exc:
        golden.replay()
    assert str(golden.tensor_file()) in str(exc.value)
    with pytest.raises(GoldenCorrupt, match="where its manifest records"):
        show_golden(golden.dir)


def test_a_git_lfs_pointer_says_to_pull_not_to_recapture(golden: Golden) -> None:
    """A checkout without git-lfs leaves pointer text where the tensors belong: recapturing would need
    the reference GPU, pulling is the fix."""
    golden.tensor_file().write_text("version https://git-lfs.github.com/spec/v1\noid sha256:"
                                    "4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 35240\n")
    for read in (golden.replay, lambda: show_golden(golden.dir)):
        with pytest.raises(GoldenCorrupt, match="git-lfs pointer") as exc:
            read()
        assert "git lfs pull" in str(exc.value) and "recapture" not in str(exc.value)
        assert str(golden.tensor_file()) in str(exc.value)


def test_hash_is_checked_whatever_size_the_manifest_claims(golden: Golden) -> None:
    """A claim too large to hash no longer skips the hash: the size gives it away, and with the real
    size the hash does."""
    _large_bytes_claim(golden)
    with pytest.raises(GoldenCorrupt, match="where its manifest records 1099511627776"):
        golden.replay()
    m = golden.manifest_json()
    m["rungs"]["float32"]["bytes"] = golden.tensor_file().stat().st_size
    golden.write_manifest(m)
    with pytest.raises(GoldenCorrupt, match="content hash differs"):
        golden.replay()


def test_show_and_diff_check_the_hash(golden: Golden, tmp_path: Path) -> None:
    good = tmp_path / "good"
    shutil.copytree(golden.dir, good)
    _flip_data_byte(golden)
    for run in (lambda: show_golden(golden.dir), lambda: diff_goldens(good, golden.dir)):
        with pytest.raises(GoldenError, match="content hash differs") as exc:
            run()
        assert str(golden.tensor_file()) in str(exc.value)


def test_an_intact_golden_still_replays_shows_and_diffs(golden: Golden, tmp_path: Path) -> None:
    good = tmp_path / "good"
    shutil.copytree(golden.dir, good)
    assert all(r.passed for r in golden.replay())
    assert show_golden(golden.dir)["rungs"]["float32"]["layers"]
    assert not diff_goldens(good, golden.dir)["differs"]
    assert json.loads(golden.manifest.read_text())["rungs"]["float32"]["bytes"] == golden.tensor_file().stat().st_size
