"""Plain result records: comparison produces them, one place turns them into failures/reports."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

LAYER_COLUMNS = ("name", "kind", "level", "block", "passed", "iso_passed", "prop_passed", "iso_ratio",
                 "ratio_lower_bound", "z", "budget", "prop_ratio", "prop_budget", "rel_to_ref", "culprit", "reason")


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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def allow_noise(self, noise: float) -> None:
        """Judge this leaf against ``noise`` (an FP8 candidate's activation-quantization noise,
        quant/allowance.py) where it exceeds the reference's error: the ratio becomes err_cand / noise."""
        self.noise = noise
        if noise > self.err_ref:
            self.ratio = self.ratio_lo = self.err_cand / noise


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

    def layer_rows(self) -> list[dict[str, Any]]:
        """One dict per judged module call (model outputs last, ``kind='output'``): the columns of
        :meth:`to_frame`."""
        rows = []
        for kind, records in (("layer", self.layers), ("output", self.outputs)):
            for l in records:
                iso, prop = l.iso, l.prop
                rows.append({
                    "name": l.name, "kind": kind, "level": l.level, "block": l.primary, "passed": l.passed,
                    "iso_passed": l.iso_passed, "prop_passed": l.prop_passed,
                    "iso_ratio": iso.ratio if iso else None, "ratio_lower_bound": iso.ratio_lo if iso else None,
                    "z": iso.z if iso else None, "budget": l.budget,
                    "prop_ratio": prop.ratio if prop else None, "prop_budget": l.prop_budget,
                    "rel_to_ref": prop.rel_to_ref if prop else None,
                    "culprit": l.name == self.culprit, "reason": l.reason,
                })
        return rows

    def to_frame(self) -> pd.DataFrame:
        """A pandas DataFrame with one row per layer (then the model outputs): name, kind, level,
        block, passed, the isolated ratio with its lower bound, z and budget, the propagated ratio
        and budget, whether it is the culprit, and the reason."""
        from pytest_rocm_parity.tables import frame

        return frame(self.layer_rows(), columns=LAYER_COLUMNS)

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
