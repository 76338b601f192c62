"""The one command: `rocm-parity ops` (through run_ops, as cli.py dispatches it)."""
from __future__ import annotations

import argparse
import json

import pytest

from pytest_rocm_parity.fuzz import opsuite
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


def test_dtype_aliases_are_the_checks_own(capsys):
    """--dtypes takes the aliases parity.check and --parity-dtypes take."""
    assert opsuite.run_ops(parse("--device", "cpu", "--max-examples", "2", "--ops", "rms_norm", "--dtypes",
                                 "bf16,fp16", "--json")) == 0
    assert [r["dtype"] for r in json.loads(capsys.readouterr().out)["ops"]] == ["bfloat16", "float16"]


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
    # a pair the folder holds no golden of is fuzzed only, and its row says so
    assert opsuite.run_ops(parse("--device", "cpu", "--max-examples", "2", "--ops", "rms_norm", "--dtypes",
                                 "float16,float32", "--replay", str(golden_dir))) == 0
    rows = {l.split()[1]: l for l in capsys.readouterr().out.splitlines() if l.startswith("rms_norm")}
    assert rows["float16"].endswith("replayed 3") and rows["float32"].endswith("no golden to replay"), rows
    # a mistyped folder, or one without the goldens asked for, replays nothing: a usage error, not a pass
    assert opsuite.main(["--device", "cpu", "--ops", "rms_norm", "--dtypes", "float16", "--replay",
                         str(tmp_path / "goldenz")]) == 2
    assert "--replay " + str(tmp_path / "goldenz") + ": no such directory" in capsys.readouterr().err
    # one golden file instead of its folder: said so, with the folder to pass
    golden_file = golden_dir / "rms_norm-float16.json"
    assert opsuite.main(["--device", "cpu", "--ops", "rms_norm", "--dtypes", "float16", "--replay",
                         str(golden_file)]) == 2
    err = capsys.readouterr().err
    assert f"--replay {golden_file}: a file, not a directory" in err and f"here {golden_dir}" in err, err
    with pytest.raises(InvalidArgument, match=r"no operator golden for the ops and dtypes asked \(softmax x float16\); "
                                              r"it holds rms_norm-float16"):
        opsuite.run_ops(parse("--device", "cpu", "--ops", "softmax", "--dtypes", "float16", "--replay", str(golden_dir)))


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
    # the row gives the reported example's ratio and counts the examples drawn, not shrinking's runs
    row = next(l for l in out.splitlines() if l.startswith("silu"))
    drawn, ratio = int(row.split("examples")[1].split()[0]), row.split("worst err/tol")[1].split()[0]
    assert 1 <= drawn <= 10 and ratio != "-" and float(ratio) > 1
    shown = float(out.split("Greatest error/tolerance: ")[1].split()[0])
    assert float(ratio) == pytest.approx(shown, rel=0.01)


def test_log_softmax_of_a_cancelling_sum_passes_torch_itself():
    """x = [-4, 0]: log(1 + e^-4) rounds the sum at 1, an absolute error of one unit roundoff, four ulps
    of the -0.018 it returns: the suite's bound counts it, so torch's own log_softmax passes; a 0.1%
    error still fails."""
    import dataclasses
    import warnings

    import torch

    from pytest_rocm_parity.fuzz.harness import check_op

    spec = opsuite.builtin_ops()["log_softmax"]
    with warnings.catch_warnings():   # .example() outside @given: wanted here only for the case's magnitude
        warnings.simplefilter("ignore")
        drawn = spec.strategy(torch.float32).example()
    case = dataclasses.replace(drawn, args=(torch.tensor([[-4.0, 0.0]]),), kwargs={"dim": -1}, reduction_length=2)
    assert check_op(torch.log_softmax, torch.log_softmax, case, device="cpu").passed
    assert not check_op(lambda x, dim: torch.log_softmax(x, dim) * 1.001, torch.log_softmax, case, device="cpu").passed


def test_a_device_error_reports_the_first_failing_example_unshrunk():
    """A CUDA/HIP error poisons the context: every later example fails too, so shrinking would walk to
    the simplest input (seen on the H200 with SDPA: 'misaligned address', shrunk to all-zero tensors).
    The report must name the example that triggered it."""
    import torch

    spec = opsuite.builtin_ops()["silu"]
    state = {"poisoned": False, "trigger": None}

    def flaky_backend(x):
        if not state["poisoned"] and x.numel() > 1 and float(x.abs().max()) > 1.0:
            state["poisoned"], state["trigger"] = True, x.clone()
        if state["poisoned"]:
            raise RuntimeError("CUDA error: misaligned address")
        return torch.nn.functional.silu(x)

    bad = opsuite.OpSpec("silu", spec.strategy, flaky_backend, spec.reference, spec.doc)
    report = opsuite.fuzz_one(bad, "float32", "cpu", max_examples=40, seed=0)
    assert report.status == "error"
    assert "first failing example, not shrunk" in report.message
    assert "misaligned address" in report.message
    trigger = state["trigger"]
    assert trigger is not None
    # the reported inputs are the triggering example's (its shape), not a shrunk trivial one
    assert f"float32[{', '.join(str(d) for d in trigger.shape)}]" in report.message


def test_sticky_device_errors_are_recognised():
    assert opsuite.sticky_device_error("AcceleratorError: CUDA error: misaligned address")
    assert opsuite.sticky_device_error("RuntimeError: HIP error: invalid device function")
    assert not opsuite.sticky_device_error("RuntimeError: shape mismatch")
