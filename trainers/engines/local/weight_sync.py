"""The models' precision and the weight sync: patching the linears with a recipe, pairing the sampler's own
model with the learner's parameters, and the learner-to-sampler copy and re-quantization after each update."""
from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import torch

from rollout.precision import patch_precision
from trainers.config import Config, ConfigError


def apply_precision(model, cfg: Config, run_dir: pathlib.Path | None, side: str = "learner") -> dict[str, Any]:
    """Patch the linears with ``precision.<side>`` (one model serves learner and sampler when the two are equal);
    'bf16' leaves them as is. ``run_dir``: where ``quantize_model`` records its layer report (None: nowhere)."""
    name = getattr(cfg.precision, side)
    env_recipe = os.environ.get("MINITE_RECIPE")
    if env_recipe and name not in ("bf16", "auto") and env_recipe != name:
        print(f"[trainers] MINITE_RECIPE={env_recipe} is ignored: the training recipe names precision "
              f"{name!r} explicitly (explicit > $MINITE_RECIPE > default)", file=sys.stderr)
    return patch_precision(model, name, exclude=cfg.precision.exclude, backend=cfg.precision.backend,
                           alignment=cfg.precision.alignment, run_dir=run_dir)


def _param_pairs(learner, sampler) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(sampler parameter, learner parameter) by name; the two models must hold the same parameters (both are
    the loaded model, patched with different recipes, which keeps parameter names and shapes)."""
    mine, theirs = dict(learner.named_parameters()), dict(sampler.named_parameters())
    if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
        diff = sorted(set(mine) ^ set(theirs)) or [k for k in mine if mine[k].shape != theirs[k].shape]
        raise ConfigError(f"precision.sampler: the sampler's model does not hold the learner's parameters "
                          f"(first difference: {diff[0]!r}); use one precision for both")
    return [(theirs[k], mine[k]) for k in mine]


class WeightSyncMixin:
    """``LocalTrainer``'s weight sync: the learner's weights into the sampler."""

    def _weight_sync(self) -> dict[str, float]:
        """The sampler's weights after an update. With one precision it shares the learner's parameters; with
        its own (``precision.sampler``) they are first copied in place into its model. Quantized weight caches
        are keyed on the parameter version counter, so the first sampler forward after that re-quantizes. On
        CUDA with the Triton kernels, all eligible weights are re-quantized here in grouped launches, and whatever
        remains by a 1-token forward (``rollout.precision.Requantizer``), so the whole cost is reported as
        `timing/sync_s`."""
        self._copy_to_sampler()
        if not self.sampler_precision.get("patched"):
            return {}
        return self._requantize()

    def _copy_to_sampler(self) -> None:
        """The learner's parameters into the sampler's own model, in place (the CUDA-graph sampler's buffers
        keep their addresses); nothing when the two share one model."""
        with torch.no_grad():
            for dst, src in self._param_pairs:
                dst.copy_(src)
