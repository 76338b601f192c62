"""Every command-line option and ini key, declared once; tests import these names."""
from __future__ import annotations

import enum
import os
import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ENABLE = "--rocm-parity"
MODE = "--parity-mode"
REGEN = "--parity-regen"
GOLDEN_DIR = "--parity-golden-dir"
DEVICE = "--parity-device"
REPORT = "--parity-report"
ALLOW_WRITE = "--parity-allow-write"
DTYPES = "--parity-dtypes"
DRILL = "--parity-drill"
PRUNE = "--parity-prune-obsolete"
PROFILE = "--parity-profile"
REPLAY = "--parity-replay"
REPLAY_KINDS = ("auto", "full", "fast")
ALLOW_REFERENCE_CHANGE = "--parity-allow-reference-change"
GOLDEN_SIZE_LIMIT = "--parity-golden-size-limit"
PRUNE_DRY_RUN = "--parity-prune-dry-run"
REQUIRE = "--parity-require"
DEFAULT_GOLDEN_SIZE_LIMIT_MB = 50.0
REGEN_ALL = "*"


# flag -> its dest, which is also its ini key (--parity-regen has no ini key)
FLAG_DESTS = {ENABLE: "rocm_parity", MODE: "parity_mode", REGEN: "parity_regen", GOLDEN_DIR: "parity_golden_dir",
              DEVICE: "parity_device", REPORT: "parity_report", ALLOW_WRITE: "parity_allow_write",
              DTYPES: "parity_dtypes", DRILL: "parity_drill", REPLAY: "parity_replay", PROFILE: "parity_profile",
              PRUNE: "parity_prune_obsolete", PRUNE_DRY_RUN: "parity_prune_dry_run",
              ALLOW_REFERENCE_CHANGE: "parity_allow_reference_change",
              GOLDEN_SIZE_LIMIT: "parity_golden_size_limit", REQUIRE: "parity_require"}


class Mode(str, enum.Enum):
    REPLAY = "replay"
    CAPTURE = "capture"

    def __str__(self) -> str:
        return self.value


def parse_mode(value: str) -> Mode:
    try:
        return Mode(value)
    except ValueError:
        raise pytest.UsageError(f"{MODE}={value!r}: allowed values are replay, capture") from None


def parse_regen(value: str) -> str:
    """A --parity-regen glob; an empty one (``--parity-regen=$MODEL`` with MODEL unset) names no check."""
    if not value.strip():
        raise pytest.UsageError(
            f"{REGEN}={value!r}: the glob of check names to regenerate is empty (a shell variable that is not set, "
            f"as in {REGEN}=$MODEL?), so it names no check. Pass a check name or a glob of names, "
            f"{REGEN}='NAME_GLOB', or {REGEN} alone to regenerate the golden of every check the run reaches")
    return value


def parse_device(value: str) -> str:
    v = value.strip()
    base = v.split(":", 1)[0]
    if base not in ("cpu", "cuda", "hip", "xpu", "mps", "auto", "model") or (":" in v and not v.split(":", 1)[1].isdigit()):
        raise pytest.UsageError(f"{DEVICE}={value!r}: allowed forms are auto, cpu, cuda, cuda:N (ROCm builds use cuda "
                                f"too), xpu, mps, or model (keep the model's own placement, e.g. split over GPUs)")
    return "cuda" + v[3:] if base == "hip" else v


def parse_dtypes(value: str) -> list[str]:
    from pytest_rocm_parity.judging.dtypes import rung_name
    from pytest_rocm_parity.errors import InvalidArgument

    try:   # commas, spaces or lines apart: an ini list is often written one a line
        got = [rung_name(x) for x in re.split(r"[,\s]+", value) if x]
    except InvalidArgument as exc:
        raise pytest.UsageError(f"{DTYPES}={value!r} (or ini parity_dtypes): {exc}") from None
    if not got:   # an empty value (an unset shell variable) must not fall back to the defaults silently
        raise pytest.UsageError(f"{DTYPES}={value!r} lists no dtype: give one or more (e.g. {DTYPES}=bfloat16,float32), "
                                f"or leave the option out for each check's own dtypes")
    return got


def parse_drill(value: str) -> int:
    if not value.strip().isdigit():
        raise pytest.UsageError(f"{DRILL}={value!r}: expected an integer >= 0, the sub-module depth below each "
                                f"selected block (0: blocks only); leave it out for the deepest whose golden fits "
                                f"the golden-size limit")
    return int(value)


def parse_replay(value: str) -> str:
    v = value.strip().lower()
    if v not in REPLAY_KINDS:
        raise pytest.UsageError(f"{REPLAY}={value!r}: allowed values are auto (default: fast above 1B parameters), "
                                f"full (propagated + isolated passes) and fast (one teacher-forced run of the "
                                f"forward plus the deeper levels)")
    return v


def parse_size_limit(value: str) -> float:
    """Megabytes (10**6 bytes); 0 turns the warning off."""
    try:
        mb = float(value)
    except ValueError:
        mb = -1.0
    if not mb >= 0 or mb == float("inf"):
        raise pytest.UsageError(f"{GOLDEN_SIZE_LIMIT}={value!r}: a size in MB, e.g. 50 (0 turns the size "
                                f"warning off)")
    return mb


INI_KEYS: set[str] = set()   # every ini key addoption registers


def _ini_file(config: pytest.Config) -> Any:
    """The keys and raw values the ini file set. pytest 9 deprecates ``inicfg`` and offers no other
    way to list them; where it is gone, the messages that use it go without."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pytest.PytestDeprecationWarning)
        return getattr(config, "inicfg", None) or {}


def _where(config: pytest.Config, key: str, overrides: dict[str, str]) -> str:
    if key in overrides:
        return f" given with -o {overrides[key]}"
    return f" in {config.inipath}" if config.inipath else ""


def check_ini_keys(config: pytest.Config) -> None:
    """UsageError for a key of this plugin's namespace (parity_*, rocm_parity*) that it does not know:
    pytest only warns of an unknown key, so a misspelled parity_golden_dir would quietly put the
    goldens in the default folder."""
    import difflib

    try:
        keys = list(_ini_file(config))
    except Exception:   # an ini pytest could not read is pytest's to report
        return
    # pytest merges -o/--override-ini KEY=VALUE into the ini keys: name the option, not the file
    overrides = {o.split("=", 1)[0].strip(): o for o in (config.getoption("override_ini", None) or [])}
    for key in keys:
        named = key.replace("-", "_")   # a flag's spelling copied into the ini file
        if named != key and named in INI_KEYS:
            raise pytest.UsageError(f"ini key {key}{_where(config, key, overrides)} is written like a flag: ini "
                                    f"keys use underscores, {named} = ...; pytest ignores {key}")
        if named == "parity_regen":
            raise pytest.UsageError(f"ini key {key}{_where(config, key, overrides)}: {REGEN} has no ini key, since "
                                    f"a setting that rewrites goldens on every run would rewrite them in CI too; "
                                    f"give it on the command line of the run that regenerates")
        if (named.startswith("parity_") or named.startswith("rocm_parity")) and key not in INI_KEYS:
            close = difflib.get_close_matches(key, sorted(INI_KEYS), n=1)
            raise pytest.UsageError(f"ini key {key}{_where(config, key, overrides)} is not a pytest-rocm-parity setting"
                                    + (f"; did you mean {close[0]}?" if close else "")
                                    + f" The settings: {', '.join(sorted(INI_KEYS))}")


def addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rocm-parity", "cross-backend numerical parity (pytest-rocm-parity)")

    def add(flag: str, ini: str, help: str, ini_type: str | None = None, default: Any = None, **kw: Any) -> None:
        group.addoption(flag, dest=ini, default=None, help=help, **kw)
        parser.addini(ini, help=help, type=ini_type, default=default)  # type: ignore[arg-type]
        INI_KEYS.add(ini)

    add(ENABLE, "rocm_parity", "run parity checks (tests using the parity fixture/marker are skipped without it)",
        ini_type="bool", default=False, action="store_true")
    add(MODE, "parity_mode", "replay (default): judge against goldens; capture: record goldens on the reference machine",
        type=parse_mode, metavar="replay|capture")
    group.addoption(REGEN, dest="parity_regen", nargs="?", const=REGEN_ALL, default=None, metavar="GLOB",
                    type=parse_regen,
                    help="rewrite the goldens of models whose name matches GLOB (all without GLOB); a golden is "
                         "written only when its test passes")
    add(GOLDEN_DIR, "parity_golden_dir", "golden directory (default: <rootdir>/goldens)", metavar="DIR")
    add(DEVICE, "parity_device", "candidate device: auto (cuda when available, else cpu), cpu, cuda[:N] (ROCm "
        "builds use cuda too), xpu, mps, or model (keep the model's own placement)", type=parse_device,
        metavar="DEVICE")
    add(REPORT, "parity_report", "write parity-report.json (and the HTML/CSV reports) into DIR", metavar="DIR")
    add(ALLOW_WRITE, "parity_allow_write", "allow writing goldens when CI=true", ini_type="bool",
        default=False, action="store_true")
    add(DTYPES, "parity_dtypes", "default precisions, comma-separated (default: deployed dtype + float32)",
        type=parse_dtypes, metavar="LIST")
    add(DRILL, "parity_drill", "sub-module depth captured below each selected block for drill-down (any N >= 0; "
        "default: the deepest whose golden fits the golden-size limit)",
        type=parse_drill, metavar="N")
    add(REPLAY, "parity_replay", "full: propagated and isolated passes; fast: one teacher-forced run of the "
        "candidate's forward plus the deeper levels (docs/judging.md says what it does not judge); auto (default): "
        "fast above 1B parameters",
        type=parse_replay, metavar="auto|full|fast")
    INI_KEYS.add("parity_ladder")
    parser.addini("parity_ladder", type="bool", default=True,
                  help="keep the float32 rung of the precision ladder beside an explicit low-precision dtypes "
                       "list (default true; a check's ladder=False or @pytest.mark.parity(ladder=False) drops it)")
    add(PROFILE, "parity_profile", "profiler parity: record per-operator time shares at capture, flag "
        "operators whose share grew at replay", ini_type="bool", default=False, action="store_true")
    add(PRUNE, "parity_prune_obsolete", "delete obsolete goldens: those no check of this run used whose test file "
        "ran to completion in this run or, after an unfiltered run of the whole suite, no longer exists (never "
        "after a failed, stopped, --lf or deselected run)", ini_type="bool",
        default=False, action="store_true")
    add(PRUNE_DRY_RUN, "parity_prune_dry_run", f"with {PRUNE}: list what it would delete, delete nothing",
        ini_type="bool", default=False, action="store_true")
    add(ALLOW_REFERENCE_CHANGE, "parity_allow_reference_change", "let --parity-regen replace a golden captured "
        "on another device kind (cuda, rocm, cpu) or torch major version, by another project sharing the golden "
        "directory, or by another test that still defines it", ini_type="bool", default=False,
        action="store_true")
    add(GOLDEN_SIZE_LIMIT, "parity_golden_size_limit", "warn when a captured golden is larger than this many MB "
        f"(default {DEFAULT_GOLDEN_SIZE_LIMIT_MB:g}; 0: never)", type=parse_size_limit, metavar="MB")
    add(REQUIRE, "parity_require", f"fail the run when it collects parity tests without {ENABLE}, instead of "
        "skipping them (for a CI job, or an ini file that only CI reads)", ini_type="bool", default=False,
        action="store_true")


@dataclass(frozen=True)
class ParityOptions:
    enabled: bool
    mode: Mode
    regen: str | None
    golden_dir: Path | str        # a path, or an fsspec URL (s3://, gs://, file://, memory://)
    device: str
    report_dir: Path | None
    allow_write: bool
    dtypes: list[str] | None
    drill: int | None              # None: automatic (engine.auto_drill)
    prune: bool
    profile: bool = False
    replay: str = "auto"
    ladder: bool = True            # float32 kept beside explicit low-precision dtypes
    prune_dry_run: bool = False
    allow_reference_change: bool = False
    require: bool = False          # parity tests collected without --rocm-parity fail the run
    golden_size_limit: int | None = int(DEFAULT_GOLDEN_SIZE_LIMIT_MB * 1e6)   # bytes; None: no warning
    # flags the commands we print must repeat: a golden directory given on the command line (an ini
    # key is read again by the printed command; a flag is not)
    command_flags: str = ""

    @property
    def ci(self) -> bool:
        return os.environ.get("CI", "").lower() in ("1", "true", "yes")

    def may_write(self) -> bool:
        return self.allow_write or not self.ci


BOOL_VALUES = "true or false (also yes/no, on/off, 1/0, y/n, t/f, any case)"


def getini(config: pytest.Config, name: str) -> Any:
    """``config.getini``, with a value pytest cannot convert (``rocm_parity = maybe``) as a UsageError
    naming the key, the value and the accepted values, not pytest's internal error."""
    try:
        return config.getini(name)
    except (ValueError, TypeError, pytest.UsageError) as exc:   # pytest >= 9.2 raises its own UsageError
        try:
            value: Any = _ini_file(config).get(name)
        except Exception:   # the raw value is only for the message
            value = None
        where = f" in {config.inipath}" if config.inipath else ""
        flag = {dest: flag for flag, dest in FLAG_DESTS.items()}.get(name)
        raise pytest.UsageError(
            f"ini key {name} = {value!r}{where} is not a boolean" + (f" ({exc})" if value is None else "")
            + f"; accepted values: {BOOL_VALUES}. "
            f"Fix or remove the line" + (f", or pass {flag} on the command line" if flag else "")) from None


def _get(config: pytest.Config, dest: str, parse: Any = None) -> Any:
    v = config.getoption(dest)
    if isinstance(v, str) and not v.strip():
        # an unset shell variable (--parity-golden-dir=$GOLDENS) must not fall back to the default
        flag = next((f for f, d in FLAG_DESTS.items() if d == dest), dest)
        raise pytest.UsageError(f"{flag}={v!r} is empty (a shell variable that is not set, say): give it a "
                                f"value, or leave the flag out for the default")
    if v is None:
        raw = getini(config, dest)
        if raw in (None, "", []):
            return None
        try:
            v = parse(str(raw)) if parse is not None and isinstance(raw, str) else raw
        except pytest.UsageError as exc:   # the parser names the flag: say where the value came from
            where = f" in {config.inipath}" if config.inipath else ""
            raise pytest.UsageError(f"ini key {dest} = {raw!r}{where}: {exc}") from None
    return v


def golden_dir_given(config: pytest.Config) -> bool:
    """Whether the golden directory was set (flag or ini key), not defaulted to <rootdir>/goldens."""
    return bool(_get(config, "parity_golden_dir"))


REPORT_FILE_SUFFIXES = (".html", ".htm", ".json", ".csv")


def report_dir(root: Path, value: str) -> Path:
    """The report folder --parity-report names, checked before the run, not after it: the reports
    are several files (parity-report.json, .html, the CSVs) written into one folder."""
    d = Path(os.path.normpath(root / Path(value).expanduser()))
    fix = f"give a folder, e.g. {REPORT}=parity-report"
    if d.exists() and not d.is_dir():
        raise pytest.UsageError(f"{REPORT}={value!r}: {d} is a file; the reports are written into a folder "
                                f"(parity-report.json, parity-report.html, the CSVs): {fix}")
    if not d.exists() and d.suffix.lower() in REPORT_FILE_SUFFIXES:
        raise pytest.UsageError(f"{REPORT}={value!r} names a file; the reports are written into a folder "
                                f"(parity-report.json, parity-report.html, the CSVs): {fix}")
    existing = next((a for a in (d, *d.parents) if a.exists()), None)
    if existing is not None and not existing.is_dir():
        raise pytest.UsageError(f"{REPORT}={value!r}: {d} cannot be created ({existing} is not a folder): {fix}")
    if existing is not None:
        # a folder made and removed there: permission bits say nothing to root, nor of a read-only
        # mount or a pseudo file system such as /proc
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".parity-report-probe-", dir=existing))
        except OSError as exc:
            raise pytest.UsageError(f"{REPORT}={value!r}: {d} cannot be created (no folder can be made in "
                                    f"{existing}: {exc.strerror or exc}): {fix}") from None
    return d


def from_config(config: pytest.Config) -> ParityOptions:
    """Parse and cross-check options; a bad value is a UsageError naming the flag."""
    root = Path(str(config.rootpath))
    golden = _get(config, "parity_golden_dir")
    report = _get(config, "parity_report")
    device = _get(config, "parity_device", parse_device) or "auto"
    drill = _get(config, "parity_drill", parse_drill)
    opts = ParityOptions(
        enabled=bool(_get(config, "rocm_parity")),
        mode=_get(config, "parity_mode", parse_mode) or Mode.REPLAY,
        regen=config.getoption("parity_regen"),
        golden_dir=(str(golden) if "://" in str(golden) else root / golden) if golden else root / "goldens",
        device=device,
        report_dir=report_dir(root, str(report)) if report else None,
        allow_write=bool(_get(config, "parity_allow_write")),
        dtypes=_get(config, "parity_dtypes", parse_dtypes),
        drill=None if drill is None else int(drill),
        prune=bool(_get(config, "parity_prune_obsolete")),
        profile=bool(_get(config, "parity_profile")),
        replay=_get(config, "parity_replay", parse_replay) or "auto",
        ladder=bool(getini(config, "parity_ladder")),
        prune_dry_run=bool(_get(config, "parity_prune_dry_run")),
        allow_reference_change=bool(_get(config, "parity_allow_reference_change")),
        require=bool(_get(config, "parity_require")),
        golden_size_limit=_size_limit(_get(config, "parity_golden_size_limit", parse_size_limit)),
        command_flags=_command_flags(config),
    )
    if opts.regen is not None and opts.mode is not Mode.CAPTURE:
        # --parity-regen implies capture for the matching models
        opts = ParityOptions(**{**opts.__dict__, "mode": Mode.CAPTURE})
    return opts


# given on the command line, these shape what a capture writes, so a printed capture or regenerate
# command repeats them (ini keys apply to it by themselves)
_GOLDEN_SHAPING = ((GOLDEN_DIR, "parity_golden_dir"), (DTYPES, "parity_dtypes"), (DRILL, "parity_drill"),
                   (PROFILE, "parity_profile"))


def shell_quote(text: str) -> str:
    """Always single-quoted, safe to paste into a shell (test ids hold [ ] and * globs)."""
    q = shlex.quote(text)
    return q if q.startswith("'") else f"'{text}'"


def capture_command(test: str = "", flags: str = "") -> str:
    """The command that captures ``test``'s goldens (every test's without one); ``flags``: those the
    command must repeat (ParityOptions.command_flags)."""
    return f"pytest {ENABLE} {flags}{MODE}=capture" + (f" {shell_quote(test)}" if test else "")


def default_name(test: str) -> str:
    """The check name a test gets without name=: its file and name, without the directory, so that it
    does not change with the rootdir."""
    return test.rsplit("/", 1)[-1]


def regen_command(name: str, test: str = "", flags: str = "") -> str:
    """The command that regenerates the golden ``name`` of ``test``; ``flags`` as capture_command's."""
    return f"pytest {ENABLE} {flags}{REGEN}={shell_quote(name)}" + (f" {shell_quote(test)}" if test else "")


def _command_flags(config: pytest.Config) -> str:
    out = []
    for flag, dest in _GOLDEN_SHAPING:
        v = config.getoption(dest)
        if v is None or v is False:
            continue
        text = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
        out.append(flag if v is True else f"{flag}={shlex.quote(text)}")
    return "".join(f + " " for f in out)


def _size_limit(mb: Any) -> int | None:
    mb = DEFAULT_GOLDEN_SIZE_LIMIT_MB if mb is None else float(mb)
    return int(mb * 1e6) if mb > 0 else None


def given_without_enable(config: pytest.Config) -> list[str]:
    """The --parity-* flags given on the command line, which do nothing without --rocm-parity.

    --parity-device is left out: the parity_ops fixture honours it without --rocm-parity; so is
    --parity-require, which is meant for a run without it.
    """
    flags = {f: d for f, d in FLAG_DESTS.items() if f not in (ENABLE, DEVICE, REQUIRE)}
    # "is not": a value of 0 (--parity-drill=0) equals False, and is given all the same
    return [flag for flag, dest in flags.items() if config.getoption(dest, None) is not None
            and config.getoption(dest, None) is not False]


def xdist_worker_index() -> int | None:
    """gw3 -> 3 under pytest-xdist, None otherwise."""
    w = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(w[2:]) if w.startswith("gw") and w[2:].isdigit() else None


def resolve_device(device: str, worker: int | None = None, ci: bool = False) -> str:
    """'auto' -> cuda when available, else cpu; a named device that is absent is an error.

    Under pytest-xdist an unindexed GPU device is pinned to one GPU per worker (gw<i> -> cuda:<i>),
    so two workers never share a GPU; more workers than GPUs is an error naming the fix. ``ci``
    (CI=true): 'auto' on a ROCm or CUDA build of torch that sees no GPU is an error, not the CPU: a
    GPU job whose container lost its devices would otherwise replay on the CPU and pass.
    """
    import torch

    if device == "model":
        return device
    if device == "auto":
        build = ("ROCm " + str(torch.version.hip)) if getattr(torch.version, "hip", None) else \
            ("CUDA " + str(torch.version.cuda)) if torch.version.cuda else ""
        if ci and build and not torch.cuda.is_available():
            from pytest_rocm_parity.errors import BackendUnavailable

            raise BackendUnavailable(
                f"{DEVICE}=auto: this torch is a {build} build but sees no GPU, so the replay would run on the "
                f"CPU, and a GPU job would pass without its GPU. Give the job its GPU (a ROCm container needs "
                f"--device=/dev/kfd --device=/dev/dri; check with rocm-parity doctor), or pass {DEVICE}=cpu to "
                f"replay on the CPU on purpose")
        device = "cuda" if torch.cuda.is_available() else "cpu"
    base, _, index = device.partition(":")
    if base == "cuda" and not index and worker is not None and torch.cuda.is_available():
        n = torch.cuda.device_count()
        if worker >= n:
            from pytest_rocm_parity.errors import BackendUnavailable

            raise BackendUnavailable(
                f"pytest-xdist worker gw{worker} has no GPU of its own ({n} visible): run one worker per GPU, "
                f"pytest -n {n} --rocm-parity, or pass {DEVICE}=cuda:N to share one on purpose")
        torch.cuda.set_device(worker)
        return f"cuda:{worker}"
    if base == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (index and int(index) >= n):
            from pytest_rocm_parity.errors import BackendUnavailable

            raise BackendUnavailable(
                f"{DEVICE}={device}: this torch ({torch.__version__}) sees {n} CUDA/ROCm device(s). Use "
                f"{DEVICE}=cpu, or install the CUDA or ROCm build of torch for this machine (README)")
    return device
