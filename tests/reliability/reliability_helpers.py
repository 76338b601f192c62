"""A captured golden to damage, and the file surgery the reliability tests do on it."""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pytest_rocm_parity.runner.capture import capture

from pytest_rocm_parity.runner.engine import CheckSpec

from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.golden.store import FAST_DIGEST, MANIFEST, GoldenStore, file_digests
from pytest_rocm_parity.judging.records import CheckResult
from parity_models import tiny, tiny_inputs
from manifest_edits import rewrite_manifest

ENV = {"device": "cpu", "torch": torch.__version__}


@dataclass
class Golden:
    """One golden captured into a temporary store, with the paths a test damages."""

    store: GoldenStore
    spec: CheckSpec
    model: nn.Module
    x: Any

    @property
    def dir(self) -> Path:
        return self.store.dir_for(self.spec.name)

    @property
    def manifest(self) -> Path:
        return self.dir / MANIFEST

    def tensor_file(self, rung: str = "float32") -> Path:
        return self.dir / self.manifest_json()["rungs"][rung]["file"]

    def manifest_json(self) -> dict[str, Any]:
        return json.loads(self.manifest.read_text("utf-8"))

    def write_manifest(self, m: dict[str, Any]) -> None:
        rewrite_manifest(self.manifest, m)

    def capture(self, model: nn.Module | None = None, overwrite: bool = True) -> dict[str, Any]:
        return capture(model or self.model, self.x, self.spec, self.store, "cpu", overwrite=overwrite, env=ENV)

    def replay(self, model: nn.Module | None = None, x: Any = None, spec: CheckSpec | None = None) -> list[CheckResult]:
        return replay(model or self.model, self.x if x is None else x, spec or self.spec, self.store, "cpu", env=ENV)

    def snapshot(self) -> dict[str, bytes]:
        """Every file of the golden directory, for 'nothing lost' comparisons."""
        return {p.name: p.read_bytes() for p in sorted(self.dir.iterdir()) if p.is_file()}

    def reseal(self, rung: str = "float32") -> None:
        """Make the manifest's hash and size agree with the (edited) tensor file again."""
        m = self.manifest_json()
        p = self.dir / m["rungs"][rung]["file"]
        sha, fast = file_digests(p)
        m["rungs"][rung]["sha256"] = sha
        if fast is not None and FAST_DIGEST in m["rungs"][rung]:
            m["rungs"][rung][FAST_DIGEST] = fast
        m["rungs"][rung]["bytes"] = p.stat().st_size
        self.write_manifest(m)


def make_golden(root: Path, name: str = "tiny", model: nn.Module | None = None, x: Any = None,
                dtypes: tuple[str, ...] = ("float32",), **spec: Any) -> Golden:
    g = Golden(GoldenStore(root / "goldens"), CheckSpec(name=name, dtypes=list(dtypes), **spec),
               model if model is not None else tiny(), tiny_inputs() if x is None else x)
    g.capture(overwrite=False)
    return g


def read_header(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_with_header(path: Path, header: dict[str, Any], data: bytes) -> None:
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def message_names(exc: BaseException, path: Path, *fix: str) -> None:
    """The error names the file and says how to fix it."""
    msg = str(exc)
    assert str(path) in msg, msg
    for f in fix:
        assert f in msg, msg
