"""Plugin load cost: `pytest --collect-only` on an empty project, with and without the plugin.

    python bench/bench_import.py [--reps 15]

Alternates the two variants so machine load affects both alike; reports medians.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(cwd: Path, extra: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra],
                   cwd=cwd, capture_output=True, check=False)
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=15)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cwd = Path(d)
        (cwd / "test_empty.py").write_text("def test_nothing():\n    pass\n")
        on, off = [], []
        run(cwd, [])
        for _ in range(a.reps):
            on.append(run(cwd, []))
            off.append(run(cwd, ["-p", "no:rocm_parity"]))
    m_on, m_off = statistics.median(on), statistics.median(off)
    # Less noisy: the import itself, in a fresh interpreter that already has pytest loaded.
    code = ("import time, pytest; t = time.perf_counter(); import pytest_rocm_parity.plugin; "
            "print(time.perf_counter() - t)")
    imp = statistics.median(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                  check=True).stdout) for _ in range(a.reps))
    print(f"import pytest_rocm_parity.plugin: {imp * 1e3:.1f} ms (median of {a.reps})")
    print(f"with plugin {m_on * 1e3:.0f} ms, without {m_off * 1e3:.0f} ms, cost {(m_on - m_off) * 1e3:+.0f} ms "
          f"(median of {a.reps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
