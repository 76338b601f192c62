"""Default layer selection, globs, and nesting levels."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_rocm_parity.errors import LayerSelectionError
from pytest_rocm_parity.runner.selection import default_primary, select


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 10)


def test_default_is_blocks_plus_outside_modules() -> None:
    assert default_primary(Net()) == ["emb", "layers.0", "layers.1", "layers.2", "norm", "head"]


def test_drill_levels() -> None:
    sel = {s.name: s for s in select(Net(), drill=2)}
    assert sel["layers.1"].level == 0
    assert sel["layers.1.mlp"].level == 1 and sel["layers.1.mlp"].primary == "layers.1"
    assert sel["layers.1.mlp.1"].level == 2
    assert "layers.1.attn" in sel and sel["emb"].level == 0
    assert all(s.level == 0 for s in select(Net(), drill=0))


def test_globs_and_nesting() -> None:
    sel = select(Net(), layers=["layers.*.mlp", "layers.0"])
    names = [s.name for s in sel]
    assert names == ["layers.0", "layers.0.mlp", "layers.1.mlp", "layers.2.mlp"]
    assert {s.name: s.level for s in sel}["layers.0.mlp"] == 1


def test_unmatched_pattern_is_error_with_hint() -> None:
    with pytest.raises(LayerSelectionError, match=r"'layer.\*' matches no module.*close matches"):
        select(Net(), layers=["layer.*"])


def test_hf_llama_default_selection() -> None:
    pytest.importorskip("transformers")
    from parity_models import llama

    names = default_primary(llama())
    assert names[0] == "model.embed_tokens" and "model.layers.1" in names
    assert names[-2:] == ["model.norm", "lm_head"] or names[-1] == "lm_head"


def test_auto_drill_depends_on_size() -> None:
    from pytest_rocm_parity.api import drill_for

    small = Net()
    assert drill_for(small, None, None, None) == 2       # without inputs: every module (Net is 2 deep)
    assert drill_for(small, None, 1, 0) == 1            # the first explicit choice wins
    import pytest_rocm_parity.api as api

    old = api.AUTO_DRILL_MAX_PARAMS
    api.AUTO_DRILL_MAX_PARAMS = 0
    try:
        assert drill_for(Net(), None, None, None) == 0
    finally:
        api.AUTO_DRILL_MAX_PARAMS = old
    assert drill_for(small, 5) == 5                      # any depth; a depth past the leaves selects them all
    with pytest.raises(Exception, match="drill=-1"):
        drill_for(small, -1)


def test_a_glob_leaves_out_what_runs_inside_an_experts_module() -> None:
    """An experts module's children run as its implementation chooses (one grouped GEMM, or a loop
    with each expert's tokens): a broad glob stops at the experts module, and a glob that selects only
    inside one is refused, naming the module to select."""
    from parity_models import mixtral

    m = mixtral()
    names = [s.name for s in select(m, ["model.layers.*"])]
    assert "model.layers.0.mlp.experts" in names and not any(".experts." in n for n in names)
    with pytest.raises(LayerSelectionError, match=r"inside an experts module .*Select the experts module itself: "
                                                  r"'model.layers.0.mlp.experts'"):
        select(m, ["model.layers.*.mlp.experts.*"])


def test_a_glob_with_a_wrong_word_is_pointed_at_the_stack_it_meant() -> None:
    """The close matches of a glob are the model's stacks as globs: one wrong word ('encoder.layer.*'
    for 'layers.*') still finds them, where the module names themselves are too far from it."""
    with pytest.raises(LayerSelectionError, match=r"close matches: layers\.\*, layers\.\*\.mlp"):
        select(Net(), layers=["encoder.layer.*"])
