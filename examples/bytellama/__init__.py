"""The example suite's model: ``bytellama``, a small byte-level Llama trained on Python source.

It lives beside the repository's examples, not in the wheel: the plugin needs no model of its own,
and the example suite and the tests import it from this folder (pytest's ``pythonpath`` names
``examples``). Files (``examples/bytellama/``):

* ``config.json``       - a ``LlamaConfig`` (4 layers, hidden 256, 8 query heads / 2 KV heads, GQA)
* ``model.safetensors`` - fp32 weights (``LlamaForCausalLM`` state dict, untied ``lm_head``)
* ``heldout.txt``       - ~64 KB of Python standard-library source from files never trained on
* ``TRAINING.json``     - recipe, steps, device, versions, final loss and held-out perplexity
* ``train.py``          - the training script that produced them

Vocabulary (259 ids): ids 0-255 are the raw UTF-8 bytes, 256 is BOS, 257 is EOS, 258 is PAD.
Training wrapped every source file as ``BOS + bytes + EOS``; PAD never occurs in training.

``transformers`` is imported inside :func:`load_bytellama`; a missing install raises
:class:`ModelDependencyMissing` naming the extra to install.  See ``docs/model.md``.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import torch

from pytest_rocm_parity.errors import InputError, ParityError

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "VOCAB_SIZE",
    "BYTELLAMA_DIR",
    "ModelDependencyMissing",
    "load_bytellama",
    "bytellama_config",
    "training_record",
    "encode",
    "decode",
    "heldout_text",
    "heldout_ids",
    "heldout_windows",
    "eval_batch",
    "perplexity",
    "heldout_perplexity",
]

BYTELLAMA_DIR = Path(__file__).resolve().parent

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259
#: Context length the model was trained with (and ``max_position_embeddings``).
CONTEXT = 512


class ModelDependencyMissing(ParityError, ImportError):
    """An optional dependency of the example model (transformers) is not installed."""


def _require_transformers() -> Any:
    try:
        import transformers  # noqa: F401
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:  # pragma: no cover - exercised only without transformers
        raise ModelDependencyMissing(
            "the example model bytellama needs the 'transformers' package, which is not "
            f"installed ({exc}); install it with: pip install 'pytest-rocm-parity[lm]'"
        ) from exc
    return LlamaConfig, LlamaForCausalLM


def bytellama_config(path: str | Path | None = None) -> dict:
    """The model's ``config.json`` as a dict."""
    p = Path(path) if path is not None else BYTELLAMA_DIR
    return json.loads((p / "config.json").read_text(encoding="utf-8"))


def training_record(path: str | Path | None = None) -> dict:
    """The model's ``TRAINING.json`` (recipe, steps, device, held-out perplexity)."""
    p = Path(path) if path is not None else BYTELLAMA_DIR
    return json.loads((p / "TRAINING.json").read_text(encoding="utf-8"))


def _config_kwargs(cfg: dict) -> dict:
    # Keys that describe the file rather than the model; transformers 4.x and 5.x both
    # accept the rest (rope_theta is mapped to rope_parameters by 5.x).
    drop = {"transformers_version", "architectures", "_comment", "torch_dtype", "dtype"}
    return {k: v for k, v in cfg.items() if k not in drop}


def load_bytellama(
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    *,
    attn_implementation: str | None = None,
    path: str | Path | None = None,
) -> Any:
    """Build ``transformers.LlamaForCausalLM`` and load the committed fp32 weights, in eval mode.

    ``dtype`` (default ``torch.float32``) casts the parameters; the rotary ``inv_freq`` buffers
    stay in float32, as ``from_pretrained(dtype=...)`` leaves them.  ``attn_implementation``
    ("eager", "sdpa", ...) is passed to the config when given; otherwise transformers picks.
    ``path`` loads another directory with the same layout (e.g. a fresh training run).
    """
    LlamaConfig, LlamaForCausalLM = _require_transformers()
    from safetensors.torch import load_file

    p = Path(path) if path is not None else BYTELLAMA_DIR
    weights = p / "model.safetensors"
    if not weights.is_file():
        raise ParityError(
            f"bytellama weights not found at {weights}: pass path= a folder holding model.safetensors "
            "and config.json, or run examples/bytellama/train.py to produce them"
        )
    kwargs = _config_kwargs(bytellama_config(p))
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    config = LlamaConfig(**kwargs)
    model = LlamaForCausalLM(config)
    state = load_file(str(weights))
    model.load_state_dict(state, strict=True)
    target = dtype if dtype is not None else torch.float32
    fp32_buffers = {
        name: buf.detach().clone()
        for name, buf in model.named_buffers()
        if name.endswith("inv_freq")
    }
    model.to(device=device, dtype=target)
    for name, buf in fp32_buffers.items():
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        setattr(owner, attr, buf.to(device=device))
    model.eval()
    return model


def encode(text: str, *, bos: bool = False, eos: bool = False) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as a 1-D ``torch.long`` tensor (optionally with BOS/EOS ids)."""
    if not isinstance(text, str):
        raise InputError(f"encode() takes a str, got {type(text).__name__}")
    data = text.encode("utf-8")
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.long) if data else (
        torch.empty(0, dtype=torch.long)
    )
    parts = []
    if bos:
        parts.append(torch.tensor([BOS_ID], dtype=torch.long))
    parts.append(ids)
    if eos:
        parts.append(torch.tensor([EOS_ID], dtype=torch.long))
    return torch.cat(parts) if len(parts) > 1 else ids


def decode(ids: torch.Tensor | Iterable[int]) -> str:
    """Inverse of :func:`encode`: byte ids to text; BOS/EOS/PAD are dropped, bad UTF-8 replaced."""
    if isinstance(ids, torch.Tensor):
        seq = ids.detach().reshape(-1).cpu().tolist()
    else:
        seq = [int(i) for i in ids]
    bad = [i for i in seq if not 0 <= i < VOCAB_SIZE]
    if bad:
        raise InputError(f"decode(): token id {bad[0]} is outside the vocabulary [0, {VOCAB_SIZE})")
    return bytes(i for i in seq if i < 256).decode("utf-8", errors="replace")


@lru_cache(maxsize=1)
def heldout_text() -> str:
    """The held-out sample (Python stdlib source from files never trained on)."""
    return (BYTELLAMA_DIR / "heldout.txt").read_text(encoding="utf-8")


def heldout_ids() -> torch.Tensor:
    """:func:`heldout_text` encoded (1-D, no BOS)."""
    return encode(heldout_text())


def heldout_windows(seq: int = CONTEXT) -> torch.Tensor:
    """The held-out bytes cut into consecutive non-overlapping windows: shape (n, seq).

    The tail that does not fill a window is dropped.  This is the evaluation set behind the
    perplexity recorded in TRAINING.json (seq=512: 127 windows of the ~64 KB sample).
    """
    ids = heldout_ids()
    n = ids.numel() // seq
    if n == 0:
        raise InputError(f"heldout_windows(seq={seq}): the held-out text is shorter than one window")
    return ids[: n * seq].view(n, seq).clone()


def eval_batch(batch: int = 2, seq: int = 128) -> torch.Tensor:
    """Deterministic held-out windows, shape (batch, seq), for the example suite.

    Window ``i`` starts at byte ``i * ((N - seq) // batch)`` of the held-out sample (N bytes):
    fixed offsets spread over the sample, no RNG, the same on every machine.
    """
    if batch < 1 or seq < 2:
        raise InputError(f"eval_batch(batch={batch}, seq={seq}): need batch >= 1 and seq >= 2")
    if seq > CONTEXT:
        raise InputError(f"eval_batch(seq={seq}): the model's context is {CONTEXT} tokens")
    ids = heldout_ids()
    span = ids.numel() - seq
    if span < 0:
        raise InputError(f"eval_batch(seq={seq}): the held-out text is shorter than seq")
    step = span // batch
    return torch.stack([ids[i * step : i * step + seq] for i in range(batch)]).clone()


@torch.no_grad()
def _nll_sum(model: Any, ids: torch.Tensor) -> tuple[float, int]:
    device = next(model.parameters()).device
    x = ids.to(device)
    out = model(input_ids=x, use_cache=False) if _is_hf(model) else model(x)
    logits = out.logits if hasattr(out, "logits") else out
    logits = logits[:, :-1].float()
    target = x[:, 1:]
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum"
    )
    return float(nll.double().cpu()), int(target.numel())


def _is_hf(model: Any) -> bool:
    return hasattr(model, "config") and hasattr(model, "generation_config")


def perplexity(model: Any, ids: torch.Tensor, *, batch_size: int = 32) -> float:
    """exp(mean next-token NLL) of ``ids`` (shape (B, T) or (T,)) under ``model``.

    Each row predicts its tokens 1..T-1 from the preceding ones; logits are upcast to float32
    before the softmax.  Rows are evaluated ``batch_size`` at a time.
    """
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long:
        raise InputError("perplexity(): ids must be a torch.long tensor of token ids")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise InputError(f"perplexity(): ids must have shape (B, T) with T >= 2, got {tuple(ids.shape)}")
    total, count = 0.0, 0
    for start in range(0, ids.shape[0], batch_size):
        s, c = _nll_sum(model, ids[start : start + batch_size])
        total += s
        count += c
    return math.exp(total / count)


def heldout_perplexity(model: Any, *, seq: int = CONTEXT, batch_size: int = 32) -> float:
    """Perplexity on :func:`heldout_windows` (the number recorded in TRAINING.json)."""
    return perplexity(model, heldout_windows(seq), batch_size=batch_size)
