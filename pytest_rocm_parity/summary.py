"""Terminal summary: one line per check, then the goldens created, updated, missing, obsolete."""
from __future__ import annotations

from typing import Any


def summary_lines(session: Any) -> list[str]:
    res = session.results
    g = session.goldens
    if not res and not (g.created or g.updated or g.missing or g.kept):
        return []
    lines = ["", "=" * 20 + " rocm-parity summary " + "=" * 20]
    for r in sorted(res, key=lambda r: (r["name"], r["dtype"])):
        verdict = "PASS" if r["passed"] else "FAIL"
        extra = ""
        if r.get("culprit"):
            extra = f"  culprit {r['culprit']}"
        if r.get("first_divergent") and not r["passed"]:
            extra += f"  first divergent {r['first_divergent']}"
        lm = r.get("extra", {}).get("lm")
        if lm:
            extra += f"  ppl d={lm.get('ppl_rel_delta', 0):+.2e} top1={lm.get('top1_agreement', 0):.4f}"
        lines.append(f"{verdict} {r['name']} [{r['dtype']}]{extra}")
    for label, items in (("created", g.created), ("updated", g.updated), ("missing", g.missing),
                         ("kept (exists; use --parity-regen)", g.kept),
                         ("obsolete (no collected test uses them; --parity-prune-obsolete deletes)", session.obsolete),
                         ("pruned", session.pruned)):
        if items:
            lines.append(f"goldens {label}: {', '.join(items[:20])}{' ...' if len(items) > 20 else ''}")
    return lines
