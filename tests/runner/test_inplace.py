"""Modules that change their input in place (ReLU(inplace=True), `x += ...`) are recorded and replayed right."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.replay import replay


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


def _layer_ratios(res) -> dict[str, tuple[float | None, float | None]]:
    return {l.name: (l.iso.ratio if l.iso else None, l.prop.ratio if l.prop else None) for l in res.layers}


def test_an_output_is_judged_as_it_was_when_produced(tmp_path) -> None:
    """The ReLU(inplace=True) after fc1 rewrites fc1's output after fc1 returns. Judged as produced,
    fc1 agrees (propagated ratio about 1); judged from the live tensor it read 6.6e6."""
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="inplace", dtypes=["float32"], drill=2)
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cpu")
    (res,) = replay(model, x, spec, store, "cpu")
    assert res.passed and _layer_ratios(res)["fc1"][1] < 1.5


def test_a_model_that_writes_its_golden_inputs_leaves_the_golden_unchanged(tmp_path) -> None:
    """`act` writes its input, which is also fc1's stored output: modules get copies, so the golden
    on disk and in the reader stays as captured and two replays agree."""
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="inplace", dtypes=["float32"], drill=2)
    store = GoldenStore(tmp_path)
    manifest = capture(model, x.clone(), spec, store, "cpu")
    meta = manifest["rungs"]["float32"]
    act_in = next(e for e in meta["layers"] if e["name"] == "act")["in"]["args.0"]
    reader = RungReader(store.rung_file("inplace", manifest, "float32"), "cpu")
    before = reader.get(act_in).clone()
    (first,) = replay(model, x, spec, store, "cpu")
    (second,) = replay(model, x, spec, store, "cpu")
    assert first.passed and _layer_ratios(first) == _layer_ratios(second)
    assert torch.equal(RungReader(store.rung_file("inplace", manifest, "float32"), "cpu").get(act_in), before)


class ScalesItsInput(nn.Module):
    """A model that writes its own input in place before using it (an in-place normalisation, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return self.fc(x)


def test_a_model_that_writes_its_own_input_gets_the_stored_inputs_on_every_pass(tmp_path) -> None:
    """The model doubles its input in place: every pass (propagated, isolated) runs on a copy of the
    stored inputs, so two replays agree and both pass."""
    torch.manual_seed(0)
    model = ScalesItsInput()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="own", dtypes=["float32"], drill=1, replay="full")
    store = GoldenStore(tmp_path)
    capture(model, x.clone(), spec, store, "cpu")
    (first,) = replay(model, x.clone(), spec, store, "cpu")
    (second,) = replay(model, x.clone(), spec, store, "cpu")
    assert first.passed and second.passed
    assert _layer_ratios(first) == _layer_ratios(second)


class _AddsInPlace(nn.Module):
    """ResNet's `out += identity`: the block writes its child's output, then returns it."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        h += self.scale * x
        return h


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b = _AddsInPlace()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(x))


def _recorded(tmp_path, model_class: type, spec: CheckSpec) -> tuple[nn.Module, torch.Tensor, GoldenStore, dict, RungReader]:
    """(model, input, store, the float32 rung's meta, its reader) of a fresh CPU capture."""
    torch.manual_seed(0)
    model = model_class()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    store = GoldenStore(tmp_path)
    manifest = capture(model, x, spec, store, "cpu")
    reader = RungReader(store.rung_file(spec.name, manifest, "float32"), "cpu")
    return model, x, store, manifest["rungs"]["float32"], reader


@pytest.mark.parametrize("route", ["full", "fast"])
def test_a_child_output_written_by_its_parent_is_recorded_as_each_one_returned_it(tmp_path, route) -> None:
    """The block's golden is its own output, not its child's from before the `+=`; so a bug in the
    block's own arithmetic is caught and blamed on it, not on the child (matched by object alone,
    the block's golden would be the child's output and the bug would pass)."""
    spec = CheckSpec(name="residual", dtypes=["float32"], layers=["b", "b.lin", "head"], replay=route)
    model, x, store, meta, reader = _recorded(tmp_path, _Residual, spec)
    entry = {e["key"]: e for e in meta["layers"]}
    with torch.no_grad():
        lin_out, b_out = model.b.lin(x), model.b(x)
    assert torch.equal(reader.get(entry["b.lin"]["out"]["0"]), lin_out)
    assert torch.equal(reader.get(entry["b"]["out"]["0"]), b_out)
    assert torch.equal(reader.get(entry["head"]["in"]["args.0"]), b_out)
    assert replay(model, x, spec, store, "cpu")[0].passed
    model.b.scale = 1.5          # the block's own add goes wrong; its child is untouched
    res = replay(model, x, spec, store, "cpu")[0]
    assert not res.passed and res.culprit == "b", [(l.name, l.reason) for l in res.layers]


class _ReusesItsBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.buf: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.buf is None or self.buf.shape != y.shape or self.buf.dtype != y.dtype:
            self.buf = torch.empty_like(y)
        return self.buf.copy_(y)


class _CallsItTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = _ReusesItsBuffer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.shared(x).clone()
        return a + self.shared(a * 0.5 + 1)


def test_a_buffer_a_module_returns_on_every_call_is_recorded_once_per_call(tmp_path) -> None:
    model, x, _store, meta, reader = _recorded(tmp_path, _CallsItTwice, CheckSpec(name="reuse", dtypes=["float32"], drill=1))
    entry = {e["key"]: e for e in meta["layers"]}
    with torch.no_grad():
        first = model.shared.lin(x)
        second = model.shared.lin(first * 0.5 + 1)
    assert torch.equal(reader.get(entry["shared"]["out"]["0"]), first)
    assert torch.equal(reader.get(entry["shared#1"]["out"]["0"]), second)


def test_a_module_called_twice_is_judged_on_each_output_as_it_was_when_produced(tmp_path) -> None:
    """Its second call rewrites the first one's output: each call is judged on its own output."""
    spec = CheckSpec(name="twice", dtypes=["float32"], drill=1)
    model, x, store, meta, reader = _recorded(tmp_path, _CallsItTwice, spec)
    (res,) = replay(model, x, spec, store, "cpu")
    assert res.passed, [(l.name, l.reason) for l in res.layers]
    calls = [l for l in res.layers if l.name in ("shared", "shared#1")]
    assert len(calls) == 2 and all(l.iso is not None and l.iso.ratio <= 1.0 for l in calls)


@pytest.mark.parametrize("model, passes", [(_Residual, 2), (Net, 2), (_CallsItTwice, 2), ("plain", 1)])
def test_the_forward_is_recorded_again_only_where_a_tensor_handed_on_was_written(tmp_path, monkeypatch,
                                                                                 model, passes) -> None:
    """A model that writes nothing it hands on is recorded in one forward; one that does (a `+=` on
    a child's output, an in-place ReLU, a reused buffer) in a second one that snapshots every
    tensor seen again (capture.RecordPool.add)."""
    from pytest_rocm_parity.runner import capture as cap

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16)) if model == "plain" else model()
    width = 32 if model is Net else 16
    x = torch.randn(8, width, generator=torch.Generator().manual_seed(1))
    calls: list[bool] = []
    real = cap.recording_pass
    monkeypatch.setattr(cap, "recording_pass", lambda *a, **k: calls.append(k.get("resnap", False)) or real(*a, **k))
    layers = ["b", "b.lin", "head"] if model is _Residual else None
    capture(m, x, CheckSpec(name="r", dtypes=["float32"], drill=2, layers=layers), GoldenStore(tmp_path), "cpu")
    assert calls == [False, True][:passes]


class _WritesItsInput(nn.Module):
    """A block whose residual add writes its input in place (`x += f(x)`), as some ports do."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x += self.lin(self.norm(x))
        return x


class _TwoWritingBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([_WritesItsInput(), _WritesItsInput()])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


@pytest.mark.parametrize("route", ["full", "fast"])
def test_a_block_that_writes_its_golden_input_leaves_it_intact_for_its_children(tmp_path, route) -> None:
    """Block 0 writes its golden input in place, and its children are judged on that same golden
    at the next level: each module gets a copy of what the reader holds, so the children get the
    captured values (judged on a written golden, each norm measured 1.4e7x the reference's error)
    and the run passes, twice alike."""
    torch.manual_seed(0)
    model = _TwoWritingBlocks()
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="writes", dtypes=["float32"], drill=2, replay=route)
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cpu")
    (first,) = replay(model, x, spec, store, "cpu")
    (second,) = replay(model, x, spec, store, "cpu")
    assert first.passed, [(l.name, l.reason) for l in first.layers if not l.passed]
    assert {"blocks.0.norm", "blocks.1.norm"} <= {l.name for l in first.layers if l.iso is not None}
    assert _layer_ratios(first) == _layer_ratios(second)


class _WritesThroughData(nn.Module):
    """Writes its input where no version counter sees it (through ``.data``, as a kernel writing a
    raw pointer does), then returns it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.data.mul_(self.w.data)
        return x


class _PreThenWrite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Sequential(nn.Linear(16, 16), nn.GELU())   # pre's output is the GELU's: one golden
        self.ip = _WritesThroughData()
        self.out = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(self.ip(self.pre(x)))


@pytest.mark.parametrize("route", ["full", "fast"])
def test_a_write_no_version_counter_sees_leaves_the_golden_intact(tmp_path, route) -> None:
    """``ip`` writes its golden input (the GELU's stored output) through ``.data``: handed the
    reader's own tensor, the GELU would then be judged against the written one and blamed (7e6x);
    handed a copy, the unchanged model passes."""
    torch.manual_seed(0)
    model = nn.Sequential(_PreThenWrite(), _PreThenWrite()).eval()
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="rawwrite", dtypes=["float32"], replay=route)
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cpu")
    (res,) = replay(model, x, spec, store, "cpu")
    assert res.passed, [(l.name, l.reason) for l in res.layers if not l.passed]
    assert {"0.pre.1", "0.ip"} <= {l.name for l in res.layers if l.iso is not None}


class _ZeroesItsInput(nn.Module):
    """Zeroes its input once it has used it, through ``.data`` (as a kernel reusing its input's
    memory through a raw pointer would): no version counter sees the write."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.lin(x))
        x.data.mul_(0.0)
        return y


class _ZeroingChain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_ZeroesItsInput() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("route", [{"replay": "full"}, {"replay": "fast"}, {"sketch": 64}], ids=["full", "fast", "sketch"])
def test_a_model_that_zeroes_its_own_input_unseen_is_captured_on_the_stored_inputs_and_passes(tmp_path, route) -> None:
    """The first block zeroes the model's input where no version counter sees it, so the capture's
    second recording pass and its float64 truth would run on zeros while the golden stores (and the
    replay feeds) the real input: every pass of a capture gets its own copy of the stored inputs,
    and the caller's tensor is left as it was."""
    torch.manual_seed(0)
    model = _ZeroingChain()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    before = x.clone()
    spec = CheckSpec(name="zeroes", dtypes=["float32"], drill=1, **route)
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cpu")
    assert torch.equal(x, before)
    (res,) = replay(model, x, spec, store, "cpu")
    assert res.passed, ([(l.name, l.reason) for l in res.layers if not l.passed], [(o.name, o.reason) for o in res.outputs])


class _OffByOnePermille(nn.Linear):
    def __init__(self, lin: nn.Linear) -> None:
        super().__init__(lin.in_features, lin.out_features)
        self.load_state_dict(lin.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 1.001


def test_a_bug_in_a_model_that_scales_its_own_input_is_caught(tmp_path) -> None:
    """The model doubles its input in place: the whole model's float64 truth must be of the model on
    the stored input, not on the input its own forward already doubled (against a truth of fc(4x),
    the reference and a candidate 0.1% off are equally far from it, and the model's output passed)."""
    torch.manual_seed(0)
    model = ScalesItsInput()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="own", dtypes=["float32"], drill=1)
    store = GoldenStore(tmp_path)
    capture(model, x.clone(), spec, store, "cpu")
    model.fc = _OffByOnePermille(model.fc)   # a port's linear kernel, 0.1% off
    (res,) = replay(model, x.clone(), spec, store, "cpu")
    assert not res.passed and res.culprit == "fc", [(l.name, l.reason) for l in res.layers]
    assert [o.passed for o in res.outputs] == [False], [(o.name, o.reason) for o in res.outputs]


class _Table(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(x) + 1.5


class _UsesTable(nn.Module):
    def __init__(self, writes: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.writes = writes

    def forward(self, h: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.lin(h) * table)
        if self.writes:   # a port's kernel that reuses the table's memory once it has read it
            table.mul_(2.0)
        return y


class _SharedTable(nn.Module):
    """One table handed to every block, as a Llama hands its rotary tables."""

    def __init__(self) -> None:
        super().__init__()
        self.table = _Table()
        self.blocks = nn.ModuleList(_UsesTable() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.table(x)
        for b in self.blocks:
            x = b(x, t)
        return x


def test_blocks_handed_one_tensor_share_its_golden_copy_in_the_fast_pass(tmp_path) -> None:
    """The port's first block writes the table it shares with the others: in the candidate's own run
    the later blocks read the written table, and so they do in the fast pass, which hands the
    blocks one golden copy where the candidate hands them one tensor (a copy per block would hide
    the write: every block judged on a clean table, and the port passed)."""
    torch.manual_seed(0)
    model = _SharedTable().eval()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="shared", dtypes=["float32"], replay="fast", drill=0)
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cpu")
    (clean,) = replay(model, x, spec, store, "cpu")
    assert clean.passed, [(l.name, l.reason) for l in clean.layers if not l.passed]
    model.blocks[0].writes = True
    (res,) = replay(model, x, spec, store, "cpu")
    failing = {l.name for l in res.layers if not l.passed}
    assert not res.passed and failing == {"blocks.1", "blocks.2"}, [(l.name, l.reason) for l in res.layers]
