"""Measure detection power: run the fault catalogue (tests/detection/catalogue.py) on both precision ladders.

    python bench/detection.py [--out bench/results/detection] [--cases id,id] [--ladders bf16,fp16]

Prints, per ladder (bf16 = bfloat16+float32, fp16 = float16+float32): each case with its verdict per rung,
the culprit, the ratios at the expected culprit and the rung that caught it; then bugs caught with the right
culprit, false alarms on correct alternates, the largest isolated ratio lower bound over every layer of every
correct alternate (the calibration of the false-alarm side) and what stricter low-precision budgets would
catch.  Writes <out>.json (every number) and <out>.md (the tables docs/detection.md quotes).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "detection"))

import torch  # noqa: E402

import catalogue as C  # noqa: E402
from pytest_rocm_parity.judging.tolerance import Tolerance  # noqa: E402

LOW = ("bfloat16", "float16")
STRICTER = (1.5, 1.25, 1.15)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:.3g}"


def rung_row(case: C.Case, r: Any) -> dict[str, Any]:
    """What one rung said about one case."""
    row: dict[str, Any] = {"rung": r.dtype, "passed": r.passed, "culprit": r.culprit,
                           "first_divergent": r.first_divergent}
    for name in case.culprits[:1]:
        l = C.layer(r, name)
        if l is not None and l.iso is not None:
            row.update(target=name, ratio=l.iso.ratio, ratio_lo=l.iso.ratio_lo, z=l.iso.z,
                       nonfinite=l.iso.nonfinite, would_pass_ratio=l.would_pass_ratio, budget=l.budget)
    judged = [l for l in r.layers if l.iso is not None and l.iso.kind == "float" and not l.iso.nonfinite]
    row["layers_judged"] = len(judged)
    if judged:
        w = max(judged, key=lambda l: l.iso.ratio_lo)
        row.update(worst_layer=w.name, worst_ratio_lo=w.iso.ratio_lo, worst_ratio=w.iso.ratio, worst_z=w.iso.z,
                   worst_budget=w.budget)
    return row


def rejudge(r: Any, budget: float, z: float = 3.0) -> tuple[bool, str | None]:
    """Re-judge a low-precision rung's isolated records under another ratio budget (worst leaf per layer)."""
    failing = []
    for l in r.layers:
        m = l.iso
        if m is None:
            bad = not l.iso_passed
        elif m.kind != "float" or m.nonfinite or m.note.startswith("shape"):
            bad = not l.iso_passed
        else:
            bad = m.ratio_lo > budget and m.z > z
        if bad:
            failing.append(l.name)
    minimal = [n for n in failing if not any(o != n and o.startswith(n + ".") for o in failing)]
    return (not minimal), (minimal[0] if minimal else None)


def run(case_ids: list[str] | None, ladders: list[str]) -> dict[str, Any]:
    torch.set_num_threads(2)
    t0 = time.time()
    root = tempfile.mkdtemp(prefix="parity-detect-")
    models = C.capture_all(root)
    t_capture = time.time() - t0
    cases = [c for c in C.CASES if not case_ids or c.id in case_ids]
    rows = []
    replays = {case.id: C.replay_case(case, models, root) for case in cases}
    for ladder in ladders:
        for case in cases:
            o = C.outcome(case, ladder, replays[case.id])
            stricter = {}
            for b in STRICTER:
                verdicts = [rejudge(r, b) if r.dtype in LOW else (r.passed, r.culprit) for r in o.results]
                if case.kind == "bug":
                    stricter[str(b)] = any((not p) and c in case.culprits for p, c in verdicts)
                else:
                    stricter[str(b)] = any(not p for p, _ in verdicts)
            rows.append({
                "case": case.id, "family": case.family, "kind": case.kind, "ladder": ladder,
                "what": case.what, "target": case.target, "culprits": list(case.culprits),
                "lowprec_only": case.lowprec_only,
                "tolerance": case.tolerance.describe() if case.tolerance else None,
                "caught": o.caught if case.kind == "bug" else None, "caught_by": o.caught_by,
                "false_alarm": o.false_alarm if case.kind == "alternate" else None, "ok": o.ok,
                "accepted": case.accepted, "wrong_culprits": o.wrong_culprits,
                "rungs": [rung_row(case, r) for r in o.results], "stricter": stricter,
            })
    summary = summarize(rows, ladders)
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} CPU, "
            f"{torch.get_num_threads()} threads, torch {torch.__version__}",
            "capture_seconds": round(t_capture, 1), "total_seconds": round(time.time() - t0, 1),
            "defaults": Tolerance().describe(), "rows": rows, "summary": summary}


def summarize(rows: list[dict[str, Any]], ladders: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ladder in ladders:
        bugs = [r for r in rows if r["ladder"] == ladder and r["kind"] == "bug"]
        alts = [r for r in rows if r["ladder"] == ladder and r["kind"] == "alternate"]
        by_rung: dict[str, int] = {}
        for r in bugs:
            for d in r["caught_by"]:
                by_rung[d] = by_rung.get(d, 0) + 1
        worst: dict[str, Any] = {}
        for r in alts:
            for g in r["rungs"]:
                key = g["rung"] + (" (tf32 policy)" if r["tolerance"] and r["tolerance"].get("tf32") else "")
                if "worst_ratio_lo" in g and g["worst_ratio_lo"] > worst.get(key, {}).get("ratio_lo", -1):
                    worst[key] = {"ratio_lo": g["worst_ratio_lo"], "ratio": g["worst_ratio"], "z": g["worst_z"],
                                  "budget": g["worst_budget"], "case": r["case"], "layer": g["worst_layer"],
                                  "margin": g["worst_budget"] / g["worst_ratio_lo"] if g["worst_ratio_lo"] else math.inf}
        out[ladder] = {
            "bugs": len(bugs), "caught": sum(r["caught"] for r in bugs),
            "caught_pct": 100.0 * sum(r["caught"] for r in bugs) / max(1, len(bugs)),
            "caught_by_rung": by_rung,
            "caught_only_by_fp32": sum(r["caught_by"] == ["float32"] for r in bugs),
            "missed": [r["case"] for r in bugs if not r["caught"]],
            "alternate_layer_judgments": sum(g.get("layers_judged", 0) for r in alts for g in r["rungs"]),
            "alternates": len(alts), "false_alarms": sum(r["false_alarm"] for r in alts),
            "false_alarm_cases": [r["case"] for r in alts if r["false_alarm"]],
            "alternate_worst": worst,
            "stricter": {b: {"caught": sum(r["stricter"][b] for r in bugs),
                             "false_alarms": sum(r["stricter"][b] for r in alts)} for b in map(str, STRICTER)},
        }
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [f"Measured {res['date']} on {res['machine']}; capture {res['capture_seconds']} s, "
             f"total {res['total_seconds']} s.", ""]
    lines += ["| ladder | bugs caught, right culprit | caught on low-precision rung | only on fp32 rung | "
              "missed | false alarms / alternates |", "|---|---|---|---|---|---|"]
    for ladder, s in res["summary"].items():
        low = sum(v for k, v in s["caught_by_rung"].items() if k in LOW)
        lines.append(f"| {ladder} | {s['caught']}/{s['bugs']} ({s['caught_pct']:.0f}%) | {low} | "
                     f"{s['caught_only_by_fp32']} | {', '.join(s['missed']) or '-'} | "
                     f"{s['false_alarms']}/{s['alternates']} |")
    lines += ["", "Per case (isolated ratio at the expected culprit: point / lower bound / sign-test z; "
              "`NaN` = non-finite output where the reference is finite):", ""]
    lines += ["| case | ladder | low rung | fp32 rung | culprit | caught by |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        cells = []
        for g in r["rungs"]:
            if "ratio" in g:
                v = "NaN" if g["nonfinite"] else f"{_fmt(g['ratio'])} / {_fmt(g['ratio_lo'])} / {g['z']:+.0f}"
            elif "worst_ratio_lo" in g:
                v = f"max lo {_fmt(g['worst_ratio_lo'])} ({g['worst_layer']})"
            else:
                v = "-"
            cells.append(("FAIL " if not g["passed"] else "pass ") + v)
        cul = ", ".join(sorted({str(g["culprit"]) for g in r["rungs"] if not g["passed"]})) or "-"
        by = ", ".join(r["caught_by"]) if r["kind"] == "bug" else ("FALSE ALARM" if r["false_alarm"] else "ok")
        lines.append(f"| {r['case']} | {r['ladder']} | {cells[0]} | {cells[1]} | {cul} | {by} |")
    lines += ["", "Largest isolated ratio lower bound over every layer of every correct alternate:", "",
              "| ladder | rung | max ratio_lo | point ratio | z | case / layer | budget | margin |",
              "|---|---|---|---|---|---|---|---|"]
    for ladder, s in res["summary"].items():
        for k, w in s["alternate_worst"].items():
            lines.append(f"| {ladder} | {k} | {_fmt(w['ratio_lo'])} | {_fmt(w['ratio'])} | {w['z']:+.0f} | "
                         f"{w['case']} / {w['layer']} | {w['budget']:g} | {w['margin']:.2f}x |")
    lines += ["", "Layer judgments on correct alternates (layers x rungs x alternates), all passing: " + ", ".join(
        f"{ladder} {s['alternate_layer_judgments']}" for ladder, s in res["summary"].items())]
    lines += ["", "Stricter low-precision budgets (fp32 rung unchanged), re-judged from the recorded metrics:", "",
              "| ladder | budget | bugs caught | false alarms |", "|---|---|---|---|"]
    for ladder, s in res["summary"].items():
        for b, v in s["stricter"].items():
            lines.append(f"| {ladder} | {b} | {v['caught']}/{s['bugs']} | {v['false_alarms']}/{s['alternates']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "detection"))
    ap.add_argument("--cases", default="")
    ap.add_argument("--ladders", default=",".join(C.LADDERS))
    ap.add_argument("--sketch", type=int, default=0, help="judge against sketch goldens with this group size")
    ap.add_argument("--replay", default="full", choices=["full", "fast"], help="fast: one teacher-forced run of the forward plus the deeper levels")
    a = ap.parse_args(argv)
    C.SKETCH = a.sketch
    C.REPLAY = a.replay
    res = run([c for c in a.cases.split(",") if c], [l for l in a.ladders.split(",") if l])
    res["sketch"] = a.sketch
    res["replay"] = a.replay
    md = (f"Sketch goldens, groups of {a.sketch} (propagated judgement only).\n\n" if a.sketch else "") + \
        ("Fast replay (one teacher-forced run of the forward plus the deeper levels).\n\n" if a.replay == "fast" else "") + markdown(res)
    print(md)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    out.with_suffix(".md").write_text(md)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    ok = all(s["false_alarms"] == 0 and s["caught_pct"] >= 90.0 for s in res["summary"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
