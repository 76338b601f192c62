"""``rocm-parity ops``: fuzz the transformer-inference operators on a new backend in one command.

Each operator is run on the chosen device in float32, float16 and bfloat16 with
Hypothesis-generated inputs (odd and block-boundary sizes, views, large values,
subnormals) and judged against a float64 CPU truth by ``fuzz.check_op``.  A failing
operator is shrunk to a minimal input and printed with a reproduction.

``--record DIR`` on the reference machine stores every example with its truth as a
golden; ``--replay DIR`` on the candidate re-runs exactly those inputs first.

Kept import-light: ``rocm-parity --help`` imports this module, torch is imported by
``run_ops`` only.
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_rocm_parity.errors import GoldenCorrupt, InvalidArgument, ParityError
from pytest_rocm_parity.judging.dtypes import dtype_alias
from pytest_rocm_parity.tables import text_table

DEFAULT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class OpSpec:
    """One built-in operator: a strategy factory (dtype -> OpArgs), the op and its float64 truth."""

    name: str
    strategy: Callable[[Any], Any]
    candidate: Callable[..., Any]
    reference: Callable[..., Any]
    doc: str


@dataclass
class OpReport:
    """The outcome of fuzzing one operator in one dtype."""

    op: str
    dtype: str
    device: str
    status: str  # "pass" | "fail" | "error"
    examples: int = 0
    worst_ratio: float = 0.0
    seconds: float = 0.0
    message: str = ""
    replayed: int = 0
    # --replay asked, and DIR holds no golden of this op and dtype: it was only fuzzed
    no_golden: bool = False
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- the operators


def builtin_ops() -> dict[str, OpSpec]:
    """The operator table (built on call so that torch is imported only when the suite runs)."""
    import torch
    import torch.nn.functional as F

    from pytest_rocm_parity.fuzz import strategies as S

    def with_magnitude(strategy: Any, magnitude: Callable[..., Any]) -> Any:
        from dataclasses import replace

        return strategy.map(lambda case: replace(case, magnitude=magnitude))

    def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")

    def log_softmax_magnitude(x: torch.Tensor, dim: int) -> torch.Tensor:
        # x - max - log(sum exp(x - max)): the sum is at least 1, so its rounding reaches the output as
        # an absolute error of about one unit roundoff (x = [-4, 0]: -0.0181 off by 4 ulps of itself)
        return x.abs() + torch.logsumexp(x, dim, keepdim=True).abs() + 1.0

    def logsumexp_magnitude(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
        return x.abs().amax(dim, keepdim=keepdim) + 1.0

    big = 3.0e37  # float32 gelu forms x * (1 + erf(.)) and overflows within 2x of the max

    specs = [
        OpSpec("matmul", S.matmul_args, torch.matmul, torch.matmul, "batched GEMM, broadcast batch, B often transposed"),
        OpSpec("linear", S.linear_args, F.linear, F.linear, "x @ W.T + b"),
        OpSpec("sdpa", S.sdpa_args, F.scaled_dot_product_attention, S.sdpa_reference,
               "attention with bool/additive masks, causal, GQA"),
        OpSpec("softmax", S.softmax_args, torch.softmax, torch.softmax, "softmax over any dim, |x| <= 1e4"),
        OpSpec("log_softmax", lambda dt: with_magnitude(S.softmax_args(dt), log_softmax_magnitude),
               torch.log_softmax, torch.log_softmax, "log-softmax"),
        OpSpec("layer_norm", S.layer_norm_args, F.layer_norm, F.layer_norm, "LayerNorm, optional affine"),
        OpSpec("rms_norm", S.rms_norm_args, F.rms_norm, F.rms_norm, "RMSNorm"),
        OpSpec("rotary", S.rotary_args, S.apply_rotary, S.apply_rotary, "rotate-half rotary embedding"),
        OpSpec("embedding", S.embedding_args, F.embedding, F.embedding, "embedding gather (exact)"),
        OpSpec("sum", lambda dt: S.reduction_args(dt, op="sum"), torch.sum, torch.sum, "sum over one dim"),
        OpSpec("mean", lambda dt: S.reduction_args(dt, op="mean"), torch.mean, torch.mean, "mean over one dim"),
        OpSpec("amax", lambda dt: S.reduction_args(dt, op="amax"), torch.amax, torch.amax, "max over one dim"),
        OpSpec("var", lambda dt: S.reduction_args(dt, op="var"), torch.var, torch.var, "variance over one dim"),
        OpSpec("logsumexp", lambda dt: with_magnitude(S.reduction_args(dt, op="logsumexp"), logsumexp_magnitude),
               torch.logsumexp, torch.logsumexp, "logsumexp over one dim"),
        OpSpec("cumsum", lambda dt: S.reduction_args(dt, op="cumsum"), torch.cumsum, torch.cumsum, "prefix sum"),
        OpSpec("index_add", S.index_add_args, torch.index_add, torch.index_add, "index_add with repeated indices"),
        OpSpec("scatter_add", S.scatter_add_args, torch.scatter_add, torch.scatter_add,
               "scatter_add with repeated indices"),
        OpSpec("add", S.binary_args, torch.add, torch.add, "broadcasting add"),
        OpSpec("mul", S.binary_args, torch.mul, torch.mul, "broadcasting mul"),
        OpSpec("gelu", lambda dt: S.unary_args(dt, max_magnitude=big, magnitude=S.abs_magnitude),
               F.gelu, F.gelu, "exact (erf) GELU"),
        OpSpec("gelu_tanh", lambda dt: S.unary_args(dt, max_magnitude=big, magnitude=S.abs_magnitude),
               gelu_tanh, gelu_tanh, "tanh-approximate GELU"),
        OpSpec("silu", lambda dt: S.unary_args(dt, max_magnitude=big), F.silu, F.silu, "SiLU"),
    ]
    return {s.name: s for s in specs}


OP_NAMES = ("matmul", "linear", "sdpa", "softmax", "log_softmax", "layer_norm", "rms_norm", "rotary", "embedding",
            "sum", "mean", "amax", "var", "logsumexp", "cumsum", "index_add", "scatter_add", "add", "mul", "gelu",
            "gelu_tanh", "silu")


def _split_names(text: str, allowed: Sequence[str], flag: str,
                 canonical: Callable[[str], str] = str) -> list[str]:
    names = [canonical(n.strip()) for n in text.split(",") if n.strip()]
    for n in names:
        if n not in allowed:
            close = difflib.get_close_matches(n, allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise InvalidArgument(f"{flag} {n!r} is not known.{hint} Choose from: {', '.join(allowed)}")
    if not names:
        raise InvalidArgument(f"{flag} is empty; give a comma-separated list such as {allowed[0]}")
    return names


# --------------------------------------------------------------------------- running


def fuzz_one(spec: OpSpec, dtype_name: str, device: str, max_examples: int, seed: int,
             database: str | None = None) -> OpReport:
    """Fuzz one operator in one dtype; never raises on a mismatch (the report carries it)."""
    import torch
    from hypothesis import HealthCheck, Verbosity, given, settings
    from hypothesis import seed as hyp_seed
    from hypothesis.database import DirectoryBasedExampleDatabase

    from pytest_rocm_parity.fuzz import harness as fuzz

    dtype = getattr(torch, dtype_name)
    report = OpReport(spec.name, dtype_name, device, "pass")
    start = time.perf_counter()
    db = DirectoryBasedExampleDatabase(database) if database else None

    sticky: list[str] = []   # the first failure that was a device error (see sticky_device_error)
    failing: list[float] = []   # the ratio of each failing example; the last is the shrunk one reported

    def _body(case: Any) -> None:
        if sticky:   # the device context is unusable: nothing run after that error is evidence
            return
        if not failing:   # examples drawn until the first failure; shrinking's runs are not examples
            report.examples += 1
        result = fuzz.check_op(spec.candidate, spec.reference, case, device=device)
        if result.passed:
            if not failing:
                report.worst_ratio = max(report.worst_ratio, result.max_ratio)
        else:
            failing.append(result.max_ratio)
            if result.error and sticky_device_error(result.error):
                sticky.append(result.message())
            raise AssertionError(result.message())

    # one database key per op and dtype (the body's source is shared by all of them)
    _body._hypothesis_internal_add_digest = f"rocm-parity-ops/{spec.name}/{dtype_name}".encode()  # type: ignore
    prop = given(spec.strategy(dtype))(_body)
    prop = settings(max_examples=max_examples, deadline=None, database=db, verbosity=Verbosity.quiet,
                    suppress_health_check=[HealthCheck.too_slow], print_blob=False)(prop)
    if db is None:  # with a database, let failures found earlier drive the run instead of a fixed seed
        prop = hyp_seed(seed)(prop)
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            prop()
    except Exception as exc:
        if sticky:
            # Shrinking after a CUDA/HIP error only walks to the simplest input (every later example
            # "fails" on the poisoned context): the first failing example is the one that triggered it.
            report.status = "error"
            report.message = (sticky[0] + "\n\nThis is the first failing example, not shrunk: after a device "
                              "error the CUDA/HIP context is unusable, so no later example was run (Hypothesis "
                              f"ended with {type(exc).__name__}). Rerun it alone, in a fresh process, to confirm.")
            report.worst_ratio = math.inf
        elif isinstance(exc, AssertionError):
            report.status = "fail"
            report.message = str(exc)
            # the reported (shrunk) example's ratio; inf where the output was not comparable at all
            report.worst_ratio = failing[-1] if failing and math.isfinite(failing[-1]) else math.inf
        else:  # the op crashing on the backend is a finding, not a CLI crash
            report.status = "error"
            report.message = f"{type(exc).__name__}: {exc}"
    report.seconds = round(time.perf_counter() - start, 3)
    return report


def sticky_device_error(error: str) -> bool:
    """A CUDA/HIP error that leaves the context unusable (every later kernel fails too)."""
    low = error.lower()
    return ("acceleratorerror" in low or "cuda error" in low or "hip error" in low
            or "device-side assert" in low or "illegal memory access" in low)


OP_GOLDEN_MAX_BYTES = 64 * 1024 * 1024


def _regular_bounded(path: Path) -> None:
    """Refuse a FIFO, a device or another special file (reading one can block forever) and oversized files."""
    import stat

    try:
        st = path.stat()
    except OSError as exc:
        raise GoldenCorrupt(f"{path}: cannot be read ({exc.strerror or exc}); re-record the operator golden", path) from None
    if not stat.S_ISREG(st.st_mode):
        raise GoldenCorrupt(f"{path}: not a regular file (a FIFO, device or socket); an operator golden is two plain "
                            f"files, DIR/<op>-<dtype>.json and .safetensors: replace it with a recorded one", path)
    if st.st_size > OP_GOLDEN_MAX_BYTES:
        raise GoldenCorrupt(f"{path}: {st.st_size} bytes, over the {OP_GOLDEN_MAX_BYTES} bytes an operator golden may "
                            f"have; it is not one written by rocm-parity ops --record", path)


def replay_one(spec: OpSpec, dtype_name: str, device: str, golden_dir: Path) -> tuple[int, str | None]:
    """Replay ``DIR/<op>-<dtype>`` exactly; returns (examples replayed, first failure message or None)."""
    from pytest_rocm_parity.fuzz import harness as fuzz

    path = golden_dir / f"{spec.name}-{dtype_name}"
    manifest = path.with_name(path.name + ".json")
    if not manifest.exists():
        return 0, None
    for f in (manifest, path.with_name(path.name + ".safetensors")):
        _regular_bounded(f)
    try:
        results = fuzz.replay_golden(path, spec.candidate, device=device)
    except ParityError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError, OverflowError,
            RuntimeError, UnicodeError) as exc:
        raise GoldenCorrupt(
            f"{manifest}: the operator golden is malformed ({type(exc).__name__}: {str(exc)[:300]}); re-record it on "
            f"the reference machine with rocm-parity ops --record DIR", manifest) from None
    bad = [r for r in results if not r.passed]
    return len(results), (bad[0].message() if bad else None)


def _require_goldens(d: Path, names: Sequence[str], dtype_names: Sequence[str]) -> None:
    """InvalidArgument unless ``--replay DIR`` holds a golden of at least one op and dtype asked for:
    a mistyped folder would otherwise replay nothing and pass."""
    if d.is_file():
        raise InvalidArgument(f"--replay {d}: a file, not a directory; name the folder the reference machine wrote "
                              f"with rocm-parity ops --record DIR (the one that holds the <op>-<dtype>.json goldens"
                              f"{', here ' + str(d.parent) if d.suffix == '.json' else ''})")
    if not d.is_dir():
        raise InvalidArgument(f"--replay {d}: no such directory; name the folder the reference machine wrote with "
                              f"rocm-parity ops --record DIR")
    if not any((d / f"{n}-{t}.json").exists() for n in names for t in dtype_names):
        held = sorted(p.stem for p in d.glob("*.json"))
        raise InvalidArgument(f"--replay {d}: no operator golden for the ops and dtypes asked ({', '.join(names)} x "
                              f"{', '.join(dtype_names)}); it holds {', '.join(held[:8]) or 'none'}. Record them on "
                              f"the reference machine with rocm-parity ops --record DIR, or ask for the ops it holds")


def add_ops_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``rocm-parity ops``."""
    parser.add_argument("--device", metavar="D", default=None,
                        help="device to test, e.g. cuda, cuda:1, cpu (default: cuda if available, else cpu)")
    parser.add_argument("--max-examples", metavar="N", type=_positive_int, default=30,
                        help="Hypothesis examples per operator and dtype (default: 30)")
    parser.add_argument("--ops", metavar="a,b", default=None,
                        help=f"comma-separated subset of: {', '.join(OP_NAMES)} (default: all)")
    parser.add_argument("--dtypes", metavar="a,b", default=",".join(DEFAULT_DTYPES),
                        help="comma-separated dtypes (default: float32,float16,bfloat16)")
    parser.add_argument("--seed", metavar="S", type=int, default=0, help="Hypothesis seed (default: 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--database", metavar="DIR", default=None,
                        help="keep failing examples in this Hypothesis example database and replay them first")
    parser.add_argument("--record", metavar="DIR", default=None,
                        help="reference machine: write each op's examples, truth and output as goldens into DIR")
    parser.add_argument("--replay", metavar="DIR", default=None,
                        help="candidate machine: first replay exactly the goldens recorded in DIR")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def run_ops(args: argparse.Namespace) -> int:
    """Run the suite; exit status 0 when every operator passes, 1 otherwise."""
    # each line as it is printed, also when piped (tee, CI logs): a run takes minutes
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(line_buffering=True)
        except (ValueError, OSError):   # a stream that cannot change its buffering keeps its own
            pass
    names = _split_names(args.ops, OP_NAMES, "--ops") if args.ops else list(OP_NAMES)
    dtype_names = _split_names(args.dtypes, ("float32", "float16", "bfloat16", "float64"), "--dtypes", dtype_alias)
    import torch

    from pytest_rocm_parity.fuzz import harness as fuzz

    device = str(fuzz._resolve_device(args.device, cpu_hint="run with --device cpu"))
    specs = builtin_ops()
    if args.replay:
        _require_goldens(Path(args.replay), names, dtype_names)
    reports: list[OpReport] = []
    for name in names:
        for dtype_name in dtype_names:
            spec = specs[name]
            if args.record:
                out = Path(args.record)
                fuzz.record_golden(out / f"{name}-{dtype_name}", spec.candidate, spec.reference,
                                   spec.strategy(getattr(torch, dtype_name)), max_examples=args.max_examples,
                                   seed=args.seed, device=device, overwrite=True)
            replayed, replay_failure = (0, None)
            if args.replay:
                replayed, replay_failure = replay_one(spec, dtype_name, device, Path(args.replay))
            report = fuzz_one(spec, dtype_name, device, args.max_examples, args.seed, args.database)
            report.replayed = replayed
            report.no_golden = bool(args.replay) and not replayed and replay_failure is None
            if replay_failure is not None:
                report.status = "fail"
                report.notes.append("a recorded golden example failed")
                report.message = replay_failure + ("\n\n" + report.message if report.message else "")
            reports.append(report)
            if not args.json:
                _print_row(report)
    if args.json:
        doc = {"device": device, "torch": torch.__version__, "hip": getattr(torch.version, "hip", None),
               "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
               "max_examples": args.max_examples, "seed": args.seed,
               "ops": [_jsonable(asdict(r)) for r in reports]}
        print(json.dumps(doc, indent=1))
    else:
        failed = [r for r in reports if r.status != "pass"]
        for r in failed:
            print(f"\n=== {r.op} [{r.dtype}] {r.status.upper()} ===\n{r.message}")
        print(f"\n{len(reports) - len(failed)} passed, {len(failed)} failed on {device} "
              f"(torch {torch.__version__})")
    return 1 if any(r.status != "pass" for r in reports) else 0


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    if isinstance(data.get("worst_ratio"), float) and not math.isfinite(data["worst_ratio"]):
        data["worst_ratio"] = None
    return data


def _print_row(r: OpReport) -> None:
    ratio = "-" if not math.isfinite(r.worst_ratio) else f"{r.worst_ratio:.3f}"
    replay = f" replayed {r.replayed}" if r.replayed else " no golden to replay" if r.no_golden else ""
    cells = (r.op, r.dtype, r.status.upper(), f"examples {r.examples:>4}", f" worst err/tol {ratio:>6}",
             f" {r.seconds:6.1f}s{replay}")
    print(text_table([cells], widths=(12, 9, 5, None, None, None), sep=" ")[0], flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_rocm_parity.fuzz.opsuite`` works even where the console script is not installed."""
    parser = argparse.ArgumentParser(prog="rocm-parity ops", description=__doc__.splitlines()[0])
    add_ops_arguments(parser)
    try:
        return run_ops(parser.parse_args(argv))
    except InvalidArgument as exc:
        print(f"rocm-parity ops: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
