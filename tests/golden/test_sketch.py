"""Sketch goldens: the sketch's algebra, and detection through capture/replay at ~0.5% of the size."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torch import nn

from parity_models import capture_then_replay, llama, mlp_lm, tokens, verdicts
from pytest_rocm_parity.runner.capture import capture

from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.runner.engine import CheckSpec

from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.golden.sketch import sketch
from pytest_rocm_parity.judging.assertion import table
from pytest_rocm_parity.reports.report import render_html


def test_sketch_is_deterministic_linear_and_norm_preserving() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3000, generator=g, dtype=torch.float64), torch.randn(3000, generator=g, dtype=torch.float64)
    assert torch.equal(sketch(a, 64, "k"), sketch(a.clone(), 64, "k"))
    assert torch.allclose(sketch(a + b, 64, "k"), sketch(a, 64, "k") + sketch(b, 64, "k"))
    assert not torch.equal(sketch(a, 64, "k"), sketch(a, 64, "other"))     # salt changes the signs
    ratios = [float(sketch(a, 64, f"s{i}").square().sum() / a.square().sum()) for i in range(40)]
    assert 0.8 < sum(ratios) / len(ratios) < 1.2                        # E||S(e)||^2 = ||e||^2
    assert sketch(torch.ones(130), 64, "k").numel() == 3                 # ragged tail group


def test_sketch_of_low_precision_and_complex_inputs() -> None:
    x = torch.randn(100, dtype=torch.float64)
    assert torch.allclose(sketch(x.to(torch.bfloat16), 10, "k"), sketch(x.to(torch.bfloat16).double(), 10, "k"))
    z = torch.randn(50, dtype=torch.complex64)
    assert sketch(z, 10, "k").numel() == 10


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def test_sketch_golden_is_small_and_still_blames_the_layer(tmp_path: Path) -> None:
    model = mlp_lm(d=128, vocab=96, width=4)   # every leaf over 64 groups: sketched, none kept whole
    ids = torch.randint(0, 64, (4, 128), generator=torch.Generator().manual_seed(1))
    full, small = GoldenStore(tmp_path / "full"), GoldenStore(tmp_path / "sketch")
    capture(model, ids, CheckSpec(name="n", dtypes=["bfloat16", "float32"]), full, "cpu", env={})
    spec = CheckSpec(name="n", dtypes=["bfloat16", "float32"], sketch=512)
    capture(model, ids, spec, small, "cpu", env={})
    assert _size(tmp_path / "sketch") < 0.01 * _size(tmp_path / "full")
    assert all(r.passed for r in replay(model, ids, spec, small, "cpu", env={}))
    model.blocks[1].act.approximate = "tanh"
    bf16, fp32 = replay(model, ids, spec, small, "cpu", env={})
    assert not fp32.passed and fp32.culprit == "blocks.1.act"
    assert any("sketch golden" in n for n in fp32.notes)
    # the sketch holds no isolated verdict, and the failure's table does not claim one
    row = next(line for line in table(fp32) if "blocks.1.act" in line)
    assert "FAIL propagated" in row and "isolated" not in row, row
    html = render_html({"checks": [fp32.to_dict()]})
    assert "FAIL propagated" in html and "FAIL isolated" not in html


def test_sketch_mismatch_is_stale(tmp_path: Path) -> None:
    from pytest_rocm_parity.errors import GoldenStale

    model = mlp_lm(d=32, n=2, vocab=64, width=4)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    store = GoldenStore(tmp_path)
    capture(model, ids, CheckSpec(name="n", dtypes=["float32"], sketch=64), store, "cpu", env={})
    with pytest.raises(GoldenStale, match="sketch=64"):
        replay(model, ids, CheckSpec(name="n", dtypes=["float32"]), store, "cpu", env={})


def test_a_small_output_is_kept_whole_and_its_bug_named(tmp_path: Path) -> None:
    """Outputs of at most 64 groups are kept whole: a sketch of one or two entries could not tell a
    1% bug in a small projection from rounding, nor name it."""
    model = mlp_lm()   # 2 x 8 tokens of width 16: every output under one group of 512
    ids = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="n", dtypes=["float32"], sketch=512)
    store = GoldenStore(tmp_path)
    capture(model, ids, spec, store, "cpu", env={})
    assert store.read_manifest("n")["rungs"]["float32"]["whole_below"] == 64
    assert all(r.passed for r in replay(model, ids, spec, store, "cpu", env={}))
    model.blocks[1].fc2.register_forward_hook(lambda _m, _a, out: out * 1.01)
    (bad,) = replay(model, ids, spec, store, "cpu", env={})
    assert not bad.passed and bad.culprit == "blocks.1.fc2", (bad.culprit, [l.reason for l in bad.layers if l.reason])


class _NearTieRouter(nn.Module):
    """Two experts' scores that differ by less than bfloat16's rounding: the float64 truth picks the
    second wherever the score is positive, bfloat16 sees a tie and picks the first."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.score = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.score(x)
        scores = torch.cat([s, s * (1 + 1e-4)], -1)
        return scores, scores.argmax(-1)


class _Routed(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.router = _NearTieRouter(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        scores, _ = self.router(h)
        return h * scores[..., :1]


def test_a_routers_indices_are_the_rungs_own_not_the_truths(tmp_path: Path) -> None:
    """A sketch golden keeps a router's indices as the bfloat16 reference chose them: the unchanged
    model replays clean at that rung, where the float64 truth chose otherwise at every near-tie."""
    model = _Routed().eval()
    x = torch.randn(4, 32, 16, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="r", dtypes=["bfloat16"], sketch=64)
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cpu", env={})
    (res,) = replay(model, x, spec, store, "cpu", env={})
    assert res.passed, verdicts([res])


def test_attention_weights_only_the_reference_returns_are_a_note() -> None:
    """Eager attention returns its weights, SDPA none: a correct migration, judged on the outputs
    both produce, as the full golden judges it."""
    res = capture_then_replay(lambda: llama("eager"), llama("sdpa"), tokens(),
                              CheckSpec(name="m", dtypes=["float32"], sketch=64))
    assert res[0].passed, verdicts(res)
    assert any("optional output '1'" in n and "reference only" in n for n in res[0].notes), res[0].notes


def test_a_check_spec_takes_sketch_as_the_fixture_does() -> None:
    """CheckSpec is public: sketch=True there wrote a manifest that read back as corrupt."""
    from pytest_rocm_parity.golden.sketch import DEFAULT_GROUP

    assert CheckSpec(name="n", dtypes=["float32"], sketch=True).sketch == DEFAULT_GROUP
    assert CheckSpec(name="n", dtypes=["float32"], sketch=False).sketch == 0
    with pytest.raises(InvalidArgument, match="sketch=1"):
        CheckSpec(name="n", dtypes=["float32"], sketch=1)


class _Up(nn.Module):
    """Upsampling in its own forward before its first child, as a UNet's up block does."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.act = nn.Conv2d(8, 8, 3, padding=1), nn.SiLU()
        self.align = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear", align_corners=self.align)
        return self.act(self.c1(x))


class _Ups(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.ups = nn.Conv2d(3, 8, 3, padding=1), nn.ModuleList([_Up(), _Up()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for up in self.ups:
            x = up(x)
        return x


def test_a_sketch_culprit_says_its_drift_may_come_in_with_its_input() -> None:
    """The bug is ups.1's own code before its first child: a sketch golden, which keeps no inputs,
    sees the drift first at ups.1.c1, and the message says where else it may begin."""
    from pytest_rocm_parity.judging.assertion import message

    cand = _Ups().eval()
    cand.ups[1].align = True
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    (res,) = capture_then_replay(lambda: _Ups().eval(), cand, x, CheckSpec(name="s", dtypes=["float32"], sketch=64))
    assert not res.passed and res.culprit == "ups.1.c1", verdicts([res])
    assert res.extra["sketch_after"] == "ups.0.act"
    assert ("a sketch golden keeps no module inputs, so the drift may come in with its input: from code that ran "
            "after ups.0.act and before it") in message(res)
