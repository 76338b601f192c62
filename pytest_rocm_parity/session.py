"""Run state of one pytest session with --rocm-parity: results, golden bookkeeping, reports."""
from __future__ import annotations

import fnmatch
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_rocm_parity.options import REGEN_ALL, Mode, ParityOptions, resolve_device, xdist_worker_index

WORKER_KEY = "rocm_parity_results"


@dataclass
class GoldenLog:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {"created": self.created, "updated": self.updated, "missing": self.missing,
                "kept": self.kept, "used": sorted(self.used)}

    def merge(self, other: dict[str, Any]) -> None:
        for k in ("created", "updated", "missing", "kept"):
            getattr(self, k).extend(x for x in other.get(k, []) if x not in getattr(self, k))
        self.used.update(other.get("used", []))


class ParitySession:
    """Registered as a plugin only when --rocm-parity is on; reached through config.stash."""

    def __init__(self, config: pytest.Config, options: ParityOptions) -> None:
        self.config = config
        self.options = options
        from pytest_rocm_parity.remote import open_store

        self.store = open_store(options.golden_dir)
        self.results: list[dict[str, Any]] = []
        self.result_objects: list[Any] = []
        self.goldens = GoldenLog()
        self._device: str | None = None
        self._env: dict[str, Any] | None = None
        self.obsolete: list[str] = []
        self.pruned: list[str] = []

    # -- facts computed on first use, so a session that runs no check never imports torch ----
    @property
    def device(self) -> str:
        if self._device is None:
            self._device = resolve_device(self.options.device, xdist_worker_index())
        return self._device

    @property
    def env(self) -> dict[str, Any]:
        if self._env is None:
            from pytest_rocm_parity.backend import collect_env

            dev = self.device
            if dev == "model":  # a split model: describe the accelerator it is split over
                import torch

                dev = "cuda" if torch.cuda.is_available() else "cpu"
            self._env = collect_env(dev)
        return self._env

    def regen_matches(self, name: str) -> bool:
        g = self.options.regen
        return g is not None and (g == REGEN_ALL or name == g or fnmatch.fnmatchcase(name, g))

    @property
    def capturing(self) -> bool:
        return self.options.mode is Mode.CAPTURE

    def add(self, result: Any) -> None:
        self.result_objects.append(result)
        self.results.append(result.to_dict())

    # -- xdist: workers ship results to the controller ---------------------------------------
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKER_KEY] = json.dumps({"results": self.results, "goldens": self.goldens.to_dict()})
            return
        self.find_obsolete()
        if self.options.report_dir is not None:
            self.write_reports(self.options.report_dir)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        data = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if data:
            payload = json.loads(data)
            self.results.extend(payload["results"])
            self.goldens.merge(payload["goldens"])

    def find_obsolete(self) -> None:
        if not self.goldens.used:
            return  # nothing ran (e.g. -k deselected everything): do not call every golden obsolete
        for name, d in self.store.names_on_disk():
            if name not in self.goldens.used and self._collected_all:
                self.obsolete.append(name)
                if self.options.prune and not hasattr(self.store, "url"):  # remote stores are never pruned
                    shutil.rmtree(d, ignore_errors=True)
                    self.pruned.append(name)

    _collected_all = True

    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list[Any]) -> None:
        # Obsolete goldens are only named when the whole suite was collected unfiltered.
        self._collected_all = not (config.getoption("keyword") or config.getoption("markexpr")
                                   or any("::" in a for a in config.args))

    def write_reports(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        doc = {"schema": 1, "checks": sorted(self.results, key=lambda r: (r["test"], r["name"], r["dtype"])),
               "goldens": {**self.goldens.to_dict(), "obsolete": self.obsolete, "pruned": self.pruned}}
        tmp = out / ".parity-report.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
        tmp.replace(out / "parity-report.json")
        try:
            from pytest_rocm_parity import report
        except ImportError:
            return
        report.write_all(doc, out)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from pytest_rocm_parity.summary import summary_lines

        for line in summary_lines(self):
            terminalreporter.write_line(line)
