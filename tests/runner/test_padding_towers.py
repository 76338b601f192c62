"""The text's attention_mask leaves out padded positions of the text's outputs only: a multimodal
model's vision tower is judged whole, even where its token count equals the text's length."""
from __future__ import annotations

import torch
from torch import nn

from parity_models import capture_then_replay, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec

SEQ = 17   # the vision tower's tokens: 16 patches and the class token


def clip() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=32)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=16,
                  patch_size=4)
    return transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision,
                                                          projection_dim=16)).eval()


def inputs() -> dict[str, torch.Tensor]:
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[:, 6:] = 0
    return {"input_ids": torch.randint(0, 64, (2, SEQ), generator=torch.Generator().manual_seed(1)),
            "attention_mask": mask, "pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))}


def tail_bug(model: nn.Module, name: str) -> nn.Module:
    """A 1% error on the token positions the text pads (6 and later) of one vision module's output."""
    def scale(_m: nn.Module, _a: object, out: torch.Tensor) -> torch.Tensor:
        f = torch.ones(out.shape[1], 1)
        f[6:] = 1.01
        return out * f
    model.get_submodule(name).register_forward_hook(scale)
    return model


def test_a_vision_tower_is_judged_at_the_positions_the_text_pads() -> None:
    spec = CheckSpec(name="clip", dtypes=["float32"])
    res = capture_then_replay(clip, clip(), inputs(), spec)
    assert res[0].passed, verdicts(res)
    name = "vision_model.encoder.layers.1.mlp.fc2"
    res = capture_then_replay(clip, tail_bug(clip(), name), inputs(), spec)
    assert not res[0].passed and res[0].culprit == name, verdicts(res)


def qa() -> nn.Module:
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    return BertForQuestionAnswering(cfg).eval()


def padded_positions_elsewhere(model: nn.Module, mask: torch.Tensor) -> nn.Module:
    """Span logits that differ at the padded positions only (an unpadded attention kernel leaves
    them zero): a correct candidate, since padding is not judged."""
    def zero(_m: nn.Module, _a: object, out: torch.Tensor) -> torch.Tensor:
        return out * mask[..., None].to(out.dtype)
    model.get_submodule("qa_outputs").register_forward_hook(zero)
    return model


def test_span_logits_leave_out_padding_where_the_length_equals_the_hidden_size() -> None:
    """start_logits and end_logits are (batch, seq) with seq == hidden_size == 64: per-token fields,
    not features."""
    inputs = {"input_ids": torch.randint(3, 64, (2, 64), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(2, 64, dtype=torch.long)}
    inputs["attention_mask"][1, -4:] = 0
    res = capture_then_replay(qa, padded_positions_elsewhere(qa(), inputs["attention_mask"]), inputs,
                              CheckSpec(name="qa", dtypes=["float32"]))
    assert res[0].passed, verdicts(res)
    spans = [o for o in res[0].outputs if o.name in ("<output>.start_logits", "<output>.end_logits")]
    assert len(spans) == 2 and all(o.prop is not None and o.prop.numel == 2 * 64 - 4 for o in spans)


class ConvOverTokens(nn.Module):
    """Token embeddings, then a Conv1d over time whose channel count equals the sequence length:
    its (batch, channels, time) output runs over the sequence along dim 2, not dim 1."""

    def __init__(self, bug: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.conv, self.head = nn.Embedding(64, 16), nn.Conv1d(16, 32, 3, padding=1), nn.Linear(32, 8)
        if bug:   # wrong in the last three channels of the padded row
            def hook(_m: nn.Module, _a: object, out: torch.Tensor) -> torch.Tensor:
                f = torch.ones_like(out)
                f[1, 29:] = 1.05
                return out * f
            self.conv.register_forward_hook(hook)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.conv(self.emb(input_ids).transpose(1, 2))
        return self.head(h.transpose(1, 2))


def test_a_convolutions_channels_are_no_positions_where_their_count_equals_the_length() -> None:
    inputs = {"input_ids": torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(2, 32, dtype=torch.long)}
    inputs["attention_mask"][1, -3:] = 0
    spec = CheckSpec(name="conv", dtypes=["float32"], layers=["emb", "conv", "head"], drill=0)
    assert capture_then_replay(ConvOverTokens, ConvOverTokens(), inputs, spec)[0].passed
    res = capture_then_replay(ConvOverTokens, ConvOverTokens(bug=True), inputs, spec)
    assert not res[0].passed and res[0].culprit == "conv", verdicts(res)


def bert_model(attn: str = "sdpa") -> nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        attn_implementation=attn)).eval()


def padded_tokens(dtype: torch.dtype = torch.long) -> dict[str, torch.Tensor]:
    mask = torch.ones(3, 12, dtype=dtype)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    ids = torch.randint(3, 64, (3, 12), generator=torch.Generator().manual_seed(1)) * mask.long()
    return {"input_ids": ids, "attention_mask": mask}


def zero_padded_rows(model: nn.Module, mask: torch.Tensor) -> nn.Module:
    """An attention that never computes padded query rows (a varlen kernel): correct, since padding
    is not judged."""
    for layer in model.encoder.layer:
        def zero(_m: nn.Module, _a: object, out: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            return (out[0] * (mask[..., None] != 0).to(out[0].dtype), *out[1:])
        layer.attention.self.register_forward_hook(zero)
    return model


def test_a_float_attention_mask_is_a_padding_mask_not_an_activation() -> None:
    """Transformers takes a float 0/1 mask: its padded positions are left out, and it is built by the
    candidate (another attention implementation converts it its own way), not fed from the golden."""
    x = padded_tokens(torch.float32)
    spec = CheckSpec(name="bert", dtypes=["float32"])
    swapped = capture_then_replay(lambda: bert_model("sdpa"), bert_model("eager"), x, spec)
    assert swapped[0].passed, verdicts(swapped)
    rows = capture_then_replay(lambda: bert_model("sdpa"), zero_padded_rows(bert_model(), x["attention_mask"]), x, spec)
    assert rows[0].passed and "padded positions (attention_mask == 0) not judged" in " ".join(rows[0].notes), \
        verdicts(rows)


class Embedder(nn.Module):
    """sentence-transformers' calling convention: one features dict in, mean-pooled embedding out,
    and no config of its own (the encoder inside has it)."""

    def __init__(self) -> None:
        super().__init__()
        self.bert = bert_model()
        self.dense = nn.Linear(32, 32)

    def forward(self, features: dict[str, torch.Tensor] | None = None, **kw: torch.Tensor) -> torch.Tensor:
        features = features or kw
        h = self.bert(**features).last_hidden_state
        m = features["attention_mask"][..., None].to(h.dtype)
        return self.dense((h * m).sum(1) / m.sum(1))


def test_a_features_dict_passed_positionally_carries_its_padding() -> None:
    x = padded_tokens()
    cand = Embedder()
    zero_padded_rows(cand.bert, x["attention_mask"])
    res = capture_then_replay(Embedder, cand, (x,), CheckSpec(name="st", dtypes=["float32"]))
    assert res[0].passed, verdicts(res)


def test_a_pooled_output_as_wide_as_the_padded_length_is_features_in_a_wrapper_without_config() -> None:
    """The embedding is (batch, 32), 32 the padded length and the encoder's hidden size; the wrapper
    has no config of its own, and the encoder's still tells a (batch, hidden) output from a sequence:
    a bug in the embedding's columns at the padded positions' indices is judged."""
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[:, 24:] = 0
    x = {"input_ids": torch.randint(3, 64, (2, 32), generator=torch.Generator().manual_seed(1)) * mask,
         "attention_mask": mask}

    def bug(_m: nn.Module, _a: object, out: torch.Tensor) -> torch.Tensor:
        f = torch.ones(out.shape[1])
        f[24:] = 1.05
        return out * f
    cand = Embedder()
    cand.dense.register_forward_hook(bug)
    res = capture_then_replay(Embedder, cand, x, CheckSpec(name="st", dtypes=["float32"]))
    assert not res[0].passed and res[0].culprit == "dense", verdicts(res)


def wav2vec2() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4, feat_extract_norm="layer", do_stable_layer_norm=True,
        mask_time_prob=0.0, attn_implementation="sdpa")).eval()


def test_a_speech_encoders_padded_frames_are_left_out() -> None:
    """The mask is per sample (330), the encoder runs per frame (32): the frames that the model's own
    conversion marks as padding are not judged."""
    mask = torch.ones(3, 330, dtype=torch.long)
    mask[1, 250:] = 0
    mask[2, 150:] = 0
    x = {"input_values": torch.randn(3, 330, generator=torch.Generator().manual_seed(0)) * mask, "attention_mask": mask}
    cand = wav2vec2()
    frames = cand._get_feature_vector_attention_mask(32, mask)
    for layer in cand.encoder.layers:
        def zero(_m: nn.Module, _a: object, out: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            return (out[0] * frames[..., None].to(out[0].dtype), *out[1:])
        layer.attention.register_forward_hook(zero)
    res = capture_then_replay(wav2vec2, cand, x, CheckSpec(name="w2v2", dtypes=["float32"]))
    assert res[0].passed, verdicts(res)
    assert any("padded frames of the encoder" in n for n in res[0].notes), res[0].notes


def whisper() -> nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    return WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=100, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=16,
        max_target_positions=32, pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2)).eval()


def test_a_mask_the_model_never_reads_pads_nothing() -> None:
    """Whisper's encoder ignores its attention_mask (the feature extractor's, 0 past the audio): those
    frames are computed like any other, so they are judged, and a bug in conv1 on them is named
    there, not as a fault between conv1 and conv2."""
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[1, 20:] = 0
    x = {"input_features": torch.randn(2, 16, 32, generator=g), "attention_mask": mask,
         "decoder_input_ids": torch.randint(4, 100, (2, 7), generator=g), "use_cache": False}
    spec = CheckSpec(name="whisper", dtypes=["float32"])
    ok = capture_then_replay(whisper, whisper(), x, spec)
    assert ok[0].passed and not any("padded" in n for n in ok[0].notes), (verdicts(ok), ok[0].notes)
    bug = whisper()

    def late_frames(_m: nn.Module, _a: object, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[1, :, 20:] *= 1.05
        return out
    bug.model.encoder.conv1.register_forward_hook(late_frames)
    res = capture_then_replay(whisper, bug, x, spec)
    assert not res[0].passed and res[0].culprit == "model.encoder.conv1", verdicts(res)
    # the failure says the mask was not read, so a fault on the frames it marks does not read as padding
    assert any(n.startswith("kwargs.attention_mask was given but no operation of the reference's forward read it")
               for n in res[0].notes), res[0].notes


@torch.jit.script
def _scripted_mask_bias(m: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return ((1 - m.to(like.dtype)) * -1e9)[:, None, None, :]


class ScriptMasked(nn.Module):
    """Attention whose mask bias is built by TorchScript, which no torch function mode sees read the
    mask; ``varlen``: the port leaves padded query rows 0, as a varlen kernel never computes them."""

    def __init__(self, varlen: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.qkv, self.o, self.varlen = nn.Linear(8, 32), nn.Linear(32, 96), nn.Linear(32, 32), varlen
        self.eval()

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        bias = _scripted_mask_bias(attention_mask, h)
        b, s, d = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
        y = (torch.softmax(q @ k.transpose(-1, -2) / (d // 4) ** 0.5 + bias, -1) @ v).transpose(1, 2).reshape(b, s, d)
        if self.varlen:
            y = y * (bias[:, 0, 0, :, None] == 0)
        return self.o(y)


def test_a_mask_read_where_the_data_flow_cannot_see_still_pads() -> None:
    """The data flow sees no operation read the mask (TorchScript builds the bias), but the outputs
    change without it: it is read, so its padded positions are left out and a varlen port passes."""
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :5] = 0
    x = {"x": torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(1)), "attention_mask": mask}
    res = capture_then_replay(ScriptMasked, ScriptMasked(varlen=True), x, CheckSpec(name="m", dtypes=["float32"]))
    assert res[0].passed, verdicts(res)
    assert any("5 padded positions" in n for n in res[0].notes), res[0].notes


def test_a_routers_flattened_tokens_leave_out_padding() -> None:
    """Mixtral's router returns (batch * seq, ...) logits and top-k indices: its padded tokens are
    left out as a (batch, seq) leaf's are. Here the candidate routes the padded tokens elsewhere
    (their hidden states are whatever an attention kernel left there)."""
    from parity_models import mixtral, tokens

    x = tokens("left")
    pad = (x["attention_mask"] == 0).reshape(-1)
    cand = mixtral()
    for layer in cand.model.layers:
        def elsewhere(_m: nn.Module, _a: object, out: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            logits, scores, idx = out
            idx = idx.clone()
            idx[pad] = (idx[pad] + 1) % 4
            return logits, scores, idx
        layer.mlp.gate.register_forward_hook(elsewhere)
    res = capture_then_replay(mixtral, cand, x, CheckSpec(name="moe", dtypes=["float32"]))
    assert res[0].passed, verdicts(res)


class TimeMajor(nn.Module):
    """A token model that runs time-major (CTC style): (seq * batch, ...) rows that are not the batch's
    tokens in batch-major order, and no discrete choice, so nothing is left out of them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.proj, self.out = nn.Embedding(40, 32), nn.Linear(32, 32), nn.Linear(32, 40)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids) * attention_mask[..., None]
        b, s, h = x.shape
        return self.out(torch.tanh(self.proj(x.transpose(0, 1).reshape(s * b, h))))


def test_rows_as_many_as_the_tokens_are_not_taken_for_them_in_a_module_that_chooses_nothing() -> None:
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 4:] = 0   # batch-major flat rows 12..15 would be padding; time-major row 12 is (batch 0, seq 6)
    x = {"input_ids": torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(1)), "attention_mask": mask}
    cand = TimeMajor().eval()

    def bug(_m: nn.Module, _a: object, out: torch.Tensor) -> torch.Tensor:
        f = torch.ones_like(out)
        f[12] = 1.01
        return out * f
    cand.proj.register_forward_hook(bug)
    res = capture_then_replay(lambda: TimeMajor().eval(), cand, x, CheckSpec(name="tm", dtypes=["float32"]))
    assert not res[0].passed and res[0].culprit == "proj", verdicts(res)


def test_a_key_padding_mask_of_a_sequence_first_encoder_marks_no_positions() -> None:
    """nn.TransformerEncoder's default layout is (seq, batch, ...): where the two lengths are equal a
    (batch, seq) mask would be read across it, leaving real positions out."""
    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0), 2,
                                     enable_nested_tensor=False).eval()

    pad = torch.zeros(6, 6, dtype=torch.bool)
    pad[5, 3:] = True
    x = {"src": torch.randn(6, 6, 32, generator=torch.Generator().manual_seed(1)), "src_key_padding_mask": pad}
    cand = build()

    def bug(_m: nn.Module, _a: object, out: torch.Tensor) -> torch.Tensor:
        f = torch.ones_like(out)
        f[5, 3] = 1.01   # seq 5 of sample 3: a real token
        return out * f
    cand.layers[1].linear2.register_forward_hook(bug)
    res = capture_then_replay(build, cand, x, CheckSpec(name="enc", dtypes=["float32"]))
    assert not res[0].passed and res[0].culprit == "layers.1.linear2", verdicts(res)


def test_an_additive_float_mask_masking_nothing_leaves_no_position_out() -> None:
    """All zeros is an additive mask that masks nothing (0: attend), not a 0/1 mask padding everything."""
    from pytest_rocm_parity.runner.padding import Padding

    assert Padding.of(nn.Linear(2, 2), (), {"attention_mask": torch.zeros(2, 6)}) is None
    assert Padding.of(nn.Linear(2, 2), (), {"attention_mask": torch.tensor([[0.0, float("-inf")]])}) is None


def test_a_features_dict_passed_by_keyword_carries_its_padding() -> None:
    """The same rule finds the mask that is kept out of the activations: by its name, in a dict
    passed as a keyword as well as positionally."""
    x = padded_tokens()

    class ByKeyword(Embedder):
        def forward(self, features: dict[str, torch.Tensor] | None = None, **kw: torch.Tensor) -> torch.Tensor:
            return super().forward(features)
    keyword = ByKeyword()
    zero_padded_rows(keyword.bert, x["attention_mask"])
    res = capture_then_replay(ByKeyword, keyword, {"features": x}, CheckSpec(name="st", dtypes=["float32"]))
    assert res[0].passed, verdicts(res)


def test_a_pooler_reading_a_left_padded_position_is_told_apart_from_the_parents_code() -> None:
    """Left padding puts BERT's pooled first token on a padded position: a port that leaves padded rows
    zero changes the classifier's output (a failure), and the message says padding may be what the
    pooler read, not only the parent's code."""
    import transformers

    from pytest_rocm_parity.judging.assertion import message

    def classifier() -> nn.Module:
        torch.manual_seed(0)
        return transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            num_labels=3)).eval()

    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :7] = 0
    x = {"input_ids": torch.randint(3, 64, (3, 12), generator=torch.Generator().manual_seed(1)) * mask,
         "attention_mask": mask}
    cand = classifier()
    for layer in cand.bert.encoder.layer:
        layer.attention.self.register_forward_hook(
            lambda _m, _a, out: (out[0] * (mask[..., None] != 0).to(out[0].dtype), *out[1:]))
    res = capture_then_replay(classifier, cand, x, CheckSpec(name="cls", dtypes=["float32"]))
    assert not res[0].passed and res[0].first_divergent == "bert.pooler", verdicts(res)
    assert "or padded positions, left out of every verdict, that bert.pooler reads" in message(res[0])
