"""Tiny random-init models of five families, built in code (no hub downloads), and a planted bug each.

Each ``build_<family>()`` returns ``(model, inputs)``; ``BUGS[family]`` names the deep sub-module a
bug is planted in and ``plant(model, family)`` plants it. A bug changes a module's ``forward``
attribute only, never the module tree, so the golden of the unchanged model is not stale for it.

Also copied into pytester projects (tests/families/test_families.py), so it imports nothing of
the test suite.
"""
from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

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
    import transformers

    torch.manual_seed(SEED)
    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                num_heads=4, relative_attention_num_buckets=8, use_cache=False,
                                decoder_start_token_id=0, pad_token_id=0)
    model = transformers.T5Model(cfg).eval()
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


BUILDERS = {"vit": build_vit, "t5": build_t5, "clip": build_clip, "mamba": build_mamba, "unet": build_unet}


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
BUGS: dict[str, tuple[str, str]] = {
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


def plant(model: nn.Module, family: str) -> nn.Module:
    """The bug of ``family`` planted in ``model`` (in place; the module tree is unchanged)."""
    name, _ = BUGS[family]
    mod = model.get_submodule(name)
    if family == "vit":
        mod.forward = _tanh_gelu
    elif family == "clip":
        mod.forward = _exact_gelu
    else:
        mod.forward = _scaled(mod, 1.01)
    return model


def make(family: str) -> tuple[nn.Module, Any]:
    """The family's model and inputs, with the bug planted when $FAMILY_BUG is set."""
    model, inputs = BUILDERS[family]()
    if os.environ.get("FAMILY_BUG"):
        plant(model, family)
    return model, inputs
