"""The training fault catalogue (train_catalogue.py): every seeded backward or optimizer bug is
caught with its culprit, and no correct alternate fails, at the bf16 and fp16 requests (each with
the float32 rung of the ladder), with full goldens and with sketch goldens (backward bugs only).
docs/training.md has the tables."""
from __future__ import annotations

import tempfile
from typing import Any

import pytest

import train_catalogue as C
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.selection import select
from pytest_rocm_parity.runner.train import capture_train, replay_train


@pytest.fixture(scope="module", params=[(ladder, sketch) for ladder in sorted(C.LADDERS) for sketch in (0, 64)],
                ids=lambda p: f"{p[0]}{'-sketch' if p[1] else ''}")
def goldens(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    ladder, sketch = request.param
    out = {}
    for family in ("decoder", "encoder"):
        spec = CheckSpec(name=family, dtypes=C.LADDERS[ladder], drill=2, sketch=sketch)
        store = GoldenStore(tempfile.mkdtemp())
        inputs = C.decoder_inputs() if family == "decoder" else C.encoder_inputs()
        loss = None if family == "decoder" else C.encoder_loss
        model = C.decoder() if family == "decoder" else C.encoder()
        capture_train(model, inputs, spec, store, "cpu", loss=loss, optimizer=C.ADAMW)
        out[family] = (store, spec, inputs, loss)
    return f"{ladder}{'-sketch' if sketch else ''}", out


def _expected(model: Any, module: str) -> str:
    names = [s.name for s in select(model, None, 2)]
    return max((n for n in names if module == n or module.startswith(n + ".")), key=len)


def test_the_catalogue(goldens: tuple[str, dict[str, Any]]) -> None:
    ladder, stores = goldens
    sketched = ladder.endswith("-sketch")   # a sketch golden judges no optimizer step (docs/training.md)
    caught, alarms = [], []
    bugs = [c for c in C.CASES if c.bug and not (sketched and c.module is None)]
    for case in C.CASES:
        if sketched and case.bug and case.module is None:
            continue
        store, spec, inputs, loss = stores[case.family]
        model = C.build(case)
        results = replay_train(model, inputs, spec, store, "cpu", loss=loss, optimizer=case.optimizer)
        if not case.bug:
            if not all(r.passed for r in results):
                alarms.append((case.id, [(r.dtype, r.culprit, r.notes[-1:]) for r in results]))
            continue
        failing = [r for r in results if not r.passed]
        if case.module is None:   # an optimizer bug: no model culprit, an optimizer finding
            ok = bool(failing) and all(r.culprit is None and r.extra.get("optimizer") for r in failing) and any(
                "optimizer's update is out of bounds" in n for r in failing for n in r.notes)
        else:
            want = _expected(model, case.module)
            ok = bool(failing) and all(r.culprit == want for r in failing)
        if ok:
            caught.append(case.id)
    assert not alarms, alarms
    assert len(caught) >= 0.9 * len(bugs), (ladder, sorted({c.id for c in bugs} - set(caught)))
    assert len(caught) == len(bugs), (ladder, sorted({c.id for c in bugs} - set(caught)))
