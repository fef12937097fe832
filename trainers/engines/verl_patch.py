"""Worker-side hook for engine=verl: loaded in every verl worker as ``actor_rollout_ref.model.external_lib``.

Importing this module (``import_external_libs`` runs it in ``HFModelConfig.__post_init__``, at the top of
``ActorRolloutRefWorker.init_model``, before the FSDP engine is built) does two things, once per process:

1. It wraps ``verl.workers.engine.fsdp.transformer_impl.FSDPEngine._build_module`` so that the Hugging Face
   module it returns (already cast to its dtype, gradient checkpointing on, **before** LoRA/QAT and before
   FSDP wrapping) goes through ``minite_kernels.quantize_model(module, $MINITE_RECIPE)``. The swapped
   ``minite_kernels.modules.Linear`` shares the original ``weight``/``bias`` parameters (meta tensors
   included) and keeps its quantized-weight cache out of the state dict, so FSDP2's rank-0 full-state-dict
   load and ``FSDPEngine.get_per_tensor_param`` (the weight sync to vLLM) see exactly the original names.
   Forward-only engines (the reference policy) are left unpatched unless ``MINITE_PATCH_REF=1``.
2. It wraps ``FSDPEngine._apply_qat`` so that, when the engine=verl driver turned verl's NVFP4 QAT path on
   only to get NVFP4 weights *into vLLM* (``MINITE_SAMPLER_RECIPE`` set to an NVFP4 recipe), verl does not
   replace our learner linears by its own ``QATLinear`` fake-quant: the learner numerics stay those of
   ``$MINITE_RECIPE`` (report §4.3), while ``_qat_enabled`` still makes the weight sync pack NVFP4 W4A16.

Environment (set by ``trainers.engines.verl`` through ``ray_kwargs.ray_init.runtime_env.env_vars``):
``MINITE_RECIPE`` learner precision recipe (``bf16``/unset: no patching; a name, or the recipe's fields as JSON,
which is what the driver sends so that each worker rebuilds the driver's recipe object), ``MINITE_SAMPLER_RECIPE`` sampler
recipe (documentation + QAT decision), ``MINITE_EXCLUDE`` comma-separated module-name patterns left BF16,
``MINITE_BACKEND`` minite backend (default ``auto``), ``MINITE_PATCH_REF`` (``1`` also patches the ref
engine),
``MINITE_VERL_PATCH_DISABLE=1`` (import without patching).

Caveat: verl enables non-reentrant gradient checkpointing; the recomputed forward re-quantizes activations.
That is exact for round-to-nearest forwards (every shipped ``nvfp4_*`` recipe quantizes the forward RTN);
a recipe with stochastic rounding in the *forward* would need its generator state replayed.

It also exposes ``compute_score``, the function named by ``reward.custom_reward_function`` (verl's
``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`` contract), which
delegates to the project's scorers (``trainers.rewards.registry.compute_score`` -> ``scoring.math``).

Verified on CPU (tests/trainers/test_engine_verl.py): the wrapper applied to a fake engine whose
``_build_module`` returns a tiny random Qwen3 swaps every decoder linear and leaves the state-dict keys
unchanged; the patch is idempotent; forward-only engines are skipped. A patched model under FSDP2
(``fully_shard``, world size 1, gloo, fp32 and bf16 mixed precision) computes, after each of three optimizer
steps, exactly what a fresh patched model with the same weights computes
(tests/minite_kernels/test_fsdp2.py). Not verified here: a real multi-GPU FSDP2 run.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any

logger = logging.getLogger("trainers.engines.verl_patch")

ENV_RECIPE = "MINITE_RECIPE"
ENV_SAMPLER_RECIPE = "MINITE_SAMPLER_RECIPE"
ENV_EXCLUDE = "MINITE_EXCLUDE"
ENV_BACKEND = "MINITE_BACKEND"
ENV_PATCH_REF = "MINITE_PATCH_REF"
NO_PATCH = ("", "bf16", "none")
_MARK = "_minite_verl_patched"


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def learner_recipe(env: dict[str, str] | None = None) -> str | None:
    """The learner recipe from ``$MINITE_RECIPE``: a name, or the recipe's fields as a JSON object (what the
    driver sends, ``trainers.engines.verl.resolved_recipe_fields``); None means plain linears."""
    env = os.environ if env is None else env
    name = (env.get(ENV_RECIPE) or "").strip()
    return None if name.lower() in NO_PATCH else name


def recipe_label(recipe: str | None) -> str:
    """A recipe's name for messages: the name itself, or the ``name`` field of its JSON fields."""
    if recipe and recipe.startswith("{"):
        try:
            return str(json.loads(recipe).get("name", "?"))
        except (ValueError, AttributeError):
            return "?"
    return recipe or "bf16"


def quantize_hf_module(module: Any, *, forward_only: bool = False, env: dict[str, str] | None = None) -> Any:
    """Apply ``minite_kernels.quantize_model`` to ``module`` per the environment; return the same module."""
    env = os.environ if env is None else env
    recipe = learner_recipe(env)
    if recipe is None:
        logger.info("minite: %s unset or bf16; linears left as they are", ENV_RECIPE)
        return module
    if forward_only and not _truthy(env.get(ENV_PATCH_REF)):
        logger.info(
            "minite: forward-only engine (reference policy) left unpatched (set %s=1 to patch it)",
            ENV_PATCH_REF,
        )
        return module
    if getattr(module, _MARK, None):
        logger.info("minite: module already patched with %s; skipping", getattr(module, _MARK))
        return module
    from minite_kernels import quantize_model

    exclude = [p.strip() for p in (env.get(ENV_EXCLUDE) or "").split(",") if p.strip()] or None
    report = quantize_model(module, recipe, exclude=exclude, backend=(env.get(ENV_BACKEND) or "auto"))
    setattr(module, _MARK, report.recipe)
    swapped = len(report.swapped)
    logger.warning(
        "minite: quantized %d linears with recipe %s (coverage %.1f%% of linear params, backend %s, "
        "%d skipped)",
        swapped,
        report.recipe,
        100.0 * report.coverage,
        report.backend,
        len(report.skipped),
    )
    return module


def wrap_engine_class(cls: type) -> bool:
    """Wrap ``cls._build_module`` and ``cls._apply_qat`` (once). Returns True when it patched now."""
    if getattr(cls, _MARK, False):
        return False
    original_build = cls._build_module

    @functools.wraps(original_build)
    def _build_module(self, *args: Any, **kwargs: Any) -> Any:
        module = original_build(self, *args, **kwargs)
        forward_only = bool(getattr(getattr(self, "engine_config", None), "forward_only", False))
        return quantize_hf_module(module, forward_only=forward_only)

    cls._build_module = _build_module
    original_qat = getattr(cls, "_apply_qat", None)
    if original_qat is not None:

        @functools.wraps(original_qat)
        def _apply_qat(self, module: Any, *args: Any, **kwargs: Any) -> Any:
            if os.environ.get(ENV_SAMPLER_RECIPE) and (
                getattr(module, _MARK, None) or learner_recipe() is None
            ):
                logger.warning(
                    "minite: verl QAT is on only to pack NVFP4 weights for vLLM (sampler recipe %s); "
                    "learner linears keep recipe %s instead of verl's QATLinear",
                    os.environ.get(ENV_SAMPLER_RECIPE),
                    recipe_label(learner_recipe()),
                )
                return module
            return original_qat(self, module, *args, **kwargs)

        cls._apply_qat = _apply_qat
    setattr(cls, _MARK, True)
    return True


def install() -> bool:
    """Patch verl's FSDPEngine (idempotent). Returns True the first time."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    patched = wrap_engine_class(FSDPEngine)
    if patched:
        level, message = install_message()
        logger.log(level, message)
    return patched


def install_message(env: dict[str, str] | None = None) -> tuple[int, str]:
    """What :func:`install` logs: a warning naming the recipes where ``$MINITE_RECIPE`` sets a learner recipe (a
    verl worker), else an info line (a process the driver did not set it for, such as the driver itself, which
    loads this module through the entry point too but builds no module: naming "bf16" there would read as if
    the run trained in BF16)."""
    env = os.environ if env is None else env
    recipe = learner_recipe(env)
    if recipe is None:
        return logging.INFO, (f"minite: FSDPEngine._build_module wrapped; ${ENV_RECIPE} is unset in this process, "
                              "so modules built here keep their linears")
    return logging.WARNING, (f"minite: FSDPEngine._build_module wrapped (learner recipe {recipe_label(recipe)}, "
                             f"sampler recipe {env.get(ENV_SAMPLER_RECIPE) or 'bf16'})")


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """verl ``custom_reward_function``: the project's built-in scorer (math-verify / GSM8K answers)."""
    from trainers.rewards.registry import compute_score as score

    return float(
        score(
            data_source=data_source,
            solution_str=solution_str,
            ground_truth=str(ground_truth),
            extra_info=extra_info,
        )
    )


if not _truthy(os.environ.get("MINITE_VERL_PATCH_DISABLE")):
    try:
        install()
    except ImportError as e:  # pragma: no cover - verl without its FSDP engine
        raise ImportError(
            f"trainers.engines.verl_patch needs verl's FSDP engine "
            f"(verl.workers.engine.fsdp.transformer_impl): {e}"
        ) from e
