"""Golden size and selection of the default check on the family matrix's models (tests/families).

    python bench/golden_sizes.py            # the default selection and drill depth
    python bench/golden_sizes.py --drill 2  # a fixed depth

Captures each model once on the CPU (float32, the default rung of an fp32 model) into a temporary
directory and prints, per model: the drill depth used, the number of selected modules, the
golden's bytes on disk, and whether the planted bug's module is selected (docs/judging.md,
"Which modules are judged", holds the measured table).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch

    import parity_models as fm
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec
    from pytest_rocm_parity.golden.store import GoldenStore

    p = argparse.ArgumentParser()
    p.add_argument("--drill", type=int, default=None, help="a fixed depth (default: the plugin's default)")
    p.add_argument("--families", default=",".join(fm.FAMILIES))
    a = p.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':<8} {'drill':>5} {'layers':>6} {'golden bytes':>12}  bug module selected")
    with tempfile.TemporaryDirectory() as tmp:
        store = GoldenStore(tmp)
        for fam in a.families.split(","):
            model, inputs = fm.FAMILIES[fam]()
            drill = a.drill
            if drill is None:
                try:
                    from pytest_rocm_parity.api import default_drill
                except ImportError:   # before the budgeted depth: 2 below 1B parameters
                    drill = 2
                else:
                    from pytest_rocm_parity.options import DEFAULT_GOLDEN_SIZE_LIMIT_MB

                    drill = default_drill(model, inputs, ["float32"], int(DEFAULT_GOLDEN_SIZE_LIMIT_MB * 1e6))
            m = capture(model, inputs, CheckSpec(name=fam, dtypes=["float32"], drill=drill), store, "cpu")
            size = sum(f.stat().st_size for f in store.dir_for(fam).iterdir() if f.is_file())
            names = {entry["name"] for entry in m["layers"]}
            bug = fm.FAMILY_BUGS[fam][0]
            print(f"{fam:<8} {drill:>5} {len(names):>6} {size:>12}  {'yes' if bug in names else 'no'}")


if __name__ == "__main__":
    main()
