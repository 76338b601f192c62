"""--parity-threads=auto's choice replayed on recorded H200 sweeps, beside a paired alternative.

    python bench/sim_chooser.py [--out chooser-sim.json] [docs/runs/h200-*-threads_p*.json ...]

Why: each sweep process of `bench/bench_direct_threads.py` ran one thread (``pass_w1``) and two
(``pass_w2``) round by round on the same golden, so the time either arm would have taken in every
round is on record. Feeding those times to the shipped chooser (`direct._Chooser`, the class itself)
shows what it would have chosen and what that cost, against the better fixed arm in hindsight;
the same for a chooser that judges the arms by adjacent passes (each try of the other arm paired
with the pass before it), the idea docs/architecture.md listed next. No device is needed: the
host's drift is in the recordings.

Reported per process and over all: each policy's median pass over the forward's median (the
sweeps' ratio), whether it met 1.05x, and its regret (its ratio less the better fixed arm's).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import statistics
import sys
from typing import Any


class Paired:
    """The alternative: after FIRST passes of each arm (alternating), keep the faster one and try the
    other every EXPLORE passes; switch when the median over the last KEEP pairs of (other's pass /
    the pass just before it) is under 1 - MARGIN."""

    def __init__(self, first: int, explore: int, keep: int, margin: float) -> None:
        self.first, self.explore, self.keep, self.margin = first, explore, keep, margin
        self.samples: dict[int, list[float]] = {1: [], 2: []}
        self.pairs: collections.deque[float] = collections.deque(maxlen=keep)
        self.best = 1
        self.n = 0
        self.last: tuple[int, float] | None = None

    def pick(self, key: Any) -> int:
        self.n += 1
        thin = [arm for arm in (1, 2) if len(self.samples[arm]) < self.first + 1]
        if thin:
            return min(thin, key=lambda arm: len(self.samples[arm]))
        if self.n == 2 * (self.first + 1) + 1:   # the first choice: medians without each warm-up
            self.best = 2 if statistics.median(self.samples[2][1:]) < (1 - self.margin) * \
                statistics.median(self.samples[1][1:]) else 1
        return 3 - self.best if self.n % self.explore == 0 else self.best

    def record(self, key: Any, arm: int, t: float) -> None:
        if len(self.samples[arm]) <= self.first:
            self.samples[arm].append(t)
        elif arm != self.best and self.last is not None and self.last[0] == self.best:
            self.pairs.append(t / self.last[1])
            if len(self.pairs) >= 3 and statistics.median(self.pairs) < 1 - self.margin:
                self.best, self.pairs = arm, collections.deque(maxlen=self.keep)
        self.last = (arm, t)


def simulate(chooser: Any, raw: dict[str, list[float]]) -> list[float]:
    """The time of each round under ``chooser``: the recorded time of the arm it picks."""
    got = []
    for r in range(len(raw["forward"])):
        arm = chooser.pick("k")
        t = raw[f"pass_w{arm}"][r]
        chooser.record("k", arm, t)
        got.append(t)
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("files", nargs="*")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    sys.path.insert(0, __file__.rsplit("/", 2)[0] if "/" in __file__ else "..")
    from pytest_rocm_parity.direct import _Chooser

    files = a.files or sorted(glob.glob("docs/runs/h200-session*-threads_p*.json"))
    rows = []
    for f in files:
        for r in json.load(open(f))["rows"]:
            raw = r.get("raw_ms", {})
            if not {"forward", "pass_w1", "pass_w2"} <= set(raw):
                continue
            fwd = statistics.median(raw["forward"])
            c = _Chooser()
            pol = {"shipped": simulate(c, raw),
                   "paired": simulate(Paired(c.FIRST, c.EXPLORE, c.KEEP, c.MARGIN), raw)}
            x = {k: statistics.median(v) / fwd for k, v in pol.items()}
            x.update({f"w{n}": statistics.median(raw[f"pass_w{n}"]) / fwd for n in (1, 2)})
            if "pass_w0" in raw:
                x["recorded_auto"] = statistics.median(raw["pass_w0"]) / fwd
            best = min(x["w1"], x["w2"])
            rows.append({"file": f.rsplit("/", 1)[-1], "forward_ms": fwd, "rounds": len(raw["forward"]),
                         **{f"{k}_x": round(v, 4) for k, v in x.items()},
                         **{f"{k}_regret": round(x[k] - best, 4) for k in pol}})
    summary = {}
    for k in ("shipped", "paired", "w1", "w2", "recorded_auto"):
        xs = [r[f"{k}_x"] for r in rows if f"{k}_x" in r]
        if xs:
            summary[k] = {"mean_x": round(statistics.mean(xs), 4), "met_1.05": sum(v <= 1.05 for v in xs),
                          "of": len(xs)}
            if f"{k}_regret" in rows[0]:
                summary[k]["mean_regret"] = round(statistics.mean(r[f"{k}_regret"] for r in rows), 4)
    for r in rows:
        print(json.dumps(r))
    print(json.dumps({"summary": summary}))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"rows": rows, "summary": summary}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
