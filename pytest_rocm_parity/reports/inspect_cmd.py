"""``rocm-parity show GOLDEN`` and ``rocm-parity diff A B``: look inside goldens without pytest.

show: the manifest (name, format, fingerprint, reference environment, dtypes,
creation time) and, per dtype rung, one row per recorded layer output leaf:
shape, dtype, bytes, RMS of the reference output and the reference's own
error against its float64 truth, ``max|ref - truth| / max|truth|``.

diff: two goldens of the same model (say captured under two CUDA versions),
layer by layer and leaf by leaf: the relative L2 distance of the two reference
outputs and each one's error against its own truth.  A leaf differs when one
error exceeds the other by more than ``--error-ratio``, when the two float64
truths of the whole model differ by more than TRUTHS_FACTOR times the goldens'
own errors (the references compute different functions), or when the relative
L2 exceeds ``--threshold`` (by default only where the goldens hold no truths to
judge by); the command exits 1 when any leaf differs (0 otherwise, 2 on an
unreadable golden).

Both read the safetensors files through the same validation as replay (no
pickle is ever loaded) and print JSON with ``--json``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from pytest_rocm_parity.colour import enabled, paint
from pytest_rocm_parity.errors import GoldenCorrupt, ParityError
from pytest_rocm_parity.judging.tolerance import FLOOR_ULPS
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import (MANIFEST, check_safetensors, check_size, expected_digest, load_manifest,
                                              verify_sha)
from pytest_rocm_parity.runner.selection import describe
from pytest_rocm_parity.progress import megabytes
from pytest_rocm_parity.tables import text_table

OUTPUT = "<output>"
# applied only to a leaf without a float64 truth in both goldens, unless --threshold is given: the
# truths judge the rest at any dtype (docs/reports.md)
DEFAULT_THRESHOLD = 1e-3
# The goldens' float64 truths of the whole model differ by more than TRUTHS_FACTOR times the larger
# of their own errors, or of TRUTHS_FLOOR: the references compute different functions. The floor is
# the float32 steps a model writes into its own code (a rotary table, a norm's variance), which its
# float64 truth keeps: between correct backends the truths differ by up to 2.4e-7 of their RMS at
# float32 and 2e-5 at bf16, where the errors are 1e-2 (docs/reports.md has the command).
TRUTHS_FACTOR = 4.0
TRUTHS_FLOOR = 1e-6
ENV_KEYS = ("backend", "device_name", "arch", "torch", "cuda", "hip", "tf32_matmul", "tf32_cudnn",
            "float32_matmul_precision", "blas_library", "deterministic", "python", "platform")


class GoldenNotFound(ParityError):
    pass


# ---------------------------------------------------------------------------------------------
# loading

def resolve_golden(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(golden directory, manifest) from a golden directory or its manifest.json."""
    p = Path(path)
    m = p / MANIFEST if p.is_dir() else p
    if m.is_file() and m.name != MANIFEST and m.suffix == ".safetensors":
        raise GoldenNotFound(f"{path}: a golden's tensor file, not the golden; name its directory ({p.parent}) or "
                             f"its {MANIFEST}")
    if not m.is_file():
        hint = " (a golden directory holds manifest.json)" if p.is_dir() else ""
        inside = sorted(d.name for d in p.iterdir() if (d / MANIFEST).is_file()) if p.is_dir() else []
        if inside:   # the --parity-golden-dir folder, not one golden in it
            listed = ", ".join(inside[:8]) + (f" and {len(inside) - 8} more" if len(inside) > 8 else "")
            hint = f"; it is a folder of goldens: name one of them, e.g. {p / inside[0]} ({listed})"
        if not p.exists():
            named = _golden_named(p)
            if named is not None:
                return named
            raise GoldenNotFound(f"{path}: no such file or directory; name a golden's directory (GOLDEN_DIR/NAME) "
                                 f"or its manifest.json")
        raise GoldenNotFound(f"{path}: no golden here{hint}")
    if m.name != MANIFEST:
        # any other file (pyproject.toml, a report) is read as a manifest only if it is one; its JSON
        # error would otherwise say "recapture this golden" of a file that never was one
        try:
            return m.parent, load_manifest(m)
        except GoldenCorrupt:
            raise GoldenNotFound(f"{path}: not a golden directory or manifest (a file that does not read as a "
                                 f"golden's {MANIFEST}); name a golden's directory (GOLDEN_DIR/NAME) or its "
                                 f"{MANIFEST}") from None
    return m.parent, load_manifest(m)


def _golden_named(p: Path) -> tuple[Path, dict[str, Any]] | None:
    """The golden whose check name is ``p`` taken as GOLDEN_DIR/NAME (``goldens/test_mlp.py::test_mlp``:
    NAME is the check name, its directory ``test_mlp.py_test_mlp-<hash>``); None when the nearest existing
    folder above ``p`` holds no goldens. GoldenNotFound, listing the names it holds, when it holds others."""
    from pytest_rocm_parity.golden.store import GoldenStore

    folder = next((a for a in p.parents if a.is_dir()), None)
    if folder is None:
        return None
    name = p.relative_to(folder).as_posix()
    store = GoldenStore(folder)
    on_disk = list(store.names_on_disk())
    if not on_disk:
        return None
    hits = [d for n, d in on_disk if n == name] or [d for d in (store.dir_for(name),) if (d / MANIFEST).is_file()]
    if hits:
        return hits[0], load_manifest(hits[0] / MANIFEST)
    names = sorted(n for n, _ in on_disk)
    dirs = dict(on_disk)
    close = store.close_names(name, n=1)
    near = f" Did you mean {close[0]!r}: rocm-parity show {folder / dirs[close[0]].name}?" if close else ""
    listed = ", ".join(repr(n) for n in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    raise GoldenNotFound(f"{p}: no such file or directory, and no golden in {folder} has the check name {name!r} "
                         f"(it holds {listed}); name a golden's directory (GOLDEN_DIR/NAME) or its {MANIFEST}.{near}")


def _rung_path(d: Path, manifest: dict[str, Any], rung: str) -> Path:
    fname = str(manifest["rungs"][rung].get("file", ""))
    if not fname or "/" in fname or "\\" in fname or fname.startswith("."):
        raise GoldenNotFound(f"{d / MANIFEST}: bad tensor file name {fname!r} for the {rung} rung")
    p = d / fname
    if not p.is_file():
        raise GoldenNotFound(f"{p}: tensor file of the {rung} rung is missing")
    meta = manifest["rungs"][rung]
    check_size(p, meta)
    expected = expected_digest(meta)
    if expected is not None:
        verify_sha(p, expected)
    return p


def _leaves(meta: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(layer key, leaf, reference tensor key, truth tensor key) for every recorded output leaf."""
    out = []
    for e in meta.get("layers", []):
        for leaf, tk in (e.get("out") or {}).items():
            out.append((e.get("key", e.get("name", "")), leaf, tk, f"truth/{e.get('key', e.get('name', ''))}/{leaf}"))
    for leaf, tk in ((meta.get("outputs") or {}).get("out") or {}).items():
        out.append((OUTPUT, leaf, tk, f"gtruth/{OUTPUT}/{leaf}"))
    return out


def _truth(reader: Any, meta: dict[str, Any], key: str, ref: Any) -> Any | None:
    """The float64 truth of one leaf, or None when the golden holds none for it.

    Goldens store the truth as its residual from the reference (``truth_encoding: residual``,
    docs/golden-format.md); older ones stored it whole.
    """
    import torch

    if key not in reader.keys or not (ref.is_floating_point() or ref.is_complex()):
        return None
    t = reader.get(key)
    if meta.get("truth_encoding") == "residual":
        return ref.to(torch.float64) + t.to(torch.float64)
    return t


def _stats(ref: Any, truth: Any | None) -> dict[str, Any]:
    import torch

    r = ref.detach().to("cpu")
    if r.is_complex():
        r = torch.view_as_real(r)
    if not (r.is_floating_point()):
        return {"rms": None, "max_rel_err": None}
    r = r.to(torch.float64).reshape(-1)
    fin = torch.isfinite(r)
    rms = float(r[fin].square().mean().sqrt()) if int(fin.sum()) else math.nan
    if truth is None:
        return {"rms": rms, "max_rel_err": None}
    t = truth.detach().to("cpu")
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.to(torch.float64).reshape(-1)
    if t.shape != r.shape:
        return {"rms": rms, "max_rel_err": None}
    ok = fin & torch.isfinite(t)
    if not int(ok.sum()):
        return {"rms": rms, "max_rel_err": None}
    scale = float(t[ok].abs().max())
    diff = float((r[ok] - t[ok]).abs().max())
    return {"rms": rms, "max_rel_err": diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)}


# ---------------------------------------------------------------------------------------------
# show

def add_show_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("golden", metavar="GOLDEN", help="a golden directory or its manifest.json")
    p.add_argument("--dtype", action="append", default=None, metavar="DTYPE",
                   help="only this rung (repeatable; default: every rung in the golden)")
    p.add_argument("--no-stats", action="store_true",
                   help="do not read tensor data (shapes, dtypes and bytes come from the file header)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


# what a golden whose manifest and tensors disagree raises inside torch or the stdlib; show and diff turn it
# into GoldenCorrupt naming the golden, so only the plugin's own errors leave them
_INCONSISTENT = (RuntimeError, TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError,
                 ZeroDivisionError, RecursionError, UnicodeError)


def _inconsistent(path: Any, exc: BaseException) -> GoldenCorrupt:
    return GoldenCorrupt(
        f"{path}: the golden's manifest and tensor files disagree or are malformed, so it cannot be read "
        f"({type(exc).__name__}: {str(exc)[:300]}). It was written by another version or damaged: recapture it "
        f"on the reference machine (pytest --rocm-parity --parity-mode=capture --parity-regen=NAME).", path)


def show_golden(path: str | Path, dtypes: list[str] | None = None, stats: bool = True,
                each_rung: bool = False) -> dict[str, Any]:
    """Everything ``show`` prints, as a JSON-able dict; an unreadable golden raises GoldenError.
    ``each_rung``: a rung that cannot be read is shown with its error beside the readable ones (a
    damaged float32 file says nothing about the bf16 one beside it, nor about the manifest)."""
    try:
        return _show_golden(path, dtypes, stats, each_rung)
    except ParityError:
        raise
    except _INCONSISTENT as exc:
        raise _inconsistent(path, exc) from None


def _rung_names(dtypes: list[str] | None) -> list[str] | None:
    """--dtype values as the goldens name their rungs ('bf16' -> 'bfloat16'); an unknown name as given,
    for the 'no such rung' message that lists what the golden holds."""
    from pytest_rocm_parity.judging.dtypes import canonical_name

    def canon(x: str) -> str:
        try:
            return canonical_name(x)
        except ParityError:
            return x
    return [canon(x) for x in dtypes] if dtypes else dtypes


def _show_golden(path: str | Path, dtypes: list[str] | None, stats: bool, each_rung: bool) -> dict[str, Any]:
    dtypes = _rung_names(dtypes)
    d, m = resolve_golden(path)
    rungs = [r for r in m.get("rungs", {}) if not dtypes or r in dtypes]
    if dtypes:
        missing = [x for x in dtypes if x not in m.get("rungs", {})]
        if missing:
            raise GoldenNotFound(f"{d}: no {', '.join(missing)} rung (it holds {', '.join(m.get('rungs', {}))})")
    info = _manifest_info(d, m)
    for rung in rungs:
        try:
            info["rungs"][rung] = _show_rung(d, m, rung, stats)
        except (ParityError, *_INCONSISTENT) as exc:
            if not each_rung:
                raise
            err = exc if isinstance(exc, ParityError) else _inconsistent(path, exc)
            info["rungs"][rung] = {"file": str(m["rungs"][rung].get("file", "")),
                                   "error": f"{type(err).__name__}: {err}"}
    return info


def _manifest_info(d: Path, m: dict[str, Any]) -> dict[str, Any]:
    """What show prints of the manifest itself, the rungs left empty."""
    return {
        "path": str(d), "name": m.get("name"), "format": m.get("format"), "test": m.get("test"),
        "model_class": m.get("model_class"), "tool_version": m.get("tool_version"), "created": m.get("created"),
        "fingerprint": m.get("fingerprint", {}), "dtypes": m.get("dtypes", list(m.get("rungs", {}))),
        "seed": m.get("seed"), "drill": m.get("drill"), "layer_patterns": m.get("layer_patterns"),
        "n_layers": len(m.get("layers", [])), "reference_env": m.get("reference_env", {}), "rungs": {},
        "kind": m.get("kind", "forward"), "steps": m.get("steps"), "optimizer": m.get("optimizer"),
        # what the golden selects, per nesting level, a stack's members folded (selection.describe)
        "selects": [{"level": lv, "modules": n, "names": names} for lv, n, names in describe(m.get("layers", []))],
    }


def _show_rung(d: Path, m: dict[str, Any], rung: str, stats: bool) -> dict[str, Any]:
    """One rung's rows for show: its file's header, each recorded leaf and, with ``stats``, its numbers."""
    meta = m["rungs"][rung]
    fpath = _rung_path(d, m, rung)
    header = check_safetensors(fpath)
    reader = RungReader(fpath, "cpu") if stats else None
    rows = []
    for key, leaf, tk, truth_key in _leaves(meta):
        if tk not in header:
            raise GoldenCorrupt(f"{fpath}: manifest names tensor {tk!r} that the file lacks (manifest and "
                                f"tensors do not match); recapture this golden", fpath)
        h = header[tk]
        start, end = h.get("data_offsets", (0, 0))
        row: dict[str, Any] = {"layer": key, "leaf": leaf, "shape": h.get("shape"), "dtype": h.get("dtype"),
                               "bytes": int(end) - int(start)}
        if reader is not None and tk in reader.keys:
            ref = reader.get(tk)
            row.update(_stats(ref, _truth(reader, meta, truth_key, ref)))
        rows.append(row)
    return {"file": fpath.name, "bytes": meta.get("bytes", fpath.stat().st_size),
            "sha256": meta.get("sha256"), "truth_dtype": meta.get("truth_dtype"),
            "truth_encoding": meta.get("truth_encoding"),
            "tf32": meta.get("tf32"), "tensors": len([k for k in header if k != "__metadata__"]),
            "updates": sum(1 for k in header if k.startswith("upd/")),
            "layers": rows, "quant": _quant_summary(meta)}


def _quant_summary(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A quantized model's modules by (format, activation scheme), and the largest activation-
    quantization noise recorded (docs/fp8.md); None for a model without quantized storage."""
    quant = meta.get("quant") or {}
    if not quant:
        return None
    schemes: dict[str, int] = {}
    for q in quant.values():
        k = f"{q.get('format')} activation={q.get('activation') or 'none (weight-only)'}"
        schemes[k] = schemes.get(k, 0) + 1
    noise = meta.get("quant_noise") or {}
    return {"modules": len(quant), "schemes": schemes, "stored": any(q.get("tensors") for q in quant.values()),
            "noise_max": max(noise.values()) if noise else None, "noise_tensors": len(noise)}


def _fmt(x: Any, spec: str = ".3e") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        return format(x, spec)
    return str(x)


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    return text_table(rows, headers, right=right, rule=True)


def _bytes(n: Any) -> str:
    """A size as capture's progress lines and the size limit say it (decimal KB and MB)."""
    return megabytes(int(n or 0))


def _txt(v: Any) -> str:
    """A manifest value as text: '-' for none, yes/no, lists joined; never a Python repr."""
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        return ", ".join(_txt(x) for x in v) or "-"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_txt(x)}" for k, x in v.items()) or "-"
    return str(v)


def format_show(info: dict[str, Any]) -> list[str]:
    fp = info.get("fingerprint") or {}
    env = info.get("reference_env") or {}
    lines = [f"golden    {info['name']}  ({info['path']})",
             f"format    {_txt(info['format'])}  (written by pytest-rocm-parity {_txt(info.get('tool_version'))})",
             f"created   {_txt(info.get('created'))}",
             f"test      {info.get('test') or '-'}",
             f"model     {_txt(info.get('model_class'))}  fingerprint structure={_txt(fp.get('structure'))} "
             f"weights={_txt(fp.get('weights'))}",
             f"dtypes    {', '.join(info.get('dtypes') or [])}",
             *([f"kind      training step ({_txt(info.get('steps'))} step(s), optimizer "
                f"{_txt(info.get('optimizer'))}): each row is a module call's output gradient"]
               if info.get("kind") == "train" else []),
             f"layers    {info['n_layers']} selected (drill {_txt(info.get('drill'))}"
             + (f", patterns {_txt(info['layer_patterns'])}" if info.get("layer_patterns") else "") + ")",
             *[f"{'selects' if i == 0 else '':<9} level {x['level']} ({x['modules']}): {', '.join(x['names'])}"
               for i, x in enumerate(info.get("selects") or [])],
             "reference " + "  ".join(f"{k}={_txt(env[k])}" for k in ENV_KEYS if env.get(k) not in (None, ""))]
    for rung, r in info["rungs"].items():
        if r.get("error"):
            lines += ["", f"[{rung}] {r['file']}  UNREADABLE: {r['error']}"]
            continue
        lines += ["", f"[{rung}] {r['file']}  {_bytes(r['bytes'])}  {r['tensors']} tensors  {_truth_text(r)}"
                  f"  tf32 {_txt(r.get('tf32'))}"]
        if r.get("updates"):
            lines.append(f"  parameter updates after {_txt(info.get('steps'))} step(s): {r['updates']} tensors "
                         f"(upd/<parameter>), kept for inspection, not judged (docs/training.md)")
        q = r.get("quant")
        if q:
            lines.append(f"  quantized: {q['modules']} modules ("
                         + "; ".join(f"{n} x {k}" for k, n in q["schemes"].items())
                         + f"), codes and scales {'stored' if q['stored'] else 'not stored (a sketch)'}; "
                         + (f"activation-quantization noise recorded for {q['noise_tensors']} tensors "
                            f"(largest RMS {_fmt(q['noise_max'])})" if q["noise_tensors"] else "no activation quantization"))
        rows = [[x["layer"] + ("" if x["leaf"] in ("", "0") else f" [{x['leaf']}]"),
                 "x".join(map(str, x["shape"] or [])) or "()", str(x["dtype"]), _bytes(x["bytes"]),
                 _fmt(x.get("rms")), _fmt(x.get("max_rel_err"))] for x in r["layers"]]
        lines += ["  " + s for s in _table(["layer", "shape", "dtype", "bytes", "rms(ref)", "max|ref-truth|/max|truth|"],
                                           rows, {3, 4, 5})]
    return lines


def run_show(args: argparse.Namespace) -> int:
    info = show_golden(args.golden, args.dtype, stats=not args.no_stats, each_rung=True)
    if args.json:
        print(json.dumps(info, indent=1, default=str))
    else:
        print("\n".join(format_show(info)), flush=True)
    # an unreadable rung is shown beside the readable ones, and the exit code of an unreadable golden
    return 2 if any(r.get("error") for r in info["rungs"].values()) else 0


# ---------------------------------------------------------------------------------------------
# diff

def add_diff_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="first golden (directory or manifest.json), e.g. captured under CUDA 12.1")
    p.add_argument("b", metavar="B", help="second golden, e.g. the same model captured under CUDA 12.4")
    p.add_argument("--dtype", action="append", default=None, metavar="DTYPE",
                   help="only this rung (repeatable; default: every rung both goldens hold)")
    p.add_argument("--threshold", type=float, default=None, metavar="REL",
                   help="a leaf differs when ||A-B||/||B|| exceeds REL (default: only for a leaf without a "
                        f"float64 truth in both goldens, {DEFAULT_THRESHOLD:g}; the truths judge the others)")
    p.add_argument("--error-ratio", type=float, default=None, metavar="R",
                   help="a leaf differs when one golden's error against its own float64 truth exceeds the "
                        "other's by more than R times (default: the ratio a replay allows at the rung, 10 at "
                        "float32, 1.75 at bf16/fp16; 0 disables)")
    p.add_argument("--all", action="store_true", help="list every leaf, not only those that differ")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _l2(x: Any) -> float:
    return float(x.square().sum().sqrt())


def _compare_leaf(ra: Any, rb: Any, ta: Any | None, tb: Any | None, u: float,
                  ga: Any | None = None, gb: Any | None = None) -> dict[str, Any]:
    """Distances of one leaf of two goldens; ``ta``/``tb``: each one's float64 truth of the module
    on its own inputs, ``ga``/``gb``: of the whole model on the model's inputs (the propagated one)."""
    import torch

    out: dict[str, Any] = {}
    if tuple(ra.shape) != tuple(rb.shape):
        out["problem"] = f"shape {tuple(ra.shape)} vs {tuple(rb.shape)}"
        return out
    if ra.dtype != rb.dtype:
        out["problem"] = f"dtype {ra.dtype} vs {rb.dtype}"
        return out
    if not (ra.is_floating_point() or ra.is_complex()):
        n = int((ra != rb).sum())
        out.update({"rel_l2": 0.0 if n == 0 else math.inf, "mismatches": n})
        return out

    def f64(t: Any) -> Any:
        t = t.detach().to("cpu")
        if t.is_complex():
            t = torch.view_as_real(t)
        return t.to(torch.float64).reshape(-1)

    a, b = f64(ra), f64(rb)
    fin = torch.isfinite(a) & torch.isfinite(b)
    nonfinite = int((torch.isfinite(a) != torch.isfinite(b)).sum())
    nb = _l2(b[fin])
    d = _l2(a[fin] - b[fin])
    out["rel_l2"] = d / nb if nb > 0 else (0.0 if d == 0 else math.inf)
    out["max_abs"] = float((a[fin] - b[fin]).abs().max()) if int(fin.sum()) else 0.0
    if nonfinite:
        out["nonfinite_mismatch"] = nonfinite
    errs: list[tuple[float, float] | None] = []
    for r, t in ((a, ta), (b, tb)):
        if t is None or t.numel() != r.numel():
            errs.append(None)
            continue
        t = f64(t)
        ok = torch.isfinite(r) & torch.isfinite(t)
        if not int(ok.sum()):
            errs.append(None)
            continue
        rms_t = float(t[ok].square().mean().sqrt())
        e = float((r[ok] - t[ok]).square().mean().sqrt())
        errs.append((e, rms_t))
    if errs[0] is not None and errs[1] is not None:
        (ea, sa), (eb, sb) = errs  # type: ignore[misc]
        out["err_a"], out["err_b"] = ea, eb
        out["err_a_rel"] = ea / sa if sa > 0 else None
        out["err_b_rel"] = eb / sb if sb > 0 else None
        # each error relative to its own truth's scale: goldens whose upstream differs (a changed norm)
        # feed a module inputs of another size, and its raw errors scale with them
        ea_rel = ea / sa if sa > 0 else 0.0
        eb_rel = eb / sb if sb > 0 else 0.0
        floor = FLOOR_ULPS * u
        out["err_ratio"] = max(eb_rel, floor) / max(ea_rel, floor)
        out["truth_rel_l2"] = (_l2(f64(ta) - f64(tb)) / _l2(f64(tb))  # type: ignore[arg-type]
                               if _l2(f64(tb)) > 0 else 0.0)
    if ga is not None and gb is not None and ga.numel() == gb.numel() == a.numel():
        # Each golden is its backend's rounding of its own truth. Two correct backends of one model
        # share the truth, up to the float32 steps a model writes into its own code; references that
        # compute different functions (an exact GELU against its tanh form) have truths further
        # apart than either's rounding, at any dtype.
        xa, xb = f64(ga), f64(gb)
        ok = fin & torch.isfinite(xa) & torch.isfinite(xb)
        if int(ok.sum()):
            na, nb_ = _l2(xa[ok]), _l2(xb[ok])
            out["truths_rel_l2"] = _l2(xa[ok] - xb[ok]) / nb_ if nb_ > 0 else 0.0
            out["prop_err_a"] = _l2(a[ok] - xa[ok]) / na if na > 0 else 0.0
            out["prop_err_b"] = _l2(b[ok] - xb[ok]) / nb_ if nb_ > 0 else 0.0
            scale = max(out["prop_err_a"], out["prop_err_b"], FLOOR_ULPS * u, TRUTHS_FLOOR)
            out["truths_x"] = out["truths_rel_l2"] / scale
    return out


def diff_goldens(path_a: str | Path, path_b: str | Path, dtypes: list[str] | None = None,
                 threshold: float | None = None, error_ratio: float | None = None) -> dict[str, Any]:
    """Layer-by-layer comparison of two goldens of one model; ``differs`` says whether any leaf differs.

    An unreadable golden raises GoldenError naming it (both are named when the failure cannot be placed).
    """
    try:
        return _diff_goldens(path_a, path_b, dtypes, threshold, error_ratio)
    except ParityError:
        raise
    except _INCONSISTENT as exc:
        raise _inconsistent(f"{path_a} or {path_b}", exc) from None


def _diff_goldens(path_a: str | Path, path_b: str | Path, dtypes: list[str] | None,
                  threshold: float | None, error_ratio: float | None) -> dict[str, Any]:
    from pytest_rocm_parity.judging.dtypes import UNIT_ROUNDOFF, canonical_name
    from pytest_rocm_parity.judging.tolerance import Tolerance

    dtypes = _rung_names(dtypes)
    da, ma = resolve_golden(path_a)
    db, mb = resolve_golden(path_b)
    ra_, rb_ = list(ma.get("rungs", {})), list(mb.get("rungs", {}))
    common = [r for r in ra_ if r in rb_ and (not dtypes or r in dtypes)]
    res: dict[str, Any] = {
        "a": {"path": str(da), "name": ma.get("name"), "created": ma.get("created"),
              "fingerprint": ma.get("fingerprint"), "reference_env": {k: (ma.get("reference_env") or {}).get(k) for k in ENV_KEYS}},
        "b": {"path": str(db), "name": mb.get("name"), "created": mb.get("created"),
              "fingerprint": mb.get("fingerprint"), "reference_env": {k: (mb.get("reference_env") or {}).get(k) for k in ENV_KEYS}},
        "threshold": threshold, "error_ratio": error_ratio, "warnings": [], "rungs": {},
        "only_in_a": [r for r in ra_ if r not in rb_], "only_in_b": [r for r in rb_ if r not in ra_],
    }
    changed = _fingerprint_changes(ma.get("fingerprint") or {}, mb.get("fingerprint") or {})
    if changed:
        res["warnings"].append(f"model fingerprints differ ({changed}): differences below are not only numerics")
    elif changed is None:
        res["warnings"].append("the goldens' fingerprints were recorded by different versions of this tool and "
                               "cannot be compared: whether the model's structure or weights changed is not known")
    if dtypes and not common:
        raise GoldenNotFound(f"no rung {dtypes} in both goldens (A holds {ra_}, B holds {rb_})")
    differs = bool(res["only_in_a"] or res["only_in_b"]) and not dtypes
    inputs_checked = False
    for rung in common:
        try:
            u = UNIT_ROUNDOFF[canonical_name(rung)]
            # one rule with the replay: the error ratio its isolated judgement allows at this rung
            ratio = error_ratio if error_ratio is not None else Tolerance().ratio_for(rung)
        except (ParityError, KeyError):
            u = 2.0 ** -24
            ratio = error_ratio if error_ratio is not None else Tolerance().ratio_for("float32")
        ra = RungReader(_rung_path(da, ma, rung), "cpu")
        rb = RungReader(_rung_path(db, mb, rung), "cpu")
        if not inputs_checked:   # every rung stores the same model inputs: one rung tells
            inputs_checked = True
            other = _inputs_differ(ra, rb)
            if other:
                res["warnings"].append(f"model inputs differ ({', '.join(other[:3])}"
                                       f"{' ...' if len(other) > 3 else ''}): the goldens ran the model on other "
                                       f"inputs, so differences below are not only numerics")
        la = {(k, leaf): (tk, truth) for k, leaf, tk, truth in _leaves(ma["rungs"][rung])}
        lb = {(k, leaf): (tk, truth) for k, leaf, tk, truth in _leaves(mb["rungs"][rung])}
        rows = []
        for key in list(la) + [k for k in lb if k not in la]:
            row: dict[str, Any] = {"layer": key[0], "leaf": key[1]}
            if key not in la or key not in lb:
                row["problem"] = "only in " + ("B" if key not in la else "A")
            else:
                (tka, tra), (tkb, trb) = la[key], lb[key]
                xa, xb = ra.get(tka), rb.get(tkb)
                gk = f"gtruth/{key[0]}/{key[1]}"
                row.update(_compare_leaf(xa, xb, _truth(ra, ma["rungs"][rung], tra, xa),
                                         _truth(rb, mb["rungs"][rung], trb, xb), u,
                                         _truth(ra, ma["rungs"][rung], gk, xa), _truth(rb, mb["rungs"][rung], gk, xb)))
            why = []
            if row.get("nonfinite_mismatch"):
                why.append(f"{row['nonfinite_mismatch']} elements finite in one, not the other")
            if row.get("mismatches"):
                why.append(f"{row['mismatches']} elements differ")
            rel = row.get("rel_l2")
            limit = threshold if threshold is not None else (
                DEFAULT_THRESHOLD if row.get("err_ratio") is None and row.get("truths_x") is None else None)
            if rel is not None and limit is not None and not (rel <= limit) and not row.get("mismatches"):
                why.append(f"relative L2 {rel:.3g} > {limit:g}"
                           + ("" if threshold is not None else " (no float64 truth in both goldens to judge by)"))
            tx = row.get("truths_x")
            if tx is not None and tx > TRUTHS_FACTOR:
                why.append(f"the goldens' float64 truths differ by {row['truths_rel_l2']:.3g}, {tx:.3g}x the larger "
                           f"of their own errors: the references compute different functions")
            er = row.get("err_ratio")
            if ratio and er is not None and (er > ratio or er < 1.0 / ratio):
                worse = "B" if er > 1 else "A"
                why.append(f"{worse}'s error against its truth is {max(er, 1 / er):.3g}x the other's")
            # a leaf only one golden holds (another drill, a derived golden) is listed, not a numeric difference
            row["differs"] = bool(why)
            row["why"] = "; ".join(why) or row.get("problem", "")
            differs = differs or row["differs"]
            rows.append(row)
        n_only = sum(1 for r in rows if r.get("problem"))
        layer_rows = [r for r in rows if r["layer"] != OUTPUT]
        if layer_rows and all(r.get("problem") for r in layer_rows):   # nothing to agree
            differs = True
            if all(r["problem"].startswith("only in") for r in layer_rows):
                res["warnings"].append(f"[{rung}] no layer in common: the goldens describe different models or "
                                       f"selections")
            else:   # the same layers, each of another shape or dtype: the model ran on other inputs or rungs
                shown = next(r for r in layer_rows if not r["problem"].startswith("only in"))
                res["warnings"].append(f"[{rung}] no layer with the same shape and dtype in both goldens (e.g. "
                                       f"{shown['layer']}: {shown['problem']}): the same layers ran on inputs of "
                                       f"other shapes, so no value can be compared")
        # in the golden's call order: every module after the first that computes another function
        # inherits its difference, so the first is where the references part; inside it, the
        # smallest module whose own truth parts on the same inputs (_changed_inside)
        order = {k: i for i, k in enumerate(ma["rungs"][rung].get("order") or [])}
        parted = [r for r in rows if (r.get("truths_x") or 0.0) > TRUTHS_FACTOR and r["layer"] != OUTPUT]
        first = min(parted, key=lambda r: order.get(r["layer"], len(order)))["layer"] if parted else None
        if first is not None:
            first = _changed_inside(first, rows, ma["rungs"][rung], mb["rungs"][rung], ra, rb, u, order)
        res["rungs"][rung] = {"layers": rows, "n_leaves": len(rows), "n_differ": sum(1 for r in rows if r["differs"]),
                              "first_function_change": first, "error_ratio": ratio,
                              "n_only_in_one": n_only,
                              "max_rel_l2": max((r.get("rel_l2") or 0.0 for r in rows), default=0.0)}
    res["differs"] = differs
    return res


def _changed_inside(block: str, rows: list[dict[str, Any]], meta_a: dict[str, Any], meta_b: dict[str, Any],
                    ra: RungReader, rb: RungReader, u: float, order: dict[str, int]) -> str:
    """The smallest module inside ``block`` (first in call order) whose float64 truth on its own golden
    inputs parts between the goldens by more than TRUTHS_FACTOR times the difference of those inputs
    (or of the goldens' own errors): it computes another function on the same inputs. ``block`` where
    none does (a change in the block's own code between its sub-modules).

    Why: below the outermost modules the goldens keep each module's truth on its own inputs, not the
    whole model's; two references of one function give truths as far apart as their inputs are."""
    entries_a = {e.get("key"): e for e in meta_a.get("layers", [])}
    entries_b = {e.get("key"): e for e in meta_b.get("layers", [])}
    flagged: list[tuple[str, str]] = []   # (key, module name)
    for r in rows:
        ea, eb = entries_a.get(r["layer"]), entries_b.get(r["layer"])
        if ea is None or eb is None or r.get("truth_rel_l2") is None:
            continue
        name = ea.get("name", r["layer"])
        if not name.startswith(block + "."):
            continue
        apart = 0.0
        for path in ea.get("act") or []:
            ka, kb = (ea.get("in") or {}).get(path), (eb.get("in") or {}).get(path)
            if ka is None or kb is None:
                continue
            xa, xb = ra.get(ka), rb.get(kb)
            if tuple(xa.shape) != tuple(xb.shape) or not xa.is_floating_point() or not xb.is_floating_point():
                apart = math.inf   # other inputs altogether: nothing to tell
                break
            a, b = xa.double().reshape(-1), xb.double().reshape(-1)
            nb = _l2(b)
            apart = max(apart, _l2(a - b) / nb if nb > 0 else 0.0)
        scale = max(apart, r.get("err_a_rel") or 0.0, r.get("err_b_rel") or 0.0, FLOOR_ULPS * u, TRUTHS_FLOOR)
        if r["truth_rel_l2"] > TRUTHS_FACTOR * scale:
            flagged.append((r["layer"], name))
            r["same_inputs_truths_x"] = r["truth_rel_l2"] / scale
    # the smallest: a flagged module none of whose flagged descendants is below it
    smallest = [(k, n) for k, n in flagged if not any(m.startswith(n + ".") for _, m in flagged)]
    if not smallest:
        return block
    key, name = min(smallest, key=lambda kn: order.get(kn[0], len(order)))
    for r in rows:
        if r["layer"] == key and not r["differs"]:
            r["differs"] = True
            r["why"] = "; ".join(filter(None, [r["why"], f"its float64 truths differ by {r['truth_rel_l2']:.3g}, "
                                               f"{r['same_inputs_truths_x']:.3g}x what its inputs and errors explain: "
                                               f"it computes another function"]))
    return name


def _fingerprint_changes(fa: dict[str, Any], fb: dict[str, Any]) -> str | None:
    """What two goldens' model fingerprints say changed ("" when nothing), or None when no part of
    them was recorded the same way. Parameter names and shapes (``tensors``) compare where both hold
    them, the structure hash where neither does (the older hash included module classes), the
    weight hash where both hashed the same tensors (``weights_of``)."""
    parts: list[str] = []
    compared = False
    if "tensors" in fa and "tensors" in fb:
        compared = True
        if fa["tensors"] != fb["tensors"]:
            parts.append("parameter names or shapes")
    elif "tensors" not in fa and "tensors" not in fb:
        compared = True
        if fa.get("structure") != fb.get("structure"):
            parts.append("structure")
    if fa.get("weights_of") == fb.get("weights_of") and fa.get("weights") and fb.get("weights"):
        compared = True
        if fa["weights"] != fb["weights"]:
            parts.append("weights")
    if not compared:
        return None
    return " and ".join(parts)


def _inputs_differ(ra: RungReader, rb: RungReader) -> list[str]:
    """The stored model inputs (``input/...``) that one golden lacks or holds with other values."""
    import torch

    ka = {k for k in ra.keys if k.startswith("input/")}
    kb = {k for k in rb.keys if k.startswith("input/")}
    return sorted((ka ^ kb) | {k for k in ka & kb if not torch.equal(ra.get(k), rb.get(k))})


def format_diff(res: dict[str, Any], show_all: bool = False) -> list[str]:
    lines = []
    for side in ("a", "b"):
        s = res[side]
        env = s.get("reference_env") or {}
        lines.append(f"{side.upper()}: {s['path']}  ({_txt(s.get('name'))}, created {_txt(s.get('created'))})  "
                     + "  ".join(f"{k}={env[k]}" for k in ("backend", "device_name", "torch", "cuda", "hip")
                                 if env.get(k) not in (None, "")))
    for w in res["warnings"]:
        lines.append(f"warning: {w}")
    if res["only_in_a"] or res["only_in_b"]:
        lines.append(f"rungs only in A: {_txt(res['only_in_a'])}  only in B: {_txt(res['only_in_b'])}")
    for rung, r in res["rungs"].items():
        lines.append("")
        only = r.get("n_only_in_one", 0)
        lines.append(f"[{rung}] {r['n_leaves'] - only} leaves compared, {r['n_differ']} differ"
                     + (f"; {only} in one golden only, not compared" if only else "")
                     + f"; max relative L2 {_fmt(r['max_rel_l2'])}"
                     + (f" (threshold {res['threshold']:g}, " if res["threshold"] is not None else " (")
                     + f"error ratio {r['error_ratio']:g}, truths {TRUTHS_FACTOR:g}x their errors)")
        if r.get("first_function_change"):
            lines.append(f"  the references first compute different functions at {r['first_function_change']}")
        rows = []
        changed = False   # past the first module whose references compute another function
        for x in r["layers"]:
            changed = changed or x["layer"] == r.get("first_function_change")
            if not (show_all or x["differs"]):
                continue
            # a row after the change whose truths were not compared ran on other inputs in each
            # golden: "ok" would read as "the same", where its outputs differ by what it inherits
            verdict = ("DIFF " + x["why"] if x["differs"] else x.get("problem") or
                       ("inherits the difference (other inputs in each golden)"
                        if changed and x.get("truths_rel_l2") is None else "ok"))
            rows.append([x["layer"] + ("" if x["leaf"] in ("", "0") else f" [{x['leaf']}]"), _fmt(x.get("rel_l2")),
                         _fmt(x.get("err_a_rel")), _fmt(x.get("err_b_rel")), _fmt(x.get("err_ratio"), ".3g"),
                         _fmt(x.get("truths_rel_l2")), verdict])
        if rows:
            lines += ["  " + s for s in _table(["layer", "rel L2(A,B)", "err A/rms", "err B/rms", "errB/errA",
                                                "truths(A,B)", "verdict"], rows, {1, 2, 3, 4, 5})]
    lines.append("")
    lines.append("goldens DIFFER" if res["differs"] else "goldens agree within the thresholds")
    return lines


def run_diff(args: argparse.Namespace) -> int:
    res = diff_goldens(args.a, args.b, args.dtype, args.threshold, args.error_ratio)
    if args.json:
        print(json.dumps(res, indent=1, default=str))
    else:
        lines = format_diff(res, args.all)
        if enabled(sys.stdout):
            lines = [_paint_diff_line(line) for line in lines]
        print("\n".join(lines), flush=True)
    return 1 if res["differs"] else 0


def _paint_diff_line(line: str) -> str:
    if line == "goldens DIFFER":
        return paint(line, "red+bold", True)
    if line.startswith("goldens agree"):
        return paint(line, "green", True)
    if line.startswith("warning:"):
        return paint("warning:", "yellow", True) + line[len("warning:"):]
    at = line.find("  DIFF ")
    return line[:at + 2] + paint("DIFF", "red", True) + line[at + 6:] if at >= 0 else line


# ---------------------------------------------------------------------------------------------
# golden prune

def add_golden_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="golden_command", metavar="ACTION", required=True)
    prune = sub.add_parser(
        "prune", help="delete the goldens no test uses any more (runs the suite to find them)",
        description="Run the parity suite in replay mode against GOLDEN_DIR and delete the goldens it proves "
                    "obsolete: those of test files whose parity tests all passed without using them. Nothing is "
                    "deleted after a failed, stopped or partial run, nor any directory without this tool's "
                    "marker. Arguments after GOLDEN_DIR go to pytest (test paths, -p, -c ...).")
    prune.add_argument("golden_dir", metavar="GOLDEN_DIR", help="the golden directory (--parity-golden-dir)")
    prune.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    prune.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="PYTEST_ARGS",
                       help="passed to pytest: the test paths to run (default: pytest's own, the testpaths of the ini "
                            "file found from the current directory, else the current directory)")
    from pytest_rocm_parity.golden.derive import add_derive_arguments

    add_derive_arguments(sub.add_parser(
        "derive", help="write a golden with fewer rungs or a shallower drill from another, no GPU needed",
        description="Derive NEW_NAME from the golden NAME: the rungs of --dtypes, the modules at most --drill "
                    "levels deep, the tensors a capture with those settings would have written. An existing "
                    "NEW_NAME is replaced only with --force; NAME itself never."))


def run_golden(args: argparse.Namespace) -> int:
    import subprocess

    from pytest_rocm_parity.options import ENABLE, GOLDEN_DIR, PRUNE, PRUNE_DRY_RUN

    if args.golden_command == "derive":
        from pytest_rocm_parity.golden.derive import run_derive

        return run_derive(args)
    root = Path(args.golden_dir)
    if root.is_file():
        example = root.parent.parent if root.name == MANIFEST else Path("goldens")   # GOLDEN_DIR/NAME/manifest.json
        raise GoldenNotFound(f"{args.golden_dir}: a file, not a directory; pass the folder of goldens the suite's "
                             f"{GOLDEN_DIR} names (default: <rootdir>/goldens), e.g. rocm-parity golden prune {example}")
    if not root.is_dir():
        raise GoldenNotFound(f"{args.golden_dir}: no such golden directory; pass the directory the suite's "
                             f"{GOLDEN_DIR} names (default: <rootdir>/goldens)")
    if not any(root.glob("*/manifest.json")):
        # a run of the suite against a directory of no goldens would fail every check and prune nothing
        raise GoldenNotFound(f"{args.golden_dir}: holds no golden (no NAME/manifest.json below it), so there is "
                             f"nothing to prune; pass the directory the suite's {GOLDEN_DIR} names "
                             f"(default: <rootdir>/goldens)")
    extra = [a for a in args.pytest_args if a != "--"] if args.pytest_args else []
    # A run of the suite is what proves a golden obsolete; a child process keeps this one's torch state clean.
    cmd = [sys.executable, "-m", "pytest", ENABLE, f"{GOLDEN_DIR}={root.resolve()}", PRUNE,
           *([PRUNE_DRY_RUN] if args.dry_run else []), *extra]
    print("rocm-parity golden prune: running " + " ".join(cmd[1:]), flush=True)
    return subprocess.call(cmd)


def _truth_text(rung: dict[str, Any]) -> str:
    """How a rung stores its float64 truth, in words (the dtype alone read as the truth's own)."""
    if rung.get("truth_encoding") == "sketch":
        return "float64 truth kept as sketches"
    return f"float64 truth stored as {_txt(rung.get('truth_dtype'))} residuals"
