"""An op that returns None and writes into an argument (a Triton launcher ``kernel(x, out)``) is judged by
what it wrote, each function on its own copies of the arguments."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.fuzz import strategies as S
from pytest_rocm_parity.fuzz.harness import check_op, compare_op, record_golden


def add_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """A launcher-style op: fills ``out``, returns nothing."""
    torch.add(a, b, out=out)


def add_into_ref(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    out.copy_(a + b)


def _operands(n: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.zeros(n), torch.randn(n, generator=gen), torch.randn(n, generator=gen)


def test_an_op_that_writes_nothing_into_out_fails() -> None:
    out, a, b = _operands()
    result = check_op(lambda out, a, b: None, add_into_ref, out, a, b, device="cpu")
    assert not result.passed
    record = result.outputs[0]
    assert (record.path, record.judged_as, record.mismatches, record.numel) == ("args[0]", "float32", 4, 4)
    assert "  args[0] (an argument both functions write; they returned None): shape [4], float32" \
        in result.message()
    with pytest.raises(AssertionError, match="Mismatched elements: 4 / 4"):
        compare_op(lambda out, a, b: None, add_into_ref, out, a, b, device="cpu")
    assert torch.equal(out, torch.zeros(4))   # the caller's tensor is untouched: each side wrote a copy


def test_each_side_writes_its_own_copy_of_the_callers_tensor() -> None:
    out, a, b = _operands()
    assert check_op(add_into, add_into_ref, out, a, b, device="cpu").passed
    assert torch.equal(out, torch.zeros(4))


def test_a_correct_write_into_out_passes_and_is_what_was_judged() -> None:
    out, a, b = _operands(33)
    result = compare_op(add_into, add_into_ref, out.bfloat16(), a.bfloat16(), b.bfloat16(), device="cpu")
    assert [(o.path, o.judged_as, o.numel) for o in result.outputs] == [("args[0]", "bfloat16", 33)]
    keyword = check_op(lambda a, b, out: add_into(out, a, b), lambda a, b, out: add_into_ref(out, a, b), a, b,
                       out=out, device="cpu")
    assert keyword.passed and [o.path for o in keyword.outputs] == ["kwargs['out']"]


def test_an_input_the_candidate_scribbles_on_fails_even_when_out_is_right() -> None:
    out, a, b = _operands()

    def clobbers(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        add_into(out, a, b)
        a.zero_()

    result = check_op(clobbers, add_into_ref, out, a, b, device="cpu")
    assert not result.passed
    assert [(o.path, o.passed) for o in result.outputs] == [("args[0]", True), ("args[1]", False)]


def test_a_write_of_the_value_already_there_is_still_compared() -> None:
    """out = 0 + 0 into zeros changes no value, yet the reference wrote it: a comparison, not a refusal."""
    zeros = torch.zeros(4)
    result = compare_op(add_into, add_into_ref, zeros, zeros.clone(), zeros.clone(), device="cpu")
    assert [(o.path, o.passed) for o in result.outputs] == [("args[0]", True)]


def test_nothing_returned_and_nothing_written_is_refused() -> None:
    out, a, b = _operands()
    with pytest.raises(InvalidArgument, match=r"returned None and changed no argument: nothing compared; return the "
                                              r"output or pass it as an argument the function writes"):
        check_op(lambda out, a, b: None, lambda out, a, b: None, out, a, b, device="cpu")


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(st.sampled_from([torch.float32, torch.float16]).flatmap(lambda dt: st.tuples(
    S.tensors(dt, (3, 17), elements=S.values(dt, regimes=("ordinary", "zero"))),
    S.tensors(dt, (3, 17), elements=S.values(dt, regimes=("ordinary", "zero"))))))
def test_fuzzing_a_correct_launcher_never_refuses_its_all_zero_examples(ab: tuple[torch.Tensor, torch.Tensor]) -> None:
    a, b = ab
    compare_op(add_into, add_into_ref, torch.zeros(a.shape, dtype=a.dtype), a, b, device="cpu")


def test_a_golden_of_a_reference_that_returns_none_is_refused(tmp_path: Path) -> None:
    """A golden stores returned outputs only: its replay would compare nothing."""
    strategy = st.just((torch.zeros(4), torch.ones(4), torch.ones(4)))
    with pytest.raises(InvalidArgument, match="returned None, and a golden stores returned outputs only"):
        record_golden(tmp_path / "add_into", add_into, add_into_ref, strategy, max_examples=1, device="cpu")
    assert not list(tmp_path.iterdir())


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(g) * u


def test_a_candidate_that_returns_its_result_written_into_an_input_fails_naming_it() -> None:
    """Right values returned, yet the caller's g is overwritten: the returned outputs alone passed it."""
    g, u = torch.randn(4, 176, generator=torch.Generator().manual_seed(1)), torch.randn(4, 176)

    def into_g(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return g.copy_(silu_mul(g, u))

    result = check_op(into_g, silu_mul, g, u, device="cpu")
    assert not result.passed
    assert [(o.path, o.passed, o.judged_as) for o in result.outputs] == [
        ("out", True, "float32"), ("args[0] (g)", False, "written")], result.outputs
    text = result.message()
    assert text.startswith("Operator writes into its inputs! (1 argument(s) the reference leaves unchanged)"), text
    assert ("args[0] (g): the candidate wrote into this argument (changed 704 of 704 elements; shape [4, 176], "
            "float32), which the reference leaves unchanged") in text and "torch.empty_like" in text, text
    with pytest.raises(AssertionError, match=r"args\[0\] \(g\): the candidate wrote into this argument"):
        compare_op(into_g, silu_mul, g, u, device="cpu")
    # the strategy's name for an argument is used where it gave one
    case = S.OpArgs((g, u), names=("gate", "up"))
    assert [o.path for o in check_op(into_g, silu_mul, case, device="cpu").outputs] == ["out", "args[0] (gate)"]


def test_an_argument_an_in_place_reference_writes_is_judged_against_the_references_copy() -> None:
    x = torch.randn(64, generator=torch.Generator().manual_seed(2))

    def doubles_in_place(x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)

    def writes_a_wrong_value(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        x.mul_(3)
        return y

    ok = check_op(doubles_in_place, doubles_in_place, x, device="cpu")
    assert ok.passed and [o.path for o in ok.outputs] == ["out", "args[0] (x)"], ok.outputs
    bad = check_op(writes_a_wrong_value, doubles_in_place, x, device="cpu")
    assert [(o.path, o.passed) for o in bad.outputs] == [("out", True), ("args[0] (x)", False)], bad.outputs
    assert "  args[0] (x) (an argument both functions write): shape [64], float32 judged as float32" in bad.message()
    # an out-of-place candidate of an in-place reference is judged by what it returns
    assert check_op(lambda x: x * 2, doubles_in_place, x, device="cpu").passed
    assert torch.equal(x, torch.randn(64, generator=torch.Generator().manual_seed(2)))
