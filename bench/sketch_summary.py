"""Summarize a detection run over sketch goldens: bugs blamed at or under the right module.

    python bench/detection.py --sketch 512 --out bench/results/detection-sketch512 \
        && python bench/sketch_summary.py bench/results/detection-sketch512.json

A sketch golden judges the propagated run only, so a bug inside an unselected part of a module
(the attention core between q/k/v_proj and o_proj) first shows at the next selected child; this
counts a culprit at or under an accepted module as right, and says which cases missed.
"""
import json, sys
d = json.load(open(sys.argv[1]))
for ladder in ("bf16", "fp16"):
    rows = [r for r in d["rows"] if r["ladder"] == ladder]
    bugs = [r for r in rows if r["kind"] == "bug"]; alts = [r for r in rows if r["kind"] == "alternate"]
    def culprits(r): return [x.get("culprit") for x in r["rungs"] if not x.get("passed", True)]
    def under(c, acc): return c is not None and any(c == a or c.startswith(a + ".") for a in acc)
    caught_any = sum(1 for r in bugs if culprits(r))
    caught_sub = sum(1 for r in bugs if any(under(c, r["culprits"]) for c in culprits(r)))
    fa = sum(1 for r in alts if culprits(r))
    print(ladder, f"bugs failing: {caught_any}/{len(bugs)}, culprit at or under the right module: {caught_sub}/{len(bugs)}, false alarms {fa}/{len(alts)}")
    for r in bugs:
        if not any(under(c, r["culprits"]) for c in culprits(r)):
            print("   miss", r["case"], culprits(r), r["culprits"][:2])
