"""``python -m pytest_rocm_parity``: the ``rocm-parity`` command, for environments whose scripts
directory is not on PATH (a venv not activated, ``pip install --user``)."""
from __future__ import annotations

import sys

from pytest_rocm_parity.cli import main

if __name__ == "__main__":
    sys.exit(main())
