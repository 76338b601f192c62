from __future__ import annotations

from typing import Any

import pytest

# A tiny model written into each pytester project; BUG=<block> seeds an approximate GELU there.
MODEL_CONFTEST = '''
import os
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Tiny(nn.Module):
    def __init__(self, d=16, n=3, vocab=40):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def make_model():
    torch.manual_seed(0)
    m = Tiny()
    bug = os.environ.get("BUG")
    if bug:
        m.blocks[int(bug)].act.approximate = "tanh"
    return m


def make_inputs():
    return torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(0))
'''

TEST_FILE = '''
from conftest import make_model, make_inputs

def test_tiny(parity):
    parity.check(make_model(), make_inputs(), name="tiny", dtypes=["float32"])
'''


@pytest.fixture
def project(parity_project: Any) -> pytest.Pytester:
    """A pytester project with the tiny model and one parity test (BUG=<block> seeds a bug)."""
    return parity_project(MODEL_CONFTEST, "BUG", test_tiny=TEST_FILE)
