"""Operator fuzzing harness: run an op on the candidate device, judge it against a float64 truth.

``compare_op(candidate, reference, *args, **kwargs)`` runs ``candidate`` on the
candidate device in the inputs' own dtype and ``reference`` in float64 on the CPU,
then judges every output element with the error model below.  Judging and
raising are separate (``check_op`` returns the record; one function builds the
message) so that suites can report every op, not just the first failure.

Error model (docs/fuzzing.md has the reasoning), per output element::

    tol = ulps * ulp_d(truth)                              # final rounding, transcendental slack
        + (inter * u_d + acc * sqrt(K) * u_acc) * scale    # intermediates and accumulation
        + tiny_d                                           # flush-to-zero of subnormal results

``d`` is the lowest precision among the floating inputs and the output, ``u`` a
unit roundoff (2^-p), ``K`` the reduction length, ``u_acc`` float32's unless the
inputs are float64 (or 2^-11 when TF32 is on for the candidate), and ``scale`` the
magnitude of the terms behind the element (``|A| @ |B|`` for a matmul) or, when
the op gives none, ``max(|truth|, rms(truth))``.

Golden replay: ``record_golden`` stores generated examples with their float64 truth
and the reference device's output as safetensors plus a JSON manifest (never
pickle); ``replay_golden`` re-runs exactly those inputs on the candidate.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import os
import re
import sys
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from pytest_rocm_parity.atomic import atomic_write
from pytest_rocm_parity.errors import (
    BackendUnavailable,
    GoldenCorrupt,
    GoldenMissing,
    InvalidArgument,
)
from pytest_rocm_parity.fuzz.strategies import OpArgs
from pytest_rocm_parity.golden.store import check_format
from pytest_rocm_parity.fuzz.values import _dname, describe_value

__all__ = [
    "ErrorModel",
    "GOLDEN_FORMAT",
    "Golden",
    "GoldenExample",
    "OpResult",
    "OutputRecord",
    "check_op",
    "compare_op",
    "default_device",
    "describe_value",
    "load_golden",
    "place",
    "record_golden",
    "replay_golden",
]

GOLDEN_FORMAT = 1
_INLINE_LIMIT = 64  # tensors up to this many storage elements are printed in full in reproductions

# mantissa bits (with the implicit one) and minimum normal exponent per floating dtype
_PRECISION: dict[torch.dtype, tuple[int, int]] = {
    torch.float64: (53, -1022),
    torch.float32: (24, -126),
    torch.float16: (11, -14),
    torch.bfloat16: (8, -126),
}
_PRECISION_NAMES = frozenset(_dname(d) for d in _PRECISION)
# default ulps for the final-rounding term: low-precision results are rounded once
# from a float32 value (0.5 ulp, doubled for safety); float32 results come from
# libm/fast intrinsics (CUDA expf: 2 ulp; __expf and ex2.approx more) and short op chains.
_DEFAULT_ULPS: dict[torch.dtype, float] = {
    torch.float64: 8.0,
    torch.float32: 8.0,
    torch.float16: 2.0,
    torch.bfloat16: 2.0,
}


def default_device() -> str:
    """``"cuda"`` when a CUDA or ROCm device is visible (ROCm torch also calls it cuda), else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_device(device: str | torch.device | None, cpu_hint: str = "pass device='cpu'") -> torch.device:
    """``cpu_hint``: how the caller's user asks for the CPU (the command line says ``--device cpu``)."""
    try:
        dev = torch.device(device if device is not None else default_device())
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgument(f"device={device!r} is not a torch device ({exc}); use cpu, cuda or cuda:N (ROCm "
                              f"builds use cuda too)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(
            f"device={str(dev)!r} was requested but torch {torch.__version__} sees no CUDA/ROCm device; "
            f"run on the GPU machine or {cpu_hint}"
        )
    if dev.type == "meta":
        raise InvalidArgument(f"device={str(dev)!r} holds shapes, not values, so there are no numbers to compare; "
                              f"use cpu, cuda or cuda:N (ROCm builds use cuda too)")
    if dev.type not in ("cpu", "cuda"):
        problem = _backend_problem(dev)
        if problem is not None:
            rocm = " (ROCm builds name their GPUs cuda)" if dev.type == "hip" else ""
            raise BackendUnavailable(
                f"device={str(dev)!r} was requested but this torch build ({torch.__version__}) has no usable "
                f"{dev.type} device: {problem}{rocm}; run on a machine whose torch has that backend or {cpu_hint}"
            )
    return dev


def _backend_problem(dev: torch.device) -> str | None:
    """Why no tensor can live on ``dev`` (mps, xpu, ...), or None when one can."""
    module = getattr(torch, dev.type, None)
    is_available = getattr(module, "is_available", None)
    if callable(is_available) and not is_available():
        return f"torch.{dev.type}.is_available() is False"
    try:
        torch.empty(1, device=dev)
    # each missing backend fails in its own way: NotImplementedError (mps, xla), AssertionError (xpu),
    # RuntimeError (an index past the devices), ModuleNotFoundError (hpu)
    except Exception as exc:  # noqa: BLE001
        text = str(exc).strip()
        return text.splitlines()[0].split(". ")[0][:200] if text else type(exc).__name__
    return None


# --------------------------------------------------------------------------- error model


@dataclass(frozen=True)
class ErrorModel:
    """How far from the float64 truth a correct kernel may land; the ``dtype_policy`` argument.

    Leave a field at ``None`` for the per-dtype default.  ``magnitude`` maps the
    float64 arguments to the per-element size of the terms (see ``OpArgs``).
    """

    ulps: float | None = None
    inter: float = 2.0
    acc: float = 4.0
    reduction_length: int | None = None
    magnitude: Callable[..., Any] | None = None
    atol: float = 0.0
    rtol: float = 0.0
    allow_flush_to_zero: bool = True
    equal_nan: bool = True
    tf32: bool | None = None

    def __post_init__(self) -> None:
        for name in ("ulps", "inter", "acc", "atol", "rtol"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0 or math.isnan(value)):
                raise InvalidArgument(f"ErrorModel({name}={value!r}) must be a non-negative number")
        if self.reduction_length is not None and self.reduction_length < 1:
            raise InvalidArgument(f"ErrorModel(reduction_length={self.reduction_length!r}) must be >= 1")

    def describe(self, dtype: torch.dtype | None, k: int, tf32: bool, recorded: bool = False) -> str:
        """The tolerance in words; ``recorded``: judged against an op golden, whose per-element scale
        was stored when it was recorded (the op's magnitude then, whichever rule made it)."""
        if dtype is None or dtype not in _PRECISION:
            return "exact equality (integer or boolean output)"
        p, _ = _PRECISION[dtype]
        ulps = self.ulps if self.ulps is not None else _DEFAULT_ULPS[dtype]
        u_acc = _accumulation_roundoff(dtype, tf32)
        scale = ("scale (per element, recorded with the golden)" if recorded else
                 "|terms| (op magnitude)" if self.magnitude is not None else "max(|truth|, rms(truth))")
        text = (f"tol = {ulps:g} ulp_{_dname(dtype)}(truth) + ({self.inter:g}*2^-{p} + {self.acc:g}*sqrt(K={k})"
                f"*{u_acc:.3g}) * {scale}")
        if self.allow_flush_to_zero:
            text += f" + tiny ({float(torch.finfo(dtype).tiny):.3g}, flush-to-zero allowed)"
        if self.atol or self.rtol:
            text += f" + {self.atol:g} + {self.rtol:g}*|truth|"
        return text + (" [TF32 on]" if tf32 else "")


def _accumulation_roundoff(dtype: torch.dtype, tf32: bool) -> float:
    if dtype == torch.float64:
        return 2.0**-53
    if dtype == torch.float32 and tf32:
        return 2.0**-11
    return 2.0**-24


def _tf32_enabled(device: torch.device) -> bool:
    """Whether float32 matmuls on ``device`` may run in TF32 (10-bit mantissa)."""
    if device.type != "cuda":
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
        if precision in ("tf32",):
            return True
        return bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False))




# --------------------------------------------------------------------------- records


class _OkAlias:
    """``ok``: the name the pass flag had before ``passed``, which every other result uses."""

    passed: bool

    @property
    def ok(self) -> bool:
        return self.passed

    @ok.setter
    def ok(self, value: bool) -> None:
        self.passed = value


@dataclass
class OutputRecord(_OkAlias):
    """The verdict for one output tensor (``out``, ``out[0]``, ``out['k']``)."""

    path: str
    passed: bool
    shape: tuple[int, ...]
    dtype: str
    judged_as: str
    numel: int = 0
    mismatches: int = 0
    max_abs_err: float = 0.0
    max_ratio: float = 0.0
    worst_index: tuple[int, ...] | None = None
    worst_candidate: float | None = None
    worst_truth: float | None = None
    worst_tol: float | None = None
    reason: str = ""


@dataclass
class OpResult(_OkAlias):
    """One candidate-versus-truth comparison; ``message()`` is the only place failure text is built."""

    passed: bool
    candidate: str
    reference: str
    device: str
    outputs: list[OutputRecord] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    reduction_length: int = 1
    model: str = ""
    error: str | None = None
    reproduction: str = ""
    reference_error: str | None = None
    # what the candidate raised, for compare_op's failure to chain (its traceback points into the kernel)
    raised: BaseException | None = field(default=None, repr=False, compare=False)
    # what the reader needs to weigh the verdict (Triton's interpreter at bfloat16)
    notes: list[str] = field(default_factory=list)

    @property
    def max_ratio(self) -> float:
        """Worst error/tolerance over all outputs (>1 fails); the 'minimum tolerance needed' factor."""
        return max((o.max_ratio for o in self.outputs), default=0.0)

    def summary(self) -> str:
        if self.error:
            return f"{self.candidate} on {self.device}: raised {self.error.splitlines()[0]}"
        verdict = "ok" if self.passed else "MISMATCH"
        return f"{self.candidate} on {self.device}: {verdict}, worst err/tol {self.max_ratio:.3g}"

    def message(self) -> str:
        return _build_message(self)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(replace(self, raised=None))
        data.pop("raised")   # an exception object, not data
        data["ok"] = self.passed
        data["max_ratio"] = self.max_ratio
        return data


def _build_message(result: OpResult) -> str:
    """Format a failing ``OpResult``: header, per-output stats, inputs, model, reproduction."""
    lines: list[str] = []
    if result.error:
        lines.append(f"Candidate {result.candidate} raised on {result.device}: {result.error}")
    else:
        bad = [o for o in result.outputs if not o.passed]
        returned = any(o.path.startswith("out") for o in result.outputs)
        if bad and all(o.judged_as == "written" for o in bad):
            lines.append(f"Operator writes into its inputs! ({len(bad)} argument(s) the reference leaves unchanged)")
        else:
            lines.append(f"Operator outputs are not close to the float64 truth! "
                         f"({len(bad)} of {len(result.outputs)} output(s) off)")
        for o in result.outputs:
            if o.passed:
                continue
            if o.judged_as in ("structure", "written"):
                lines.append(f"  {o.path}: {o.reason}")
                continue
            written = ("" if o.path.startswith("out") else " (an argument both functions write)" if returned
                       else " (an argument both functions write; they returned None)")
            lines.append(f"  {o.path}{written}: shape {list(o.shape)}, {o.dtype}"
                         + (f" judged as {o.judged_as}" if o.judged_as != "shape" else ""))
            if o.reason:
                lines.append(f"    {o.reason}")
            if o.numel and o.judged_as != "shape":
                pct = 100.0 * o.mismatches / o.numel
                lines.append(f"    Mismatched elements: {o.mismatches} / {o.numel} ({pct:.1f}%)")
            if o.worst_index is not None:
                lines.append(f"    Greatest error/tolerance: {o.max_ratio:.3g} at index {o.worst_index}: "
                             f"candidate {o.worst_candidate!r}, truth {o.worst_truth!r}, tol {o.worst_tol:.3g}")
                special = not all(math.isfinite(v) for v in (o.worst_candidate or 0.0, o.worst_truth or 0.0))
                lines.append(f"    Greatest absolute difference{' among finite elements' if special else ''}: "
                             f"{o.max_abs_err:.6g}")
        worst = _worst_seen()
        if worst is not None and worst.ratio > result.max_ratio:
            lines.append(f"Worst seen in this search: err/tol {worst.ratio:.3g} with {worst.where}; Hypothesis "
                         f"reports the smallest failing example it shrank to, not the worst "
                         f"(err/tol {result.max_ratio:.3g} here)")
            if worst.reproduction:
                lines.append("  Reproduce the worst seen:")
                lines.extend(f"    {line}" for line in worst.reproduction.splitlines())
    lines.extend(f"Note: {note}" for note in result.notes)
    lines.append(f"Candidate: {result.candidate} on {result.device}; truth: {result.reference} in float64 on cpu")
    lines.append(_model_line(result))
    lines.append("Inputs:")
    lines.extend(f"  {text}" for text in result.inputs)
    if result.reproduction:
        lines.append("Reproduce:")
        lines.extend(f"  {line}" for line in result.reproduction.splitlines())
    database = _hypothesis_database()
    if database is not None:
        lines.append(f"Hypothesis keeps this failing example in its database ({database}) and replays it first "
                     "on the next run; settings(print_blob=True) prints a @reproduce_failure line.")
    return "\n".join(lines)


# said by a failing bfloat16 operator check (here) and model check (api.ladder_notes) under the interpreter
INTERPRETER_BF16 = ("TRITON_INTERPRET=1: a Triton kernel here runs in Triton's interpreter, which rounds float32 to "
                    "bfloat16 by truncation and computes bfloat16 arithmetic wrongly, so a correct kernel can fail at "
                    "bfloat16; judge it at float32 here, and at bfloat16 on a GPU")
INTERPRETER_BF16_NOTE = f"{INTERPRETER_BF16} (docs/fuzzing.md)"


def _note_interpreter(result: OpResult) -> None:
    """Add the interpreter's bfloat16 caveat to a mismatch judged at bfloat16 under TRITON_INTERPRET=1.

    Why: the interpreter computes bfloat16 wrongly (1 + 1 gives 1.7e38 in a bf16 accumulator), so such a
    failure reads as a kernel bug that a GPU would not show. Float16 is left out: the interpreter
    computes and rounds it as a GPU does. The text is the model check's (api.ladder_notes)."""
    if os.environ.get("TRITON_INTERPRET") != "1" or result.passed or result.error:
        return
    if any(not o.passed and o.judged_as == "bfloat16" for o in result.outputs):
        result.notes.append(INTERPRETER_BF16_NOTE)


def _model_line(result: OpResult) -> str:
    """The "Error model:" line: the tolerance where a floating value was or would have been judged, else
    what was compared instead."""
    unmatched = [o for o in result.outputs if o.judged_as in ("shape", "structure")]
    floating = [o for o in result.outputs
                if o.judged_as in _PRECISION_NAMES or (o.judged_as == "shape" and o.dtype in _PRECISION_NAMES)]
    if result.error or floating:
        its = "its" if len(unmatched) == 1 else "their"
        note = (f" (not applied to {', '.join(o.path for o in unmatched)}: {its} shape or structure differs from "
                f"the truth's, so no value there was compared)") if unmatched else ""
        return f"Error model: {result.model}{note}"
    if any(o.judged_as == "exact" for o in result.outputs):
        return "Error model: exact (no floating output: integer, bool and other values must match)"
    return ("Error model: not applied: no output has the truth's shape and structure, so no value was compared")


def _under_hypothesis() -> bool:
    """Whether a Hypothesis test is running this comparison (not a reproduction script, not a plain test)."""
    hyp = sys.modules.get("hypothesis")
    try:
        return bool(hyp is not None and hyp.currently_in_test_context())
    except Exception:   # an older Hypothesis without the function
        return False


def _hypothesis_database() -> str | None:
    """Where the running Hypothesis test saves failing examples, or None where it saves none
    (``database=None``, ``derandomize=True``) or no Hypothesis test runs this comparison."""
    if not _under_hypothesis():
        return None
    from hypothesis import settings

    database = settings.default.database   # inside a test: the settings that test runs with
    if database is None:
        return None
    path = getattr(database, "path", None)
    if path is None:
        return type(database).__name__
    try:
        return str(Path(path).resolve().relative_to(Path.cwd())) + os.sep
    except ValueError:
        return str(path) + os.sep


@dataclass
class _Worst:
    """The worst err/tol one Hypothesis run has seen; ``run``: that run's random generator, its identity."""

    run: Any
    ratio: float
    where: str
    reproduction: str = ""


# per Hypothesis test function; a test shrinks a failure to its smallest input, which for an error that
# grows with the input (an accumulation in bf16) sits just over the threshold: the threshold problem,
# https://github.com/HypothesisWorks/hypothesis/issues/2180
_WORST: weakref.WeakKeyDictionary[Any, _Worst] = weakref.WeakKeyDictionary()


def _search_context() -> tuple[Any, Any] | None:
    """(the Hypothesis test function, its run) when a Hypothesis test runs this comparison, else None."""
    if not _under_hypothesis():
        return None
    from hypothesis.control import current_build_context

    context = current_build_context()
    test = getattr(context, "wrapped_test", None)
    if test is None:
        return None
    return test, getattr(context.data, "_random", None)


def _observe_search(result: OpResult, named: Sequence[tuple[str, Any]], reproduce: Callable[[Path], str]) -> None:
    """Under Hypothesis: keep the worst err/tol of this run, with its inputs' shapes and, where it fails,
    its reproduction, for the message: shrinking ends at the smallest failing example, not the worst.

    The reproduction's tensors too large to print go to a file in the temp dir, one per test, since
    Hypothesis keeps only the shrunk example.  Not ``hypothesis.target``: its optimiser keeps running
    failing examples after the first, which lengthens a failing search (docs/fuzzing.md)."""
    found = _search_context()
    if found is None or result.error or not result.outputs:
        return
    test, run = found
    try:
        worst = _WORST.get(test)
        if worst is not None and worst.run is run and worst.ratio >= result.max_ratio:
            return
        where = "; ".join(f"{label}: {_short(v)}" for label, v in named if isinstance(v, torch.Tensor))
        script = ""
        if not result.passed:
            try:
                script = reproduce(_worst_file(test))
            except OSError:   # no temp dir to write to: the script without the large tensors
                script = result.reproduction
        _WORST[test] = _Worst(run, result.max_ratio, f"{result.candidate}({where})", script)
    except TypeError:   # a test object that takes no weak reference: no worst kept
        pass


def _worst_file(test: Any) -> Path:
    """Where the worst example of ``test`` keeps its large tensors: named by the test and this process,
    so parallel workers and other tests do not overwrite it."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{getattr(test, '__module__', '')}.{getattr(test, '__qualname__', 'test')}")
    return Path(tempfile.gettempdir()) / "rocm-parity-worst" / f"{name[-120:]}-{os.getpid()}.safetensors"


def _worst_seen() -> _Worst | None:
    """The worst err/tol the running Hypothesis test has seen in this run."""
    found = _search_context()
    if found is None:
        return None
    try:
        worst = _WORST.get(found[0])
    except TypeError:
        return None
    return worst if worst is not None and worst.run is found[1] else None


def _raise(result: OpResult) -> None:
    __tracebackhide__ = True
    raise AssertionError(result.message()) from result.raised


# --------------------------------------------------------------------------- describing inputs


def _storage_span(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return int(t.storage_offset() + 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())))


def _tensor_literal(t: torch.Tensor) -> str:
    t = t.detach().cpu()
    span = _storage_span(t)
    flat = t.as_strided((span,), (1,), 0) if span else t.reshape(0)
    if t.dtype.is_floating_point:
        vals = [float(v) for v in flat.to(torch.float64)]
        body = "[" + ", ".join(repr(v) if math.isfinite(v) else f"float({str(v)!r})" for v in vals) + "]"
    else:
        body = repr(flat.tolist())
    text = f"torch.tensor({body}, dtype=torch.{_dname(t.dtype)})"
    if t.is_contiguous() and t.storage_offset() == 0:
        return text + (f".view({tuple(t.shape)})" if t.dim() != 1 else "")
    return text + f".as_strided({tuple(t.shape)}, {tuple(t.stride())}, {t.storage_offset()})"


# public namespaces where torch's builtins are reached by name (their __module__/__qualname__ name a private class)
_TORCH_NAMESPACES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft")
_PLAIN = (int, float, bool, str, type(None))


def _resolve(module: str, path: str) -> Any:
    """``module.path`` from a module already imported (never imports: formatting a message must not run
    a module's import-time code); raises LookupError when it does not resolve."""
    obj: Any = sys.modules.get(module)
    if obj is None:
        raise LookupError(module)
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LookupError(path) from None
    return obj


def _callable_expr(fn: Any) -> tuple[set[str], str] | None:
    """(modules to import, an expression naming ``fn``) that a fresh interpreter can run, or None for a
    lambda, a local function, a bound method, a module instance or a function defined in ``__main__``."""
    if isinstance(fn, functools.partial):
        inner = _callable_expr(fn.func)
        values = [*fn.args, *fn.keywords.values()]
        if inner is None or not all(isinstance(v, _PLAIN) and not (isinstance(v, float) and not math.isfinite(v))
                                    for v in values):
            return None
        parts = [inner[1], *map(repr, fn.args), *(f"{k}={v!r}" for k, v in fn.keywords.items())]
        return inner[0] | {"functools"}, f"functools.partial({', '.join(parts)})"
    op = _operator(fn)
    if op is not None:
        module = _registering_module(op[0], fn)
        if module == "__main__":
            return None
        return {"torch"} | ({module} if module else set()), f"torch.ops.{op[0].replace('::', '.')}{op[1]}"
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    name = getattr(fn, "__name__", None)
    tries: list[tuple[str, str]] = []
    if isinstance(module, str) and isinstance(qual, str) and module != "__main__" and "<" not in qual:
        tries.append((module, qual))
    if isinstance(name, str):
        public = [(ns, name) for ns in _TORCH_NAMESPACES] + [("torch", f"Tensor.{name}")]
        # a builtin whose own module is private (torch._C._nn) is written by its public name
        private = bool(tries) and any(part.startswith("_") for part in tries[0][0].split("."))
        tries = public + tries if private else tries + public
    for mod, path in tries:
        try:
            if _resolve(mod, path) is fn:
                return {mod}, f"{mod}.{path}"
        except LookupError:
            continue
    return None


def _custom_op_type() -> Any:
    """torch.library's ``CustomOpDef`` (what ``@torch.library.custom_op`` returns), where torch has it."""
    try:
        from torch._library.custom_ops import CustomOpDef
    except ImportError:
        return None
    return CustomOpDef


def _operator(fn: Any) -> tuple[str, str] | None:
    """(``ns::name``, ``""`` or ``".overload"``) of a torch operator (an ``OpOverloadPacket``, an
    ``OpOverload``) or a ``torch.library`` custom op, else None."""
    custom = _custom_op_type()
    if custom is not None and isinstance(fn, custom):
        return str(fn._qualname), ""
    if isinstance(fn, torch._ops.OpOverloadPacket):
        return str(fn._qualified_op_name), ""
    if isinstance(fn, torch._ops.OpOverload):
        return str(fn.overloadpacket._qualified_op_name), f".{fn._overloadname}"
    return None


# namespaces whose operators exist once torch is imported
_TORCH_OP_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_quantized", "c10d", "_c10d_functional",
                                  "mkldnn", "onednn", "sparse", "profiler", "inductor", "higher_order",
                                  "rngprims", "debugprims", "quantized_decomposed"})


def _registering_module(qualname: str, fn: Any) -> str | None:
    """The Python module whose import registers the operator ``qualname`` (a ``torch.library.custom_op``'s
    decorated function's module, or the module holding the ``torch.library.Library`` that defines it), or
    None where none is known (torch's own operators, a C++ extension's)."""
    custom = _custom_op_type()
    from torch._library import custom_ops

    is_definition = custom is not None and isinstance(fn, custom)
    definition = fn if is_definition else getattr(custom_ops, "OPDEFS", {}).get(qualname)
    init = getattr(definition, "_init_fn", None)
    module = getattr(init, "__module__", None)
    if isinstance(module, str):
        return module
    library_type = torch.library.Library
    for name, mod in list(sys.modules.items()):
        for value in list(getattr(mod, "__dict__", {}).values()):
            # type(), not isinstance(): a deprecation shim warns when its __class__ is read
            if issubclass(type(value), library_type) and qualname in getattr(value, "_op_defs", ()):
                return name
    return None


def _assignment(name: str, fn: Any, imports: set[str]) -> str:
    """``name = <expression>``, adding the modules it needs to ``imports``; a placeholder the user fills
    where ``fn`` cannot be named from a fresh interpreter."""
    found = _callable_expr(fn)
    if found is None:
        return (f"{name} = ...  # {_qualname(fn)} is not importable (a lambda, local function, bound method or "
                f"object, or defined in __main__): assign it here")
    imports |= found[0]
    op = _operator(fn)
    if op is not None and found[0] == {"torch"} and op[0].split("::")[0] not in _TORCH_OP_NAMESPACES:
        return f"{name} = {found[1]}  # import the module that registers {op[0]} above this line"
    return f"{name} = {found[1]}"


def _model_expr(model: ErrorModel, imports: set[str], notes: list[str]) -> str:
    """``ErrorModel(...)`` with the fields that differ from the defaults (the case's K and magnitude)."""
    default = ErrorModel()
    parts: list[str] = []
    for f in fields(ErrorModel):
        value = getattr(model, f.name)
        if value == getattr(default, f.name):
            continue
        if f.name == "magnitude":
            found = _callable_expr(value)
            if found is None:
                notes.append(f"# the error model's magnitude {_qualname(value)} is not importable: pass "
                             f"dtype_policy=ErrorModel(magnitude=...) with it to judge with the same tolerance")
                continue
            imports |= found[0]
            parts.append(f"magnitude={found[1]}")
        else:
            parts.append(f"{f.name}={value!r}")
    return f"ErrorModel({', '.join(parts)})"


def _reproduction(candidate: Callable[..., Any], reference: Callable[..., Any], args: Sequence[Any],
                  kwargs: Mapping[str, Any], device: torch.device, model: ErrorModel,
                  spill: Path | None = None) -> str:
    """A script that runs as pasted: the imports of the modules defining the candidate and the reference,
    the inputs as literals, the two calls, and the ``compare_op`` call that raises this failure again.

    ``spill``: the safetensors file to write the tensors too large to print into, which the script
    loads; by default one _spill_file names. Where it cannot be written they are elided."""
    imports: set[str] = {"torch"}
    # a line, or for a spilled tensor (the line that loads it, the line that elides it), chosen once written
    lines: list[str | tuple[str, str]] = []
    spilled: dict[str, torch.Tensor] = {}

    head = [_assignment("candidate", candidate, imports), _assignment("reference", reference, imports)]

    tensor_names: dict[int, str] = {}

    def literal(value: Any, wrap: Callable[[str, torch.Tensor], str]) -> str:
        """``value`` as source text, each tensor as its variable (printed once, on first sight) through ``wrap``."""
        if isinstance(value, torch.Tensor):
            name = tensor_names.get(id(value))
            if name is None:
                name = tensor_names[id(value)] = f"t{len(tensor_names)}"
                if _storage_span(value) <= _INLINE_LIMIT:
                    lines.append(f"{name} = {_tensor_literal(value)}")
                else:
                    t = value.detach().cpu()
                    span = _storage_span(t)
                    spilled[name] = t.as_strided((span,), (1,), 0).clone() if span else torch.empty(0, dtype=t.dtype)
                    lines.append((f"{name} = load_file({_SPILL_TOKEN})[{name!r}].as_strided({tuple(t.shape)}, "
                                  f"{tuple(t.stride())}, {t.storage_offset()})  # {describe_value(value)}",
                                  f"{name} = ...  # {describe_value(value)}"))
            return wrap(name, value)
        if isinstance(value, (list, tuple)):
            inner = ", ".join(literal(v, wrap) for v in value)
            return f"({inner}{',' if len(value) == 1 else ''})" if isinstance(value, tuple) else f"[{inner}]"
        if isinstance(value, torch.dtype):
            return f"torch.{_dname(value)}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"float({str(value)!r})"
        return repr(value)

    def call(wrap: Callable[[str, torch.Tensor], str]) -> str:
        return ", ".join([literal(a, wrap) for a in args] + [f"{k}={literal(v, wrap)}" for k, v in kwargs.items()])

    dev = str(device)
    joined = call(lambda name, t: name)
    out_args = call(lambda name, t: f"place({name}, {dev!r})")
    truth_args = call(lambda name, t: f"{name}.double()" if t.dtype.is_floating_point else name)
    notes: list[str] = []
    model_text = _model_expr(model, imports, notes)
    policy = "" if model_text == "ErrorModel()" else f", dtype_policy={model_text}"
    written = None
    if spilled:
        from safetensors.torch import save_file

        written = spill if spill is not None else _spill_file(spilled)
        try:
            written.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(written, lambda p: save_file(spilled, str(p)))
        except OSError:   # no temp dir to write to: the script without the large tensors
            written = None
    too_big = [name for name in spilled if written is None]
    shown = [line if isinstance(line, str) else
             line[0].replace(_SPILL_TOKEN, repr(str(written))) if written is not None else line[1] for line in lines]
    script = [f"# torch {torch.__version__}, candidate device {dev}", *_variables(),
              *(f"import {m}" for m in sorted(imports)),
              "from pytest_rocm_parity.fuzz.harness import ErrorModel, compare_op, place",
              *(["from safetensors.torch import load_file"] if written is not None else []),
              *head, *shown,
              f"out = candidate({out_args})",
              f"truth = reference({truth_args})  # the float64 truth, on the CPU",
              *notes,
              f"compare_op(candidate, reference, {joined}{', ' if joined else ''}device={dev!r}{policy})"
              "  # raises this failure"]
    if too_big:
        script.append(f"# {', '.join(too_big)} too large to print and not written (no temp dir): replay the "
                      f"Hypothesis example or record a golden")
    return "\n".join(script)


_SPILL_TOKEN = "\x00spill\x00"   # where a reproduction's line names its spill file, known once written


def _spill_file(spilled: Mapping[str, torch.Tensor]) -> Path:
    """Where a reproduction's tensors too large to print go: under a Hypothesis test one file per test
    and process, which each failing example rewrites (the last is the shrunk one Hypothesis reports);
    elsewhere a file named by the tensors' contents, so that two failures never share one."""
    found = _search_context()
    if found is not None:
        worst = _worst_file(found[0])
        return worst.with_name(f"{worst.stem}-example.safetensors")
    digest = hashlib.sha256()
    for name, t in sorted(spilled.items()):
        digest.update(f"{name}:{t.dtype}:{t.numel()};".encode())
        digest.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return Path(tempfile.gettempdir()) / "rocm-parity-repro" / f"{digest.hexdigest()[:16]}.safetensors"


# variables read when a kernel library is imported, which the failing process had: a pasted script
# without them runs other code (Triton without its interpreter finds no GPU on a CPU machine)
_REPRO_ENV = ("TRITON_INTERPRET",)


def _variables() -> list[str]:
    """The lines that set, before any import, the variables of _REPRO_ENV this process has."""
    found = [(k, os.environ[k]) for k in _REPRO_ENV if os.environ.get(k)]
    return ["import os", *(f"os.environ[{k!r}] = {v!r}" for k, v in found)] if found else []


def _qualname(fn: Callable[..., Any]) -> str:
    """The name messages, results and golden manifests give ``fn``: ``module.qualname``, a
    ``functools.partial`` as its function with the bound arguments (``mod.f(scale=1.01)``), an object by
    its class; never a memory address, which differs between runs and says nothing to the reader."""
    if isinstance(fn, functools.partial):
        bound = [*map(_bound_value, fn.args), *(f"{k}={_bound_value(v)}" for k, v in fn.keywords.items())]
        return f"{_qualname(fn.func)}({', '.join(bound)})"
    op = _operator(fn)
    if op is not None:   # torch's own spelling: mylib::rms_norm, aten::add.Tensor
        return op[0] + ("" if op[1] == ".default" else op[1])
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    # an instance (an nn.Module, a callable object) has no name of its own: its class names it
    module = getattr(fn if isinstance(name, str) else type(fn), "__module__", None) or ""
    if not isinstance(name, str):
        name = _instance_text(fn)
    return f"{module}.{name}" if module and module not in ("builtins", "__main__") else name


def _instance_text(obj: Any) -> str:
    """``obj``'s repr where it is one short line without an address (``RMSNorm((16,), eps=1e-06)``), else its
    class with the contents elided (``Sequential(...)``): a message line names the object, not its state."""
    text = repr(obj)
    if "\n" in text or " at 0x" in text or len(text) > 80:
        return f"{type(obj).__qualname__}(...)"
    return text


def _bound_value(value: Any) -> str:
    """A partial's bound argument in its name: a tensor by dtype and shape, a callable by its name."""
    if isinstance(value, torch.Tensor):
        return _short(value)
    if callable(value) and not isinstance(value, type):
        return _qualname(value)
    return _instance_text(value)


# --------------------------------------------------------------------------- moving inputs


def place(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """Copy ``t`` to ``device`` keeping its exact strides and storage offset.

    ``Tensor.to`` densifies non-dense views (``x[..., ::2]``), which would hide exactly
    the stride bugs the fuzzer looks for; this copies the storage span instead.
    """
    device = torch.device(device)
    if t.numel() == 0:
        return torch.empty(t.shape, dtype=t.dtype, device=device)
    span = _storage_span(t)
    if any(st < 0 for st in t.stride()):  # pragma: no cover - torch does not make negative strides
        return t.detach().to(device, copy=True)
    flat = t.detach().as_strided((span,), (1,), 0).to(device, copy=True)
    return flat.as_strided(tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _grad_mode() -> torch.autograd.grad_mode.enable_grad:
    """Grad mode on around the functions compared, whatever the caller's mode: a gradient wrapper
    (``torch.autograd.grad`` of a forward) needs it to differentiate, and the inputs it is given are
    detached copies, so a forward-only operator builds no graph and costs nothing more."""
    return torch.enable_grad()


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(_map(v, fn) for v in value)
    if isinstance(value, list):
        return [_map(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _to_truth_input(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.dtype.is_floating_point:
        return t.to("cpu", torch.float64, copy=True)
    return t.to("cpu", copy=True)


def _flatten(value: Any, path: str = "out") -> Iterator[tuple[str, Any]]:
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (int, float, bool)):
        yield path, value
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _flatten(v, f"{path}[{i}]")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flatten(v, f"{path}[{k!r}]")
    else:
        yield path, value


def _input_dtypes(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[torch.dtype]:
    found: list[torch.dtype] = []
    _map((tuple(args), dict(kwargs)),
         lambda t: found.append(t.dtype) if t.dtype.is_floating_point else None)
    return found


def _lowest(dtypes: Sequence[torch.dtype]) -> torch.dtype | None:
    known = [d for d in dtypes if d in _PRECISION]
    if not known:
        return None
    # bfloat16 has fewer mantissa bits than float16; the judged precision is the worst one
    return min(known, key=lambda d: _PRECISION[d][0])


def _default_k(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """Without a hint, assume the longest dimension of any input is reduced (conservative)."""
    sizes: list[int] = [1]
    _map((tuple(args), dict(kwargs)), lambda t: sizes.extend(int(s) for s in t.shape))
    return max(sizes)


# --------------------------------------------------------------------------- judging


def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    p, emin = _PRECISION[dtype]
    mag = x.abs().clamp_min(2.0**emin)
    exp = torch.floor(torch.log2(mag)).clamp_min(emin)
    return torch.pow(2.0, exp - (p - 1))


def _verdict(c: torch.Tensor, t: torch.Tensor, scale: Any, model: ErrorModel, judged: torch.dtype, k: int,
             tf32: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Elementwise (ok, err/tol, tol) of candidate ``c`` against truth ``t``, both float64."""
    p, _ = _PRECISION[judged]
    info = torch.finfo(judged)
    ulps = model.ulps if model.ulps is not None else _DEFAULT_ULPS[judged]
    u_acc = _accumulation_roundoff(judged, tf32)
    t_fin = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    if scale is None:
        rms = float(t_fin.pow(2).mean().sqrt())
        s = t_fin.abs().clamp_min(rms)
    else:
        s = torch.broadcast_to(torch.as_tensor(scale, dtype=torch.float64).detach().cpu(), t.shape).abs()
        s = torch.where(torch.isfinite(s), s, torch.zeros_like(s))
    coef = model.inter * 2.0**-p + model.acc * math.sqrt(k) * u_acc
    tol = ulps * _ulp(t_fin, judged) + coef * s + model.atol + model.rtol * t_fin.abs()
    tol = tol + (float(info.tiny) if model.allow_flush_to_zero else float(info.tiny) * 2.0 ** -(p - 1))
    err = (c - t).abs()
    within = err <= tol
    # the truth itself overflows the dtype: a correct kernel returns inf of the same sign
    limit = float(info.max) + 0.5 * float(_ulp(torch.tensor(float(info.max), dtype=torch.float64), judged))
    overflow = torch.isfinite(t) & (t.abs() >= limit) & torch.isinf(c) & (torch.sign(c) == torch.sign(t))
    special = ~torch.isfinite(t)
    same_special = (c == t) | (torch.isnan(c) & torch.isnan(t) & model.equal_nan)
    ok = torch.where(special, same_special, within | overflow)
    ratio = torch.nan_to_num(err / tol, nan=math.inf, posinf=math.inf)
    ratio = torch.where(ok, torch.where(within, ratio, torch.zeros_like(ratio)),
                        ratio.clamp_min(math.nextafter(1.0, 2.0)))
    return ok, ratio, tol


def _judge(path: str, cand: Any, truth: Any, scale: Any, model: ErrorModel, judged: torch.dtype | None,
           k: int, tf32: bool, alternative: tuple[Any, Any] | None = None) -> OutputRecord:
    if not isinstance(truth, torch.Tensor) or not isinstance(cand, torch.Tensor):
        if isinstance(cand, torch.Tensor) or isinstance(truth, torch.Tensor) or type(cand) is not type(truth):
            return OutputRecord(path, False, (), type(cand).__name__, "structure",
                                reason=f"candidate returned {_short(cand)}; truth {_short(truth)}")
        same = cand == truth or (isinstance(cand, float) and math.isnan(cand) and math.isnan(truth))
        return OutputRecord(path, bool(same), (), type(cand).__name__, "exact",
                            reason="" if same else f"candidate {_short(cand)} != truth {_short(truth)}")
    shape = tuple(cand.shape)
    rec = OutputRecord(path, True, shape, _dname(cand.dtype), "exact", numel=cand.numel())
    if tuple(truth.shape) != shape:
        rec.passed = False
        rec.reason = f"shape {list(shape)} but the truth has shape {list(truth.shape)}"
        rec.judged_as = "shape"
        return rec
    c = cand.detach().to("cpu", torch.float64)
    t = truth.detach().to("cpu", torch.float64)
    if judged is None:
        diff = ~((c == t) | (torch.isnan(c) & torch.isnan(t)))
        rec.mismatches = int(diff.sum())
        rec.passed = rec.mismatches == 0
        if not rec.passed:
            idx = tuple(int(i) for i in diff.nonzero()[0])
            rec.worst_index, rec.worst_candidate, rec.worst_truth = idx, float(c[idx]), float(t[idx])
            rec.worst_tol, rec.max_ratio = 0.0, math.inf
            rec.max_abs_err = float((c - t).abs().max())
        return rec
    rec.judged_as = _dname(judged)
    if c.numel() == 0:
        return rec
    ok, ratio, tol = _verdict(c, t, scale, model, judged, k, tf32)
    if alternative is not None and isinstance(alternative[0], torch.Tensor):
        # flush-to-zero: a kernel may treat subnormal inputs as zero; judge against that truth too
        t2 = alternative[0].detach().to("cpu", torch.float64)
        ok2, ratio2, _ = _verdict(c, t2, alternative[1], model, judged, k, tf32)
        ok, ratio = ok | ok2, torch.minimum(ratio, ratio2)
    rec.mismatches = int((~ok).sum())
    rec.passed = rec.mismatches == 0
    flat_idx = int(torch.argmax(ratio.flatten()))
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_idx), t.shape))
    rec.max_ratio = float(ratio.flatten()[flat_idx])
    rec.worst_index = idx
    rec.worst_candidate = float(c.flatten()[flat_idx])
    rec.worst_truth = float(t.flatten()[flat_idx])
    rec.worst_tol = float(tol.flatten()[flat_idx])
    err = (c - t).abs()
    finite_err = err[torch.isfinite(err)]
    rec.max_abs_err = float(finite_err.max()) if finite_err.numel() else math.inf
    if not rec.passed:
        rec.reason = _special_reason(c, t, ok)
    return rec


def _special_reason(c: torch.Tensor, t: torch.Tensor, ok: torch.Tensor) -> str:
    """What the failing NaN/inf elements did: a NaN/inf the kernel made, or one of the truth it lost."""
    reasons = []
    made = ~ok & torch.isfinite(t) & ~torch.isfinite(c)
    if bool(made.any()):
        reasons.append(f"candidate produced NaN/inf where the truth is finite at {_count(made)} (overflow or 0/0 "
                       f"in the kernel?)")
    lost = ~ok & ~torch.isfinite(t)
    if bool(lost.any()):
        idx = tuple(int(i) for i in lost.nonzero()[0])
        reasons.append(f"candidate returned another value where the truth is NaN/inf at {_count(lost)} (first at "
                       f"index {idx}: candidate {float(c[idx])!r}, truth {float(t[idx])!r}): the kernel lost a "
                       f"NaN/inf of its inputs (a nan_to_num, clamp, masked max or where() that drops it?)")
    return "; ".join(reasons)


def _count(mask: torch.Tensor) -> str:
    n = int(mask.sum())
    return f"{n} element{'s' if n != 1 else ''}"


def _short(value: Any) -> str:
    """One line naming ``value``: a tensor's dtype and shape, never its elements."""
    if isinstance(value, torch.Tensor):
        return f"{_dname(value.dtype)}{list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _judge_outputs(result: OpResult, cand_out: Any, truth_out: Any, scale_out: Any, model: ErrorModel,
                   in_dtypes: Sequence[torch.dtype], k: int, tf32: bool,
                   alternative: tuple[Any, Any] | None = None) -> None:
    cand_leaves = list(_flatten(cand_out))
    truth_leaves = list(_flatten(truth_out))
    if [p for p, _ in cand_leaves] != [p for p, _ in truth_leaves]:
        result.outputs.append(OutputRecord(
            "out", False, (), "", "structure",
            reason=f"candidate returned {[p for p, _ in cand_leaves]} but the truth {[p for p, _ in truth_leaves]}"))
        result.passed = False
        return
    scales = _leaves_like(truth_leaves, scale_out)
    alt_truths = _leaves_like(truth_leaves, alternative[0]) if alternative else {}
    alt_scales = _leaves_like(truth_leaves, alternative[1]) if alternative else {}
    for (path, c), (_, t) in zip(cand_leaves, truth_leaves):
        judged = None
        alt = (alt_truths[path], alt_scales.get(path)) if path in alt_truths else None
        if type(c) is float and type(t) is float:
            # a Python float (``.item()``) was computed in the inputs' precision: judge it as a 0-dim tensor
            record = _judge(path, _as_float64(c), _as_float64(t), scales.get(path), model,
                            _lowest(in_dtypes) or torch.float64, k, tf32,
                            (_as_float64(alt[0]), alt[1]) if alt is not None else None)
            record.dtype = "float"
            result.outputs.append(record)
            continue
        if isinstance(c, torch.Tensor):
            judged = _judged_dtype(c, in_dtypes)
        result.outputs.append(_judge(path, c, t, scales.get(path), model, judged, k, tf32, alt))
    result.passed = all(o.passed for o in result.outputs)


def _judge_output_dtypes(result: OpResult, cand_out: Any, reference: Callable[..., Any], args: Sequence[Any],
                         kwargs: Mapping[str, Any]) -> None:
    """Fail a floating output the candidate returns in another dtype than the reference does on the
    same inputs (a kernel that allocates its output as float16 whatever it is given): its values may
    pass at the lower precision, yet every caller gets another tensor. The reference runs once more,
    on the CPU in the inputs' own dtypes; where it cannot (a dtype the CPU lacks), nothing is judged."""
    try:
        with _grad_mode():
            # copies: an in-place reference would otherwise write into the caller's own tensors
            native = reference(*_map(tuple(args), lambda t: t.detach().to("cpu", copy=True)),
                               **_map(dict(kwargs), lambda t: t.detach().to("cpu", copy=True)))
    except Exception:
        return
    want = {p: v.dtype for p, v in _flatten(native) if isinstance(v, torch.Tensor) and v.dtype.is_floating_point}
    given = dict(_flatten(cand_out))
    for record in result.outputs:
        got = given.get(record.path)
        if not isinstance(got, torch.Tensor) or record.path not in want or got.dtype == want[record.path]:
            continue
        record.passed = False
        record.reason = (f"dtype {_dname(got.dtype)} where the reference returns {_dname(want[record.path])} on the same "
                         f"inputs: the kernel allocates or casts its output otherwise"
                         + (f"; {record.reason}" if record.reason else ""))
    result.passed = all(o.passed for o in result.outputs)


def _judged_dtype(c: torch.Tensor, in_dtypes: Sequence[torch.dtype]) -> torch.dtype | None:
    """The precision a floating output is judged at: the lowest of its own and the inputs' (an op
    given bf16 inputs that returns float32 is held to bf16); None for an exact output."""
    return _lowest([c.dtype, *in_dtypes]) if c.dtype.is_floating_point else None


def _as_float64(value: Any) -> Any:
    """A Python float as a 0-dim float64 tensor, so the error model can judge it; anything else as is."""
    return torch.tensor(value, dtype=torch.float64) if type(value) is float else value


def _argument_leaves(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """Each tensor among the arguments with its path (``args[0]``, ``args[1][2]``, ``kwargs['out']``)."""
    leaves = [leaf for i, a in enumerate(args) for leaf in _flatten(a, f"args[{i}]")]
    leaves += [leaf for key, v in kwargs.items() for leaf in _flatten(v, f"kwargs[{key!r}]")]
    return [(path, v) for path, v in leaves if isinstance(v, torch.Tensor)]


def _same_values(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether ``after`` (a copy of ``before`` that an op was given) still holds ``before``'s values."""
    if tuple(before.shape) != tuple(after.shape):
        return False
    if not (before.dtype.is_floating_point or after.dtype.is_floating_point):
        return bool(torch.equal(before.detach().cpu(), after.detach().to("cpu", before.dtype)))
    x = before.detach().to("cpu", torch.float64)
    y = after.detach().to("cpu", torch.float64)
    return bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())


def _reference_writes(reference: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> set[str]:
    """Paths of the arguments ``reference`` writes, whatever it writes: a write of the value already
    there (``out`` zeros, the sum of zeros) changes nothing, yet is a result to compare. Read from the
    schemas of the operators it dispatches (``Tensor(a!)``), on float64 copies."""
    from torch.utils._python_dispatch import TorchDispatchMode

    a = _map(tuple(args), _to_truth_input)
    kw = _map(dict(kwargs), _to_truth_input)
    written: set[int] = set()

    class _Writes(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            for i, arg in enumerate(func._schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    value = args[i] if i < len(args) else kwargs.get(arg.name)
                    _map(value, lambda t: written.add(t.untyped_storage().data_ptr()))
            return func(*args, **kwargs)

    with _grad_mode(), _Writes():
        reference(*a, **kw)
    return {path for path, t in _argument_leaves(a, kw)
            if t.numel() and t.untyped_storage().data_ptr() in written}


def _judge_written(result: OpResult, reference: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                   cand_args: Sequence[Any], cand_kwargs: Mapping[str, Any], truth: _Truth, model: ErrorModel,
                   in_dtypes: Sequence[torch.dtype], k: int, tf32: bool) -> None:
    """Both functions returned None: judge the arguments they write (``kernel(x, out)``), each side's own
    copies after its call, with the error model of outputs."""
    given = _argument_leaves(args, kwargs)
    cand = _argument_leaves(cand_args, cand_kwargs)
    ref = _argument_leaves(truth.args, truth.kwargs)
    flushed = _argument_leaves(truth.flushed.args, truth.flushed.kwargs) if truth.flushed is not None else None
    judged = [i for i, (_, t) in enumerate(given) if not (_same_values(t, ref[i][1]) and _same_values(t, cand[i][1]))]
    if not judged:
        writes = _reference_writes(reference, args, kwargs)
        judged = [i for i, (path, _) in enumerate(given) if path in writes]
    if not judged:
        raise InvalidArgument(
            f"compare_op: both {result.candidate} and {result.reference} returned None and changed no argument: "
            f"nothing compared; return the output or pass it as an argument the function writes (a launcher "
            f"kernel(x, out) is judged by the out it fills)")
    one = len(judged) == 1 and isinstance(truth.scale, torch.Tensor)
    for i in judged:
        path, c = cand[i]
        t = ref[i][1]
        scale = truth.scale if one and _broadcasts(truth.scale, t) else None
        alt = None
        if flushed is not None and truth.flushed is not None:
            alt_scale = truth.flushed.scale if one and _broadcasts(truth.flushed.scale, t) else None
            alt = (flushed[i][1], alt_scale)
        result.outputs.append(_judge(path, c, t, scale, model, _judged_dtype(c, in_dtypes), k, tf32, alt))
    result.passed = all(o.passed for o in result.outputs)


def _judge_argument_writes(result: OpResult, candidate: Callable[..., Any], args: Sequence[Any],
                           kwargs: Mapping[str, Any], cand_args: Sequence[Any], cand_kwargs: Mapping[str, Any],
                           truth: _Truth, model: ErrorModel, in_dtypes: Sequence[torch.dtype], k: int, tf32: bool,
                           names: Sequence[str]) -> None:
    """The functions returned their results: fail each argument the candidate wrote that the reference
    left unchanged, and judge one both wrote (an in-place reference) against the reference's copy.

    Why: a kernel that writes its result into an input and returns it (``g.copy_(y); return g``) has
    right outputs, yet overwrites a tensor its caller still holds; judging the returned values alone
    passed it. ``args``/``kwargs`` are the caller's own tensors, which neither side was given."""
    given = _argument_leaves(args, kwargs)
    cand = _argument_leaves(cand_args, cand_kwargs)
    ref = _argument_leaves(truth.args, truth.kwargs)
    for i, (path, before) in enumerate(given):
        c, t = cand[i][1], ref[i][1]
        if _same_values(before, c):
            continue
        label = _argument_label(path, candidate, names)
        if not _same_values(before, t):
            result.outputs.append(_judge(label, c, t, None, model, _judged_dtype(c, in_dtypes), k, tf32))
            continue
        if tuple(c.shape) != tuple(before.shape):
            what = f"resized it from {list(before.shape)} to {list(c.shape)}"
        else:
            x, y = before.detach().to("cpu", torch.float64), c.detach().to("cpu", torch.float64)
            changed = int((~((x == y) | (torch.isnan(x) & torch.isnan(y)))).sum())
            what = f"changed {changed} of {before.numel()} elements"
        result.outputs.append(OutputRecord(
            label, False, tuple(c.shape), _dname(c.dtype), "written", numel=c.numel(),
            reason=(f"the candidate wrote into this argument ({what}; shape {list(before.shape)}, "
                    f"{_dname(before.dtype)}), which the reference leaves unchanged: its caller's tensor is "
                    f"overwritten. Write the result into a tensor of its own (torch.empty_like) and return that")))
    result.passed = all(o.passed for o in result.outputs)


def _argument_label(path: str, fn: Callable[..., Any], names: Sequence[str]) -> str:
    """``args[0] (g)``: an argument's path with its name, the strategy's (OpArgs.names) or else the
    candidate's own parameter's, so a failure says which argument in the words of the code."""
    m = re.fullmatch(r"args\[(\d+)\](.*)", path)
    if m is None:
        return path
    i = int(m.group(1))
    name = names[i] if i < len(names) else None
    if name is None:
        try:
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            name = params[i].name if i < len(params) else None
        except (TypeError, ValueError):
            name = None
    return f"args[{i}] ({name}){m.group(2)}" if name else path


def _broadcasts(scale: Any, t: torch.Tensor) -> bool:
    """Whether a magnitude tensor describes ``t`` elementwise (broadcasts to its shape)."""
    if not isinstance(scale, torch.Tensor):
        return False
    try:
        return bool(torch.broadcast_shapes(tuple(scale.shape), tuple(t.shape)) == tuple(t.shape))
    except RuntimeError:
        return False


def _leaves_like(truth_leaves: list[tuple[str, Any]], value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if len(truth_leaves) == 1 and isinstance(value, torch.Tensor):
        return {truth_leaves[0][0]: value}
    return dict(_flatten(value))


def _flush_subnormals(t: torch.Tensor) -> torch.Tensor:
    if not t.dtype.is_floating_point:
        return t
    tiny = float(torch.finfo(t.dtype).tiny)
    return torch.where(t.abs() < tiny, torch.zeros_like(t), t)


def _has_subnormals(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    found: list[bool] = []
    _map((tuple(args), dict(kwargs)), lambda t: found.append(
        t.dtype.is_floating_point and bool(((t != 0) & (t.abs() < float(torch.finfo(t.dtype).tiny))).any())))
    return any(found)


@dataclass
class _Truth:
    """The reference's float64 run: its output, the term magnitudes, and its own copies of the arguments
    after the call (what an op that writes into an argument wrote); ``flushed``: the same run on inputs
    with their subnormals flushed to zero, where they hold any."""

    out: Any
    scale: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    flushed: _Truth | None = None

    def alternative(self) -> tuple[Any, Any] | None:
        """(truth, scale) of the flush-to-zero run, the form ``_judge`` takes."""
        return (self.flushed.out, self.flushed.scale) if self.flushed is not None else None


def _truth(reference: Callable[..., Any], model: ErrorModel, args: Sequence[Any], kwargs: Mapping[str, Any],
           ) -> _Truth:
    """Float64 truth, term magnitudes and, if inputs hold subnormals, the flush-to-zero truth."""

    def run(prep: Callable[[torch.Tensor], torch.Tensor]) -> _Truth:
        a = _map(tuple(args), lambda t: _to_truth_input(prep(t)))
        kw = _map(dict(kwargs), lambda t: _to_truth_input(prep(t)))
        out = reference(*a, **kw)
        scale = model.magnitude(*a, **kw) if model.magnitude is not None else None
        return _Truth(out, scale, a, kw)

    with _grad_mode():
        truth = run(lambda t: t)
        if model.allow_flush_to_zero and _has_subnormals(args, kwargs):
            truth.flushed = run(_flush_subnormals)
    return truth


# --------------------------------------------------------------------------- public entry points


def _unpack(args: tuple[Any, ...], kwargs: dict[str, Any], model: ErrorModel | None
            ) -> tuple[tuple[Any, ...], dict[str, Any], ErrorModel]:
    if model is not None and not isinstance(model, ErrorModel):
        raise InvalidArgument(f"dtype_policy={model!r} must be an ErrorModel (or None for the defaults)")
    from hypothesis.strategies import SearchStrategy

    drawn = [f"args[{i}]" for i, a in enumerate(args) if isinstance(a, SearchStrategy)]
    drawn += [f"kwargs[{k!r}]" for k, v in kwargs.items() if isinstance(v, SearchStrategy)]
    if drawn:
        raise InvalidArgument(f"compare_op got a Hypothesis strategy as {drawn[0]}, not a value drawn from it: "
                              f"draw the case with @given(case=strategy) on the test and pass the case, "
                              f"compare_op(candidate, reference, case)")
    if len(args) > 1 and any(isinstance(a, OpArgs) for a in args):
        raise InvalidArgument(f"compare_op got an OpArgs (a strategy's whole argument list) beside "
                              f"{len(args) - 1} more positional argument(s); pass the OpArgs alone, or add the "
                              f"arguments to it: OpArgs((*case.args, extra), case.kwargs)")
    if len(args) == 1 and isinstance(args[0], OpArgs):
        case = args[0]
        model = model or ErrorModel()
        if model.reduction_length is None:
            model = replace(model, reduction_length=case.reduction_length)
        if model.magnitude is None and case.magnitude is not None:
            model = replace(model, magnitude=case.magnitude)
        if case.inter is not None and case.inter > model.inter:
            model = replace(model, inter=case.inter)
        return tuple(case.args), {**case.kwargs, **kwargs}, model
    return args, kwargs, model or ErrorModel()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_op(candidate: Callable[..., Any], reference: Callable[..., Any], *args: Any,
             device: str | torch.device | None = None, dtype_policy: ErrorModel | None = None,
             **kwargs: Any) -> OpResult:
    """Like :func:`compare_op` but never raises on a mismatch: returns the ``OpResult``.

    A single ``OpArgs`` positional argument is unpacked (its reduction length and
    magnitude feed the error model unless ``dtype_policy`` sets them).
    """
    names = args[0].names if len(args) == 1 and isinstance(args[0], OpArgs) else ()
    for what, fn in (("candidate", candidate), ("reference", reference)):
        if not callable(fn):
            raise InvalidArgument(f"compare_op's {what} is {fn!r}, not a function: pass the op itself "
                                  f"(compare_op(my_kernel, torch.softmax, case))")
    args, kwargs, model = _unpack(args, kwargs, dtype_policy)
    _refuse_complex("an input", (args, kwargs))
    dev = _resolve_device(device)
    k = model.reduction_length or _default_k(args, kwargs)
    tf32 = model.tf32 if model.tf32 is not None else _tf32_enabled(dev)
    in_dtypes = _input_dtypes(args, kwargs)
    judged = _lowest(in_dtypes)
    result = OpResult(passed=False, candidate=_qualname(candidate), reference=_qualname(reference), device=str(dev),
                      inputs=[f"{n}: {describe_value(v)}" for n, v in _named(args, kwargs, names)],
                      reduction_length=k, model=model.describe(judged, k, tf32))
    truth = _truth(reference, model, args, kwargs)
    _refuse_complex("the reference's output", truth.out)
    cand_args = _map(args, lambda t: place(t, dev))
    cand_kwargs = _map(kwargs, lambda t: place(t, dev))
    with _grad_mode():
        try:
            cand_out = candidate(*cand_args, **cand_kwargs)
            _synchronize(dev)
        except Exception as exc:  # the op itself failing on the backend is a parity failure
            result.error = f"{type(exc).__name__}: {exc}"
            result.raised = exc
            result.reproduction = _reproduction(candidate, reference, args, kwargs, dev, model)
            return result
    if cand_out is None and truth.out is None:
        _judge_written(result, reference, args, kwargs, cand_args, cand_kwargs, truth, model, in_dtypes, k, tf32)
    else:
        _judge_outputs(result, cand_out, truth.out, truth.scale, model, in_dtypes, k, tf32, truth.alternative())
        _judge_output_dtypes(result, cand_out, reference, args, kwargs)
        _judge_argument_writes(result, candidate, args, kwargs, cand_args, cand_kwargs, truth, model, in_dtypes, k,
                               tf32, names)
    if judged is None:
        _describe_floating_outputs(result, model, k, tf32)
    _note_interpreter(result)
    if not result.passed:
        result.reproduction = _reproduction(candidate, reference, args, kwargs, dev, model)
    _observe_search(result, _named(args, kwargs, names),
                    lambda spill: _reproduction(candidate, reference, args, kwargs, dev, model, spill=spill))
    return result


def _describe_floating_outputs(result: OpResult, model: ErrorModel, k: int, tf32: bool, recorded: bool = False) -> None:
    """The error model in words where the inputs have no floating precision: a floating output of
    integer inputs (or a Python float) is judged in its own precision, not exactly."""
    floating = [getattr(torch, o.judged_as) for o in result.outputs if o.judged_as in _PRECISION_NAMES]
    if floating:
        result.model = model.describe(_lowest(floating), k, tf32, recorded=recorded)


def compare_op(candidate: Callable[..., Any], reference: Callable[..., Any], *args: Any,
               device: str | torch.device | None = None, dtype_policy: ErrorModel | None = None,
               **kwargs: Any) -> OpResult:
    """Run ``candidate`` on ``device`` and ``reference`` in float64 on the CPU; fail if they disagree.

    Raises ``AssertionError`` describing the inputs (shapes, dtypes, strides, values
    and a reproduction) when any output element is outside the error model.  Safe in
    ``@given`` tests: it never calls ``assume``/``reject`` and keeps no per-example state.
    """
    __tracebackhide__ = True
    result = check_op(candidate, reference, *args, device=device, dtype_policy=dtype_policy, **kwargs)
    if not result.passed:
        _raise(result)
    return result


def _refuse_complex(what: str, value: Any) -> None:
    """InvalidArgument where ``value`` holds a complex tensor: the error model and the value
    descriptions are of real numbers, and a complex output judged through them would lose its
    imaginary part."""
    found: list[torch.dtype] = []
    _map(value, lambda t: found.append(t.dtype) if t.is_complex() else None)
    if found:
        raise InvalidArgument(f"compare_op: {what} is complex ({found[0]}); complex tensors are not judged. Compare "
                              f"real views: wrap both ops to take and return torch.view_as_real(...) tensors")


def _named(args: Sequence[Any], kwargs: Mapping[str, Any], names: Sequence[str] = ()) -> list[tuple[str, Any]]:
    """Each input with its label: the strategy's name for it where it gave one (OpArgs.names)."""
    return [(f"args[{i}] ({names[i]})" if i < len(names) else f"args[{i}]", a) for i, a in enumerate(args)] \
        + list(kwargs.items())


# --------------------------------------------------------------------------- golden replay


def _golden_paths(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    p = Path(path)
    stem = p.with_suffix("") if p.suffix in (".safetensors", ".json") else p
    return stem.with_name(stem.name + ".safetensors"), stem.with_name(stem.name + ".json")


_DTYPE_BY_NAME = {n: getattr(torch, n) for n in ("float64", "float32", "float16", "bfloat16", "int64", "int32",
                                                 "int16", "int8", "uint8", "bool") if getattr(torch, n, None)}
for _fp8 in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if getattr(torch, _fp8, None) is not None:
        _DTYPE_BY_NAME[_fp8] = getattr(torch, _fp8)


class _Packer:
    """Turns nested argument structures into JSON specs plus a flat dict of tensors."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def pack(self, value: Any, key: str) -> Any:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu()
            span = _storage_span(t)
            self.tensors[key] = t.as_strided((span,), (1,), 0).clone() if span else torch.empty(0, dtype=t.dtype)
            return {"tensor": key, "dtype": _dname(t.dtype), "shape": list(t.shape), "stride": list(t.stride()),
                    "offset": t.storage_offset()}
        if isinstance(value, (list, tuple)):
            return {"list" if isinstance(value, list) else "tuple":
                    [self.pack(v, f"{key}.{i}") for i, v in enumerate(value)]}
        if isinstance(value, Mapping):
            return {"dict": {str(k): self.pack(v, f"{key}.{k}") for k, v in value.items()}}
        if isinstance(value, torch.dtype):
            return {"torch_dtype": _dname(value)}
        if isinstance(value, float) and not math.isfinite(value):
            return {"float": repr(value)}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"value": value}
        raise InvalidArgument(f"cannot store a {type(value).__name__} in a golden: only tensors, numbers, strings, "
                              "None, dtypes and lists/tuples/dicts of them")


def _unpack_spec(spec: Any, tensors: Mapping[str, torch.Tensor], where: Path) -> Any:
    try:
        if "tensor" in spec:
            dtype = _DTYPE_BY_NAME[spec["dtype"]]
            flat = tensors[spec["tensor"]]
            if flat.dtype != dtype:
                raise GoldenCorrupt(f"{where}: tensor {spec['tensor']!r} is {flat.dtype}, manifest says {dtype}", where)
            if flat.numel() == 0:
                return torch.empty(spec["shape"], dtype=dtype)
            return flat.as_strided(tuple(spec["shape"]), tuple(spec["stride"]), int(spec["offset"]))
        if "list" in spec:
            return [_unpack_spec(s, tensors, where) for s in spec["list"]]
        if "tuple" in spec:
            return tuple(_unpack_spec(s, tensors, where) for s in spec["tuple"])
        if "dict" in spec:
            return {k: _unpack_spec(s, tensors, where) for k, s in spec["dict"].items()}
        if "torch_dtype" in spec:
            return _DTYPE_BY_NAME[spec["torch_dtype"]]
        if "float" in spec:
            return float(spec["float"])
        return spec["value"]
    except (KeyError, TypeError, RuntimeError) as exc:
        raise GoldenCorrupt(f"{where}: malformed entry {spec!r} ({exc}); re-record the golden", where) from exc


@dataclass
class GoldenExample:
    """One recorded input with its float64 truth, term magnitudes and the reference device's output."""

    index: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    truth: Any
    scale: Any
    reference_output: Any
    reduction_length: int
    source: str
    flushed: Any = None
    inter: float | None = None

    def __str__(self) -> str:  # used as a pytest id
        return f"example{self.index}"

    def check(self, candidate: Callable[..., Any], *, device: str | torch.device | None = None,
              dtype_policy: ErrorModel | None = None) -> OpResult:
        """Run ``candidate`` on exactly these inputs and judge it against the stored truth."""
        model = dtype_policy or ErrorModel()
        if dtype_policy is None and self.inter is not None:
            model = replace(model, inter=max(model.inter, self.inter))
        dev = _resolve_device(device)
        k = model.reduction_length or self.reduction_length
        tf32 = model.tf32 if model.tf32 is not None else _tf32_enabled(dev)
        in_dtypes = _input_dtypes(self.args, self.kwargs)
        result = OpResult(passed=False, candidate=_qualname(candidate), reference=f"golden {self.source}#{self.index}",
                          device=str(dev), inputs=[f"{n}: {describe_value(v)}" for n, v in _named(self.args,
                                                                                                   self.kwargs)],
                          reduction_length=k, model=model.describe(_lowest(in_dtypes), k, tf32, recorded=True))
        with _grad_mode():
            try:
                out = candidate(*_map(self.args, lambda t: place(t, dev)),
                                **_map(self.kwargs, lambda t: place(t, dev)))
                _synchronize(dev)
            except Exception as exc:
                result.error = f"{type(exc).__name__}: {exc}"
                return result
        alt = tuple(self.flushed) if self.flushed is not None and model.allow_flush_to_zero else None
        _judge_outputs(result, out, self.truth, self.scale, model, in_dtypes, k, tf32, alt)
        if _lowest(in_dtypes) is None:
            _describe_floating_outputs(result, model, k, tf32, recorded=True)
        if self.reference_output is not None:
            ref = OpResult(passed=False, candidate="reference device", reference="truth", device="recorded")
            _judge_outputs(ref, self.reference_output, self.truth, self.scale, model, in_dtypes, k, tf32, alt)
            result.reference_error = f"reference device worst err/tol {ref.max_ratio:.3g}"
        _note_interpreter(result)
        if not result.passed:
            result.reproduction = self._reproduction(candidate, dev, model)
        return result

    def _reproduction(self, candidate: Callable[..., Any], device: torch.device, model: ErrorModel) -> str:
        """A script that runs as pasted and raises this failure again: the example replayed from its golden."""
        imports: set[str] = set()
        notes: list[str] = []
        assign = _assignment("candidate", candidate, imports)
        model_text = _model_expr(model, imports, notes)
        policy = "" if model_text == "ErrorModel()" else f", dtype_policy={model_text}"
        return "\n".join([*_variables(), *(f"import {m}" for m in sorted(imports)),
                          "from pytest_rocm_parity.fuzz.harness import ErrorModel, load_golden",
                          assign, *notes,
                          f"load_golden({self.source!r}).examples[{self.index}].compare(candidate, "
                          f"device={str(device)!r}{policy})  # raises this failure"])

    def compare(self, candidate: Callable[..., Any], *, device: str | torch.device | None = None,
                dtype_policy: ErrorModel | None = None) -> OpResult:
        """Raising form of :meth:`check`."""
        __tracebackhide__ = True
        result = self.check(candidate, device=device, dtype_policy=dtype_policy)
        if not result.passed:
            _raise(result)
        return result


@dataclass
class Golden:
    """A loaded golden: its manifest (environment, op names) and the examples."""

    path: Path
    manifest: dict[str, Any]
    examples: list[GoldenExample]


def _collect_examples(strategy: Any, count: int, seed: int) -> list[Any]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hyp_seed

    found: list[Any] = []

    @hyp_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(strategy)
    def _collect(case: Any) -> None:
        found.append(case)

    _collect()
    return found


def record_golden(path: str | os.PathLike[str], candidate: Callable[..., Any], reference: Callable[..., Any],
                  strategy: Any, *, max_examples: int = 25, seed: int = 0,
                  device: str | torch.device | None = None, overwrite: bool = False,
                  dtype_policy: ErrorModel | None = None) -> Path:
    """On the reference machine: generate examples, store inputs, float64 truth and device output.

    ``strategy`` draws ``OpArgs`` (or tuples of positional arguments).  ``dtype_policy`` is the
    ``ErrorModel`` the checks take: its ``magnitude`` and ``reduction_length`` replace the case's, as in
    :func:`compare_op`, and are what the golden stores (the term magnitudes, K), since a replay has no
    reference to compute them from.  Writes ``<path>.safetensors`` and ``<path>.json`` atomically;
    returns the manifest path.
    """
    from safetensors.torch import save_file

    tensor_file, manifest_file = _golden_paths(path)
    if manifest_file.exists() and not overwrite:
        from pytest_rocm_parity.errors import GoldenExists

        raise GoldenExists(f"{manifest_file} exists; pass overwrite=True to re-record it", manifest_file)
    dev = _resolve_device(device)
    packer = _Packer()
    entries = []
    for i, case in enumerate(_collect_examples(strategy, max_examples, seed)):
        if not isinstance(case, OpArgs):
            case = OpArgs(tuple(case) if isinstance(case, (tuple, list)) else (case,))
        args, kwargs, model = _unpack((case,), {}, dtype_policy)
        inter = model.inter if case.inter is not None or model.inter != ErrorModel().inter else None
        truth = _truth(reference, model, args, kwargs)
        if truth.out is None:
            raise InvalidArgument(
                f"record_golden: the reference {_qualname(reference)} returned None, and a golden stores returned "
                f"outputs only, so its replay would compare nothing; record a wrapper that returns what the op "
                f"writes, e.g. lambda out, a, b: (op(out, a, b), out)[1], for the candidate and the reference")
        with _grad_mode():
            out = candidate(*_map(args, lambda t: place(t, dev)), **_map(kwargs, lambda t: place(t, dev)))
            _synchronize(dev)
        entries.append({
            "args": packer.pack(args, f"{i}.args"), "kwargs": packer.pack(kwargs, f"{i}.kwargs"),
            "truth": packer.pack(truth.out, f"{i}.truth"), "scale": packer.pack(truth.scale, f"{i}.scale"),
            "flushed": packer.pack(truth.alternative(), f"{i}.ftz"),
            "reference_output": packer.pack(_map(out, lambda t: t.detach().cpu()), f"{i}.ref"),
            "reduction_length": model.reduction_length or case.reduction_length,
            "inter": inter,
        })
    manifest = {
        "format": GOLDEN_FORMAT, "kind": "rocm-parity-op-golden", "candidate": _qualname(candidate),
        "reference": _qualname(reference), "seed": seed, "examples": entries,
        "environment": _environment(dev),
    }
    tensor_file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(tensor_file, lambda p: save_file(packer.tensors, str(p), metadata={"format": str(GOLDEN_FORMAT)}))
    manifest["sha256"] = hashlib.sha256(tensor_file.read_bytes()).hexdigest()
    atomic_write(manifest_file, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest_file


def _environment(dev: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "device": str(dev),
                           "hip": getattr(torch.version, "hip", None), "cuda": torch.version.cuda}
    if dev.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(dev)
    return env


def load_golden(path: str | os.PathLike[str]) -> Golden:
    """Load a golden written by :func:`record_golden`, checking format version and checksum."""
    from safetensors.torch import load_file

    tensor_file, manifest_file = _golden_paths(path)
    if not manifest_file.exists() or not tensor_file.exists():
        raise GoldenMissing(f"no op golden at {manifest_file} (+ .safetensors); record one on the reference "
                            "machine with record_golden() or `rocm-parity ops --record DIR`", manifest_file)
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as exc:
        raise GoldenCorrupt(f"{manifest_file}: unreadable manifest ({exc}); re-record it", manifest_file) from exc
    if not isinstance(manifest, dict) or manifest.get("kind") != "rocm-parity-op-golden":
        raise GoldenCorrupt(f"{manifest_file} is not an operator golden manifest", manifest_file)
    check_format(manifest_file, manifest.get("format"), GOLDEN_FORMAT, "re-record it on the reference machine")
    digest = hashlib.sha256(tensor_file.read_bytes()).hexdigest()
    if digest != manifest.get("sha256"):
        raise GoldenCorrupt(f"{tensor_file} does not match the checksum in {manifest_file.name}; the pair was "
                            "edited or copied incompletely; re-record or re-copy both files", tensor_file)
    try:
        tensors = load_file(str(tensor_file))
    except Exception as exc:  # safetensors raises its own error types
        raise GoldenCorrupt(f"{tensor_file}: cannot read tensors ({exc})", tensor_file) from exc
    examples = []
    for i, entry in enumerate(manifest["examples"]):
        examples.append(GoldenExample(
            index=i, args=tuple(_unpack_spec(entry["args"], tensors, manifest_file)),
            kwargs=dict(_unpack_spec(entry["kwargs"], tensors, manifest_file)),
            truth=_unpack_spec(entry["truth"], tensors, manifest_file),
            scale=_unpack_spec(entry["scale"], tensors, manifest_file),
            flushed=_unpack_spec(entry.get("flushed", {"value": None}), tensors, manifest_file),
            reference_output=_unpack_spec(entry["reference_output"], tensors, manifest_file),
            reduction_length=int(entry.get("reduction_length", 1)), source=str(manifest_file),
            inter=float(entry["inter"]) if isinstance(entry.get("inter"), (int, float)) else None))
    return Golden(manifest_file, manifest, examples)


def replay_golden(path: str | os.PathLike[str], candidate: Callable[..., Any], *,
                  device: str | torch.device | None = None,
                  dtype_policy: ErrorModel | None = None) -> list[OpResult]:
    """On the candidate machine: run every recorded example and return all records (never raises on mismatch)."""
    golden = load_golden(path)
    return [ex.check(candidate, device=device, dtype_policy=dtype_policy) for ex in golden.examples]
