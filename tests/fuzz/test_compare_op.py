"""compare_op/check_op: the error model's numbers, the message, devices and @given friendliness."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

from pytest_rocm_parity.fuzz import strategies as S
from pytest_rocm_parity.errors import BackendUnavailable, InvalidArgument
from pytest_rocm_parity.fuzz.harness import ErrorModel, OpResult, check_op, compare_op, place


def test_correct_op_passes_and_returns_a_record():
    x = torch.randn(4, 33, dtype=torch.float16)
    result = compare_op(torch.softmax, torch.softmax, x, dim=-1, device="cpu")
    assert isinstance(result, OpResult) and result.passed
    assert 0 <= result.max_ratio <= 1
    assert result.outputs[0].judged_as == "float16"


def test_result_fields_passed_and_its_alias_ok():
    x = torch.linspace(-2, 2, 12, dtype=torch.float32).reshape(3, 4)
    good = check_op(torch.softmax, torch.softmax, x, -1, device="cpu")
    bad = check_op(lambda t, d: torch.softmax(t, d) * 1.01, torch.softmax, x, -1, device="cpu")
    assert good.passed is True and good.ok is True and bad.passed is False and bad.ok is False
    assert [o.passed for o in bad.outputs] == [o.ok for o in bad.outputs] == [False]
    assert bad.to_dict()["passed"] is False and bad.to_dict()["ok"] is False
    assert bad.reproduction and not good.reproduction and bad.max_ratio > 1 >= good.max_ratio
    assert bad.outputs[0].mismatches == 12 and bad.outputs[0].worst_index is not None and bad.error is None


def test_one_ulp_error_passes_and_ten_ulps_fail():
    x = torch.linspace(1, 2, 64, dtype=torch.float32)

    def off_by(n):
        return lambda t: torch.nextafter(t * 1.0, torch.tensor(math.inf)) if n == 1 else t * (1 + n * 2.0**-23)

    assert check_op(off_by(1), lambda t: t * 1.0, x, device="cpu", dtype_policy=ErrorModel(ulps=2, inter=0,
                                                                                          acc=0)).passed
    bad = check_op(off_by(10), lambda t: t * 1.0, x, device="cpu", dtype_policy=ErrorModel(ulps=2, inter=0, acc=0))
    assert not bad.passed and bad.max_ratio > 2


def test_reduction_length_widens_the_bound():
    x = torch.ones(1024, dtype=torch.float32)
    sloppy = lambda t: t.sum() * (1 + 2e-6)  # noqa: E731
    assert not check_op(sloppy, torch.sum, x, device="cpu", dtype_policy=ErrorModel(reduction_length=1)).passed
    assert check_op(sloppy, torch.sum, x, device="cpu", dtype_policy=ErrorModel(reduction_length=1024)).passed


def test_cancellation_is_judged_against_the_terms_not_the_result():
    a = torch.tensor([[1e4, 1.0, -1e4]], dtype=torch.float32)
    b = torch.ones(3, 1, dtype=torch.float32)
    noisy = lambda x, y: x @ y + 1e-3  # noqa: E731  (rounding-sized error on terms of 1e4)
    case = S.OpArgs((a, b), reduction_length=3, magnitude=lambda x, y: x.abs() @ y.abs())
    assert check_op(noisy, torch.matmul, case, device="cpu").passed
    assert not check_op(noisy, torch.matmul, a, b, device="cpu", dtype_policy=ErrorModel(reduction_length=3)).passed


def test_layer_norm_where_the_mean_cancels_passes_a_correct_kernel_and_fails_a_wrong_eps():
    """x = [-3, 3, 0, 0, 0]: the mean is the sum of terms that cancel, so the float64 truth at the
    zeros is the mean's rounding (2.6e-17), not 0, and a correct float32 kernel's exact 0 must pass:
    the layer-norm magnitude counts the terms' mean(|x|), not |mean|. A wrong eps still fails."""
    x = torch.tensor([[-3.0, 3.0, 0.0, 0.0, 0.0]])
    policy = ErrorModel(reduction_length=5, magnitude=S._layer_norm_magnitude)

    def by_hand(t, shape, w, b, eps, *, keep_eps=True):
        tf = t.float()
        y = (tf - tf.mean(-1, keepdim=True)) * torch.rsqrt(tf.var(-1, unbiased=False, keepdim=True)
                                                            + (eps if keep_eps else 1e-1))
        return y.to(t.dtype)

    for cand in (F.layer_norm, by_hand):
        assert check_op(cand, F.layer_norm, x, (5,), None, None, 1e-5, device="cpu", dtype_policy=policy).passed
    wrong = lambda *a: by_hand(*a, keep_eps=False)  # noqa: E731
    assert not check_op(wrong, F.layer_norm, x, (5,), None, None, 1e-5, device="cpu", dtype_policy=policy).passed


def test_overflowing_truth_accepts_inf_but_finite_truth_does_not():
    x = torch.tensor([60000.0, 2.0], dtype=torch.float16)
    assert compare_op(lambda t: t * 2, lambda t: t * 2, x, device="cpu").passed  # 120000 -> inf is right
    bad = check_op(lambda t: (t * t) / t, lambda t: t, x, device="cpu")  # t*t overflows: inf, truth 60000
    assert not bad.passed and "NaN/inf where the truth is finite" in bad.message()


def test_nan_matches_nan_only():
    x = torch.tensor([math.nan, 1.0])
    assert compare_op(torch.exp, torch.exp, x, device="cpu").passed
    assert not check_op(lambda t: torch.nan_to_num(t), lambda t: t, x, device="cpu").passed


def test_flush_to_zero_of_subnormal_inputs_is_allowed_only_by_policy():
    x = torch.tensor([1e-40], dtype=torch.float32)
    daz = lambda t: torch.where(t.abs() < 1e-38, torch.zeros_like(t), t) * 1e30  # noqa: E731
    ref = lambda t: t * 1e30  # noqa: E731
    assert check_op(daz, ref, x, device="cpu").passed
    assert not check_op(daz, ref, x, device="cpu", dtype_policy=ErrorModel(allow_flush_to_zero=False)).passed


def test_failure_message_describes_inputs_for_reproduction():
    base = torch.arange(8, dtype=torch.float32)
    x = base[::2]  # non-contiguous
    with pytest.raises(AssertionError) as info:
        compare_op(lambda t: t + 1, lambda t: t, x, device="cpu")
    msg = str(info.value)
    assert "Operator outputs are not close to the float64 truth!" in msg
    assert "Mismatched elements: 4 / 4" in msg
    assert "float32[4] stride=(2,) offset=0 (non-contiguous)" in msg
    assert "t0 = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float32).as_strided((4,), (2,), 0)" in msg
    assert "Error model: tol = 8 ulp_float32(truth)" in msg
    assert "Hypothesis" not in msg   # a plain test or a pasted reproduction keeps no Hypothesis database


def _message_under_hypothesis(**options: object) -> str:
    """The failure message of a comparison run inside a one-example Hypothesis test with these settings."""
    from hypothesis import given, settings, strategies as st

    messages: list[str] = []

    @settings(max_examples=1, **options)  # type: ignore[arg-type]
    @given(st.just(0))
    def fuzzed(_x: int) -> None:
        try:
            compare_op(lambda t: t + 1, lambda t: t, torch.ones(3), device="cpu")
        except AssertionError as exc:
            messages.append(str(exc))

    fuzzed()
    assert messages
    return messages[0]


def test_a_failure_under_hypothesis_says_where_it_keeps_the_example(tmp_path) -> None:
    from hypothesis.database import DirectoryBasedExampleDatabase

    msg = _message_under_hypothesis(database=DirectoryBasedExampleDatabase(tmp_path / "examples"))
    assert f"Hypothesis keeps this failing example in its database ({tmp_path / 'examples'}" in msg


@pytest.mark.parametrize("options", [{"database": None}, {"derandomize": True}], ids=["database=None", "derandomize"])
def test_a_failure_under_hypothesis_without_a_database_claims_none(options: dict[str, object]) -> None:
    """database=None and derandomize=True save nothing: the message must not promise a replay."""
    msg = _message_under_hypothesis(**options)
    assert "Operator outputs are not close" in msg and "database" not in msg and "replays it" not in msg


def test_candidate_exceptions_become_parity_failures():
    def broken(t):
        raise RuntimeError("HIP error: invalid device function")

    result = check_op(broken, torch.neg, torch.ones(2), device="cpu")
    assert not result.passed and "invalid device function" in result.message()
    with pytest.raises(AssertionError, match="raised on cpu") as info:
        compare_op(broken, torch.neg, torch.ones(2), device="cpu")
    # chained, so the traceback shows the line of the kernel (or its wrapper) that raised
    assert isinstance(info.value.__cause__, RuntimeError) and "invalid device function" in str(info.value.__cause__)
    assert "raised" not in result.to_dict() and result.to_dict()["error"].startswith("RuntimeError")


def test_shape_mismatch_is_reported():
    result = check_op(lambda t: t.sum(0), lambda t: t, torch.ones(2, 3), device="cpu")
    msg = result.message()
    assert not result.passed and "  out: shape [3], float32\n    shape [3] but the truth has shape [2, 3]\n" in msg
    assert "Mismatched elements" not in msg and "judged as" not in msg


def test_a_structure_mismatch_and_an_integer_output_say_only_what_applies():
    x = torch.randn(4, 8)
    msg = check_op(lambda t: (F.silu(t), t), F.silu, x, device="cpu").message()
    assert "  out: candidate returned ['out[0]', 'out[1]'] but the truth ['out']\n" in msg and "shape []" not in msg
    msg = check_op(lambda t: t.argmax(-1) + 1, lambda t: t.argmax(-1), x, device="cpu").message()
    assert "Error model: exact (no floating output" in msg and "ulp" not in msg


def test_inputs_carry_the_names_the_strategy_gave_them():
    case = S.OpArgs((torch.randn(4, 8), torch.randn(8, 3)), names=("a", "b"))
    msg = check_op(lambda a, b: a @ b * 1.01, torch.matmul, case, device="cpu").message()
    assert "  args[0] (a): float32[4, 8]" in msg and "  args[1] (b): float32[8, 3]" in msg


def test_an_opargs_beside_more_positional_arguments_is_refused():
    case = S.OpArgs((torch.randn(4, 8), (8,), None, 1e-6))
    with pytest.raises(InvalidArgument, match="pass the OpArgs alone"):
        compare_op(F.rms_norm, F.rms_norm, case, 3, device="cpu")


def test_tuple_outputs_are_judged_leaf_by_leaf():
    x = torch.randn(5, 7)
    result = check_op(lambda t: (t.amax(0), t.sum(0) + 1), lambda t: (t.amax(0), t.sum(0)), x, device="cpu")
    assert [o.path for o in result.outputs] == ["out[0]", "out[1]"]
    assert [o.passed for o in result.outputs] == [True, False]


def test_inputs_are_not_mutated_and_views_survive_place():
    x = torch.arange(12.0).reshape(3, 4).t()
    moved = place(x, "cpu")
    assert moved.stride() == x.stride() and torch.equal(moved, x)
    inplace = lambda t: t.mul_(2)  # noqa: E731
    # the candidate writes its own copy, never the caller's; writing an input the reference leaves fails
    result = check_op(inplace, lambda t: t * 2, x, device="cpu")
    assert [(o.path, o.passed) for o in result.outputs] == [("out", True), ("args[0] (t)", False)]
    assert torch.equal(x, torch.arange(12.0).reshape(3, 4).t())
    assert check_op(inplace, lambda t: t.mul_(2), x, device="cpu").passed


def test_bad_policy_and_missing_device_are_explained():
    with pytest.raises(InvalidArgument, match="ErrorModel"):
        check_op(torch.neg, torch.neg, torch.ones(1), dtype_policy={"ulps": 3})
    with pytest.raises(InvalidArgument, match="ulps"):
        ErrorModel(ulps=-1)
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailable, match="device='cpu'"):
            check_op(torch.neg, torch.neg, torch.ones(1), device="cuda")
    with pytest.raises(InvalidArgument, match=r"device='cpux' is not a torch device .*use cpu, cuda or cuda:N"):
        check_op(torch.neg, torch.neg, torch.ones(1), device="cpux")


# Default Hypothesis settings apart from the deadline (first calls into a GPU stack
# are slow): health checks stay on, so this is the "no complaints" check.
@settings(max_examples=20, derandomize=True, database=None, deadline=None)
@given(case=S.layer_norm_args(S.dtypes(), max_side=64))
def test_usable_inside_given_with_health_checks_on(case):
    compare_op(F.layer_norm, F.layer_norm, case, device="cpu")


def test_complex_inputs_and_outputs_are_refused_not_judged_as_real() -> None:
    """The error model and the value descriptions are of real numbers: a complex input, or a
    complex output whose imaginary part a real comparison would drop, is refused up front."""

    with pytest.raises(InvalidArgument, match=r"an input is complex \(torch.complex64\).*torch.view_as_real"):
        check_op(torch.exp, torch.exp, torch.randn(8, dtype=torch.complex64), device="cpu")
    with pytest.raises(InvalidArgument, match=r"the reference's output is complex"):
        check_op(torch.fft.fft, torch.fft.fft, torch.randn(8), device="cpu")
    # judged through real views, a wrong imaginary part fails
    def fft(x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(torch.fft.fft(x))

    def wrong(x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(torch.fft.fft(x).conj())
    assert check_op(fft, fft, torch.randn(8), device="cpu").passed
    assert not check_op(wrong, fft, torch.randn(8), device="cpu").passed


def test_a_failure_describes_a_one_element_shape_as_the_tuple_it_is() -> None:
    """layer_norm's normalized_shape (8,) reads as a tuple, not as the int 8 in parentheses."""
    result = check_op(lambda x, shape: F.layer_norm(x, shape) * 1.1, F.layer_norm, torch.randn(4, 8), (8,),
                      device="cpu")
    assert not result.passed and "args[1]: (8,)" in result.message()


def test_a_python_float_output_is_judged_in_the_inputs_precision() -> None:
    """``x.sum().item()`` of a float32 x was computed in float32: the float32 model judges it, not equality."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    result = check_op(lambda t: t.sum().item(), lambda t: t.sum().item(), x, device="cpu")
    assert result.passed, result.message()
    assert (result.outputs[0].dtype, result.outputs[0].judged_as) == ("float", "float32")
    wrong = check_op(lambda t: t.sum().item() * 1.001, lambda t: t.sum().item(), x, device="cpu")
    assert not wrong.passed and wrong.max_ratio > 1
    assert "Error model: tol = 8 ulp_float32(truth)" in wrong.message()
    ints = torch.arange(10)   # no floating input: a Python float is a float64 value
    assert check_op(lambda t: float(t.sum()), lambda t: float(t.sum()), ints, device="cpu").outputs[0].judged_as \
        == "float64"


def test_a_missing_output_is_named_in_one_line() -> None:
    x = torch.randn(1000)
    result = check_op(lambda t: None, lambda t: t * 2, x, device="cpu")
    assert not result.passed and result.outputs[0].reason == "candidate returned None; truth float64[1000]"
    flipped = check_op(lambda t: t * 2, lambda t: None, x, device="cpu")
    assert flipped.outputs[0].reason == "candidate returned float32[1000]; truth None"
    msg = result.message()
    assert "  out: candidate returned None; truth float64[1000]\n" in msg and "tensor(" not in msg
    assert "Error model: not applied" in msg


def test_a_wrong_shape_of_a_float_output_does_not_claim_an_exact_model() -> None:
    msg = check_op(lambda t: t[:2], lambda t: t, torch.randn(4), device="cpu").message()
    assert "  out: shape [2], float32\n    shape [2] but the truth has shape [4]\n" in msg
    assert "exact (no floating output" not in msg
    assert "Error model: tol = 8 ulp_float32(truth)" in msg and "not applied to out: its shape" in msg


def test_a_nan_of_the_truth_that_the_candidate_lost_is_named() -> None:
    x = torch.tensor([[1.0, float("nan"), 2.0], [1.0, 2.0, 3.0]])
    result = check_op(lambda t, d: torch.softmax(t, d).nan_to_num(0.0), torch.softmax, x, -1, device="cpu")
    record = result.outputs[0]
    assert not result.passed and record.mismatches == 3
    assert record.reason.startswith("candidate returned another value where the truth is NaN/inf at 3 elements "
                                    "(first at index (0, 0): candidate 0.0, truth nan)")
    msg = result.message()
    assert "Greatest absolute difference among finite elements:" in msg
    made = check_op(lambda t: t / 0, lambda t: t, torch.tensor([1.0, float("inf")]), device="cpu").outputs[0]
    assert made.reason.startswith("candidate produced NaN/inf where the truth is finite at 1 element")


def _size_search(op: Callable[[torch.Tensor], torch.Tensor]) -> tuple[Callable[[], None], list[str]]:
    """A Hypothesis search over the size of ``op``'s input, and the failure messages it collects."""
    from hypothesis import strategies as st

    messages: list[str] = []

    @settings(max_examples=100, derandomize=True, database=None, deadline=None)
    @given(st.integers(1, 2048))
    def search(n: int) -> None:
        result = check_op(op, lambda x: x, torch.ones(n), device="cpu")
        if not result.passed:
            messages.append(result.message())
            raise AssertionError(messages[-1])

    return search, messages


def _fails(search: Callable[[], None]) -> None:
    with pytest.raises(AssertionError):
        search()


def _worst_seen(message: str) -> str:
    return next(line for line in message.splitlines() if line.startswith("Worst seen in this search: err/tol "))


def _ratio(line: str) -> float:
    return float(line.removeprefix("Worst seen in this search: err/tol ").split(" ", 1)[0])


def test_a_failure_under_hypothesis_reports_the_worst_ratio_seen() -> None:
    """An error that grows with the size shrinks to the threshold size, just over 1x: the message also
    gives the worst err/tol the search met, with that example's shape."""
    def drifting(x: torch.Tensor) -> torch.Tensor:
        return x * (1 + 1e-9 * x.numel() ** 2)   # relative error n^2/1e9: fails from n ~ 50

    search, messages = _size_search(drifting)
    _fails(search)
    final = messages[-1]
    shrunk = float(final.split("Greatest error/tolerance: ", 1)[1].split(" ", 1)[0])
    line = _worst_seen(final)
    assert shrunk < 2 and _ratio(line) > 10 * shrunk, final
    assert "args[0]: float32[" in line
    plain = check_op(drifting, lambda x: x, torch.ones(1024), device="cpu").message()
    assert "Worst seen" not in plain


def test_the_worst_ratio_seen_is_of_this_run_of_the_search_only() -> None:
    """A second run of the same Hypothesis test (pytest's rerun, a loop over settings) reports its own
    worst, not one a run before it met."""
    scale = [1e-6]

    def drifting(x: torch.Tensor) -> torch.Tensor:
        return x * (1 + scale[0] * x.numel() ** 2)

    search, messages = _size_search(drifting)
    _fails(search)
    first = _ratio(_worst_seen(messages[-1]))
    scale[0] = 1e-9   # the same search, errors a thousand times smaller
    _fails(search)
    second = _ratio(_worst_seen(messages[-1]))
    assert second < first / 100, (first, second)


def _scaled_rms_norm(x: torch.Tensor, shape: tuple[int, ...], w: torch.Tensor | None, eps: float, *,
                     scale: float = 1.0) -> torch.Tensor:
    return F.rms_norm(x, shape, w, eps) * scale


class _Scaled:
    """A callable object, as a user wraps a kernel launcher with its settings."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_a_partial_is_named_by_its_function_and_bound_arguments() -> None:
    """functools.partial has no name of its own: the candidate reads as the wrapped function with what
    is bound, in the result, the header and the reproduction's note, never with a memory address."""
    x, w = torch.linspace(-2, 2, 64).reshape(4, 16), torch.ones(16)
    result = check_op(functools.partial(_scaled_rms_norm, scale=1.01), functools.partial(F.rms_norm, eps=1e-6),
                      x, (16,), w, device="cpu")
    assert result.candidate == f"{__name__}._scaled_rms_norm(scale=1.01)"
    assert result.reference == "torch.nn.functional.rms_norm(eps=1e-06)"
    message = result.message()
    assert (f"Candidate: {__name__}._scaled_rms_norm(scale=1.01) on cpu; truth: torch.nn.functional.rms_norm"
            f"(eps=1e-06) in float64 on cpu") in message
    assert " at 0x" not in message and "functools" not in result.candidate
    tensor_bound = check_op(functools.partial(_scaled_rms_norm, w=torch.ones(16), scale=1.01), F.rms_norm, x,
                            (16,), eps=1e-6, device="cpu")
    assert tensor_bound.candidate == f"{__name__}._scaled_rms_norm(w=float32[16], scale=1.01)"


def test_objects_bound_methods_and_lambdas_are_named_without_addresses() -> None:
    x = torch.ones(3)
    assert check_op(_Scaled(1.01), lambda t: t, x, device="cpu").candidate == f"{__name__}._Scaled(...)"
    assert check_op(_Scaled(1.01).apply, lambda t: t, x, device="cpu").candidate == f"{__name__}._Scaled.apply"
    norm = torch.nn.RMSNorm(3)
    assert check_op(norm, lambda t: t, x, device="cpu").candidate == \
        "torch.nn.modules.normalization.RMSNorm((3,), eps=None, elementwise_affine=True)"
    stack = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Identity())   # a repr of many lines
    assert check_op(stack, lambda t: t, x, device="cpu").candidate == "torch.nn.modules.container.Sequential(...)"
    lam = check_op(lambda t: t * 2, lambda t: t, x, device="cpu")
    assert lam.candidate.endswith("<locals>.<lambda>") and " at 0x" not in lam.message()


def test_the_worst_seen_line_names_a_partial_by_its_function() -> None:
    def drifting(x: torch.Tensor, *, rate: float) -> torch.Tensor:
        return x * (1 + rate * x.numel() ** 2)

    search, messages = _size_search(functools.partial(drifting, rate=1e-9))
    _fails(search)
    line = _worst_seen(messages[-1])
    assert ".drifting(rate=1e-09)(args[0]: float32[" in line and " at 0x" not in line, line


@pytest.mark.parametrize(("given", "returned"), [(torch.float32, torch.float16), (torch.float16, torch.float32)])
def test_an_output_in_another_dtype_than_the_references_fails(given: torch.dtype, returned: torch.dtype) -> None:
    """A kernel that allocates its output in a fixed dtype: values within the lower precision's
    tolerance, yet every caller gets another tensor, so the op fails, naming both dtypes; the
    same op returning the reference's dtype passes."""
    x = torch.randn(4, 33, generator=torch.Generator().manual_seed(0)).to(given)

    def fixed(t: torch.Tensor) -> torch.Tensor:
        return torch.softmax(t.float(), -1).to(returned)

    r = check_op(fixed, lambda t: torch.softmax(t, -1), x, device="cpu")
    assert not r.passed, r.message()
    assert (f"dtype {str(returned).removeprefix('torch.')} where the reference returns "
            f"{str(given).removeprefix('torch.')} on the same inputs") in r.message(), r.message()
    assert check_op(lambda t: torch.softmax(t.float(), -1).to(t.dtype), lambda t: torch.softmax(t, -1), x,
                    device="cpu").passed


def test_a_strategy_or_a_name_where_a_value_or_an_op_belongs_is_our_error() -> None:
    """compare_op given the strategy itself (not a case drawn from it), or a name for the op, says
    how to call it, where torch's own TypeError (or a reported parity failure) said nothing of it."""
    with pytest.raises(InvalidArgument, match=r"Hypothesis strategy as args\[0\], not a value drawn from it.*@given"):
        check_op(torch.neg, torch.neg, S.softmax_args(torch.float16), device="cpu")
    with pytest.raises(InvalidArgument, match=r"compare_op's candidate is 'softmax', not a function"):
        check_op("softmax", torch.softmax, torch.ones(2), device="cpu")
