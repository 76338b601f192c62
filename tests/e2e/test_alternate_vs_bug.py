"""End to end through the plugin: a correct alternate kernel passes, a seeded bug is blamed."""
from __future__ import annotations

from typing import Any

import pytest

CONFTEST = '''
import os
import torch
from torch import nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        mode = os.environ.get("VARIANT", "")
        if mode == "manual_attention":   # correct alternate: explicit softmax(QK^T)V
            w = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
            w = w.masked_fill(torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = torch.softmax(w.float(), -1).to(q.dtype) @ v
        elif mode == "scale_bug":        # kernel bug: attention scale off by 2%
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.02 / (q.shape[-1] ** 0.5))
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attn(d, h)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=64, d=48, h=4, n=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def make():
    torch.manual_seed(0)
    return GPT().eval()
'''

TEST = '''
import torch
from conftest import make

def test_gpt(parity):
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    parity.check(make(), ids, name="gpt", dtypes=["bfloat16", "float32"])
'''


@pytest.fixture
def gpt(parity_project: Any) -> pytest.Pytester:
    pytester = parity_project(CONFTEST, "VARIANT", test_gpt=TEST)
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    return pytester


def test_correct_alternate_attention_passes(gpt: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VARIANT", "manual_attention")
    result = gpt.runpytest("--rocm-parity")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*PASS gpt [[]bfloat16[]]*", "*PASS gpt [[]float32[]]*"])


def test_seeded_bug_in_one_layer_is_the_culprit(gpt: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VARIANT", "scale_bug")
    result = gpt.runpytest("--rocm-parity")
    result.assert_outcomes(failed=1)
    # every block runs the same buggy kernel: the first one is blamed, at its attention module
    result.stdout.fnmatch_lines(["*parity check failed: gpt [[]float32[]]*", "*culprit: blocks.0.attn (inside block blocks.0)*"])
