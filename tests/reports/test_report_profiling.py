"""Profiler parity: per-operator shares of self time, and the operators whose share grew."""
from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from pytest_rocm_parity.reports.profiling import compare_shares, format_flags, profile_shares
from manifest_edits import rewrite_manifest


class Head(nn.Module):
    """Elementwise work, then a small matrix product (out=16); ``slow`` plants a layout problem."""

    def __init__(self, slow: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(16, 512, generator=g) / 16)
        # the slow path: the weight kept in a padded (1024 x 512) buffer and used through a
        # transposed, non-contiguous view, so the one matrix product does 64x the work
        padded = torch.zeros(1024, 512)
        padded[:16] = self.weight.detach()
        self.register_buffer("padded", padded)
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x).exp().sigmoid()
        h = torch.softmax(h, -1) * torch.cos(h)
        if self.slow:
            h = torch.mm(h, self.padded.t())[:, :16]
        else:
            h = torch.mm(h, self.weight.t())
        return torch.layer_norm(h, (16,))


@pytest.fixture
def one_thread() -> Iterator[None]:
    # A shared CI machine preempts OpenMP workers; one thread keeps operator times meaningful.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_planted_slow_matmul_is_flagged(one_thread: None) -> None:
    x = torch.randn(128, 512, generator=torch.Generator().manual_seed(1))
    fast, slow = Head().eval(), Head(slow=True).eval()
    assert torch.allclose(fast(x), slow(x), atol=1e-5)  # same numbers, different speed
    ref = profile_shares(fast, (x,), {}, "cpu", iters=7)
    cand = profile_shares(slow, (x,), {}, "cpu", iters=7)
    assert ref["activity"] == "cpu" and ref["total_us"] > 0 and len(ref["shares"]) <= 15
    assert 0.99 <= sum(ref["shares"].values()) <= 1.0 + 1e-9 or len(ref["shares"]) == 15
    assert list(cand["shares"])[0] == "aten::mm"  # the product dominates the candidate
    flags = compare_shares(ref, cand)
    mm = next((f for f in flags if f["op"] == "aten::mm"), None)
    assert mm is not None, (ref["shares"], cand["shares"])
    assert mm["growth"] >= 2.0 and mm["cand_share"] > 0.4 and mm["factor"] == 2.0
    assert "aten::mm" in format_flags(flags)


def test_compare_shares_rules() -> None:
    ref = {"aten::mm": 0.10, "aten::add": 0.30, "aten::gelu": 0.02}
    cand = {"aten::mm": 0.45, "aten::add": 0.35, "aten::gelu": 0.04, "aten::copy_": 0.20}
    flags = compare_shares(ref, cand)
    ops = [f["op"] for f in flags]
    # copy_ is new (inf growth, listed first); mm grew 4.5x; add did not grow 2x; gelu is under min_share
    assert ops == ["aten::copy_", "aten::mm"]
    assert flags[0]["ref_share"] is None and math.isinf(flags[0]["growth"])
    assert flags[1]["growth"] == pytest.approx(4.5)
    assert [f["op"] for f in compare_shares(ref, cand, factor=5.0)] == ["aten::copy_"]
    assert [f["op"] for f in compare_shares(ref, cand, min_share=0.01)] == ["aten::copy_", "aten::mm", "aten::gelu"]
    with pytest.raises(ValueError):
        compare_shares(ref, cand, factor=1.0)


def test_compare_shares_bounds_ops_cut_from_the_reference_top_list() -> None:
    ref = {"shares": {"a": 0.5, "b": 0.3, "c": 0.1}, "top": 3}   # cut at 3: 'd' had at most 10%
    cand = {"shares": {"d": 0.15, "e": 0.25}}
    assert compare_shares(ref, cand) == [
        {"op": "e", "ref_share": 0.1, "cand_share": 0.25, "growth": pytest.approx(2.5), "factor": 2.0,
         "note": "not in the reference's top 3: its share there was at most 10.0%"}]


def test_profiles_of_one_device_kind_far_apart_in_total_are_named_in_a_note(tmp_path: object) -> None:
    """Operator shares taken while a CPU is busy (or under another thread count) describe that as much
    as the code: a replay whose profile's total is far from the golden's on the same kind of device
    says so beside its flags."""
    import json

    from pytest_rocm_parity import CheckSpec
    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.reports.profiling import totals_note
    from pytest_rocm_parity.runner.replay import replay

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    x = torch.randn(32, 64)
    store = GoldenStore(str(tmp_path))
    spec = CheckSpec(name="p", dtypes=["float32"], profile=True)
    capture(model, {"input": x}, spec, store, "cpu")
    (res,) = replay(model, {"input": x}, spec, store, "cpu")
    measured = res.extra["profile"]["candidate"]["total_us"]
    assert measured > 0

    # the golden's total set at the replay's own (a replay on a busy machine could take several
    # times a capture's: the note is the point of this test, not an idle machine's timing)
    path = store.manifest_path("p")
    manifest = json.loads(path.read_text())
    manifest["rungs"]["float32"]["extra"]["profile"]["total_us"] = measured
    rewrite_manifest(path, manifest)
    assert not totals_note(manifest["rungs"]["float32"]["extra"]["profile"], res.extra["profile"]["candidate"])
    manifest["rungs"]["float32"]["extra"]["profile"]["total_us"] = measured * 1e5   # a reference profiled while busy
    rewrite_manifest(path, manifest)
    (res,) = replay(model, {"input": x}, spec, store, "cpu")
    assert any("profiler parity: the reference's forward took" in n and "OMP_NUM_THREADS" in n
               for n in res.notes), res.notes
