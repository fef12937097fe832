"""The sampler's model under the learner's precision recipe: the rule ``trainers.engines.local.apply_precision``
applies to the local engine's sampler copy, for a model the minite rollout loaded itself.

``bf16`` leaves the linears as they are (plain torch linears in the model's dtype). Any other name goes through
``minite_kernels.quantize_model`` with the same quantizers as the learner: ``exclude`` patterns stay in high
precision (``lm_head`` in it keeps the output head unquantized, otherwise the head is quantized too), and under
``alignment=strict`` the quantized linears run on the strict backend (``minite_kernels.strict.linear_backend``).
"""
from __future__ import annotations

from typing import Any

from rollout.verl_backend.settings import MiniteRolloutSettings


def apply_sampler_precision(model: Any, settings: MiniteRolloutSettings) -> dict[str, Any]:
    """Patch ``model``'s linears in place per ``settings``; returns what was done (for ``describe()``)."""
    if settings.recipe == "bf16":
        return {"recipe": "bf16", "patched": False, "note": "plain torch linears in the model's dtype"}
    from minite_kernels import quantize_model

    backend = settings.backend
    if settings.alignment == "strict":  # dequantized GEMMs as plain matmuls, which StrictMode computes
        from minite_kernels.strict import linear_backend

        backend = linear_backend(backend)
    exclude = [e for e in settings.exclude if e != "lm_head"] or None
    report = quantize_model(model, None if settings.recipe == "auto" else settings.recipe, exclude=exclude,
                            backend=backend, lm_head="lm_head" not in settings.exclude)
    return {"recipe": report.recipe, "patched": True, "coverage": report.coverage,
            "quantized_layers": len(report.swapped), "backend": report.backend}
