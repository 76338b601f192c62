"""Numerics edge cases through engine.capture/replay on CPU (and the fixture where the
message matters): non-finite values, empty and 0-dim tensors, exact dtypes, complex, non-tensor leaves."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytest_rocm_parity.judging.compare import exact_metrics, float_metrics
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.judging.tolerance import Tolerance
from pytest_rocm_parity.runner.tree import constant_leaves, iter_leaves, map_tensors, tensor_leaves
from parity_models import tiny_inputs
from reliability_helpers import Golden, GoldenStore

U32 = 2.0**-24


class Poison(nn.Module):
    """Identity, or writes ``value`` at ``index`` when poisoned (an attribute: not in the fingerprint)."""

    def __init__(self) -> None:
        super().__init__()
        self.value: float | None = None
        self.index: tuple[int, ...] = (0, 1)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        if self.value is None:
            return y
        y = y.clone()
        y[self.index] = self.value
        return y


class Head(nn.Module):
    """fc -> poison -> a head that shapes the output (``kind``)."""

    def __init__(self, kind: str = "plain") -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.poison = Poison()
        self.kind = kind
        self.flip = False

    def forward(self, x: torch.Tensor) -> Any:
        y = self.poison(self.fc(x))
        k = self.kind
        if k == "empty":
            return y[:, :0] if not self.flip else y[:, :1]
        if k == "scalar":
            return y.sum()
        if k == "exact":
            idx, pos = y.argmax(-1), y > 0
            if self.flip:
                idx, pos = idx.clone(), pos.clone()
                idx[1] = (idx[1] + 1) % 4
                pos[2, 3] = ~pos[2, 3]
            return idx, pos
        if k == "complex":
            z = torch.fft.fft(y)
            return z * (1 + 1e-2j) if self.flip else z
        if k == "leaves":
            return Out(y=y, note="hello", nothing=None), None, "text", 3, {"mask": y > 0, "n": 2.5}
        return y


@dataclasses.dataclass
class Out:
    y: torch.Tensor
    note: str
    nothing: None


def run(tmp_path: Path, kind: str = "plain", *, cand: Any = None, ref_poison: float | None = None,
        dtypes: tuple[str, ...] = ("float32",), tol: Tolerance | None = None, x: Any = None) -> CheckResult:
    torch.manual_seed(0)
    m = Head(kind)
    m.poison.value = ref_poison
    g = Golden(GoldenStore(tmp_path / "goldens"), CheckSpec(name=kind, dtypes=list(dtypes),
                                                            tolerance=tol or Tolerance()), m, tiny_inputs() if x is None else x)
    g.capture(overwrite=False)
    if cand is not None:
        cand(m)
    return g.replay()[0]


def poison(value: float, index: tuple[int, ...] = (0, 1)) -> Any:
    def fn(m: Head) -> None:
        m.poison.value, m.poison.index = value, index
    return fn


def flip(m: Head) -> None:
    m.flip = True


def reasons(r: CheckResult) -> str:
    return " | ".join(f"{l.name}: {l.reason}" for l in r.layers + r.outputs if l.reason)


# -- non-finite values -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_candidate_where_reference_is_finite_fails(tmp_path: Path, value: float) -> None:
    r = run(tmp_path, cand=poison(value, (2, 3)))
    assert not r.passed
    assert r.culprit == "poison"
    assert "1 non-finite candidate value(s) where the reference is finite; first at index [2, 3]" in reasons(r)
    poisoned = next(l for l in r.layers if l.name == "poison")
    assert poisoned.iso is not None and poisoned.iso.nonfinite == 1 and poisoned.iso.first_nonfinite == [2, 3]


def test_nonfinite_count_and_first_index_in_row_major_order() -> None:
    ref = torch.ones(2, 3, 4)
    cand = ref.clone()
    cand[1, 2, 0] = float("nan")
    cand[0, 1, 3] = float("inf")
    cand[1, 0, 0] = float("nan")
    m = float_metrics("y", cand, ref, ref.double(), U32)
    assert (m.nonfinite, m.first_nonfinite) == (3, [0, 1, 3])
    assert m.note.startswith("3 non-finite candidate value(s) where the reference is finite")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_in_both_passes_by_default(tmp_path: Path, value: float) -> None:
    """Documented policy nan="equal": the same non-finite value in reference and candidate agrees."""
    r = run(tmp_path, ref_poison=value, cand=poison(value))
    assert r.passed, reasons(r)


def test_nan_in_both_fails_with_policy_fail(tmp_path: Path) -> None:
    r = run(tmp_path, ref_poison=float("nan"), cand=poison(float("nan")), tol=Tolerance(nan="fail"))
    assert not r.passed
    assert "policy is nan='fail'" in reasons(r)


def test_nan_policy_is_validated() -> None:
    with pytest.raises(InvalidArgument, match="nan='ignore'.*equal, fail"):
        Tolerance(nan="ignore")


@pytest.mark.parametrize("ref,cand", [(float("nan"), 1.0), (float("inf"), float("-inf")), (float("inf"), float("nan"))])
def test_nonfinite_disagreement_fails(ref: float, cand: float) -> None:
    r = torch.tensor([1.0, ref, 2.0])
    c = torch.tensor([1.0, cand, 2.0])
    m = float_metrics("y", c, r, r.double(), U32)
    assert m.nonfinite == 1 and m.first_nonfinite == [1]
    assert "disagreeing on non-finite entries" in m.note


def test_reference_nan_candidate_finite_fails_through_replay(tmp_path: Path) -> None:
    r = run(tmp_path, ref_poison=float("nan"), cand=poison(2.0))   # candidate "fixed" a NaN: still a change
    assert not r.passed


# -- empty and 0-dim -------------------------------------------------------------------------------

def test_empty_output_passes(tmp_path: Path) -> None:
    r = run(tmp_path, "empty")
    assert r.passed and r.outputs[0].prop is not None and r.outputs[0].prop.numel == 0


def test_empty_output_shape_change_fails(tmp_path: Path) -> None:
    r = run(tmp_path, "empty", cand=flip)
    assert not r.passed and "shape (3, 1) != golden (3, 0)" in reasons(r)


def test_empty_input_batch(tmp_path: Path) -> None:
    assert run(tmp_path, x=torch.zeros(0, 4)).passed


def test_zero_dim_output(tmp_path: Path) -> None:
    assert run(tmp_path, "scalar").passed


def test_zero_dim_output_nan_fails(tmp_path: Path) -> None:
    r = run(tmp_path, "scalar", cand=poison(float("nan")))
    assert not r.passed
    out = r.outputs[0].prop
    assert out is not None and out.nonfinite == 1 and out.first_nonfinite == []


def test_zero_dim_exact() -> None:
    assert exact_metrics("n", torch.tensor(3), torch.tensor(3)).mismatches == 0
    m = exact_metrics("n", torch.tensor(4), torch.tensor(3))
    assert m.mismatches == 1 and m.first_nonfinite == []


# -- exact dtypes ----------------------------------------------------------------------------------

def test_int_and_bool_outputs_pass_exactly(tmp_path: Path) -> None:
    r = run(tmp_path, "exact")
    assert r.passed
    assert [o.prop.kind for o in r.outputs if o.prop] == ["exact", "exact"]


def test_int_and_bool_outputs_fail_on_one_element(tmp_path: Path) -> None:
    r = run(tmp_path, "exact", cand=flip)
    assert not r.passed
    why = reasons(r)
    assert "<output>.0: 1 of 3 elements differ (exact dtype)" in why
    assert "<output>.1: 1 of 12 elements differ (exact dtype)" in why
    assert r.outputs[1].prop is not None and r.outputs[1].prop.first_nonfinite == [2, 3]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
                                   torch.uint16, torch.uint32, torch.uint64])
def test_every_exact_dtype_round_trips(tmp_path: Path, dtype: torch.dtype) -> None:
    class Cast(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.abs() * 10).to(dtype)

    from reliability_helpers import make_golden

    g = make_golden(tmp_path, model=Cast())
    assert g.replay()[0].passed


# -- complex ---------------------------------------------------------------------------------------

COMPLEX_FIX = [pytest.mark.filterwarnings("ignore:Casting complex values to real")]


@COMPLEX_FIX[0]
@pytest.mark.parametrize("rung", ["float32", "float64"])
def test_complex_output_passes(tmp_path: Path, rung: str) -> None:
    """complex64 is stored as C64; complex128 (the float64 truth) as its float64 real view."""
    r = run(tmp_path, "complex", dtypes=(rung,))
    assert r.passed, reasons(r)
    assert r.outputs[0].prop is not None and r.outputs[0].prop.kind == "complex"


@COMPLEX_FIX[0]
def test_complex_output_change_fails(tmp_path: Path) -> None:
    assert not run(tmp_path, "complex", cand=flip).passed


def test_complex_nonfinite_index_is_the_element_index() -> None:
    ref = torch.zeros(2, 3, dtype=torch.complex64)
    cand = ref.clone()
    cand[1, 2] = complex(0.0, float("nan"))
    m = float_metrics("z", cand, ref, ref.to(torch.complex128), U32)
    assert (m.kind, m.nonfinite, m.first_nonfinite) == ("complex", 1, [1, 2])


def test_complex_candidate_for_real_golden_fails_cleanly() -> None:
    ref = torch.ones(3)
    m = float_metrics("z", ref.to(torch.complex64), ref, ref.double(), U32)
    assert m.note.startswith("shape/kind") and m.ratio == float("inf")


# -- non-tensor leaves -----------------------------------------------------------------------------

def test_non_tensor_leaves(tmp_path: Path) -> None:
    """None, strings, integers and dataclasses around tensors: tensors judged, constants recorded; a
    Python float is a computed number (a ``loss.item()``), judged like a 0-d tensor."""
    from reliability_helpers import make_golden

    torch.manual_seed(0)
    g = make_golden(tmp_path, model=Head("leaves"))
    r = g.replay()[0]
    assert r.passed
    assert [o.name for o in r.outputs] == ["<output>.0.y", "<output>.4.mask", "<output>.4.n"]
    const = g.manifest_json()["rungs"]["float32"]["outputs"]["const"]
    assert const == {"0.note": "hello", "0.nothing": None, "1": None, "2": "text", "3": 3}


def test_tensor_leaf_turning_into_none_fails(tmp_path: Path) -> None:
    r = run(tmp_path, "leaves", cand=lambda m: setattr(m, "kind", "plain"))
    assert not r.passed and "missing on the candidate" in reasons(r)


@dataclasses.dataclass(frozen=True)
class Batch:
    x: torch.Tensor
    scale: float


class TakesBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, b: Batch) -> torch.Tensor:
        return self.fc(b.x) * b.scale


@pytest.mark.parametrize("rung", ["float32", "bfloat16"])
def test_dataclass_inputs_are_cast_and_replayed(tmp_path: Path, rung: str) -> None:
    """Tensors inside dataclass inputs are cast to the rung and replaced by the stored ones."""
    from reliability_helpers import make_golden

    torch.manual_seed(0)
    g = make_golden(tmp_path, model=TakesBatch(), x=(Batch(tiny_inputs(), 2.0),), dtypes=(rung,))
    assert g.replay()[0].passed


def test_map_tensors_walks_what_iter_leaves_walks() -> None:
    from collections import OrderedDict, namedtuple

    P = namedtuple("P", "a b")
    obj = {"d": Batch(torch.ones(1), 1.0), "o": OrderedDict(t=torch.ones(2)), "p": P(torch.ones(3), "s"), "l": [None]}
    found = tensor_leaves(obj)
    mapped = map_tensors(obj, lambda p, t: t * 0 + len(p))
    assert set(found) == {"d.x", "o.t", "p.0"}   # namedtuples are tuples
    assert all(bool((v == len(k)).all()) for k, v in tensor_leaves(mapped).items())
    assert isinstance(mapped["d"], Batch) and isinstance(mapped["o"], OrderedDict) and isinstance(mapped["p"], P)
    assert obj["d"].x.item() == 1.0   # the original is untouched


@pytest.mark.parametrize("obj", [{"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}},
                                 {0: torch.ones(1), "0": torch.zeros(1)}], ids=["dotted-key", "int-and-str-key"])
def test_colliding_leaf_paths_are_refused(obj: Any) -> None:
    with pytest.raises(InvalidArgument, match="share the path"):
        tensor_leaves(obj)


def test_split_leaves_fast_path_agrees_with_the_generic_walk() -> None:
    """split_leaves walks plain containers its own way (recording hooks run it on every module call):
    the same leaves, constants and container kinds as the generic walk, in the same order."""
    from collections import OrderedDict

    from pytest_rocm_parity.runner.tree import walk_leaves, split_leaves

    x = torch.ones(2)
    objs = [{"args": (x, [1, 2.5, "s", None]), "kwargs": {"pe": (x, x), "e": {}, "t": (), "f": 1.5}},
            {"args": (x,), "kwargs": {"o": OrderedDict(a=x), "b": Batch(x, 2.0), "dot": {"a.b": 1}}}, x, [x, (x,)]]
    for obj in objs:
        kinds: dict[str, str] = {}
        tensors, consts = split_leaves(obj, kinds)
        slow_kinds: dict[str, str] = {}
        leaves = list(walk_leaves(obj, "", frozenset(), slow_kinds))
        assert list(tensors) == [p for p, v in leaves if isinstance(v, torch.Tensor)]
        assert consts == {p: v if isinstance(v, (type(None), bool, int, float, str)) else f"<{type(v).__name__}>"
                          for p, v in leaves if not isinstance(v, torch.Tensor)}
        assert kinds == slow_kinds
    assert split_leaves(objs[1], {})[0].keys() == {"args.0", "kwargs.o.a", "kwargs.b.x"}
    kinds = {}
    split_leaves(objs[1], kinds)
    assert kinds["kwargs.o"] == kinds["kwargs.b"] == kinds["kwargs.dot"] == "other"


@pytest.mark.parametrize("obj", [{"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}},
                                 {0: torch.ones(1), "0": torch.zeros(1)}], ids=["dotted-key", "int-and-str-key"])
def test_split_leaves_refuses_colliding_paths_too(obj: Any) -> None:
    from pytest_rocm_parity.runner.tree import split_leaves

    with pytest.raises(InvalidArgument, match="share the path"):
        split_leaves(obj)


def test_self_referencing_output_does_not_recurse_forever() -> None:
    a: list[Any] = [torch.ones(1)]
    a.append(a)
    assert set(tensor_leaves(a)) == {"0"}
    assert constant_leaves(a) == {"1": "<list>"}
    assert map_tensors(a, lambda p, t: t)[0] is a[0]
    assert [p for p, _ in iter_leaves(a)] == ["0", "1"]


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_unstorable_dtype_is_a_clear_error(tmp_path: Path) -> None:
    class Half(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.to(torch.complex32)

    from reliability_helpers import make_golden

    with pytest.raises(InvalidArgument, match="complex32.*cannot store"):
        make_golden(tmp_path, model=Half())
    assert not list((tmp_path / "goldens").glob("*/manifest.json"))


# -- through the fixture ---------------------------------------------------------------------------

FIXTURE_TESTS = '''
import os, torch
from torch import nn

class M(nn.Module):
    def __init__(self, nan_ref):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.nan_ref = nan_ref

    def forward(self, x):
        y = self.fc(x).clone()
        if self.nan_ref or os.environ.get("POISON"):
            y[1, 2] = float("nan")
        return y

def model(nan_ref):
    torch.manual_seed(0)
    return M(nan_ref)

def test_candidate_nan(parity):
    parity.check(model(False), torch.ones(2, 4), dtypes="float32")

def test_both_nan_default(parity):
    parity.check(model(True), torch.ones(2, 4), dtypes="float32")

def test_both_nan_policy_fail(parity):
    parity.check(model(True), torch.ones(2, 4), dtypes="float32", tolerance={"nan": "fail"})
'''


def test_nan_through_the_fixture(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("POISON", raising=False)
    pytester.makepyfile(test_nan=FIXTURE_TESTS)
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=3)
    monkeypatch.setenv("POISON", "1")
    result = pytester.runpytest("--rocm-parity", "-rA")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "PASSED test_nan.py::test_both_nan_default" in out
    result.stdout.fnmatch_lines(["*1 non-finite candidate value(s) where the reference is finite; first at index [[]1, 2[]]*"])
    result.stdout.fnmatch_lines(["*policy is nan='fail'*"])
