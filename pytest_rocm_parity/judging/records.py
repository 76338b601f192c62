"""Plain result records: comparison produces them, one place turns them into failures/reports."""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class LeafMetrics:
    """Error statistics of one tensor leaf of one module call (all floats are plain Python)."""

    leaf: str
    numel: int
    kind: str = "float"          # float | exact (int/bool) | complex
    err_cand: float = 0.0        # RMSE(candidate - truth)
    err_ref: float = 0.0         # RMSE(reference - truth)
    rms_truth: float = 0.0
    ratio: float = 0.0           # err_cand / max(err_ref, floor)
    ratio_lo: float = 0.0        # lower confidence bound of ratio (jackknife over blocks)
    z: float = 0.0               # paired sign test: candidate farther from truth than reference
    rel_to_ref: float = 0.0      # ||cand - ref|| / ||ref||
    max_abs_to_ref: float = 0.0
    nonfinite: int = 0           # non-finite candidate elements where the reference is finite
    first_nonfinite: list[int] | None = None
    mismatches: int = 0          # exact kinds: differing elements
    note: str = ""
    noise: float = 0.0           # activation-quantization noise RMS the candidate may add (quant/allowance.py)
    untied: int = 0              # exact kinds: tokens whose choices differ where the reference's scores do not tie

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def allow_noise(self, noise: float) -> None:
        """Judge this leaf against ``noise`` (an FP8 candidate's activation-quantization noise,
        quant/allowance.py) where it exceeds the reference's error: the ratio becomes err_cand / noise."""
        self.noise = noise
        if noise > self.err_ref:
            self.ratio = self.ratio_lo = self.err_cand / noise

    def allow_spread(self, spread: float) -> None:
        """Judge this propagated leaf against ``spread``, its own run-to-run RMS difference on the
        candidate, where that exceeds the reference's error: a quantity the candidate does not
        compute repeatably (a backward that adds with atomics) is held to what two of its own runs
        agree on. The propagated rule reads err_ref (Rule.propagated_ratio)."""
        self.err_ref = max(self.err_ref, spread)


def module_of(key: str) -> str:
    """The module name of a call key (``blocks.0.proj#1`` -> ``blocks.0.proj``)."""
    return _CALL.sub("", key)


_CALL = re.compile(r"#\d+$")

NOT_CALLED = "not called in the candidate (fused or bypassed): judged through its parent and the outputs"


@dataclass
class LayerRecord:
    """One module call judged twice: isolated (fed golden inputs) and propagated (whole model)."""

    name: str
    level: int = 0
    primary: str = ""            # the top-level selected module that contains it
    passed: bool = True
    iso_passed: bool = True
    prop_passed: bool = True
    budget: float = 0.0          # allowed isolated ratio
    prop_budget: float = 0.0     # allowed propagated multiplier
    iso: LeafMetrics | None = None     # worst leaf, isolated replay
    prop: LeafMetrics | None = None    # worst leaf, propagated replay
    would_pass_ratio: float | None = None
    reason: str = ""
    # whether the reference's call made a discrete choice on its activations (a comparison, top-k,
    # rounding: capture's data flow); None for a golden that did not record it
    decides: bool | None = None

    @property
    def module(self) -> str:
        """The module's name: a module called several times has a record per call, ``name#1`` for its
        second (golden-format.md)."""
        return module_of(self.name)

    def holds(self, other: LayerRecord) -> bool:
        """Whether ``other`` is a module inside this one (any call of it)."""
        return other.module.startswith(self.module + ".")

    @property
    def not_called(self) -> bool:
        """The candidate never called this module (a fused kernel used its weights): nothing judged it."""
        return self.reason == NOT_CALLED

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"level": self.level, "budget_ratio": self.budget, "budget_propagated": self.prop_budget}
        if self.iso is not None:
            out.update({f"iso_{k}": v for k, v in self.iso.to_dict().items()})
        if self.prop is not None:
            out.update({f"prop_{k}": v for k, v in self.prop.to_dict().items()})
        if self.reason:
            out["reason"] = self.reason
        if self.would_pass_ratio is not None:
            out["would_pass_ratio"] = self.would_pass_ratio
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "iso_passed": self.iso_passed,
                "prop_passed": self.prop_passed, "primary": self.primary, "metrics": self.metrics()}


@dataclass
class CheckResult:
    """The verdict of one model at one dtype rung."""

    test: str
    name: str
    dtype: str
    passed: bool
    culprit: str | None = None
    culprit_block: str | None = None
    first_divergent: str | None = None
    layers: list[LayerRecord] = field(default_factory=list)
    outputs: list[LayerRecord] = field(default_factory=list)
    reference_env: dict[str, Any] = field(default_factory=dict)
    candidate_env: dict[str, Any] = field(default_factory=dict)
    golden: str = ""
    kind: str = "model"          # model | lm | train
    extra: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # the command that regenerates its golden, with the run's golden-shaping flags (a golden
    # directory given on the command line, the dtypes): for the failure's message
    regen: str = ""

    def to_frame(self) -> pd.DataFrame:
        """A pandas DataFrame with one row per layer (then the model outputs, ``kind='output'``): the
        columns of a report's ``layers.csv`` (:func:`layer_rows`), so one schema answers both."""
        return layers_frame(layer_rows({"checks": [self.to_dict()]}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "test": self.test, "name": self.name, "dtype": self.dtype, "passed": self.passed,
            "culprit": self.culprit, "culprit_block": self.culprit_block,
            "first_divergent": self.first_divergent,
            "reference_env": self.reference_env, "candidate_env": self.candidate_env,
            "golden": self.golden, "kind": self.kind,
            "layers": [l.to_dict() for l in self.layers],
            "outputs": [o.to_dict() for o in self.outputs],
            "extra": self.extra, "notes": self.notes,
        }


def layer_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per check x layer of a report document (model outputs too, ``kind='output'``), every
    metric of ``LayerRecord.metrics`` flattened into a column: the rows of ``layers.csv``."""
    rows = []
    for c in doc.get("checks", []):
        for kind, items in (("layer", (c.get("layers") or [])), ("output", (c.get("outputs") or []))):
            for i, l in enumerate(items):
                m = l.get("metrics") or {}
                row: dict[str, Any] = {
                    "test": c.get("test", ""), "check": c.get("name", ""), "dtype": c.get("dtype", ""),
                    "check_passed": c.get("passed"), "kind": kind, "order": i, "layer": l.get("name", ""),
                    "primary": l.get("primary", ""), "passed": l.get("passed"),
                    "iso_passed": _run_verdict(l.get("iso_passed"), "iso_ratio" in m),
                    "prop_passed": _run_verdict(l.get("prop_passed"), "prop_ratio" in m),
                    "is_culprit": l.get("name") == c.get("culprit"),
                    "is_first_divergent": l.get("name") == c.get("first_divergent"),
                    "is_undecided": l.get("name") in ((c.get("extra") or {}).get("undecided") or []),
                }
                for k, v in m.items():
                    row[k] = json.dumps(v) if isinstance(v, (list, dict)) else v
                rows.append(row)
    return rows


def _run_verdict(passed: bool | None, measured: bool) -> bool | None:
    """A row's verdict of one run (isolated or propagated): None where that run did not judge the
    row (a sub-module has no propagated run, a model output no isolated one), so that a filter on
    the column does not count it as passing; a failure without a measurement (a gradient the
    candidate never produced) stays False."""
    return passed if measured or passed is False else None


def layers_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The DataFrame of layer rows (:func:`layer_rows`): the columns of ``layers.csv``, the per-run
    verdicts as pandas' nullable booleans (NA where the run did not judge the row)."""
    from pytest_rocm_parity.tables import frame

    df = frame(rows, layer_columns(rows))
    for col in ("iso_passed", "prop_passed"):
        df[col] = df[col].astype("boolean")
    return df


def layer_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The columns of layer rows: every field a row can carry, in a fixed order, whatever the results
    (a run with no failure still has ``reason``), then any other key the rows hold."""
    leaf = [f.name for f in dataclasses.fields(LeafMetrics)]
    fixed = ["test", "check", "dtype", "check_passed", "kind", "order", "layer", "primary", "passed", "iso_passed",
             "prop_passed", "is_culprit", "is_first_divergent", "is_undecided", "level", "budget_ratio", "budget_propagated",
             *(f"iso_{k}" for k in leaf), *(f"prop_{k}" for k in leaf), "reason", "would_pass_ratio"]
    seen = dict.fromkeys(fixed)
    for r in rows:
        seen.update(dict.fromkeys(r))
    return list(seen)
