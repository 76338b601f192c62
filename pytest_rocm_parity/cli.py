"""The ``rocm-parity`` command: a thin argparse front over the core modules.

``COMMANDS`` is the whole command line: each entry names the function that adds the
command's arguments and the function that runs it (``module:function``). Modules are
imported only when their command is parsed or run, so ``rocm-parity --help`` stays instant.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_rocm_parity.errors import ParityError


@dataclass(frozen=True)
class Command:
    """One subcommand: ``arguments`` adds its options to a parser, ``run`` returns the exit status."""

    arguments: str   # "module:function" taking an argparse parser
    run: str         # "module:function" taking the parsed namespace
    help: str


COMMANDS: dict[str, Command] = {
    "doctor": Command("pytest_rocm_parity.migration.doctor:add_doctor_arguments", "pytest_rocm_parity.migration.doctor:run_doctor",
                      "check this machine's GPU stack for a CUDA-to-ROCm migration"),
    "scan": Command("pytest_rocm_parity.migration.scan:add_scan_arguments", "pytest_rocm_parity.migration.scan:run_scan",
                    "list custom CUDA kernels and CUDA-only constructs in a codebase"),
    "show": Command("pytest_rocm_parity.reports.inspect_cmd:add_show_arguments", "pytest_rocm_parity.reports.inspect_cmd:run_show",
                    "print a golden's manifest and per-layer summary"),
    "diff": Command("pytest_rocm_parity.reports.inspect_cmd:add_diff_arguments", "pytest_rocm_parity.reports.inspect_cmd:run_diff",
                    "compare two goldens layer by layer"),
    "golden": Command("pytest_rocm_parity.reports.inspect_cmd:add_golden_arguments", "pytest_rocm_parity.cli:run_golden",
                      "manage a golden directory: prune obsolete goldens, derive one from another"),
    "ops": Command("pytest_rocm_parity.fuzz.opsuite:add_ops_arguments", "pytest_rocm_parity.fuzz.opsuite:run_ops",
                   "run the built-in operator fuzz suite on a backend"),
}


def resolve(target: str) -> Callable[..., Any]:
    """The function a ``module:function`` string names."""
    module, _, name = target.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


def run_golden(args: argparse.Namespace) -> int:
    """``rocm-parity golden``: prune runs the suite of the project its goldens record (_prune_where)."""
    if args.golden_command == "prune":
        _prune_where(args)
    return int(resolve("pytest_rocm_parity.reports.inspect_cmd:run_golden")(args))


def _prune_where(args: argparse.Namespace) -> None:
    """Point prune's run of the suite at the project the goldens' manifests record, or refuse.

    A run proves goldens obsolete by their test ids, which are relative to pytest's rootdir: run from
    a folder above the project, pytest would collect every test below that folder (other projects'
    among them) and the project's under other ids, and find none of the goldens' tests. Given no
    test paths there, the run goes to the project's folder; a ``--rootdir`` naming another folder is
    refused. Goldens that record no project (older captures) or several (a shared directory) leave
    the choice to pytest, as before.
    """
    from pytest_rocm_parity.errors import InvalidArgument
    from pytest_rocm_parity.golden.store import GoldenStore

    root = Path(args.golden_dir)
    if not root.is_dir():
        return   # the prune command says what is wrong with it
    projects = GoldenStore(root).projects()
    if len(projects) != 1 or not next(iter(projects)).is_dir():
        return
    (project,) = projects
    here = Path.cwd().resolve()
    extra = [a for a in args.pytest_args or [] if a != "--"]
    rootdir = _option_value(extra, "--rootdir")
    if rootdir is not None:
        if (here / rootdir).resolve() != project:
            raise InvalidArgument(
                f"{args.golden_dir}: its goldens record the project at {project} (each manifest's project: the "
                f"rootdir of the run that captured it), and --rootdir={rootdir} names another folder, from which "
                f"their tests are not collected under the ids they record, so the run would prove nothing about "
                f"them. Run it from the project: cd {project} && rocm-parity golden prune "
                f"{os.path.relpath(root.resolve(), project)}")
        return
    if project == here or not project.is_relative_to(here) or _option_value(extra, "-c", "--config-file"):
        return
    if any(not a.startswith("-") and Path(a.split("::", 1)[0]).exists() for a in extra):
        return   # test paths given: pytest finds their project's configuration from them
    print(f"rocm-parity golden prune: running in {project}, the project these goldens record (from {here}, "
          f"pytest would collect every test below it, and the project's under other ids than the goldens name)",
          flush=True)
    args.golden_dir = str(root.resolve())
    os.chdir(project)


def _option_value(argv: list[str], *flags: str) -> str | None:
    """The value of the last of ``flags`` in ``argv`` (``--flag=V`` or ``--flag V``), None if absent."""
    found = None
    for i, a in enumerate(argv):
        for flag in flags:
            if a.startswith(flag + "="):
                found = a[len(flag) + 1:]
            elif a == flag and i + 1 < len(argv):
                found = argv[i + 1]
    return found


def version_text() -> str:
    from pytest_rocm_parity import __version__

    return f"rocm-parity {__version__} (pytest-rocm-parity, Python {sys.version.split()[0]})"


# The namespace attribute holding the subcommand words the user typed ("golden", "derive"): errors name them.
COMMAND_PATH = "command_path"


class _Subcommands(argparse._SubParsersAction):
    """Parses a subcommand's arguments strictly, so that an argument it does not take is reported with that
    subcommand's usage and name ("rocm-parity doctor: error: unrecognized arguments: --bogus"), not left
    for the top-level parser, whose usage names no option of the subcommand; and records the words typed."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        name, rest = values[0], list(values[1:])
        if name not in self.choices:
            super().__call__(parser, namespace, values, option_string)   # argparse's "invalid choice" error
            return
        if self.dest is not argparse.SUPPRESS:
            setattr(namespace, self.dest, name)
        sub = self.choices[name].parse_args(rest)
        for key, value in vars(sub).items():
            setattr(namespace, key, value)
        setattr(namespace, COMMAND_PATH, [name, *getattr(sub, COMMAND_PATH, [])])


class _Parser(argparse.ArgumentParser):
    """argparse with two fixes the subcommands share: strict subcommand parsing (_Subcommands), and a
    positional that takes the rest of the line (``nargs=REMAINDER``, e.g. prune's PYTEST_ARGS) counted as
    optional, as its help says, so a usage error does not list it among the required arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.nargs == argparse.REMAINDER and not action.option_strings:
            action.required = False
        return action


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rocm-parity", description="Cross-backend numerical parity of PyTorch models: check the migration environment (doctor), scan code for CUDA-only constructs (scan), inspect, compare and manage goldens (show, diff, golden prune, golden derive), fuzz operators (ops).")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        resolve(cmd.arguments)(sub.add_parser(name, help=cmd.help, description=cmd.help))
    return parser


def _without_command_prefix(message: str, words: list[str], argv: Sequence[str] | None) -> str:
    """The message without a leading "<command>: " that repeats a word of the prefix the CLI prints (some
    errors name their command for callers outside the CLI). A prefix that is an argument the user typed
    (a golden directory named "prune") is the message's subject and stays."""
    typed = list(sys.argv[1:] if argv is None else argv)
    for word in words:
        if message.startswith(f"{word}: ") and typed.count(word) <= 1:
            return message[len(word) + 2:]
    return message


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(resolve(COMMANDS[args.command].run)(args))
    except ParityError as exc:
        from pytest_rocm_parity.colour import enabled, paint

        words = getattr(args, COMMAND_PATH, None) or [args.command]
        print(f"rocm-parity {' '.join(words)}: {paint('error:', 'red+bold', enabled(sys.stderr))} "
              f"{_without_command_prefix(str(exc), words, argv)}", file=sys.stderr)
        return 2
    except BrokenPipeError:   # the reader went away (`| head`): not an error of this command
        # stdout's buffered rest would fail again at exit; point it at devnull, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
