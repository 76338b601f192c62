"""The plugin's hooks stay out of Dynamo's tracing: regional compilation of a decoder's and a
state-space model's layers replays cleanly, and a miscompiled layer is named."""
from __future__ import annotations


import pytest
import torch

from parity_models import capture_then_replay, llama, tokens, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec

import parity_models as fm


def _scaled_backend(gm: torch.fx.GraphModule, _example: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    def run(*args: torch.Tensor) -> list[torch.Tensor]:
        return [o * 1.01 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in gm(*args)]
    return run


def _mamba() -> torch.nn.Module:
    model, _inputs = fm.build_mamba()
    return model


def _mamba_inputs():  # type: ignore[no-untyped-def]
    return fm.build_mamba()[1]


CASES = [("llama", lambda: llama("sdpa"), tokens, lambda m: m.model.layers, "model.layers.1"),
         ("mamba", _mamba, _mamba_inputs, lambda m: m.layers, "layers.1")]


@pytest.mark.parametrize("family, build, inputs, layers, layer", CASES, ids=[c[0] for c in CASES])
def test_regionally_compiled_layers_replay_and_a_miscompiled_one_is_named(family, build, inputs, layers,  # type: ignore[no-untyped-def]
                                                                         layer) -> None:
    cand = build()
    for block in layers(cand):
        block.compile(backend="aot_eager")
    res = capture_then_replay(build, cand, inputs(), CheckSpec(name="m", dtypes=["float32"]))
    assert res[0].passed, verdicts(res)
    bad = build()
    layers(bad)[1].compile(backend=_scaled_backend)
    res = capture_then_replay(build, bad, inputs(), CheckSpec(name="m", dtypes=["float32"]))
    assert not res[0].passed and res[0].culprit.startswith(layer), verdicts(res)


def test_a_layer_compiled_by_assignment_keeps_the_golden_names_and_is_judged_compiled() -> None:
    """``layers[i] = torch.compile(layers[i])`` puts an OptimizedModule in the tree, whose names
    carry ``_orig_mod``: replayed as the in-place ``.compile()``, the same compiled code runs under the
    golden's names, and the model the user handed in gets its wrapper back."""
    cand = llama("sdpa")
    for i, block in enumerate(cand.model.layers):
        cand.model.layers[i] = torch.compile(block, backend="aot_eager")
    wrapped = list(cand.model.layers)
    res = capture_then_replay(lambda: llama("sdpa"), cand, tokens(), CheckSpec(name="m", dtypes=["float32"]))
    assert res[0].passed, verdicts(res)
    assert list(cand.model.layers) == wrapped
    assert all(getattr(b._orig_mod, "_compiled_call_impl", None) is None for b in wrapped)
    torch._dynamo.reset()
    bad = llama("sdpa")
    bad.model.layers[1] = torch.compile(bad.model.layers[1], backend=_scaled_backend)
    res = capture_then_replay(lambda: llama("sdpa"), bad, tokens(), CheckSpec(name="m", dtypes=["float32"]))
    assert not res[0].passed and res[0].culprit.startswith("model.layers.1"), verdicts(res)


def _silu_miscompiled(gm: torch.fx.GraphModule, _example: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    """A backend that gets one operator wrong: the graphs holding a SiLU come out 1% high."""
    if not any("silu" in str(n.target) for n in gm.graph.nodes):
        return gm.forward
    return _scaled_backend(gm, _example)


def test_a_miscompile_inside_a_compiled_block_is_named_at_the_module_that_computes_it() -> None:
    """The block's sub-modules are judged inside its compiled call, not called on their own (which
    would run them eagerly and score every one as the reference)."""
    bad = llama("sdpa")
    bad.model.layers[1].compile(backend=_silu_miscompiled)
    res = capture_then_replay(lambda: llama("sdpa"), bad, tokens(), CheckSpec(name="m", dtypes=["float32"], drill=2))
    assert not res[0].passed and res[0].culprit == "model.layers.1.mlp.act_fn", verdicts(res)


class Stack(torch.nn.Module):
    """Twelve convolutions of as many kernel sizes: the hooks break a compiled graph at each judged
    one, so Dynamo compiles Conv1d.forward once per kernel size (a constant of its graph) and rung
    dtype, past its default limit of 8 recompiles per frame."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Conv1d(4, 4, k, padding="same") for k in range(1, 13))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def test_a_whole_model_miscompile_is_judged_at_every_rung_past_dynamos_default_recompile_limit() -> None:
    """With the default limit the float32 rung used up the recompiles and the bf16 rung ran its frames
    eagerly: the miscompile passed there, 'below the noise of bfloat16'."""
    import torch._dynamo

    torch._dynamo.reset()
    x = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(Stack().eval(), backend=_scaled_backend)
    res = capture_then_replay(Stack, compiled, x, CheckSpec(name="stack", dtypes=["bfloat16", "float32"]))
    assert [r.passed for r in res] == [False, False], verdicts(res)
    assert all(r.culprit == "layers.0" for r in res), verdicts(res)
