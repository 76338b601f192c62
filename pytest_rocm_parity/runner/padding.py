"""Which positions of a recorded output are padding, and so not judged.

Padded positions hold whatever an attention implementation leaves there (zeros, the NaN rows of a
fully masked softmax), so capture keeps their float64 truth finite and replay leaves them out. What
is padding follows the Hugging Face convention: ``attention_mask == 0`` in the model's inputs. The
hard part is which outputs that mask runs along. An encoder-decoder model's mask is its encoder's:
the decoder's outputs run over the decoder's tokens (``decoder_attention_mask``, or all of them),
even when the two lengths are equal. And a (batch, n) output is a sequence only when n is not one
of the model's feature widths: a pooler's (batch, hidden) output with hidden equal to the padded
length would otherwise lose the columns of the padded positions. The towers of a multimodal model
that read no text (named for vision, image, audio or speech) are judged whole.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_rocm_parity.runner.engine import OUTPUT
from pytest_rocm_parity.runner.tree import tensor_leaves

# config attributes that give the width of a (batch, width) output that is not a sequence
_WIDTHS = ("hidden_size", "d_model", "n_embd", "num_labels", "projection_dim", "vocab_size")


# the model inputs that say which positions are padding (1 or True: a token, 0: padding)
MASK_INPUTS = ("attention_mask", "decoder_attention_mask")
# ... in PyTorch's convention (nn.TransformerEncoder, nn.MultiheadAttention): True is padding
PAD_INPUTS = ("src_key_padding_mask", "key_padding_mask")


def mask_input(path: str) -> bool:
    """Whether input leaf ``path`` is a padding mask, by its name wherever it is passed
    (``kwargs.attention_mask``, ``args.0.attention_mask`` in a features dict): its values are a
    convention, not an activation, even where it is a float 0/1 tensor."""
    return path.rpartition(".")[2] in MASK_INPUTS + PAD_INPUTS


def mask_inputs(args: Any, kwargs: Any, unread: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The padding masks of a call by name (mask_input), the shallowest of each name: keywords, or
    the keys of a dict passed in them (a sentence-transformers model called with its features).
    ``unread``: input paths the reference's forward never read (capture.DataFlow.watch), which pad
    nothing."""
    leaves = tensor_leaves({"args": args, "kwargs": kwargs})
    found: dict[str, Any] = {}
    for path in sorted((p for p in leaves if mask_input(p) and p not in unread), key=lambda p: p.count(".")):
        found.setdefault(path.rpartition(".")[2], leaves[path])
    return found


def valid_positions(mask: Any) -> Any:
    """The (batch, seq) positions to judge: where ``mask`` is nonzero; None when it is no 2-D mask of
    0/1 (integer, bool or float) values, or has no padding. An additive float mask (0 and -inf) is
    not this convention."""
    if mask is None or not hasattr(mask, "dim") or mask.dim() != 2:
        return None
    if mask.is_floating_point() and not (bool(((mask == 0) | (mask == 1)).all()) and bool((mask == 1).any())):
        return None   # additive (0 and -inf, or all 0: nothing masked), not 0/1
    valid = mask != 0
    return None if bool(valid.all()) else valid


@dataclass(frozen=True)
class Padding:
    """The padding of one model call: the encoder's (or only) mask, the decoder's, and which
    modules each applies to."""

    valid: Any                  # (batch, seq) bool of the model input attention_mask, or None
    decoder_valid: Any = None   # of decoder_attention_mask, in an encoder-decoder model
    encoder_decoder: bool = False
    widths: frozenset[int] = frozenset()
    channel_first: frozenset[str] = frozenset()   # convolutions: (batch, channels, time, ...) outputs
    frames: Any = None          # (batch, frames) bool: the mask over a speech encoder's frames, or None
    said: str = "attention_mask == 0"   # which input said so, for the note
    # calls whose (batch * seq, ...) leaves are the batch's tokens flattened: those the golden records
    # making a discrete choice (a MoE router); elsewhere a first dim of batch * seq may be anything
    # (a time-major model's (seq * batch, ...), another input's rows)
    flat_keys: frozenset[str] = frozenset()

    @classmethod
    def of(cls, model: Any, args: Any, kwargs: Any, unread: frozenset[str] = frozenset()) -> Padding | None:
        """The padding of ``model`` called on ``(args, kwargs)``; None where nothing is padded.
        ``unread``: as mask_inputs'."""
        kw = mask_inputs(args, kwargs, unread)
        valid = valid_positions(kw.get("attention_mask"))
        said = "attention_mask == 0"
        named = next((n for n in PAD_INPUTS if n in kw), None)   # mask_inputs: tensors only
        if valid is None and named is not None and not kw[named].is_floating_point() and _batch_first(model):
            valid, said = valid_positions(kw[named] == 0), f"{named} true"
        dec = valid_positions(kw.get("decoder_attention_mask"))
        if valid is None and dec is None:
            return None
        enc_dec = _encoder_decoder(model)
        if not enc_dec:
            dec = None
            if valid is None:
                return None
        # every config's: a wrapper without one (sentence-transformers) holds the model that has it
        configs = [getattr(m, "config", None) for m in _modules(model)]
        widths = frozenset(v for c in configs if c is not None for a in _WIDTHS
                           if isinstance(v := getattr(c, a, None), int) and not isinstance(v, bool))
        import torch

        convs = (torch.nn.modules.conv._ConvNd,)
        channel_first = frozenset(n for n, m in model.named_modules() if isinstance(m, convs)) \
            if hasattr(model, "named_modules") else frozenset()
        return cls(valid, dec, enc_dec, widths, channel_first, _frames(model, kw.get("attention_mask"), valid), said)

    def of_leaf(self, key: str, leaf: str) -> Any:
        """The (batch, seq) mask of module call ``key``'s output ``leaf`` (OUTPUT: the model's own)."""
        if _other_modality(leaf if key == OUTPUT else key.split("#", 1)[0]):
            return None
        if not self.encoder_decoder:
            return self.valid
        if key == OUTPUT:
            return self.valid if leaf.split(".", 1)[0].startswith("encoder_") else self.decoder_valid
        return self.valid if "encoder" in key.split("#", 1)[0].split(".") else self.decoder_valid

    def seq_dim(self, t: Any, valid: Any, leaf: str = "", key: str = "") -> int | None:
        """The dim of ``t`` that runs over the sequence of the (batch, seq) ``valid`` mask: 1 in a
        (batch, seq, ...) leaf, 2 in a (batch, heads, seq, ...) one (attention weights, whose padded
        query rows a float64 softmax leaves NaN) or in a convolution's (batch, channels, seq)
        output; None where ``t`` has neither layout. A (batch, n) leaf as wide as a feature width
        is features, unless its name is a per-token field."""
        if valid is None or t.dim() < 2 or t.shape[0] != valid.shape[0]:
            return None
        conv = key.split("#", 1)[0] in self.channel_first
        if t.shape[1] == valid.shape[1] and not conv and not (t.dim() == 2 and t.shape[1] in self.widths
                                                              and leaf.rpartition(".")[2] not in _PER_TOKEN):
            return 1
        return 2 if t.dim() >= 3 and t.shape[2] == valid.shape[1] else None

    def _matching(self, key: str, leaf: str, t: Any) -> tuple[Any, int | None]:
        """The mask of ``t``'s positions and the dim it runs along: the input's, or over a speech
        encoder's frames where ``t`` runs over those; dim 0 with the mask flattened where ``t``'s
        first dim is every token of the batch in a call of ``flat_keys`` (a MoE router's
        (batch * seq, experts) logits and top-k indices)."""
        valid = self.of_leaf(key, leaf)
        d = self.seq_dim(t, valid, leaf, key)
        if d is None and valid is not None and valid is self.valid and self.frames is not None:
            valid = self.frames
            d = self.seq_dim(t, valid, leaf, key)
        if d is None and valid is not None and key in self.flat_keys and t.dim() >= 1 and valid.shape[1] > 1 \
                and t.shape[0] == valid.numel():
            return valid.reshape(-1), 0
        return valid, d

    def padded(self, key: str, leaf: str, t: Any) -> Any:
        """A bool mask that broadcasts over ``t``, true at its padded positions; None where none apply."""
        valid, d = self._matching(key, leaf, t)
        if d is None:
            return None
        shape = [1] * t.dim()
        if d == 0:
            shape[0] = valid.shape[0]
        else:
            shape[0], shape[d] = valid.shape
        return ~valid.to(t.device).reshape(shape)

    def unpadded(self, key: str, leaf: str, *ts: Any) -> tuple[Any, ...]:
        """``ts`` (of one shape) with their padded positions left out, flattened over (batch, seq)."""
        ref = ts[1] if len(ts) > 1 else ts[0]
        valid, d = self._matching(key, leaf, ref)
        if d is None or any(tuple(t.shape) != tuple(ref.shape) for t in ts):
            return ts
        if d == 0:
            return tuple(t[valid.to(t.device)] for t in ts)
        return tuple(t.movedim(d, 1)[valid.to(t.device)] for t in ts)

    def note(self) -> str:
        """What the verdict left out, in words."""
        parts = []
        if self.valid is not None:
            parts.append(f"{int((~self.valid).sum())} padded positions ({self.said})"
                         + (" of the encoder's outputs" if self.encoder_decoder else ""))
        if self.frames is not None:
            parts.append(f"{int((~self.frames).sum())} padded frames of the encoder (derived from it)")
        if self.decoder_valid is not None:
            parts.append(f"{int((~self.decoder_valid).sum())} of the decoder's (decoder_attention_mask == 0)")
        return f"{' and '.join(parts)} not judged"


# Hugging Face output fields of one value per token: (batch, seq) whatever the feature widths, so a
# question-answering model's span logits leave out their padded positions even where the padded
# length equals hidden_size
_PER_TOKEN = frozenset({"start_logits", "end_logits"})

# Name parts of the towers of a multimodal model that read no text (CLIP's vision_model, a VLM's
# vision_tower, image_embeds): the text's attention_mask says nothing about their positions, even
# where their token count equals the text's length
_OTHER_MODALITIES = ("vision", "visual", "image", "audio", "speech")


def _frames(model: Any, mask: Any, valid: Any) -> Any:
    """The mask over the frames of a speech encoder whose input mask is per sample (Wav2Vec2, HuBERT,
    WavLM): the model's own conversion (Hugging Face's _get_feature_vector_attention_mask), where
    the two lengths differ; None elsewhere."""
    if valid is None:
        return None
    for m in _modules(model):
        lengths = getattr(m, "_get_feat_extract_output_lengths", None)
        to_frames = getattr(m, "_get_feature_vector_attention_mask", None)
        if callable(lengths) and callable(to_frames):
            try:
                n = int(lengths(valid.shape[1]))
                frames = to_frames(n, mask.long()).bool()
            except Exception:   # another signature: its frames are judged whole
                return None
            return frames if n != valid.shape[1] and tuple(frames.shape) == (valid.shape[0], n) else None
    return None


def _batch_first(model: Any) -> bool:
    """Whether the model's attentions run (batch, seq, ...): nn.MultiheadAttention's default is
    (seq, batch, ...), which a (batch, seq) mask cannot tell apart where the two lengths are equal."""
    import torch

    attns = [m for m in _modules(model) if isinstance(m, torch.nn.MultiheadAttention)]
    return bool(attns) and all(m.batch_first for m in attns)


def _modules(model: Any) -> list[Any]:
    return [m for _, m in model.named_modules()] if hasattr(model, "named_modules") else [model]


def _other_modality(path: str) -> bool:
    return any(m in part for part in path.lower().split(".") for m in _OTHER_MODALITIES)


def _encoder_decoder(model: Any) -> bool:
    """Whether ``model`` runs an encoder and a decoder over two sequences: its Hugging Face config
    says so, or it has modules named ``encoder`` and ``decoder``."""
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False) is True:
        return True
    names = {part for name, _ in model.named_modules() for part in name.split(".")} if hasattr(model, "named_modules") else set()
    return "encoder" in names and "decoder" in names
