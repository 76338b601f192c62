"""Reports people look at: one self-contained HTML page, CSV tables, failing tensors.

``write_all(doc, out_dir)`` is called by the session after it wrote
``parity-report.json`` (``doc`` is that document, see docs/reports.md) and writes:

* ``parity-report.html``: one file that opens offline: inline CSS and inline SVG
  plots drawn here in Python; no JavaScript, no CDN, no external resource;
* ``layers.csv`` (one row per check x layer, every metric) and ``checks.csv``
  (one row per check), through pandas (``tables.write_csv``).

``save_failing_tensors(result, tensors, out_dir)`` writes the obtained tensors of
a failing check's failing layers to ``<out_dir>/tensors/<check>-<dtype>.safetensors`` (a
parametrized test's parameters after ``<check>`` where its name lacks them);
the HTML links that file when it exists.

Nothing here imports torch at module level, and nothing here may break a test
session: ``write_all`` reports a failed artifact as a warning and goes on.
"""
from __future__ import annotations

import html
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_rocm_parity.judging.assertion import SUGGEST_WITHIN, ratio_tolerance, verdict_label
from pytest_rocm_parity.judging.records import layer_columns, layer_rows, layers_frame
from pytest_rocm_parity.atomic import atomic_write
from pytest_rocm_parity.progress import megabytes
from pytest_rocm_parity.reports.summary import EXPECTED, counts, error_text, ordered_checks, verdict
from pytest_rocm_parity.tables import write_csv

HTML_NAME = "parity-report.html"
LAYERS_CSV = "layers.csv"
CHECKS_CSV = "checks.csv"
TENSORS_DIR = "tensors"
MAX_TENSOR_BYTES = 256 * 1024 * 1024

# colours of the plot (colour-blind safe pair: blue reference, orange candidate)
C_REF = "#1f6fb4"
C_CAND = "#e8710a"
C_BUDGET = "#7a7a7a"
C_FAIL = "#c62828"


# ---------------------------------------------------------------------------------------------
# public API

def write_all(doc: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write the HTML report and the CSV tables for ``doc`` into ``out_dir``; returns what was written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for key, fn in (("layers_csv", _write_layers_csv), ("checks_csv", _write_checks_csv),
                    ("html", _write_html)):
        try:
            path = fn(doc, out)
        except Exception as exc:  # a report must never break the test session that produced it
            warnings.warn(f"rocm-parity: could not write the {key} report into {out}: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            continue
        if path is not None:
            written[key] = path
    return written


def _test_params(test: str) -> str:
    """The parameters of a pytest node id (``[eager]`` of ``tests/t.py::test_m[eager]``), or ''."""
    _, sep, function = test.partition("::")
    at = function.find("[")
    return function[at:] if sep and at >= 0 else ""


def failing_tensors_path(out_dir: str | os.PathLike[str], name: str, dtype: str, test: str = "") -> Path:
    """Where ``save_failing_tensors`` puts one check's tensors: ``<check>-<dtype>``, with the
    parameters of ``test`` after the check's name where the name lacks them (the variants of one
    parametrized test that name one golden), so that each test has a file of its own."""
    from pytest_rocm_parity.golden.store import safe_name

    params = _test_params(test)
    key = name if name.endswith(params) else name + params
    return Path(out_dir) / TENSORS_DIR / f"{safe_name(f'{key}-{dtype}')}.safetensors"


def clear_failing_tensors(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Delete the failing tensors an earlier run saved into ``out_dir`` (those whose metadata names
    their check and failing layers, as save_failing_tensors writes them), so that a report folder a
    runner reuses holds this run's only. Returns the files deleted."""
    from safetensors import safe_open

    gone = []
    for f in sorted((Path(out_dir) / TENSORS_DIR).glob("*.safetensors")):
        try:
            with safe_open(str(f), "np") as st:
                meta = st.metadata() or {}
        except Exception:   # not a safetensors file of ours: left alone
            continue
        if "check" in meta and "failing_layers" in meta:
            f.unlink(missing_ok=True)
            gone.append(f)
    return gone


def failing_layer_names(result: Any) -> list[str]:
    """Names of the layers (and model outputs) of ``result`` that failed, in execution order."""
    d = _as_dict(result)
    names = [l["name"] for l in d.get("layers", []) if not (l.get("passed", True) and l.get("prop_passed", True))]
    names += [o["name"] for o in d.get("outputs", []) if not o.get("passed", True)]
    return names


def save_failing_tensors(result: Any, tensors: Mapping[str, Any], out_dir: str | os.PathLike[str],
                         max_bytes: int = MAX_TENSOR_BYTES) -> Path | None:
    """Save the obtained tensors of ``result``'s failing layers next to the HTML report.

    ``result`` is a CheckResult (or its ``to_dict()``); ``tensors`` maps keys to tensors, each key
    ``"<layer key>/<anything>"`` (e.g. ``"blocks.2/0/isolated"``) or exactly a layer key. Only keys
    whose layer failed (isolated or propagated, or a failing model output ``<output>.<leaf>``) are
    written, moved to the CPU, into ``failing_tensors_path(out_dir, check, dtype, test)`` with the
    check, dtype, culprit and test in the file's metadata; tensors beyond ``max_bytes`` in total
    are left out (named in the metadata). Returns the file, or None when the check passed or no
    key matched. When ``result`` is a CheckResult or a dict, ``extra["failing_tensors"]`` is set
    to the file's path relative to ``out_dir`` so the JSON report names it too.
    """
    d = _as_dict(result)
    if d.get("passed", True):
        return None
    failing = failing_layer_names(d)
    chosen: dict[str, Any] = {}
    skipped: list[str] = []
    total = 0
    storages: set[int] = set()
    for key, t in tensors.items():
        if not any(key == n or key.startswith(n + "/") for n in failing):
            continue
        t = t.detach().to("cpu").contiguous()
        # safetensors refuses tensors that share memory: a module's outputs that are views of one
        # storage (a tuple holding a tensor twice, chunks, y and y.view) each get their own copy
        if t.untyped_storage().data_ptr() in storages - {0}:
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        size = t.numel() * t.element_size()
        if total + size > max_bytes:
            skipped.append(key)
            continue
        total += size
        chosen[key] = t
    if not chosen:
        return None
    from safetensors.torch import save_file

    path = failing_tensors_path(out_dir, str(d.get("name", "check")), str(d.get("dtype", "")), str(d.get("test", "")))
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"check": str(d.get("name", "")), "dtype": str(d.get("dtype", "")), "test": str(d.get("test", "")),
            "culprit": str(d.get("culprit")), "first_divergent": str(d.get("first_divergent")),
            "failing_layers": json.dumps(failing), "skipped_over_budget": json.dumps(skipped)}
    atomic_write(path, lambda tmp: save_file(chosen, tmp, metadata=meta))
    rel = path.relative_to(Path(out_dir)).as_posix()
    extra = result.get("extra") if isinstance(result, dict) else getattr(result, "extra", None)
    if isinstance(extra, dict):
        extra["failing_tensors"] = rel
    return path


# ---------------------------------------------------------------------------------------------
# tables (also the CSV rows)

def _as_dict(result: Any) -> dict[str, Any]:
    return result if isinstance(result, dict) else result.to_dict()


def _env_brief(env: Mapping[str, Any]) -> str:
    if not env:
        return ""
    ver = " ".join(f"{k} {env[k]}" for k in ("cuda", "hip") if env.get(k))
    arch = env.get("arch", "") if env.get("arch") != env.get("device_name") else ""   # a CPU's name is its arch
    return " ".join(str(x) for x in (env.get("backend", ""), env.get("device_name", ""), arch,
                                     f"torch {env.get('torch', '')}", ver) if x).strip()


# checks.csv's columns, written as its header even when no check ran (a capture run), so that
# pandas.read_csv reads an empty table instead of raising EmptyDataError
CHECK_COLUMNS = ("test", "check", "dtype", "kind", "passed", "culprit", "culprit_block", "first_divergent", "layers",
                 "failing_isolated", "failing_propagated", "failing_outputs", "undecided", "reference", "candidate",
                 "profile_flags", "golden", "notes", "error", "error_message", "expected")


def check_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for c in doc.get("checks", []):
        layers = (c.get("layers") or [])
        prof = (c.get("extra") or {}).get("profile") or []
        rows.append({
            "test": c.get("test", ""), "check": c.get("name", ""), "dtype": c.get("dtype", ""),
            "kind": c.get("kind", ""), "passed": c.get("passed"), "culprit": c.get("culprit"),
            "culprit_block": c.get("culprit_block"), "first_divergent": c.get("first_divergent"),
            "layers": len(layers), "failing_isolated": sum(1 for l in layers if not l.get("iso_passed", True)),
            "failing_propagated": sum(1 for l in layers if not l.get("prop_passed", True)),
            "failing_outputs": sum(1 for o in (c.get("outputs") or []) if not o.get("passed", True)),
            "undecided": ";".join((c.get("extra") or {}).get("undecided") or []),
            "reference": _env_brief(c.get("reference_env") or {}),
            "candidate": _env_brief(c.get("candidate_env") or {}),
            "profile_flags": ";".join(f"{p.get('op')}x{_fmt_num(p.get('growth'))}" for p in _profile_flags(prof)),
            "golden": c.get("golden", ""), "notes": " | ".join(c.get("notes", [])),
            "error": (c.get("error") or {}).get("kind", ""), "error_message": error_text(c) if c.get("error") else "",
            "expected": c.get("expected") or "",
        })
    return rows


def _write_layers_csv(doc: Mapping[str, Any], out: Path) -> Path:
    rows = layer_rows(doc)
    return write_csv(rows, out / LAYERS_CSV, layer_columns(rows))


def _write_checks_csv(doc: Mapping[str, Any], out: Path) -> Path:
    return write_csv(check_rows(doc), out / CHECKS_CSV, CHECK_COLUMNS)


# ---------------------------------------------------------------------------------------------
# the SVG plot

def _num(x: Any) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _fmt_num(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "–"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e4:
        return f"{v:.3g}"
    return f"{v:.2e}"


def _series(layers: list[dict[str, Any]], prefix: str, budget_key: str) -> list[dict[str, Any]]:
    """Per layer: reference error, candidate error and budget, relative to the truth's RMS."""
    pts = []
    for i, l in enumerate(layers):
        m = l.get("metrics") or {}
        if f"{prefix}_err_cand" not in m:
            continue
        kind = m.get(f"{prefix}_kind", "float")
        ec, er = _num(m.get(f"{prefix}_err_cand")), _num(m.get(f"{prefix}_err_ref"))
        rms = _num(m.get(f"{prefix}_rms_truth")) or 0.0
        scale = rms if rms > 0 and math.isfinite(rms) else 1.0
        ratio = _num(m.get(f"{prefix}_ratio"))
        # ratio = err_cand / max(err_ref, floor): the denominator the budget multiplies
        if ratio is not None and ratio > 0 and math.isfinite(ratio) and ec is not None and ec > 0:
            denom = ec / ratio
        else:
            denom = er or 0.0
        budget = _num(m.get(budget_key)) or 0.0
        note = str(m.get(f"{prefix}_note", "") or "")
        nonfinite = int(m.get(f"{prefix}_nonfinite") or 0)
        broken = kind == "exact" or nonfinite > 0 or note.startswith("shape") or (ratio is not None and math.isinf(ratio))
        pts.append({
            "i": i, "name": l.get("name", ""), "level": int(m.get("level", 0) or 0),
            "ref": None if er is None else er / scale, "cand": None if ec is None else ec / scale,
            "budget": denom * budget / scale if denom > 0 else None,
            "ratio": ratio, "failed": not l.get("iso_passed" if prefix == "iso" else "prop_passed", True),
            "broken": broken and kind != "exact", "exact": kind == "exact",
            "mismatches": int(m.get(f"{prefix}_mismatches") or 0), "note": note,
        })
    return pts


def _log_range(values: Iterable[float]) -> tuple[float, float]:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return 1e-8, 1.0
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    if hi - lo < 2:
        lo, hi = lo - 1, hi + 1
    return 10.0 ** lo, 10.0 ** hi


def svg_plot(layers: list[dict[str, Any]], mode: str, culprit: str | None, first_divergent: str | None,
             title: str, width: int = 560, height: int = 330) -> str:
    """Inline SVG: error / RMS(truth) against layer depth, log scale, for ``mode`` 'iso' or 'prop'.

    Errors of exactly zero (the candidate or the reference reproduced the truth bit for bit) have
    no place on a log axis: they are drawn as hollow markers in an "exact" band under the plot,
    never at the axis floor. The x labels hang vertically under their points, thinned so that no
    two overlap, shortened to the end of the name with the full name as a hover title.
    """
    budget_key = "budget_ratio" if mode == "iso" else "budget_propagated"
    pts = _series(layers, mode, budget_key)
    ml, mr, mt, mb = 64, 16, 40, 112   # mt: the title's line, then the culprit label's under it
    band = 16                       # the "exact (0)" band at the bottom of the plot area
    pw, ph = width - ml - mr, height - mt - mb
    pl = ph - band                  # height of the log-scale part
    e = html.escape
    out = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}" data-mode="{mode}">',
           f'<title>{e(title)}</title>',
           f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fcfcfc" stroke="#ccc"/>',
           f'<text x="{ml}" y="16" font-size="13" font-weight="600" fill="#222">{e(title)}</text>']
    if not pts:
        out.append(f'<text x="{ml + pw / 2}" y="{mt + ph / 2}" font-size="12" text-anchor="middle" '
                   f'fill="#777">no float layers to plot</text></svg>')
        return "".join(out)
    lo, hi = _log_range([v for p in pts for v in (p["ref"], p["cand"], p["budget"])])
    llo, lhi = math.log10(lo), math.log10(hi)
    n = len(pts)
    band_y = mt + pl + band / 2     # centre line of the exact band

    def X(k: int) -> float:
        return ml + (pw * (k + 0.5) / n)

    def Y(v: float | None) -> float:
        if v is None or not math.isfinite(v):
            return mt + 4.0   # non-finite: pinned at the top
        if v <= 0:
            return band_y     # exact zero: in the band, off the log scale
        return mt + pl * (1 - (math.log10(min(max(v, lo), hi)) - llo) / (lhi - llo))

    # decade grid and labels; the exact band under the log scale
    for d in range(int(round(llo)), int(round(lhi)) + 1):
        y = Y(10.0 ** d)
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e6e6"/>'
                   f'<text x="{ml - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end" fill="#555">1e{d}</text>')
    out.append(f'<rect class="exact-band" x="{ml}" y="{mt + pl:.1f}" width="{pw}" height="{band}" fill="#eef5ee"/>'
               f'<line x1="{ml}" x2="{ml + pw}" y1="{mt + pl:.1f}" y2="{mt + pl:.1f}" stroke="#bbb"/>'
               f'<text class="exact-label" x="{ml - 6}" y="{band_y + 3.5:.1f}" font-size="10" text-anchor="end" '
               f'fill="#2e7d32">exact<title>error exactly 0: reproduced the float64 truth bit for bit '
               f'(no place on a log scale)</title></text>')
    out.append(f'<text transform="translate(14,{mt + pl / 2}) rotate(-90)" font-size="11" text-anchor="middle" '
               f'fill="#444">RMSE / RMS(truth), log</text>')
    # culprit band and first-divergent line
    for k, p in enumerate(pts):
        if culprit and p["name"] == culprit:
            bw = max(pw / n, 6.0)
            label = f"culprit: {_short(p['name'], 28)}"
            # centred over its band, but kept whole inside the plot: a wide estimate of its width
            # (bold 11 px: at most 7 px a character) decides how far from either edge it may sit
            half = min(len(label) * 3.5, pw / 2)
            cx = min(max(X(k), ml + half), ml + pw - half)
            out.append(f'<rect class="culprit-band" x="{X(k) - bw / 2:.1f}" y="{mt}" width="{bw:.1f}" height="{ph}" '
                       f'fill="{C_FAIL}" fill-opacity="0.13"/>'
                       f'<text class="culprit-label" x="{cx:.1f}" y="{mt - 6}" '
                       f'font-size="11" text-anchor="middle" fill="{C_FAIL}" font-weight="700">'
                       f'{e(label)}<title>culprit: {e(p["name"])}</title></text>')
        if first_divergent and p["name"] == first_divergent and first_divergent != culprit:
            out.append(f'<line x1="{X(k):.1f}" x2="{X(k):.1f}" y1="{mt}" y2="{mt + ph}" stroke="{C_FAIL}" '
                       f'stroke-dasharray="2,3"><title>first divergent: {e(p["name"])}</title></line>')
    # lines: broken at exact zeros, which are not on the log scale
    for key, color, dash, wdt in (("budget", C_BUDGET, "5,4", 1.2), ("ref", C_REF, "", 1.6), ("cand", C_CAND, "", 1.6)):
        runs: list[list[str]] = [[]]
        for k, p in enumerate(pts):
            v = p[key]
            if v is None or p["exact"] or v <= 0:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append(f"{X(k):.1f},{Y(v):.1f}")
        for coords in runs:
            if len(coords) > 1:
                out.append(f'<polyline class="series-{key}" points="{" ".join(coords)}" fill="none" stroke="{color}" '
                           f'stroke-width="{wdt}"' + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
    # points, with native tooltips
    for k, p in enumerate(pts):
        r = 3.2 if p["level"] == 0 else 2.2
        tip = (f'{p["name"]} (level {p["level"]}): reference {_err_text(p["ref"])}, candidate {_err_text(p["cand"])}, '
               f'budget {_fmt_num(p["budget"])}, ratio {_fmt_num(p["ratio"])}'
               + (f', {p["mismatches"]} exact mismatches' if p["exact"] else "") + (" FAIL" if p["failed"] else ""))
        out.append(f'<g class="pt{" fail" if p["failed"] else ""}"><title>{e(tip)}</title>')
        if p["exact"]:
            out.append(f'<rect x="{X(k) - 3:.1f}" y="{band_y - 3:.1f}" width="6" height="6" '
                       f'fill="{C_FAIL if p["failed"] else "#888"}"/>')
        else:
            for key, color in (("ref", C_REF), ("cand", C_CAND)):
                v = p[key]
                if v is None:
                    continue
                if key == "cand" and (p["broken"] or not math.isfinite(v)):
                    x, y = X(k), mt + 4
                    out.append(f'<path d="M{x - 5:.1f},{y + 8:.1f} L{x:.1f},{y - 1:.1f} L{x + 5:.1f},{y + 8:.1f} Z" '
                               f'fill="{C_FAIL}"/>')
                elif v == 0:
                    out.append(f'<circle class="exact-zero" cx="{X(k):.1f}" cy="{band_y:.1f}" r="{r}" fill="#fff" '
                               f'stroke="{color}" stroke-width="1.6"/>')
                else:
                    out.append(f'<circle cx="{X(k):.1f}" cy="{Y(v):.1f}" r="{r}" fill="{color}"/>')
            if p["failed"]:
                y = Y(p["cand"]) if p["cand"] is not None and not p["broken"] else mt + 6
                out.append(f'<circle cx="{X(k):.1f}" cy="{y:.1f}" r="{r + 3.5}" fill="none" '
                           f'stroke="{C_FAIL}" stroke-width="1.8"/>')
        out.append("</g>")
    out += _x_labels(pts, X, mt + ph, mb - 22, pw / n, culprit, first_divergent)
    out.append(f'<text x="{ml}" y="{height - 5}" font-size="11" fill="#444">layer, in execution order &#8594;</text>')
    # legend, bottom right, clear of the data
    lx = ml + pw - 246
    for j, (label, color, dash) in enumerate((("reference", C_REF, ""), ("candidate", C_CAND, ""),
                                              ("budget", C_BUDGET, "5,4"))):
        x = lx + j * 84
        out.append(f'<line x1="{x}" x2="{x + 18}" y1="{height - 9}" y2="{height - 9}" stroke="{color}" '
                   f'stroke-width="2"' + (f' stroke-dasharray="{dash}"' if dash else "") + "/>"
                   f'<text x="{x + 22}" y="{height - 5}" font-size="10" fill="#333">{label}</text>')
    out.append("</svg>")
    return "".join(out)


LABEL_FONT = 9          # px, the x labels
LABEL_PITCH = 12.0      # px between two vertical labels: the font's line height, so they never touch
LABEL_CHAR = 5.6        # px, a generous average advance of one character at LABEL_FONT (sans-serif)


def _err_text(v: float | None) -> str:
    return "exact (0)" if v == 0 else _fmt_num(v)


def _x_labels(pts: list[dict[str, Any]], X: Any, y0: float, room: float, slot: float,
              culprit: str | None, first_divergent: str | None) -> list[str]:
    """Vertical x labels that never overlap: the culprit and the first divergent layer first, then the
    other failing points (ringed red, they need a name), then the blocks (level 0), then deeper
    layers, each kept only at least LABEL_PITCH from every kept one."""
    import bisect

    order = sorted(range(len(pts)), key=lambda k: (pts[k]["name"] not in (culprit, first_divergent),
                                                   not pts[k]["failed"], pts[k]["level"], k))
    kept_x: list[float] = []
    kept: list[int] = []
    for k in order:
        x = X(k)
        j = bisect.bisect_left(kept_x, x)
        if (j < len(kept_x) and kept_x[j] - x < LABEL_PITCH) or (j and x - kept_x[j - 1] < LABEL_PITCH):
            continue
        kept_x.insert(j, x)
        kept.append(k)
    chars = max(4, int((room - 6) / LABEL_CHAR))
    e = html.escape
    out = []
    for k in sorted(kept):
        name = pts[k]["name"]
        col = C_FAIL if name == culprit else "#444"
        weight = ' font-weight="700"' if name in (culprit, first_divergent) else ""
        out.append(f'<text class="xlabel" transform="translate({X(k) + 3:.1f},{y0 + 5:.1f}) rotate(-90)" '
                   f'font-size="{LABEL_FONT}" text-anchor="end" fill="{col}"{weight}>{e(_short(name, chars))}'
                   f'<title>{e(name)}</title></text>')
    return out


def _short(s: str, n: int) -> str:
    """``s`` in at most ``n`` characters, shortened from the front but keeping its last index, which
    tells a stack's members apart (``…1.self_attn.k_proj``, or ``1.…attn.k_proj`` where that is too
    long)."""
    if len(s) <= n:
        return s
    parts = s.split(".")
    at = max((i for i, p in enumerate(parts) if p.isdigit()), default=None)
    if at is None or len(parts[at]) + 6 > n:
        return "…" + s[-(n - 1):]
    start = at
    while start > 0 and len(".".join(parts[start - 1:])) + 1 <= n:
        start -= 1
    if len(".".join(parts[start:])) + 1 <= n:
        return "…" + ".".join(parts[start:])
    tail = ".".join(parts[at + 1:])
    return f"{parts[at]}.…{tail[-(n - len(parts[at]) - 2):]}"


# ---------------------------------------------------------------------------------------------
# HTML

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;color:#1b1b1b;background:#f4f5f7}
header{background:#1d2733;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px} header p{margin:4px 0 0;color:#c9d3de;font-size:13px}
main{padding:16px 24px;max-width:1240px}
section.check{background:#fff;border:1px solid #dde1e6;border-radius:6px;margin:16px 0;padding:12px 18px}
section.check.fail{border-left:6px solid #c62828} section.check.pass{border-left:6px solid #2e7d32}
section.check.error{border-left:6px solid #6a1b9a}
h2{font-size:17px;margin:4px 0 8px} h3{font-size:14px;margin:14px 0 6px;color:#333}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:700;color:#fff;vertical-align:2px}
.badge.pass{background:#2e7d32} .badge.fail{background:#c62828} .badge.error{background:#6a1b9a} .badge.xfail{background:#8d6e00}
.culprit{color:#c62828;font-weight:700}
table{border-collapse:collapse;font-size:12.5px;margin:4px 0}
th,td{border:1px solid #e1e4e8;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f0f2f5;white-space:nowrap} td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums;font-family:ui-monospace,Menlo,Consolas,monospace}
.scroll{overflow-x:auto;max-width:100%} svg.plot{max-width:100%;height:auto}
tr.fail td{background:#fdecea} tr.culprit-row td{font-weight:700} tr.diff td{background:#fff6d6}
.plots{display:flex;flex-wrap:wrap;gap:12px} .kv td:first-child{color:#555}
.envs td{max-width:420px;word-break:break-word}
td.reason{min-width:360px}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
details summary{cursor:pointer;color:#1f4f8a;margin:6px 0}
.notes{color:#7a4b00} .muted{color:#777}
"""


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>{body}</body></html>\n")


def _anchor(c: Mapping[str, Any], label: str) -> str:
    """A check's section id, from its ``label`` (``check_labels``): unique among the report's checks."""
    from pytest_rocm_parity.golden.store import safe_name

    return "check-" + safe_name(f"{label}-{c.get('dtype', '')}")


def _badge(c: Mapping[str, Any]) -> str:
    v = verdict(c)
    return f'<span class="badge {v.lower()}">{v}</span>'


def _env_table(ref: Mapping[str, Any], cand: Mapping[str, Any]) -> str:
    e = html.escape
    keys = list(ref) + [k for k in cand if k not in ref]

    def show(v: Any) -> str:
        return "" if v is None else _value_text(v)

    rows = []
    for k in keys:
        a, b = show(ref.get(k)), show(cand.get(k))
        # a mapping (the SDPA flags) differs only in its values, not in the order its keys were stored
        same = ref.get(k) == cand.get(k) if isinstance(ref.get(k), dict) else a == b
        cls = ' class="diff"' if not same else ""
        rows.append(f'<tr{cls}><td>{e(str(k))}</td><td>{e(a)}</td><td>{e(b)}</td></tr>')
    return ('<table class="envs"><tr><th></th><th>reference (golden capture)</th><th>candidate (this run)</th></tr>'
            + "".join(rows) + "</table>")


def _profile_flags(prof: Any) -> list[dict[str, Any]]:
    if isinstance(prof, dict):
        prof = prof.get("flags", [])
    return [p for p in prof if isinstance(p, dict)] if isinstance(prof, list) else []


def _profile_table(prof: Any) -> str:
    flags = _profile_flags(prof)
    if not flags:
        return ""
    e = html.escape
    rows = "".join(
        f'<tr class="fail"><td><code>{e(str(p.get("op")))}</code></td><td class="num">{_pct(p.get("ref_share"))}</td>'
        f'<td class="num">{_pct(p.get("cand_share"))}</td><td class="num">{_fmt_num(p.get("growth"))}x</td>'
        f'<td>{e(str(p.get("note", "")))}</td></tr>' for p in flags)
    factor = flags[0].get("factor")
    return (f'<h3>Profiler parity: operators whose share of time grew'
            f'{f" past {_fmt_num(factor)}x" if factor else ""}</h3>'
            '<table><tr><th>operator</th><th>reference share</th><th>candidate share</th><th>growth</th>'
            f'<th>note</th></tr>{rows}</table>')


def _pct(x: Any) -> str:
    v = _num(x)
    return "–" if v is None else f"{100 * v:.1f}%"


def rel_to_ref_legend(run: str) -> str:
    """The one-line key to the ``rel->ref`` column of a layer table; ``run``: whose outputs it compares."""
    return (f"rel->ref = ||cand - ref|| / ||ref||, the candidate's output against the reference's ({run}); "
            "not judged: the verdict measures both against the float64 truth")


def _layer_table(c: Mapping[str, Any]) -> str:
    e = html.escape
    head = ("<tr><th>#</th><th>layer</th><th>lvl</th><th>verdict</th><th>iso ratio</th><th>ratio lo</th>"
            "<th>z</th><th>budget</th><th>prop ratio</th><th>prop budget</th><th>err ref</th><th>err cand</th>"
            "<th>rel-&gt;ref</th><th>reason</th></tr>")
    rows = []
    items = [("", l) for l in (c.get("layers") or [])] + [("out", o) for o in (c.get("outputs") or [])]
    for i, (tag, l) in enumerate(items):
        m = l.get("metrics") or {}
        bad = not (l.get("passed", True) and l.get("prop_passed", True))
        cls = []
        if bad:
            cls.append("fail")
        if l.get("name") == c.get("culprit"):
            cls.append("culprit-row")
        iso_bad, prop_bad = not l.get("iso_passed", l.get("passed", True)), not l.get("prop_passed", True)
        named = "iso" if iso_bad and "iso_ratio" in m else "prop"   # the run the verdict names
        verdict = verdict_label(iso_bad, prop_bad, "iso_ratio" in m, not l.get("passed", True),
                                int(m.get(f"{named}_nonfinite") or 0))
        pre = "iso" if "iso_ratio" in m else "prop"
        rows.append(
            f'<tr class="{" ".join(cls)}"><td class="num">{i}</td><td><code>{e(str(l.get("name", "")))}</code></td>'
            f'<td class="num">{e(str(m.get("level", "")))}</td><td>{verdict}</td>'
            f'<td class="num">{_fmt_num(m.get("iso_ratio"))}</td><td class="num">{_fmt_num(m.get("iso_ratio_lo"))}</td>'
            f'<td class="num">{_fmt_num(m.get("iso_z"))}</td>'
            f'<td class="num">{_fmt_num(m.get("budget_ratio") if "iso_ratio" in m else None)}</td>'
            f'<td class="num">{_fmt_num(m.get("prop_ratio"))}</td><td class="num">{_fmt_num(m.get("budget_propagated"))}</td>'
            f'<td class="num">{_fmt_num(m.get(pre + "_err_ref"))}</td><td class="num">{_fmt_num(m.get(pre + "_err_cand"))}</td>'
            f'<td class="num">{_fmt_num(m.get(pre + "_rel_to_ref"))}</td>'
            f'<td class="reason">{e(str(m.get("reason", "") or m.get(pre + "_note", "")))}</td></tr>')
    if not rows:
        return ""
    # failing as in checks.csv and layers.csv (the verdict); a row that passed with its propagated
    # error over budget (drift from an earlier layer) is counted apart, as the terminal lists it
    n_bad = sum(1 for _, l in items if not l.get("passed", True))
    n_drift = sum(1 for _, l in items if l.get("passed", True) and not l.get("prop_passed", True))
    drift = f", {n_drift} with drift propagated" if n_drift else ""
    opened = " open" if len(rows) <= 40 or n_bad or n_drift else ""
    return (f"<details{opened}><summary>All {len(rows)} layers and outputs ({n_bad} failing{drift})</summary>"
            f"<div class=\"scroll\"><table>{head}{''.join(rows)}</table></div>"
            f'<p class="muted legend">{e(rel_to_ref_legend(REL_TO_REF_RUN_HTML))}</p></details>')


# the run whose outputs the HTML layer table's err ref, err cand and rel->ref columns measure
REL_TO_REF_RUN_HTML = "isolated run; propagated where a row has no isolated run"


# one row per LM metric: (label, key or keys of the candidate / reference / truth columns, how to format)
LM_ROWS: tuple[tuple[str, tuple[str, str, str], str], ...] = (
    ("perplexity", ("ppl", "ppl_ref", "ppl_truth"), "ppl"),
    ("perplexity, relative change", ("ppl_rel_delta_truth", "ppl_ref_rel_delta_truth", ""), "signed"),
    ("log-perplexity error against the truth", ("log_ppl_err", "log_ppl_err_ref", ""), "signed"),
    ("top-1 agreement with the reference", ("top1_agreement", "", ""), "num"),
    ("top-1 flips (near ties included)", ("flips", "", ""), "int"),
    ("confident flips", ("confident_flips", "", ""), "int"),
    ("near-tie margin (logits)", ("near_tie_margin", "", ""), "num"),
    ("KL(reference || candidate) mean", ("kl_mean", "", ""), "num"),
    ("KL(reference || candidate) max", ("kl_max", "", ""), "num"),
    ("KL(truth || ·) mean", ("kl_truth_cand_mean", "kl_truth_ref_mean", ""), "num"),
)
LM_KNOWN = {k for _, keys, _ in LM_ROWS for k in keys if k} | {
    "ppl_rel_delta", "log_ppl_budget", "positions", "logit_noise_rms", "generation", "first_confident_disagreement"}


def _value_text(v: Any) -> str:
    """A metric value in words and numbers: no Python reprs (None, lists, dicts) reach the page."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if _num(v) is not None:
        return _fmt_num(v)
    if isinstance(v, dict):   # sorted: two environments' flags read side by side in one order
        return "; ".join(f"{k} {_value_text(x)}" for k, x in sorted(v.items(), key=lambda kv: str(kv[0])))
    if isinstance(v, (list, tuple)):
        return ", ".join(_value_text(x) for x in v) or "–"
    return str(v)


def _signed(v: Any) -> str:
    x = _num(v)
    return "–" if x is None else (f"{x:+.2e}" if x else "0")


def _lm_table(lm: Mapping[str, Any]) -> str:
    """The LM metrics as a table: metric, candidate, reference, truth; then generation and first flip."""
    from pytest_rocm_parity.judging.assertion import steps_text

    e = html.escape

    def cell(key: str, how: str) -> str:
        if not key or key not in lm:
            return '<td class="num muted">–</td>' if key else "<td></td>"
        v = lm[key]
        x = _num(v)
        if how == "signed":
            text = _signed(v)
        elif how == "int" and x is not None:
            text = str(int(v))
        elif how == "ppl" and x is not None:
            text = f"{x:.8g}"   # perplexities that differ in the fifth digit must not print alike
        else:
            text = _value_text(v)
        return f'<td class="num">{e(text)}</td>'

    rows = []
    for label, keys, how in LM_ROWS:
        if keys[0] in lm:
            rows.append(f"<tr><td>{e(label)}</td>" + "".join(cell(k, how) for k in keys) + "</tr>")
    for key in sorted(k for k in lm if k.startswith("top") and k.endswith("_containment")):
        rows.append(f"<tr><td>{e(key[:-len('_containment')])} containment</td>{cell(key, 'num')}<td></td><td></td></tr>")
    if "log_ppl_budget" in lm:
        rows.append(f"<tr><td>log-perplexity budget</td>{cell('log_ppl_budget', 'num')}<td></td><td></td></tr>")
    for key in sorted(k for k in lm if k not in LM_KNOWN and not k.endswith("_containment")):
        rows.append(f"<tr><td>{e(key.replace('_', ' '))}</td><td class=\"num\">{e(_value_text(lm[key]))}</td>"
                    "<td></td><td></td></tr>")
    parts = ['<h3>Language-model metrics</h3><div class="scroll"><table class="lm"><tr><th>metric</th>'
             '<th>candidate</th><th>reference</th><th>truth</th></tr>' + "".join(rows) + "</table></div>"]
    gen = lm.get("generation")
    if isinstance(gen, Mapping) and gen:
        labels = (("steps", "greedy steps"), ("first_divergent_step", "first divergent step"),
                  ("exact_match_rows", "sequences that match exactly"),
                  ("confident_divergences", "confident divergences"),
                  ("teacher_forced_agreement", "teacher-forced agreement"),
                  ("teacher_forced_confident_flips", "teacher-forced confident flips"))
        grows = []
        for key, label in labels:
            if key in gen:
                v = steps_text(gen[key]) if key == "first_divergent_step" else _value_text(gen[key])
                grows.append(f'<tr><td>{e(label)}</td><td class="num">{e(v)}</td></tr>')
        grows += [f'<tr><td>{e(str(k).replace("_", " "))}</td><td class="num">{e(_value_text(v))}</td></tr>'
                  for k, v in gen.items() if k not in dict(labels)]
        parts.append('<h3>Greedy generation</h3><table class="kv lm-gen">' + "".join(grows) + "</table>")
    first = lm.get("first_confident_disagreement")
    if isinstance(first, Mapping) and first:
        parts.append(
            '<p class="notes">First confident top-1 disagreement: sequence '
            f'{e(_value_text(first.get("batch")))}, position {e(_value_text(first.get("position")))}, token '
            f'{e(_value_text(first.get("ref_token")))} (reference) against {e(_value_text(first.get("cand_token")))} '
            f'(candidate), reference margin {e(_value_text(first.get("ref_margin")))}; first layer beyond its budget '
            f'there: <code>{e(str(first.get("layer") or "none"))}</code></p>')
    return "".join(parts)


def _extra_table(extra: Mapping[str, Any]) -> str:
    e = html.escape
    parts = []
    rows = []
    for k, v in extra.items():
        if k in ("profile", "failing_tensors") or k.startswith("_"):
            continue
        if k == "lm" and isinstance(v, Mapping):
            parts.append(_lm_table(v))
            continue
        rows.append(f"<tr><td>{e(str(k))}</td><td>{e(_value_text(v))}</td></tr>")
    if rows:
        parts.append(f'<h3>Extra</h3><table class="kv">{"".join(rows)}</table>')
    return "".join(parts)


def _tensor_link(c: Mapping[str, Any], out: Path) -> str:
    rel = (c.get("extra") or {}).get("failing_tensors")   # set where this run saved them
    path = out / rel if rel else None
    if path is None or not path.is_file():
        return ""
    rel = path.relative_to(out).as_posix()
    size = path.stat().st_size
    return (f'<p>Obtained tensors of the failing layers: <a class="tensors" href="{html.escape(rel)}" download>'
            f'{html.escape(rel)}</a> <span class="muted">({megabytes(size)}, safetensors; '
            f'<code>safetensors.torch.load_file(path)</code>)</span></p>')


def _error_section(c: Mapping[str, Any], label: str) -> str:
    """A check that reached no verdict: what kept it from one, and which golden."""
    e = html.escape
    err = c.get("error") or {}
    kv = [("test", f'<code>{e(str(c.get("test", "")))}</code>'), ("error", e(str(err.get("kind", "")))),
          ("why", e(error_text(c))), ("golden", f'<code>{e(str(c.get("golden", "")))}</code>')]
    return (f'<section class="check error" id="{_anchor(c, label)}"><h2>{_badge(c)} {e(label)} '
            f'<span class="muted">[{e(str(c.get("dtype", "")))}]</span></h2><table class="kv">'
            + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in kv) + "</table></section>")


def _check_section(c: Mapping[str, Any], label: str, out: Path) -> str:
    """One check's section; ``label``: its name as the summary shows it (``check_labels``)."""
    if c.get("error"):
        return _error_section(c, label)
    e = html.escape
    passed = bool(c.get("passed"))
    culprit, first = c.get("culprit"), c.get("first_divergent")
    layers = list((c.get("layers") or []))
    by_name = {l.get("name"): l for l in layers}
    parts = [f'<section class="check {"pass" if passed else "fail"}" id="{_anchor(c, label)}">',
             f'<h2>{_badge(c)} {e(label)} <span class="muted">[{e(str(c.get("dtype", "")))}]'
             f'</span></h2>']
    kv = [("test", f'<code>{e(str(c.get("test", "")))}</code>'), ("kind", e(str(c.get("kind", ""))))]
    if c.get("expected") in EXPECTED:
        kv.append(("expected", e(EXPECTED[c["expected"]])))
    if culprit:
        reason = (by_name.get(culprit, {}).get("metrics") or {}).get("reason", "")
        cm = by_name.get(culprit, {}).get("metrics") or {}
        wp = cm.get("would_pass_ratio")
        if _num(wp) is None or _num(cm.get("budget_ratio")) is None or wp > SUGGEST_WITHIN * cm["budget_ratio"]:
            wp = None   # a tolerance is suggested only as a modest widening (assertion.tolerance_hint)
        kv.append(("culprit", f'<span class="culprit">{e(str(culprit))}</span>'
                   + (f' (block <code>{e(str(c.get("culprit_block")))}</code>)' if c.get("culprit_block") else "")
                   + (f"<br>{e(str(reason))}" if reason else "")
                   + (f'<br><span class="muted">would pass with {e(ratio_tolerance(str(c.get("dtype", "")), wp))}</span>'
                      if wp else "")))
    elif not passed and isinstance((c.get("extra") or {}).get("unselected_region"), dict):
        from pytest_rocm_parity.runner.selection import region_text

        kv.append(("culprit", f'none among the selected modules; {e(region_text(c["extra"]["unselected_region"]))}'))
    elif not passed:
        kv.append(("culprit", '<span class="muted">none in isolation</span>'))
    if first:
        kv.append(("first divergent", f"<code>{e(str(first))}</code>"))
    kv.append(("golden", f'<code>{e(str(c.get("golden", "")))}</code>'))
    parts.append('<table class="kv">' + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in kv) + "</table>")
    for note in c.get("notes", []):
        parts.append(f'<p class="notes">{e(str(note))}</p>')
    parts.append(_tensor_link(c, out))
    # outputs are plotted at the end of the propagated panel
    prop_layers = layers + [{**o, "metrics": {**(o.get("metrics") or {}), "level": 0}} for o in (c.get("outputs") or [])]
    parts.append('<div class="plots">'
                 + svg_plot(layers, "iso", culprit, first, "Isolated (each layer fed the golden inputs)")
                 + svg_plot(prop_layers, "prop", culprit, first, "Propagated (whole model on the candidate)")
                 + "</div>")
    parts.append(_profile_table((c.get("extra") or {}).get("profile")))
    parts.append(_extra_table(c.get("extra") or {}))
    parts.append("<h3>Environments</h3>" + '<div class="scroll">' + _env_table(c.get("reference_env") or {}, c.get("candidate_env") or {}) + "</div>")
    parts.append("<h3>Layers</h3>" + _layer_table(c))
    parts.append("</section>")
    return "".join(parts)


def render_html(doc: Mapping[str, Any], out_dir: str | os.PathLike[str] = ".") -> str:
    """The whole report page as a string (``out_dir`` is only used to find saved tensors)."""
    e = html.escape
    out = Path(out_dir)
    checks = list(doc.get("checks", []))
    n = counts(checks)
    n_err, n_fail = n["ERROR"], n["FAIL"]
    order = ordered_checks(checks)
    summary_rows = []
    for label, c in order:
        prof = _profile_flags((c.get("extra") or {}).get("profile"))
        culprit_cell = (f'<td colspan="2">{e(error_text(c))}</td>' if c.get("error") else
                        f'<td class="culprit">{e(str(c.get("culprit") or ""))}</td>'
                        f'<td>{e(str(c.get("first_divergent") or ""))}</td>')
        summary_rows.append(
            f'<tr class="{"" if c.get("passed") else "fail"}"><td>{_badge(c)}</td>'
            f'<td><a href="#{_anchor(c, label)}">{e(label)}</a></td><td>{e(str(c.get("dtype", "")))}</td>'
            + culprit_cell +
            f'<td>{e(", ".join(str(p.get("op")) for p in prof))}</td>'
            f'<td>{e(_env_brief(c.get("reference_env") or {}))}</td><td>{e(_env_brief(c.get("candidate_env") or {}))}</td></tr>')
    g = doc.get("goldens") or {}
    glines = []
    for key in ("created", "updated", "missing", "corrupt", "stale", "foreign", "kept", "obsolete", "unchecked",
                "pruned"):
        items = g.get(key) or []
        label = "of another project" if key == "foreign" else key
        if items:
            glines.append(f"<tr><td>{label}</td><td>{e(', '.join(map(str, items)))}</td></tr>")
    for w in g.get("withheld") or []:
        glines.append(f"<tr><td>not {'updated' if w.get('existed') else 'created'}</td>"
                      f"<td>{e(str(w.get('name')))}: {e(str(w.get('reason')))}</td></tr>")
    errors = (f", {n['XFAIL']} failing as {'their tests' if n['XFAIL'] > 1 else 'its test'} expected"
              if n["XFAIL"] else "") + (f", {n_err} error{'' if n_err == 1 else 's'}" if n_err else "")
    capture = doc.get("mode") == "capture"
    title = "rocm-parity report" + (" (capture run)" if capture else "")
    body = [f'<header><h1>{e(title)}</h1><p>{len(checks)} checks, {n_fail} failing{errors} · '
            f'schema {e(str(doc.get("schema", "")))} · tables: <a style="color:#9cd" href="{CHECKS_CSV}">{CHECKS_CSV}</a>, '
            f'<a style="color:#9cd" href="{LAYERS_CSV}">{LAYERS_CSV}</a>, '
            f'<a style="color:#9cd" href="parity-report.json">parity-report.json</a></p></header><main>']
    if doc.get("incomplete"):
        body.append(f'<p class="incomplete"><b>{e(str(doc["incomplete"]))}</b></p>')
    if checks:
        body.append('<div class="scroll"><table class="summary"><tr><th>verdict</th><th>check</th><th>dtype</th><th>culprit</th>'
                    '<th>first divergent</th><th>profile flags</th><th>reference</th><th>candidate</th></tr>'
                    + "".join(summary_rows) + "</table></div>")
    elif capture:
        body.append('<p class="muted">A capture run writes goldens and judges no check: the goldens it wrote and '
                    'kept are below. Replay (without --parity-mode=capture) for verdicts.</p>')
    else:
        body.append('<p class="muted">No parity check ran in this session.</p>')
    if glines:
        body.append('<h3>Goldens</h3><table class="kv">' + "".join(glines) + "</table>")
    body += [_check_section(c, label, out) for label, c in order]
    body.append("</main>")
    said = ", ".join(x for x in (f"{n_fail} failing" if n_fail else "", errors.lstrip(", ")) if x)
    return _page(title + (f" — {said}" if said else ""), "".join(body))


def _write_html(doc: Mapping[str, Any], out: Path) -> Path:
    return atomic_write(out / HTML_NAME, render_html(doc, out))


# JSON has no NaN nor Infinity (JSON.parse refuses Python's bare NaN): a non-finite number is written
# as one of these strings, which float() reads back, and read back as the number
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def report_json(doc: Any) -> str:
    """``doc`` as strict JSON (every parser reads it), non-finite numbers as NONFINITE's strings."""
    import json

    def strict(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return "NaN" if math.isnan(x) else "Infinity" if x > 0 else "-Infinity"
        if isinstance(x, dict):
            return {k: strict(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [strict(v) for v in x]
        return x
    return json.dumps(strict(doc), indent=1, default=str, allow_nan=False)


def read_report_json(text: str) -> Any:
    """A parity-report.json's document, its non-finite numbers (report_json) numbers again."""
    import json

    def numbers(x: Any) -> Any:
        if isinstance(x, str):
            return NONFINITE.get(x, x)
        if isinstance(x, dict):
            return {k: numbers(v) for k, v in x.items()}
        if isinstance(x, list):
            return [numbers(v) for v in x]
        return x
    return numbers(json.loads(text))


def _report_document(path: Path) -> Any:
    """The parity-report.json at ``path``, or in the --parity-report folder ``path``."""
    import json

    from pytest_rocm_parity.errors import InvalidArgument

    f = path / "parity-report.json" if path.is_dir() else path
    try:
        return read_report_json(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidArgument(f"{f}: no such file; name a --parity-report folder or the parity-report.json in "
                              f"it") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument(f"{f}: not a parity report ({exc}); name the parity-report.json a run with "
                              f"--parity-report wrote") from None


def layer_frame(report: Any) -> Any:
    """A DataFrame of layers: of one ``CheckResult`` (its :meth:`~CheckResult.to_frame`), or of every
    check in a ``parity-report.json`` (its path or loaded document; the columns of ``layers.csv``)."""
    to_frame = getattr(report, "to_frame", None)
    if callable(to_frame):
        result: Any = to_frame()
        return result
    if isinstance(report, (str, os.PathLike)):
        report = _report_document(Path(report))
    return layers_frame(layer_rows(report))
