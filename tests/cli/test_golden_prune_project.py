"""`rocm-parity golden prune` runs the suite of the project its goldens' manifests record: from a
folder above it, not every test below that folder under other ids (a collection error in another
project, a 'test file is gone' line per golden); a --rootdir naming another folder is refused."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = '''
import torch
from torch import nn

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))

def make_inputs():
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
'''

TEST = '''
from conftest import make_model, make_inputs

def test_{fn}(parity):
    parity.check(make_model(), make_inputs(), name="{name}", dtypes=["float32"])
'''


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    env.pop("CI", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(cwd, "-c", "import sys; from pytest_rocm_parity.cli import main; sys.exit(main())", *args)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tmp_path/suite: a project with goldens alpha (now obsolete: its check was renamed alpha2) and
    beta; tmp_path/other: a folder whose test file does not import. Shared by the tests here, whose
    prunes are dry runs (each asserts the goldens are all still there): its captures are most of
    their time."""
    tmp_path = tmp_path_factory.mktemp("prune-project")
    suite = tmp_path / "suite"
    (suite / "tests").mkdir(parents=True)
    (suite / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "tests" / "test_a.py").write_text(TEST.format(fn="a", name="alpha"))
    (suite / "tests" / "test_b.py").write_text(TEST.format(fn="b", name="beta"))
    capture = ("-m", "pytest", "-p", "no:cacheprovider", "-q", "--rocm-parity", "--parity-mode=capture")
    assert _run(suite, *capture).returncode == 0
    (suite / "tests" / "test_a.py").write_text(TEST.format(fn="a", name="alpha2"))
    assert _run(suite, *capture).returncode == 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "test_broken.py").write_text("import no_such_module_here\n")
    return tmp_path


def _goldens(workspace: Path) -> set[str]:
    return {d.name for d in (workspace / "suite" / "goldens").iterdir()}


def test_prune_from_the_folder_above_runs_the_project_of_the_goldens(workspace: Path) -> None:
    proc = _cli(workspace, "golden", "prune", "--dry-run", "suite/goldens", "--", "-p", "no:cacheprovider")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"rocm-parity golden prune: running in {workspace / 'suite'}, the project these goldens record" in out
    assert "ERROR collecting" not in out and "rocm-parity: kept " not in out, out
    assert f"rocm-parity: would delete {workspace / 'suite' / 'goldens' / 'alpha' / 'manifest.json'}" in out, out
    assert _goldens(workspace) == {"alpha", "alpha2", "beta"}


def test_prune_with_a_rootdir_of_another_folder_is_refused(workspace: Path) -> None:
    proc = _cli(workspace, "golden", "prune", "--dry-run", "suite/goldens", "--",
                f"--rootdir={workspace}", "suite/tests")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "running" not in proc.stdout, proc.stdout   # no run of the suite at all
    assert (f"its goldens record the project at {workspace / 'suite'}" in proc.stderr
            and f"--rootdir={workspace} names another folder" in proc.stderr
            and f"cd {workspace / 'suite'} && rocm-parity golden prune goldens" in proc.stderr), proc.stderr
    assert _goldens(workspace) == {"alpha", "alpha2", "beta"}


def test_prune_given_test_paths_leaves_the_rootdir_to_pytest(workspace: Path) -> None:
    """Test paths inside the project: pytest finds its pytest.ini from them, the rootdir is right."""
    proc = _cli(workspace, "golden", "prune", "--dry-run", "suite/goldens", "--", "-p", "no:cacheprovider",
                "suite/tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "running in" not in proc.stdout and "rocm-parity: kept " not in proc.stdout, proc.stdout
    assert f"would delete {workspace / 'suite' / 'goldens' / 'alpha' / 'manifest.json'}" in proc.stdout, proc.stdout
