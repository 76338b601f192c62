"""Isolated replay by direct calls: each selected module called on its golden inputs, back to back.

Why: the isolated pass used to run the whole model with hooks that swap each selected module's
inputs for the golden ones. On a GPU the forward of a large model is bound by the host launching
kernels, so every microsecond of Python around a module (PyTorch's hook dispatch, the swap, the
model's own glue between modules) is added to the replay one to one: 1.30-1.38x the forward at 1.1B
on the H200. The golden already holds each call: its tensor inputs (``in``), its constants
(``const_in``) and the kinds of the containers they came in (``in_tree``, which captures record
since direct calls were added). Rebuilt once per golden, the calls run with nothing between them,
which is what an isolated judgement is: every module on the reference's inputs; the glue between
modules (causal masks, rotary tables) comes from the golden as it did through the hooks.

A level holding a call that cannot be rebuilt exactly goes back to the hooked pass: a golden without
``in_tree``, an input container known only as "other" (a dataclass, a model-output mapping, a named
tuple), an opaque constant (a KV-cache object, a dtype), a module the model no longer has.
"""
from __future__ import annotations

import collections
import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SLOT, _CONST, _TUPLE, _LIST, _DICT = range(5)
_KIND_CODE = {"tuple": _TUPLE, "list": _LIST, "dict": _DICT}


@dataclass(frozen=True)
class DirectCall:
    key: str            # the golden's layer key (module name, "#n" for its n-th call)
    name: str           # the module's name in the model
    make: Callable[[Callable[[str], Any]], tuple[Any, Any]]   # fetch -> (args, kwargs): builder()
    snapshot: bool      # the module is called again in this pass: its output may be a buffer it reuses
    # its inputs hold no container below the call's own (args, kwargs): what make() built may be
    # called with again, no module can have changed it (replay keeps it across passes)
    flat: bool = True


def call_template(entry: dict[str, Any]) -> tuple[Any, Any] | str:
    """(args node, kwargs node) rebuilding a recorded call, or why it cannot be rebuilt exactly."""
    tree = entry.get("in_tree")
    if tree is None:
        return "the golden predates recorded input containers (in_tree): recapture to replay by direct calls"
    leaves: dict[str, Any] = {p: (_SLOT, k) for p, k in entry.get("in", {}).items()}
    for p, v in entry.get("const_in", {}).items():
        if isinstance(v, str) and v.startswith("<") and v.endswith(">"):
            return f"input {p} is an object the golden does not hold ({v})"
        leaves[p] = (_CONST, v)
    other = [p for p, k in tree.items() if k not in _KIND_CODE]
    if other:
        return f"input {other[0]} is a container a rebuild cannot make ({tree[other[0]]})"
    kinds = {"args": "tuple", "kwargs": "dict", **tree}
    if kinds["args"] not in ("tuple", "list") or kinds["kwargs"] != "dict":
        return "the recorded inputs are not an (args, kwargs) call"
    children: dict[str, list[tuple[str, str]]] = {}
    for path in list(kinds) + list(leaves):
        parent, _, name = path.rpartition(".")
        if parent and parent not in kinds or not parent and name not in ("args", "kwargs"):
            return f"input {path} lies in no recorded container (the golden's in_tree is incomplete)"
        children.setdefault(parent, []).append((name, path))

    def build(path: str) -> Any:
        if path in leaves:
            return leaves[path]
        code = _KIND_CODE[kinds[path]]
        kids = children.get(path, [])
        if code == _DICT:
            return (_DICT, {n: build(p) for n, p in kids})
        by_index = {int(n): p for n, p in kids if n.isdigit()}
        if sorted(by_index) != list(range(len(kids))):
            raise _Gap(path)
        return (code, [build(by_index[i]) for i in range(len(kids))])

    try:
        return build("args"), build("kwargs")
    except _Gap as gap:
        return f"input {gap} has positions the golden does not hold"


class _Gap(Exception):
    pass


def builder(args: Any, kwargs: Any) -> Callable[[Callable[[str], Any]], tuple[Any, Any]]:
    """The function that rebuilds a call from call_template's nodes: fetch -> (args, kwargs).

    Why generated code: the nodes were walked on every call of every pass, one Python function
    call per node (about nine per decoder layer), host time added to a GPU replay one to one; as
    one expression, made once per golden, the containers are built by the interpreter's own
    opcodes (with RungReader.fetcher, session 10's pass-level measurements are in
    docs/benchmarks.md). Golden keys and container keys go in as repr() of strings, constants by
    reference (``C[i]``), so no value of a golden reaches the source.
    """
    consts: list[Any] = []

    def src(node: Any) -> str:
        code, val = node
        if code == _SLOT:
            return f"f({str(val)!r})"
        if code == _CONST:
            consts.append(val)
            return f"C[{len(consts) - 1}]"
        if code == _DICT:
            return "{" + ", ".join(f"{str(k)!r}: {src(v)}" for k, v in val.items()) + "}"
        items = "".join(f"{src(v)}, " for v in val)
        return f"({items})" if code == _TUPLE else f"[{items}]"
    return eval(f"lambda f: ({src(args)}, {src(kwargs)})", {"C": consts})   # our own source, see above


def plan_level(meta: dict[str, Any], layers: dict[str, dict[str, Any]], level: int) -> list[DirectCall] | str:
    """The calls of one nesting level in execution order, or why the level needs the hooked pass.

    Made once per replay of a rung (replay.prepare_rung), before any pass.
    """
    keys = [k for k in meta.get("order", list(layers)) if k in layers and layers[k]["level"] == level]
    names = [layers[k]["name"] for k in keys]
    calls_of = collections.Counter(names)
    plan: list[DirectCall] | str = []
    for key, name in zip(keys, names):
        t = call_template(layers[key])
        if isinstance(t, str):
            plan = f"{key}: {t}"
            break
        assert isinstance(plan, list)
        plan.append(DirectCall(key, name, builder(*t), calls_of[name] > 1, _flat(*t)))
    return plan


def _flat(args: Any, kwargs: Any) -> bool:
    """Whether every argument is a leaf or a tuple of leaves (no list or dict a module could change)."""
    leafy = (_SLOT, _CONST)
    return all(code in leafy or code == _TUPLE and all(c in leafy for c, _ in val)
               for code, val in [*args[1], *kwargs[1].values()])


def run_level(model: Any, calls: list[DirectCall], built: list[tuple[Any, Any]],
              on_output: Callable[[str, Any, bool], None], workers: int = 1,
              mods: list[Any] | None = None, before_rest: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """Call each module on its golden inputs; on_output(key, output, snapshot) after each call.

    Returns, when ``workers`` is AUTO and the calls were shared, the function that records this
    level's time per call for the choice: the caller calls it once the level's outputs are judged
    (after the flush's synchronisation), so the time includes the device finishing the calls.
    Timed to the end of the host's launches alone, the choice did not see the device's part: on
    the H200 auto then measured 1.177x the forward where one thread gave 1.141x and two 1.187x
    (session 5, docs/benchmarks.md).

    ``built``: each call's (args, kwargs), in ``calls``' order, made by its DirectCall.make from
    this pass's fetch (RungReader.fetcher: a golden handed out watched reaches every call that
    takes it as one object, a rotary table or a mask as in the reference's forward; a copy is one
    per call), or kept from an earlier pass whose goldens were all handed out watched and none
    written (replay re-registers them with RungReader.rehand).

    ``workers`` > 1, on a GPU: the calls of a level are independent (each takes golden inputs), so
    contiguous shares of them run on that many host threads, each on a CUDA stream of its own. A
    forward bound by the host launching kernels may spend much of its time in torch's C++ with the
    interpreter lock released, which the threads can overlap. ``workers`` = 0 (AUTO): 1 or 2
    threads, whichever has issued these calls faster in this process (see _Chooser). Run first on
    this thread, in order: the first call of each module class (lazy set-up, Triton compiles, handle
    creation happen once, unraced) and every call of a module called more than once (its output may
    be a buffer its next call reuses, so it is judged at once). The other calls (a model's repeated
    blocks) come after them, shared or not (BLOCKS_LAST). ``before_rest``: called between the two
    groups, when there are later calls (the caller starts the first group's statistics there).
    """
    import torch

    if mods is None:   # the modules called, in order (resolve_modules; the caller may keep them)
        mods = resolve_modules(model, calls)
    rest: list[int] = []           # the repeated blocks' later calls: last, and the threads may share them
    if BLOCKS_LAST or workers != 1:
        seen: set[type] = set()
        for i, (c, mod) in enumerate(zip(calls, mods)):
            if not c.snapshot and type(mod) in seen:
                rest.append(i)
            seen.add(type(mod))
    dev = next((t.device for t in model.parameters() if t.is_cuda or THREADS_ON_CPU), None) \
        if workers != 1 and len(rest) >= 2 * max(workers, AUTO_THREADS) else None
    shared_calls = set(rest)
    with torch.inference_mode():
        for i, c in enumerate(calls):
            if i not in shared_calls:
                a, kw = built[i]
                on_output(c.key, mods[i](*a, **kw), c.snapshot)
    if rest and before_rest is not None:
        before_rest()
    key = (str(dev), type(mods[rest[0]]).__name__) if dev is not None else None
    n = 1 if dev is None else workers or CHOOSER.pick(key)
    t0 = time.perf_counter()
    if n > 1:
        # inputs built before, in order, by one thread (the reader's watch list is no state to race
        # on), and held until every stream is joined (a copy handed to one call must outlive its read)
        for i, o in zip(rest, _threaded([(mods[i], *built[i]) for i in rest], n, dev)):
            on_output(calls[i].key, o, False)
    else:
        with torch.inference_mode():
            for i in rest:
                a, kw = built[i]
                on_output(calls[i].key, mods[i](*a, **kw), False)
    if key is not None and not workers:
        return lambda: CHOOSER.record(key, n, (time.perf_counter() - t0) / len(rest))
    return None


def resolve_modules(model: Any, calls: list[DirectCall]) -> list[Any]:
    """The module of each call; AttributeError for one the model no longer has."""
    get = model.get_submodule
    return [get(c.name) if c.name else model for c in calls]


AUTO = 0            # run_level(workers=AUTO): 1 or AUTO_THREADS threads, chosen by measurement
AUTO_THREADS = 2
# the later calls of a module class already called (a model's repeated blocks) run after every other
# call of the level, on one thread as on several: the calls are independent, and on a GPU the host
# then waits at the end for a block's last kernels rather than for the model's head (the 1.1B's
# lm_head, the largest output), whose device time runs while the host still launches the blocks
BLOCKS_LAST = True


class _Chooser:
    """1 or AUTO_THREADS threads per (device, module class), by the host time per call measured here.

    Why measured: which one wins depends on the host's phase, not on the model alone. On H200
    leases the same 1.1B fast pass measured 0.97-1.04x the forward with two threads against
    1.11-1.16x with one in some runs, and 1.37x against 1.16x in another (docs/benchmarks.md). The
    arms alternate until each has FIRST (3) samples, then the faster median is used, with one try
    of the other every EXPLORE passes (the host's speed drifts within minutes).

    Each arm's first sample is a warm-up, kept apart (``warmups``) and out of the choice: the first
    threaded pass makes the pool's thread, the side streams and that thread's cuBLAS handle, and
    the first passes of a signature run the statistics eagerly, then capture their graph. On the
    H200 the two-thread arm's first sample was 3.2-4.9 ms per call against 0.9-1.1 after (session 7,
    docs/benchmarks.md), half of the median that made the first choice.

    Two threads are chosen only when their median is MARGIN under one thread's: a closer call is
    within the samples' noise, and one thread is the arm with nothing to contend. On the H200 a
    1.4% lead of two threads in the samples (791 against 802 us per call) chose them where one
    thread, run alone, measured 0.99-1.03x the forward against auto's 1.09-1.18x; where two threads
    won (0.84-1.01x against 1.02-1.09x) their samples led by 13-25% (session 9, docs/benchmarks.md).
    Where one thread won by far (0.995x against 1.317x) auto still began on two threads: the first
    rounds of a process run slow at random, for whichever arm they hit, and there they hit its
    first one-thread samples (10 ms slow; not the allocator: session 9, runs 10 and 11). Hence
    FIRST: three samples per arm before the first choice.
    """

    EXPLORE = 8
    KEEP = 6
    MARGIN = 0.05
    # kept samples per arm before the first choice: a median of two is their mean, which one slow
    # round moves all the way; of three, one slow round is outvoted (run 11: a process's first
    # rounds are slow at random)
    FIRST = 3

    def __init__(self) -> None:
        self.samples: dict[Any, dict[int, collections.deque[float]]] = {}
        self.warmups: dict[Any, dict[int, float]] = {}
        self.picks: dict[Any, int] = {}

    def pick(self, key: Any) -> int:
        s = self.samples.setdefault(key, {1: collections.deque(maxlen=self.KEEP),
                                          AUTO_THREADS: collections.deque(maxlen=self.KEEP)})
        self.picks[key] = n = self.picks.get(key, 0) + 1
        thin = [arm for arm in (1, AUTO_THREADS) if len(s[arm]) < self.FIRST]
        if thin:   # alternate, one thread first: a run of two passes has tried both
            warm = self.warmups.get(key, {})
            return min(thin, key=lambda arm: len(s[arm]) + (arm in warm))
        threads = statistics.median(s[AUTO_THREADS]) < (1 - self.MARGIN) * statistics.median(s[1])
        best, other = (AUTO_THREADS, 1) if threads else (1, AUTO_THREADS)
        return other if n % self.EXPLORE == 0 else best

    def record(self, key: Any, arm: int, per_call: float) -> None:
        warm = self.warmups.setdefault(key, {})
        if arm not in warm:
            warm[arm] = per_call
            return
        self.samples[key][arm].append(per_call)


CHOOSER = _Chooser()


THREADS_ON_CPU = False   # tests set it to run the threaded path without a GPU (no streams there)
_POOL: Any = None
_STREAMS: dict[Any, list[Any]] = {}


def _threaded(built: list[tuple[Any, Any, Any]], workers: int, dev: Any) -> list[Any]:
    """Outputs of the built calls, run in ``workers`` contiguous shares on threads and side streams."""
    import concurrent.futures
    import torch

    global _POOL
    if _POOL is None or _POOL._max_workers < workers - 1:
        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=max(workers - 1, 1),
                                                      thread_name_prefix="parity-direct")
    cuda = dev.type == "cuda"
    streams = _STREAMS.setdefault(dev, []) if cuda else []
    while cuda and len(streams) < workers:
        streams.append(torch.cuda.Stream(device=dev))
    main: Any = torch.cuda.current_stream(dev) if cuda else None
    outs: list[Any] = [None] * len(built)
    step = -(-len(built) // workers)

    def share(k: int) -> None:
        with contextlib.ExitStack() as on:
            if cuda:
                on.enter_context(torch.cuda.device(dev))
                on.enter_context(torch.cuda.stream(streams[k]))
            on.enter_context(torch.inference_mode())
            for i in range(k * step, min(len(built), (k + 1) * step)):
                mod, a, kw = built[i]
                outs[i] = mod(*a, **kw)

    for s in streams[:workers]:      # none on the CPU
        s.wait_stream(main)          # the goldens were loaded and handed out on the main stream
    futures = [_POOL.submit(share, k) for k in range(1, workers)]
    try:
        share(0)
    finally:
        for f in futures:
            f.exception()            # every share ends before its inputs may be released
        for s in streams[:workers]:
            main.wait_stream(s)      # the statistics (main stream) read the outputs after their calls
    for f in futures:
        f.result()                   # a share's error, raised here
    return outs

