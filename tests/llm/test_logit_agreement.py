"""Token agreement where the candidate's logits hold a NaN: such a row prefers no token, so it is a
confident disagreement, not the agreement every comparison with a NaN would otherwise count."""
from __future__ import annotations

import torch

from pytest_rocm_parity.judging.logits import judge_logits


def test_a_row_of_nan_logits_agrees_with_nothing() -> None:
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(2, 8, 32, generator=g, dtype=torch.float64)
    ref = truth + 1e-4 * torch.randn(2, 8, 32, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 32, (2, 8), generator=g)
    valid = torch.ones(2, 8, dtype=torch.bool)
    same = judge_logits(ref.clone(), ref, truth, ids, valid, 8, 2.0**-8, 3.0, 3.0, 5)
    assert same.metrics["top1_agreement"] == 1.0 and same.metrics["confident_flips"] == 0
    cand = ref.clone()
    cand[0, 3, 7] = float("nan")   # one NaN: that row's softmax is NaN everywhere
    cand[1] = float("nan")         # a whole sequence
    j = judge_logits(cand, ref, truth, ids, valid, 8, 2.0**-8, 3.0, 3.0, 5)
    assert j.metrics["flips"] == j.metrics["confident_flips"] == 9
    assert j.metrics["top1_agreement"] == 1 - 9 / 16
    assert j.metrics["top5_containment"] == 1 - 9 / 16
