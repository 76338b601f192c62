"""Training parity: the loss, per-module gradients and the optimizer's update against a float64 truth."""
from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch

from parity_models import backward_only, bert, llama, scaled_grad, tokens, wrap_input
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.runner.train import TRAIN_GOLDEN_SCALE, capture_train, replay_train

ADAMW = (torch.optim.AdamW, {"lr": 1e-3})


def _inputs() -> dict[str, torch.Tensor]:
    t = tokens("none")
    return {"input_ids": t["input_ids"], "labels": t["input_ids"]}


@pytest.fixture(scope="module")
def golden() -> tuple[GoldenStore, CheckSpec]:
    spec = CheckSpec(name="train", dtypes=["float32"], drill=2)
    store = GoldenStore(tempfile.mkdtemp())
    capture_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=ADAMW)
    return store, spec


def _replay(golden: tuple[GoldenStore, CheckSpec], model: torch.nn.Module, optimizer: Any = ADAMW) -> CheckResult:
    store, spec = golden
    return replay_train(model, _inputs(), spec, store, "cpu", optimizer=optimizer)[0]


def test_the_same_model_passes_with_every_quantity_judged(golden) -> None:  # type: ignore[no-untyped-def]
    r = _replay(golden, llama("sdpa"))
    assert r.passed, [(l.name, l.reason) for l in r.layers if not l.passed]
    judged = [l for l in r.layers if l.iso is not None and l.prop is not None]
    assert len(judged) >= 10                          # blocks, attention, MLP, projections, norms
    assert r.outputs[0].name == "<loss>" and r.outputs[0].prop is not None
    assert any(o.name == "optimizer:model.layers.1.mlp.down_proj" for o in r.outputs)
    assert not r.extra["nondeterministic"]           # the CPU's backward is deterministic


def test_another_attention_implementation_passes(golden) -> None:  # type: ignore[no-untyped-def]
    assert _replay(golden, llama("eager")).passed


def test_a_backward_bug_with_an_exact_forward_is_named(golden) -> None:  # type: ignore[no-untyped-def]
    model = llama("sdpa")
    wrap_input(model.model.layers[1].mlp.down_proj, scaled_grad())
    r = _replay(golden, model)
    assert not r.passed and r.culprit == "model.layers.1.mlp.down_proj"
    assert r.first_divergent is not None


class _OverwritingEmbedding(torch.autograd.Function):
    """An embedding whose backward writes each token's gradient row instead of adding it: a repeated
    token keeps one occurrence's gradient (index_put without accumulate), the classic kernel bug."""

    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.rows = weight.shape[0]
        return weight[ids]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[None, torch.Tensor]:
        (ids,) = ctx.saved_tensors
        dw = torch.zeros(ctx.rows, g.shape[-1], dtype=g.dtype)
        dw[ids.reshape(-1)] = g.reshape(-1, g.shape[-1])
        return None, dw


def test_an_embedding_fed_token_ids_has_its_weight_gradient_judged(tmp_path: Any) -> None:
    """A module with no floating input (token ids) has no input gradient, but its weight's gradient
    is its own backward: judged in isolation, and a bug in it is named. Text repeats its tokens."""
    ids = torch.randint(0, 12, (2, 24), generator=torch.Generator().manual_seed(3))
    inputs = {"input_ids": ids, "labels": ids}
    spec = CheckSpec(name="train-emb", dtypes=["float32"], drill=1)
    store = GoldenStore(tmp_path)
    capture_train(llama("sdpa"), inputs, spec, store, "cpu", optimizer=ADAMW)
    (r,) = replay_train(llama("sdpa"), inputs, spec, store, "cpu", optimizer=ADAMW)
    emb = next(l for l in r.layers if l.name == "model.embed_tokens")
    assert r.passed and emb.iso is not None and emb.iso.leaf.startswith("grad model.embed_tokens.weight"), emb
    model = llama("sdpa")
    model.model.embed_tokens.forward = lambda x: _OverwritingEmbedding.apply(x, model.model.embed_tokens.weight)
    (r,) = replay_train(model, inputs, spec, store, "cpu", optimizer=ADAMW)
    assert not r.passed and r.culprit == "model.embed_tokens", [(l.name, l.reason) for l in r.layers if not l.passed]


def test_a_backward_bug_on_a_few_rows_is_named_undecided(golden) -> None:  # type: ignore[no-untyped-def]
    """One token repeated three times: the dropped gradients sit on one row of the embedding's, too few
    blocks for the bound to decide, as in a forward check; the layer is named undecided, not passed
    silently (docs/judging.md)."""
    model = llama("sdpa")
    model.model.embed_tokens.forward = lambda x: _OverwritingEmbedding.apply(x, model.model.embed_tokens.weight)
    r = _replay(golden, model)
    assert "model.embed_tokens" in r.extra.get("undecided", []), r.extra
    assert any(n.startswith("model.embed_tokens: isolated error") for n in r.notes), r.notes


def test_an_optimizer_bug_is_named_apart_from_the_model(golden) -> None:  # type: ignore[no-untyped-def]
    """AdamW with another epsilon: the model's backward passes, the update does not."""
    r = _replay(golden, llama("sdpa"), optimizer=(torch.optim.AdamW, {"lr": 1e-3, "eps": 1e-4}))
    assert not r.passed and r.culprit is None
    assert all(l.passed for l in r.layers)
    assert any("optimizer's update is out of bounds" in n for n in r.notes)
    assert any(not ok for ok in r.extra["optimizer"].values())
    from pytest_rocm_parity.judging.assertion import message, property_text

    text = message(r)   # the headline names the optimizer, not a fault after the last module
    assert "culprit: the optimizer: its update is out of bounds for 21 of 21 parameter groups" in text   # the embedding's too
    assert "after the last" not in text and "optimizer update out of bounds" in property_text(r)


def test_a_loss_function_of_the_outputs_and_an_encoder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = CheckSpec(name="enc", dtypes=["float32"], drill=1)
    store = GoldenStore(tmp_path)
    t = tokens("right")
    loss = lambda out: out.last_hidden_state.square().mean()  # noqa: E731
    capture_train(bert("eager"), t, spec, store, "cpu", loss=loss)
    assert replay_train(bert("sdpa"), t, spec, store, "cpu", loss=loss)[0].passed


def test_a_model_without_its_own_loss_gets_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pytest_rocm_parity.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="labels"):
        capture_train(llama("sdpa"), tokens("none"), CheckSpec(name="x", dtypes=["float32"]), GoldenStore(tmp_path),
                      "cpu")


def test_through_the_fixture(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
import sys
sys.path.insert(0, %r)
""" % str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    pytester.makepyfile(test_t="""
import os, torch
from parity_models import llama, tokens

def test_train(parity):
    model = llama("sdpa")
    if os.environ.get("BUG") == "forward":
        model.model.layers[0].mlp.act_fn.forward = lambda x: torch.nn.functional.silu(x) * 1.01
    share = (lambda out: out.loss) if os.environ.get("BUG") == "undivided" else (lambda out: out.loss / 2)
    t = tokens("none")
    parity.check_train(model, {"input_ids": t["input_ids"], "labels": t["input_ids"]}, name="train",
                       dtypes=["float32"], optimizer=(torch.optim.SGD, {"lr": 0.1}), loss=share,
                       accumulate=2, clip_grad_norm=1.0)
""")
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    pytester.runpytest("--rocm-parity").assert_outcomes(passed=1)
    import os
    for bug, line in (("forward", "*culprit*model.layers.0.mlp.act_fn*"),
                      ("undivided", "*culprit: none among the modules: every gradient is 2x*the loss or its scaling*")):
        os.environ["BUG"] = bug
        try:
            result = pytester.runpytest("--rocm-parity")
        finally:
            del os.environ["BUG"]
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([line])
        if bug == "undivided":
            result.stdout.fnmatch_lines(["*note: the loss and every gradient are 2x*the loss or its scaling*"])


_NOISE = torch.Generator().manual_seed(7)


def _noisy(g: torch.Tensor) -> torch.Tensor:
    """About one rounding per element, different on every run, as a reduction through atomics
    gives when its order changes."""
    ulp = torch.finfo(g.dtype).eps
    return g * (1 + ((torch.rand(g.shape, generator=_NOISE) - 0.5) * 2 * ulp).to(g.dtype))


def test_a_nondeterministic_backward_is_reported_and_judged_against_its_spread(golden) -> None:  # type: ignore[no-untyped-def]
    model = llama("sdpa")
    wrap_input(model.model.layers[1].mlp.up_proj, backward_only(_noisy))
    r = _replay(golden, model)
    assert r.extra["nondeterministic"]
    assert any("nondeterministic backward" in n for n in r.notes)
    assert r.passed, [(l.name, l.reason) for l in r.layers if not l.passed]


def test_a_sketch_golden_is_small_and_still_names_a_backward_bug(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = CheckSpec(name="sk", dtypes=["float32"], drill=2, sketch=64)
    full = CheckSpec(name="full", dtypes=["float32"], drill=2)
    store = GoldenStore(tmp_path)
    capture_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=ADAMW)
    capture_train(llama("sdpa"), _inputs(), full, store, "cpu", optimizer=ADAMW)
    size = {n: sum(f.stat().st_size for f in (tmp_path / n).glob("*.safetensors")) for n in ("sk", "full")}
    assert size["sk"] < size["full"] / 2   # this model's tensors are small: most are kept whole
    assert replay_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=ADAMW)[0].passed
    model = llama("sdpa")
    wrap_input(model.model.layers[1].mlp.down_proj, scaled_grad())
    r = replay_train(model, _inputs(), spec, store, "cpu", optimizer=ADAMW)[0]
    assert not r.passed and r.culprit == "model.layers.1.mlp.down_proj", (r.culprit, r.notes)
    assert any("optimizer's step is not judged against a sketch golden" in n for n in r.notes)


def test_an_optimizer_factory_gets_the_parameter_names(golden) -> None:  # type: ignore[no-untyped-def]
    """Groups by name (no weight decay on norms) at capture and replay; a class or pair still works."""
    seen: list[list[str]] = []

    def factory(named: list[tuple[str, torch.nn.Parameter]]) -> torch.optim.Optimizer:
        seen.append([n for n, _ in named])
        norms = [(n, p) for n, p in named if "norm" in n]
        return torch.optim.AdamW([{"params": [np_ for np_ in named if "norm" not in np_[0]]},
                                  {"params": norms, "weight_decay": 0.0}], lr=1e-3)
    store = GoldenStore(tempfile.mkdtemp())
    spec = CheckSpec(name="groups", dtypes=["float32"], drill=2)
    capture_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=factory)
    r = replay_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=factory)[0]
    assert r.passed, r.notes
    model_names = {n for n, _ in llama("sdpa").named_parameters()}
    assert seen and all(set(s) <= model_names for s in seen) and "model.layers.1.input_layernorm.weight" in seen[-1]
    decays_norms = replay_train(llama("sdpa"), _inputs(), spec, store, "cpu",
                                optimizer=(torch.optim.AdamW, {"lr": 1e-3}))[0]
    assert not decays_norms.passed and decays_norms.culprit is None
    failing = {k for k, ok in decays_norms.extra["optimizer"].items() if not ok}
    assert failing and all("norm" in k for k in failing), failing


def test_clipping_is_judged_with_the_optimizer_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pytest_rocm_parity.errors import InvalidArgument

    sgd = (torch.optim.SGD, {"lr": 0.1})
    spec = CheckSpec(name="clip", dtypes=["float32"], drill=1)
    store = GoldenStore(tmp_path)
    capture_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=sgd, clip_grad_norm=0.5)
    assert replay_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=sgd, clip_grad_norm=0.5)[0].passed
    unclipped = replay_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=sgd)[0]
    assert not unclipped.passed and unclipped.culprit is None and all(l.passed for l in unclipped.layers)
    assert any("optimizer's update is out of bounds" in n for n in unclipped.notes)
    for bad, words in ((0.0, "positive"), ("1", "maximum total norm"), (True, "maximum total norm")):
        with pytest.raises(InvalidArgument, match=f"clip_grad_norm=.*{words}"):
            capture_train(llama("sdpa"), _inputs(), spec, GoldenStore(tmp_path / "x"), "cpu", optimizer=sgd,
                          clip_grad_norm=bad)
    with pytest.raises(InvalidArgument, match="give optimizer= too"):
        capture_train(llama("sdpa"), _inputs(), spec, GoldenStore(tmp_path / "x"), "cpu", clip_grad_norm=1.0)


@pytest.mark.parametrize("kwargs, words", [
    ({"steps": "2"}, r"steps='2': the number of optimizer steps, an integer"),
    ({"optimizer": (torch.optim.AdamW, {"learning_rate": 0.1})},
     r"optimizer=\(AdamW, \{'learning_rate': 0.1\}\): AdamW refused these settings \(TypeError: .*learning_rate"),
    ({"optimizer": (torch.optim.LBFGS, {"lr": 0.1})}, r"its step\(\) needs a closure .* not supported"),
    ({"optimizer": (torch.optim.SparseAdam, {"lr": 0.1})}, r"SparseAdam.step\(\) failed on the model's parameters"),
    ({"optimizer": "instance"}, r"optimizer=<a SGD instance>: built on the model's own parameters; pass its class"),
    ({"optimizer": (torch.nn.Linear, {"in_features": 2})},
     r"torch.nn.modules.linear.Linear is not a torch.optim optimizer"),
    # a learning-rate scheduler from a factory: its "updates" would all be zero and pass
    ({"optimizer": lambda named: torch.optim.lr_scheduler.StepLR(torch.optim.SGD([p for _, p in named], lr=0.1), 1)},
     r"returned a StepLR, not a torch.optim optimizer .* a learning-rate scheduler is not judged"),
    ({"steps": 3}, r"steps=3: steps are optimizer steps, and no optimizer= is given"),
])
def test_training_settings_a_step_cannot_take_are_refused_by_name(tmp_path, kwargs, words) -> None:  # type: ignore[no-untyped-def]
    """Settings torch would refuse deep inside the capture are the check's argument errors, named."""
    from pytest_rocm_parity.errors import InvalidArgument

    model = llama("sdpa")
    if kwargs.get("optimizer") == "instance":
        kwargs = {"optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    with pytest.raises(InvalidArgument, match=words):
        capture_train(model, _inputs(), CheckSpec(name="bad", dtypes=["float32"], drill=0), GoldenStore(tmp_path),
                      "cpu", **kwargs)
    assert not (tmp_path / "bad").exists()


def test_a_loss_closing_over_the_whole_batch_is_named_under_accumulation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With accumulate=2 the loss gets each micro-batch's outputs; one that closes over the whole
    batch's targets fails on their sizes: said as the loss's mistake, with the fix."""
    import torch.nn.functional as F

    from pytest_rocm_parity.errors import InvalidArgument

    targets = _inputs()["input_ids"]

    def whole_batch_loss(out):  # type: ignore[no-untyped-def]
        return F.cross_entropy(out.logits.flatten(0, 1), targets.flatten())
    with pytest.raises(InvalidArgument, match=r"loss: raised on one of the 2 micro-batches .*targets it closes over "
                                              r"must be split too: pass them in the inputs"):
        capture_train(llama("sdpa"), _inputs(), CheckSpec(name="acc", dtypes=["float32"], drill=0),
                      GoldenStore(tmp_path), "cpu", loss=whole_batch_loss, accumulate=2)


def test_accumulation_holds_the_full_batch_gradients_and_names_a_loss_that_does_not_divide(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file

    from pytest_rocm_parity.errors import GoldenStale, InvalidArgument

    store = GoldenStore(tmp_path)
    acc, whole = CheckSpec(name="acc", dtypes=["float32"], drill=2), CheckSpec(name="whole", dtypes=["float32"], drill=2)
    capture_train(llama("sdpa"), _inputs(), acc, store, "cpu", optimizer=ADAMW, accumulate=2)   # the model's loss / 2
    capture_train(llama("sdpa"), _inputs(), whole, store, "cpu", optimizer=ADAMW)
    a, w = (load_file(next((tmp_path / n).glob("float32*.safetensors"))) for n in ("acc", "whole"))
    pg = [k for k in w if k.startswith("pg/")]
    assert pg and all(torch.allclose(a[k], w[k], rtol=1e-4, atol=1e-7) for k in pg)
    assert "x/model.layers.0#1" in a and "x/model.layers.0#1" not in w   # the second micro-batch's call

    ok = replay_train(llama("sdpa"), _inputs(), acc, store, "cpu", optimizer=ADAMW, accumulate=2,
                      loss=lambda out: out.loss / 2)[0]
    assert ok.passed, [(l.name, l.reason) for l in ok.layers if not l.passed]
    assert len({l.name for l in ok.layers}) == len(ok.layers)   # one record per module over both micro-batches
    undivided = replay_train(llama("sdpa"), _inputs(), acc, store, "cpu", optimizer=ADAMW, accumulate=2,
                             loss=lambda out: out.loss)[0]
    assert not undivided.passed and undivided.culprit is None
    assert abs(undivided.extra["loss_factor"] - 2) < 1e-3 and all(undivided.extra["optimizer"].values())
    assert any("the loss or its scaling" in n and "accumulate=2" in n for n in undivided.notes)
    with pytest.raises(GoldenStale, match="micro-batches"):
        replay_train(llama("sdpa"), _inputs(), acc, store, "cpu", optimizer=ADAMW)
    with pytest.raises(InvalidArgument, match="accumulate=3"):
        replay_train(llama("sdpa"), _inputs(), acc, store, "cpu", optimizer=ADAMW, accumulate=3)
    with pytest.raises(InvalidArgument, match="accumulate=0"):
        capture_train(llama("sdpa"), _inputs(), acc, GoldenStore(tmp_path / "x"), "cpu", accumulate=0)


def test_a_stale_training_golden_names_what_changed(tmp_path: Any) -> None:
    from pytest_rocm_parity.errors import GoldenStale

    spec = CheckSpec(name="stale", dtypes=["float32"])
    store = GoldenStore(str(tmp_path))
    capture_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=ADAMW)
    other = llama("sdpa")
    other.lm_head.bias = torch.nn.Parameter(torch.zeros(other.lm_head.out_features))
    with pytest.raises(GoldenStale, match=r"added \['lm_head.bias'\].*number of steps changed \(golden 1, now 2\)"):
        replay_train(other, _inputs(), spec, store, "cpu", optimizer=ADAMW, steps=2)


def test_a_candidate_that_trains_what_the_reference_froze_is_refused(tmp_path: Any) -> None:
    """A LoRA-style fine-tune (only the attention projections train): a port that unfreezes a norm
    trains another model, and is named, with the parameter, before any step runs."""
    from pytest_rocm_parity.errors import GoldenStale

    def partly_frozen() -> torch.nn.Module:
        m = llama("sdpa")
        for n, p in m.named_parameters():
            p.requires_grad_(".self_attn." in n)
        return m

    spec = CheckSpec(name="frozen", dtypes=["float32"])
    store = GoldenStore(str(tmp_path))
    capture_train(partly_frozen(), _inputs(), spec, store, "cpu", optimizer=ADAMW)
    assert replay_train(partly_frozen(), _inputs(), spec, store, "cpu", optimizer=ADAMW)[0].passed
    unfrozen = partly_frozen()
    unfrozen.model.norm.weight.requires_grad_(True)
    with pytest.raises(GoldenStale, match=r"the candidate trains 1 the reference froze \(model.norm.weight\)"):
        replay_train(unfrozen, _inputs(), spec, store, "cpu", optimizer=ADAMW)


def test_an_optimizer_set_otherwise_or_left_out_is_said(golden) -> None:  # type: ignore[no-untyped-def]
    """The candidate's own optimizer is what is judged; where its settings differ from the golden's, or
    where none is passed and the golden's update goes unjudged, a note says so."""
    other = _replay(golden, llama("sdpa"), optimizer=(torch.optim.AdamW, {"lr": 1e-3, "betas": (0.9, 0.99)}))
    assert any("the candidate's optimizer is built otherwise than the golden's: betas [0.9, 0.99] where the "
               "golden's is [0.9, 0.999]" in n for n in other.notes), other.notes
    # other betas pass (only the optimizer's state carries them), and the note does not promise a failure
    assert other.passed and any("(momentum, Adam's betas) cannot show" in n for n in other.notes), other.notes
    none = _replay(golden, llama("sdpa"), optimizer=None)
    assert none.passed and any("this replay passes no optimizer=, so the update is not judged" in n
                               for n in none.notes), none.notes
    assert not any("optimizer" in n for n in _replay(golden, llama("sdpa")).notes)


def test_a_decoder_left_with_its_kv_cache_is_told_to_drop_it(tmp_path: Any) -> None:
    """Eager attention with use_cache on: the step's forward fills the cache, so calling a layer again
    sees its keys twice. The error says so and names the fix, instead of a shape mismatch."""
    from pytest_rocm_parity.errors import InvalidArgument

    spec = CheckSpec(name="cache", dtypes=["float32"], drill=2)
    with pytest.raises(InvalidArgument, match=r"holds a KV cache .* give the model use_cache=False"):
        capture_train(llama("eager", use_cache=True), _inputs(), spec, GoldenStore(str(tmp_path)), "cpu",
                      optimizer=ADAMW)


def _scaled_backend(gm: torch.fx.GraphModule, _example: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    """A miscompile: every floating output of every compiled graph 1% too large."""
    def run(*args: torch.Tensor) -> list[torch.Tensor]:
        return [o * 1.01 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in gm(*args)]
    return run


def test_a_compiled_candidate_trains_through_its_compiled_forward(golden) -> None:  # type: ignore[no-untyped-def]
    """torch.compile(model): the training step runs the compiled code, so a correct compile passes
    and a miscompile fails, as they do in the forward check."""
    torch._dynamo.reset()
    assert _replay(golden, torch.compile(llama("sdpa"), backend="eager")).passed
    torch._dynamo.reset()
    miscompiled = _replay(golden, torch.compile(llama("sdpa"), backend=_scaled_backend))
    assert not miscompiled.passed, [(l.name, l.reason) for l in miscompiled.layers if not l.passed]


def test_a_sketch_golden_blames_a_module_called_twice_for_the_gradient_it_passes_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The block calls one activation twice: fc2's output gradient drifts because the activation's
    second call passes it back wrong. The culprit is the activation (the call that consumed fc2's
    output), with a reason, not the next block."""
    from parity_models import MlpLM, SharedActBlock

    def model() -> MlpLM:
        torch.manual_seed(0)
        return MlpLM(16, 3, 40, block=SharedActBlock)

    ids = torch.randint(0, 40, (4, 8), generator=torch.Generator().manual_seed(1))
    loss = lambda out: out.float().square().mean()   # noqa: E731
    spec = CheckSpec(name="shared", dtypes=["float32"], sketch=64)
    store = GoldenStore(tmp_path)
    capture_train(model(), ids, spec, store, "cpu", loss=loss)
    cand = model()
    wrap_input(cand.blocks[1].act, scaled_grad(1.02))
    (r,) = replay_train(cand, ids, spec, store, "cpu", loss=loss)
    assert not r.passed and r.culprit == "blocks.1.act", [(l.name, l.reason) for l in r.layers if not l.passed]
    culprit = next(l for l in r.layers if l.name == r.culprit)
    assert culprit.reason and not culprit.passed


def test_show_describes_a_training_golden(golden) -> None:  # type: ignore[no-untyped-def]
    """rocm-parity show says the golden is a training step, what its rows are, and counts the kept
    updates (upd/), which are not judged."""
    from pytest_rocm_parity.reports.inspect_cmd import format_show, show_golden

    store, spec = golden
    text = "\n".join(format_show(show_golden(store.dir_for(spec.name))))
    assert "kind      training step (1 step(s), optimizer" in text and "output gradient" in text
    n_params = len(store.read_manifest(spec.name)["rungs"]["float32"]["optimizer_params"])
    assert f"parameter updates after 1 step(s): {n_params} tensors (upd/<parameter>)" in text


def test_a_failing_training_check_saves_the_failing_modules_gradients(golden, tmp_path: Any) -> None:  # type: ignore[no-untyped-def]
    """--parity-report exports the candidate's gradients of the modules that failed, as a forward
    check exports their outputs (docs/reports.md)."""
    from dataclasses import replace

    from safetensors.torch import load_file

    store, spec = golden
    model = llama("sdpa")
    wrap_input(model.model.layers[1].mlp.down_proj, scaled_grad())
    (r,) = replay_train(model, _inputs(), replace(spec, report_dir=str(tmp_path)), store, "cpu", optimizer=ADAMW)
    assert not r.passed and r.extra.get("failing_tensors"), r.extra
    saved = load_file(str(tmp_path / r.extra["failing_tensors"]))
    assert "model.layers.1.mlp.down_proj/grad_input/isolated" in saved
    assert "model.layers.1.mlp.down_proj/grad model.layers.1.mlp.down_proj.weight/isolated" in saved
    # the backward reaches the head before the bug: its gradients pass, and are not exported
    assert not any(k.startswith("lm_head/") for k in saved)


def test_a_model_in_training_mode_with_batchnorm_is_told_its_batch_statistics_are_not_judged(tmp_path) -> None:  # type: ignore[no-untyped-def]
    def cnn() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))

    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="cnn", dtypes=["float32"])
    store = GoldenStore(tmp_path)
    loss = lambda out: out.square().mean()  # noqa: E731
    capture_train(cnn(), x, spec, store, "cpu", loss=loss)
    res = replay_train(cnn().train(), x, spec, store, "cpu", loss=loss)[0]
    assert res.passed and any(n.startswith("the model came in training mode: 1 was judged in eval mode") for n in res.notes), \
        res.notes
    note = next(n for n in res.notes if "came in training mode" in n)
    assert "momentum is not judged" in note and "dropout" not in note   # what applies to a BatchNorm alone
    assert not any("came in training mode" in n for n in replay_train(cnn().eval(), x, spec, store, "cpu", loss=loss)[0].notes)


def test_a_moe_with_its_default_experts_kernel_trains_against_an_eager_float64_truth(tmp_path: Any) -> None:
    """grouped_mm, the MoE experts' default kernel, has no float64: the truth of the training step
    takes the eager experts, as the forward's does, and the model as the user built it passes."""
    from parity_models import mixtral

    spec = CheckSpec(name="moe", dtypes=["float32"], drill=0)
    store = GoldenStore(tmp_path)
    capture_train(mixtral(), _inputs(), spec, store, "cpu", optimizer=ADAMW)
    (r,) = replay_train(mixtral(), _inputs(), spec, store, "cpu", optimizer=ADAMW)
    assert r.passed, [(l.name, l.reason) for l in r.layers if not l.passed]


def test_a_loss_computed_otherwise_is_named_as_the_loss_not_as_accumulated_drift(golden) -> None:  # type: ignore[no-untyped-def]
    """A candidate whose loss has a term the reference's lacks (a regulariser; a router's auxiliary
    loss dropped is the same case): every module's backward agrees in isolation and the loss is far
    beyond what rounding adds up to, so the loss itself is named."""
    from pytest_rocm_parity.judging.assertion import message

    store, spec = golden
    (r,) = replay_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=ADAMW,
                        loss=lambda out: out.loss + 0.05 * out.logits.float().pow(2).mean())
    assert not r.passed and r.culprit is None and r.extra["loss_otherwise"] > 300, r.notes
    assert "culprit: the loss itself" in message(r), message(r)
    assert not any("accumulated drift" in n for n in r.notes), r.notes


def test_a_loss_within_jump_of_its_budget_is_named_by_the_gradient_it_sends(golden) -> None:  # type: ignore[no-untyped-def]
    """The same term 50x smaller: its value beyond the loss's budget but within what rounding that
    adds up to can reach (judge.JUMP), so the value alone does not name the loss; the gradient it
    sends the head is far over, which no drift does, so the note says the loss computes otherwise."""
    store, spec = golden
    (r,) = replay_train(llama("sdpa"), _inputs(), spec, store, "cpu", optimizer=ADAMW,
                        loss=lambda out: out.loss + 1e-3 * out.logits.float().pow(2).mean())
    assert not r.passed and r.culprit is None and "loss_otherwise" not in r.extra, r.notes
    assert r.extra["backward_jump"] == "lm_head", r.notes
    assert any("the loss (loss= or the model's own) and any code after lm_head in the forward computes otherwise"
               in n for n in r.notes), r.notes


def test_a_backward_bug_in_a_parents_own_code_points_inside_it_at_its_backward(golden) -> None:  # type: ignore[no-untyped-def]
    """The gradient scaled between an MLP's children, in the MLP's own code: each child's backward
    passes, and the culprit line says the fault is in the backward through the MLP's own code."""
    from pytest_rocm_parity.judging.assertion import message

    model = llama("sdpa")
    mlp = model.model.layers[1].mlp
    bug = scaled_grad()
    mlp.forward = lambda x: mlp.down_proj(bug(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)))
    r = _replay(golden, model)
    assert not r.passed and r.culprit == "model.layers.1.mlp", [(l.name, l.reason) for l in r.layers if not l.passed]
    assert "so the fault is in its backward through its own code between them" in message(r), message(r)


@pytest.mark.parametrize("steps, words", [("2", r"steps='2': the number of optimizer steps"),
                                          (3, r"steps=3: steps are optimizer steps, and no optimizer= is given")])
def test_a_replay_refuses_the_steps_a_capture_refuses(tmp_path, steps, words) -> None:  # type: ignore[no-untyped-def]
    from pytest_rocm_parity.errors import InvalidArgument

    spec = CheckSpec(name="t", dtypes=["float32"], drill=0)
    with pytest.raises(InvalidArgument, match=words):
        replay_train(llama("sdpa"), _inputs(), spec, GoldenStore(tmp_path), "cpu", steps=steps)


class _CrossEntropyWrongBackward(torch.autograd.Function):
    """A fused cross-entropy port: its value exact, its gradient (p - 0.97 onehot) / N, not (p - onehot) / N."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        lp = logits.log_softmax(-1)
        ctx.save_for_backward(lp, target)
        return -lp.gather(-1, target[:, None]).mean()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        lp, target = ctx.saved_tensors
        p = lp.exp()
        return (p - 0.97 * torch.nn.functional.one_hot(target, p.shape[-1]).to(p.dtype)) / p.shape[0] * g, None


@pytest.mark.parametrize("wrong", [False, True], ids=["exact", "wrong-backward"])
def test_a_loss_whose_value_agrees_and_whose_gradient_does_not_fails(tmp_path: Any, wrong: bool) -> None:
    """Every module's own backward holds and the loss value agrees, but the gradient reaching the
    head is far over its budget: the loss's backward is wrong, and the check fails saying so. The
    exact loss, written the same way, passes."""
    from pytest_rocm_parity.judging.assertion import headline

    ids = tokens("none")["input_ids"]

    def loss(out: Any, fn: Any = _CrossEntropyWrongBackward.apply if wrong else None) -> torch.Tensor:
        logits, target = out.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()
        return fn(logits, target) if fn is not None else torch.nn.functional.cross_entropy(logits, target)

    spec = CheckSpec(name="ce", dtypes=["float32"], drill=1)
    store = GoldenStore(tmp_path)
    reference = lambda out: torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())  # noqa: E731
    capture_train(llama("sdpa"), {"input_ids": ids}, spec, store, "cpu", loss=reference)
    r = replay_train(llama("sdpa"), {"input_ids": ids}, spec, store, "cpu", loss=loss)[0]
    if not wrong:
        assert r.passed and "backward_jump" not in r.extra, r.notes
        return
    assert not r.passed and r.culprit is None and r.extra["backward_jump"] == "lm_head", (r.first_divergent, r.notes)
    assert headline(r.extra) == "the gradient reaching lm_head is wrong; no module's own backward is"
    assert any("the backward of the loss (loss= or the model's own)" in n for n in r.notes), r.notes


def test_hugging_face_gradient_checkpointing_is_said_not_to_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """gradient_checkpointing_enable() recomputes only in training mode, which the step does not run:
    a note says its recomputation is not judged, so a pass is not read as covering it."""
    spec = CheckSpec(name="ckpt", dtypes=["float32"], drill=0)
    golden = (GoldenStore(str(tmp_path)), spec)
    capture_train(llama("sdpa", num_hidden_layers=4), _inputs(), spec, golden[0], "cpu", optimizer=ADAMW)
    model = llama("sdpa", num_hidden_layers=4)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    r = _replay(golden, model)
    assert r.passed and any(n.startswith("gradient checkpointing is on in model") and "not judged" in n
                            for n in r.notes), r.notes
    # every checkpointed module counted (the model and its 4 layers), not the first two alone
    assert any("model, model.layers.0, model.layers.1 and 2 more" in n for n in r.notes), r.notes
    assert not any("gradient checkpointing" in n for n in _replay(golden, llama("sdpa", num_hidden_layers=4)).notes)


def test_a_stale_training_golden_another_test_captured_says_whose_it_is(tmp_path: Any) -> None:
    """A probe test reusing a training check's name with other steps: the stale message says which
    test captured the golden, so its regenerate command is not followed blindly."""
    from pytest_rocm_parity.errors import GoldenStale

    store = GoldenStore(tmp_path)
    capture_train(llama("sdpa"), _inputs(), CheckSpec(name="t", dtypes=["float32"], drill=0, test="a.py::test_a"),
                  store, "cpu", optimizer=ADAMW, steps=2)
    with pytest.raises(GoldenStale, match=r"the number of steps changed \(golden 2, now 1\)\. It was captured by "
                                          r"a\.py::test_a, and this check runs in b\.py::test_b"):
        replay_train(llama("sdpa"), _inputs(), CheckSpec(name="t", dtypes=["float32"], drill=0, test="b.py::test_b"),
                     store, "cpu", optimizer=ADAMW, steps=1)


CONV_NET = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn, self.act, self.c2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return x + self.c2(self.act(self.bn(self.c1(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.layers, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.ModuleList([Block() for _ in range(3)]), nn.Linear(16, 10)

    def forward(self, x):
        h = self.stem(x)
        for layer in self.layers:
            h = layer(h)
        return self.fc(h.mean((2, 3)))


X = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
'''


def test_the_default_depth_keeps_a_training_golden_under_the_size_limit(pytester: pytest.Pytester) -> None:
    """A training golden holds 2.5x-3.5x a forward golden's bytes at one depth: its default depth is
    the deepest whose golden, so estimated, fits the limit. Here the forward's estimate fits 20 MB at
    drill 1 (14.4 MB), where the training golden is 50 MB; drill 0's is 12 MB."""
    import json

    from pytest_rocm_parity.runner.selection import activation_sizes, golden_bytes, select

    pytester.makepyfile(conv_net=CONV_NET, test_t='''
import torch
from conv_net import Net, X

def test_train(parity):
    parity.check_train(Net().eval(), X, name="t", dtypes=["bfloat16"], loss=lambda out: out.pow(2).mean(),
                       optimizer=(torch.optim.SGD, {"lr": 0.1}))
''')
    result = pytester.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-golden-size-limit=20")
    result.assert_outcomes(passed=1)
    assert "over the 20.0 MB limit" not in result.stdout.str()
    golden = pytester.path / "goldens" / "t"
    assert json.loads((golden / "manifest.json").read_text())["drill"] == 0
    held = sum(p.stat().st_size for p in golden.glob("*.safetensors"))
    assert 5e6 < held <= 20e6, held
    import sys

    sys.path.insert(0, str(pytester.path))
    from conv_net import Net, X   # type: ignore[import-not-found]

    model, rungs = Net().eval(), ["bfloat16", "float32"]
    acts = activation_sizes(model, X)
    deeper = GoldenStore(tempfile.mkdtemp(prefix="parity-train-size-"))
    capture_train(model, X, CheckSpec(name="t", dtypes=rungs, drill=1), deeper, "cpu",
                  loss=lambda out: out.pow(2).mean(), optimizer=(torch.optim.SGD, {"lr": 0.1}))
    held1 = sum(p.stat().st_size for p in deeper.dir_for("t").glob("*.safetensors"))
    ratios = [size / golden_bytes(acts, select(model, None, d), rungs) for d, size in ((0, held), (1, held1))]
    print("training golden over the forward estimate, drill 0 and 1: "
          + ", ".join(f"{r:.2f}x" for r in ratios))   # the figures behind train.TRAIN_GOLDEN_SCALE (-s)
    assert all(1.5 < r <= TRAIN_GOLDEN_SCALE for r in ratios), ratios
