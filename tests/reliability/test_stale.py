"""A golden that no longer describes the model or its inputs is GoldenStale: the message
says "stale", names the golden, and gives the command that regenerates that model's golden only."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.errors import GoldenStale
from parity_models import Tiny, tiny, tiny_inputs
from reliability_helpers import Golden, make_golden, message_names


class Wider(Tiny):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)


class Extra(Tiny):
    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Identity()

    def forward(self, x: torch.Tensor) -> Any:
        return self.extra(super().forward(x))


def stale(golden: Golden, *why: str, model: nn.Module | None = None, x: Any = None,
          spec: CheckSpec | None = None) -> GoldenStale:
    before = golden.snapshot()
    with pytest.raises(GoldenStale) as info:
        golden.replay(model, x, spec)
    msg = str(info.value)
    assert "stale" in msg
    for w in why:
        assert w in msg, msg
    message_names(info.value, golden.manifest, "--parity-regen='tiny'")
    assert golden.snapshot() == before
    return info.value


def test_weights_changed(golden: Golden) -> None:
    stale(golden, "weights changed", model=tiny(seed=1))


def test_a_model_loaded_in_another_dtype_is_named_as_such(golden: Golden) -> None:
    """The candidate's checkpoint loaded in bfloat16 where the reference's model was float32: the
    message names both dtypes and the fix, not only that the weights differ."""
    stale(golden, "weights changed: its floating parameters are bfloat16, the captured model's were float32",
          "Give the replay the model in the dtype it was captured from", model=tiny().to(torch.bfloat16))
    msg = str(stale(golden, "weights changed", model=tiny(seed=1)))
    assert "floating parameters" not in msg, msg   # the same dtype: other weights, said plainly


def test_weight_nudged_by_one_ulp(golden: Golden) -> None:
    m = tiny()
    with torch.no_grad():
        m.fc2.weight[0, 0] = torch.nextafter(m.fc2.weight[0, 0], torch.tensor(1.0))
    stale(golden, "weights changed: fc2.weight (1 of 4 tensors) differs from the captured model's",
          "a checkpoint loaded or converted otherwise", model=m)


def test_a_module_without_parameters_added_is_judged_with_a_note(golden: Golden) -> None:
    """The same parameters under another module tree are the same model: an added parameter-free
    module is not in the golden, so not judged on its own, and the result says so."""
    torch.manual_seed(0)
    (r,) = golden.replay(Extra())
    assert r.passed and any("['extra'] of the candidate is not in the golden" in n for n in r.notes), r.notes


def test_a_module_without_parameters_removed_is_judged_through_its_parent(tmp_path: Path) -> None:
    torch.manual_seed(0)
    g = make_golden(tmp_path, model=Extra())
    (r,) = g.replay(tiny())
    assert r.passed and any("['extra'] of the golden is not in the candidate" in n for n in r.notes), r.notes


def test_a_module_without_parameters_left_unselected_is_still_stale(golden: Golden) -> None:
    """A golden module the candidate still has but no longer selects is another selection: a
    narrower one is named as such, with the selection the golden was captured with."""
    with pytest.raises(GoldenStale) as info:
        golden.replay(spec=CheckSpec(name="tiny", dtypes=["float32"], layers=["fc1", "fc2"]))
    msg = str(info.value)
    assert "holds 3 modules; this check selects 2 of them (layers=['fc1', 'fc2'], drill=" in msg, msg
    assert "give the check layers=None as at capture (every module of the golden is judged, 'act' among them)" in msg
    message_names(info.value, golden.manifest, "--parity-regen='tiny'")


def test_parameter_shapes_changed(golden: Golden) -> None:
    """The golden records each tensor's name and shape, so the message names what changed."""
    torch.manual_seed(0)
    stale(golden, "structure changed: parameters or buffers reshaped ['fc1.weight (4, 4) -> (8, 4)'",
          model=Wider())


def test_a_dropped_bias_is_named(golden: Golden) -> None:
    m = tiny()
    m.fc2.bias = None
    stale(golden, "structure changed: parameters or buffers removed ['fc2.bias']", model=m)


def test_a_golden_without_recorded_shapes_says_the_structure_changed(golden: Golden) -> None:
    """Goldens written before the shapes were recorded: the general words."""
    m = golden.manifest_json()
    del m["fingerprint"]["tensors"]
    golden.write_manifest(m)
    torch.manual_seed(0)
    stale(golden, "structure (module names, parameter names or shapes) changed", model=Wider())


def test_dtype_not_captured_is_named_as_a_setting(golden: Golden) -> None:
    """The same model asked at a precision its golden lacks: the message names the rungs it holds and
    the two ways on (replay those, or capture the new ones), not a model that changed."""
    before = golden.snapshot()
    with pytest.raises(GoldenStale) as info:
        golden.replay(None, None, CheckSpec(name="tiny", dtypes=["float16"]))
    held = ",".join(golden.manifest_json()["rungs"])
    message_names(info.value, golden.manifest, f"holds the rungs {held.replace(',', ', ')}; this run asks for float16 "
                  f"instead of {held.replace(',', ', ')} (", f"--parity-dtypes={held}", "--parity-regen='tiny'")
    assert "changed" not in str(info.value) and golden.snapshot() == before
    with pytest.raises(GoldenStale) as info:   # every rung it holds asked as well: the new one is asked too
        golden.replay(None, None, CheckSpec(name="tiny", dtypes=[*golden.manifest_json()["rungs"], "float16"]))
    assert "this run asks for float16 too (" in str(info.value), str(info.value)


def test_a_rung_missing_from_another_tests_golden_is_captured_from_that_test_once_it_asks(tmp_path: Path) -> None:
    """Two tests of one name: the one that captured the golden asks for other rungs, so its
    regeneration alone would capture the same ones again. The message says to add the rung there
    first, or to give this check its own name."""
    owner = "tests/test_serve.py::test_bf16"
    golden = make_golden(tmp_path, test=owner)
    assert golden.manifest_json()["test"] == owner
    with pytest.raises(GoldenStale) as info:
        golden.replay(None, None, CheckSpec(name="tiny", dtypes=["float16"], test="tests/test_other.py::test_fp16"))
    msg = str(info.value)
    assert f"from the test that captured it, {owner}, once it asks for float16 too: " in msg, msg
    assert msg.endswith("or give this check its own name= and capture that"), msg


def test_dtypes_the_check_sets_are_named_where_to_change_them(golden: Golden) -> None:
    """--parity-dtypes does not override the check's own dtypes=: the advice says to change them there."""
    with pytest.raises(GoldenStale) as info:
        golden.replay(None, None, CheckSpec(name="tiny", dtypes=["float16"], dtypes_from="check"))
    held = list(golden.manifest_json()["rungs"])
    message_names(info.value, "set by the check's dtypes=, which --parity-dtypes does not override",
                  f"Replay the rungs it holds (dtypes={held!r} in the check)")
    assert "--parity-dtypes=" not in str(info.value)


def test_dtype_not_captured_beside_a_changed_model_is_stale(golden: Golden) -> None:
    stale(golden, "weights changed", "dtypes ['float16'] were not captured", model=tiny(seed=1),
          spec=CheckSpec(name="tiny", dtypes=["float16"]))


@pytest.mark.parametrize("x,why", [
    (tiny_inputs(seed=1), "values differ from the stored inputs"),
    (torch.randn(5, 4), "input args.0: shape (5, 4) vs stored (3, 4)"),
    (torch.ones(3, 4, dtype=torch.float64).to(torch.int64).float()[:2], "shape (2, 4) vs stored (3, 4)"),
    (torch.ones(3, 4, dtype=torch.int64), "input args.0: dtype torch.int64 vs stored torch.float32"),
    ((tiny_inputs(), tiny_inputs()), "input names changed"),
    ({"x": tiny_inputs()}, "input names changed"),
], ids=["values", "shape", "fewer-rows", "integer", "extra-positional", "as-keyword"])
def test_inputs_changed(golden: Golden, x: Any, why: str) -> None:
    msg = str(stale(golden, why, x=x))
    # the advice fits the change: only values that differ may be a backend's RNG
    assert ("seeded torch.Generator" in msg) == (why == "values differ from the stored inputs"), msg


def test_an_input_moved_between_position_and_keyword_is_named_as_such(golden: Golden, tmp_path: Path) -> None:
    stale(golden, "given by keyword where the capture passed them by position; pass them as the capture did",
          x={"x": tiny_inputs()})
    by_keyword = make_golden(tmp_path / "by_keyword", x={"x": tiny_inputs()})
    with pytest.raises(GoldenStale, match="given by position where the capture passed x by keyword; pass it as "
                                          "the capture did"):
        by_keyword.replay(x=tiny_inputs())


def test_input_with_nan_is_not_stale_against_itself(tmp_path: Path) -> None:
    """NaN inputs compare equal to their stored copy (NaN != NaN must not make every replay stale)."""
    x = tiny_inputs()
    x[1, 2] = float("nan")
    g = make_golden(tmp_path, x=x)
    g.replay()   # no GoldenStale


def test_forward_change_without_parameter_change_fails_the_comparison(golden: Golden) -> None:
    """Code changes that keep every parameter are not detectable as stale; the comparison catches them."""
    m = tiny()
    m.forward = lambda x: Tiny.forward(m, x)[:, :2]  # type: ignore[method-assign]
    res = golden.replay(model=m)[0]
    assert not res.passed
    assert any("shape" in o.reason for o in res.outputs)


# -- through the fixture: the printed command regenerates exactly that model ----------------------

TWO_MODELS = '''
import os, pytest, torch

def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

X = torch.ones(2, 4)

def test_alpha(parity):
    parity.check(model(int(os.environ.get("ALPHA_SEED", "0"))), X, name="alpha", dtypes="float32")

def test_beta(parity):
    parity.check(model(1), X, name="beta", dtypes="float32")

@pytest.mark.parametrize("k", ["a-1"])
def test_param(parity, k):
    parity.check(model(int(os.environ.get("PARAM_SEED", "2"))), X, dtypes="float32")
'''


def _regen_args(out: str, name: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if "GoldenStale" in ln and f"{name!r}" in ln)
    cmd = line.split("reference machine: ", 1)[1].strip()
    args = shlex.split(cmd)
    assert args[:2] == ["pytest", "--rocm-parity"], cmd
    return args[1:]


def _manifests(root: Path) -> dict[str, bytes]:
    return {p.parent.name: p.read_bytes() for p in sorted(root.glob("goldens/*/manifest.json"))}


@pytest.fixture
def two(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_two=TWO_MODELS)
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=3)
    return pytester


def test_stale_message_regenerates_that_model_only(two: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALPHA_SEED", "7")
    before = _manifests(two.path)
    result = two.runpytest("--rocm-parity")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(["*GoldenStale: stale golden */goldens/alpha/manifest.json for 'alpha': "
                                 "the model's weights changed: * from the captured model's*Regenerate*--parity-regen='alpha'*"])
    two.runpytest(*_regen_args(result.stdout.str(), "alpha")).assert_outcomes(passed=1)
    after = _manifests(two.path)
    assert after["alpha"] != before["alpha"]
    assert {k: v for k, v in after.items() if k != "alpha"} == {k: v for k, v in before.items() if k != "alpha"}
    two.runpytest("--rocm-parity").assert_outcomes(passed=3)


def test_regen_command_of_a_parametrized_test(two: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARAM_SEED", "9")
    before = _manifests(two.path)
    result = two.runpytest("--rocm-parity")
    result.assert_outcomes(failed=1, passed=2)
    name = "test_two.py::test_param[a-1]"
    two.runpytest(*_regen_args(result.stdout.str(), name))
    after = _manifests(two.path)
    changed = [k for k in after if after[k] != before[k]]
    assert len(changed) == 1 and "test_param" in changed[0], changed
    two.runpytest("--rocm-parity").assert_outcomes(passed=3)


class Scaled(Tiny):
    def forward(self, x: torch.Tensor, scale: float = 1.0, mode: str = "a") -> Any:
        return super().forward(x) * scale


@pytest.mark.parametrize("kw", [{"scale": 3.0}, {"mode": "b"}])
def test_constant_input_changed(tmp_path: Path, kw: dict[str, Any]) -> None:
    torch.manual_seed(0)
    m = Scaled()
    g = make_golden(tmp_path, model=m, x={"x": tiny_inputs(), "scale": 2.0, "mode": "a"})
    with pytest.raises(GoldenStale, match="stale"):
        g.replay(x={"x": tiny_inputs(), "scale": 2.0, "mode": "a", **kw})


def test_constant_inputs_are_recorded(tmp_path: Path) -> None:
    """The data the stale check above needs is in the golden already."""
    torch.manual_seed(0)
    g = make_golden(tmp_path, model=Scaled(), x={"x": tiny_inputs(), "scale": 2.0, "mode": "a"})
    m = json.loads(g.manifest.read_text())
    assert m["rungs"]["float32"]["inputs"]["const"] == {"kwargs.scale": 2.0, "kwargs.mode": "a"}
    assert re.fullmatch(r"[0-9a-f]{16}", m["fingerprint"]["weights"])


def test_an_untied_head_is_named_with_the_tie_the_golden_had(tmp_path: Path) -> None:
    """A tied checkpoint loaded into a config that unties the head leaves lm_head as initialised: a
    model whose outputs are noise, which 'regenerate' would approve."""
    from parity_models import llama, tokens
    from pytest_rocm_parity import GoldenStore, capture, replay

    spec = CheckSpec(name="tied", dtypes=["float32"], drill=0)
    store = GoldenStore(tmp_path)
    tied = llama(tie_word_embeddings=True)
    capture(tied, tokens(), spec, store, "cpu")
    untied = llama(tie_word_embeddings=False)
    untied.load_state_dict(tied.state_dict(), strict=False)
    with pytest.raises(GoldenStale, match=r"added \['lm_head.weight'\] \(lm_head.weight is a weight of its own here; "
                                          r"the captured model had it tied to model.embed_tokens.weight.*"
                                          r"tie_word_embeddings=False"):
        replay(untied, tokens(), spec, store, "cpu")


@pytest.mark.parametrize("name, says_default", [("shared", False), ("test_a.py::test_one", True)])
def test_a_stale_golden_of_another_test_mentions_the_default_name_only_where_it_is_one(
        tmp_path: Path, name: str, says_default: bool) -> None:
    from pytest_rocm_parity import GoldenStore, capture, replay

    store = GoldenStore(tmp_path)
    capture(tiny(), tiny_inputs(), CheckSpec(name=name, test="a/test_a.py::test_one", dtypes=["float32"]), store, "cpu")
    with pytest.raises(GoldenStale, match="It was captured by a/test_a.py::test_one") as err:
        replay(tiny(), tiny_inputs() * 2, CheckSpec(name=name, test="b/test_a.py::test_one", dtypes=["float32"]),
               store, "cpu")
    assert ("the default leaves the directory out" in str(err.value)) == says_default, str(err.value)


def test_a_changed_config_is_named_beside_the_failure_it_causes() -> None:
    """The same weights under another config (an RMSNorm eps): the failure is the config's doing, and
    the note names the field with both values; another attention implementation is no such change."""
    from parity_models import capture_then_replay, llama, tokens

    spec = CheckSpec(name="llama", dtypes=["float32"])
    inputs = {**tokens(), "use_cache": False}
    (res,) = capture_then_replay(llama, llama(rms_norm_eps=1e-2), inputs, spec)
    assert not res.passed
    assert any(n.startswith("the model's config differs from the golden's (rms_norm_eps: 1e-06 -> 0.01)")
               for n in res.notes), res.notes
    (res,) = capture_then_replay(llama, llama(attn="eager"), inputs, spec)
    assert res.passed and not any("config differs" in n for n in res.notes), res.notes


def test_the_config_note_of_a_test_judged_against_another_tests_golden_regenerates_from_that_test(
        tmp_path: Path) -> None:
    """Variants judged against one golden: a regeneration comes from the test that captured it (the
    run refuses one from the variant), in the config note as in the result's regen line."""
    from parity_models import llama, tokens
    from pytest_rocm_parity import GoldenStore, capture, replay

    store = GoldenStore(tmp_path)
    inputs = {**tokens(), "use_cache": False}
    capture(llama(), inputs, CheckSpec(name="shared", test="test_m.py::test_a", dtypes=["float32"]), store, "cpu")
    (res,) = replay(llama(rms_norm_eps=1e-2), inputs,
                    CheckSpec(name="shared", test="test_m.py::test_b", dtypes=["float32"]), store, "cpu")
    note = next(n for n in res.notes if n.startswith("the model's config differs"))
    assert note.endswith("--parity-regen='shared' 'test_m.py::test_a'") and "test_b" not in note, note
    assert res.regen.endswith("'test_m.py::test_a'"), res.regen
