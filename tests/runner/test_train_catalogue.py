"""The training fault catalogue (train_catalogue.py): every seeded backward, optimizer or loss-scaling
bug is caught with its verdict, and no correct alternate fails, at the bf16 and fp16 requests (each
with the float32 rung of the ladder), with full goldens and with sketch goldens (the cases a
propagated step can judge). docs/training.md has the tables."""
from __future__ import annotations

import tempfile
from typing import Any

import pytest

import train_catalogue as C
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.selection import select
from pytest_rocm_parity.runner.train import capture_train, replay_train


class Goldens:
    """One request's goldens, captured once per (family, reference step) on first use."""

    def __init__(self, ladder: str, sketch: int) -> None:
        self.ladder, self.sketch = ladder, sketch
        self.stores: dict[tuple[str, str], tuple[GoldenStore, CheckSpec, Any, Any]] = {}

    def get(self, family: str, reference: str) -> tuple[GoldenStore, CheckSpec, Any, Any]:
        if (family, reference) not in self.stores:
            ref = C.REFERENCES[reference]
            spec = CheckSpec(name=family, dtypes=C.LADDERS[self.ladder], drill=2, sketch=self.sketch)
            store = GoldenStore(tempfile.mkdtemp())
            inputs = C.decoder_inputs() if family == "decoder" else C.encoder_inputs()
            loss = ref.loss or (None if family == "decoder" else C.encoder_loss)
            model = C.decoder() if family == "decoder" else C.encoder()
            capture_train(model, inputs, spec, store, "cpu", loss=loss, optimizer=ref.optimizer,
                          clip_grad_norm=ref.clip_grad_norm, accumulate=ref.accumulate)
            self.stores[family, reference] = (store, spec, inputs, loss)
        return self.stores[family, reference]


@pytest.fixture(scope="module", params=[(ladder, sketch) for ladder in sorted(C.LADDERS) for sketch in (0, 64)],
                ids=lambda p: f"{p[0]}{'-sketch' if p[1] else ''}")
def goldens(request: pytest.FixtureRequest) -> Goldens:
    return Goldens(*request.param)


def _expected(model: Any, module: str) -> str:
    names = [s.name for s in select(model, None, 2)]
    return max((n for n in names if module == n or module.startswith(n + ".")), key=len)


def _verdict_ok(case: C.Case, model: Any, results: list[CheckResult]) -> bool:
    """The failing rungs say what the case expects, and at least one rung fails."""
    failing = [r for r in results if not r.passed]
    if not failing:
        return False
    if case.expect == "optimizer":   # no model culprit, an optimizer finding, no loss-factor finding
        return all(r.culprit is None and r.extra.get("optimizer") and "loss_factor" not in r.extra
                   and any("optimizer's update" in n and "out of bounds" in n for n in r.notes) for r in failing)
    if case.expect == "loss_factor":   # no module blamed, the optimizer passes, the factor named in words
        return all(r.culprit is None and abs(r.extra.get("loss_factor", 0) - C.ACCUMULATE) < 0.05
                   and all(r.extra.get("optimizer", {}).values())
                   and any("the loss or its scaling" in n for n in r.notes) for r in failing)
    assert case.module is not None
    return all(r.culprit == _expected(model, case.module) for r in failing)


def test_the_catalogue(goldens: Goldens) -> None:
    sketched = bool(goldens.sketch)   # a sketch golden judges no optimizer step (docs/training.md)
    cases = [c for c in C.CASES if not (sketched and c.optimizer_only)]
    caught, alarms = [], []
    for case in cases:
        store, spec, inputs, loss = goldens.get(case.family, case.reference)
        model = C.build(case)
        ref = C.REFERENCES[case.reference]
        results = replay_train(model, inputs, spec, store, "cpu", loss=case.loss or loss, optimizer=case.optimizer,
                               clip_grad_norm=case.clip_grad_norm, accumulate=ref.accumulate)
        if not case.bug:
            if not all(r.passed for r in results):
                alarms.append((case.id, [(r.dtype, r.culprit, r.notes[-1:]) for r in results]))
        elif _verdict_ok(case, model, results):
            caught.append(case.id)
    bugs = {c.id for c in cases if c.bug}
    label = f"{goldens.ladder}{'-sketch' if sketched else ''}"
    assert not alarms, (label, alarms)
    assert len(caught) >= 0.9 * len(bugs), (label, sorted(bugs - set(caught)))
    assert len(caught) == len(bugs), (label, sorted(bugs - set(caught)))
    assert len(bugs) >= (6 if sketched else 12) and len(cases) - len(bugs) >= 6
