"""Faults while writing a golden lose nothing. Disk full, permission denied, a killed
process, KeyboardInterrupt and concurrent writers all leave the previous golden whole and loadable,
and the ones that are errors are a GoldenWriteError naming the directory and the fix."""
from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_rocm_parity.golden import store as golden_mod
from pytest_rocm_parity.errors import GoldenExists, GoldenMissing, GoldenWriteError
from pytest_rocm_parity.golden.store import MANIFEST, GoldenStore
from parity_models import tiny, tiny_inputs
from reliability_helpers import Golden, make_golden
from pytest_rocm_parity.runner.replay import replay

HERE = Path(__file__).parent


def assert_intact(g: Golden, before: dict[str, bytes]) -> None:
    """The golden directory holds exactly the previous files, and the previous model still replays."""
    assert g.snapshot() == before
    assert not [p for p in g.dir.iterdir() if p.name.startswith(".tmp-")]
    assert g.replay()[0].passed


def _enospc(*_: Any, **__: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# -- disk full / permission denied -----------------------------------------------------------------

def test_disk_full_when_committing_the_manifest(golden: Golden, monkeypatch: pytest.MonkeyPatch) -> None:
    before = golden.snapshot()
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if str(dst).endswith(MANIFEST):
            _enospc()
        real(src, dst)

    monkeypatch.setattr(golden_mod.os, "replace", replace)
    with pytest.raises(GoldenWriteError, match="No space left on device") as info:
        golden.capture(tiny(seed=1))
    monkeypatch.undo()
    msg = str(info.value)
    assert str(golden.dir) in msg and "previous golden, if any, is intact" in msg and "Free disk space" in msg
    assert isinstance(info.value, OSError)
    assert_intact(golden, before)


def test_disk_full_inside_safetensors(golden: Golden, monkeypatch: pytest.MonkeyPatch) -> None:
    """safetensors reports I/O errors as SafetensorError, not OSError: still a GoldenWriteError."""
    from safetensors import SafetensorError
    import safetensors.torch

    before = golden.snapshot()

    def save_file(tensors: Any, path: str, metadata: Any = None) -> None:
        Path(path).write_bytes(b"\0" * 100)   # a partial file, then the device fills up
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    with pytest.raises(GoldenWriteError, match="No space left on device"):
        golden.capture(tiny(seed=1))
    monkeypatch.undo()
    assert_intact(golden, before)


def test_second_rung_fails_first_rung_file_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = make_golden(tmp_path, dtypes=("bfloat16", "float32"))
    before = g.snapshot()
    real = golden_mod.write_tensors_tmp
    calls = []

    def write(d: Path, tensors: Any, metadata: Any) -> Path:
        calls.append(metadata["dtype"])
        if len(calls) == 2:
            _enospc()
        return real(d, tensors, metadata)

    monkeypatch.setattr(golden_mod, "write_tensors_tmp", write)
    with pytest.raises(GoldenWriteError):
        g.capture(tiny(seed=1))
    monkeypatch.undo()
    assert_intact(g, before)


def test_real_write_error_from_the_file_system(golden: Golden) -> None:
    """A real EFBIG from the kernel (RLIMIT_FSIZE in a forked child): no simulation involved."""
    before = golden.snapshot()

    def body() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        try:
            golden.capture(tiny(seed=1))
        except GoldenWriteError as exc:
            os._exit(3 if "File too large" in str(exc) and str(golden.dir) in str(exc) else 4)

    assert _forked(body) == 3
    assert_intact(golden, before)


def test_permission_denied(golden: Golden, monkeypatch: pytest.MonkeyPatch) -> None:
    before = golden.snapshot()

    def mkstemp(*_: Any, **__: Any) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    with pytest.raises(GoldenWriteError, match="Permission denied") as info:
        golden.capture(tiny(seed=1))
    monkeypatch.undo()
    assert "fix permissions on" in str(info.value) and str(golden.dir) in str(info.value)
    assert_intact(golden, before)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores file modes")
def test_permission_denied_by_the_file_system(golden: Golden) -> None:
    before = golden.snapshot()
    golden.dir.chmod(0o555)
    try:
        with pytest.raises(GoldenWriteError, match="Permission denied"):
            golden.capture(tiny(seed=1))
    finally:
        golden.dir.chmod(0o755)
    assert_intact(golden, before)


def test_failed_first_capture_leaves_no_golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(golden_mod, "_atomic_write_text", _enospc)
    with pytest.raises(GoldenWriteError):
        make_golden(tmp_path)
    store = GoldenStore(tmp_path / "goldens")
    assert not store.exists("tiny") and list(store.names_on_disk()) == []
    assert [p.name for p in store.dir_for("tiny").iterdir()] == []


# -- KeyboardInterrupt -----------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["_atomic_write_text", "file_digests"])
def test_keyboard_interrupt_is_not_swallowed(golden: Golden, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    before = golden.snapshot()

    def interrupt(*_: Any, **__: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(golden_mod, where, interrupt)
    with pytest.raises(KeyboardInterrupt):
        golden.capture(tiny(seed=1))
    monkeypatch.undo()
    assert_intact(golden, before)


# -- a process killed mid-write --------------------------------------------------------------------

def _forked(body: Any) -> int:
    """Run ``body`` in a forked child (torch already imported); its exit code, or -signal if killed."""
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    pid = os.fork()
    if pid == 0:   # the child never returns into pytest
        code = 1
        try:
            import torch

            torch.set_num_threads(1)
            body()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _kill_before_manifest_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The new tensor file is complete and renamed into place; the manifest is not yet committed."""
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if str(dst).endswith(MANIFEST):
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)

    monkeypatch.setattr(golden_mod.os, "replace", replace)


def _kill_mid_tensor_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half of the tensor file is on disk under its temporary name."""
    import safetensors.torch as st

    def save_file(tensors: Any, path: str, metadata: Any = None) -> None:
        data = st.save(tensors, metadata=metadata)
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(st, "save_file", save_file)


KILL_AT = {"before-manifest-commit": _kill_before_manifest_commit, "mid-tensor-write": _kill_mid_tensor_write}


@pytest.mark.parametrize("where", list(KILL_AT))
def test_sigkill_mid_write_keeps_previous_golden(golden: Golden, where: str) -> None:
    before = golden.snapshot()

    def body() -> None:
        with pytest.MonkeyPatch.context() as mp:
            KILL_AT[where](mp)
            golden.capture(tiny(seed=1))

    assert _forked(body) == -signal.SIGKILL
    leftovers = sorted(set(p.name for p in golden.dir.iterdir()) - set(before))
    assert leftovers, "the child died before writing anything: the test proves nothing"
    assert all(p.startswith(".tmp-") or p.endswith(".safetensors") for p in leftovers)
    assert golden.dir.joinpath(MANIFEST).read_bytes() == before[MANIFEST]
    assert golden.replay()[0].passed          # the old golden is whole and still the one in force
    golden.capture(tiny(seed=2))               # the next capture sweeps the dead writer's files
    names = {p.name for p in golden.dir.iterdir()}
    assert names == {MANIFEST, golden.tensor_file().name}


def test_sigkill_during_first_capture_leaves_no_golden(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "goldens")
    g = Golden(store, make_golden(tmp_path / "x").spec, tiny(), make_golden(tmp_path / "y").x)

    def body() -> None:
        with pytest.MonkeyPatch.context() as mp:
            _kill_before_manifest_commit(mp)
            g.capture(tiny(seed=1), overwrite=False)

    assert _forked(body) == -signal.SIGKILL
    assert list(store.dir_for("tiny").iterdir()), "the child died before writing anything"
    assert not store.exists("tiny") and list(store.names_on_disk()) == []
    with pytest.raises(GoldenMissing):
        store.read_manifest("tiny")


def _child(g: Golden, body: str) -> str:
    """Run ``body`` in a fresh interpreter with ``g`` (a Golden of the same store) and ``tiny`` bound."""
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from parity_models import tiny, tiny_inputs
        from reliability_helpers import Golden, GoldenStore, CheckSpec
        g = Golden(GoldenStore(Path(sys.argv[1])), CheckSpec(name=sys.argv[2], dtypes=["float32"]), tiny(), tiny_inputs())
    """) + body
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script, str(g.store.root), g.spec.name],
                          capture_output=True, text=True, env=env, timeout=120)
    return f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"


# -- concurrent writers ----------------------------------------------------------------------------

def _writer(root: str, seed: int, rounds: int, barrier: Any, errors: Any) -> None:
    from reliability_helpers import CheckSpec
    from pytest_rocm_parity.runner.capture import capture

    spec = CheckSpec(name="shared", dtypes=["float32"])
    barrier.wait()
    for _ in range(rounds):
        try:
            capture(tiny(seed=seed), tiny_inputs(), spec, GoldenStore(root), "cpu", overwrite=True, env={})
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            errors.put(f"{seed}: {type(exc).__name__}: {exc}")


def test_a_staged_golden_survives_another_writers_commit(tmp_path: Path) -> None:
    """A capture holds its tensor files staged while its test runs; another writer of the same golden
    commits meanwhile and collects the files no manifest names: the staged ones are left alone, so
    the later commit names files that are there, and its golden replays its own model."""
    from reliability_helpers import CheckSpec
    from pytest_rocm_parity.runner.capture import capture

    class Staging(GoldenStore):   # capture's write, held at the stage
        def write(self, name: str, manifest: dict[str, Any], rungs: dict[str, Any], overwrite: bool) -> Path:
            self.held = self.stage(name, manifest, rungs, overwrite)
            return self.dir_for(name) / MANIFEST

    root = tmp_path / "goldens"
    spec = CheckSpec(name="shared", dtypes=["float32"])
    staging = Staging(root)
    capture(tiny(seed=1), tiny_inputs(), spec, staging, "cpu", overwrite=True, env={})
    capture(tiny(seed=2), tiny_inputs(), spec, GoldenStore(root), "cpu", overwrite=True, env={})
    staging.commit(staging.held)
    store = GoldenStore(root)
    m = store.read_manifest("shared")
    assert {p.name for p in store.dir_for("shared").iterdir()} == {MANIFEST, m["rungs"]["float32"]["file"]}
    assert all(r.passed for r in replay(tiny(seed=1), tiny_inputs(), spec, store, "cpu", env={}))


def test_concurrent_writers_of_one_golden(tmp_path: Path) -> None:
    """Three processes rewrite the same golden with different models at once: every write succeeds,
    the survivor is whole (its tensor file is the one its manifest names) and replays its own model."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs fork")
    ctx = multiprocessing.get_context("fork")
    root = str(tmp_path / "goldens")
    seeds = [1, 2, 3]
    barrier, errors = ctx.Barrier(len(seeds)), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(root, s, 6, barrier, errors)) for s in seeds]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    errs = []
    while not errors.empty():
        errs.append(errors.get())
    assert not errs, errs
    store = GoldenStore(root)
    m = store.read_manifest("shared")
    d = store.dir_for("shared")
    assert {p.name for p in d.iterdir()} == {MANIFEST, m["rungs"]["float32"]["file"]}
    from reliability_helpers import CheckSpec
    from pytest_rocm_parity.runner.engine import fingerprint

    winner = next(s for s in seeds if fingerprint(tiny(seed=s)) == m["fingerprint"])
    g = Golden(store, CheckSpec(name="shared", dtypes=["float32"]), tiny(seed=winner), tiny_inputs())
    assert g.replay()[0].passed


XDIST_TEST = '''
import pytest, torch

@pytest.mark.parametrize("k", range(6))
def test_same_golden(parity, k):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    parity.check(m, torch.ones(8, 64), name="shared", dtypes=["bfloat16", "float32"])
'''


def test_xdist_workers_refuse_one_name_in_six_tests(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest -n 2 --parity-regen with six tests of one check name: refused, within a worker (the test fails
    naming both tests) and across workers (an error line and a failing exit status); the golden stays whole."""
    pytest.importorskip("xdist")
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_x=XDIST_TEST)
    first = pytester.runpytest("--rocm-parity", "--parity-mode=capture")
    first.assert_outcomes(passed=1, failed=5)
    first.stdout.fnmatch_lines(["*DuplicateCheckName: check name 'shared' is used by test_x.py::test_same_golden[[]0[]] "
                                "and again by test_x.py::test_same_golden[[]1[]]*"])
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "-p", "no:cacheprovider",
                                           "-p", "no:hypothesispytest", "--rocm-parity", "--parity-regen")
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert outcomes.get("failed", 0) >= 4 and outcomes.get("passed", 0) in (1, 2), outcomes
    if outcomes.get("passed") == 2:   # each worker ran one first: the controller names the clash
        result.stdout.fnmatch_lines(["rocm-parity: error: check name 'shared' is used by *test_same_golden* "
                                     "and again by *test_same_golden*"])
    store = GoldenStore(pytester.path / "goldens")
    m = store.read_manifest("shared")
    files = {p.name for p in store.dir_for("shared").iterdir()}
    assert files == {MANIFEST, *(r["file"] for r in m["rungs"].values())}


CREATE_RACE_CONFTEST = '''
from pytest_rocm_parity.golden import store as golden

_real = golden.GoldenStore.stage

def stage(self, name, manifest, rungs, overwrite):
    # Another xdist worker commits the same new golden between this worker's exists() check and its
    # write: replay that interleaving deterministically by writing it first.
    import copy
    rungs = {k: (v() if callable(v) else v) for k, v in rungs.items()}  # capture streams rungs lazily
    self.commit(_real(self, name, copy.deepcopy(manifest), rungs, True))
    return _real(self, name, manifest, rungs, overwrite)

golden.GoldenStore.stage = stage
'''


def test_new_golden_created_by_two_workers_at_once(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    pytester.makeconftest(CREATE_RACE_CONFTEST)
    pytester.makepyfile(test_x=XDIST_TEST.replace("range(6)", "range(1)"))
    try:
        result = pytester.runpytest("--rocm-parity", "--parity-mode=capture")
    finally:
        golden_mod.GoldenStore.stage = _REAL_STAGE  # type: ignore[method-assign]
    result.assert_outcomes(skipped=1)


_REAL_STAGE = GoldenStore.stage


def test_capture_refuses_to_overwrite_under_the_lock(golden: Golden) -> None:
    """The exists-check is made under the directory lock, so a racing creator cannot be overwritten."""
    before = golden.snapshot()
    with pytest.raises(GoldenExists, match="--parity-regen='tiny'"):
        golden.capture(tiny(seed=1), overwrite=False)
    assert_intact(golden, before)


def test_tmp_dir_is_independent(tmp_path: Path) -> None:
    """Temporary files live in the golden's own directory (same file system, so os.replace is atomic)."""
    g = make_golden(tmp_path)
    assert Path(tempfile.gettempdir()) not in g.dir.parents or tmp_path in g.dir.parents
    assert json.loads(g.manifest.read_text())["rungs"]["float32"]["file"].startswith("float32-")


def test_recapture_in_another_process_is_byte_identical(golden: Golden, tmp_path: Path) -> None:
    """Same model, same inputs -> the same tensor file bytes and name in any process (safetensors'
    metadata order is per-process random; golden.py sorts it), so concurrent writers of one golden
    produce the same file and an unchanged model's recapture leaves nothing to commit."""
    other = Golden(GoldenStore(tmp_path / "other"), golden.spec, golden.model, golden.x)
    out = _child(other, "g.capture(overwrite=False)\n")
    assert out.startswith("rc=0"), out
    assert other.tensor_file().name == golden.tensor_file().name
    assert other.tensor_file().read_bytes() == golden.tensor_file().read_bytes()
