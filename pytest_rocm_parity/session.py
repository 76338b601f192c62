"""Run state of one pytest session with --rocm-parity: results, golden bookkeeping, reports."""
from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from pytest_rocm_parity import progress as progress_lines
from pytest_rocm_parity.options import (
    ALLOW_REFERENCE_CHANGE, ALLOW_WRITE, ENABLE, GOLDEN_DIR, GOLDEN_SIZE_LIMIT, PRUNE, REGEN, REGEN_ALL, REPORT,
    Mode, ParityOptions,
    default_name, regen_command, resolve_device, xdist_worker_index,
)

WORKER_KEY = "rocm_parity_results"
# A file above this size is refused by a push to GitHub unless git-lfs stores it.
GITHUB_FILE_LIMIT = 100 * 1000 * 1000


NAME_LISTS = ("created", "updated", "missing", "corrupt", "stale", "kept", "unchanged", "foreign")



@dataclass
class GoldenLog:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)     # a replay could not read the golden
    stale: list[str] = field(default_factory=list)       # a replay found the golden describes another model
    kept: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)   # regenerated, identical: left untouched
    # another project's golden under this check's name (a shared golden directory): not judged, not written
    foreign: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    # captured, then not written because the test failed: {name, test, existed, reason}
    withheld: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in NAME_LISTS}, "used": sorted(self.used), "withheld": self.withheld}

    def dedupe(self) -> None:
        """List each name once: several tests may keep (or replay) one golden, a migration's variants."""
        for k in NAME_LISTS:
            setattr(self, k, list(dict.fromkeys(getattr(self, k))))

    def merge(self, other: dict[str, Any]) -> None:
        for k in NAME_LISTS:
            getattr(self, k).extend(x for x in other.get(k, []) if x not in getattr(self, k))
        # two workers that capture one name (a duplicate, said as an error): one writes it, the other
        # finds it written and keeps it; the run wrote it, so it is listed once, as written
        written = set(self.created) | set(self.updated)
        self.kept = [x for x in self.kept if x not in written]
        self.used.update(other.get("used", []))
        self.withheld.extend(other.get("withheld", []))


def test_file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _function(nodeid: str) -> str:
    """A test's node id without its parameters: one test's cases share a golden."""
    return nodeid.split("[", 1)[0]


@dataclass
class RunLog:
    """What this run collected and completed: which goldens it can call obsolete, and whether prune may act.

    Every test counts, not only those that name ``parity`` as an argument: a test may take the fixture
    with ``request.getfixturevalue("parity")`` (after a ``pytest.skip``, say), which collection cannot
    see. A test file counts as complete when every test collected from it passed (setup, call,
    teardown) and none of its tests was deselected; only there does an unused golden prove obsolete.
    """

    collected: dict[str, set[str]] = field(default_factory=dict)  # test file -> test ids collected
    partial: set[str] = field(default_factory=set)                # test files with tests left out
    narrowed: set[str] = field(default_factory=set)               # why this run is a partial selection
    passed: set[str] = field(default_factory=set)                 # ids whose call phase passed
    incomplete: set[str] = field(default_factory=set)             # ids with a phase failed or skipped
    owners: dict[str, str] = field(default_factory=dict)          # check name -> the first test that ran it
    checkers: set[str] = field(default_factory=set)               # every test that made a check
    writers: dict[str, str] = field(default_factory=dict)         # check name -> the first test whose check writes it
    ignored: bool = False                                         # --ignore or --ignore-glob skipped paths

    def complete_files(self) -> set[str]:
        return {f for f, ids in self.collected.items()
                if f not in self.partial and ids <= self.passed and not ids & self.incomplete}

    def completed(self, test: str) -> bool:
        """The test ran to its end and passed: every check it makes was reached."""
        return test in self.passed and test not in self.incomplete

    def to_dict(self) -> dict[str, Any]:
        return {"collected": {f: sorted(ids) for f, ids in self.collected.items()}, "partial": sorted(self.partial),
                "narrowed": sorted(self.narrowed), "owners": self.owners, "checkers": sorted(self.checkers),
                "writers": self.writers, "ignored": self.ignored}

    def merge(self, other: dict[str, Any], capturing: bool) -> list[str]:
        """Add a worker's log; returns the duplicate-name errors seen across workers (Session.claim's rule)."""
        for f, ids in other.get("collected", {}).items():
            self.collected.setdefault(f, set()).update(ids)
        self.partial.update(other.get("partial", []))
        self.narrowed.update(other.get("narrowed", []))
        self.checkers.update(other.get("checkers", []))
        self.ignored = self.ignored or bool(other.get("ignored"))
        for name, test in other.get("writers", {}).items():   # before the owners: either worker's write counts
            self.writers.setdefault(name, test)
        errors = []
        for name, test in other.get("owners", {}).items():
            prev = self.owners.setdefault(name, test)
            if clash(name, prev, test, capturing and name in self.writers):
                errors.append(duplicate_message(name, prev, test, capturing))
        return errors


def clash(name: str, first: str, second: str, writing: bool) -> bool:
    """Whether two tests' checks of one name are refused: several tests may replay one golden (a
    migration's variants, parametrized), or keep it in a capture run that does not write it (it
    exists and --parity-regen does not ask for it), but a golden this run writes is written from
    one test (``writing``: either check writes it), and two tests whose default names coincide (one
    file name in two directories) are told apart in either mode. A test that names another test's
    default golden explicitly (a planted-bug self-test) replays it."""
    return first != second and (writing or name == default_name(first) == default_name(second))


def duplicate_message(name: str, first: str, second: str, capturing: bool = True) -> str:
    where = f"by {first} and again by {second}" if first != second else f"twice by {first}"
    if first != second and default_name(first) == default_name(second):
        fix = (f"Both tests default to this name (a test's file and name, without its directory): give one of "
               f"them its own, e.g. parity.check(..., name={second!r})")
        return (f"check name {name!r} is used {where} in this run; one name is one golden, so the two checks would "
                f"{'capture into' if capturing else 'replay'} the same files. {fix}")
    if first != second:
        # several tests replaying or keeping one golden is allowed (candidate variants); writing it twice is not
        return (f"check name {name!r} is used {where} in this capture run, which writes its golden; one name is "
                f"one golden, written from one test. Capture it from one of the tests (select it with -k, or "
                f"capture before adding the others: once it exists, a capture run keeps it and every test that "
                f"names it is judged against it in a replay run). For two goldens, give each check its own name=")
    return (f"check name {name!r} is used {where} in this run; one name is one golden, and one test judges it "
            f"once. Give each check its own name= (or parametrize the test: several tests may replay one golden)")


class StagingStore:
    """The session's golden store in a capture run: a golden's tensor files are written beside the
    golden they replace (GoldenStore.stage), and its manifest only through ``commit``, once the test
    that captured it has passed. A test that fails after its check, or a run stopped in the middle of
    a test, so never replaces a golden (nor creates one), and nothing is written twice.
    Everything but writing is the real store's.
    """

    def __init__(self, target: Any, project: str | None = None) -> None:
        self.target = target
        self.project = project   # written into each manifest: prune tells this project's goldens by it
        self._staged: dict[str, Any] = {}

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.target, attr)

    def write(self, name: str, manifest: dict[str, Any], rungs: dict[str, Any], overwrite: bool) -> Path:
        """Stage the golden (its tensor files written, its manifest held); ``commit`` makes it the golden."""
        self.discard(name)
        if self.project is not None:
            from pytest_rocm_parity.golden.store import PROJECT_KEY

            manifest[PROJECT_KEY] = self.project
        self._staged[name] = self.target.stage(name, manifest, rungs, overwrite)
        path: Path = self.target.dir_for(name) / "manifest.json"
        return path

    def commit(self, name: str) -> None:
        """Replace the golden's manifest by the staged one (the store's lock, an unchanged golden left
        as it was); GoldenExists where another writer's golden is there and this one may not replace it."""
        self.target.commit(self._staged.pop(name))

    def discard(self, name: str) -> None:
        staged = self._staged.pop(name, None)
        if staged is not None:
            self.target.abandon(staged)

    def close(self) -> None:
        """Remove the files of whatever is still staged."""
        for name in list(self._staged):
            self.discard(name)


@dataclass
class Pending:
    """A golden captured by the test in progress, written when the test's outcome is known."""

    name: str
    test: str
    existed: bool
    size_limit: int | None


class ParitySession:
    """Registered as a plugin only when --rocm-parity is on; reached through config.stash."""

    def __init__(self, config: pytest.Config, options: ParityOptions) -> None:
        self.config = config
        self.options = options
        from pytest_rocm_parity.errors import BackendUnavailable
        from pytest_rocm_parity.golden.remote import open_store

        # Any: the real store, or in a capture run the StagingStore in front of it
        try:
            self.store: Any = open_store(options.golden_dir)
        except BackendUnavailable as exc:   # a URL whose filesystem is not installed: the run cannot start
            raise pytest.UsageError(f"rocm-parity: {GOLDEN_DIR}: {exc}") from None
        root = getattr(self.store, "root", None)
        if not hasattr(self.store, "url") and isinstance(root, Path) and root.exists() and not root.is_dir():
            # said once here, not as a write or read error of every check
            raise pytest.UsageError(f"rocm-parity: {GOLDEN_DIR}: {root} is a file, not a directory; point "
                                    f"{GOLDEN_DIR} (or the parity_golden_dir ini key) at the directory of the goldens")
        if options.mode is Mode.CAPTURE:
            if str(options.golden_dir).startswith("memory://") and not hasattr(config, "workerinput"):
                # fsspec's in-memory filesystem lives in this process: the goldens go with it
                config.issue_config_time_warning(pytest.PytestWarning(
                    f"rocm-parity: {GOLDEN_DIR}={options.golden_dir}: an in-memory store lives only as long as "
                    f"this pytest process (and each xdist worker has its own), so a later run will not find these "
                    f"goldens; capture into a folder or a persistent URL (file://, s3://, gs://)"), stacklevel=2)
            self.store = StagingStore(self.store, self.project())
        self.pending: list[Pending] = []      # goldens captured by the test in progress, not yet written
        self.passed_over: dict[str, list[str]] = {}   # test -> why each check it passed over (skip_check)
        self.regen_matched_nothing = False
        self._shows_progress = False
        self.results: list[dict[str, Any]] = []
        self.result_objects: list[Any] = []
        self.goldens = GoldenLog()
        self._device: str | None = None
        self._env: dict[str, Any] | None = None
        self.obsolete: list[str] = []
        self.leftovers: list[Path] = []   # files stopped captures left (GoldenStore.leftovers)
        self.store_leftovers: list[str] = []   # a remote store's stopped uploads (upload_leftovers)
        self.pruned: list[str] = []
        self.kept_why: list[str] = []      # why a golden that looks unused is kept: another project's, or unchecked
        self.unchecked: list[str] = []     # goldens whose test ran and passed without making any check
        self.run = RunLog()
        self.xfailed: set[str] = set()   # tests marked xfail that failed (mark_expected)
        self.deselected: set[str] = set()     # node ids reported deselected (pytest_deselected)
        self.lost_worker = False              # an xdist worker went down without its report
        self._merged_workers: set[str] = set()   # xdist workers whose report is merged
        self.prune_lines: list[str] = []      # every path deleted (or, dry, that would be), and why not
        self.errors: list[str] = []           # run-level errors for the summary (duplicates across workers)
        self.reports_written = False          # --parity-report's files are there: the summary points to them
        self._regen_not_a_path(config)

    # -- facts computed on first use, so a session that runs no check never imports torch ----
    @property
    def device(self) -> str:
        if self._device is None:
            self._device = resolve_device(self.options.device, xdist_worker_index(), self.options.ci)
        return self._device

    @property
    def env(self) -> dict[str, Any]:
        if self._env is None:
            from pytest_rocm_parity.migration.backend import collect_env

            dev = self.device
            if dev == "model":  # a split model: describe the accelerator it is split over
                import torch

                dev = "cuda" if torch.cuda.is_available() else "cpu"
            self._env = collect_env(dev)
        return self._env

    def regen_matches(self, name: str) -> bool:
        """Whether --parity-regen asks for ``name``; a test's default name asks for its later checks
        too (``NAME#2``, ...), so one command regenerates a test whose checks are all stale (the
        replay names only the first)."""
        g = self.options.regen
        if g is None:
            return False
        base = re.sub(r"#\d+$", "", name)
        return g == REGEN_ALL or any(n == g or fnmatch.fnmatchcase(n, g) for n in {name, base})

    def project(self) -> str | None:
        """This run's project as a manifest records it: pytest's rootdir relative to the golden
        directory (``..`` for goldens/ at the root), so it does not change with the checkout's place.
        In a remote store, shared by machines where no relative path means anything, the project's
        name as every checkout of it gives it (remote_project)."""
        root = getattr(self.store, "root", None)
        if hasattr(self.store, "url"):
            from pytest_rocm_parity.golden.remote import remote_project

            return remote_project(Path(self.config.rootpath))
        if not isinstance(root, Path):
            return None
        try:
            return Path(os.path.relpath(Path(self.config.rootpath).resolve(), root.resolve())).as_posix()
        except ValueError:   # another drive (Windows): no relative path
            return None

    def owned_here(self, d: Path, manifest: dict[str, Any]) -> str:
        """'' when the golden at ``d`` is this project's to call obsolete, else why it is kept.

        Its manifest's ``project`` must be this run's; a manifest without one (captured before it was
        recorded) counts as this project's only where the golden directory lies inside the rootdir.
        """
        from pytest_rocm_parity.golden.store import PROJECT_KEY

        here = self.project()
        owner = manifest.get(PROJECT_KEY)
        if isinstance(owner, str):
            if owner == here:
                return ""
            return (f"its manifest records the project at {owner!r} (the rootdir relative to the golden directory) "
                    f"as the one that captured it, and this run's is at {here!r}: a golden directory shared "
                    f"with another project. Prune it from that project")
        root = Path(self.config.rootpath).resolve()
        if here is not None and Path(self.store.root).resolve().is_relative_to(root):
            return ""
        return (f"its manifest does not record which project captured it (an older capture), and the golden "
                f"directory is outside this project's rootdir {root}, perhaps shared with another project. "
                f"Regenerate it from its project ({REGEN}) to record that, or delete {d} by hand if it is obsolete")

    def other_project(self, manifest: dict[str, Any]) -> str:
        """The folder of the project that captured a golden whose manifest records another project than
        this run's; '' for this project's, for one that records none (an older capture) and for
        remote goldens. Check names are golden names, so two projects sharing a golden directory
        under one name would replay and overwrite each other's golden."""
        from pytest_rocm_parity.golden.store import PROJECT_KEY

        owner = manifest.get(PROJECT_KEY)
        here = self.project()
        if not isinstance(owner, str) or here is None or owner == here:
            return ""
        if hasattr(self.store, "url"):
            from pytest_rocm_parity.golden.store import REMOTE_PROJECT_KINDS

            # a remote golden recorded before projects were named there (a path) is no one else's
            return owner if owner.startswith(REMOTE_PROJECT_KINDS) else ""
        return os.path.normpath(Path(self.store.root).resolve() / owner)

    def taken_by(self, spec: Any) -> str:
        """Why regenerating ``spec``'s golden would replace another test's: its manifest records a test
        of another function whose file still defines it (two tests that default to one name, run
        folder by folder); '' otherwise, a test moved or renamed away included."""
        from pytest_rocm_parity.errors import ParityError

        try:
            owner = self.store.read_manifest(spec.name).get("test")
        except ParityError:
            return ""
        if not isinstance(owner, str) or not owner or not spec.test:
            return ""
        if _function(owner) == _function(spec.test) or not self.test_defined(owner):
            return ""
        return (f"regenerating {spec.name!r} from {spec.test} would replace the golden at "
                f"{self.store.dir_for(spec.name)}, which {owner} captured and which that test still replays "
                f"({test_file(owner)} is there): the two tests share the check name {spec.name!r}"
                f"{' (the default leaves the directory out)' if spec.name == default_name(spec.test) else ''}. "
                f"Regenerate it from {owner} ({regen_command(spec.name, owner, spec.command_flags)}) to keep "
                f"both judged against it; give one of them its own name, parity.check(..., name=...), and capture "
                f"it; or, if {owner} is to replay the golden this test captures, pass {ALLOW_REFERENCE_CHANGE}")

    def test_defined(self, nodeid: str) -> bool:
        """Whether the test ``nodeid`` (a golden manifest's ``test``) is still there: its file, under
        this run's rootdir, defines its function."""
        path = Path(self.config.rootpath) / test_file(nodeid)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            return False
        return re.search(rf"\bdef {re.escape(_function(nodeid).rsplit('::', 1)[-1])}\b", text) is not None

    def names_in_file(self, nodeid: str, name: str) -> bool:
        """Whether the file of test ``nodeid`` holds the check name ``name`` as a string literal."""
        try:
            text = (Path(self.config.rootpath) / test_file(nodeid)).read_text()
        except (OSError, UnicodeDecodeError):
            return False
        return f'"{name}"' in text or f"'{name}'" in text

    def owner_of(self, name: str) -> str:
        """other_project of the golden ``name`` on disk; '' where it cannot be read (the replay or
        capture names that itself)."""
        from pytest_rocm_parity.errors import ParityError

        try:
            return self.other_project(self.store.read_manifest(name))
        except ParityError:
            return ""

    def foreign(self, spec: Any, owner: str, regen: bool) -> str:
        """Lists the golden of ``spec.name`` as another project's (``owner``, other_project) and says why
        it is not this project's to judge against (``regen``: to overwrite), and the fixes. The message
        starts with what is wrong (pytest's short summary shows only its start): whose golden it is.
        A --parity-regen glob that does not ask for the name keeps it, as it keeps any golden it does
        not match: listed kept, its skip reason saying whose it is, so that the run's list of another
        project's goldens holds the names the regen was refused for."""
        if self.capturing and not regen and self.options.regen is not None and not self.regen_matches(spec.name):
            self.goldens.kept.append(spec.name)
        else:
            self.goldens.foreign.append(spec.name)
        ours = f"{Path(self.config.rootpath).name}-{spec.name}"
        what = ("regenerating it would overwrite that project's golden" if regen else
                "it describes that project's model, not this check's")
        here = self.project() if hasattr(self.store, "url") else Path(self.config.rootpath).resolve()
        return (f"the golden for {spec.name!r} belongs to another project: its manifest "
                f"{self.store.manifest_path(spec.name)} records the project {owner} as the one that captured it, "
                f"and this run's is {here}. The golden directory {getattr(self.store, 'url', self.store.root)} "
                f"is shared, and checks of both projects are named {spec.name!r}; {what}. Give this check a name "
                f"of its own, "
                f"e.g. parity.check(..., name={ours!r}), and capture it, or give each project a golden directory "
                f"of its own ({GOLDEN_DIR}, ini parity_golden_dir). If {owner} is this project checked out at "
                f"another place, replace the golden on purpose: {spec.regen_command} {ALLOW_REFERENCE_CHANGE}")

    @property
    def capturing(self) -> bool:
        return self.options.mode is Mode.CAPTURE

    def add(self, result: Any) -> None:
        self.result_objects.append(result)
        self.results.append(result.to_dict())

    def add_error(self, spec: Any, exc: BaseException, kind: str = "model") -> dict[str, Any]:
        """Record a check that reached no verdict (its golden missing, corrupt or stale, or the replay
        raised) as an error entry of the results, so that the summary and every report list it;
        returns the entry."""
        from pytest_rocm_parity.errors import GoldenCorrupt, GoldenError, GoldenMissing, GoldenStale

        why = next((w for t, w in ((GoldenMissing, "missing"), (GoldenCorrupt, "corrupt"), (GoldenStale, "stale"))
                    if isinstance(exc, t)), "error")
        if spec.name in self.goldens.foreign:
            why = "foreign"
        if why in ("corrupt", "stale") and spec.name not in getattr(self.goldens, why):
            getattr(self.goldens, why).append(spec.name)
        path = getattr(exc, "path", None) if isinstance(exc, GoldenError) else None
        try:
            env = self.env
        except Exception:   # an error entry must be written even where the environment cannot be read
            env = {}
        entry = {"test": spec.test, "name": spec.name, "dtype": ",".join(spec.dtypes), "passed": False,
                 "error": {"kind": why, "type": type(exc).__name__, "message": str(exc),
                           "path": None if path is None else str(path)},
                 "culprit": None, "culprit_block": None, "first_divergent": None, "reference_env": {},
                 "candidate_env": env, "golden": str(path or self.store.dir_for(spec.name)), "kind": kind,
                 "layers": [], "outputs": [], "extra": {}, "notes": []}
        self.results.append(entry)
        return entry

    # -- xdist: workers ship results to the controller ---------------------------------------
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
        self.store_unpin()
        for p in self.pending:   # the run stopped inside the test that captured them
            self._withhold(p, f"the run stopped before {p.test} finished")
        self.pending.clear()
        if isinstance(self.store, StagingStore):
            self.store.close()
        self.goldens.dedupe()
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKER_KEY] = json.dumps({"results": self.results, "goldens": self.goldens.to_dict(),
                                                   "run": self.run.to_dict()})
            return
        if self.errors and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.mark_expected()
        self.find_obsolete(session, int(session.exitstatus))
        if self.options.report_dir is not None:
            try:
                self.write_reports(self.options.report_dir)
                self.reports_written = True
            except OSError as exc:   # a report must never break the run: its summary still prints
                self.errors.append(f"{REPORT} {self.options.report_dir}: the reports could not be written "
                                   f"({exc.strerror or exc}); give a writable folder")
                if session.exitstatus == pytest.ExitCode.OK:
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def store_unpin(self) -> None:
        unpin = getattr(self.store, "unpin", None)
        if unpin is not None:
            unpin()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        data = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if error is not None or not data:
            # a worker that crashed took its record of the goldens its checks used with it
            self.lost_worker = True
        # xdist may report one worker down twice (finished, then interrupted), with the same output
        worker = str(getattr(getattr(node, "gateway", None), "id", id(node)))
        if data and worker not in self._merged_workers:
            self._merged_workers.add(worker)
            payload = json.loads(data)
            self.results.extend(payload["results"])
            self.goldens.merge(payload["goldens"])
            self.errors.extend(self.run.merge(payload.get("run", {}), self.capturing))

    # -- what ran: obsolete goldens and prune ------------------------------------------------------
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[Any]) -> Any:
        """A plugin or conftest that drops tests from ``items`` without reporting them deselected
        (a sharding plugin, an environment filter) leaves their files partial, as a deselection does."""
        before = {item.nodeid: test_file(item.nodeid) for item in items}
        try:
            return (yield)
        finally:
            kept = {item.nodeid for item in items}
            dropped = {f for nodeid, f in before.items() if nodeid not in kept and nodeid not in self.deselected}
            if dropped:
                self.run.narrowed.add("tests removed from the collection by a plugin or conftest")
                self.run.partial.update(dropped)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        config = session.config
        for item in session.items:   # every test: one may take ``parity`` through request.getfixturevalue
            self.run.collected.setdefault(test_file(item.nodeid), set()).add(item.nodeid)
        for flag, dest in (("-k", "keyword"), ("-m", "markexpr"), ("--lf", "lf"), ("--sw", "stepwise")):
            if config.getoption(dest, None):
                self.run.narrowed.add(flag)
        named = [a for a in config.args if "::" in a]
        if config.getoption("ignore", None) or config.getoption("ignore_glob", None):
            # collection skipped paths: a test file that is not under the rootdir any more may have
            # moved under one of them, so no golden is obsolete for want of its file
            self.run.ignored = True
        if named:
            self.run.narrowed.add("test ids on the command line")
            for a in named:   # the file's other tests were not collected
                p = Path(config.invocation_params.dir, a.split("::", 1)[0]).resolve()
                with contextlib.suppress(ValueError):
                    self.run.partial.add(p.relative_to(config.rootpath.resolve()).as_posix())

    def pytest_deselected(self, items: list[Any]) -> None:
        self.run.narrowed.add("deselected tests")
        self.deselected.update(item.nodeid for item in items)
        for item in items:
            self.run.partial.add(test_file(item.nodeid))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed or report.skipped:
            self.run.incomplete.add(report.nodeid)
            if report.when == "call" and report.skipped and hasattr(report, "wasxfail"):
                self.xfailed.add(report.nodeid)
        elif report.when == "call":
            self.run.passed.add(report.nodeid)

    def mark_expected(self) -> None:
        """A failing check whose test expected it is labelled so (``expected``: ``xfail`` where the test
        is marked xfail and failed, ``caught`` where it passed, having caught the failure): a planted
        bug's self-test reads as such in the summary and the reports, not as a regression."""
        for r in self.results:
            if r.get("passed") or r.get("error") or not r.get("test"):
                continue
            if r["test"] in self.xfailed:
                r["expected"] = "xfail"
            elif self.run.completed(r["test"]):
                r["expected"] = "caught"

    def _whole_suite(self) -> bool:
        """Every test path the project has was collected: no arguments, or arguments that name its
        ``testpaths`` (or its rootdir) exactly, as CI commands often spell the whole suite."""
        c = self.config
        src = getattr(c, "args_source", None)
        if src == pytest.Config.ArgsSource.TESTPATHS:
            return True
        root = Path(c.rootpath).resolve()
        if src == pytest.Config.ArgsSource.INVOCATION_DIR:
            given = {Path(c.invocation_params.dir).resolve()}
        elif any("::" in a for a in c.args):
            return False
        else:
            given = {Path(c.invocation_params.dir, a).resolve() for a in c.args}
        testpaths = {(root / t).resolve() for t in c.getini("testpaths") or ()}
        return given == {root} or bool(testpaths) and given == testpaths

    def find_obsolete(self, session: pytest.Session | None = None, exitstatus: int = 0) -> None:
        """Name the goldens this run proves obsolete, and prune them when asked and safe.

        Obsolete: the golden is this project's (``owned_here``), no check of this run used it, its test
        (its manifest's ``test``), where collected or deselected, passed, and either its test file was
        collected and every test in it passed, or the whole suite ran unfiltered and that file no
        longer exists. A golden whose test is gone from an existing file counts only when the whole
        suite ran too: its check may have moved, name and all, to another file.
        """
        if hasattr(self.store, "url"):
            # remote goldens are never listed obsolete nor pruned (their manifests are not local); the
            # temporary files of uploads a killed run stopped are listed, and pruned like leftovers
            self.store_leftovers = self.store.upload_leftovers()
            if self.options.prune or self.options.prune_dry_run:
                self._prune_leftovers()
            return
        self.leftovers = self.store.leftovers()
        if self.lost_worker:   # which goldens its checks used is unknown: none is proven obsolete
            if self.options.prune or self.options.prune_dry_run:
                self.prune_lines.append(f"rocm-parity: {PRUNE} deleted nothing: an xdist worker crashed, and its "
                                        f"record of the goldens its checks used went with it")
            return
        complete = self.run.complete_files()
        collected = set().union(*self.run.collected.values()) if self.run.collected else set()
        # The whole suite of the project that owns these goldens: unfiltered, and with at least one of
        # its checks using them. A run of another project (a trivial suite, a command run from the
        # wrong folder) has none of their test files, and must not read them as deleted; nor may a
        # project that shares the golden directory (owned_here).
        whole = self._whole_suite() and not self.run.narrowed and not self.run.ignored and bool(self.goldens.used)
        root = Path(self.config.rootpath)
        checked = self.run.checkers   # the tests that made a check in this run
        found = []
        for name, d, manifest in self.store.goldens_on_disk():
            test = manifest.get("test") if manifest is not None else None
            if manifest is None or name in self.goldens.used or not isinstance(test, str):
                continue
            if (test in collected or test in self.deselected) and not self.run.completed(test):
                continue   # its test is here but did not finish: it may not have reached this check
            gone = test_file(test) not in self.run.collected and not (root / test_file(test)).exists()
            if gone and not whole:
                if not self.run.collected:
                    continue   # a run that collected nothing (another folder): the refusal says so, once
                # its check may have moved, name and all, to a file this run did not collect
                self.kept_why.append(f"rocm-parity: kept {name!r}: its test file {test_file(test)} is gone, but this "
                                     f"run did not run the whole suite unfiltered, where a check of that name may "
                                     f"live now; a run of the whole suite prunes it")
                continue
            deleted = whole and gone
            if test_file(test) not in complete and not deleted:
                continue
            if test not in collected and not whole:
                # a renamed test: its file ran whole, but a check of that name may have moved elsewhere
                self.kept_why.append(f"rocm-parity: kept {name!r}: its test {test} is gone from {test_file(test)}, "
                                     f"which ran whole, but this run did not run the whole suite unfiltered, where "
                                     f"a check of that name may live now; a run of the whole suite prunes it")
                continue
            why_kept = self.owned_here(d, manifest)
            if why_kept:   # a test path of another project's can match one of this project's, or none
                self.kept_why.append(f"rocm-parity: kept {name!r}: {why_kept}")
                continue
            if test in collected and test not in checked:
                # its test ran and passed without any check (a return behind a feature flag): its check
                # may come back, and a test that stops without one gives no sign that it is gone for good
                self.unchecked.append(name)
                self.kept_why.append(f"rocm-parity: kept {name!r}: its test {test} ran and passed without checking "
                                    f"it (it made no parity check at all); a golden is obsolete once its test is "
                                    f"gone or checks other names. Delete {d} by hand if its check is gone for good")
                continue
            if test in collected and self.names_in_file(test, name):
                # its test checked others this run, yet its file still names this one: a check behind a
                # condition (a nightly job's environment variable), which a renamed check is not
                self.unchecked.append(name)
                self.kept_why.append(f"rocm-parity: kept {name!r}: its test {test} ran and passed without checking "
                                    f"it, and {test_file(test)} still names {name!r} (a check behind a condition, "
                                    f"such as an environment variable another job sets); a run that makes that "
                                    f"check uses it. Delete {d} by hand if its check is gone for good")
                continue
            self.obsolete.append(name)
            found.append((name, d, manifest))
        if self.options.prune or self.options.prune_dry_run:
            self._prune_leftovers()
            self.prune_lines.extend(self.kept_why)
            self._prune(found, session, exitstatus)

    def _prune_leftovers(self) -> None:
        """Files no manifest names need no run to prove them unused: they go whatever the run did,
        unless CI=true forbids writing."""
        dry = self.options.prune_dry_run
        n = len(self.leftovers) + len(self.store_leftovers)
        if not n:
            return
        if not dry and not self.options.may_write():
            self.prune_lines.append(f"rocm-parity: {n} leftover file(s) of stopped captures not "
                                    f"deleted: CI=true; pass {ALLOW_WRITE} to override")
            return
        try:
            done: list[Path | str] = list(self.leftovers) if dry else list(self.store.remove_leftovers(self.leftovers))
            gone = self.store_leftovers if dry or not self.store_leftovers else \
                self.store.remove_upload_leftovers(self.store_leftovers)
        except OSError as exc:
            self.prune_lines.append(f"rocm-parity: leftover files of stopped captures not deleted: {exc}")
            return
        for p in done:
            self.prune_lines.append(f"rocm-parity: {'would delete' if dry else 'deleted'} {p} (left by a capture "
                                    f"that was stopped before its manifest was written)")
        for r in gone:
            self.prune_lines.append(f"rocm-parity: {'would delete' if dry else 'deleted'} {r} in {self.store.url} "
                                    f"(an upload that was stopped before it was moved into place)")
        if not dry:
            self.leftovers = [p for p in self.leftovers if p.exists()]
            self.store_leftovers = [r for r in self.store_leftovers if r not in gone]

    def _prune_refusal(self, session: pytest.Session | None, exitstatus: int) -> str:
        if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            return ("the run ran no tests (none collected, or every one deselected), so it proves nothing obsolete; "
                    "run from the project's rootdir or pass its test paths")
        if exitstatus != 0 or (session is not None and (session.shouldstop or session.shouldfail)):
            return (f"the run did not pass (exit status {exitstatus}); a failed, stopped or interrupted run may not "
                    f"have reached every check. Prune after a run that passes")
        if self.run.narrowed:
            return (f"this run was a partial selection ({', '.join(sorted(self.run.narrowed))}); prune after a run "
                    f"of whole test files")
        if not self.options.prune_dry_run and not self.options.may_write():
            return (f"CI=true, and deleting goldens writes to {self.store.root}; goldens are pruned on a developer "
                    f"machine and the deletion committed. Pass {ALLOW_WRITE} to override")
        return ""

    def _prune(self, found: list[tuple[str, Path, Any]], session: pytest.Session | None, exitstatus: int) -> None:
        dry = self.options.prune_dry_run
        why = self._prune_refusal(session, exitstatus)
        if not found and not why:
            self.prune_lines.append(f"rocm-parity: {PRUNE}: no obsolete goldens under {self.store.root}")
            return
        if why:
            self.prune_lines.append(f"rocm-parity: {PRUNE} {'would delete' if dry else 'deleted'} no obsolete "
                                    f"golden: {why}")
            return
        for name, d, manifest in found:
            if not self.store.ours(d, manifest):
                self.prune_lines.append(
                    f"rocm-parity: not deleted: {d}: its manifest lacks \"tool\": \"pytest-rocm-parity\" (a golden of "
                    f"an older version, or a directory this tool did not write); delete it by hand if it is obsolete")
                continue
            try:
                for p in self.store.delete(d, dry_run=dry):
                    self.prune_lines.append(f"rocm-parity: {'would delete' if dry else 'deleted'} {p}")
            except OSError as exc:
                self.prune_lines.append(f"rocm-parity: could not delete {d}: {exc}; what it still holds is listed "
                                        f"as obsolete or leftover by the next run")
                continue
            if not dry:
                self.pruned.append(name)

    # -- checks: names, regeneration, sizes ---------------------------------------------------------
    def claim(self, name: str, test: str, names_of_this_test: set[str]) -> None:
        """Refuse a second check of one name in this run (a rerun of the same test is not a second
        check), unless another test made the first and the two do not clash (clash)."""
        from pytest_rocm_parity.errors import DuplicateCheckName

        if name in names_of_this_test:
            raise DuplicateCheckName(duplicate_message(name, test, test))
        if self.writes(name):
            self.run.writers.setdefault(name, test)
        prev = self.run.owners.setdefault(name, test)
        if clash(name, prev, test, self.capturing and name in self.run.writers):
            raise DuplicateCheckName(duplicate_message(name, prev, test, capturing=self.capturing))
        names_of_this_test.add(name)
        self.run.checkers.add(test)

    def writes(self, name: str) -> bool:
        """Whether this run's check of ``name`` writes its golden: a capture run writes a golden that
        is not there yet (unless a --parity-regen glob leaves it out) and one --parity-regen asks for;
        it keeps any other."""
        if not self.capturing:
            return False
        return self.regen_matches(name) or (self.options.regen is None and not self.store.exists(name))

    def _regen_not_a_path(self, config: pytest.Config) -> None:
        """``--parity-regen tests/test_x.py`` (a space, not ``=``) makes the path the glob: say so."""
        g = self.options.regen
        if g is None or g == REGEN_ALL:
            return
        # a test id (file.py::test) is not refused: default check names are test ids, so it names a check
        if not Path(config.invocation_params.dir, g).exists():
            return
        raise pytest.UsageError(
            f"{REGEN} took {g!r} as the glob of check names to regenerate, but it is a path: an option value "
            f"given after a space is read as the value. To regenerate every check of that file, put the path "
            f"first: pytest {g} {ENABLE} {REGEN}; to regenerate some checks: {REGEN}='NAME_GLOB' {g}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        result = yield
        g = self.options.regen
        if (g is None or g == REGEN_ALL or hasattr(session.config, "workerinput")
                or session.shouldstop or session.shouldfail):
            return result
        if not any(self.regen_matches(n) for n in self.goldens.used):
            self.regen_matched_nothing = True   # the error says it all: no summary of the goldens kept
            reached = sorted(self.goldens.used)
            listed = ", ".join(reached[:10]) + (" ..." if len(reached) > 10 else "")
            raise pytest.UsageError(
                f"{REGEN}={g!r} matched none of the {len(reached)} checks this run reached"
                + (f" ({listed})" if reached else "") + ", so nothing was regenerated. Pass a check name or a glob "
                f"of names ({REGEN}='prefix*'), or {REGEN} alone to regenerate every check collected")
        return result

    def reference_change(self, name: str) -> str:
        """What would change in the golden's reference environment if this machine regenerated it; '' when nothing."""
        from pytest_rocm_parity.errors import ParityError

        try:
            old = self.store.read_manifest(name).get("reference_env") or {}
        except ParityError:
            return ""   # unreadable: regenerating is the fix, and there is no reference to keep
        new = self.env
        changes = []
        if old.get("backend") and old.get("backend") != new.get("backend"):
            changes.append(f"device kind {old.get('backend')} -> {new.get('backend')}")
        major = [str(e.get("torch") or "").split(".", 1)[0] for e in (old, new)]
        if major[0] and major[0] != major[1]:
            changes.append(f"torch major version {old.get('torch')} -> {new.get('torch')}")
        if not changes:
            return ""

        def where(e: dict[str, Any]) -> str:
            return f"{e.get('backend')} ({e.get('device_name') or e.get('device') or '?'}, torch {e.get('torch')})"

        return (f"regenerating {name!r} would replace the golden at {self.store.dir_for(name)}, captured on "
                f"{where(old)}, with one captured here on {where(new)}: {'; '.join(changes)}. Goldens are the "
                f"reference machine's results: regenerate them there, or pass {ALLOW_REFERENCE_CHANGE} to "
                f"change the reference on purpose")

    def skip_check(self, spec: Any, why: str) -> None:
        """Pass over a check a capture run writes no golden for (its golden kept, or not asked for by
        --parity-regen): the test goes on, so a check after it (a new one) is captured, and the test
        reads skipped, with ``why``, where it captured nothing (pytest_runtest_makereport)."""
        self.passed_over.setdefault(spec.test, []).append(why)

    def record_capture(self, spec: Any, existed: bool) -> None:
        """Hold the staged capture until its test's outcome is known (``pytest_runtest_makereport``)."""
        self.pending.append(Pending(spec.name, spec.test, existed, spec.golden_size_limit))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        """Write the goldens a test captured once it passed (or skipped at a kept golden); withhold them
        when it failed or skipped itself. A test still in setup keeps them pending until its call phase."""
        report = yield
        over = self.passed_over.pop(item.nodeid, []) if report.when == "call" or report.failed else []
        if over and report.passed and not any(p.test == item.nodeid for p in self.pending):
            report.outcome = "skipped"   # every check passed over, none captured: as a skip reads
            report.longrepr = (str(item.path), (item.location[1] or 0) + 1, "Skipped: " + "; ".join(over))
        if not self.pending:
            return report
        # a skip after a capture is the test's own (a check passed over raises nothing): as a failure
        failed = report.failed or report.skipped
        if failed:
            what = "failed" if report.failed or hasattr(report, "wasxfail") else "skipped"
            lines = [self._withhold(p, f"{p.test} {what} after the capture") for p in self.pending]
            report.sections.append(("rocm-parity: goldens not written", "\n".join(lines)))
        elif report.when != "setup" or report.skipped:
            errors = [e for e in (self._commit(p) for p in self.pending) if e]
            if errors:   # the test passed, but its golden is not on disk: that fails it
                report.outcome = "failed"
                report.longrepr = "\n".join(errors)
        else:
            return report
        self.pending.clear()
        return report

    def _withhold(self, p: Pending, why: str) -> str:
        """Drop a staged capture; the golden on disk, if any, stays as it was. Returns the line said."""
        assert isinstance(self.store, StagingStore)
        self.store.discard(p.name)
        self.goldens.withheld.append({"name": p.name, "test": p.test, "existed": p.existed, "reason": why})
        return (f"golden for {p.name!r} not {'updated' if p.existed else 'created'}: {why}; "
                + (f"the golden at {self.store.dir_for(p.name)} is as it was" if p.existed else "nothing was written")
                + "; capture again once the test passes")

    def _commit(self, p: Pending) -> str:
        """Write one staged golden; '' when written (or another worker's was kept), else the error."""
        from pytest_rocm_parity.errors import GoldenExists, ParityError

        assert isinstance(self.store, StagingStore)
        progress_lines.set_sink(None)   # the store's per-rung lines were said when the capture ran
        try:
            self.store.commit(p.name)
        except GoldenExists:
            self.goldens.kept.append(p.name)
            return ""
        except (ParityError, OSError) as exc:
            return (f"{type(exc).__name__}: the golden for {p.name!r} was captured but could not be written "
                    f"to {self.store.dir_for(p.name)}: {exc}")
        finally:
            progress_lines.set_sink(self._progress_line if self._shows_progress else None)
        with progress_lines.checking(p.name):
            self._log_written(p)
        return ""

    def _log_written(self, p: Pending) -> None:
        """Log the write (created, updated, or unchanged and left alone), print its size, warn when large."""
        name = p.name
        if name in getattr(self.store, "unchanged", ()):
            self.goldens.unchanged.append(name)
            progress_lines.progress("golden unchanged (same tensors and description): left as it was")
        else:
            (self.goldens.updated if p.existed else self.goldens.created).append(name)
        try:
            from pytest_rocm_parity.golden.store import load_manifest

            d = self.store.dir_for(name)
            manifest = load_manifest(d / "manifest.json")
            files = {str(r["file"]): int(r.get("bytes") or 0) for r in manifest["rungs"].values()}
        except Exception:  # the size line must never fail a capture that succeeded
            return
        size = sum(files.values())
        progress_lines.progress(f"golden {progress_lines.megabytes(size)} in {len(files)} file(s) at {d}")
        limit = p.size_limit
        if limit is None or size <= limit:
            return
        largest, largest_bytes = max(files.items(), key=lambda kv: kv[1])
        warnings.warn(pytest.PytestWarning(self.size_advice(name, size, limit, largest, largest_bytes,
                                                            manifest.get("drill"), manifest.get("sketch"))),
                      stacklevel=1)

    def size_advice(self, name: str, size: int, limit: int, largest: str, largest_bytes: int,
                    drill: Any = None, sketch: Any = None) -> str:
        """The ways to shrink the golden that it has not taken already (``drill``, ``sketch``: the
        golden's), and, for a golden directory in the repository, the git-lfs line."""
        mb = progress_lines.megabytes
        github = (f" Its largest file, {largest} ({mb(largest_bytes)}), is over GitHub's 100 MB file limit: a push "
                  f"without git-lfs is refused." if largest_bytes > GITHUB_FILE_LIMIT else "")
        ways = []
        if not isinstance(drill, int) or drill > 0:
            ways.append(f"a shallower drill= in parity.check or @pytest.mark.parity (0: block outputs only"
                        + (f"; this golden is drill={drill}" if isinstance(drill, int) else "") + ")")
        if not sketch:
            ways.append("sketch=True (on a large model well under 1% of the size, judged on the propagated pass)")
        ways.append("fewer tokens (a shorter sequence or a smaller batch)")
        text = (f"rocm-parity: the golden for {name!r} is {mb(size)}, over the {mb(limit)} limit "
                f"({GOLDEN_SIZE_LIMIT}, ini parity_golden_size_limit).{github} To shrink it: {'; or '.join(ways)}.")
        if hasattr(self.store, "url"):
            return text   # an artifact store's goldens are not in git
        rel = os.path.relpath(self.store.root, self.config.rootpath)
        if rel.startswith(".."):
            return text + (f" The golden directory {self.store.root} is outside the repository at "
                           f"{self.config.rootpath}, so git does not hold it")
        return text + (f" To keep it in git as it is, store goldens with git-lfs: add this line to .gitattributes: "
                       f"{Path(rel).as_posix()}/**/*.safetensors filter=lfs diff=lfs merge=lfs -text")

    # -- the session's start: the report folder, progress lines through the terminal reporter ---------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return   # an xdist worker's terminal is not shown
        if self.options.report_dir is not None:   # before any worker saves this run's
            from pytest_rocm_parity.reports.report import clear_failing_tensors

            clear_failing_tensors(self.options.report_dir)
        self._shows_progress = True
        progress_lines.set_sink(self._progress_line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        progress_lines.set_sink(None)
        self.store_unpin()
        if isinstance(self.store, StagingStore):
            self.store.close()   # a session that ended before sessionfinish leaves nothing staged behind

    def _progress_line(self, line: str, verbose: int) -> None:
        # level 0 shows at the default verbosity, level 1 with -v; -q keeps pytest's line of dots
        if self.config.get_verbosity() < max(verbose, 0):
            return
        tr = self.config.pluginmanager.getplugin("terminalreporter")
        if tr is None:
            return
        capman = self.config.pluginmanager.getplugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            tr.write_line(line)
        if hasattr(tr, "currentfspath"):
            tr.currentfspath = None   # the test's own line starts afresh after ours

    def write_reports(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        doc = {"schema": 1, "mode": self.options.mode.value,
               "checks": sorted(self.results, key=lambda r: (r["test"], r["name"], r["dtype"])),
               "goldens": {**self.goldens.to_dict(), "obsolete": self.obsolete, "unchecked": self.unchecked,
                           "pruned": self.pruned}}
        if self.lost_worker:
            from pytest_rocm_parity.reports.summary import LOST_WORKER

            doc["incomplete"] = LOST_WORKER
        from pytest_rocm_parity.atomic import atomic_write
        from pytest_rocm_parity.reports import report

        atomic_write(out / "parity-report.json", report.report_json(doc))
        report.write_all(doc, out)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from pytest_rocm_parity.reports.summary import summary_lines

        if self.regen_matched_nothing:
            return

        for line in summary_lines(self):
            terminalreporter.write_line(line)
        if self.goldens.unchanged:
            terminalreporter.write_line("goldens unchanged (regenerated identical, files left as they were): "
                                        + ", ".join(self.goldens.unchanged))
        for line in self.errors:
            terminalreporter.write_line(f"rocm-parity: error: {line}", red=True)
        for line in self.prune_lines:
            terminalreporter.write_line(line)
