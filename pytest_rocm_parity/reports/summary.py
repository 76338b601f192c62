"""Terminal summary: one line per check, then the goldens created, updated, missing, obsolete.

One line per check (verdict, model/check name, dtype, culprit and why, first
divergent layer; for a check that reached no verdict, ERROR and why on the next
line), an indented line for profiler-parity flags or LM metrics when present,
then one line per golden list, then where the reports were written.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_rocm_parity.judging.assertion import headline
from pytest_rocm_parity.options import capture_command
from pytest_rocm_parity.tables import text_table

MAX_LISTED = 20
MAX_REASON = 110


def _culprit_reason(r: dict[str, Any]) -> str:
    for l in r.get("layers", []):
        if l.get("name") == r.get("culprit"):
            reason = str((l.get("metrics") or {}).get("reason", ""))
            if len(reason) <= MAX_REASON:
                return reason
            # which output failed (" (output grad_input)") ends the reason: cut before it, not it
            at = reason.rfind(" (output ")
            tail = reason[at:] if at > 0 and reason.endswith(")") and len(reason) - at < MAX_REASON // 2 else ""
            return reason[:MAX_REASON - 1 - len(tail)] + "…" + tail
    return ""


def verdict(r: Mapping[str, Any]) -> str:
    """PASS, FAIL, ERROR for a check that reached no verdict (its golden unreadable, the replay raised),
    or XFAIL for a failure its test expected (``expected``)."""
    return "ERROR" if r.get("error") else "PASS" if r.get("passed") else "XFAIL" if r.get("expected") else "FAIL"


# why a failing check's test expected it (the result's ``expected``), as the summary and the report say it
EXPECTED = {"xfail": "its test is marked xfail and failed as expected",
            "caught": "its test caught the failure and passed (pytest.raises, a planted bug's self-test)"}


def counts(checks: Sequence[Mapping[str, Any]]) -> Counter[str]:
    """How many checks have each verdict (``verdict``): one count for the summary, the HTML and the title."""
    return Counter(verdict(c) for c in checks)


def counts_text(checks: Sequence[Mapping[str, Any]], failed: str = "failed") -> str:
    """``"2 passed, 1 failed, 1 failed as its test expected, 1 error"``: the parts with a count."""
    n = counts(checks)
    return ", ".join([f"{n['PASS']} passed", f"{n['FAIL']} {failed}"]
                     + ([f"{n['XFAIL']} failed as {'their tests' if n['XFAIL'] > 1 else 'its test'} expected"]
                        if n["XFAIL"] else [])
                     + ([plural(n["ERROR"], "error")] if n["ERROR"] else []))


def error_text(r: Mapping[str, Any]) -> str:
    """What kept an error entry from a verdict, in one line: ``golden corrupt: <the exception's message>``."""
    err = r.get("error") or {}
    kind = str(err.get("kind", "error"))
    what = (f"golden {kind}" if kind in ("missing", "corrupt", "stale") else "golden of another project"
            if kind == "foreign" else str(err.get("type") or "error"))
    return f"{what}: " + " ".join(str(err.get("message", "")).split())


def check_labels(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each check's name as the summary and the HTML report show it: where several tests replay one
    golden at one dtype (a migration's variants), each name is followed by its test, which tells them
    apart (``bert (test_bert[eager])``)."""
    count = Counter((str(c.get("name")), str(c.get("dtype"))) for c in checks)
    return [f"{c.get('name')} ({str(c['test']).split('::', 1)[-1]})"
            if count[(str(c.get("name")), str(c.get("dtype")))] > 1 and c.get("test") else str(c.get("name", ""))
            for c in checks]


VERDICT_ORDER = {"ERROR": 0, "FAIL": 1, "XFAIL": 2, "PASS": 3}


def ordered_checks(checks: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(label, check)`` in the order the summary and the HTML report list checks: errors, then
    failures, then passes, each by label (``check_labels``) and dtype."""
    return sorted(zip(check_labels(checks), checks),
                  key=lambda lc: (VERDICT_ORDER[verdict(lc[1])], lc[0], str(lc[1].get("dtype"))))


def check_line(r: dict[str, Any], width: int = 0, verdict_width: int = 4, notes: bool = False) -> list[str]:
    """The line (and indented detail lines) of one check result dict; ``notes``: a passing check's
    notes too (a failing one's are in its failure message)."""
    if r.get("error"):
        # a check refused over its arguments may have no dtypes to show: no empty brackets then
        rungs = f"[{r['dtype']}]" if r.get("dtype") else ""
        return text_table([("ERROR", r.get("name", ""), rungs, "")], widths=(5, width, 0, None),
                          sep=" ") + [f"      {error_text(r)}"]
    parts = [EXPECTED[r["expected"]]] if r.get("expected") in EXPECTED else []
    if r.get("culprit"):
        block = r.get("culprit_block")
        c = f"culprit {r['culprit']}" + (f" (block {block})" if block and block != r["culprit"] else "")
        why = _culprit_reason(r)
        parts.append(c + (f": {why}" if why else ""))
    elif not r.get("passed"):
        parts.append(headline(r.get("extra") or {}))
    elif (r.get("extra") or {}).get("undecided"):
        parts.append(f"undecided: {_listed(r['extra']['undecided'])} (over budget on too few tokens to judge"
                     + ("; see the notes)" if notes else "; -v for the notes)"))
    if r.get("first_divergent") and not r.get("passed"):
        parts.append(f"first divergent {r['first_divergent']}")
    out = text_table([(verdict(r), r.get("name", ""), f"[{r.get('dtype', '')}]", " " + "; ".join(parts))],
                     widths=(verdict_width, width, 0, None), sep=" ")
    extra = r.get("extra") or {}
    lm = extra.get("lm")
    if lm:
        out.append(f"     lm: ppl d={lm.get('ppl_rel_delta', 0):+.2e} top1={lm.get('top1_agreement', 0):.4f}")
    prof = extra.get("profile")
    if isinstance(prof, dict):
        prof = prof.get("flags")
    if prof:
        from pytest_rocm_parity.reports.profiling import format_flags

        out.append(f"     profile: share of time grew: {format_flags([p for p in prof if isinstance(p, dict)])}")
    if r.get("extra", {}).get("failing_tensors"):
        out.append(f"     failing tensors: {extra['failing_tensors']}")
    if notes and r.get("passed"):
        out += [f"     note: {n}" for n in r.get("notes") or ()]
    return out


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def withheld_lines(withheld: list[dict[str, Any]]) -> list[str]:
    """One line per test and outcome: the goldens it captured but did not write, and why."""
    groups: dict[tuple[bool, str], list[str]] = {}
    for w in withheld:
        groups.setdefault((bool(w.get("existed")), str(w.get("reason", ""))), []).append(str(w.get("name")))
    return [f"goldens not {'updated' if existed else 'created'} ({why}; "
            + ("the goldens on disk are as they were" if existed else "nothing was written")
            + f"; capture again once the test passes): {_listed(names)}"
            for (existed, why), names in groups.items()]


def _listed(items: list[str]) -> str:
    return ", ".join(items[:MAX_LISTED]) + (f" ... (+{len(items) - MAX_LISTED})" if len(items) > MAX_LISTED else "")


FOREIGN_LABEL = ("of another project (a shared golden directory holds its golden under the same check name; "
                 "neither judged nor written: give these checks names of their own, see each error or skip reason)")


def kept_label(regen: str | None) -> str:
    """Why existing goldens were kept: a run given --parity-regen already uses the flag."""
    if regen is None:
        return "kept (exists; use --parity-regen)"
    return f"kept (exists; --parity-regen={regen} does not match them)"


# said by the summary and the report of a run in which an xdist worker went down without its report
LOST_WORKER = ("incomplete: an xdist worker crashed, and the checks it ran went down with it: they are not in this "
               "summary nor in the report; rerun to see them")


def summary_lines(session: Any) -> list[str]:
    res = session.results
    g = session.goldens
    obsolete = list(getattr(session, "obsolete", []) or [])
    unchecked = list(getattr(session, "unchecked", []) or [])
    pruned = list(getattr(session, "pruned", []) or [])
    withheld = list(getattr(g, "withheld", []) or [])
    leftovers = list(getattr(session, "leftovers", []) or [])
    store_leftovers = list(getattr(session, "store_leftovers", []) or [])
    foreign = list(getattr(g, "foreign", []) or [])
    if not res and not (g.created or g.updated or g.missing or g.corrupt or g.stale or g.kept or obsolete or pruned or withheld
                        or leftovers or store_leftovers or foreign or unchecked
                        or getattr(session, "lost_worker", False)):
        return []
    lines = ["", "=" * 20 + " rocm-parity summary " + "=" * 20]
    ordered = [{**r, "name": label} for label, r in ordered_checks(res)]
    width = max((len(str(r.get("name", ""))) for r in ordered), default=0)
    verdict_width = max((len(verdict(r)) for r in res), default=4)
    verbose = session.config.get_verbosity() > 0 if hasattr(session, "config") else False
    for r in ordered:
        lines += check_line(r, width, verdict_width, notes=verbose)
    if res:
        lines.append(f"{plural(len(res), 'check')}: {counts_text(res)}")
    if getattr(session, "lost_worker", False):
        lines.append(f"rocm-parity: {LOST_WORKER}")
    for label, items in (("created", g.created), ("updated", g.updated), ("missing", g.missing),
                         ("corrupt (unreadable: " + ("delete the damaged files from the store, then" if hasattr(
                             getattr(session, "store", None), "url") else "restore them, e.g. git lfs pull, or")
                          + " rewrite them with --parity-regen)",
                          getattr(g, "corrupt", [])),
                         ("stale (they describe another model, inputs or setting: see each error or skip "
                          "reason; --parity-regen rewrites them)",
                          getattr(g, "stale", [])),
                         (FOREIGN_LABEL, foreign),
                         (kept_label(getattr(getattr(session, "options", None), "regen", None)), g.kept),
                         ("obsolete (no check of this run uses them: their test is gone or checks other names; "
                          "--parity-prune-obsolete deletes)", obsolete),
                         ("unchecked (their test ran and passed without checking them: it made no check, as one "
                          "that returns early does, or its file still names them, a check behind a condition; kept, "
                          "not obsolete)", unchecked),
                         ("pruned", pruned)):
        if items:
            lines.append(f"goldens {label}: {_listed(list(items))}")
    lines += withheld_lines(withheld)
    if leftovers:
        lines.append(f"leftover files (no manifest names them: a stopped capture's, a file a regeneration replaced "
                     f"while another run was reading it, or a golden's whose manifest.json is gone, which git "
                     f"checkout restores; --parity-prune-obsolete deletes): "
                     f"{_listed([str(p) for p in leftovers])}")
    if store_leftovers:
        lines.append(f"leftover files in the store (uploads stopped over an hour ago before they were moved into "
                     f"place, a killed capture's; no manifest names them; --parity-prune-obsolete deletes): "
                     f"{_listed(store_leftovers)}")
    no_dir = (session.store.missing_root(capture_command(flags=session.options.command_flags))
              if g.missing and hasattr(session, "store") else "")
    if no_dir:
        lines.append(no_dir[0].upper() + no_dir[1:])
    report_dir = getattr(getattr(session, "options", None), "report_dir", None)
    if report_dir is not None and res and getattr(session, "reports_written", False):
        lines.append(f"report: {report_dir}/parity-report.html (tables: checks.csv, layers.csv)")
    return lines
