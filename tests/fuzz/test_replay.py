"""Golden record/replay: same inputs on both machines, safetensors + JSON, never pickle."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from pytest_rocm_parity.fuzz import strategies as S
from pytest_rocm_parity.errors import GoldenCorrupt, GoldenExists, GoldenMissing, GoldenStale, GoldenTooNew
from pytest_rocm_parity.fuzz.harness import load_golden, record_golden, replay_golden

STRATEGY = S.rms_norm_args(st.just(torch.float16), max_side=48)


@pytest.fixture
def golden(tmp_path):
    return record_golden(tmp_path / "rms", F.rms_norm, F.rms_norm, STRATEGY, max_examples=8, seed=3, device="cpu")


def test_record_writes_safetensors_and_a_json_manifest(golden, tmp_path):
    assert golden.name == "rms.json" and (tmp_path / "rms.safetensors").exists()
    manifest = json.loads(golden.read_text())
    assert manifest["format"] == 1 and len(manifest["examples"]) == 8
    assert manifest["environment"]["torch"] == torch.__version__
    assert not list(tmp_path.glob("*.pt")) and not list(tmp_path.glob("*.pkl"))


def test_replay_uses_exactly_the_recorded_inputs_including_views(golden):
    first = load_golden(golden)
    second = load_golden(golden)
    for a, b in zip(first.examples, second.examples):
        assert torch.equal(a.args[0], b.args[0]) and a.args[0].stride() == b.args[0].stride()
    layouts = {(ex.args[0].is_contiguous(), ex.args[0].storage_offset() > 0) for ex in first.examples}
    assert len(layouts) >= 2  # views are stored as storage + strides, not densified
    results = replay_golden(golden, F.rms_norm, device="cpu")
    assert len(results) == 8 and all(r.passed for r in results)
    assert results[0].reference_error.startswith("reference device worst err/tol")


def test_replay_catches_a_buggy_candidate(golden):
    def bad(x, shape, w, eps):
        return F.rms_norm(x, shape, w, eps) * 1.01

    results = replay_golden(golden, bad, device="cpu")
    assert not all(r.passed for r in results)
    failing = next(i for i, r in enumerate(results) if not r.passed)
    msg = results[failing].message()
    assert "golden" in msg and f".examples[{failing}].compare(candidate" in msg
    # the tolerance is said as judged: the golden's recorded scale, not a rule of the live comparison
    assert "* scale (per element, recorded with the golden)" in msg and "max(|truth|, rms(truth))" not in msg
    with pytest.raises(AssertionError):
        load_golden(golden).examples[failing].compare(bad, device="cpu")


def test_missing_stale_corrupt_and_existing_goldens(golden, tmp_path):
    with pytest.raises(GoldenMissing, match="record_golden"):
        load_golden(tmp_path / "nope")
    with pytest.raises(GoldenExists):
        record_golden(tmp_path / "rms", F.rms_norm, F.rms_norm, STRATEGY, max_examples=1, device="cpu")
    tensors = tmp_path / "rms.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 0xFF
    tensors.write_bytes(bytes(data))
    with pytest.raises(GoldenCorrupt, match="checksum"):
        load_golden(golden)
    manifest = json.loads(golden.read_text())
    manifest["format"] = 99
    golden.write_text(json.dumps(manifest))
    with pytest.raises(GoldenTooNew, match="upgrade"):
        load_golden(golden)
    manifest["format"] = 0
    golden.write_text(json.dumps(manifest))
    with pytest.raises(GoldenStale, match="re-record"):
        load_golden(golden)


def test_a_floating_output_of_integer_inputs_is_described_alike_live_and_from_a_golden(tmp_path):
    """Both routes judge it in its own precision, and both messages say so (the golden's said
    "exact equality" while it judged with a tolerance)."""
    def third(t: torch.Tensor) -> torch.Tensor:
        return t.float() / 3

    ints = st.builds(lambda n: torch.arange(n), st.integers(4, 16))
    golden = record_golden(tmp_path / "third", third, third, ints, max_examples=2, seed=1, device="cpu")
    for result in replay_golden(golden, lambda t: third(t) * 1.01, device="cpu"):
        assert not result.passed and "exact equality" not in result.message(), result.message()
        assert "ulp_float32" in result.model, result.model
