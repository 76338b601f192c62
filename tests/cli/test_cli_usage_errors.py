"""Usage and run-time errors name the subcommand the user typed: its usage for an argument it does not
take, its full name ("rocm-parity golden derive") before a run-time error, no prefix said twice, and no
optional argument listed as required."""
from __future__ import annotations

from pathlib import Path

import pytest

from pytest_rocm_parity import cli


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(("argv", "prog", "bad"), [
    (["doctor", "--bogus"], "rocm-parity doctor", "--bogus"),
    (["scan", "{tmp}", "extra"], "rocm-parity scan", "extra"),
    (["ops", "--bogus", "x"], "rocm-parity ops", "--bogus x"),
    (["golden", "derive", "{tmp}", "g", "--to", "h", "--bogus"], "rocm-parity golden derive", "--bogus"),
    (["--bogus", "doctor"], "rocm-parity", "--bogus"),      # the top level's own unknown argument
])
def test_an_unknown_argument_gets_the_usage_of_the_command_that_refused_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], prog: str, bad: str) -> None:
    lines = _usage_error(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert lines[0].startswith(f"usage: {prog} "), lines
    assert lines[-1] == f"{prog}: error: unrecognized arguments: {bad}", lines


def test_prune_lists_only_its_required_argument(capsys: pytest.CaptureFixture[str]) -> None:
    """PYTEST_ARGS has a default (pytest's own test paths), as prune's help says: not required."""
    lines = _usage_error(capsys, ["golden", "prune"])
    assert lines[-1] == "rocm-parity golden prune: error: the following arguments are required: GOLDEN_DIR", lines
    args = cli.build_parser().parse_args(["golden", "prune", "goldens", "-x", "tests/"])
    assert args.golden_dir == "goldens" and args.pytest_args == ["-x", "tests/"]
    assert cli.build_parser().parse_args(["golden", "prune", "goldens"]).pytest_args == []


@pytest.mark.parametrize(("argv", "prefix"), [
    (["golden", "derive", "{tmp}", "g", "--to", "h"], "rocm-parity golden derive: error: {tmp}: "),
    (["golden", "prune", "{tmp}/none"], "rocm-parity golden prune: error: {tmp}/none: no such golden directory"),
    (["scan", "{tmp}/none"], "rocm-parity scan: error: PATH='{tmp}/none' does not exist"),
])
def test_a_run_time_error_names_the_whole_subcommand_once(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          argv: list[str], prefix: str) -> None:
    assert cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(prefix.replace("{tmp}", str(tmp_path))), err


def test_a_subject_named_like_the_command_is_kept(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A golden directory called "prune" starts the message as its subject, not as a repeated prefix."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["golden", "prune", "prune"]) == 2
    assert capsys.readouterr().err.startswith("rocm-parity golden prune: error: prune: no such golden directory")


def test_a_missing_path_named_like_the_command_is_said_once(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The scanner's own message names no command: the CLI's prefix does, once, whatever the path."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["scan", "scan"]) == 2
    assert capsys.readouterr().err.startswith("rocm-parity scan: error: PATH='scan' does not exist")
