"""The ``parity`` fixture object: capture or replay a model, depending on the session's mode."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from pytest_rocm_parity.judging import dtypes as dt
from pytest_rocm_parity.judging.assertion import headline, property_text, raise_if_failed
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec, default_dtypes, sketch_group
from pytest_rocm_parity.runner.replay import check_inputs, check_stale, replay as replay_golden
from pytest_rocm_parity.runner.selection import check_tolerance_layers
from pytest_rocm_parity.runner.wrappers import unwrap
from pytest_rocm_parity.errors import GoldenCorrupt, GoldenExists, GoldenMissing, GoldenStale, InvalidArgument, ParityError
from pytest_rocm_parity.errors import WriteForbidden
from pytest_rocm_parity.errors import ReferenceChange
from pytest_rocm_parity.progress import checking, progress
from pytest_rocm_parity.guards import (clean_errors, fail_once, known_keywords, require_inputs, require_model,
                                       require_token_ids, require_trainable)
from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.judging.tolerance import coerce
from pytest_rocm_parity.options import capture_command, default_name, shell_quote


class Parity:
    """What a test gets as ``parity``: ``check``, ``check_lm`` and ``compare_op``."""

    def __init__(self, session: Any, node: Any) -> None:
        self._session = session
        self._node = node
        self._count = 0
        self._claimed: set[str] = set()   # check names this test has run (one name, one check)
        marker = node.get_closest_marker("parity") if node is not None else None
        self._defaults: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
        self._marker_error = _marker_error(marker)   # raised by the first check, as its failure
        _refuse_hypothesis(node)

    @property
    def device(self) -> str:
        """The candidate device (``--parity-device``)."""
        return self._session.device

    @property
    def capturing(self) -> bool:
        return self._session.capturing

    def _name(self, name: str | None) -> str:
        self._count += 1
        if name is not None:
            if not isinstance(name, str) or not name.strip():
                raise InvalidArgument(f"name={name!r}: must be a non-empty string")
            return name
        base = self._default_name()
        return base if self._count == 1 else f"{base}#{self._count}"

    def _default_name(self) -> str:
        return default_name(self._node.nodeid) if self._node is not None else "check"

    def _spec(self, model: Any, name: str | None, dtypes: Sequence[str] | str | None,
              layers: Sequence[str] | str | None, tolerance: Any, drill: int | None,
              sketch: int | bool | None = None, replay_kind: str | None = None,
              ladder: bool | None = None, inputs: Any = None, golden_scale: float = 1.0) -> CheckSpec:
        if self._marker_error:
            raise InvalidArgument(self._marker_error)
        dtypes_from = "check" if dtypes is not None else "marker" if self._defaults.get("dtypes") is not None else ""
        dtypes = dtypes if dtypes is not None else self._defaults.get("dtypes")
        if dtypes is None:
            dtypes = self._session.options.dtypes or default_dtypes(model)
        if isinstance(dtypes, str):
            dtypes = [dtypes]
        rungs = list(dict.fromkeys(dt.rung_name(d) for d in dtypes))
        if ladder is None:
            ladder = self._defaults.get("ladder", self._session.options.ladder)
        if ladder and "float32" not in rungs and any(r in LOW_PRECISION for r in rungs):
            # the sentinel rung: bugs under the noise of bf16/fp16 stand out at fp32 (docs/judging.md)
            rungs.append("float32")
        if isinstance(layers, str):
            layers = [layers]
        nm = self._name(name)
        explicit = _explicit_drill(drill, self._defaults.get("drill"), self._session.options.drill)
        spec = CheckSpec(
            name=nm, test=self._node.nodeid if self._node is not None else "",
            dtypes=rungs, layers=layers if layers is not None else self._defaults.get("layers"),
            drill=explicit if explicit is not None else 0,
            tolerance=coerce(tolerance if tolerance is not None else self._defaults.get("tolerance")),
            profile=self._session.options.profile,
            sketch=sketch_group(sketch if sketch is not None else self._defaults.get("sketch")),
            report_dir=self._session.options.report_dir,
            golden_size_limit=self._session.options.golden_size_limit, dtypes_from=dtypes_from,
            replay=replay_kind_of(model, replay_kind or self._defaults.get("replay") or self._session.options.replay),
            command_flags=self._session.options.command_flags,
        )
        check_tolerance_layers(unwrap(model), list(spec.tolerance.layers))
        spec.drill = resolve_drill(model, inputs, spec, explicit, self._session.store, self._session.capturing,
                                   golden_scale)
        return spec

    @known_keywords
    def check(self, model: Any, inputs: Any, *, name: str | None = None,
              dtypes: Sequence[str] | str | None = None, layers: Sequence[str] | str | None = None,
              tolerance: Any = None, drill: int | None = None, sketch: int | bool | None = None,
              replay: str | None = None, ladder: bool | None = None) -> list[CheckResult]:
        """Capture (reference run) or judge (candidate run) ``model`` on ``inputs``, per layer and dtype.

        ``sketch=True`` (or a group size) keeps per-layer sketches instead of full tensors: well under
        1% of the golden's size, for models whose activations are too large to keep; judged on the
        propagated run only. ``replay="fast"`` is one teacher-forced run of the forward plus the deeper levels (no propagated drift);
        the default is --parity-replay, else "auto" (fast above 1B parameters). ``ladder=False``: judge only
        the dtypes asked for; by default an explicit bfloat16/float16 list keeps the float32 rung, where
        bugs below the low-precision noise show (ini ``parity_ladder``).
        """
        __tracebackhide__ = True
        with self.refusing(name, dtypes):
            require_model(model)
            require_inputs(inputs)
            vocab = getattr(getattr(unwrap(model), "config", None), "vocab_size", None)
            require_token_ids(inputs, vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None)
            spec = self._spec(model, name, dtypes, layers, tolerance, drill, sketch, replay, ladder, inputs=inputs)
        def stale(manifest: dict[str, Any]) -> None:
            # at the golden's own depth: a capture run's default depth is not the one asked of a replay
            check_stale(unwrap(model), inputs, replace(spec, drill=int(manifest.get("drill", spec.drill))), manifest,
                        str(self._session.store.manifest_path(spec.name)))
            if not hasattr(self._session.store, "url"):   # a remote store would fetch the tensors to read them
                check_inputs(inputs, spec, self._session.store, manifest)

        return self._run(spec, lambda: capture(model, inputs, spec, self._session.store, self.device,
                                               overwrite=self._session.store.exists(spec.name), env=self._session.env),
                         lambda: replay_golden(model, inputs, spec, self._session.store, self.device,
                                               env=self._session.env),
                         stale=stale)

    def check_lm(self, model: Any, input_ids: Any, **kwargs: Any) -> list[CheckResult]:
        """Per-layer parity plus perplexity, token agreement, KL and generation for a causal LM."""
        __tracebackhide__ = True
        from pytest_rocm_parity.llm.lm import check_lm

        return known_keywords(check_lm)(self, model, input_ids, **kwargs)

    @known_keywords
    def check_train(self, model: Any, inputs: Any, *, loss: Any = None, optimizer: Any = None, steps: int = 1,
                    name: str | None = None, dtypes: Sequence[str] | str | None = None,
                    layers: Sequence[str] | str | None = None, tolerance: Any = None,
                    drill: int | None = None, sketch: int | bool | None = None, clip_grad_norm: Any = None,
                    accumulate: int = 1) -> list[CheckResult]:
        """Training parity: the loss, each selected module's gradients (of its output and of its own
        parameters) and, with ``optimizer``, every parameter's update after ``steps`` steps, judged
        against a float64 truth; the culprit is the smallest module whose own backward is out of
        bounds (docs/training.md). ``loss=None``: the model's own loss (labels in ``inputs``).
        ``optimizer``: a torch.optim class, a (class, kwargs) pair, or a factory given the
        (name, parameter) pairs (parameter groups by name: no weight decay on norms and biases).
        ``clip_grad_norm``: a maximum total norm, or the script's own clipping function of the
        parameters, run before each optimizer step and judged with it. ``accumulate=k``: the inputs
        split into k micro-batches along dim 0, one forward and backward each; ``loss`` returns each
        micro-batch's share (the model's own loss is divided by k). ``sketch=True`` (or a group size)
        keeps sketches of the gradients and updates, for models whose full gradients are too large to
        keep; judged on the propagated step."""
        __tracebackhide__ = True
        from pytest_rocm_parity.runner.train import TRAIN_GOLDEN_SCALE, capture_train, replay_train

        with self.refusing(name, dtypes, "train"):
            require_model(model)
            require_trainable(model)
            require_inputs(inputs)
            spec = self._spec(model, name, dtypes, layers, tolerance, drill, sketch, inputs=inputs,
                              golden_scale=TRAIN_GOLDEN_SCALE)
        store, device, env = self._session.store, self.device, self._session.env
        return self._run(spec,
                         lambda: capture_train(model, inputs, spec, store, device, loss, optimizer, steps,
                                               overwrite=store.exists(spec.name), env=env,
                                               clip_grad_norm=clip_grad_norm, accumulate=accumulate),
                         lambda: replay_train(model, inputs, spec, store, device, loss, optimizer, steps, env=env,
                                              clip_grad_norm=clip_grad_norm, accumulate=accumulate), kind="train")

    def compare_op(self, candidate: Any, reference: Any, *args: Any, **kwargs: Any) -> Any:
        """Fuzz-friendly operator check against a float64 CPU truth (see pytest_rocm_parity.fuzz.harness)."""
        __tracebackhide__ = True
        from pytest_rocm_parity.fuzz.harness import compare_op

        kwargs.setdefault("device", self.device)
        return compare_op(candidate, reference, *args, **kwargs)

    # -- shared by check and check_lm -------------------------------------------------------
    @contextlib.contextmanager
    def refusing(self, name: Any, dtypes: Any, kind: str = "model") -> Iterator[None]:
        """A check refused over its arguments (the model, the inputs, an option) before its spec
        exists, or whose model raised while its spec was made (a sizing forward), is an error entry
        too, so that no summary or report of the run looks all-green; the error fails the test as
        it is."""
        __tracebackhide__ = True
        with clean_errors():
            try:
                yield
            except Exception as exc:
                shown = name if isinstance(name, str) and name.strip() else self._default_name()
                rungs = [dtypes] if isinstance(dtypes, str) else [d for d in dtypes or () if isinstance(d, str)]
                self._error(_Refused(shown, self._node.nodeid if self._node is not None else "", rungs), exc, kind)
                raise

    def _error(self, spec: CheckSpec | _Refused, exc: BaseException, kind: str) -> None:
        """A check without a verdict: an error entry in the session's results and its JUnit property."""
        from pytest_rocm_parity.reports.summary import error_text

        entry = self._session.add_error(spec, exc, kind)
        if self._node is not None:
            self._node.user_properties.append((f"parity[{spec.name}][{entry['dtype']}]", f"ERROR; {error_text(entry)}"))

    def _run(self, spec: CheckSpec, do_capture: Any, do_replay: Any, kind: str = "model",
             stale: Callable[[dict[str, Any]], None] | None = None) -> list[CheckResult]:
        """``stale(manifest)``: raises GoldenStale where a golden a capture run keeps no longer matches
        the check (said then, rather than only at the next replay)."""
        __tracebackhide__ = True
        s = self._session
        with clean_errors():
            try:
                s.claim(spec.name, spec.test, self._claimed)
            except ParityError as exc:
                self._error(spec, exc, kind)
                raise
        s.goldens.used.add(spec.name)
        exists = s.store.exists(spec.name)
        if s.capturing:
            if exists and not s.regen_matches(spec.name):
                try:   # the manifest, and each tensor file there at its size; replay hashes every byte
                    manifest = s.store.read_manifest(spec.name)
                    if not hasattr(s.store, "url"):   # a remote store would fetch the files to check them
                        for rung in manifest["rungs"]:
                            s.store.rung_file(spec.name, manifest, rung)
                except GoldenCorrupt as exc:
                    s.goldens.corrupt.append(spec.name)
                    s.skip_check(spec, f"golden for {spec.name!r} exists but is corrupt ({exc}); capture never "
                                       f"overwrites: replace it with {spec.regen_command}")
                    return []
                why = _stale_reason(stale, manifest)
                owner = s.other_project(manifest) if why else ""
                if owner:   # not stale: another project's model under this check's name
                    s.skip_check(spec, f"kept: {s.foreign(spec, owner, regen=False)}")
                    return []
                if why:
                    s.goldens.stale.append(spec.name)
                    s.skip_check(spec, f"kept, and no longer matches this check: {why} (capture never overwrites a "
                                       f"golden)")
                    return []
                s.goldens.kept.append(spec.name)
                s.skip_check(spec, f"golden for {spec.name!r} exists at {s.store.manifest_path(spec.name)}; capture "
                                   f"never overwrites: rewrite it with {spec.regen_command}")
                return []
            if not exists and s.options.regen not in (None, "*") and not s.regen_matches(spec.name):
                s.skip_check(spec, f"{spec.name!r} does not match --parity-regen={s.options.regen!r}")
                return []

            def refuse(exc: ParityError) -> None:
                """A refused write is a check without a verdict: listed as an error, as a failed capture is."""
                __tracebackhide__ = True
                self._error(spec, exc, kind)
                fail_once(exc)

            if not s.options.may_write():
                refuse(WriteForbidden(
                    f"refusing to write the golden for {spec.name!r} into {s.store.root} because CI=true; goldens "
                    f"are captured on the reference machine and committed. Pass --parity-allow-write to override."))
            owner = s.owner_of(spec.name) if exists and not s.options.allow_reference_change else ""
            if owner:
                refuse(ReferenceChange(s.foreign(spec, owner, regen=True), s.store.manifest_path(spec.name)))
            taken = s.taken_by(spec) if exists and not s.options.allow_reference_change else ""
            if taken:
                refuse(ReferenceChange(taken, s.store.manifest_path(spec.name)))
            change = s.reference_change(spec.name) if exists and not s.options.allow_reference_change else ""
            if change:
                refuse(ReferenceChange(change, s.store.manifest_path(spec.name)))
            try:
                with clean_errors(), checking(spec.name):
                    progress(f"capture {', '.join(spec.dtypes)} on {s.device} ...")
                    do_capture()
                    s.record_capture(spec, existed=exists)
            except GoldenExists:
                s.goldens.kept.append(spec.name)
                s.skip_check(spec, f"golden for {spec.name!r} was just captured by another worker")
                return []
            except Exception as exc:   # no golden: listed as an error, as a replay that raises is
                self._error(spec, exc, kind)
                raise
            return []
        if not exists:
            s.goldens.missing.append(spec.name)
            missing = GoldenMissing(_missing_golden(s.store, spec, capture_command(spec.test, s.options.command_flags),
                                                    s.test_defined),
                                    s.store.manifest_path(spec.name))
            self._error(spec, missing, kind)
            fail_once(missing)
        with clean_errors(), checking(spec.name):
            progress(f"replay {', '.join(spec.dtypes)} on {s.device} against {s.store.dir_for(spec.name)} ...")
            try:
                try:
                    results = do_replay()
                except GoldenCorrupt as exc:   # the store names the file; the command that replaces it, here
                    restore = "" if "git lfs pull" in str(exc) else f"; or {s.store.restore_hint(spec.name)}"
                    raise GoldenCorrupt(f"{exc}. On the reference machine: {spec.regen_command}{restore}",
                                        exc.path) from None
                except GoldenStale as exc:   # another project's golden is not stale: it was never this check's
                    owner = s.owner_of(spec.name)
                    if not owner:
                        raise
                    raise GoldenStale(s.foreign(spec, owner, regen=False), exc.path) from None
            except Exception as exc:   # no verdict: listed as an error, so no report looks all-green
                self._error(spec, exc, kind)
                raise
            for r in results:
                progress(f"{r.dtype}: verdict {'PASS' if r.passed else 'FAIL'}"
                         + (f" (culprit {r.culprit})" if not r.passed and r.culprit else ""))
        for r in results:
            r.test, r.regen = spec.test, r.regen or spec.regen_command
            s.add(r)
            if self._node is not None:  # reaches JUnit XML <properties> and CI test views
                self._node.user_properties.append((f"parity[{r.name}][{r.dtype}]", property_text(r)))
        ladder_notes(results)
        raise_if_failed(results)
        return results


@dataclass(frozen=True)
class _Refused:
    """What names a check refused before its spec was built, for its error entry."""

    name: str
    test: str
    dtypes: list[str]


MARKER_OPTIONS = ("dtypes", "layers", "tolerance", "drill", "sketch", "replay", "ladder")


def _marker_error(marker: Any) -> str:
    """What is wrong with a @pytest.mark.parity(...) ("" when nothing): a misspelt option would
    otherwise be ignored, and the check run with the defaults it was meant to change."""
    if marker is None:
        return ""
    if marker.args:
        return (f"@pytest.mark.parity takes keyword options only ({', '.join(MARKER_OPTIONS)}); got positional "
                f"{marker.args!r}")
    unknown = sorted(k for k in marker.kwargs if k not in MARKER_OPTIONS)
    if unknown:
        import difflib

        near = [difflib.get_close_matches(k, MARKER_OPTIONS, n=1) for k in unknown]
        hint = "; ".join(f"{k!r}: did you mean {m[0]!r}?" for k, m in zip(unknown, near) if m)
        return (f"@pytest.mark.parity got unknown option(s) {', '.join(map(repr, unknown))}"
                f"{' (' + hint + ')' if hint else ''}; its options are {', '.join(MARKER_OPTIONS)}")
    ladder = marker.kwargs.get("ladder")
    if ladder is not None and not isinstance(ladder, bool):
        return f"@pytest.mark.parity(ladder={ladder!r}): must be True or False"
    return ""


def _refuse_hypothesis(node: Any) -> None:
    """A Hypothesis ``@given`` test asking for the function-scoped ``parity`` fixture: name ``parity_ops``.

    Hypothesis would stop such a test with its function_scoped_fixture health check, which does not
    say what to use instead. A test that suppresses that health check explicitly is left alone.
    """
    __tracebackhide__ = True
    fn = getattr(node, "obj", None)
    if not getattr(fn, "is_hypothesis_test", False):
        return
    settings = getattr(fn, "_hypothesis_internal_use_settings", None)
    suppressed = [getattr(h, "name", str(h)) for h in (getattr(settings, "suppress_health_check", ()) or ())]
    if "function_scoped_fixture" in suppressed:
        return
    fail_once(InvalidArgument(
        f"{node.nodeid} is a Hypothesis @given test that asks for the function-scoped 'parity' fixture, which "
        f"Hypothesis refuses (one fixture value would be shared by every generated example). For operator "
        f"fuzzing use the session-scoped 'parity_ops' fixture instead: def test_op(parity_ops, x): "
        f"parity_ops.compare_op(candidate, reference, x). Model checks (parity.check) belong in plain tests."))


AUTO_DRILL_MAX_PARAMS = 1_000_000_000


def _what_failed(result: CheckResult) -> str:
    """A failing rung in a few words for another rung's note: its culprit, else its headline (the
    optimizer, the loss, KV-cache decoding, the model's outputs)."""
    if result.culprit:
        return f"culprit {result.culprit}"
    what = headline(result.extra)
    return "the model's outputs" if what == "no culprit in isolation" else what


def _stale_reason(stale: Callable[[dict[str, Any]], None] | None, manifest: dict[str, Any]) -> str:
    """Why a golden a capture run keeps no longer matches its check ('' where it does, or where
    ``stale`` is None or refuses for another reason, which the replay names itself)."""
    try:
        if stale is not None:
            stale(manifest)
    except ParityError as exc:
        return str(exc) if isinstance(exc, GoldenStale) else ""
    return ""


def replay_kind_of(model: Any, kind: Any) -> str:
    """full or fast; auto is fast above 1B parameters (the size where drill turns 0 too), else full.

    Why fast for large models: it costs one run of the forward plus the deeper levels
    (docs/performance.md), and on the fault catalogue it catches what the full replay catches
    (docs/detection.md); full adds the propagated drift and the outputs.
    """
    from pytest_rocm_parity.options import REPLAY_KINDS

    if kind not in REPLAY_KINDS:
        raise InvalidArgument(f"replay={kind!r}: allowed {' or '.join(map(repr, REPLAY_KINDS))} (full: propagated "
                              f"and isolated passes; fast: one teacher-forced run of the forward; auto: fast above 1B parameters)")
    if kind == "auto":
        return "fast" if sum(p.numel() for p in model.parameters()) > AUTO_DRILL_MAX_PARAMS else "full"
    return str(kind)


def _missing_golden(store: Any, spec: CheckSpec, capture_it: str, test_defined: Callable[[str], bool]) -> str:
    """Why the check has no golden, and the fix: the golden directory missing, a golden directory
    whose manifest is gone (its tensor files still there: restore, not recapture), or none at all."""
    no_dir = store.missing_root(capture_it)
    if no_dir:
        return f"no golden for {spec.name!r}: {no_dir}"
    left = store.no_manifest(spec.name, capture_it) if hasattr(store, "no_manifest") else ""
    if left:
        return f"no golden for {spec.name!r}: {left}"
    close = _close_goldens(store, spec.name, spec.test, test_defined)
    return (f"no golden for {spec.name!r} in {store.root}.{close} Capture it on "
            f"the reference machine and commit it: {capture_it}")


def _close_goldens(store: Any, name: str, test: str, test_defined: Callable[[str], bool]) -> str:
    """' Goldens of close names here: ...' for a name that may be a typo of goldens on disk, else '';
    with the command that copies the closest under the new name, for a check renamed on purpose.
    A golden that another test captured and still replays (``test_defined``) is that test's, not
    this check's under an old name: left out."""
    try:
        close = store.close_names(name)
    except OSError:
        return ""

    def others(c: str) -> bool:
        try:
            owner = store.read_manifest(c).get("test")
        except ParityError:
            return False
        return isinstance(owner, str) and bool(owner) and owner != test and test_defined(owner)
    close = [c for c in close if not others(c)]
    if not close:
        return ""
    copy = (f"rocm-parity golden derive {shell_quote(str(store.root))} {shell_quote(close[0])} --to "
            f"{shell_quote(name)}{' --test ' + shell_quote(test) if test else ''}")
    return (f" Goldens of close names here: {', '.join(map(repr, close))} (a changed name= ?). If the check was "
            f"renamed on purpose, its golden is copied under the new name with no GPU: {copy}.")


DEFAULT_GOLDEN_SIZE_LIMIT = 50_000_000   # bytes, for a spec without golden_size_limit (options' default)


def _explicit_drill(*choices: Any) -> int | None:
    """The first explicit drill depth (any depth >= 0; a depth below the deepest module selects all)."""
    for c in choices:
        if c is not None:
            if not isinstance(c, int) or isinstance(c, bool) or c < 0:
                raise InvalidArgument(f"drill={c!r}: expected an integer >= 0, the sub-module depth below each "
                                      f"selected block (0: blocks only); leave it out to choose the deepest "
                                      f"whose golden fits the golden-size limit")
            return c
    return None


def drill_for(model: Any, *choices: Any) -> int:
    """The first explicit drill depth, else the deepest selection (as by default_drill without inputs:
    no activation sizes, so no budget; 0 above 1B parameters, where every module's golden gets huge)."""
    from pytest_rocm_parity.runner.selection import max_drill

    c = _explicit_drill(*choices)
    if c is not None:
        return c
    n = sum(p.numel() for p in model.parameters())
    return 0 if n > AUTO_DRILL_MAX_PARAMS else max_drill(model)


def default_drill(model: Any, inputs: Any, rungs: Sequence[str], limit: int | None, sketch: int = 0,
                  scale: float = 1.0) -> int:
    """The deepest drill whose golden for ``inputs`` over ``rungs`` stays under ``limit`` bytes (None: no
    limit, every module down to the leaves).

    Why a budget and not a fixed depth: a bug is named at the smallest selected module that fails in
    isolation, so the deeper the selection the more exact the culprit (a value projection four levels
    below a T5 block); what bounds it is the golden's size, estimated from one shape-only pass
    (selection.activation_sizes, within about 15% of the file's bytes on the family matrix), times
    ``scale`` for a golden that holds more per call than a forward's (a training step's).
    """
    from pytest_rocm_parity.runner.selection import activation_sizes, deepest_drill

    acts = activation_sizes(model, inputs) if limit is not None else None
    return deepest_drill(model, acts, rungs, limit, sketch, scale)


def resolve_drill(model: Any, inputs: Any, spec: CheckSpec, explicit: int | None, store: Any,
                   capturing: bool, golden_scale: float = 1.0) -> int:
    """``explicit`` if given; with ``layers=`` globs the depth plays no part (0); on a replay the depth the
    golden was captured with (its selection is what the replay must find again); on a capture the
    deepest within the golden-size limit."""
    if explicit is not None:
        return explicit
    if spec.layers:
        return 0
    if not capturing:
        if store is not None and store.exists(spec.name):
            try:
                drill = store.read_manifest(spec.name).get("drill")
            except ParityError:   # unreadable: the replay reads it again, and reports the check as an error
                drill = None
            if isinstance(drill, int) and not isinstance(drill, bool) and drill >= 0:
                return drill
        return drill_for(model)
    if inputs is None:
        return drill_for(model)
    limit = getattr(spec, "golden_size_limit", DEFAULT_GOLDEN_SIZE_LIMIT)
    drill = default_drill(model, inputs, spec.dtypes, limit, int(spec.sketch or 0), golden_scale)
    try:
        was = store.read_manifest(spec.name).get("drill") if store is not None and store.exists(spec.name) else None
    except ParityError:
        was = None
    if isinstance(was, int) and not isinstance(was, bool) and drill < was:
        # a regeneration that judges less deep than the golden it replaces: said, not only seen in a diff
        import warnings

        warnings.warn(f"rocm-parity: {spec.name}: captured at drill {drill}, where its golden was at drill {was}: "
                      f"at drill {was} the golden would exceed the size limit ({limit / 1e6:g} MB), so a failure will "
                      f"name modules at most {drill} levels below the blocks. Keep the depth with drill={was} in the "
                      f"check (a larger golden), or raise --parity-golden-size-limit", stacklevel=2)
    return drill


class OpChecker:
    """What ``parity_ops`` gives: compare_op bound to the candidate device."""

    def __init__(self, device: str) -> None:
        self.device = device

    def compare_op(self, candidate: Any, reference: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        from pytest_rocm_parity.fuzz.harness import compare_op

        kwargs.setdefault("device", self.device)
        return compare_op(candidate, reference, *args, **kwargs)


LOW_PRECISION = ("bfloat16", "float16")


def _nonfinite_cause(rung: str, interpreted: bool) -> str:
    """Why a rung gives inf or NaN where float32 holds. float16 overflows at 65504; bfloat16 has
    float32's exponent, so what overflows it overflows float32 too, and its inf or NaN comes of lost
    precision instead."""
    if rung == "float16":
        return ("this is float16's range: values overflow to inf or NaN there (above 65504) where the truth is "
                "finite (a sum or an exponent without the max subtracted), not a changed computation")
    return ((f"this comes of the Triton interpreter's {rung} arithmetic (above) or of {rung}'s precision, "
             if interpreted else f"this is {rung}'s precision, ")
            + f"not its range (it has float32's): a value rounded to zero or to another's value is then divided "
              f"by or taken the log of (an epsilon below its spacing, a difference of near-equal values), not a "
              f"changed computation")


def ladder_notes(results: list[CheckResult]) -> None:
    """Say, on each failing low-precision rung, what the float32 rung found: a bug of the function
    (float32 fails too) or of precision only (float32 holds)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if interpreted:
        from pytest_rocm_parity.fuzz.harness import INTERPRETER_BF16

        for r in results:
            if r.dtype == "bfloat16" and not r.passed:
                r.notes.append(f"{INTERPRETER_BF16} (docs/migrations.md)")
    by = {r.dtype: r for r in results}
    f32 = by.get("float32")
    if f32 is None:
        return
    for r in results:
        if r.dtype not in LOW_PRECISION:
            continue
        if not r.passed and f32.passed:
            overflow = any(m is not None and m.nonfinite for l in [*r.layers, *r.outputs] if not l.passed
                           for m in (l.iso, l.prop))
            r.notes.append(f"less accurate at {r.dtype}, same function at float32: the float32 rung passed, so "
                           + (_nonfinite_cause(r.dtype, interpreted and r.dtype == "bfloat16") if overflow else
                              "this is a precision difference (accumulation, rounding), not a changed computation"))
        elif not r.passed and not f32.passed:
            r.extra["changed_at_float32"] = True
            r.notes.append(f"the float32 rung fails too ({_what_failed(f32)}): the computation "
                           f"itself changed, not only its precision")
        elif r.passed and not f32.passed:
            seen = next((l for l in r.layers if l.name == f32.culprit and l.iso is not None
                         and l.iso.ratio > l.budget), None)
            if seen is not None and seen.iso is not None:
                # over budget but not surely so: the error sits on a few blocks, not below the noise
                why = (f"at {r.dtype} {seen.name}'s isolated error was {seen.iso.ratio:.3g}x the reference's, over "
                       f"its {seen.budget:g}x budget, but its bound over the tensor's blocks ({seen.iso.ratio_lo:.3g}x) "
                       f"was within it, so it passed there: an error on a few rows or tokens")
            else:
                why = f"a change below the noise of {r.dtype}"
            r.notes.append(f"found at float32 only ({_what_failed(f32)}): {why}")
            f32.notes.append(f"the {r.dtype} rung passed: " + (
                "its error there sat on a few rows or tokens, within the bound; " if seen is not None else
                f"this change is below the noise of {r.dtype} arithmetic; ") +
                             f"the float32 rung of the precision ladder found it: a changed computation, or a part of it "
                             f"run below float32 (a float16 or bfloat16 accumulation or intermediate)")
