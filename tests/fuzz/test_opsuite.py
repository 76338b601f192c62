"""The one command: `rocm-parity ops` (through run_ops, as cli.py dispatches it)."""
from __future__ import annotations

import argparse
import json

import pytest

from pytest_rocm_parity import opsuite
from pytest_rocm_parity.errors import InvalidArgument


def parse(*argv):
    parser = argparse.ArgumentParser()
    opsuite.add_ops_arguments(parser)
    return parser.parse_args(list(argv))


def test_suite_has_at_least_fifteen_operators():
    ops = opsuite.builtin_ops()
    assert len(ops) >= 15 and tuple(ops) == opsuite.OP_NAMES


def test_json_run_passes_on_cpu(capsys):
    rc = opsuite.run_ops(parse("--device", "cpu", "--max-examples", "3", "--ops", "matmul,softmax,embedding",
                               "--dtypes", "float16", "--json"))
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert [r["op"] for r in doc["ops"]] == ["matmul", "softmax", "embedding"]
    assert all(r["status"] == "pass" and r["examples"] == 3 for r in doc["ops"])


def test_every_builtin_op_runs_on_cpu(capsys):
    rc = opsuite.run_ops(parse("--device", "cpu", "--max-examples", "2", "--dtypes", "bfloat16"))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"{len(opsuite.OP_NAMES)} passed, 0 failed on cpu" in out


def test_record_then_replay(tmp_path, capsys):
    golden_dir = tmp_path / "goldens"
    assert opsuite.run_ops(parse("--device", "cpu", "--max-examples", "3", "--ops", "rms_norm", "--dtypes",
                                 "float16", "--record", str(golden_dir))) == 0
    assert (golden_dir / "rms_norm-float16.json").exists()
    capsys.readouterr()
    assert opsuite.run_ops(parse("--device", "cpu", "--max-examples", "2", "--ops", "rms_norm", "--dtypes",
                                 "float16", "--replay", str(golden_dir), "--json")) == 0
    assert json.loads(capsys.readouterr().out)["ops"][0]["replayed"] == 3


def test_unknown_op_is_a_usage_error_with_a_hint():
    with pytest.raises(InvalidArgument, match="Did you mean 'softmax'"):
        opsuite.run_ops(parse("--ops", "sofmax"))
    assert opsuite.main(["--ops", "sofmax"]) == 2


def test_failures_are_reported_with_exit_status_one(monkeypatch, capsys):
    import torch

    real = opsuite.builtin_ops

    def broken_ops():
        ops = real()
        spec = ops["silu"]
        ops["silu"] = opsuite.OpSpec("silu", spec.strategy, lambda x: torch.nn.functional.silu(x) * 1.1,
                                     spec.reference, spec.doc)
        return ops

    monkeypatch.setattr(opsuite, "builtin_ops", broken_ops)
    rc = opsuite.run_ops(parse("--device", "cpu", "--max-examples", "10", "--ops", "silu", "--dtypes", "float32"))
    out = capsys.readouterr().out
    assert rc == 1 and "silu         float32   FAIL" in out and "Reproduce:" in out
