"""Seeded backward, optimizer and loss-scaling bugs, and correct alternates, for training parity
(check_train).

Each bug is confined to one module's backward (its forward exact), to the optimizer's step (clipping
included) or to the loss's scaling. The expected verdict: the module (the smallest selected module
holding it) as the culprit; for an optimizer bug no model culprit and an optimizer finding; for a
loss off by a constant factor no culprit and that factor named.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from parity_models import backward_only, bert, llama, scaled_grad, tokens, wrap_input


def no_decay(cls: type[torch.optim.Optimizer], **kw: Any) -> Callable[[list[tuple[str, nn.Parameter]]], Any]:
    """The optimizer a training script builds: weight decay on the matrices, none on norms and biases,
    chosen by parameter name."""
    def factory(named: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
        flat = [n.endswith("bias") or "norm" in n.lower() for n, _ in named]
        groups = [{"params": [np_ for np_, f in zip(named, flat) if not f]},
                  {"params": [np_ for np_, f in zip(named, flat) if f], "weight_decay": 0.0}]
        return cls([g for g in groups if g["params"]], **kw)
    factory.__qualname__ = f"no_decay.{cls.__name__}"
    return factory


ADAMW = no_decay(torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
SGD = (torch.optim.SGD, {"lr": 0.1})
MAX_NORM = 1.0        # below the decoder's total gradient norm (about 3.2): the clipping is active
ACCUMULATE = 2


def decoder() -> nn.Module:
    return llama("sdpa")


def encoder() -> nn.Module:
    return bert("sdpa")


def decoder_inputs() -> dict[str, torch.Tensor]:
    t = tokens("none")
    return {"input_ids": t["input_ids"], "labels": t["input_ids"]}


def encoder_inputs() -> dict[str, torch.Tensor]:
    return tokens("right")


_PROBE = torch.randn(64, generator=torch.Generator().manual_seed(3))


def encoder_loss(out: Any) -> torch.Tensor:
    """A regression head's squared error on a fixed random projection: its gradient has a nonzero
    mean over the features, as a real task's has (a mean-of-squares loss would hide a LayerNorm
    backward that drops its centering term)."""
    h = out.last_hidden_state.float()
    return (h @ _PROBE.to(h.device) - 1.0).square().mean()


# -- backward kernels with an exact forward -------------------------------------------------------

class _RMSNorm(torch.autograd.Function):
    """RMSNorm with a hand-written backward; ``exact`` chooses the correct one or one that drops the
    term through the mean of squares (subclasses)."""

    exact = True

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(xf, w, inv)
        return (w * (xf * inv).to(x.dtype)).to(x.dtype)

    @classmethod
    def backward(cls, ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:   # type: ignore[override]
        xf, w, inv = ctx.saved_tensors
        gf = g.float() * w.float()
        gw = (g.float() * (xf * inv)).sum(tuple(range(g.dim() - 1))).to(w.dtype)
        gx = inv * gf
        if cls.exact:
            gx = gx - xf * inv.pow(3) * (gf * xf).mean(-1, keepdim=True)
        return gx.to(g.dtype), gw, None


class _RMSNormExact(_RMSNorm):
    """A correct alternate: RMSNorm's exact backward, written by hand."""


class _RMSNormDropsTerm(_RMSNorm):
    """The bug: the -x * mean(g*w*x) * inv^3 term of the input gradient is gone."""

    exact = False


class _LayerNormDropsTerm(torch.autograd.Function):
    """LayerNorm whose backward drops the mean-centering term of the input gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        mu = xf.mean(-1, keepdim=True)
        inv = torch.rsqrt((xf - mu).pow(2).mean(-1, keepdim=True) + eps)
        xh = (xf - mu) * inv
        ctx.save_for_backward(xh, w, inv)
        return (xh * w.float() + b.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        xh, w, inv = ctx.saved_tensors
        dims = tuple(range(g.dim() - 1))
        gf = g.float()
        gxh = gf * w.float()
        gx = inv * (gxh - xh * (gxh * xh).mean(-1, keepdim=True))   # the - mean(gxh) term is gone
        return gx.to(g.dtype), (gf * xh).sum(dims).to(w.dtype), gf.sum(dims).to(w.dtype), None


def _exact_forward(forward: Callable[[torch.Tensor], torch.Tensor],
                   wrong_grad: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Any:
    """An activation with an exact forward and the backward ``wrong_grad(x, g)``."""
    class _Activation(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            (x,) = ctx.saved_tensors
            return wrong_grad(x, g).to(g.dtype)
    return _Activation


def _silu_grad_shifted(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """SiLU's derivative taken at a sigmoid of 1.05x: an approximation's backward."""
    s = torch.sigmoid(1.05 * x.float())
    return g.float() * (s * (1 + x.float() * (1 - s)))


def _gelu_tanh_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The tanh approximation's derivative, for an exact GELU forward."""
    xf = x.detach().float().requires_grad_(True)
    with torch.enable_grad():
        (gx,) = torch.autograd.grad(F.gelu(xf, approximate="tanh"), xf, g.float())
    return gx


_ApproxSiLU = _exact_forward(F.silu, _silu_grad_shifted)
_TanhGELUBackward = _exact_forward(F.gelu, _gelu_tanh_grad)


def _flush_denormals(g: torch.Tensor) -> torch.Tensor:
    """Gradients below 64x fp16's smallest normal flushed to zero (an fp16 kernel built with
    flush-to-zero)."""
    return torch.where(g.abs() < torch.finfo(torch.float16).tiny * 64, torch.zeros_like(g), g)


class _LinearDropsBiasGrad(torch.autograd.Function):
    """A fused linear whose backward returns no bias gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w, b)
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, w, b = ctx.saved_tensors
        gw = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return g @ w, gw, torch.zeros_like(b)


def _linear_split_k(lin: nn.Module) -> None:
    """A correct alternate: the weight gradient summed over the tokens in 4 chunks, each partial
    product rounded to the rung and the partials added last chunk first in float32 (a split-K
    reduction in another order): exact up to rounding."""
    class _SplitK(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x, w)
            return F.linear(x, w)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, w = ctx.saved_tensors
            g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
            parts = [gc.t() @ xc for gc, xc in zip(g2.tensor_split(4), x2.tensor_split(4))]
            gw = torch.stack([p_.float() for p_ in reversed(parts)]).sum(0)
            return g @ w, gw.to(w.dtype)
    lin.forward = lambda x: _SplitK.apply(x, lin.weight)   # type: ignore[method-assign]


def _clip(total_norm: Callable[[list[torch.Tensor]], torch.Tensor]) -> Callable[[list[nn.Parameter]], None]:
    """A training script's own clipping to MAX_NORM, by ``total_norm`` of the gradients."""
    @torch.no_grad()
    def clip(params: list[nn.Parameter]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        coef = (MAX_NORM / (total_norm(grads).float() + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return clip


def _sum_of_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """The bug: the total norm as the sum of the per-tensor norms, not the root of their squares' sum."""
    return torch.stack([g.float().norm() for g in grads]).sum()


def _root_sum_of_squares(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([g.float().norm() for g in grads]).norm()


def micro_batch_share(out: Any) -> torch.Tensor:
    """An accumulating loop's loss: the micro-batch's mean loss divided by the number of micro-batches."""
    return out.loss / ACCUMULATE


def micro_batch_loss_undivided(out: Any) -> torch.Tensor:
    """The bug: the micro-batch's loss, not divided (every gradient ACCUMULATE times too large)."""
    return out.loss


# -- patches ------------------------------------------------------------------------------------

def _patch_rmsnorm(fn: Any) -> Callable[[nn.Module], None]:
    def patch(norm: nn.Module) -> None:
        norm.forward = lambda x: fn.apply(x, norm.weight, norm.variance_epsilon)   # type: ignore[method-assign]
    return patch


def _patch_layernorm(norm: nn.Module) -> None:
    norm.forward = lambda x: _LayerNormDropsTerm.apply(x, norm.weight, norm.bias, norm.eps)   # type: ignore[method-assign]


def _wrap_input(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[nn.Module], None]:
    return lambda mod: wrap_input(mod, fn) and None


def _activation(fn: Any) -> Callable[[nn.Module], None]:
    def patch(mod: nn.Module) -> None:
        mod.forward = lambda x: fn.apply(x)   # type: ignore[method-assign]
    return patch


def _drop_bias_grad(lin: nn.Module) -> None:
    lin.forward = lambda x: _LinearDropsBiasGrad.apply(x, lin.weight, lin.bias)   # type: ignore[method-assign]


def _checkpointed(layer: nn.Module) -> None:
    from torch.utils.checkpoint import checkpoint

    forward = layer.forward
    layer.forward = lambda *a, **k: checkpoint(forward, *a, use_reentrant=False, **k)   # type: ignore[method-assign]


class AdamWNoBiasCorrection(torch.optim.Optimizer):
    """AdamW whose step forgets the bias correction of both moments."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, eps_inside_sqrt: bool = False, correct: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.eps_inside_sqrt, self.correct = eps_inside_sqrt, correct

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:   # type: ignore[override]
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["t"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["t"] += 1
                p.mul_(1 - group["lr"] * group["weight_decay"])
                st["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m, v = st["m"], st["v"]
                if self.correct:
                    m, v = m / (1 - b1 ** st["t"]), v / (1 - b2 ** st["t"])
                denom = (v + group["eps"]).sqrt() if self.eps_inside_sqrt else v.sqrt() + group["eps"]
                p.addcdiv_(m, denom, value=-group["lr"])


@dataclass(frozen=True)
class Reference:
    """How a golden is captured: the reference training step a case is replayed against."""
    optimizer: Any = ADAMW
    clip_grad_norm: Any = None
    accumulate: int = 1
    loss: Callable[[Any], Any] | None = None     # None: the family's loss


REFERENCES = {
    "adamw": Reference(),
    "sgd_clip": Reference(optimizer=SGD, clip_grad_norm=MAX_NORM),   # Adam's first step hides a gradient scale
    "accumulate": Reference(accumulate=ACCUMULATE, loss=micro_batch_share),
}


@dataclass(frozen=True)
class Case:
    id: str
    family: str                                   # decoder | encoder
    module: str | None                            # the module patched (None: the optimizer or the loss)
    patch: Callable[[nn.Module], None] | None
    optimizer: Any = ADAMW
    expect: str = "culprit"                       # culprit | optimizer | loss_factor | pass
    reference: str = "adamw"                      # the golden (REFERENCES)
    clip_grad_norm: Any = None                    # the candidate's own clipping
    loss: Callable[[Any], Any] | None = None      # the candidate's own loss (None: the reference's)

    @property
    def bug(self) -> bool:
        return self.expect != "pass"

    @property
    def optimizer_only(self) -> bool:
        """Judged through the optimizer's step only, which a sketch golden does not hold."""
        return self.expect == "optimizer" or self.reference == "sgd_clip"


CASES = [
    Case("dec_rmsnorm_drops_term", "decoder", "model.layers.1.post_attention_layernorm", _patch_rmsnorm(_RMSNormDropsTerm)),
    Case("dec_silu_approx_backward", "decoder", "model.layers.0.mlp.act_fn", _activation(_ApproxSiLU)),
    Case("dec_attention_backward_scale", "decoder", "model.layers.1.self_attn",
         _wrap_input(scaled_grad(1.0 + 2 ** -6))),
    Case("dec_fp16_denormal_flush", "decoder", "model.layers.0.mlp.down_proj", _wrap_input(backward_only(_flush_denormals))),
    Case("enc_layernorm_drops_term", "encoder", "encoder.layer.1.output.LayerNorm", _patch_layernorm),
    Case("enc_gelu_tanh_backward", "encoder", "encoder.layer.0.intermediate.intermediate_act_fn",
         _activation(_TanhGELUBackward)),
    Case("enc_dense_drops_bias_grad", "encoder", "encoder.layer.1.intermediate.dense", _drop_bias_grad),
    Case("dec_adamw_no_bias_correction", "decoder", None, None, expect="optimizer",
         optimizer=no_decay(AdamWNoBiasCorrection, lr=1e-3, weight_decay=0.1)),
    Case("dec_adamw_eps_inside_sqrt", "decoder", None, None, expect="optimizer",
         optimizer=no_decay(AdamWNoBiasCorrection, lr=1e-3, weight_decay=0.1, eps_inside_sqrt=True, correct=True,
                            eps=1e-6)),
    Case("dec_weight_decay_on_norms", "decoder", None, None, expect="optimizer",
         optimizer=(torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.1})),
    Case("dec_clip_by_sum_of_norms", "decoder", None, None, expect="optimizer", optimizer=SGD, reference="sgd_clip",
         clip_grad_norm=_clip(_sum_of_norms)),
    Case("dec_accumulation_does_not_divide", "decoder", None, None, expect="loss_factor", reference="accumulate",
         loss=micro_batch_loss_undivided),
    # correct alternates
    Case("alt_dec_exact_rmsnorm_backward", "decoder", "model.layers.1.post_attention_layernorm",
         _patch_rmsnorm(_RMSNormExact), expect="pass"),
    Case("alt_dec_checkpointing", "decoder", "model.layers.0", _checkpointed, expect="pass"),
    Case("alt_dec_adamw_foreach", "decoder", None, None, expect="pass",
         optimizer=no_decay(torch.optim.AdamW, lr=1e-3, weight_decay=0.1, foreach=True)),
    Case("alt_dec_own_adamw", "decoder", None, None, expect="pass",
         optimizer=no_decay(AdamWNoBiasCorrection, lr=1e-3, weight_decay=0.1, correct=True)),
    Case("alt_enc_eager_attention", "encoder", None, None, expect="pass"),
    Case("alt_dec_split_k_weight_grad", "decoder", "model.layers.1.mlp.up_proj", _linear_split_k, expect="pass"),
    Case("alt_dec_own_clipping", "decoder", None, None, expect="pass", optimizer=SGD, reference="sgd_clip",
         clip_grad_norm=_clip(_root_sum_of_squares)),
]

LADDERS = {"bf16": ["bfloat16", "float32"], "fp16": ["float16", "float32"]}


def build(case: Case) -> nn.Module:
    model = (decoder if case.family == "decoder" else encoder)()
    if case.id == "alt_enc_eager_attention":
        model = bert("eager")
    if case.patch is not None and case.module is not None:
        case.patch(model.get_submodule(case.module))
    return model
