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
import sys
from collections.abc import Sequence
from typing import Any

from pytest_rocm_parity.runner.engine import OUTPUT
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.golden.store import GoldenStore, RungReader, expected_digest


def derive(src: GoldenStore, name: str, dst: GoldenStore, new_name: str, dtypes: Sequence[str],
           drill: int, test: str | None = None) -> dict[str, Any]:
    """Write ``new_name`` into ``dst``: rungs ``dtypes`` of ``name``, modules nested at most ``drill`` deep."""
    m = src.read_manifest(name)
    missing = [d for d in dtypes if d not in m["rungs"]]
    if missing:
        raise InvalidArgument(f"dtypes: {missing} not in golden {name!r} (it holds {list(m['rungs'])})")
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
    if test is not None:
        new["test"] = test
    producers = {d: _rung(src, name, m, d, drill, new) for d in dtypes}
    dst.write(new_name, new, producers, overwrite=dst.exists(new_name))
    return new


def _rung(src: GoldenStore, name: str, m: dict[str, Any], dtype: str, drill: int, new: dict[str, Any]) -> Any:
    def produce() -> dict[str, Any]:
        meta = copy.deepcopy(m["rungs"][dtype])
        reader = RungReader(src.rung_file(name, m, dtype), "cpu", expected_digest(meta))
        layers = [e for e in meta["layers"] if int(e["level"]) <= drill]
        keys = {e["key"] for e in layers}
        meta["layers"] = layers
        meta["order"] = [k for k in meta.get("order", []) if k in keys]
        meta["selected"] = sorted({e["name"] for e in layers})
        wanted = {k for k in reader.keys if k.startswith(("input/", "extra/", f"gtruth/{OUTPUT}/", "quant/", "qnoise/"))}
        wanted |= set(meta["outputs"]["out"].values())
        for e in layers:
            wanted |= set(e["in"].values()) | set(e["out"].values())
            wanted |= {k for k in reader.keys if k.startswith((f"truth/{e['key']}/", f"gtruth/{e['key']}/"))}
        new["rungs"][dtype] = meta
        return {k: reader.get(k) for k in sorted(wanted)}
    return produce


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pytest_rocm_parity.golden.derive", description=__doc__.splitlines()[0])
    p.add_argument("golden_dir")
    p.add_argument("name")
    p.add_argument("--to", required=True, help="name of the derived golden")
    p.add_argument("--dtypes", required=True, help="comma-separated rungs to keep")
    p.add_argument("--drill", type=int, required=True)
    p.add_argument("--test", default=None, help="node id recorded in the derived manifest")
    a = p.parse_args(argv)
    store = GoldenStore(a.golden_dir)
    derive(store, a.name, store, a.to, [d for d in a.dtypes.split(",") if d], a.drill, a.test)
    print(f"wrote {store.manifest_path(a.to)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
