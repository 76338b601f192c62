"""Session-scoped goldens for the detection catalogue: captured once, each case replayed once (all rungs)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))

import catalogue as C  # noqa: E402


class Catalogue:
    """Captured clean models plus a cache of replays: {case id: {rung: CheckResult}}."""

    def __init__(self, root: Path) -> None:
        import torch

        torch.set_num_threads(min(2, torch.get_num_threads()))
        self.root = root
        self.models = C.capture_all(root)
        self._replays: dict[str, dict[str, Any]] = {}

    def outcome(self, case: C.Case, ladder: str) -> C.Outcome:
        if case.id not in self._replays:
            self._replays[case.id] = C.replay_case(case, self.models, self.root)
        return C.outcome(case, ladder, self._replays[case.id])


@pytest.fixture(scope="session")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> Catalogue:
    return Catalogue(tmp_path_factory.mktemp("detection-goldens"))
