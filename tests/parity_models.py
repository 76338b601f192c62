"""The test suite's models: tiny random-init models of the families a CUDA-to-ROCm migration meets,
small hand-written ones, and the ways to plant a bug in them.

Built from configs with seeded weights (no hub): each call returns the same weights, so a capture on
one variant and a replay on another differ only in what the variant changes. A bug changes a
module's ``forward`` attribute (or a flag that is not a parameter), never the module tree or the
weights, so the golden of the unchanged model is not stale for it. Also copied into pytester
projects, so it imports nothing else of the test suite.
"""
from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
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


def plant_expert(model: nn.Module, expert: int | None, scale: float = 1.05, layer: int = 0) -> nn.Module:
    """A bug in the first Mixtral layer's experts module: expert ``expert``'s output scaled by
    ``scale`` on the tokens routed to it (its weights' slice read wrong), or every expert's (None)."""
    exp = model.model.layers[layer].mlp.experts   # type: ignore[union-attr, index]

    def hook(mod: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        if expert is None:
            return out * scale
        h, idx, w = args[:3]
        sel = idx == expert
        rows = sel.any(-1)
        gate, up = F.linear(h[rows], mod.gate_up_proj[expert]).chunk(2, dim=-1)
        y = F.linear(mod.act_fn(gate) * up, mod.down_proj[expert])
        out = out.clone()
        out[rows] += (scale - 1) * (w * sel).sum(-1)[rows].unsqueeze(-1).to(y.dtype) * y
        return out
    exp.register_forward_hook(hook)
    return model


def t5(**config: Any) -> nn.Module:
    """A 2+2-layer T5 (cross-attention, relative positions); ``config`` overrides any field."""
    from transformers import T5Config, T5Model

    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, use_cache=False)
    return T5Model(T5Config(**{**fields, **config})).eval()


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


def suggested_tolerances(text: str) -> list[Any]:
    """Every ``tolerance=Tolerance(...)`` a failure's message suggests, evaluated as a user pastes it."""
    from pytest_rocm_parity import Tolerance

    found = []
    for part in text.split("tolerance=Tolerance(")[1:]:
        depth, end = 1, 0
        while depth:
            depth += {"(": 1, ")": -1}.get(part[end], 0)
            end += 1
        found.append(eval("Tolerance(" + part[:end], {"Tolerance": Tolerance}))
    return found


# One training step's batch, optimizer and loss for the small check_train models (width 32 in)
TRAIN_X = torch.randn(16, 32, generator=torch.Generator().manual_seed(2))
TRAIN_SGD = (torch.optim.SGD, {"lr": 0.1})


def mean_square(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


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


# --- families built from transformers configs and by hand: each build_<family>() returns (model,
# inputs); FAMILY_BUGS[family] names the deep sub-module plant_family plants its bug in ---------

SEED = 0


def _ids(vocab: int, shape: tuple[int, int], seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# --- a vision transformer ---------------------------------------------------------------------

def build_vit() -> tuple[nn.Module, Any]:
    import transformers

    torch.manual_seed(SEED)
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    model = transformers.ViTModel(cfg).eval()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return model, {"pixel_values": pixels}


# --- an encoder-decoder with cross-attention and relative positions ------------------------

def build_t5() -> tuple[nn.Module, Any]:
    model = t5(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_decoder_layers=2, relative_attention_num_buckets=8,
               decoder_start_token_id=0, pad_token_id=0)
    return model, {"input_ids": _ids(64, (2, 10), 1), "decoder_input_ids": _ids(64, (2, 7), 2)}


# --- a dual-tower model -----------------------------------------------------------------------

def build_clip() -> tuple[nn.Module, Any]:
    import transformers

    torch.manual_seed(SEED)
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=16, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=16,
                  patch_size=4)
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    model = transformers.CLIPModel(cfg).eval()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": _ids(64, (2, 8), 2), "pixel_values": pixels}


# --- a state-space model ----------------------------------------------------------------------

def build_mamba() -> tuple[nn.Module, Any]:
    import transformers

    torch.manual_seed(SEED)
    cfg = transformers.MambaConfig(vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                                   conv_kernel=4, time_step_rank=4, use_cache=False)
    model = transformers.MambaModel(cfg).eval()
    return model, {"input_ids": _ids(64, (2, 12), 1)}


# --- a UNet (down, mid and up blocks of convolutions, as diffusers lays one out) --------------

class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(4, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.shortcut(x) + h


class SpatialAttention(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, ch)
        self.to_q = nn.Linear(ch, ch)
        self.to_k = nn.Linear(ch, ch)
        self.to_v = nn.Linear(ch, ch)
        self.to_out = nn.Linear(ch, ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        s = self.norm(x).flatten(2).transpose(1, 2)
        y = F.scaled_dot_product_attention(self.to_q(s)[:, None], self.to_k(s)[:, None], self.to_v(s)[:, None])[:, 0]
        return x + self.to_out(y).transpose(1, 2).reshape(b, c, h, w)


class DownBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int, attn: bool, down: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResBlock(cin, cout, temb), ResBlock(cout, cout, temb)])
        self.attentions = nn.ModuleList([SpatialAttention(cout), SpatialAttention(cout)]) if attn else None
        self.downsample = nn.Conv2d(cout, cout, 3, stride=2, padding=1) if down else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        skips = []
        for i, r in enumerate(self.resnets):
            x = r(x, temb)
            if self.attentions is not None:
                x = self.attentions[i](x)
            skips.append(x)
        if self.downsample is not None:
            x = self.downsample(x)
        return x, tuple(skips)


class AttnDownBlock(DownBlock):
    """A second class in the down stack, as diffusers mixes CrossAttnDownBlock2D and DownBlock2D."""

    def __init__(self, cin: int, cout: int, temb: int, down: bool) -> None:
        super().__init__(cin, cout, temb, attn=True, down=down)


class MidBlock(nn.Module):
    def __init__(self, ch: int, temb: int) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResBlock(ch, ch, temb), ResBlock(ch, ch, temb)])
        self.attentions = nn.ModuleList([SpatialAttention(ch)])

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x, temb)
        return self.resnets[1](self.attentions[0](x), temb)


class UpBlock(nn.Module):
    def __init__(self, cin: int, skip: int, cout: int, temb: int, up: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResBlock(cin + skip, cout, temb), ResBlock(cout + skip, cout, temb)])
        self.upsample = nn.Conv2d(cout, cout, 3, padding=1) if up else None

    def forward(self, x: torch.Tensor, skips: tuple[torch.Tensor, ...], temb: torch.Tensor) -> torch.Tensor:
        for r, s in zip(self.resnets, skips):
            x = r(torch.cat([x, s], dim=1), temb)
        if self.upsample is not None:
            x = self.upsample(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return x


class TimestepEmbedding(nn.Module):
    def __init__(self, ch: int, temb: int) -> None:
        super().__init__()
        self.ch = ch
        self.linear_1 = nn.Linear(ch, temb)
        self.linear_2 = nn.Linear(temb, temb)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.ch // 2
        freqs = torch.exp(-torch.arange(half, dtype=torch.float32, device=t.device) * (4.0 / half))
        arg = t.to(freqs.dtype)[:, None] * freqs[None]
        emb = torch.cat([arg.sin(), arg.cos()], dim=-1).to(self.linear_1.weight.dtype)
        return self.linear_2(F.silu(self.linear_1(emb)))


class TinyUNet(nn.Module):
    """conv_in, a time embedding, down (two classes), mid and up stacks, conv_out."""

    def __init__(self, ch: int = 8, temb: int = 16) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.time_embedding = TimestepEmbedding(ch, temb)
        self.down_blocks = nn.ModuleList([DownBlock(ch, ch, temb, attn=False, down=True),
                                          AttnDownBlock(ch, 2 * ch, temb, down=False)])
        self.mid_block = MidBlock(2 * ch, temb)
        self.up_blocks = nn.ModuleList([UpBlock(2 * ch, 2 * ch, 2 * ch, temb, up=True),
                                        UpBlock(2 * ch, ch, ch, temb, up=False)])
        self.conv_norm_out = nn.GroupNorm(4, ch)
        self.conv_out = nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        temb = self.time_embedding(timestep)
        x = self.conv_in(sample)
        skips: list[torch.Tensor] = []
        for block in self.down_blocks:
            x, s = block(x, temb)
            skips.extend(s)
        x = self.mid_block(x, temb)
        for block in self.up_blocks:
            n = len(block.resnets)
            x = block(x, tuple(reversed(skips[-n:])), temb)
            del skips[-n:]
        return self.conv_out(F.silu(self.conv_norm_out(x)))


def build_unet() -> tuple[nn.Module, Any]:
    torch.manual_seed(SEED)
    model = TinyUNet().eval()
    sample = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    return model, (sample, torch.tensor([3.0, 11.0]))


FAMILIES = {"vit": build_vit, "t5": build_t5, "clip": build_clip, "mamba": build_mamba, "unet": build_unet}


def _tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _exact_gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def _scaled(mod: nn.Module, factor: float) -> Any:
    inner = mod.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs) * factor
    return forward


# family -> (the sub-module the bug is planted in, what the bug does)
FAMILY_BUGS: dict[str, tuple[str, str]] = {
    # an MLP activation swapped for its tanh approximation, two levels below a block
    "vit": ("layers.1.mlp.activation_fn", "tanh-approximate GELU"),
    # the decoder cross-attention's value projection, four levels below a block (relative positions)
    "t5": ("decoder.block.1.layer.1.EncDecAttention.v", "value projection scaled by 1.01"),
    # the vision tower's MLP activation swapped (quick GELU -> exact GELU)
    "clip": ("vision_model.encoder.layers.1.mlp.activation_fn", "exact GELU for quick GELU"),
    # the state-space layer's projection to time steps and B, C (dt_proj is read as a weight, not called)
    "mamba": ("layers.1.mixer.x_proj", "x projection scaled by 1.01"),
    # a convolution inside a resnet of the second down block, three levels below it
    "unet": ("down_blocks.1.resnets.0.conv2", "convolution scaled by 1.01"),
}


def plant_family(model: nn.Module, family: str) -> nn.Module:
    """The bug of ``family`` planted in ``model`` (in place; the module tree is unchanged)."""
    name, _ = FAMILY_BUGS[family]
    mod = model.get_submodule(name)
    if family == "vit":
        mod.forward = _tanh_gelu
    elif family == "clip":
        mod.forward = _exact_gelu
    else:
        mod.forward = _scaled(mod, 1.01)
    return model


def family(name: str) -> tuple[nn.Module, Any]:
    """The family's model and inputs, with its bug planted when $FAMILY_BUG is set."""
    model, inputs = FAMILIES[name]()
    if os.environ.get("FAMILY_BUG"):
        plant_family(model, name)
    return model, inputs


# --- a stack of residual blocks with a switchable bug (the report tests) -------------------------

class HalfRoundingBlock(nn.Module):
    """A residual MLP block whose ``bug`` flag makes its float32 kernel round through half."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)
        self.bug = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(self.act(self.fc1(x)))
        if self.bug and y.dtype != torch.float64:  # a float32 kernel that silently rounds through half
            y = y.half().float()
        return x + y


class BlockStack(nn.Module):
    """``copies``: each block called through a deep copy made in the forward (a module folded on the
    fly, as torch.nn.utils.fusion.fuse_conv_bn_eval does), which carries the block's hooks."""

    def __init__(self, d: int = 32, n: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(HalfRoundingBlock(d) for _ in range(n))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 8)
        self.copies = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = (copy.deepcopy(b) if self.copies else b)(x)
        return self.head(self.norm(x))


def block_stack(bug_block: int | None = None) -> tuple[BlockStack, torch.Tensor]:
    """Four residual blocks, the bug switched on in ``bug_block``, and an input."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    m = BlockStack().eval()
    if bug_block is not None:
        m.blocks[bug_block].bug = True
    return m, torch.randn(16, 32, generator=g)


# --- two linears around a ReLU (the reliability tests) --------------------------------------------

class Tiny(nn.Module):
    """Two linears around a ReLU; ``poison`` (not a parameter, so not in the fingerprint) makes
    the candidate differ from the reference: "nan"/"inf" at output [0, 1], "flip" in int outputs."""

    def __init__(self, d: int = 4, out: str = "plain") -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(d, d)
        self.out = out
        self.poison = ""

    def forward(self, x: torch.Tensor) -> Any:
        y = self.fc2(self.act(self.fc1(x)))
        if self.poison in ("nan", "inf"):
            y = y.clone()
            y[0, 1] = float(self.poison)
        return y


def tiny(seed: int = 0, **kw: Any) -> Tiny:
    torch.manual_seed(seed)
    return Tiny(**kw)


def tiny_inputs(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
