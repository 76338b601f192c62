"""show and diff on goldens whose manifest and tensors disagree: the plugin's own error, naming the golden."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from pytest_rocm_parity.cli import main
from pytest_rocm_parity.errors import GoldenError
from pytest_rocm_parity.reports.inspect_cmd import diff_goldens, show_golden
from manifest_edits import rewrite_manifest


def _reshaped_truths(src: Path, dst: Path) -> Path:
    """A copy of the golden with every stored truth flattened: a valid file whose shapes disagree."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for rung, meta in manifest["rungs"].items():
        f = dst / meta["file"]
        tensors = load_file(str(f))
        changed = {k: (v.reshape(-1)[:-1].contiguous() if "truth" in k and v.numel() > 1 else v) for k, v in tensors.items()}
        assert changed.keys() == tensors.keys() and any("truth" in k for k in tensors)
        save_file(changed, str(f))
        data = f.read_bytes()
        meta["sha256"], meta["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    rewrite_manifest(dst / "manifest.json", manifest)
    return dst


def test_shape_inconsistent_golden_raises_golden_errors(parity_results: dict[str, Any], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    good = parity_results["root"] / "goldens" / "tiny"
    bad = _reshaped_truths(good, tmp_path / "bad")
    with pytest.raises(GoldenError) as exc:
        show_golden(bad)
    assert str(bad) in str(exc.value) and "recapture" in str(exc.value)
    with pytest.raises(GoldenError):
        diff_goldens(good, bad)
    assert main(["show", str(bad)]) == 2 and main(["diff", str(good), str(bad)]) == 2
    out, err = capsys.readouterr()
    assert "UNREADABLE: GoldenCorrupt: " in out   # show: the manifest, each rung with its error
    assert err.count("error:") == 1 and "Traceback" not in err


def test_show_on_the_golden_folder_names_the_goldens_inside(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`rocm-parity show goldens` (the --parity-golden-dir folder) says which goldens it holds."""
    import torch

    from pytest_rocm_parity.errors import ParityError
    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.reports.inspect_cmd import show_golden
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec

    torch.manual_seed(0)
    capture(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)), torch.randn(2, 4),
            CheckSpec(name="two-linears", dtypes=["float32"]), GoldenStore(tmp_path), "cpu")
    with pytest.raises(ParityError, match="folder of goldens.*two-linears"):
        show_golden(str(tmp_path), None, stats=False)


def test_show_names_the_unreadable_rung_and_shows_the_others(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged float32 file says nothing about the bf16 one beside it: `show` prints the readable
    rung, names the other with its error and exits 2."""
    import torch

    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec

    torch.manual_seed(0)
    store = GoldenStore(tmp_path)
    capture(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)), torch.randn(4, 8),
            CheckSpec(name="two", dtypes=["bfloat16", "float32"]), store, "cpu")
    manifest = store.read_manifest("two")
    damaged = store.dir_for("two") / manifest["rungs"]["float32"]["file"]
    damaged.write_bytes(damaged.read_bytes()[:200])
    assert main(["show", str(store.dir_for("two"))]) == 2
    out = capsys.readouterr().out
    assert "[bfloat16] " in out and "rms(ref)" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("[float32]")]
    assert "UNREADABLE: GoldenCorrupt: " in line and str(damaged) in line
    assert main(["show", str(store.dir_for("two")), "--dtype", "float32"]) == 2   # nothing readable: still listed
    out = capsys.readouterr().out
    assert "golden    two" in out and "[bfloat16]" not in out and "[float32] " in out and "UNREADABLE" in out


@pytest.mark.parametrize("flags", [[], ["--no-stats"], ["--json"]])
def test_show_of_a_one_rung_golden_whose_file_is_truncated_prints_its_manifest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    """docs/reports.md: the manifest, and the damaged rung listed UNREADABLE with its error; exit 2.
    --no-stats reads the file's header, which a truncated file has no more than its data."""
    import torch

    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec

    torch.manual_seed(0)
    store = GoldenStore(tmp_path)
    capture(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)), torch.randn(4, 8),
            CheckSpec(name="one", dtypes=["float32"]), store, "cpu")
    damaged = store.dir_for("one") / store.read_manifest("one")["rungs"]["float32"]["file"]
    damaged.write_bytes(damaged.read_bytes()[:len(damaged.read_bytes()) // 2])
    assert main(["show", str(store.dir_for("one")), *flags]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "error:" not in err
    if flags == ["--json"]:
        doc = json.loads(out)
        assert doc["name"] == "one" and doc["dtypes"] == ["float32"]
        assert str(damaged) in doc["rungs"]["float32"]["error"] and "truncated" in doc["rungs"]["float32"]["error"]
        return
    assert "golden    one" in out and "fingerprint structure=" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("[float32]")]
    assert "UNREADABLE: GoldenCorrupt: " in line and str(damaged) in line and "truncated" in line


def _two_goldens(root: Path) -> None:
    import torch

    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec

    torch.manual_seed(0)
    for name in ("test_mlp.py::test_mlp_renamed", "two-linears"):
        capture(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)), torch.randn(2, 4),
                CheckSpec(name=name, dtypes=["float32"]), GoldenStore(root), "cpu")


def test_show_takes_a_check_name_in_the_golden_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`show goldens/test_mlp.py::test_mlp_renamed` names the check, whose directory is test_mlp.py_..-<hash>."""
    _two_goldens(tmp_path / "goldens")
    assert main(["show", str(tmp_path / "goldens" / "test_mlp.py::test_mlp_renamed"), "--no-stats"]) == 0
    assert "test_mlp.py::test_mlp_renamed  (" in capsys.readouterr().out
    assert main(["show", str(tmp_path / "goldens" / "test_mlp.py::test_mlp_renamd"), "--no-stats"]) == 2
    err = capsys.readouterr().err
    assert "no golden in" in err and "has the check name 'test_mlp.py::test_mlp_renamd'" in err, err
    assert "Did you mean 'test_mlp.py::test_mlp_renamed': rocm-parity show " in err and "_renamed-" in err, err
    assert "'two-linears'" in err


def test_show_of_a_file_that_is_no_manifest_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert main(["show", str(tmp_path / "pyproject.toml")]) == 2
    err = capsys.readouterr().err
    assert "pyproject.toml: not a golden directory or manifest" in err and "recapture" not in err, err


def test_prune_of_a_file_says_it_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _two_goldens(tmp_path / "goldens")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert main(["golden", "prune", str(tmp_path / "pyproject.toml")]) == 2
    assert "pyproject.toml: a file, not a directory" in capsys.readouterr().err
    manifest = next((tmp_path / "goldens").glob("two-linears*/manifest.json"))
    assert main(["golden", "prune", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert "a file, not a directory" in err and f"rocm-parity golden prune {tmp_path / 'goldens'}" in err, err
