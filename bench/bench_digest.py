"""Seconds per GiB to read a golden's bytes, and to check them by SHA-256 and by XXH3-128 (the
replay's check where xxhash is installed): the part of a cold replay the integrity check costs
(docs/performance.md). The file is written once and read from the page cache, best of three.

    python bench/bench_digest.py [--gib 1]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from pytest_rocm_parity.golden.store import FAST_DIGEST, digest_matches, file_digests, sha256_file


def best(fn, reps: int = 3) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "golden.bin"
        with open(path, "wb") as f:
            for _ in range(int(a.gib * 256)):
                f.write(os.urandom(1 << 22))
        _, fast = file_digests(path)

        def read() -> None:
            with open(path, "rb") as f:
                while f.read(1 << 22):
                    pass

        row = {"gib": a.gib, "read_s_per_gib": best(read) / a.gib,
               "sha256_s_per_gib": best(lambda: sha256_file(path)) / a.gib,
               f"{FAST_DIGEST}_s_per_gib": best(lambda: digest_matches(path, f"{FAST_DIGEST}:{fast}")) / a.gib}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
