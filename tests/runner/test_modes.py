"""A replay runs the model in eval mode and fp32 rungs without TF32, and puts both back after.

The mode is decided from the module walk a replay takes at set-up (engine.ModelWalk.training), not
by looking at every module again on each pass; these tests pin what that must still do.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec, eval_mode, numerics, walk_model
from pytest_rocm_parity.runner.replay import replay


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)))


def test_a_model_in_training_mode_runs_in_eval_and_gets_its_flags_back() -> None:
    net = _net()
    net.train()
    net[2].eval()                      # a mixed model: each module's own flag comes back
    walk = walk_model(net)
    assert walk.training
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with eval_mode(net, walk):
        assert not any(m.training for m in net.modules())
        a, b = net(x), net(x)          # dropout off: the same output twice
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert net.training and net[0].training and net[1].training
    assert not net[2].training and not net[2][1].training


def test_a_model_walked_in_eval_mode_is_left_alone() -> None:
    net = _net().eval()
    walk = walk_model(net)
    assert not walk.training
    with eval_mode(net, walk):
        assert not any(m.training for m in net.modules())
    assert not any(m.training for m in net.modules())
    with eval_mode(net):               # no walk: the modules are looked at
        pass
    net.train()
    with eval_mode(net):
        assert not any(m.training for m in net.modules())
    assert all(m.training for m in net.modules())


@pytest.mark.parametrize("tf32", [False, True])
def test_fp32_rungs_set_tf32_and_restore_it_other_rungs_touch_nothing(tf32: bool) -> None:
    cm, cd = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (cm.allow_tf32, cd.allow_tf32)
    try:
        cm.allow_tf32, cd.allow_tf32 = not tf32, not tf32
        with numerics("float32", tf32):
            assert cm.allow_tf32 is tf32 and cd.allow_tf32 is tf32
        assert cm.allow_tf32 is (not tf32) and cd.allow_tf32 is (not tf32)
        with numerics("bfloat16", tf32):
            assert cm.allow_tf32 is (not tf32) and cd.allow_tf32 is (not tf32)
        assert cm.allow_tf32 is (not tf32) and cd.allow_tf32 is (not tf32)
    finally:
        cm.allow_tf32, cd.allow_tf32 = saved


def test_a_module_swapped_in_after_eval_is_named_not_the_model(tmp_path: Path) -> None:
    """A module built after model.eval() starts in training mode: the note names it, and does not
    say the model was in training mode."""
    net = _net().eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    spec = CheckSpec(name="n", dtypes=["float32"])
    store = GoldenStore(tmp_path)
    capture(net, x, spec, store, "cpu", env={})
    net[1] = nn.Dropout(0.5)          # the candidate swaps a module in, left in training mode
    with pytest.warns(UserWarning, match="dropout on"):
        (res,) = replay(net, x, spec, store, "cpu", env={})
    assert res.passed
    assert any(n.startswith("module 1 of the model in eval mode was in training mode") for n in res.notes), res.notes
    assert not any("the model was in training mode" in n for n in res.notes), res.notes


class Jitter(nn.Module):
    """Adds noise in training mode only, as a MoE router's jitter does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.01 * torch.randn_like(x) if self.training else x


@pytest.mark.parametrize("swapped, named", [(nn.Identity, False), (Jitter, True)])
def test_only_a_module_whose_forward_differs_in_training_mode_is_named(tmp_path: Path, swapped: type[nn.Module],
                                                                        named: bool) -> None:
    """A module that computes the same in both modes (a Linear, an Identity built after
    model.eval()) is no news; one whose forward reads self.training is."""
    net = _net().eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    spec = CheckSpec(name="n", dtypes=["float32"])
    store = GoldenStore(tmp_path)
    capture(net, x, spec, store, "cpu", env={})
    net[1] = swapped()
    linear = nn.Linear(8, 8)   # built after model.eval(), so in training mode, where it computes the same
    linear.load_state_dict(net[0].state_dict())
    net[0] = linear
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        (res,) = replay(net, x, spec, store, "cpu", env={})
    said = [n for n in res.notes if "training mode" in n] + [str(w.message) for w in seen if "training mode" in str(w.message)]
    assert res.passed
    if named:   # the Jitter alone, in the note and in the warning a passing check shows
        assert any(s.startswith("module 1 of the model in eval mode was in training mode") for s in said), said
        assert any(s.startswith("rocm-parity: n: 1 of a model in eval mode is in training mode") for s in said), said
        assert len(said) == 2, said
    else:
        assert not said, said


def test_a_buffer_the_model_replaces_while_replayed_is_kept_not_put_back(tmp_path: Path) -> None:
    """A dynamic-NTK rotary embedding grows inv_freq on its first long sequence and records the length
    beside it: the replay casts the buffer per rung, and putting the old one back afterwards left the
    two disagreeing (the float32 rung failed an unchanged model, and the user's model kept wrong
    tables)."""
    from parity_models import llama, tokens

    def dynamic() -> nn.Module:
        return llama(max_position_embeddings=8, rope_scaling={"rope_type": "dynamic", "factor": 4.0})

    x = tokens(seq=24)
    spec = CheckSpec(name="dyn", dtypes=["bfloat16", "float32"], drill=0)
    store = GoldenStore(tmp_path)
    capture(dynamic(), x, spec, store, "cpu")
    model = dynamic()
    res = replay(model, x, spec, store, "cpu")
    assert all(r.passed for r in res), [(r.dtype, r.culprit) for r in res]
    fresh = dynamic()
    with torch.no_grad():
        want = fresh(**x).logits
        got = model(**x).logits
    assert torch.equal(model.model.rotary_emb.inv_freq, fresh.model.rotary_emb.inv_freq)
    assert torch.equal(got, want)


def test_a_batchnorm_swapped_in_after_eval_is_warned_of_though_the_check_passes(tmp_path: Path) -> None:
    """A module built after model.eval() is in training mode, where BatchNorm uses the batch's
    statistics; the replay judges eval mode, so a passing check would hide it: a warning says so."""
    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()

    x = torch.randn(2, 3, 8, 8)
    spec = CheckSpec(name="bn", dtypes=["float32"])
    store = GoldenStore(tmp_path)
    capture(model(), x, spec, store, "cpu")
    cand = model()
    swapped = nn.BatchNorm2d(4)   # a fresh module: training mode
    swapped.load_state_dict(cand[1].state_dict())
    cand[1] = swapped
    with pytest.warns(UserWarning, match=r"rocm-parity: bn: 1 of a model in eval mode is in training mode"):
        assert replay(cand, x, spec, store, "cpu")[0].passed
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert replay(model(), x, spec, store, "cpu")[0].passed   # all in eval mode: no warning


class GrownCache(nn.Module):
    """The classic rotary cache: cos rebuilt in the input's dtype when a longer sequence comes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = nn.Linear(8, 16), nn.Linear(16, 4)
        self.max_len = 4
        self.register_buffer("cos", torch.arange(4.0)[:, None].expand(4, 16).cos(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if h.shape[1] > self.max_len:
            self.max_len = h.shape[1]
            pos = torch.arange(h.shape[1], dtype=torch.float32)[:, None] * torch.linspace(0.1, 1.0, 16)
            self.register_buffer("cos", pos.cos().to(h.dtype), persistent=False)
        return self.out(h * self.cos[:h.shape[1]].to(h.dtype))


def test_a_cache_grown_during_the_replay_is_grown_at_float32(tmp_path: Path) -> None:
    """The float32 rung runs first, so the cache is built at full precision and kept for the bf16
    rung; built in the bf16 rung and kept, it failed the float32 rung of the unchanged model."""
    x = torch.randn(2, 24, 8, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="rope", dtypes=["bfloat16", "float32"])
    store = GoldenStore(tmp_path)
    capture(GrownCache().eval(), x, spec, store, "cpu")
    cand = GrownCache().eval()
    res = replay(cand, x, spec, store, "cpu")
    assert [r.dtype for r in res] == ["bfloat16", "float32"] and all(r.passed for r in res), \
        [(r.dtype, r.culprit) for r in res]
    plain = GrownCache().eval()
    with torch.no_grad():
        plain(x)
    assert torch.equal(cand.cos, plain.cos)


def test_a_whole_model_left_in_training_mode_is_warned_of_when_it_passes(tmp_path: Path) -> None:
    """A served model whose .eval() was forgotten runs dropout and BatchNorm's batch statistics; the
    replay judges eval mode and passes, so the passing check warns, naming the modules."""
    store, spec = GoldenStore(tmp_path), CheckSpec(name="n", dtypes=["float32"])
    net = _net().eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    capture(net, x, spec, store, "cpu")
    net.train()
    with pytest.warns(UserWarning, match=r"the model is in training mode \(model.eval\(\) not called\?\), where 1, "
                                         r"2.1 compute otherwise"):
        (res,) = replay(net, x, spec, store, "cpu")
    assert res.passed


def test_a_model_in_training_mode_whose_forward_is_the_same_is_not_warned_of(tmp_path: Path) -> None:
    """Linears alone compute the same in training mode: nothing to warn of."""
    import warnings

    store, spec = GoldenStore(tmp_path), CheckSpec(name="n", dtypes=["float32"])
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    capture(net, x, spec, store, "cpu")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        (res,) = replay(net, x, spec, store, "cpu")
    assert res.passed and not [w for w in seen if "training mode" in str(w.message)]
