"""pytest entry point: options, marker, the ``parity`` fixture and hook wiring. No logic, no torch.

Loading this module must stay cheap and silent; the ParitySession that does the
work is registered only when --rocm-parity is given.
"""
from __future__ import annotations

from typing import Any

import pytest

from pytest_rocm_parity import options as opt

SESSION_KEY: pytest.StashKey[Any] = pytest.StashKey()
SKIP_REASON = f"parity checks run only with {opt.ENABLE} (or rocm_parity = true in the ini file)"
IGNORED_KEY: pytest.StashKey[list[str]] = pytest.StashKey()


def _ignored_message(flags: list[str]) -> str:
    return (f"rocm-parity: {', '.join(flags)} given without {opt.ENABLE}: ignored, and the parity tests are "
            f"skipped. Add {opt.ENABLE} (or rocm_parity = true in the ini file) to run them")


def pytest_addoption(parser: pytest.Parser) -> None:
    opt.addoption(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "parity(dtypes=None, layers=None, tolerance=None, drill=None, sketch=None, replay=None, ladder=None): "
        "a cross-backend parity test; "
        f"the keyword arguments are defaults for its parity.check calls. Skipped without {opt.ENABLE}.",
    )
    opt.check_ini_keys(config)
    options = opt.from_config(config)
    if not options.enabled:
        ignored = opt.given_without_enable(config)
        if ignored:
            config.stash[IGNORED_KEY] = ignored
            config.issue_config_time_warning(pytest.PytestWarning(_ignored_message(ignored)), stacklevel=2)
        return
    if options.mode is opt.Mode.CAPTURE and not options.may_write():
        # per check, capture skips a golden that exists: a CI job misconfigured into capture mode
        # would skip every test and pass without judging anything
        raise pytest.UsageError(
            f"{opt.REGEN if options.regen is not None else opt.MODE + '=capture'} under CI=true: goldens are "
            f"captured on the reference machine and committed, not written in CI, and a capture run judges nothing. "
            f"Replay with {opt.ENABLE} alone, or pass {opt.ALLOW_WRITE} for a dedicated capture job.")
    from pytest_rocm_parity.session import ParitySession

    session = ParitySession(config, options)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "rocm_parity_session")
    from pytest_rocm_parity.reports.html_extras import register as register_html_extras

    register_html_extras(config, session)  # adds plots to pytest-html's page when it is installed


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SESSION_KEY in config.stash:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    skipped = 0
    for item in items:
        if "parity" in getattr(item, "fixturenames", ()) or item.get_closest_marker("parity") is not None:
            item.add_marker(skip)
            skipped += 1
    why = _skipping_fails(config, "run")
    if why and skipped:
        # a forgotten --rocm-parity would turn a CI job green with every parity test skipped
        raise pytest.UsageError(
            f"{why}: the parity tests would be skipped and "
            f"the job would pass without judging anything (counted at collection: {skipped}, those that name the "
            f"parity fixture as an argument or carry the parity marker; a test that takes the fixture through "
            f"request.getfixturevalue is seen only when it runs, and fails then)")


def _skipping_fails(config: pytest.Config, what: str) -> str:
    """Why this run fails its parity tests instead of skipping them without --rocm-parity ('' where
    it skips them): parity options given under CI=true, or --parity-require (ini parity_require).
    ``what``: the run, or the test (one that takes the fixture through request.getfixturevalue)."""
    ignored = _ignored_under_ci(config)
    if ignored:
        return f"{_ignored_message(ignored)}. Under CI=true this fails the {what}"
    if opt.from_config(config).require:
        return (f"rocm-parity: {opt.REQUIRE} (or parity_require = true in the ini file) is set, and {opt.ENABLE} "
                f"is not given (nor rocm_parity = true in the ini file). Add {opt.ENABLE} to run the parity tests, "
                f"or leave them out of this run (--ignore=PATH). {opt.REQUIRE} fails the {what}")
    return ""


def _ignored_under_ci(config: pytest.Config) -> list[str]:
    """The parity options given without --rocm-parity when CI=true, which make skipped parity tests an
    error; [] otherwise."""
    ignored = list(config.stash.get(IGNORED_KEY, None) or [])
    if config.getoption(opt.FLAG_DESTS[opt.DEVICE], None) is not None:
        # not warned about (the parity_ops fixture honours it alone), but a CI job that sets it for
        # parity tests meant to run them
        ignored.append(opt.DEVICE)
    return ignored if ignored and opt.from_config(config).ci else []


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return None
    o = session.options
    lines = [f"rocm-parity: mode={o.mode.value} device={o.device} goldens={o.golden_dir}"
             + (f" regen={o.regen}" if o.regen else "")]
    if config.inipath is None and not opt.golden_dir_given(config):
        lines.append(f"rocm-parity: no pytest configuration file, so the goldens' place follows pytest's rootdir, which "
                     f"the arguments and the working directory decide; pin it: a pytest.ini (or "
                     f"[tool.pytest.ini_options] in pyproject.toml) at the repository root, or parity_golden_dir")
    try:
        from pytest_rocm_parity.migration.doctor import header_lines

        lines += header_lines()
    except Exception as exc:  # the header must never break a run
        lines.append(f"rocm-parity: environment summary unavailable ({type(exc).__name__}: {exc})")
    return lines


@pytest.fixture
def parity(request: pytest.FixtureRequest) -> Any:
    """Per-layer cross-backend parity: ``parity.check(model, inputs)``; see the README."""
    session = request.config.stash.get(SESSION_KEY, None)
    if session is None:
        why = _skipping_fails(request.config, "test")
        if why:   # a test that takes the fixture through request.getfixturevalue: collection did not see it
            pytest.fail(f"{why}: skipped, it would let the job pass without judging anything", pytrace=False)
        pytest.skip(SKIP_REASON)
    from pytest_rocm_parity.api import Parity

    return Parity(session, request.node)


@pytest.fixture(scope="session")
def parity_ops(request: pytest.FixtureRequest) -> Any:
    """Session-scoped operator checker for Hypothesis ``@given`` tests (no function-scoped health check).

    ``parity_ops.compare_op(candidate, reference, *args)`` runs on ``--parity-device``; it needs no
    goldens, so it is not gated by --rocm-parity.
    """
    from pytest_rocm_parity.api import OpChecker

    return OpChecker(opt.resolve_device(opt.from_config(request.config).device))
