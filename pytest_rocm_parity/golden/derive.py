"""Derive a golden from another: a subset of its dtype rungs and of its drill-down depth.

The derived golden holds exactly the tensors a capture with those settings would have written
(the reference pass is the same, the float64 truth of top-level modules is computed with the
same substitutions), so a golden captured once on the reference GPU can be split or slimmed
without the GPU. Used to keep every committed file of the example suite under 10 MB:

    python -m pytest_rocm_parity.golden.derive GOLDEN_DIR NAME --to NEW_NAME --dtypes float32 --drill 0
"""
from __future__ import annotations

import argparse
import copy
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_rocm_parity.runner.capture import numbered_in_order, rename_tensor_keys
from pytest_rocm_parity.runner.choices import choice_like, watch_entry
from pytest_rocm_parity.runner.engine import OUTPUT
from pytest_rocm_parity.errors import GoldenError, GoldenExists, InvalidArgument
from pytest_rocm_parity.judging import dtypes as dt
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import MANIFEST, PROJECT_KEY, REMOTE_PROJECT_KINDS, GoldenStore, expected_digest, load_manifest


def derive(src: GoldenStore, name: str, dst: GoldenStore, new_name: str, dtypes: Sequence[str],
           drill: int | None = None, test: str | None = None, force: bool = False) -> dict[str, Any]:
    """Write ``new_name`` into ``dst``: rungs ``dtypes`` of ``name``, modules nested at most ``drill`` deep
    (None: as deep as the source). An existing ``new_name`` is replaced only with ``force``, and never the
    source itself. ``test``: the node id of the test that uses it, recorded as its owner; without one
    it has none (not the source's: a run of the source's test file would prove it obsolete and
    --parity-prune-obsolete delete it), and prune never deletes it."""
    check_new_name(new_name)
    if new_name == name and src.root.resolve() == dst.root.resolve():
        raise InvalidArgument(f"--to {new_name!r}: that is the golden derived from; deriving in place would replace "
                              f"it with less. Derive to another name, then replace the old one yourself if you mean to")
    if drill is None:
        drill = int(src.read_manifest(name).get("drill", 2))
    if not isinstance(drill, int) or isinstance(drill, bool) or drill < 0:
        raise InvalidArgument(f"--drill {drill!r}: expected an integer >= 0, the sub-module depth to keep (0: blocks "
                              f"only)")
    dtypes = [dt.rung_name(d) for d in dtypes]
    if not dtypes:
        raise InvalidArgument("--dtypes: name at least one rung to keep (e.g. float32)")
    if dst.exists(new_name) and not force:
        raise GoldenExists(f"{dst.manifest_path(new_name)}: a golden {new_name!r} exists; derive never replaces one "
                           f"unasked: choose another --to, or pass --force to replace it", dst.manifest_path(new_name))
    m = src.read_manifest(name)
    if int(m.get("sketch") or 0):
        raise InvalidArgument(f"{name!r} is a sketch golden; only full goldens can be derived")
    missing = [d for d in dtypes if d not in m.get("rungs", {})]
    if missing:
        raise InvalidArgument(f"dtypes {missing}: golden {name!r} holds {', '.join(m.get('rungs', {}))}; derive from "
                              f"those, or capture the missing precisions on the reference machine")
    if drill > int(m.get("drill", 2)):
        raise InvalidArgument(f"drill={drill}: golden {name!r} was captured with drill={m.get('drill')}")
    new = copy.deepcopy(m)
    new.update(name=new_name, dtypes=list(dtypes), drill=drill, rungs={},
               layers=[l for l in m["layers"] if int(l["level"]) <= drill])
    new["test"] = test
    project = m.get(PROJECT_KEY)
    if isinstance(project, str) and not project.startswith(REMOTE_PROJECT_KINDS) \
            and Path(src.root).resolve() != Path(dst.root).resolve():
        # the project is the rootdir relative to the golden directory: say it from the new one
        new[PROJECT_KEY] = Path(os.path.relpath((Path(src.root) / project).resolve(), Path(dst.root).resolve())).as_posix()
    producers = {d: _rung(src, name, m, d, drill, new) for d in dtypes}
    dst.write(new_name, new, producers, overwrite=dst.exists(new_name))
    return new


def check_new_name(new_name: str) -> None:
    """InvalidArgument unless ``new_name`` is a golden's name: not blank, and no path (a name maps to
    one directory under the golden directory; ``../x`` would be written as ``x-<hash>`` inside it,
    not where it points)."""
    if not new_name.strip():
        raise InvalidArgument(f"--to {new_name!r}: the derived golden needs a name (the check name its test "
                              f"passes, e.g. --to mlp-float32)")
    if "/" in new_name or "\\" in new_name or new_name.strip() in (".", ".."):
        raise InvalidArgument(f"--to {new_name!r}: a golden's name is not a path; the derived golden is written "
                              f"in the golden directory, beside its source, under its name: give a plain name "
                              f"(e.g. --to {_plain(new_name)})")


def _plain(name: str) -> str:
    """``name`` as a plain golden name: its last path component, or a placeholder."""
    last = name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return last if last.strip() and last not in (".", "..") else "NEW_NAME"


def _rung(src: GoldenStore, name: str, m: dict[str, Any], dtype: str, drill: int, new: dict[str, Any]) -> Any:
    def produce() -> dict[str, Any]:
        meta = copy.deepcopy(m["rungs"][dtype])
        reader = RungReader(src.rung_file(name, m, dtype), "cpu", expected_digest(meta))
        layers = [e for e in meta["layers"] if int(e["level"]) <= drill]
        keys = {e["key"] for e in layers}
        # a router below the new depth is watched, as a capture at that depth keeps it (choices.Decisions),
        # at its level there: the number of kept modules around it
        watch = meta.get("watch", []) + [
            watch_entry(e) for e in meta["layers"] if int(e["level"]) > drill and e.get("decides")
            and choice_like({p: reader.get(k) for p, k in e["out"].items()})]
        kept = {e["name"] for e in layers}
        for w in watch:
            w["level"] = sum(1 for n in kept if w["name"].startswith(n + "."))
        order = {k: i for i, k in enumerate(meta.get("order", []))}
        meta["layers"] = layers
        if watch:
            meta["watch"] = sorted(watch, key=lambda e: order.get(e["key"], len(order)))
        meta["order"] = [k for k in meta.get("order", []) if k in keys]
        # every module selected at this depth, as a capture lists them: one the forward never calls
        # (a dropout an attention kernel bypasses) has no layer entry but is selected all the same
        meta["selected"] = sorted(l["name"] for l in new["layers"])
        wanted = {k for k in reader.keys if k.startswith(("input/", "extra/", f"gtruth/{OUTPUT}/", "quant/", "qnoise/"))}
        wanted |= set(meta["outputs"]["out"].values())
        for e in watch:
            wanted |= set(e["out"].values())
        for e in layers:
            wanted |= set(e["in"].values()) | set(e["out"].values())
            wanted |= {k for k in reader.keys if k.startswith((f"truth/{e['key']}/", f"gtruth/{e['key']}/"))}
        # the recorded tensors renumbered t/0, t/1, ... in the order first seen, as a capture at this
        # depth numbers them (capture.merge_repeats): the same file, so a later regeneration rewrites nothing
        renumbered = numbered_in_order(wanted)
        rename_tensor_keys([*layers, *watch, meta["outputs"]], renumbered)
        new["rungs"][dtype] = meta
        return {renumbered.get(k, k): reader.get(k) for k in sorted(wanted)}
    return produce


def add_derive_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("golden_dir", metavar="GOLDEN_DIR", help="the golden directory")
    p.add_argument("name", metavar="NAME", help="the golden to derive from")
    p.add_argument("--to", required=True, metavar="NEW_NAME", help="name of the derived golden")
    p.add_argument("--dtypes", default=None, help="comma-separated rungs to keep (default: all it holds)")
    p.add_argument("--drill", type=int, default=None,
                   help="the sub-module depth to keep (0: blocks only; default: the source's)")
    p.add_argument("--test", default=None, metavar="NODEID",
                   help="the test that uses the derived golden (e.g. tests/test_x.py::test_y), recorded as its owner "
                        "so that --parity-prune-obsolete can tell when it is no longer used; without it none is "
                        "recorded and prune never deletes it")
    p.add_argument("--force", action="store_true", help="replace an existing golden NEW_NAME")


def run_derive(a: argparse.Namespace) -> int:
    store = GoldenStore(a.golden_dir)
    if not store.root.is_dir():
        raise InvalidArgument(f"{a.golden_dir}: no such golden directory")
    check_new_name(a.to)
    if not store.exists(a.name) and (store.root / MANIFEST).is_file():
        raise InvalidArgument(_golden_not_goldens_folder(a))
    name = a.name if store.exists(a.name) else _named_by_folder(store, a.name)
    dtypes = ([d.strip() for d in a.dtypes.split(",") if d.strip()] if a.dtypes is not None
              else list(store.read_manifest(name)["rungs"]))
    derive(store, name, store, a.to, dtypes, a.drill, a.test, force=a.force)
    print(f"wrote {store.manifest_path(a.to)}" + (f" (owned by {a.test})" if a.test else
          " (no owning test recorded: --parity-prune-obsolete never deletes it; derive again with --test NODEID "
          "to let prune tell when that test stops using it)"))
    return 0


def _named_by_folder(store: GoldenStore, given: str) -> str:
    """The check name of the golden whose folder in ``store`` is ``given`` (what `ls goldens` shows:
    ``test_x.py_test_m-<hash>``); InvalidArgument naming close check names where there is none."""
    manifest = store.root / given / MANIFEST
    if manifest.is_file():
        try:
            held = load_manifest(manifest).get("name")
        except GoldenError:
            held = None
        if isinstance(held, str) and held:
            return held
    close = store.close_names(given, n=3)
    near = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise InvalidArgument(f"{store.root}: no golden named {given!r}. NAME is the check's name (a default name is "
                          f"the test's id without its directories, e.g. 'test_x.py::test_m') or a golden's folder "
                          f"in {store.root}{near}")


def _golden_not_goldens_folder(a: argparse.Namespace) -> str:
    """What to say when GOLDEN_DIR is one golden's directory rather than the folder of goldens."""
    root = Path(a.golden_dir)
    try:
        held = load_manifest(root / MANIFEST).get("name")
    except GoldenError:
        held = None
    name = held if isinstance(held, str) and held else a.name
    parent = root.resolve().parent
    shown = os.path.relpath(parent) if not root.is_absolute() else str(parent)
    argv = ["rocm-parity", "golden", "derive", shown, name, "--to", a.to]
    for flag, value in (("--dtypes", a.dtypes), ("--drill", a.drill), ("--test", a.test)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--force"] if a.force else []
    return (f"{a.golden_dir} is the directory of the golden {name!r} (it holds {MANIFEST}), not the folder of "
            f"goldens; the first argument is that folder, its parent: {shlex.join(argv)}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_rocm_parity.golden.derive``: the same as ``rocm-parity golden derive``."""
    from pytest_rocm_parity.cli import main as cli_main

    return cli_main(["golden", "derive", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
