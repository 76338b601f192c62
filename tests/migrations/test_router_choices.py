"""A router inside a block judged in isolation sees the block's other children's outputs, which
differ from the reference's by rounding: a token at a near-tie of its scores goes to another expert
there, and its output differs whole, as on a correct backend (docs/judging.md, "Choices inside an
isolated call")."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from parity_models import capture_then_replay, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec

H, TOKENS = 16, (2, 8)


class Mix(nn.Module):
    """The 'attention' of the block: exact here (a copy), so the golden is exact too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


class RoundsOtherwise(nn.Module):
    """A port of Mix whose arithmetic rounds the first element of some tokens one ulp up: within
    rounding of the reference, as another kernel's summation order would be."""

    def __init__(self, tokens: list[int]) -> None:
        super().__init__()
        self.tokens = tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * 1.0
        flat = out.view(-1, H)
        for t in self.tokens:
            flat[t, 0] = torch.nextafter(flat[t, 0], torch.tensor(float("inf"), dtype=flat.dtype))
        return out


class Router(nn.Module):
    """Top-1 of two experts: expert 1's score is the token's first feature, expert 0's its second."""

    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = a.reshape(-1, H)
        scores = torch.stack([flat[:, 1], flat[:, 0]], -1)
        return scores, scores.argmax(-1, keepdim=True)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix = Mix()
        self.router = Router()
        self.experts = nn.ModuleList(nn.Linear(H, H) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.routed(x, self.mix(x))

    def routed(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """x plus each token of ``a`` through the expert its router picks."""
        _, idx = self.router(a)
        flat = a.reshape(-1, H)
        out = torch.where(idx == 0, self.experts[0](flat), self.experts[1](flat))
        return x + out.reshape(x.shape)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def _model() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def _inputs(ties: list[int], tokens: tuple[int, int] = TOKENS) -> torch.Tensor:
    """Tokens far from a tie of the router's two scores, except ``ties``, whose two are equal."""
    x = torch.randn(*tokens, H, generator=torch.Generator().manual_seed(1))
    flat = x.view(-1, H)
    flat[:, 0] = flat[:, 1] + torch.where(torch.rand(flat.shape[0], generator=torch.Generator().manual_seed(2)) < 0.5,
                                          -1.0, 1.0)
    flat[ties, 0] = flat[ties, 1]
    return x.to(torch.bfloat16).float()


def _replay(ties: list[int], moved: list[int], route: str = "fast"):
    candidate = _model()
    candidate.blocks[0].mix = RoundsOtherwise(moved).eval()
    spec = CheckSpec(name="m", dtypes=["bfloat16"], layers=["blocks.0", "blocks.0.*"], replay=route)
    (res,) = capture_then_replay(_model, candidate, _inputs(ties), spec)
    return res


@pytest.mark.parametrize("route", ["fast", "full"])
def test_a_token_a_router_sends_elsewhere_at_a_near_tie_inside_its_block_is_scored_as_the_reference(route) -> None:
    """Token 5's two scores tie; the port's mix rounds its first feature up one ulp, so inside the
    block's isolated call (in the forward, or called directly) the router picks the other expert for
    it. The router on its own golden inputs agrees, and so does the mix within rounding: the block
    passes in isolation, and a note names the token. (The full replay's propagated verdict of the
    model output, where that token differs whole, is the near-tie rule of the outputs.)"""
    res = _replay(ties=[5], moved=[5], route=route)
    assert all(l.iso_passed for l in res.layers) and res.passed == (route == "fast"), verdicts([res])
    block = next(l for l in res.layers if l.name == "blocks.0")
    assert block.iso is not None and block.iso.ratio < 1.5, block.iso
    assert any(n.startswith("blocks.0: 1 of 16 tokens took other choices at blocks.0.router") for n in res.notes), res.notes


def test_more_than_half_the_tokens_sent_elsewhere_is_judged_whole() -> None:
    """Every token at a tie, every one moved: not a few near-ties, and the block is judged on all of
    them (its router's other choices are the block's error)."""
    every = list(range(TOKENS[0] * TOKENS[1]))
    res = _replay(ties=every, moved=every)
    block = next(l for l in res.layers if l.name == "blocks.0")
    assert not block.passed, verdicts([res])
    assert not any("took other choices" in n for n in res.notes), res.notes


class MovesAToken(Block):
    """A port whose block adds 2 to token 3's first feature before its router: its own code is
    wrong, and the router sends that token elsewhere though the reference's scores for it are far
    from a tie (they differ by 1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.mix(x)
        a.view(-1, H)[3, 0] += 2.0
        return self.routed(x, a)


def test_a_fault_of_the_block_that_sends_a_token_elsewhere_is_not_a_near_tie() -> None:
    """Only a choice the reference's own scores nearly tie is scored as the reference's: the block
    that moves token 3 is named, whatever its router then does with it."""
    candidate = _model()
    wrong = MovesAToken()
    wrong.load_state_dict(candidate.blocks[0].state_dict())
    candidate.blocks[0] = wrong.eval()
    spec = CheckSpec(name="m", dtypes=["bfloat16"], layers=["blocks.0", "blocks.0.*"], replay="fast")
    (res,) = capture_then_replay(_model, candidate, _inputs([5]), spec)
    assert not res.passed and res.culprit == "blocks.0", verdicts([res])
    assert not any("took other choices" in n for n in res.notes), res.notes


class PicksWrongForOne(Router):
    """A port of the router that returns the other expert for token 3, whose scores differ by 1."""

    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores, idx = super().forward(a)
        idx = idx.clone()
        idx[3] = 1 - idx[3]
        return scores, idx


def test_a_router_that_picks_another_expert_where_the_scores_do_not_tie_is_named() -> None:
    """One choice of 128 differs: the near-tie allowance of integer outputs lets that many through
    (judging.md), but the reference's own scores for that token are 1 apart, so it is no near-tie,
    and the router is named."""
    candidate = _model()
    candidate.blocks[0].router = PicksWrongForOne().eval()
    spec = CheckSpec(name="m", dtypes=["bfloat16"], layers=["blocks.0", "blocks.0.*"], replay="fast")
    (res,) = capture_then_replay(_model, candidate, _inputs([], (4, 32)), spec)
    assert not res.passed and res.culprit == "blocks.0.router", verdicts([res])
    router = next(l for l in res.layers if l.name == "blocks.0.router")
    assert "1 token of them where the reference's own scores do not tie" in router.reason, router.reason


@pytest.mark.parametrize("route", ["fast", "full"])
def test_a_router_below_the_drill_depth_is_watched(route) -> None:
    """With only the block selected (drill 0), the golden keeps its router's choices (a ``watch``
    entry): the token moved at the tie is scored as the reference's in the block's isolated verdict
    as above, though the router itself is not judged."""
    candidate = _model()
    candidate.blocks[0].mix = RoundsOtherwise([5]).eval()
    spec = CheckSpec(name="m", dtypes=["bfloat16"], layers=["blocks.0"], drill=0, replay=route)
    (res,) = capture_then_replay(_model, candidate, _inputs([5]), spec)
    assert [l.name for l in res.layers] == ["blocks.0"] and res.layers[0].iso_passed, verdicts([res])
    assert any(n.startswith("blocks.0: 1 of 16 tokens took other choices at blocks.0.router") for n in res.notes), res.notes


def test_a_fault_of_the_block_below_the_drill_depth_is_still_named() -> None:
    """The watched router's choice for token 3 differs where the reference's scores are 1 apart:
    no near-tie, and the block fails."""
    candidate = _model()
    wrong = MovesAToken()
    wrong.load_state_dict(candidate.blocks[0].state_dict())
    candidate.blocks[0] = wrong.eval()
    spec = CheckSpec(name="m", dtypes=["bfloat16"], layers=["blocks.0"], drill=0, replay="fast")
    (res,) = capture_then_replay(_model, candidate, _inputs([5]), spec)
    assert not res.passed and res.culprit == "blocks.0", verdicts([res])
    assert not any("took other choices" in n for n in res.notes), res.notes


def test_a_golden_derived_below_its_routers_watches_them(tmp_path) -> None:
    """``golden derive --drill 0`` of a golden that selected the router keeps the router's choices
    as a capture at drill 0 does (the same ``watch`` entry, the same tensors), and its replay scores
    the moved token as the reference's."""
    from pytest_rocm_parity.golden.derive import derive
    from pytest_rocm_parity.golden.reader import RungReader
    from pytest_rocm_parity.golden.store import GoldenStore, expected_digest
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.replay import replay

    store = GoldenStore(tmp_path)
    capture(_model(), _inputs([5]), CheckSpec(name="deep", dtypes=["bfloat16"], layers=["blocks.0", "blocks.0.*"]),
            store, "cpu")
    derive(store, "deep", store, "shallow", ["bfloat16"], drill=0)
    shallow = CheckSpec(name="captured", dtypes=["bfloat16"], layers=["blocks.0"], drill=0)
    capture(_model(), _inputs([5]), shallow, store, "cpu")

    def watched(name: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
        m = store.read_manifest(name)
        rung = m["rungs"]["bfloat16"]
        reader = RungReader(store.rung_file(name, m, "bfloat16"), "cpu", expected_digest(rung))
        return rung["watch"], {f"{e['name']}/{p}": reader.get(k) for e in rung["watch"] for p, k in e["out"].items()}
    (derived, d_values), (captured, c_values) = watched("shallow"), watched("captured")
    assert [(e["name"], e["level"], sorted(e["out"])) for e in derived] == \
        [(e["name"], e["level"], sorted(e["out"])) for e in captured] == [("blocks.0.router", 1, ["0", "1"])]
    assert d_values.keys() == c_values.keys() and all(torch.equal(d_values[k], c_values[k]) for k in d_values)

    candidate = _model()
    candidate.blocks[0].mix = RoundsOtherwise([5]).eval()
    (res,) = replay(candidate, _inputs([5]), dataclasses.replace(shallow, name="shallow", replay="fast"), store, "cpu")
    assert res.passed and any("took other choices at blocks.0.router" in n for n in res.notes), verdicts([res])


class MaskedMix(Mix):
    """Mix that reads the padding mask, as attention does (and leaves the values as they are)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:   # type: ignore[override]
        return x * mask[..., None].to(x.dtype).clamp(min=1.0)


class MaskedRoundsOtherwise(RoundsOtherwise):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:   # type: ignore[override]
        return super().forward(x)


class MaskedBlock(Block):
    def __init__(self) -> None:
        super().__init__()
        self.mix = MaskedMix()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:   # type: ignore[override]
        return self.routed(x, self.mix(x, mask))


class MaskedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([MaskedBlock()])

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, attention_mask)
        return x


def _masked_model() -> MaskedNet:
    torch.manual_seed(0)
    return MaskedNet().eval()


@pytest.mark.parametrize("route", ["fast", "full"])
def test_padded_tokens_are_neither_counted_nor_weighed_among_the_choices_sent_elsewhere(route) -> None:
    """Tokens 10-15 are padding, and the candidate's choices there are made on whatever it computes
    at padded positions. With four unpadded tokens of ten moved at near-ties, the block is scored
    on the rest and passes, and the note counts ten tokens; counting the padded ones, ten of sixteen
    moved reads as more than half, and the block was judged whole and failed."""
    padded = list(range(10, 16))
    moved = [0, 1, 2, 3] + padded
    candidate = _masked_model()
    candidate.blocks[0].mix = MaskedRoundsOtherwise(moved).eval()
    mask = torch.ones(TOKENS, dtype=torch.long)
    mask[1, 2:] = 0
    spec = CheckSpec(name="m", dtypes=["bfloat16"], layers=["blocks.0", "blocks.0.*"], replay=route)
    (res,) = capture_then_replay(_masked_model, candidate, {"x": _inputs(moved), "attention_mask": mask}, spec)
    block = next(l for l in res.layers if l.name == "blocks.0")
    assert block.iso_passed, verdicts([res])
    assert any(n.startswith("blocks.0: 4 of 10 tokens took other choices at blocks.0.router") for n in res.notes), \
        res.notes
