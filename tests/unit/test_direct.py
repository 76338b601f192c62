"""Isolated replay by direct calls (direct.py): each module called on its golden inputs.

The route must judge exactly as the hooked forward does (same tensors, same kernels), take the
hooked forward wherever a call cannot be rebuilt or needs its caller's context, and confirm any
failure there.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from pytest_rocm_parity import replay as replay_mod
from pytest_rocm_parity.capture import capture
from pytest_rocm_parity.direct import call_template, plan_level
from pytest_rocm_parity.engine import CheckSpec
from pytest_rocm_parity.golden import GoldenStore, RungReader
from pytest_rocm_parity.replay import replay


def _ratios(res) -> dict[str, tuple[float | None, float | None]]:
    return {l.name: (l.iso.ratio if l.iso else None, l.iso.ratio_lo if l.iso else None) for l in res.layers}


def _count(monkeypatch, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(replay_mod, name)
    monkeypatch.setattr(replay_mod, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _captured(tmp_path, model: nn.Module, inputs, name: str, drill: int):
    """(store, manifest, the float32 rung's meta) of a fresh CPU capture."""
    store = GoldenStore(tmp_path)
    manifest = capture(model, inputs, CheckSpec(name=name, dtypes=["float32"], drill=drill), store, "cpu")
    return store, manifest, manifest["rungs"]["float32"]


def _llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.BertModel(cfg).eval()


@pytest.mark.parametrize("arch", ["llama", "bert"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_direct_calls_judge_exactly_as_the_hooked_forward(tmp_path, monkeypatch, arch, dtype) -> None:
    model = _llama() if arch == "llama" else _bert()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
    spec = CheckSpec(name=arch, dtypes=[dtype], drill=2)
    store = GoldenStore(tmp_path)
    manifest = capture(model.to(getattr(torch, dtype)), inputs, spec, store, "cpu")
    meta = manifest["rungs"][dtype]
    layers = {e["key"]: e for e in meta["layers"]}
    for level in {e["level"] for e in meta["layers"]}:
        plan = plan_level(meta, layers, level)
        assert not isinstance(plan, str), plan           # every call of these models can be rebuilt
    direct_calls = _count(monkeypatch, "run_level")
    hooked_calls = _count(monkeypatch, "_run")
    (direct,) = replay(model, inputs, spec, store, "cpu")
    assert direct_calls and len(hooked_calls) == 1       # the propagated pass only
    monkeypatch.setattr(replay_mod, "DIRECT", False)
    (hooked,) = replay(model, inputs, spec, store, "cpu")
    assert direct.passed and hooked.passed
    assert _ratios(direct) == _ratios(hooked)            # the same tensors through the same kernels
    assert not [n for n in direct.notes if "direct" in n]


def test_a_kv_cache_object_sends_its_level_to_the_hooked_forward_with_a_hint(tmp_path, monkeypatch) -> None:
    """HF decoders given no use_cache=False hand each layer a DynamicCache, which no golden holds."""
    model = _llama()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="cache", dtypes=["float32"], drill=0, replay="fast")
    store = GoldenStore(tmp_path)
    capture(model, ids, spec, store, "cpu")
    direct_calls = _count(monkeypatch, "run_level")
    (res,) = replay(model, ids, spec, store, "cpu")
    assert res.passed and not direct_calls
    assert any("DynamicCache" in n and "use_cache=False" in n for n in res.notes), res.notes


def test_a_bug_is_blamed_on_the_same_module_and_confirmed_through_the_hooked_forward(tmp_path, monkeypatch) -> None:
    model = _llama()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    ids = {"input_ids": ids, "use_cache": False}
    spec = CheckSpec(name="bug", dtypes=["float32"], drill=2, replay="fast")
    store = GoldenStore(tmp_path)
    capture(model, ids, spec, store, "cpu")
    act = model.model.layers[1].mlp.act_fn
    monkeypatch.setattr(act, "forward", lambda x: torch.nn.functional.silu(x) * 1.02)
    direct_calls = _count(monkeypatch, "run_level")
    hooked_calls = _count(monkeypatch, "_run")
    (direct,) = replay(model, ids, spec, store, "cpu")
    # every level by direct calls; each failing level (the block, its MLP, the activation) judged
    # again through the hooked forward, which agreed: no note
    assert len(direct_calls) == 3 and len(hooked_calls) == 3
    assert not [n for n in direct.notes if "disagreed" in n or "failed" in n]
    monkeypatch.setattr(replay_mod, "DIRECT", False)
    (hooked,) = replay(model, ids, spec, store, "cpu")
    assert not direct.passed and direct.culprit == hooked.culprit == "model.layers.1.mlp.act_fn"
    assert _ratios(direct) == _ratios(hooked)


class WritesInput(nn.Module):
    """Scales its input in place; returns it (``returns_input``) or a new tensor, leaving it changed."""

    def __init__(self, returns_input: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((16,), 1.5))
        self.returns_input = returns_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(self.w)
        return x if self.returns_input else x + 1.0


class Shared(nn.Module):
    """a and b take the same tensor h; a writes it, after b read it or (``writer_first``) before."""

    def __init__(self, writer_first: bool = False) -> None:
        super().__init__()
        self.pre = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.a = WritesInput(returns_input=not writer_first)
        self.writer_first = writer_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        if self.writer_first:
            v = self.a(h)
            return self.b(h) + v
        u = self.b(h)
        return u + self.a(h)


@pytest.mark.parametrize("preloaded", [True, False])
def test_a_golden_two_calls_share_and_one_writes_is_handed_out_as_copies(tmp_path, monkeypatch, preloaded) -> None:
    """b and a take one recorded tensor; a writes it. Preloaded (a GPU replay), the golden is
    handed to both as one watched object, the write is seen and the level repeated with copies;
    read from the file (a CPU replay), each call gets its own tensor. Either way both modules are
    judged on the stored values and agree with the hooked forward."""
    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="shared", dtypes=["float32"], drill=2, replay="fast")
    store, manifest, meta = _captured(tmp_path, model, x, "shared", 2)
    keys = {e["name"]: e["in"]["args.0"] for e in meta["layers"]}
    assert keys["a"] == keys["b"]                         # one recorded tensor for both
    path = store.rung_file("shared", manifest, "float32")
    tmpl = {"args": (x,), "kwargs": {}}
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    reader = RungReader(path, "cpu")
    before = reader.get(keys["a"]).clone()
    if preloaded:
        reader.preload(sorted(reader.keys), 1 << 30)
    runs = _count(monkeypatch, "run_level")
    got = replay_mod._replay_rung(model, spec, manifest, meta, reader, "float32", "cpu", tmpl, keep_loaded=True)
    assert len(runs) == (2 if preloaded else 1)
    assert torch.equal(reader.get(keys["a"]), before)
    monkeypatch.setattr(replay_mod, "DIRECT", False)
    hooked = replay_mod._replay_rung(model, spec, manifest, meta, RungReader(path, "cpu"), "float32", "cpu", tmpl)
    assert got.passed and hooked.passed
    assert _ratios(got) == _ratios(hooked)


def test_a_tensor_written_before_another_call_takes_it_is_that_calls_own_golden(tmp_path, monkeypatch) -> None:
    """a writes h in place, then b takes h: the golden holds each call's input as it took it (b's
    with a's write; until session 13 both named the value a took), and the direct calls judge as
    the hooked forward."""
    torch.manual_seed(0)
    model = Shared(writer_first=True)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    store, manifest, meta = _captured(tmp_path, model, x, "writer", 2)
    keys = {e["name"]: e["in"]["args.0"] for e in meta["layers"]}
    assert keys["a"] != keys["b"]
    reader = RungReader(store.rung_file("writer", manifest, "float32"), "cpu")
    with torch.no_grad():
        h = model.pre(x)
    assert torch.equal(reader.get(keys["a"]), h) and torch.equal(reader.get(keys["b"]), h * 1.5)
    spec = CheckSpec(name="writer", dtypes=["float32"], drill=2, replay="fast", threads=1)
    (direct,) = replay(model, x, spec, store, "cpu")
    monkeypatch.setattr(replay_mod, "DIRECT", False)
    (hooked,) = replay(model, x, spec, store, "cpu")
    assert _ratios(direct) == _ratios(hooked)


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(16, 16)
        self.shared = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(self.shared(self.pre(x)))


@pytest.mark.parametrize("sketch", [0, 8])
def test_a_per_layer_tolerance_holds_for_every_call_of_its_module(tmp_path, sketch) -> None:
    """The override names the module; its second call (golden key "shared#1") is judged by it too,
    in the direct calls' verdict and in the record alike, and against a sketch golden."""
    from pytest_rocm_parity.tolerance import Tolerance

    torch.manual_seed(0)
    model = Twice()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    store = GoldenStore(tmp_path)
    capture(model, x, CheckSpec(name="twice", dtypes=["float32"], drill=1, sketch=sketch), store, "cpu")
    tol = Tolerance(layers={"shared": Tolerance(ratio=7.0)})
    spec = CheckSpec(name="twice", dtypes=["float32"], drill=1, replay="fast", tolerance=tol, sketch=sketch)
    (res,) = replay(model, x, spec, store, "cpu")
    budgets = {rec.name: rec.budget for rec in res.layers}
    assert budgets == {"pre": 10.0, "shared": 7.0, "shared#1": 7.0}


@dataclasses.dataclass
class Packet:
    x: torch.Tensor


class TakesPacket(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, p: Packet) -> torch.Tensor:
        return self.lin(p.x)


class PacketNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([TakesPacket(), TakesPacket()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(Packet(x))
        return x


def test_calls_a_rebuild_cannot_make_take_the_hooked_forward(tmp_path, monkeypatch) -> None:
    torch.manual_seed(0)
    model = PacketNet()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="packet", dtypes=["float32"], drill=0, replay="fast")
    store, _, meta = _captured(tmp_path, model, x, "packet", 0)
    layers = {e["key"]: e for e in meta["layers"]}
    why = plan_level(meta, layers, 0)
    assert isinstance(why, str) and "args.0" in why and "other" in why
    direct_calls = _count(monkeypatch, "run_level")
    (res,) = replay(model, x, spec, store, "cpu")
    assert res.passed and not direct_calls and all(l.iso is not None for l in res.layers)


def test_call_templates_say_why_a_call_cannot_be_rebuilt() -> None:
    base = {"in": {"args.0": "t/0"}, "const_in": {"kwargs.flag": True},
            "in_tree": {"args": "tuple", "kwargs": "dict"}}
    from pytest_rocm_parity.direct import builder

    a, kw = builder(*call_template(base))(lambda k: f"<{k}>")
    assert a == ("<t/0>",) and kw == {"flag": True}
    assert "in_tree is incomplete" in call_template({**base, "in": {"kwargs.pe.0": "t/1"}})
    assert "not an (args, kwargs) call" in call_template({**base, "in_tree": {"args": "dict", "kwargs": "dict"}})
    assert "predates" in call_template({k: v for k, v in base.items() if k != "in_tree"})
    assert "DynamicCache" in call_template({**base, "const_in": {"kwargs.past_key_values": "<DynamicCache>"}})
    assert "positions" in call_template({**base, "in": {"args.1": "t/0"}})
    nested = {"in": {"kwargs.pe.0": "t/1", "kwargs.pe.1": "t/2"}, "const_in": {"kwargs.mask": None, "kwargs.e": 3},
              "in_tree": {"args": "tuple", "kwargs": "dict", "kwargs.pe": "tuple", "kwargs.empty": "list"}}
    a, kw = builder(*call_template(nested))(lambda k: f"<{k}>")
    assert a == () and kw == {"pe": ("<t/1>", "<t/2>"), "mask": None, "e": 3, "empty": []}


class Child(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale    # set by the parent before each call


class Parent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Child(), Child()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            b.scale = 0.5
            x = b(x)
        return x


@pytest.mark.parametrize("stale", [False, True])
def test_modules_that_need_their_callers_context_are_judged_through_the_hooked_forward(tmp_path, monkeypatch,
                                                                                       stale) -> None:
    """A module reading state its parent sets during the forward: called directly it raises (never
    set) or computes with a stale value. Either way the level is judged through the hooked forward,
    which passes, and a note says why; the records are the hooked forward's, with nothing left of
    the direct calls' failing verdict."""
    torch.manual_seed(0)
    model = Parent()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="ctx", dtypes=["float32"], drill=0, replay="fast")
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cpu")
    for b in model.blocks:
        if stale:
            b.scale = 2.0
        else:
            del b.scale
    (res,) = replay(model, x, spec, store, "cpu")
    assert res.passed, [(l.name, l.reason) for l in res.layers]
    note = " ".join(res.notes)
    assert ("disagreed with the hooked forward" in note) if stale else ("a direct call failed" in note)
    monkeypatch.setattr(replay_mod, "DIRECT", False)
    (hooked,) = replay(model, x, spec, store, "cpu")
    assert [rec.to_dict() for rec in res.layers] == [rec.to_dict() for rec in hooked.layers]


def _llama_n(layers: int) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_threads_share_the_calls_and_judge_as_one_thread(tmp_path, monkeypatch, request) -> None:
    """--parity-threads: shares of a level's calls on host threads (GPU streams there; the CPU runs
    the same path here). The first call of each module class and the calls of a module called twice
    stay on the calling thread; the verdicts equal one thread's."""
    import threading

    from pytest_rocm_parity import direct

    model = _llama_n(8)
    model.model.layers.append(model.model.layers[3])      # one layer called twice: judged on the caller's thread
    model.config.num_hidden_layers = 9
    inputs = {"input_ids": torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1)),
              "use_cache": False}
    store = GoldenStore(tmp_path)
    capture(model, inputs, CheckSpec(name="t", dtypes=["float32"], drill=0), store, "cpu")
    monkeypatch.setattr(direct, "THREADS_ON_CPU", True)
    # one intra-op thread: a CPU kernel's reduction split then cannot depend on the calling thread
    # (on a GPU each call's kernels are the same whichever host thread launches them)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads_before))
    where: dict[str, set[str]] = {}
    for name, mod in model.named_modules():
        if name.count(".") <= 2:
            mod.register_forward_pre_hook(
                lambda m, a, n=name: where.setdefault(n, set()).add(threading.current_thread().name))
    results = {}
    for threads in (1, 3):
        where.clear()
        spec = CheckSpec(name="t", dtypes=["float32"], drill=0, replay="fast", threads=threads)
        (results[threads],) = replay(model, inputs, spec, store, "cpu")
        if threads == 3:
            main = threading.current_thread().name
            # the first call of each class, wherever it falls in the order, on the calling thread
            assert where["model.layers.0"] == where["model.norm"] == where["lm_head"] == {main}
            assert where["model.layers.3"] == {main}                         # called twice
            workers = set().union(*(where[f"model.layers.{i}"] for i in (1, 2, 4, 5, 6, 7)))
            # share 0 on the caller; shares 1 and 2 on the pool (one pool thread may take both)
            assert main in workers and workers - {main}
            assert all(w.startswith("parity-direct") for w in workers - {main})
    assert results[1].passed and results[3].passed
    assert _ratios(results[1]) == _ratios(results[3])


@pytest.mark.parametrize("threads", [1, 0])
def test_the_repeated_blocks_run_after_the_head_and_judge_as_in_the_models_order(tmp_path, monkeypatch,
                                                                                 threads) -> None:
    """direct.BLOCKS_LAST: a block's later calls come after every other call of the level (on a GPU
    the host then waits at the end for a block, not for the head), on one thread and with auto.
    A module called twice keeps both calls in their order; the verdicts are the model order's."""
    from pytest_rocm_parity import direct

    model = _llama_n(4)
    model.model.layers.append(model.model.layers[1])      # called twice: both calls in order, up front
    model.config.num_hidden_layers = 5
    inputs = {"input_ids": torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1)),
              "use_cache": False}
    store = GoldenStore(tmp_path)
    capture(model, inputs, CheckSpec(name="o", dtypes=["float32"], drill=0), store, "cpu")
    order: list[str] = []
    for name, mod in model.named_modules():
        if name.count(".") <= 2 and name not in ("", "model", "model.layers"):
            mod.register_forward_pre_hook(lambda m, a, n=name: order.append(n))
    spec = CheckSpec(name="o", dtypes=["float32"], drill=0, replay="fast", threads=threads)
    seen = {}
    for last in (True, False):
        monkeypatch.setattr(direct, "BLOCKS_LAST", last)
        order.clear()
        (res,) = replay(model, inputs, spec, store, "cpu")
        assert res.passed
        seen[last] = (list(order), _ratios(res))
    head = ["model.embed_tokens", "model.rotary_emb", "model.layers.0", "model.layers.1"]
    assert seen[True][0] == head + ["model.layers.1", "model.norm", "lm_head", "model.layers.2", "model.layers.3"]
    assert seen[False][0] == (head + ["model.layers.2", "model.layers.3", "model.layers.1", "model.norm", "lm_head"]
                              if threads == 1 else seen[True][0])   # auto shares the blocks whatever the switch
    assert seen[True][1] == seen[False][1]


@pytest.mark.parametrize("threads", [1, 0])
def test_a_part_before_the_blocks_holds_the_other_calls_statistics_and_judges_the_same(tmp_path, monkeypatch,
                                                                                       threads) -> None:
    """_StatsQueue.PART_BEFORE_BLOCKS: the statistics of the calls before a level's repeated blocks
    (the head's logits among them) start as one part before the blocks are called, the blocks' at
    the flush; the verdicts are those of one start at the flush."""
    from pytest_rocm_parity import direct

    model = _llama_n(4)
    inputs = {"input_ids": torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1)),
              "use_cache": False}
    store = GoldenStore(tmp_path)
    capture(model, inputs, CheckSpec(name="o", dtypes=["float32"], drill=0), store, "cpu")
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    monkeypatch.setattr(direct, "THREADS_ON_CPU", True)
    starts: list[list[str]] = []
    real = replay_mod._StatsQueue._launch
    monkeypatch.setattr(replay_mod._StatsQueue, "_launch",
                        lambda self, items, *rest: starts.append([it[8] for it in items]) or real(self, items, *rest))
    seen = {}
    for on in (True, False):
        monkeypatch.setattr(replay_mod._StatsQueue, "PART_BEFORE_BLOCKS", on)
        starts.clear()
        (res,) = replay(model, inputs, CheckSpec(name="o", dtypes=["float32"], drill=0, replay="fast",
                                                 threads=threads), store, "cpu")
        assert res.passed
        seen[on] = ([[t.split("/")[0] for t in s] for s in starts], _ratios(res))
    first = ["model.embed_tokens", "model.rotary_emb", "model.rotary_emb", "model.layers.0", "model.norm", "lm_head"]
    assert seen[True][0] == [first, [f"model.layers.{i}" for i in (1, 2, 3)]]
    assert seen[False][0] == [first + [f"model.layers.{i}" for i in (1, 2, 3)]]
    assert seen[True][1] == seen[False][1]


class Flaky(nn.Module):
    """Raises when called off the thread that built it."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.lin = nn.Linear(8, 8)
        self.owner = threading.get_ident()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import threading

        if threading.get_ident() != self.owner:
            raise RuntimeError("not thread-safe")
        return self.lin(x)


def test_a_call_that_fails_on_a_thread_sends_the_level_to_the_hooked_forward(tmp_path, monkeypatch) -> None:
    from pytest_rocm_parity import direct

    torch.manual_seed(0)
    model = nn.Sequential(*[Flaky() for _ in range(6)])
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    store = GoldenStore(tmp_path)
    capture(model, x, CheckSpec(name="f", dtypes=["float32"], drill=0), store, "cpu")
    monkeypatch.setattr(direct, "THREADS_ON_CPU", True)
    (res,) = replay(model, x, CheckSpec(name="f", dtypes=["float32"], drill=0, replay="fast", threads=2), store, "cpu")
    assert res.passed and any("not thread-safe" in n for n in res.notes), res.notes
    (one,) = replay(model, x, CheckSpec(name="f", dtypes=["float32"], drill=0, replay="fast", threads=1), store, "cpu")
    assert one.passed and not any("direct call failed" in n for n in one.notes)


def test_auto_threads_alternate_then_keep_the_faster_and_look_again_now_and_then() -> None:
    from pytest_rocm_parity.direct import AUTO_THREADS, _Chooser

    ch = _Chooser()
    key = ("cuda:0", "LlamaDecoderLayer")
    cost = {1: 1.0e-3, AUTO_THREADS: 0.8e-3}
    picks = []
    for _ in range(24):
        arm = ch.pick(key)
        picks.append(arm)
        # a first threaded pass pays for the pool's thread, streams and cuBLAS handle
        ch.record(key, arm, cost[arm] * (5 if arm == AUTO_THREADS and AUTO_THREADS not in picks[:-1] else 1))
    # each arm's first sample is a warm-up: three kept samples each take eight passes
    assert picks[:8] == [1, AUTO_THREADS] * 4
    assert ch.warmups[key] == {1: 1.0e-3, AUTO_THREADS: 4.0e-3} and max(ch.samples[key][AUTO_THREADS]) == 0.8e-3
    later = picks[8:]
    assert later.count(1) == len([n for n in range(9, 25) if n % ch.EXPLORE == 0])   # exploration only
    cost[AUTO_THREADS] = 1.4e-3          # the host got faster at launching: threads now lose
    for _ in range(2 * ch.EXPLORE * ch.KEEP):
        arm = ch.pick(key)
        ch.record(key, arm, cost[arm])
    assert [ch.pick(key) for _ in range(ch.EXPLORE - 1)].count(1) >= ch.EXPLORE - 2


@pytest.mark.parametrize("lead,want", [(0.015, 1), (0.04, 1), (0.06, 2), (0.13, 2)])   # 2: AUTO_THREADS
def test_auto_threads_need_a_clear_lead_over_one_thread(lead: float, want: int) -> None:
    """Two threads are kept only when their median is MARGIN (5%) under one thread's: a lead
    within the samples' noise keeps one thread."""
    from pytest_rocm_parity.direct import AUTO_THREADS, _Chooser

    ch = _Chooser()
    key = ("cuda:0", "LlamaDecoderLayer")
    spread = [1.0, 0.9, 1.1, 0.95, 1.05, 1.0]          # each arm's samples scatter around its cost
    cost = {1: 1.0e-3, AUTO_THREADS: (1 - lead) * 1.0e-3}
    seen = {1: 0, AUTO_THREADS: 0}
    for _ in range(6 * ch.EXPLORE):
        arm = ch.pick(key)
        ch.record(key, arm, cost[arm] * spread[seen[arm] % len(spread)])
        seen[arm] += 1
    later = [ch.pick(key) for _ in range(ch.EXPLORE - 1)]
    assert later.count(want) >= ch.EXPLORE - 2, later


def test_auto_threads_first_choice_outvotes_one_slow_round() -> None:
    """A slow round (the host's, at a process's start) that hits one thread's first kept sample does
    not hand the first choice to two threads: the choice waits for three samples per arm."""
    from pytest_rocm_parity.direct import AUTO_THREADS, _Chooser

    ch = _Chooser()
    key = ("cuda:0", "LlamaDecoderLayer")
    cost = {1: 0.70e-3, AUTO_THREADS: 0.90e-3}     # one thread is the faster arm here
    picks = []
    for i in range(12):
        arm = ch.pick(key)
        picks.append(arm)
        slow = 1.8 if i == 2 else 1.0               # pass 3: one thread's first kept sample, slowed
        ch.record(key, arm, cost[arm] * slow)
    assert picks[2] == 1
    settled = [arm for n, arm in enumerate(picks, 1) if n > 2 * (ch.FIRST + 1) and n % ch.EXPLORE]
    assert settled and set(settled) == {1}, picks    # every choice after the alternation: one thread


def test_auto_threads_time_a_level_up_to_its_judged_outputs(tmp_path, monkeypatch) -> None:
    """The auto choice's sample covers the flush after the calls (on a GPU, where the device
    finishes the shared calls' work): a flush made 40 ms slow shows in the time per call."""
    import time

    from pytest_rocm_parity import direct

    model = _llama_n(6)
    inputs = {"input_ids": torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1)),
              "use_cache": False}
    store = GoldenStore(tmp_path)
    capture(model, inputs, CheckSpec(name="t", dtypes=["float32"], drill=0), store, "cpu")
    monkeypatch.setattr(direct, "THREADS_ON_CPU", True)
    monkeypatch.setattr(direct, "CHOOSER", direct._Chooser())
    real_flush = replay_mod._StatsQueue.flush

    def slow_flush(self, **kw) -> None:
        real_flush(self, **kw)
        time.sleep(0.04)

    monkeypatch.setattr(replay_mod._StatsQueue, "flush", slow_flush)
    for _ in range(3):     # one thread's warm-up, two threads' warm-up, one thread's first kept sample
        (res,) = replay(model, inputs, CheckSpec(name="t", dtypes=["float32"], drill=0, replay="fast", threads=0),
                        store, "cpu")
        assert res.passed
    ((_, arms),) = direct.CHOOSER.samples.items()
    (sample,) = arms[1]
    shared = 5                              # layers 1-5: layer 0 is its class's first call
    assert sample >= 0.04 / shared


class StartsWriting(nn.Module):
    """Scales its input in place after using it once ``writing`` is set: its output is the same,
    but a golden handed to it and kept for the next pass would not be."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.writing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.writing:
            x.mul_(1.5)
        return y


class KeepsInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(16, 16)
        self.w = StartsWriting()
        self.post = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        return self.post(self.w(h.clone()) + h)


def test_a_pass_keeps_the_inputs_of_the_one_before_and_still_sees_a_write(tmp_path, monkeypatch) -> None:
    """Preloaded (a GPU replay), a level's calls keep the inputs of a pass that handed out only
    watched goldens and wrote none: no fetch from the second pass on, the same ratios as fetching
    every pass. A module that starts writing its input then is seen by the watch all the same: its
    pass is repeated with copies, the golden stays as stored, and it is judged on the stored
    values."""
    torch.manual_seed(0)
    model = KeepsInputs()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    store, manifest, meta = _captured(tmp_path, model, x, "keeps", 1)
    spec = CheckSpec(name="keeps", dtypes=["float32"], drill=1, replay="fast", threads=1)
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    fetches = []
    real = RungReader.fetcher
    monkeypatch.setattr(RungReader, "fetcher", lambda self, *a: fetches.append(1) or real(self, *a))
    got = {}
    for keep in (True, False):
        monkeypatch.setattr(replay_mod, "KEEP_INPUTS", keep)
        model.w.writing = False
        reader = RungReader(store.rung_file("keeps", manifest, "float32"), "cpu")
        reader.preload(sorted(reader.keys), 1 << 30)
        run = replay_mod.prepare_rung(model, spec, manifest, meta, reader, "float32", "cpu",
                                      {"args": (x,), "kwargs": {}}, keep_loaded=True)
        fetches.clear()
        got[keep] = [_ratios(run()) for _ in range(3)]
        assert len(fetches) == (1 if keep else 3)
        w_in = next(e["in"]["args.0"] for e in meta["layers"] if e["name"] == "w")
        stored = reader.get(w_in).clone()
        model.w.writing = True
        runs = _count(monkeypatch, "run_level")
        wrote = run()
        assert len(runs) == 2                         # the write seen: the level again, with copies
        assert torch.equal(reader.get(w_in), stored)  # the golden as stored
        assert wrote.passed
        got[keep].append(_ratios(wrote))
        got[keep].append(_ratios(run()))
    assert got[True] == got[False]
    assert got[True][0] == got[True][2]


class AppendsToItsList(nn.Module):
    """Appends its input to a list it was given: a kept list would grow from pass to pass."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, seen: list[torch.Tensor]) -> torch.Tensor:
        seen.append(x)
        return self.lin(x) + sum(seen)


class GivesAList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(16, 16)
        self.app = AppendsToItsList()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        return self.app(h, [h * 0.5])


def test_a_call_given_a_container_gets_it_built_again_every_pass(tmp_path, monkeypatch) -> None:
    """Inputs inside a list or dict of the call's are not kept across passes (DirectCall.flat): the
    module may change the container, as this one appends to it."""
    torch.manual_seed(0)
    model = GivesAList()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    store, manifest, meta = _captured(tmp_path, model, x, "lists", 1)
    plan = plan_level(meta, {e["key"]: e for e in meta["layers"]}, meta["layers"][0]["level"])
    assert [c.flat for c in plan] == [True, False]
    spec = CheckSpec(name="lists", dtypes=["float32"], drill=1, replay="fast", threads=1)
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    reader = RungReader(store.rung_file("lists", manifest, "float32"), "cpu")
    reader.preload(sorted(reader.keys), 1 << 30)
    run = replay_mod.prepare_rung(model, spec, manifest, meta, reader, "float32", "cpu",
                                  {"args": (x,), "kwargs": {}}, keep_loaded=True)
    for _ in range(3):
        res = run()
        assert res.passed and not res.notes[:-1], (res.notes, [(l.name, l.reason) for l in res.layers])


def test_every_output_of_a_llama_level_goes_through_a_slot_and_judges_as_the_general_walk(tmp_path,
                                                                                         monkeypatch) -> None:
    """The rotary embedding's (cos, sin) included: from the second pass on, every leaf a level
    queues came through a slot, which is what lets a GPU restart its graphed statistics
    (_StatsQueue._launch, stats_graph.Restart); the ratios are the general walk's."""
    model = _llama()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "use_cache": False}
    store = GoldenStore(tmp_path)
    manifest = capture(model, inputs, CheckSpec(name="l", dtypes=["float32"], drill=0), store, "cpu")
    meta = manifest["rungs"]["float32"]
    spec = CheckSpec(name="l", dtypes=["float32"], drill=0, replay="fast", threads=1)
    monkeypatch.setattr(replay_mod._StatsQueue, "DEFER_ON_CPU", True)
    runs: list[list[int]] = []
    real = replay_mod._StatsQueue._launch
    monkeypatch.setattr(replay_mod._StatsQueue, "_launch",
                        lambda self, items, slot_ids=None: runs.append(list(slot_ids or [])) or real(self, items, slot_ids))
    got = {}
    for slots in (True, False):
        monkeypatch.setattr(replay_mod, "SLOTS", slots)
        reader = RungReader(store.rung_file("l", manifest, "float32"), "cpu")
        reader.preload(sorted(reader.keys), 1 << 30)
        run = replay_mod.prepare_rung(model, spec, manifest, meta, reader, "float32", "cpu",
                                      {"args": (), "kwargs": inputs}, keep_loaded=True)
        runs.clear()
        got[slots] = [_ratios(run()) for _ in range(3)]
        rotary = next(e for e in meta["layers"] if e["name"].endswith("rotary_emb"))
        assert len(rotary["out"]) == 2
        assert len(runs) == 3 and len(runs[1]) == len(runs[2]) > 5
        assert all(runs[2]) == slots and not any(runs[0])
    assert got[True] == got[False]
