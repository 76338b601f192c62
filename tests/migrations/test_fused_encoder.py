"""torch's fused inference kernels run only under conditions the plugin's instrumentation could
break: nn.TransformerEncoderLayer's when no hook is registered in it and no torch function mode is
active, nn.MultiheadAttention's when query is key is value. The plugin must leave those paths to
run, or a bug in the kernel the candidate runs in production goes unjudged."""
from __future__ import annotations

import tempfile

import pytest
import torch
from torch import nn

from parity_models import capture_then_replay, verdicts
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay


class Encoder(nn.Module):
    def __init__(self, nested: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested)
        self.out = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return self.out(self.enc(self.emb(ids), src_key_padding_mask=pad))


def encoder(nested: bool = False) -> Encoder:
    torch.manual_seed(0)
    return Encoder(nested).eval()


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 30, (3, 12), generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(3, 12, dtype=torch.bool)
    pad[1, 8:] = True
    pad[2, 5:] = True
    return ids, pad


def replay_with_kernel_bug(nested: bool, spec: CheckSpec, monkeypatch: pytest.MonkeyPatch) -> list[CheckResult]:
    """Capture the encoder, then replay it with a 1% error in the fused kernel only (torch's own
    op, patched where the layer looks it up), which must run."""
    store = GoldenStore(tempfile.mkdtemp(prefix="parity-fused-"))
    capture(encoder(nested), inputs(), spec, store, "cpu")
    calls: list[int] = []
    real = torch._transformer_encoder_layer_fwd

    def buggy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs) * 1.01

    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", buggy)
    res = replay(encoder(nested), inputs(), spec, store, "cpu")
    assert calls, "the candidate's fused path did not run"
    return res


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_a_bug_in_the_fused_kernel_is_named_in_either_replay(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = CheckSpec(name="enc", dtypes=["float32"], replay=mode)
    res = capture_then_replay(encoder, encoder(), inputs(), spec)
    assert res[0].passed, verdicts(res)
    res = replay_with_kernel_bug(False, spec, monkeypatch)
    assert not res[0].passed and res[0].culprit == "enc.layers.0", verdicts(res)
    if mode == "full":   # the propagated pass runs the fused path too
        assert res[0].first_divergent == "enc.layers.0", verdicts(res)


def test_the_nested_path_is_judged_through_the_encoder_and_refused_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidArgument, match=r"nested tensor.*layers=\['enc'\], drill=0.*enable_nested_tensor=False"):
        capture_then_replay(lambda: encoder(nested=True), encoder(nested=True), inputs())
    spec = CheckSpec(name="enc", dtypes=["float32"], layers=["enc"], drill=0)
    res = capture_then_replay(lambda: encoder(nested=True), encoder(nested=True), inputs(), spec)
    assert res[0].passed, verdicts(res)
    res = replay_with_kernel_bug(True, spec, monkeypatch)
    assert not res[0].passed and res[0].culprit == "enc", verdicts(res)


def test_a_model_that_is_the_encoder_itself_is_told_the_one_fix_that_works() -> None:
    """layers=[its name] is layers=[''] there, which selects nothing."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    with pytest.raises(InvalidArgument, match=r"nested tensor.*Build it with enable_nested_tensor=False \(the model "
                                              r"is the encoder itself") as err:
        capture_then_replay(nn.TransformerEncoder(layer, 2).eval(), nn.TransformerEncoder(layer, 2).eval(),
                            {"src": x, "src_key_padding_mask": pad})
    assert "layers=" not in str(err.value)


class KeywordEncoder(Encoder):
    """Called with PyTorch's padding convention by name (True: padding)."""

    def forward(self, ids: torch.Tensor, src_key_padding_mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(ids, src_key_padding_mask)


def keyword_encoder(nested: bool) -> KeywordEncoder:
    torch.manual_seed(0)
    return KeywordEncoder(nested).eval()


def test_src_key_padding_mask_marks_padding_the_nested_path_leaves_zero() -> None:
    """The nested path returns zeros at padded positions, the padded path computes them: a correct
    candidate either way, since padding is not judged; a bug at real positions still fails."""
    ids, pad = inputs()
    x = {"ids": ids, "src_key_padding_mask": pad}
    spec = CheckSpec(name="enc", dtypes=["float32"], layers=["enc"], drill=0)
    res = capture_then_replay(lambda: keyword_encoder(True), keyword_encoder(False), x, spec)
    assert res[0].passed, verdicts(res)
    assert any("padded positions (src_key_padding_mask true) not judged" in n for n in res[0].notes), res[0].notes
    bug = keyword_encoder(False)
    bug.enc.layers[1].linear2.register_forward_hook(lambda _m, _a, out: out * 1.01)
    res = capture_then_replay(lambda: keyword_encoder(True), bug, x, spec)
    assert not res[0].passed and res[0].culprit == "enc", verdicts(res)


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(16, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head(a + h)


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_a_bug_in_the_fused_self_attention_kernel_names_the_attention(mode: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """nn.MultiheadAttention takes its fused kernel only when query is key is value: the isolated
    call on the golden inputs must pass one copy at the three places, as the candidate's forward
    did, or the isolated call runs the unfused path and the kernel's bug is blamed on no module."""
    def model() -> SelfAttention:
        torch.manual_seed(0)
        return SelfAttention().eval()

    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="mha", dtypes=["float32"], replay=mode)
    assert capture_then_replay(model, model(), {"x": x}, spec)[0].passed
    calls: list[int] = []
    real = torch._native_multi_head_attention

    def buggy(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        calls.append(1)
        out = real(*args, **kwargs)
        return (out[0] * 1.01, *out[1:])

    store = GoldenStore(tempfile.mkdtemp(prefix="parity-fused-"))
    capture(model(), {"x": x}, spec, store, "cpu")
    monkeypatch.setattr(torch, "_native_multi_head_attention", buggy)
    res = replay(model(), {"x": x}, spec, store, "cpu")
    assert calls and not res[0].passed and res[0].culprit == "attn", verdicts(res)
