"""The ``rocm-parity`` command: a thin argparse front over the core modules.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; the modules are imported only when their command runs so
``rocm-parity --help`` stays instant.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from pytest_rocm_parity.errors import ParityError

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("pytest_rocm_parity.doctor", "check this machine's GPU stack for a CUDA-to-ROCm migration"),
    "scan": ("pytest_rocm_parity.scan", "list custom CUDA kernels and CUDA-only constructs in a codebase"),
    "show": ("pytest_rocm_parity.inspect_cmd", "print a golden's manifest and per-layer summary"),
    "diff": ("pytest_rocm_parity.inspect_cmd", "compare two goldens layer by layer"),
    "golden": ("pytest_rocm_parity.inspect_cmd", "manage a golden directory: prune [--dry-run] GOLDEN_DIR"),
    "ops": ("pytest_rocm_parity.opsuite", "run the built-in operator fuzz suite on a backend"),
}


def version_text() -> str:
    from pytest_rocm_parity import __version__

    return f"rocm-parity {__version__} (pytest-rocm-parity, Python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocm-parity", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(module)
        adder = getattr(mod, f"add_{name}_arguments", None) or mod.add_arguments
        adder(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    mod = importlib.import_module(COMMANDS[args.command][0])
    runner = getattr(mod, f"run_{args.command}", None) or mod.run
    try:
        return int(runner(args))
    except ParityError as exc:
        from pytest_rocm_parity.colour import enabled, paint

        print(f"rocm-parity {args.command}: {paint('error:', 'red+bold', enabled(sys.stderr))} {exc}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
