"""A forward that calls a deep copy of a selected module (one folded on the fly): the copy carries
the hooks, and the check judges around it instead of failing on a module it does not know."""
from __future__ import annotations

from pathlib import Path

from parity_models import block_stack
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.assertion import message
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay


def test_copies_made_in_the_forward_capture_and_replay(tmp_path: Path) -> None:
    store, spec = GoldenStore(tmp_path), CheckSpec(name="copies", dtypes=["float32"])
    m, x = block_stack()
    m.copies = True
    capture(m, x, spec, store, "cpu")
    (res,) = replay(m, x, spec, store, "cpu")
    assert res.passed, res.notes


def test_a_bug_in_a_copy_fails_the_outputs_it_changes(tmp_path: Path) -> None:
    store, spec = GoldenStore(tmp_path), CheckSpec(name="copies", dtypes=["float32"])
    m, x = block_stack()
    capture(m, x, spec, store, "cpu")
    m.copies = True
    m.blocks[2].bug = True   # the copy inherits it
    (res,) = replay(m, x, spec, store, "cpu")
    assert not res.passed
    assert {l.name for l in res.layers if not l.passed or not l.prop_passed} >= {"norm", "head"}
    assert all(l.not_called for l in res.layers if l.name.startswith("blocks."))
    # located between the last module judged and the first divergent, the uncalled blocks named
    text = message(res)
    assert ("the fault lies between inp (last agreeing) and norm (first divergent), where the candidate called "
            "none of the selected modules blocks.0, blocks.1, blocks.2, blocks.3") in text, text
