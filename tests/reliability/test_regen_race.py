"""A replay during a regeneration sees the old golden or the new one; prune deletes only what is ours."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pytest_rocm_parity.golden.reader import RungReader

from pytest_rocm_parity.golden.store import MANIFEST, TOOL, TOOL_KEY, GoldenStore
from parity_models import tiny
from reliability_helpers import ENV, Golden, make_golden

from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.replay import replay


def regen(g: Golden, seed: int) -> None:
    """Another process's regeneration: its own store, a model with other weights (other tensor files)."""
    capture(tiny(seed), g.x, g.spec, GoldenStore(g.store.root), "cpu", overwrite=True, env=ENV)


def test_files_named_by_a_read_manifest_survive_a_regen(golden: Golden) -> None:
    reader = GoldenStore(golden.store.root)
    m = reader.read_manifest("tiny")
    old = golden.dir / m["rungs"]["float32"]["file"]
    regen(golden, seed=1)
    assert golden.manifest_json()["rungs"]["float32"]["file"] != old.name   # the regen committed
    path = reader.rung_file("tiny", m, "float32")   # still there for the replay that read the old manifest
    assert path == old
    RungReader(path, "cpu", m["rungs"]["float32"]["sha256"]).get("input/args.0")
    # once nobody reads it, the next write collects it
    reader.unpin()
    regen(golden, seed=2)
    assert not old.exists()
    assert sorted(p.name for p in golden.dir.iterdir()) == sorted(
        [MANIFEST, golden.manifest_json()["rungs"]["float32"]["file"]])


def test_replay_racing_a_regen_judges_the_old_golden(golden: Golden, monkeypatch: pytest.MonkeyPatch) -> None:
    """The regen commits between the replay's manifest read and its tensor file open: the worst moment."""
    original = GoldenStore.rung_file
    fired = []

    def rung_file_after_a_regen(self: GoldenStore, name: str, manifest: dict, dtype: str) -> Path:
        if not fired:
            fired.append(True)
            regen(golden, seed=1)
        return original(self, name, manifest, dtype)

    monkeypatch.setattr(GoldenStore, "rung_file", rung_file_after_a_regen)
    results = golden.replay()   # the model of the old golden, judged against the old golden
    assert fired and all(r.passed for r in results)


def test_replays_and_regens_in_threads_never_error(tmp_path: Path) -> None:
    g = make_golden(tmp_path, dtypes=("float32", "float64"))
    # each thread its own model objects: the race under test is the golden store's (a regen and a
    # replay run in separate processes in practice), not two threads hooking one module tree
    models = {0: tiny(0), 1: tiny(1)}
    writers = {0: tiny(0), 1: tiny(1)}
    errors: list[BaseException] = []
    stop = threading.Event()

    def regens() -> None:
        try:
            for i in range(12):
                capture(writers[i % 2], g.x, g.spec, GoldenStore(g.store.root), "cpu", overwrite=True, env=ENV)
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    t = threading.Thread(target=regens)
    t.start()
    replays = 0
    while not stop.is_set() or replays == 0:
        store = GoldenStore(g.store.root)
        seed = json.loads(g.manifest.read_text())["fingerprint"]
        model = next((m for m in models.values() if _fingerprint(m) == seed), models[0])
        try:
            replay(model, g.x, g.spec, store, "cpu", env=ENV)
        except BaseException as exc:
            from pytest_rocm_parity.errors import GoldenStale

            if not isinstance(exc, (GoldenStale, AssertionError)):   # stale: the golden moved on to the other model
                errors.append(exc)
        store.unpin()
        replays += 1
    t.join()
    assert not errors, errors


def _fingerprint(model: object) -> dict:
    from pytest_rocm_parity.runner.engine import fingerprint

    return fingerprint(model)


def test_every_written_manifest_carries_the_marker(golden: Golden) -> None:
    assert golden.manifest_json()[TOOL_KEY] == TOOL
    name, d, manifest = next(iter(golden.store.goldens_on_disk()))
    assert (name, d) == ("tiny", golden.dir) and golden.store.ours(d, manifest)


def test_ours_refuses_what_it_did_not_write(golden: Golden, tmp_path: Path) -> None:
    store = golden.store
    m = golden.manifest_json()
    assert not store.ours(golden.dir, {k: v for k, v in m.items() if k != TOOL_KEY})   # no marker
    assert not store.ours(golden.dir, {**m, TOOL_KEY: "someone-else"})
    assert not store.ours(golden.dir, None)                                            # unreadable manifest
    assert not store.ours(golden.dir, {**m, "name": "other"})                          # directory of another name
    assert not store.ours(tmp_path / "tiny", m)                                        # outside the root
    link = store.root / "alias"
    link.symlink_to(golden.dir)
    assert not store.ours(link, {**m, "name": "alias"})


def test_delete_removes_our_files_only(golden: Golden) -> None:
    (golden.dir / "notes.md").write_text("by hand")
    tensor = golden.tensor_file()
    dry = golden.store.delete(golden.dir, dry_run=True)
    assert dry == [golden.manifest, tensor] and golden.manifest.exists()
    deleted = golden.store.delete(golden.dir)
    assert deleted == [golden.manifest, tensor]
    assert sorted(p.name for p in golden.dir.iterdir()) == ["notes.md"]
    (golden.dir / "notes.md").unlink()
    golden.capture(overwrite=False)
    assert golden.store.delete(golden.dir)[-1] == golden.dir and not golden.dir.exists()
