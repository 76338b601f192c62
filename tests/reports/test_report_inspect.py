"""``rocm-parity show`` and ``rocm-parity diff`` on real goldens."""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import parity_models

from pytest_rocm_parity.reports import inspect_cmd
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.errors import ParityError
from pytest_rocm_parity.golden.store import GoldenStore
from manifest_edits import rewrite_manifest


@pytest.fixture(scope="module")
def goldens(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A, A again (same numerics), and B whose reference rounds blocks.2 through half precision."""
    root = tmp_path_factory.mktemp("inspect")
    out = {}
    for label, bug in (("a", None), ("a2", None), ("b", 2)):
        m, x = parity_models.block_stack(bug)
        store = GoldenStore(root / label)
        capture(m, x, CheckSpec(name="tiny", dtypes=["float32"]), store, "cpu")
        out[label] = store.dir_for("tiny")
    return out


def _parse(add: Any, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(argv)


def test_show_text(goldens: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect_cmd.run_show(_parse(inspect_cmd.add_show_arguments, [str(goldens["a"])])) == 0
    out = capsys.readouterr().out
    for needle in ("golden    tiny", "format    1", "created   ", "fingerprint structure=", "dtypes    float32",
                   "reference backend=cpu", "[float32] float32-", "rms(ref)", "max|ref-truth|/max|truth|"):
        assert needle in out, needle
    row = next(l for l in out.splitlines() if l.strip().startswith("blocks.2.fc1 "))
    assert "16x64" in row and "F32" in row and "4.1 KB" in row   # 4096 bytes, as capture counts sizes


def test_show_json_accepts_manifest_path(goldens: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(inspect_cmd.add_show_arguments, [str(goldens["a"] / "manifest.json"), "--json"])
    assert inspect_cmd.run_show(args) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["name"] == "tiny" and info["format"] == 1 and info["dtypes"] == ["float32"]
    assert set(info["fingerprint"]) == {"structure", "weights", "weights_of", "tensors", "dtypes", "weight_digests"} and info["reference_env"]["backend"] == "cpu"
    rows = {r["layer"]: r for r in info["rungs"]["float32"]["layers"]}
    assert set(rows) >= {"inp", "blocks.0", "blocks.2.fc2", "head", "<output>"}
    r = rows["blocks.0.fc1"]
    assert r["shape"] == [16, 64] and r["dtype"] == "F32" and r["bytes"] == 16 * 64 * 4
    assert r["rms"] > 0.1 and 0 < r["max_rel_err"] < 1e-5  # fp32 rounding against the float64 truth


def test_show_no_stats_reads_no_tensor_data(goldens: dict[str, Path]) -> None:
    info = inspect_cmd.show_golden(goldens["a"], stats=False)
    assert all("rms" not in r for r in info["rungs"]["float32"]["layers"])


def test_show_and_diff_take_rung_aliases_and_name_a_tensor_file_given_for_a_golden(goldens: dict[str, Path]) -> None:
    assert list(inspect_cmd.show_golden(goldens["a"], ["fp32"], stats=False)["rungs"]) == ["float32"]
    assert list(inspect_cmd.diff_goldens(goldens["a"], goldens["a2"], ["fp32"])["rungs"]) == ["float32"]
    tensors = next(goldens["a"].glob("*.safetensors"))
    with pytest.raises(ParityError, match=r"a golden's tensor file, not the golden; name its directory \(.*\) or its "
                                          r"manifest.json"):
        inspect_cmd.show_golden(tensors)


def test_diff_identical_goldens_agree(goldens: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(inspect_cmd.add_diff_arguments, [str(goldens["a"]), str(goldens["a2"])])
    assert inspect_cmd.run_diff(args) == 0
    assert "goldens agree" in capsys.readouterr().out


def test_diff_flags_the_changed_layer(goldens: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(inspect_cmd.add_diff_arguments, [str(goldens["a"]), str(goldens["b"]), "--json"])
    assert inspect_cmd.run_diff(args) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["differs"] is True
    rows = {r["layer"]: r for r in res["rungs"]["float32"]["layers"]}
    assert rows["blocks.2"]["differs"] and rows["blocks.2"]["rel_l2"] > 1e-6
    assert rows["blocks.2"]["err_b"] > 10 * rows["blocks.2"]["err_a"]  # B's own error against its truth
    assert "B's error against its truth" in rows["blocks.2"]["why"]
    assert not rows["blocks.0"]["differs"] and rows["blocks.0"]["rel_l2"] == 0.0
    # a tight threshold flags the drift downstream too; loose ones and no error ratio accept it
    tight = inspect_cmd.diff_goldens(goldens["a"], goldens["b"], threshold=1e-7)
    assert {r["layer"] for r in tight["rungs"]["float32"]["layers"] if r["differs"]} >= {"blocks.2", "blocks.3", "<output>"}
    args = _parse(inspect_cmd.add_diff_arguments,
                  [str(goldens["a"]), str(goldens["b"]), "--threshold", "1", "--error-ratio", "0"])
    assert inspect_cmd.run_diff(args) == 0


def test_diff_names_where_the_references_compute_different_functions(tmp_path: Path) -> None:
    """An exact GELU against its tanh form in one block: 3e-5 apart in float32, far under any fixed
    threshold, yet the goldens' float64 truths part there, and inside the block the activation's own
    truth parts on the same inputs; at bf16 the change is under the rounding."""
    import torch

    m, x = parity_models.block_stack()
    capture(m, x, CheckSpec(name="tiny", dtypes=["float32", "bfloat16"]), GoldenStore(tmp_path / "exact"), "cpu")
    m.blocks[2].act = torch.nn.GELU(approximate="tanh")
    capture(m, x, CheckSpec(name="tiny", dtypes=["float32", "bfloat16"]), GoldenStore(tmp_path / "tanh"), "cpu")
    res = inspect_cmd.diff_goldens(tmp_path / "exact" / "tiny", tmp_path / "tanh" / "tiny")
    assert res["differs"] and not res["warnings"]   # same weights and structure: only the function changed
    fp32 = res["rungs"]["float32"]
    assert fp32["first_function_change"] == "blocks.2.act"
    rows = {r["layer"]: r for r in fp32["layers"]}
    assert "it computes another function" in rows["blocks.2.act"]["why"]
    assert not any(rows[k]["differs"] for k in ("blocks.2.fc1", "blocks.2.fc2"))   # fc2 only gets other inputs
    assert rows["blocks.2"]["rel_l2"] < 1e-4 and "compute different functions" in rows["blocks.2"]["why"]
    assert not rows["blocks.1"]["differs"] and rows["blocks.1"]["truths_x"] == 0.0
    assert res["rungs"]["bfloat16"]["n_differ"] == 0 and res["rungs"]["bfloat16"]["first_function_change"] is None
    text = "\n".join(inspect_cmd.format_diff(res))
    assert "the references first compute different functions at blocks.2.act" in text
    # with --all, a row after the change reads as inheriting it, not as "ok"; one before it is ok
    lines = {l.split()[0]: l for l in inspect_cmd.format_diff(res, show_all=True) if l.startswith("  blocks.")}
    assert lines["blocks.2.fc2"].endswith("inherits the difference (other inputs in each golden)"), lines
    assert lines["blocks.1"].endswith(" ok") and lines["blocks.1.fc2"].endswith(" ok"), lines
    parted = [r["truths_x"] for r in fp32["layers"] if (r.get("truths_x") or 0) > inspect_cmd.TRUTHS_FACTOR]
    print(f"exact against tanh GELU at float32: blocks.2 {rows['blocks.2']['rel_l2']:.2g} apart, truths "
          f"{min(parted):.3g}-{max(parted):.3g}x the goldens' errors")


def test_diff_of_cuda_and_cpu_goldens_of_one_model_agrees(tmp_path: Path) -> None:
    """The example model's H200 golden against the same check captured here: correct backends, one
    function, so nothing differs at either rung (a fixed threshold of 1e-3 would flag every bf16 block)."""
    import torch
    from bytellama import eval_batch, load_bytellama

    h200 = Path(__file__).resolve().parents[2] / "conftest_examples" / "goldens" / "bytellama-blocks"
    store = GoldenStore(tmp_path)
    capture(load_bytellama(dtype=torch.float32), {"input_ids": eval_batch(batch=2, seq=96), "use_cache": False},
            CheckSpec(name="bytellama-blocks", dtypes=["bfloat16", "float32"], drill=0), store, "cpu")
    res = inspect_cmd.diff_goldens(h200, store.dir_for("bytellama-blocks"))
    assert not res["differs"], inspect_cmd.format_diff(res, show_all=True)
    for rung in ("bfloat16", "float32"):
        rows = res["rungs"][rung]["layers"]
        assert max(r.get("truths_x") or 0.0 for r in rows) < 1.0
        assert max(r["rel_l2"] for r in rows) > 1e-7   # the backends did round differently
        print(f"H200 against CPU, {rung}: at most {max(r['rel_l2'] for r in rows):.2g} apart, truths at most {max(r.get('truths_x') or 0.0 for r in rows):.2g}x the scale "
              f"they are judged against, {max(r.get('truths_rel_l2') or 0.0 for r in rows):.2g} of their RMS")
    assert res["rungs"]["bfloat16"]["max_rel_l2"] > inspect_cmd.DEFAULT_THRESHOLD
    # no changed model is claimed (a golden older than the fingerprint's parameter list cannot tell)
    assert not any(w.startswith("model fingerprints differ") for w in res["warnings"])
    assert not any(w.startswith("model inputs differ") for w in res["warnings"])


@pytest.mark.parametrize("change, warned", [
    ({"weights": "0" * 16}, "model fingerprints differ (weights)"),
    ({"tensors": "inp.weight:(1, 1)"}, "model fingerprints differ (parameter names or shapes)"),
    ({"structure": "0" * 16}, None),   # module classes renamed: the same parameters, judged by their numbers
    ({"structure": "0" * 16, "tensors": None, "weights_of": None}, "recorded by different versions"),
])
def test_diff_says_what_the_fingerprints_show_changed(goldens: dict[str, Path], tmp_path: Path,
                                                      change: dict[str, Any], warned: str | None) -> None:
    other = tmp_path / "tiny"
    shutil.copytree(goldens["a2"], other)
    manifest = json.loads((other / "manifest.json").read_text())
    fp = manifest["fingerprint"]
    for k, v in change.items():
        if v is None:
            fp.pop(k)
        else:
            fp[k] = v
    rewrite_manifest(other / "manifest.json", manifest)
    warnings = inspect_cmd.diff_goldens(goldens["a"], other)["warnings"]
    assert [w for w in warnings if warned in w] if warned else not warnings, warnings


def test_diff_warns_when_the_goldens_ran_on_other_inputs(goldens: dict[str, Path], tmp_path: Path) -> None:
    m, x = parity_models.block_stack()
    store = GoldenStore(tmp_path)
    capture(m, x * 2, CheckSpec(name="tiny", dtypes=["float32"]), store, "cpu")
    res = inspect_cmd.diff_goldens(goldens["a"], store.dir_for("tiny"))
    assert [w for w in res["warnings"] if w.startswith("model inputs differ (input/args.0)")]
    assert not [w for w in inspect_cmd.diff_goldens(goldens["a"], goldens["b"])["warnings"] if "inputs" in w]


def test_diff_against_a_derived_golden_compares_the_layers_both_hold(goldens: dict[str, Path], tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A golden derived at a shallower drill holds fewer layers: those are listed, not differences."""
    from pytest_rocm_parity.golden.derive import derive

    src = GoldenStore(goldens["a"].parent)
    derive(src, "tiny", GoldenStore(tmp_path), "tiny", ["float32"], drill=0)
    args = _parse(inspect_cmd.add_diff_arguments, [str(goldens["a"]), str(tmp_path / "tiny"), "--all"])
    assert inspect_cmd.run_diff(args) == 0
    out = capsys.readouterr().out
    assert "in one golden only, not compared" in out and "goldens agree" in out
    assert any(l.rstrip().endswith("only in A") for l in out.splitlines())


def test_diff_of_goldens_with_no_layer_in_common_differs(goldens: dict[str, Path], tmp_path: Path) -> None:
    import torch

    store = GoldenStore(tmp_path)
    torch.manual_seed(0)
    other = torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
    capture(other, parity_models.block_stack()[1], CheckSpec(name="other", dtypes=["float32"]), store, "cpu")
    res = inspect_cmd.diff_goldens(goldens["a"], store.dir_for("other"))
    assert res["differs"] and any("no layer in common" in w for w in res["warnings"])


def test_diff_of_one_model_on_inputs_of_other_shapes_says_so(goldens: dict[str, Path], tmp_path: Path) -> None:
    """The same layers, every one of another shape (more tokens): not 'no layer in common', which
    would send the user looking for another model."""
    import torch

    store = GoldenStore(tmp_path)
    m, _ = parity_models.block_stack()
    capture(m, torch.randn(24, 32, generator=torch.Generator().manual_seed(0)), CheckSpec(name="longer",
                                                                                       dtypes=["float32"]), store, "cpu")
    res = inspect_cmd.diff_goldens(goldens["a"], store.dir_for("longer"))
    assert res["differs"] and not any("no layer in common" in w for w in res["warnings"]), res["warnings"]
    assert any("no layer with the same shape" in w and "(16, 32) vs (24, 32)" in w for w in res["warnings"]), \
        res["warnings"]


def test_diff_text_names_the_layer(goldens: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    inspect_cmd.run_diff(_parse(inspect_cmd.add_diff_arguments, [str(goldens["a"]), str(goldens["b"])]))
    out = capsys.readouterr().out
    row = next(l for l in out.splitlines() if l.strip().startswith("blocks.2 "))
    assert "DIFF" in row and "goldens DIFFER" in out


def test_missing_golden_is_a_parity_error(tmp_path: Path) -> None:
    with pytest.raises(ParityError, match="no golden here"):
        inspect_cmd.show_golden(tmp_path)
    with pytest.raises(ParityError, match="no such file or directory; name a golden's directory"):
        inspect_cmd.show_golden(tmp_path / "absent")


def test_cli_dispatch(goldens: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_rocm_parity import cli

    assert cli.main(["show", str(goldens["a"]), "--no-stats"]) == 0
    assert cli.main(["diff", str(goldens["a"]), str(goldens["b"])]) == 1
    capsys.readouterr()
    assert cli.main(["show", str(tmp_path)]) == 2
    assert "no golden here" in capsys.readouterr().err
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_show_says_what_a_quantized_golden_holds() -> None:
    """The example suite's FP8 golden (captured on the H200): its modules' format and activation
    scheme, whether codes and scales are stored, and the recorded activation-quantization noise."""
    from pathlib import Path

    from pytest_rocm_parity.reports.inspect_cmd import format_show, show_golden

    golden = Path(__file__).resolve().parents[2] / "conftest_examples" / "goldens" / "bytellama-fp8"
    text = "\n".join(format_show(show_golden(golden, ["bfloat16"], stats=False)))
    assert "quantized: 28 modules (28 x float8_e4m3fn activation=token), codes and scales stored" in text
    assert "activation-quantization noise recorded for" in text


def test_diff_compares_each_goldens_error_at_its_own_scale(tmp_path: Path) -> None:
    """A norm's eps changed in the second layer: the modules after it get inputs of another size, and
    their raw errors scale with them; relative to their truths the two goldens round alike, so only
    where the references part is flagged, not the next module as 'less accurate'."""
    from parity_models import llama, tokens

    spec = CheckSpec(name="m", dtypes=["bfloat16"])
    x = tokens(batch=2, seq=32)
    capture(llama(), x, spec, GoldenStore(tmp_path / "a"), "cpu")
    changed = llama()
    changed.model.layers[1].post_attention_layernorm.variance_epsilon = 1e-2
    capture(changed, x, spec, GoldenStore(tmp_path / "b"), "cpu")
    res = inspect_cmd.diff_goldens(tmp_path / "a" / "m", tmp_path / "b" / "m")
    rows = {r["layer"]: r for r in res["rungs"]["bfloat16"]["layers"]}
    assert res["rungs"]["bfloat16"]["first_function_change"] == "model.layers.1.post_attention_layernorm"
    assert not any("error against its truth" in r["why"] for r in rows.values()), \
        {k: r["why"] for k, r in rows.items() if r["why"]}
    assert 0.8 < rows["model.layers.1.mlp"]["err_ratio"] < 1.25
