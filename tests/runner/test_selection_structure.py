"""The default selection from the model's structure, the drill depth from the golden-size budget, and
where a fault lies that the selection did not judge."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytest_rocm_parity import api
from pytest_rocm_parity.judging.assertion import message
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.runner.selection import (activation_sizes, default_primary, golden_bytes, max_drill, select,
                                          stacks)

import parity_models as fm


def test_every_stack_and_the_modules_between_them() -> None:
    t5, _ = fm.build_t5()
    primary = default_primary(t5)
    assert {"encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"} <= set(primary)
    assert {"encoder.final_layer_norm", "decoder.final_layer_norm", "decoder.embed_tokens"} <= set(primary)
    clip, _ = fm.build_clip()
    primary = default_primary(clip)
    for tower in ("text_model", "vision_model"):
        assert f"{tower}.encoder.layers.1" in primary and f"{tower}.embeddings" in primary
    assert {"visual_projection", "text_projection", "vision_model.post_layernorm"} <= set(primary)


def test_unet_down_mid_and_up_blocks_of_mixed_classes() -> None:
    unet, _ = fm.build_unet()
    assert ("down_blocks", ["down_blocks.0", "down_blocks.1"]) in stacks(unet)   # DownBlock, AttnDownBlock
    primary = default_primary(unet)
    assert primary == ["conv_in", "time_embedding", "down_blocks.0", "down_blocks.1", "mid_block.resnets.0",
                       "mid_block.resnets.1", "mid_block.attentions.0", "up_blocks.0", "up_blocks.1",
                       "conv_norm_out", "conv_out"]
    # a ModuleList is never called, so never selected itself: its members are, at its level
    names = [s.name for s in select(unet, drill=1)]
    assert "down_blocks.1.resnets.0" in names and "down_blocks.1.resnets" not in names


def test_a_mixed_sequential_is_one_sub_network_not_a_stack() -> None:
    model = nn.Sequential(nn.Embedding(10, 8), nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)))
    assert stacks(model) == []
    assert default_primary(model) == ["0", "1"]


def test_drill_goes_as_deep_as_the_model() -> None:
    t5, _ = fm.build_t5()
    assert max_drill(t5) == 3
    sel = {s.name: s.level for s in select(t5, drill=3)}
    assert sel[fm.FAMILY_BUGS["t5"][0]] == 3            # decoder.block.1.layer.1.EncDecAttention.v
    assert fm.FAMILY_BUGS["t5"][0] not in {s.name for s in select(t5, drill=2)}
    assert select(t5, drill=9) == select(t5, drill=3)


def test_explicit_drill_any_depth_and_refusals() -> None:
    t5, _ = fm.build_t5()
    assert api.drill_for(t5, 3) == 3 and api.drill_for(t5, 7) == 7
    with pytest.raises(InvalidArgument, match="drill=-1"):
        api.drill_for(t5, -1)
    with pytest.raises(InvalidArgument, match="drill=True"):
        api.drill_for(t5, True)


def test_option_accepts_any_depth() -> None:
    from pytest_rocm_parity.options import parse_drill

    assert parse_drill("5") == 5
    with pytest.raises(pytest.UsageError, match="integer >= 0"):
        parse_drill("x")


def test_golden_estimate_tracks_the_file(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model, inputs = fm.build_vit()
    acts = activation_sizes(model, inputs)
    assert acts.where == "meta"
    store = GoldenStore(tmp_path)
    for d in (0, 2):
        capture(model, inputs, CheckSpec(name=f"v{d}", dtypes=["float32"], drill=d), store, "cpu")
        on_disk = sum(f.stat().st_size for f in store.dir_for(f"v{d}").iterdir())
        est = golden_bytes(acts, select(model, drill=d), ["float32"])
        assert 0.8 * on_disk < est < 1.3 * on_disk, (d, est, on_disk)
        for group in (8, 512):   # a sketch golden: sketches of the outputs, no inputs
            capture(model, inputs, CheckSpec(name=f"s{d}-{group}", dtypes=["float32"], drill=d, sketch=group), store,
                    "cpu")
            on_disk = sum(f.stat().st_size for f in store.dir_for(f"s{d}-{group}").iterdir())
            est = golden_bytes(acts, select(model, drill=d), ["float32"], group)
            assert 0.8 * on_disk < est < 1.35 * on_disk, (d, group, est, on_disk)


def test_a_sketch_goldens_default_drill_is_deeper_under_the_same_limit() -> None:
    """The depth a check gets by default is the deepest whose golden fits the limit, estimated as the
    golden it writes: a sketch golden's, far smaller, reaches a depth the full one does not."""
    model, inputs = fm.build_t5()
    acts = activation_sizes(model, inputs)
    deepest = max_drill(model)
    limit = golden_bytes(acts, select(model, drill=deepest), ["float32"], 8)
    assert api.default_drill(model, inputs, ["float32"], limit, sketch=8) == deepest
    assert api.default_drill(model, inputs, ["float32"], limit) < deepest


def test_default_drill_is_the_deepest_within_the_budget() -> None:
    model, inputs = fm.build_t5()
    acts = activation_sizes(model, inputs)
    sizes = [golden_bytes(acts, select(model, drill=d), ["float32"]) for d in range(4)]
    assert sizes == sorted(sizes)
    assert api.default_drill(model, inputs, ["float32"], None) == 3
    assert api.default_drill(model, inputs, ["float32"], 50 * 1024 * 1024) == 3
    assert api.default_drill(model, inputs, ["float32"], sizes[2]) == 2
    assert api.default_drill(model, inputs, ["float32"], sizes[1] - 1) == 0
    assert api.default_drill(model, inputs, ["float32"], 1) == 0


def test_a_half_model_given_float32_inputs_gets_its_default_depth() -> None:
    """The capture casts float inputs to each rung; the size estimate must too, or a half model given
    float32 pixels died in it with torch's dtype error."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)).eval().half()
    x = torch.randn(2, 3, 16, 16)
    assert activation_sizes(model, x).where == "meta"
    rungs = ["float16", "float32"]
    assert api.default_drill(model, x, rungs, 50 * 1024 * 1024) == api.default_drill(model, x, rungs, None)


def test_shape_pass_falls_back_to_the_forward() -> None:
    class DataDependent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * (2.0 if float(x.sum()) > 0 else 1.0)   # .item() on a meta tensor fails

    acts = activation_sizes(DataDependent(), torch.ones(3, 4))
    assert acts.where == "forward" and acts.calls["lin"][0][1][0][1] == 12


def _replayed(tmp_path: Path, family: str, **spec: Any) -> Any:
    torch.set_num_threads(1)
    model, inputs = fm.build_unet() if family == "unet" else fm.FAMILIES[family]()
    s = CheckSpec(name=family, dtypes=["float32"], **spec)
    store = GoldenStore(tmp_path)
    capture(model, inputs, s, store, "cpu")
    fm.plant_family(model, family)
    return replay(model, inputs, s, store, "cpu")[0]


def test_a_fault_outside_the_selection_names_its_region_and_glob(tmp_path: Path) -> None:
    layers = ["conv_in", "time_embedding", "mid_block", "up_blocks.*", "conv_out"]   # no down blocks
    result = _replayed(tmp_path, "unet", layers=layers)
    assert result.culprit is None
    region = result.extra["unselected_region"]
    assert region["before"] == "mid_block" and region["modules"] == ["down_blocks"]
    assert region["layers"] == [*layers, "down_blocks.*"]
    text = message(result)
    assert "culprit: none among the selected modules; the fault lies between" in text
    assert "'down_blocks.*'" in text
    assert "accumulated drift" not in text


def test_a_culprit_with_unselected_children_says_how_to_narrow_it(tmp_path: Path) -> None:
    result = _replayed(tmp_path, "unet", drill=1)
    assert result.culprit == "down_blocks.1.resnets.0"
    (note,) = [n for n in result.notes if "drill=2" in n and "down_blocks.1.resnets.0.conv2" in n]
    assert note.endswith("in a golden captured with that selection on the reference machine (--parity-regen)")


def test_a_selected_child_that_neither_side_called_is_not_offered_as_unselected(tmp_path: Path) -> None:
    """BERT under sdpa never calls its attention's dropout: it is selected, has no record, and
    drilling deeper would not judge it, so the culprit's note does not send the user there."""
    from parity_models import bert, plant, tokens

    s = CheckSpec(name="bert", dtypes=["float32"], drill=3)
    store = GoldenStore(tmp_path)
    capture(bert(), tokens(), s, store, "cpu")
    model = plant(bert(), "encoder.layer.1.attention.self")
    result = replay(model, tokens(), s, store, "cpu")[0]
    assert result.culprit == "encoder.layer.1.attention.self"
    assert not [n for n in result.notes if "did not select" in n]


def test_show_lists_what_a_golden_selects(tmp_path: Path) -> None:
    from pytest_rocm_parity.reports.inspect_cmd import format_show, show_golden
    from pytest_rocm_parity.runner.selection import describe

    torch.set_num_threads(1)
    model, inputs = fm.build_t5()
    store = GoldenStore(tmp_path)
    capture(model, inputs, CheckSpec(name="t5", dtypes=["float32"], drill=1), store, "cpu")
    info = show_golden(store.dir_for("t5"), stats=False)
    level0 = info["selects"][0]
    assert level0["level"] == 0 and level0["modules"] == 11
    assert "encoder.block.[0-1]" in level0["names"] and "decoder.block.[0-1]" in level0["names"]
    assert info["selects"][1]["names"] == ["encoder.block.[0-1].layer.0", "encoder.block.[0-1].layer.1",
                                           "decoder.block.[0-1].layer.0", "decoder.block.[0-1].layer.1",
                                           "decoder.block.[0-1].layer.2"]
    lines = format_show(info)
    assert any(line.startswith("selects   level 0 (11): shared, encoder.embed_tokens, encoder.block.[0-1]")
               for line in lines)
    assert describe([{"name": "a.0", "level": 0}, {"name": "a.2", "level": 0}]) == [(0, 2, ["a.[0,2]"])]


def test_replay_uses_the_depth_the_golden_was_captured_with(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model, inputs = fm.build_t5()
    store = GoldenStore(tmp_path)
    capture(model, inputs, CheckSpec(name="t5", dtypes=["float32"], drill=1), store, "cpu")
    spec = CheckSpec(name="t5", dtypes=["float32"])
    assert api.resolve_drill(model, inputs, spec, None, store, capturing=False) == 1
    assert api.resolve_drill(model, inputs, spec, 2, store, capturing=False) == 2        # explicit wins
    assert api.resolve_drill(model, inputs, spec, None, store, capturing=True) == 3      # no limit: all the way
    spec.golden_size_limit = 1
    assert api.resolve_drill(model, inputs, spec, None, store, capturing=True) == 0
    spec.layers = ["decoder.*"]
    assert api.resolve_drill(model, inputs, spec, None, store, capturing=True) == 0      # globs: depth unused


def test_code_between_two_blocks_without_a_jump_is_named_with_drift_in_one_note(tmp_path: Path) -> None:
    """A small change in a parent's own code (a scale between two blocks) raises the propagated error
    less than a jump: accumulated drift and that code both explain it, and the note says both rather
    than contradicting the culprit line that names the code."""
    from parity_models import block_stack

    store, spec = GoldenStore(tmp_path), CheckSpec(name="between", dtypes=["float32"])
    m, x = block_stack()
    capture(m, x, spec, store, "cpu")

    def forward(x: torch.Tensor) -> torch.Tensor:
        x = m.inp(x)
        for i, b in enumerate(m.blocks):
            x = b(x * (1 + 2e-5) if i == 2 else x)
        return m.head(m.norm(x))
    m.forward = forward   # type: ignore[method-assign]
    (res,) = replay(m, x, spec, store, "cpu")
    text = message(res)
    assert "the fault lies between blocks.1 (last agreeing) and blocks.2 (first divergent), in no module" in text
    assert ("accumulated drift (see first divergent layer), or the code between blocks.1 and blocks.2 that the "
            "culprit line names") in text, text
