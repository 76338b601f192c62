"""A derived golden equals, tensor for tensor, a capture made directly with those settings."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from parity_models import MlpBlock
from pytest_rocm_parity.golden.derive import derive
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import GoldenStore
from manifest_edits import rewrite_manifest


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), *[MlpBlock(16) for _ in range(3)], nn.Linear(16, 4))


def _by_layer(store: GoldenStore, name: str, dtype: str) -> dict[str, torch.Tensor]:
    m = store.read_manifest(name)
    meta = m["rungs"][dtype]
    r = RungReader(store.rung_file(name, m, dtype), "cpu")
    out = {f"out:{e['key']}:{p}": r.get(k) for e in meta["layers"] for p, k in e["out"].items()}
    out.update({f"in:{e['key']}:{p}": r.get(k) for e in meta["layers"] for p, k in e["in"].items()})
    out.update({k: r.get(k) for k in r.keys if not k.startswith("t/")})
    return out


def test_derived_equals_direct_capture(tmp_path: Path) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    store = GoldenStore(tmp_path)
    capture(_model(), x, CheckSpec(name="full", dtypes=["bfloat16", "float32"], drill=2), store, "cpu", env={})
    capture(_model(), x, CheckSpec(name="direct", dtypes=["float32"], drill=0), store, "cpu", env={})
    derive(store, "full", store, "derived", ["float32"], 0)
    a, b = _by_layer(store, "derived", "float32"), _by_layer(store, "direct", "float32")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert store.read_manifest("derived")["layers"] == store.read_manifest("direct")["layers"]
    # the same file, byte for byte, as a capture of that name at that depth: a later regeneration of
    # the derived golden rewrites nothing
    again = GoldenStore(tmp_path / "again")
    capture(_model(), x, CheckSpec(name="derived", dtypes=["float32"], drill=0), again, "cpu", env={})
    derived, captured = (s.read_manifest("derived")["rungs"]["float32"] for s in (store, again))
    assert derived == captured
    (res,) = replay(_model(), x, CheckSpec(name="derived", dtypes=["float32"], drill=0), store, "cpu", env={})
    assert res.passed and len(res.layers) == 5


def test_derive_refuses_what_the_golden_lacks(tmp_path: Path) -> None:
    x = torch.randn(4, 8)
    store = GoldenStore(tmp_path)
    capture(_model(), x, CheckSpec(name="g", dtypes=["float32"], drill=0), store, "cpu", env={})
    with pytest.raises(InvalidArgument, match="float16"):
        derive(store, "g", store, "h", ["float16"], 0)
    with pytest.raises(InvalidArgument, match="drill=1"):
        derive(store, "g", store, "h", ["float32"], 1)


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_derive_never_replaces_a_golden_unasked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Another golden of the target name, or the source itself, stays as it was; the command line
    says why in one line with exit status 2; --force replaces the target, never the source."""
    from pytest_rocm_parity.cli import main as cli_main
    from pytest_rocm_parity.golden.derive import main as module_main

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    store = GoldenStore(tmp_path)
    capture(_model(), x, CheckSpec(name="full", dtypes=["bfloat16", "float32"], drill=2), store, "cpu", env={})
    capture(_model(), x, CheckSpec(name="other", dtypes=["bfloat16", "float32"], drill=2), store, "cpu", env={})
    before = _snapshot(tmp_path)
    for argv, says in [
        (["--to", "other"], "a golden 'other' exists; derive never replaces one unasked"),
        (["--to", "full"], "that is the golden derived from"),
        (["--to", "x", "--drill", "-1"], "expected an integer >= 0"),
        (["--to", "x", "--dtypes", "float64"], "not a rung"),
        (["--to", "x", "--dtypes", "float16"], "golden 'full' holds bfloat16, float32"),
    ]:
        argv = [str(tmp_path), "full", "--drill", "0", *argv] if "--drill" not in argv else [str(tmp_path), "full", *argv]
        assert cli_main(["golden", "derive", *argv]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert _snapshot(tmp_path) == before
    assert module_main([str(tmp_path), "full", "--to", "other", "--drill", "0", "--dtypes", "float32",
                        "--force"]) == 0
    assert store.read_manifest("other")["drill"] == 0 and list(store.read_manifest("other")["rungs"]) == ["float32"]
    assert {k: v for k, v in _snapshot(tmp_path).items() if k.startswith("full/")} == \
        {k: v for k, v in before.items() if k.startswith("full/")}


def test_derive_keeps_the_sources_depth_unless_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fewer rungs alone need no --drill; the CLI says whether an owning test was recorded."""
    from pytest_rocm_parity.cli import main as cli_main

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    store = GoldenStore(tmp_path)
    capture(_model(), x, CheckSpec(name="full", dtypes=["bfloat16", "float32"], drill=2), store, "cpu", env={})
    assert cli_main(["golden", "derive", str(tmp_path), "full", "--to", "fp32", "--dtypes", "float32"]) == 0
    assert "no owning test recorded" in capsys.readouterr().out
    m = store.read_manifest("fp32")
    assert m["drill"] == 2 and list(m["rungs"]) == ["float32"] and m["test"] is None
    assert m["layers"] == store.read_manifest("full")["layers"]


def test_prune_refuses_a_directory_that_holds_no_golden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pointed at a source tree, prune runs no test suite: it says the directory holds no golden."""
    from pytest_rocm_parity.cli import main as cli_main

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "kernel.cu").write_text("__global__ void k() {}\n")
    assert cli_main(["golden", "prune", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert "holds no golden" in out.err and "running" not in out.out


@pytest.mark.parametrize(("to", "says"), [
    ("", "--to '': the derived golden needs a name"),
    ("   ", "--to '   ': the derived golden needs a name"),
    ("../escape", "--to '../escape': a golden's name is not a path"),
    ("sub/name", "(e.g. --to name)"),
    ("..", "--to '..': a golden's name is not a path"),
])
def test_derive_refuses_a_blank_or_path_name(tmp_path: Path, capsys: pytest.CaptureFixture[str], to: str,
                                             says: str) -> None:
    from pytest_rocm_parity.cli import main as cli_main

    store = GoldenStore(tmp_path / "goldens")
    capture(_model(), torch.randn(4, 8), CheckSpec(name="g", dtypes=["float32"], drill=0), store, "cpu", env={})
    before = _snapshot(tmp_path)
    assert cli_main(["golden", "derive", str(tmp_path / "goldens"), "g", "--to", to]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert _snapshot(tmp_path) == before
    with pytest.raises(InvalidArgument, match="not a path"):
        derive(store, "g", store, "../x", ["float32"], 0)


def test_derive_from_a_golden_directory_gives_the_corrected_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_rocm_parity.cli import main as cli_main

    store = GoldenStore(tmp_path / "goldens")
    capture(_model(), torch.randn(4, 8), CheckSpec(name="tiny-llama", dtypes=["float32"], drill=0), store, "cpu", env={})
    monkeypatch.chdir(tmp_path)
    assert cli_main(["golden", "derive", "goldens/tiny-llama", "tiny-llama", "--to", "slim", "--drill", "0"]) == 2
    err = capsys.readouterr().err
    assert "goldens/tiny-llama is the directory of the golden 'tiny-llama' (it holds manifest.json)" in err, err
    assert "rocm-parity golden derive goldens tiny-llama --to slim --drill 0" in err, err
    assert cli_main(["golden", "derive", "goldens", "tiny-llama", "--to", "slim", "--drill", "0"]) == 0


def test_a_golden_derived_into_another_folder_keeps_its_project(tmp_path: Path) -> None:
    """The project is the rootdir relative to the golden folder (prune tells this project's goldens
    by it): derived into another folder, it is said from there."""
    import json

    from pytest_rocm_parity.golden.store import PROJECT_KEY

    src, dst = GoldenStore(tmp_path / "proj" / "goldens"), GoldenStore(tmp_path / "shared" / "goldens")
    capture(_model(), torch.randn(4, 8), CheckSpec(name="full", dtypes=["float32"], drill=1), src, "cpu", env={})
    manifest = src.read_manifest("full")
    manifest[PROJECT_KEY] = ".."
    rewrite_manifest(src.manifest_path("full"), manifest)
    derive(src, "full", dst, "slim", ["float32"], 0)
    assert dst.read_manifest("slim")[PROJECT_KEY] == "../../proj"
    derive(src, "full", src, "slim", ["float32"], 0)
    assert src.read_manifest("slim")[PROJECT_KEY] == ".."


def test_derive_takes_a_goldens_folder_name_and_names_close_checks_otherwise(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A default check name (test_x.py::test_m) lives in a folder named after it with a hash: derive
    takes that folder's name, as `ls goldens` shows it, for the check; a name of neither kind is
    refused with the close check names."""
    from pytest_rocm_parity.cli import main as cli_main

    store = GoldenStore(tmp_path / "goldens")
    capture(_model(), torch.randn(4, 8), CheckSpec(name="test_x.py::test_m", dtypes=["float32"], drill=1), store,
            "cpu", env={})
    folder = store.dir_for("test_x.py::test_m").name
    assert folder != "test_x.py::test_m"
    monkeypatch.chdir(tmp_path)
    assert cli_main(["golden", "derive", "goldens", folder, "--to", "slim", "--drill", "0"]) == 0
    assert store.read_manifest("slim")["drill"] == 0
    assert cli_main(["golden", "derive", "goldens", "test_x.py::test_mm", "--to", "slim2"]) == 2
    err = capsys.readouterr().err
    assert "no golden named 'test_x.py::test_mm'" in err and "did you mean 'test_x.py::test_m'" in err, err


class _Skipping(nn.Module):
    """A block holding a module its forward never calls (as BERT's attention dropout under SDPA): a
    capture selects it all the same."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.unused = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _skipping_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), _Skipping(), _Skipping(), nn.Linear(16, 4))


def _files(d: Path) -> dict[str, bytes]:
    """A golden directory's files, its manifest less the keys every capture changes (VOLATILE_KEYS)."""
    import json

    from pytest_rocm_parity.golden.store import VOLATILE_KEYS

    out = {p.name: p.read_bytes() for p in d.iterdir()}
    m = json.loads(out.pop("manifest.json"))
    out["manifest.json"] = json.dumps({k: v for k, v in m.items() if k not in VOLATILE_KEYS},
                                      indent=1, sort_keys=True).encode()
    return out


@pytest.mark.parametrize("drill", [None, 1])
def test_derived_golden_is_byte_for_byte_a_capture_with_never_called_modules(tmp_path: Path, drill: int | None) -> None:
    """Selected modules the forward never calls stay in the derived rung's ``selected``, as a capture
    records them: the derived directory is the one a capture writes, and regenerating it rewrites nothing."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    store, direct = GoldenStore(tmp_path / "derived"), GoldenStore(tmp_path / "direct")
    capture(_skipping_model(), x, CheckSpec(name="full", dtypes=["bfloat16", "float32"], drill=2), store, "cpu", env={})
    derive(store, "full", store, "b", ["float32"], drill, test="test_x.py::test_b")
    spec = CheckSpec(name="b", dtypes=["float32"], drill=2 if drill is None else drill, test="test_x.py::test_b")
    capture(_skipping_model(), x, spec, direct, "cpu", env={})
    assert "1.unused" in store.read_manifest("b")["rungs"]["float32"]["selected"]
    assert _files(store.dir_for("b")) == _files(direct.dir_for("b"))
    capture(_skipping_model(), x, spec, store, "cpu", overwrite=True, env={})
    assert "b" in store.unchanged
