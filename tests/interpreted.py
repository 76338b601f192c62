"""Run a script in a process of its own under Triton's CPU interpreter and read what it printed:
Triton reads TRITON_INTERPRET when it is imported, so a test process that has imported Triton
already cannot switch it on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_interpreted(script: str, *args: str, cwd: Path | None = None, timeout: int = 300) -> Any:
    """The JSON the script printed last, once it exited 0 (else the assertion shows its stderr)."""
    p = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout,
                       cwd=cwd, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])
