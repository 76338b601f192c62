"""The judging rule: how far from the float64 truth a candidate layer may be.

A layer is judged by the ratio of the candidate's error to the reference's own
error, both measured against a float64 truth computed at capture time on the
same inputs (docs/judging.md gives the numbers behind every default):

* isolated (each module fed the golden inputs): fail when the ratio's lower
  confidence bound exceeds ``ratio`` *and* a paired sign test says the candidate
  is systematically farther from the truth (z > ``z``);
* propagated (whole model on the candidate): Dynamo's rule per layer,
  ``err_cand <= k * max(err_ref, floor)``, which locates the first divergent layer.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_rocm_parity.judging.dtypes import UNIT_ROUNDOFF, canonical_name
from pytest_rocm_parity.errors import InvalidArgument

# Allowed isolated error ratio per rung (docs/detection.md has the measurements).  At bf16/fp16 a correct
# kernel that rounds once more than the reference (GEMM, then a separate bias add) is sqrt(2) ~ 1.41x by
# construction (measured 1.46-1.49x, lower bound 1.43x); 1.75 accepts up to two extra roundings of the output's
# magnitude (sqrt(3) = 1.73).  Bugs that live in every precision are found on the float32 rung, far above its
# budget, with the correct alternates well below it; precision-only defects above 1.75x (low-precision
# accumulation) fail on their own rung; rounding-level precision defects pass: see "stricter" in the docs.
# float32: 10, because correct backends differ by reduction order (the example model's CPU fp32 RMSNorm
# against the H200's: docs/lm.md), while the seeded bugs present in all precisions measure far above it
# (docs/detection.md has the figures).
DEFAULT_RATIO = {"float64": 10.0, "float32": 10.0, "bfloat16": 1.75, "float16": 1.75}
DEFAULT_PROPAGATED = {"float64": 3.0, "float32": 3.0, "bfloat16": 3.0, "float16": 3.0}
# Errors below FLOOR_ULPS unit roundoffs of the output's RMS are rounding, whatever the reference did.
FLOOR_ULPS = 0.25
# Under the TF32 policy (Tolerance(tf32=True)) the fp32 rung's floor is TF32_FLOOR_ULPS TF32 unit roundoffs:
# against an exact-fp32 reference (TF32 off, or a CPU/ROCm reference) a TF32 GEMM is 0.6 u_tf32 of RMS error,
# a decoder block 1.0-2.4 u_tf32 and 4.1 u_tf32 for a block with a large-logit (~100) attention head
# (docs/detection.md), so the reference's own error is no measure of the noise the policy accepts.  With
# the float32 ratio of 10 the rung then allows 20 u_tf32 (9.8e-3 of the output's RMS) where the reference's
# own error is below the floor; bugs below that are invisible under TF32.
TF32_FLOOR_ULPS = 2.0
# ... and its propagated multiplier: TF32 drift at a model's outputs is 5.2 u_tf32 (2-layer decoder, CPU
# emulation) to 5.5 u_tf32 (22-layer 1.1B Llama, H200; docs/calibration.md): 5 x the floor allows 10 u_tf32.
TF32_PROPAGATED = 5.0
# On the float32 rung, a leaf whose reference is this many float32 unit roundoffs of the output's RMS
# from the truth was computed at low precision (a model that opens torch.autocast in its own forward:
# its convolutions and matmuls run in bf16 or fp16 on every rung): it is judged by the bf16/fp16 budget,
# since against the float32 one a bug of a few percent passes (docs/judging.md). One bf16 rounding is
# about 2e4 of them and one fp16 rounding 3e3; a float32 computation stays far below 1e3 unless its
# output is ill-conditioned beyond a thousandfold.
LOW_PRECISION_ULPS = 1000.0
NAN_POLICIES = ("equal", "fail")
# A candidate that quantizes its activations in another FP8 format than the reference (quant/allowance.py)
# is judged against the quantization noise capture measured: its error may reach QUANT_NOISE times that
# noise. Two independent roundings of the same size give sqrt(2) = 1.41 by construction; docs/fp8.md has
# the correct alternates (at most 1.63x) and the bugs (>= 10.3x) this sits between.
QUANT_NOISE = 3.0


@dataclass(frozen=True)
class Tolerance:
    """A tolerance policy; every field left None takes the per-dtype default.

    ratio: allowed candidate/reference error ratio against the truth (isolated replay); a number for
        every rung, or a dict of rung -> number that widens only the rungs it names (the others keep
        their defaults: a number meant for bf16 would also set float32's 10 to it).
    propagated: Dynamo multiplier for the propagated replay.
    z: minimum paired sign-test z-score for a failure (per-layer false-alarm control).
    confidence: z of the one-sided jackknife bound on the ratio.
    tf32: judge the float32 rung as TF32 arithmetic (noise floor of a 10-bit mantissa).
    nan: "equal" (NaN where the reference has NaN passes) or "fail".
    quant_noise: allowed error, in units of the activation-quantization noise, where the candidate
        quantizes activations in another format than the reference (docs/fp8.md).
    layers: per-module overrides, glob over module names -> Tolerance.
    """

    ratio: float | dict[str, float] | None = None
    propagated: float | None = None
    z: float = 3.0
    confidence: float = 3.0
    tf32: bool = False
    nan: str = "equal"
    quant_noise: float = QUANT_NOISE
    layers: dict[str, Tolerance] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.ratio, dict):
            per_rung = {}
            for rung, v in self.ratio.items():
                try:
                    name = canonical_name(rung)
                except InvalidArgument:
                    raise InvalidArgument(f"Tolerance(ratio={self.ratio!r}): {rung!r} is not a rung; name "
                                          f"{', '.join(DEFAULT_RATIO)}") from None
                if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1.0):
                    raise InvalidArgument(f"Tolerance(ratio={self.ratio!r}): the {name} ratio {v!r} must be a "
                                          f"number >= 1.0 (a ratio of errors)")
                per_rung[name] = float(v)
            object.__setattr__(self, "ratio", per_rung)
        for fname in ("ratio", "propagated", "quant_noise"):
            v = getattr(self, fname)
            if isinstance(v, dict):
                continue
            if v is not None and not (isinstance(v, (int, float)) and v >= 1.0):
                raise InvalidArgument(f"Tolerance({fname}={v!r}): must be a number >= 1.0 (a ratio of errors)")
        if self.nan not in NAN_POLICIES:
            raise InvalidArgument(f"Tolerance(nan={self.nan!r}): allowed {', '.join(NAN_POLICIES)}")

    def for_layer(self, name: str) -> Tolerance:
        for pattern, override in self.layers.items():
            if fnmatch.fnmatchcase(name, pattern):
                return replace(override, layers={})
        return self

    def ratio_for(self, rung: str) -> float:
        name = canonical_name(rung)
        if isinstance(self.ratio, dict):
            return self.ratio.get(name, DEFAULT_RATIO[name])
        return float(self.ratio if self.ratio is not None else DEFAULT_RATIO[name])

    def _tf32(self, rung: str) -> bool:
        """Whether ``rung`` is judged as TF32 arithmetic (the policy, on the float32 rung)."""
        return self.tf32 and canonical_name(rung) == "float32"

    def low_precision_ratio(self, rung: str) -> float | None:
        """The budget of a float32 leaf whose reference computed at low precision (LOW_PRECISION_ULPS),
        or None where none applies: another rung, the TF32 policy, or a float32 ratio the policy sets."""
        if canonical_name(rung) != "float32" or self._tf32(rung):
            return None
        if self.ratio is not None and (not isinstance(self.ratio, dict) or "float32" in self.ratio):
            return None
        low = min(self.ratio_for("bfloat16"), self.ratio_for("float16"))
        return low if low < self.ratio_for(rung) else None

    def propagated_for(self, rung: str) -> float:
        if self.propagated is not None:
            return float(self.propagated)
        return TF32_PROPAGATED if self._tf32(rung) else float(DEFAULT_PROPAGATED[canonical_name(rung)])

    def unit_roundoff(self, rung: str) -> float:
        """The noise unit of the rung's arithmetic: the judging floor is FLOOR_ULPS of it times the output RMS.

        Under tf32 the float32 rung's unit is scaled so that the floor is TF32_FLOOR_ULPS TF32 unit roundoffs.
        """
        if self._tf32(rung):
            return UNIT_ROUNDOFF["tf32"] * (TF32_FLOOR_ULPS / FLOOR_ULPS)
        return UNIT_ROUNDOFF[canonical_name(rung)]

    def propagated_floor(self, rung: str) -> float:
        """The propagated rule's floor per unit of the output's RMS: one rounding of the rung; under tf32
        TF32_FLOOR_ULPS TF32 roundoffs, so that the outputs may drift TF32_PROPAGATED times that."""
        return UNIT_ROUNDOFF["tf32"] * TF32_FLOOR_ULPS if self._tf32(rung) else UNIT_ROUNDOFF[canonical_name(rung)]

    def describe(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "propagated": self.propagated, "z": self.z,
                "confidence": self.confidence, "tf32": self.tf32, "nan": self.nan,
                "quant_noise": self.quant_noise, "layers": {k: v.describe() for k, v in self.layers.items()}}


def coerce(value: Any) -> Tolerance:
    """Accept Tolerance, None, a number (the ratio) or a dict of fields."""
    if value is None:
        return Tolerance()
    if isinstance(value, Tolerance):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Tolerance(ratio=float(value))
    if isinstance(value, dict):
        try:
            layers = {k: coerce(v) for k, v in value.get("layers", {}).items()}
            return Tolerance(**{**value, "layers": layers})
        except TypeError as exc:
            raise InvalidArgument(f"tolerance={value!r}: {exc}; fields are ratio, propagated, z, confidence, tf32, nan, quant_noise, layers") from None
    raise InvalidArgument(f"tolerance={value!r}: expected a Tolerance, a number (the ratio) or a dict")
