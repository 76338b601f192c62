"""Editing a golden's manifest in a test, as a capture would have written it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_rocm_parity.golden.store import MANIFEST_DIGEST_KEY, manifest_digest


def rewrite_manifest(path: str | Path, manifest: Any, **dumps: Any) -> None:
    """Write ``manifest`` signed with its own hash, as a capture signs it: a test that edits a field
    to reach a later check (an older golden, a damaged entry) is not stopped by the hash check,
    which tests/reliability/test_damaged.py holds on its own."""
    signed = {**manifest, MANIFEST_DIGEST_KEY: manifest_digest(manifest)} if isinstance(manifest, dict) else manifest
    Path(path).write_text(json.dumps(signed, **dumps) + ("\n" if dumps.get("indent") else ""), "utf-8")
