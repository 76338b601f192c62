"""The model argument: a model whose weights are on the meta device is our own error naming the
argument and the fix, in the test's failure and without a traceback into the plugin."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_rocm_parity.api import require_model
from pytest_rocm_parity.errors import InvalidArgument

META_TEST = '''
import torch
from conftest import Tiny, make_inputs

def test_meta(parity):
    with torch.device("meta"):
        m = Tiny()
    parity.check(m, make_inputs(), name="meta", dtypes=["float32"])

def test_meta_lm(parity):
    with torch.device("meta"):
        m = Tiny()
    parity.check_lm(m, make_inputs(), name="meta-lm", dtypes=["float32"])
'''


@pytest.mark.parametrize("mode", ["capture", "replay"])
def test_meta_model_fails_with_the_fix(project: pytest.Pytester, mode: str) -> None:
    project.makepyfile(test_meta=META_TEST)
    rep = project.runpytest("--rocm-parity", f"--parity-mode={mode}", "test_meta.py")
    rep.assert_outcomes(failed=2)
    out = rep.stdout.str()
    failures = out.split("= FAILURES =")[1].split("rocm-parity summary")[0]
    assert failures.count("InvalidArgument: model: ") == 2, failures
    rep.stdout.fnmatch_lines(["ERROR meta *", "ERROR meta-lm *", "2 checks: 0 passed, 0 failed, 2 errors"])
    assert "on the meta device (first: emb.weight)" in out and "model.to_empty(device='cpu')" in out
    assert "load_state_dict" in out
    assert "Traceback" not in out and "NotImplementedError" not in out and "api.py:" not in out
    assert not (project.path / "goldens" / "meta").exists()


def test_meta_buffers_are_named_too() -> None:
    m = nn.BatchNorm1d(4)
    m.register_buffer("running_mean", torch.empty(4, device="meta"))
    with pytest.raises(InvalidArgument, match=r"1 parameter\(s\) or buffer\(s\) .*first: running_mean"):
        require_model(m)


def test_materialized_model_is_accepted() -> None:
    with torch.device("meta"):
        m = nn.Linear(4, 4)
    state = nn.Linear(4, 4).state_dict()
    m = m.to_empty(device="cpu")
    m.load_state_dict(state)
    require_model(m)


def test_a_tolerance_pattern_that_matches_no_module_is_an_error(project: pytest.Pytester) -> None:
    """A per-layer tolerance whose glob names no module would apply nowhere, silently: the check is
    refused with the pattern, close matches and how to list the names; an output's pattern is kept."""
    project.makepyfile(test_tol='''
from conftest import make_model, make_inputs
from pytest_rocm_parity import Tolerance

def test_typo(parity):
    parity.check(make_model(), make_inputs(), name="t", dtypes=["float32"],
                 tolerance=Tolerance(layers={"block.*": Tolerance(ratio=5.0)}))

def test_output(parity):
    parity.check(make_model(), make_inputs(), name="o", dtypes=["float32"],
                 tolerance=Tolerance(layers={"blocks.1.*": Tolerance(ratio=5.0), "<output>*": Tolerance(ratio=5.0)}))
''')
    result = project.runpytest("--rocm-parity", "--parity-mode=capture", "test_tol.py")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["LayerSelectionError: tolerance layers: pattern 'block.*' matches no module of "
                                 "Tiny; close matches: blocks.*named_modules()*"])


BAD_ARGUMENTS = '''
import torch
from conftest import make_model, make_inputs

def test_meta_inputs(parity):
    parity.check(make_model(), make_inputs().to("meta"), name="meta-in", dtypes=["float32"])

def test_frozen(parity):
    m = make_model().requires_grad_(False)
    parity.check_train(m, make_inputs(), loss=lambda out: out.mean(), name="frozen", dtypes=["float32"])

def test_unreduced_loss(parity):
    parity.check_train(make_model(), make_inputs(), loss=lambda out: out ** 2, name="unreduced", dtypes=["float32"])
'''


def test_bad_arguments_are_our_errors_naming_the_argument(project: pytest.Pytester) -> None:
    """Inputs without values, a model with nothing to train, a loss that is not one number: each is
    the plugin's own error naming the argument and the fix, and no golden is left behind."""
    project.makepyfile(test_bad=BAD_ARGUMENTS)
    rep = project.runpytest("--rocm-parity", "--parity-mode=capture", "test_bad.py")
    rep.assert_outcomes(failed=3)
    rep.stdout.fnmatch_lines(["*InputError: inputs: 1 tensor(s) are on the meta device*seeded torch.Generator*",
                              "*InvalidArgument: model: no parameter requires grad*requires_grad_(True)*",
                              "*InvalidArgument: loss: returned a torch.float32 tensor of shape (2, 8, 40)*.mean()*"])
    out = rep.stdout.str()
    assert "NotImplementedError" not in out and "element 0 of tensors" not in out, out
    assert not any((project.path / "goldens" / n).exists() for n in ("meta-in", "frozen", "unreduced"))


def test_inputs_of_no_supported_form_are_refused_before_the_golden_is_looked_up(project: pytest.Pytester) -> None:
    """A replay with no golden yet must not send the user to capture what capture will refuse."""
    project.makepyfile(test_gen='''
from conftest import make_model, make_inputs

def test_gen(parity):
    parity.check(make_model(), (t for t in [make_inputs()]), name="gen", dtypes=["float32"])
''')
    rep = project.runpytest("--rocm-parity", "test_gen.py")
    rep.assert_outcomes(failed=1)
    rep.stdout.fnmatch_lines(["*InvalidArgument: inputs: expected a tensor, a tuple of positional inputs or a dict*"
                              "got generator*"])
    assert "GoldenMissing" not in rep.stdout.str()


def test_a_list_of_inputs_is_refused_with_both_readings(tmp_path) -> None:
    """A forward taking a list of tensors as one argument got them spread as positional arguments:
    with one tensor it silently ran another computation. Which reading is meant is the user's to say."""
    import torch

    from pytest_rocm_parity import CheckSpec, GoldenStore, InvalidArgument, capture

    class Sum(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
            return self.fc(torch.stack(list(xs)).sum(0))

    with pytest.raises(InvalidArgument, match=r"inputs is a list of 1: pass a tuple, \(xs,\) .*tuple\(xs\)"):
        capture(Sum(), [torch.ones(2, 4)], CheckSpec(name="l", dtypes=["float32"]), GoldenStore(tmp_path), "cpu")
    assert not (tmp_path / "l").exists()


def test_an_iterator_among_the_inputs_is_refused_naming_where(tmp_path) -> None:
    """Every pass calls the model again on the same inputs: a generator inside them was used up by
    the first, and the next failed inside the model with torch's own error."""
    import torch

    from pytest_rocm_parity import CheckSpec, GoldenStore, InvalidArgument, capture

    class Sum(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, extra: object = None) -> torch.Tensor:
            return self.fc(x + torch.stack(list(extra["terms"])).sum(0)) if extra else self.fc(x)

    terms = (torch.ones(2, 4) for _ in range(2))
    with pytest.raises(InvalidArgument, match=r"inputs: kwargs.extra.terms is generator, an iterator.*list\(\.\.\.\)"):
        capture(Sum(), {"x": torch.ones(2, 4), "extra": {"terms": terms}}, CheckSpec(name="g", dtypes=["float32"]),
                GoldenStore(tmp_path), "cpu")
    assert not (tmp_path / "g").exists()
