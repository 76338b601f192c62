"""Tiny random-init models of the families a CUDA-to-ROCm migration meets, and a way to plant a bug.

Built from configs with seeded weights (no hub): each call returns the same weights, so a capture on
one variant and a replay on another differ only in what the variant changes.
"""
from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.runner.selection import select

VOCAB = 96


def llama(attn: str = "sdpa", **config: Any) -> nn.Module:
    """A 2-layer Llama with GQA; ``config`` overrides any field (sizes included)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, attn_implementation=attn, use_cache=False)
    return LlamaForCausalLM(LlamaConfig(**{**fields, **config})).eval()


def falcon(attn: str = "eager") -> nn.Module:
    """A 2-layer Falcon (multi-query, parallel attention) whose attention returns its weights: with
    left padding their padded query rows are NaN in float64."""
    from transformers import FalconConfig, FalconForCausalLM

    torch.manual_seed(0)
    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       new_decoder_architecture=False, multi_query=True, parallel_attn=True, alibi=False, bias=False,
                       use_cache=False)
    cfg._attn_implementation = attn
    return FalconForCausalLM(cfg).eval()


def bert(attn: str = "sdpa") -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, attn_implementation=attn)
    return BertModel(cfg).eval()


def mixtral(experts: str | None = None) -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        use_cache=False)
    m = MixtralForCausalLM(cfg).eval()
    if experts is not None:
        m.set_experts_implementation(experts)
    return m


def t5() -> nn.Module:
    from transformers import T5Config, T5Model

    torch.manual_seed(0)
    cfg = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, use_cache=False)
    return T5Model(cfg).eval()


class MlpBlock(nn.Module):
    """A pre-norm residual MLP: the smallest block with a norm, two projections and an activation."""

    def __init__(self, d: int, width: int = 2) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, width * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(width * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class SharedActBlock(MlpBlock):
    """MlpBlock whose one activation module is called twice, as torchvision's ResNet blocks call
    their ReLU: its second call consumes fc2's output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc2(self.act(self.fc1(self.norm(x)))))


class MlpLM(nn.Module):
    """Embedding, ``n`` MlpBlocks and a head: a token model without attention, fast on any CPU."""

    def __init__(self, d: int, n: int, vocab: int, width: int = 2,
                 block: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(block(d) if block else MlpBlock(d, width) for _ in range(n))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def mlp_lm(d: int = 16, n: int = 3, vocab: int = 40, width: int = 2) -> MlpLM:
    torch.manual_seed(0)
    return MlpLM(d, n, vocab, width).eval()


class TopKMoE(nn.Module):
    """A router and a ModuleList of experts, each called on the tokens routed to it: which tokens,
    and so the shape of each expert's call, depends on near-ties of the router's scores."""

    def __init__(self, d: int, experts: int = 8, k: int = 2) -> None:
        super().__init__()
        self.k = k
        self.gate = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                                     for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(self.gate(h).softmax(-1), self.k, dim=-1)
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == i)
            if token.numel():
                out.index_add_(0, token, expert(h[token]) * weights[token, slot, None])
        return out.reshape(x.shape)


class MoEBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.moe = TopKMoE(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.moe(self.norm(x))


def moe_lm(d: int = 32, n: int = 3, vocab: int = VOCAB) -> nn.Module:
    """A token model of MoEBlocks (a hand-written MoE, as ports of older checkpoints have)."""
    torch.manual_seed(0)
    return MlpLM(d, n, vocab, block=MoEBlock).eval()


def convnet(channels_last: bool = False) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()
    with torch.no_grad():
        for b in m:
            if isinstance(b, nn.BatchNorm2d):   # statistics of a trained net, not the identity
                b.running_mean.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(2))
                b.running_var.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(3))
    return m.to(memory_format=torch.channels_last) if channels_last else m


def tokens(pad: str = "none", batch: int = 2, seq: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if pad == "left":
        mask[1, :4] = 0
    elif pad == "right":
        mask[1, -4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def seq2seq_tokens() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, VOCAB, (2, 10), generator=g),
            "decoder_input_ids": torch.randint(0, VOCAB, (2, 7), generator=g)}


def image() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def plant(model: nn.Module, name: str, factor: float = 1.01) -> nn.Module:
    """A kernel bug in one module: its output scaled by ``factor`` (the weights stay the golden's)."""
    def hook(_m: nn.Module, _a: Any, out: Any) -> Any:
        if isinstance(out, torch.Tensor):
            return out * factor
        return (out[0] * factor, *out[1:])
    model.get_submodule(name).register_forward_hook(hook)
    return model


def expected_culprit(model: nn.Module, planted: str, spec: CheckSpec) -> str:
    """The smallest selected module that holds the planted one (the culprit a correct verdict names)."""
    names = [s.name for s in select(model, spec.layers, spec.drill)]
    holders = [n for n in names if planted == n or planted.startswith(n + ".")]
    return max(holders, key=len)


def capture_then_replay(reference: nn.Module | Callable[[], nn.Module], candidate: nn.Module, inputs: Any,
                        spec: CheckSpec | None = None, reference_inputs: Any = None) -> list[CheckResult]:
    """Capture on ``reference`` (with ``reference_inputs`` when they differ in call flags), replay
    ``candidate`` against it, on the CPU (a fresh golden dir)."""
    spec = spec or CheckSpec(name="m", dtypes=["float32"])
    ref = reference() if callable(reference) and not isinstance(reference, nn.Module) else reference
    store = GoldenStore(tempfile.mkdtemp(prefix="parity-migration-"))
    capture(ref, copy.deepcopy(inputs if reference_inputs is None else reference_inputs), spec, store, "cpu")
    return replay(candidate, inputs, spec, store, "cpu")


def verdicts(results: list[CheckResult]) -> str:
    """A readable summary for assertion messages."""
    out = []
    for r in results:
        bad = [f"{l.name}: {l.reason}" for l in r.layers if not l.passed][:3]
        bad += [f"{o.name}: {o.reason}" for o in r.outputs if not o.passed][:2]
        out.append(f"{r.dtype} {'PASS' if r.passed else 'FAIL'} culprit={r.culprit} {bad} notes={r.notes}")
    return "\n".join(out)


def backward_only(grad: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """An identity whose backward passes ``grad(g)`` back instead of ``g``: a backward kernel's bug
    (or nondeterminism) with an exact forward."""
    class _Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return grad(g)
    return _Identity.apply


def scaled_grad(factor: float = 1.02) -> Callable[[torch.Tensor], torch.Tensor]:
    """backward_only, the gradient ``factor`` times too large."""
    return backward_only(lambda g: g * factor)


def wrap_input(module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """``module`` called on ``fn`` of its first input (positional or keyword), in place."""
    forward = module.forward

    def call(*args: Any, **kwargs: Any) -> Any:
        if args:
            return forward(fn(args[0]), *args[1:], **kwargs)
        key = next(iter(kwargs))
        return forward(**{**kwargs, key: fn(kwargs[key])})
    module.forward = call   # type: ignore[method-assign]
    return module
