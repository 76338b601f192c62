"""The one place where parity records become a test failure, with a readable message."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_rocm_parity.records import CheckResult, LayerRecord

MAX_ROWS = 24
MAX_CHARS = 6000


def env_line(env: dict[str, Any]) -> str:
    if not env:
        return "unknown"
    parts = [str(env.get("device", "?"))]
    if env.get("device_name"):
        parts.append(str(env["device_name"]))
    if env.get("arch"):
        parts.append(f"({env['arch']})")
    parts.append(f"torch {env.get('torch', '?')}")
    if env.get("hip"):
        parts.append(f"HIP {env['hip']}")
    elif env.get("cuda") and str(env.get("device", "")).startswith("cuda"):
        parts.append(f"CUDA {env['cuda']}")
    return " ".join(parts)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}"


def _row(l: LayerRecord) -> str:
    iso, prop = l.iso, l.prop
    verdict = "FAIL" if not l.iso_passed else ("drift" if not l.prop_passed else "ok")
    return (f"  {l.name[:44]:<44} {_fmt(iso.ratio if iso else None):>9} {_fmt(l.budget):>6} "
            f"{_fmt(iso.z if iso else None):>7} {_fmt(prop.ratio if prop else None):>9} "
            f"{_fmt(prop.rel_to_ref if prop else None):>9}  {verdict}")


def table(result: CheckResult, max_rows: int = MAX_ROWS) -> list[str]:
    rows = result.layers
    if len(rows) > max_rows:
        # failing layers and the first divergent one first, then the rest in order
        important = [l for l in rows if not l.iso_passed or l.name == result.first_divergent]
        rest = [l for l in rows if l not in important]
        keep = set(map(id, (important + rest)[:max_rows]))
        shown = [l for l in rows if id(l) in keep]
    else:
        shown = rows
    lines = [f"  {'layer':<44} {'iso ratio':>9} {'budget':>6} {'z':>7} {'prop ratio':>9} {'rel->ref':>9}  verdict"]
    lines += [_row(l) for l in shown]
    if len(shown) < len(rows):
        lines.append(f"  ... {len(rows) - len(shown)} more layers passed (full table: --parity-report=DIR)")
    return lines


def message(result: CheckResult) -> str:
    lines = [f"parity check failed: {result.name} [{result.dtype}]",
             f"  reference: {env_line(result.reference_env)}",
             f"  candidate: {env_line(result.candidate_env)}"]
    culprit = next((l for l in result.layers if l.name == result.culprit), None)
    if culprit is not None:
        inside = f" (inside block {result.culprit_block})" if result.culprit_block and result.culprit_block != result.culprit else ""
        lines.append(f"  culprit: {result.culprit}{inside}: {culprit.reason}")
    else:
        lines.append("  culprit: none in isolation; the model outputs drifted (accumulated error)")
    lines.append(f"  first divergent layer (propagated): {result.first_divergent or 'none'}")
    bad_out = [o for o in result.outputs if not o.passed]
    for o in bad_out[:3]:
        lines.append(f"  output {o.name}: {o.reason}")
    lm = result.extra.get("lm")
    if lm:
        gen = lm.get("generation") or {}
        lines.append(f"  lm: ppl {lm['ppl']:.6g} vs reference {lm['ppl_ref']:.6g} (rel {lm['ppl_rel_delta']:+.2e}), "
                     f"top-1 agreement {lm['top1_agreement']:.4f} ({lm['confident_flips']} confident flips), "
                     f"KL mean {lm['kl_mean']:.2e} max {lm['kl_max']:.2e}"
                     + (f", first divergent generation step {gen.get('first_divergent_step')}" if gen else ""))
    lines += table(result)
    fixes = {l.name: l.would_pass_ratio for l in result.layers if not l.iso_passed and l.would_pass_ratio}
    if fixes:
        worst = max(fixes.values())
        lines.append(f"  would have passed with tolerance=Tolerance(ratio={worst:g}) (or per layer: "
                     + ", ".join(f"{k!r}: Tolerance(ratio={v:g})" for k, v in list(fixes.items())[:3]) + ")")
    for n in result.notes:
        lines.append(f"  note: {n}")
    lines.append(f"  golden: {result.golden}")
    text = "\n".join(lines)
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS] + "\n  ... (message capped; see --parity-report=DIR)"
    return text


def raise_if_failed(results: Sequence[CheckResult]) -> None:
    __tracebackhide__ = True
    failed = [r for r in results if not r.passed]
    if failed:
        raise AssertionError("\n\n".join(message(r) for r in failed))
