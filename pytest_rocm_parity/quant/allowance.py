"""Which judged leaves may carry the candidate's own activation-quantization noise.

Why: the float64 truth of a quantized model quantizes its activations as the reference did
(docs/fp8.md). A candidate that quantizes them in another format (an OCP checkpoint served as FNUZ
on MI300) rounds each activation onto another grid: its error against that truth is the
quantization noise of its own grid, however correct it is, while the reference's error is only its
rounding. Capture measured that noise per truth tensor (the truth run again with activation
quantization off); a leaf is judged against it where the candidate's quantization differs from the
reference's in the module itself or inside it (isolated), or anywhere in the model (propagated,
since the difference flows downstream). Where the candidate quantizes as the reference did, its
codes are the reference's and no noise is allowed, so a wrong accumulation still shows.
"""
from __future__ import annotations

from typing import Any

from pytest_rocm_parity.quant.storage import scheme


def differing_modules(meta: dict[str, Any], model: Any) -> set[str]:
    """Names of the modules whose quantization (codes' format, activation scheme) differs between the
    golden's reference and ``model``, or that only one of them quantizes."""
    recorded = {n: (q.get("format"), q.get("activation")) for n, q in (meta.get("quant") or {}).items()}
    cand = {n: s for n, mod in model.named_modules() if (s := scheme(mod)) is not None}
    return {n for n in recorded.keys() | cand.keys() if recorded.get(n) != cand.get(n)}


def noise_allowance(meta: dict[str, Any], model: Any) -> dict[str, float]:
    """{judging tag "<call key>/<leaf>/isolated|propagated": the quantization noise RMS it may carry}."""
    noise = meta.get("quant_noise") or {}
    if not noise:
        return {}
    differs = differing_modules(meta, model)
    if not differs:
        return {}
    out: dict[str, float] = {}
    for name, rms in noise.items():
        kind, key, leaf = name.split("/", 2)
        module = key.split("#")[0]
        if kind == "truth":
            if any(module == "" or d == module or d.startswith(module + ".") for d in differs):
                out[f"{key}/{leaf}/isolated"] = float(rms)
        elif kind == "gtruth":
            out[f"{key}/{leaf}/propagated"] = float(rms)
    return out
