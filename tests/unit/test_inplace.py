"""Modules that change their input in place (ReLU(inplace=True), `x += ...`) are recorded and replayed right."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_rocm_parity.capture import capture
from pytest_rocm_parity.engine import CheckSpec
from pytest_rocm_parity.golden import GoldenStore, RungReader
from pytest_rocm_parity.replay import replay


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 32)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def test_inplace_module_output_is_its_result_not_its_input(tmp_path) -> None:
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="inplace", dtypes=["float32"], drill=2)
    store = GoldenStore(tmp_path)
    manifest = capture(model, x, spec, store, "cpu")
    meta = manifest["rungs"]["float32"]
    act = next(e for e in meta["layers"] if e["name"] == "act")
    reader = RungReader(store.rung_file("inplace", manifest, "float32"), "cpu")
    got_in, got_out = reader.get(act["in"]["args.0"]), reader.get(act["out"]["0"])
    with torch.no_grad():
        pre = model.fc1(x)
    torch.testing.assert_close(got_in, pre)                 # the input as it was before the ReLU
    torch.testing.assert_close(got_out, torch.relu(pre))    # the output after it
    assert (got_in < 0).any()
    (res,) = replay(model, x, spec, store, "cpu")
    assert res.passed, [(l.name, l.reason) for l in res.layers]


def _plain_and_preloaded(model, x, spec, tmp_path, monkeypatch):
    """Goldens of ``model`` on ``x``; their replay reading every tensor from the file; a reader with
    every golden preloaded (what a GPU replay does, replay._preload) and the function that replays
    through it, again and again. Both on the queued (GPU) comparison path."""
    from pytest_rocm_parity import replay as replay_mod
    from pytest_rocm_parity.replay import _replay_rung

    store = GoldenStore(tmp_path)
    manifest = capture(model, x.clone(), spec, store, "cpu")
    meta = manifest["rungs"]["float32"]
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    tmpl = {"args": (x,), "kwargs": {}}
    path = store.rung_file(spec.name, manifest, "float32")
    plain = _replay_rung(model, spec, manifest, meta, RungReader(path, "cpu"), "float32", "cpu", tmpl)
    reader = RungReader(path, "cpu")
    reader.preload(sorted(reader.keys), 1 << 30)

    def replay_preloaded():
        return _replay_rung(model, spec, manifest, meta, reader, "float32", "cpu", tmpl, keep_loaded=True)
    return meta, plain, reader, replay_preloaded


def _layer_ratios(res) -> dict[str, tuple[float | None, float | None]]:
    return {l.name: (l.iso.ratio if l.iso else None, l.prop.ratio if l.prop else None) for l in res.layers}


def test_queued_replay_judges_an_output_as_it_was_when_produced(tmp_path, monkeypatch) -> None:
    """The GPU path queues outputs and judges them after the pass; the ReLU(inplace=True) after fc1
    rewrites fc1's output before then. Judged from a snapshot, fc1 agrees (propagated ratio 1),
    as on the immediate path; judged from the live tensor it read 6.6e6."""
    from pytest_rocm_parity import replay as replay_mod

    torch.manual_seed(0)
    model = Net()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="inplace", dtypes=["float32"], drill=2)
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cpu")
    (immediate,) = replay(model, x, spec, store, "cpu")
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    (queued,) = replay(model, x, spec, store, "cpu")
    assert queued.passed and _layer_ratios(queued) == _layer_ratios(immediate)
    assert _layer_ratios(queued)["fc1"][1] < 1.5


@pytest.mark.parametrize("route", ["direct", "hooked"])
def test_preloaded_golden_written_by_the_model_is_reloaded_and_the_pass_repeated(tmp_path, monkeypatch, route) -> None:
    """Preloaded goldens are handed to the model without a copy; `act` writes its input, which is
    also fc1's stored output. The reader sees the write, reloads that tensor, and the pass runs
    again with a copy: the verdicts equal a replay that reads every tensor from the file. Both
    isolated routes: modules called directly (direct.py) and the hooked forward. (A repeat that
    discards statistics parts already started: tests/unit/test_stats_queue.py.)"""
    from pytest_rocm_parity import replay as replay_mod

    torch.manual_seed(0)
    model = Net()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="inplace", dtypes=["float32"], drill=2, replay="fast")
    meta, plain, reader, replay_preloaded = _plain_and_preloaded(model, x, spec, tmp_path, monkeypatch)
    act_in = next(e for e in meta["layers"] if e["name"] == "act")["in"]["args.0"]
    before = reader.get(act_in).clone()
    runs = []
    monkeypatch.setattr(replay_mod, "DIRECT", route == "direct")
    counted = "run_level" if route == "direct" else "_run"
    real_run = getattr(replay_mod, counted)
    monkeypatch.setattr(replay_mod, counted, lambda *a: runs.append(1) or real_run(*a))
    got = replay_preloaded()
    assert len(runs) == 2                                # the pass, then its repeat
    assert reader._copy_keys == {act_in}
    assert torch.equal(reader.get(act_in), before)       # the cache holds the stored tensor again
    assert got.passed and _layer_ratios(got) == _layer_ratios(plain)
    runs.clear()
    again = replay_preloaded()
    assert len(runs) == 1 and _layer_ratios(again) == _layer_ratios(plain)   # a copy now: no repeat
    assert torch.equal(reader.get(act_in), before)


class ScalesItsInput(nn.Module):
    """A model that writes its own input in place before using it (an in-place normalisation, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return self.fc(x)


def test_a_model_that_writes_its_own_input_gets_fresh_inputs_on_the_repeat(tmp_path, monkeypatch) -> None:
    """The whole model's stored inputs are handed out watched too: a forward that writes them is
    repeated, and the repeat must run on the stored values again (a copy), not on the tensor the
    first run doubled; the verdicts equal a replay that reads every tensor from the file."""
    from pytest_rocm_parity import replay as replay_mod

    torch.manual_seed(0)
    model = ScalesItsInput()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="own", dtypes=["float32"], drill=1, replay="full")
    _meta, plain, reader, replay_preloaded = _plain_and_preloaded(model, x, spec, tmp_path, monkeypatch)
    runs = []
    real_run = replay_mod._run
    monkeypatch.setattr(replay_mod, "_run", lambda *a: runs.append(1) or real_run(*a))
    got = replay_preloaded()
    assert len(runs) >= 2 and any(k.startswith("input/") for k in reader._copy_keys)
    assert plain.passed and got.passed
    assert [o.prop_passed for o in got.outputs] == [o.prop_passed for o in plain.outputs]
    assert _layer_ratios(got) == _layer_ratios(plain)
