"""verl's ``BaseRollout`` for ``rollout.name=minite`` (``verl.workers.rollout.base``; registered as
``_ROLLOUT_REGISTRY[("minite", "async")]``).

verl builds it in every actor worker (``ActorRolloutRefWorker.init_model``, hybrid engine) after the FSDP
learner, and drives it from ``ActorRolloutRefWorker.update_weights`` (``checkpoint_engine.backend=naive``):
``resume(["weights"])``, ``update_weights(per_tensor_param, ...)``, ``resume(["kv_cache"])``. Unlike vLLM's
``ServerAdapter``, which ships the weights to another process over CUDA IPC, this adapter *owns* the sampler
(:class:`~rollout.verl_backend.engine.MiniteEngine`): the server actor of its replica forwards generate calls
here, and an update is an in-process, in-place copy of the learner's full tensors into the sampler's parameters.

The engine loads ``model_config.local_path`` in ``actor_rollout_ref.rollout.dtype`` on the worker's device,
patched with the learner's recipe from ``actor_rollout_ref.rollout.engine_kwargs.minite``
(:class:`~rollout.verl_backend.settings.MiniteRolloutSettings`); its base seed is ``rollout.seed``.

Refused with an error naming the setting: more than one GPU per replica, a checkpoint engine other than
``naive`` (the weights would arrive in another process), LoRA adapters (``peft_config``), and delta weight
flushes (``wire_format="delta_flush"``).
"""
from __future__ import annotations

from typing import Any

import torch
from verl.workers.rollout.base import BaseRollout

from rollout.verl_backend.engine import MiniteEngine
from rollout.verl_backend.engine_thread import run_on_engine_thread
from rollout.verl_backend.settings import MiniteRolloutSettings


class MiniteRollout(BaseRollout):
    """The actor worker's side of the minite rollout. ``engine``: an already-built engine (tests); otherwise one
    is loaded from the model config."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, *, engine: MiniteEngine | None = None,
                 **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        check_rollout_config(self.config)
        self.settings = MiniteRolloutSettings.from_rollout_config(self.config)
        self.replica_rank = kwargs.get("replica_rank", -1)
        if engine is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
            engine = run_on_engine_thread(MiniteEngine.from_pretrained, self.model_config.local_path, self.settings,
                                          dtype=self.config.dtype, device=device, base_seed=self.config.seed)
        self.engine = engine

    async def resume(self, tags: list[str]) -> None:
        run_on_engine_thread(self.engine.resume, tags)

    async def release(self) -> None:
        run_on_engine_thread(self.engine.release)

    @torch.no_grad()
    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", peft_config: Any = None,
                             base_sync_done: bool = True, global_steps: int | None = None, **kwargs: Any
                             ) -> dict[str, float]:
        """Write ``weights`` (``(name, tensor)`` pairs, a sync generator or an async iterator) into the sampler's
        parameters in place and re-quantize them."""
        if wire_format != "named_tensors":
            raise ValueError(f"minite rollout: update_weights(wire_format={wire_format!r}) is not supported; it takes "
                             "full tensors (actor_rollout_ref.rollout.checkpoint_engine.backend=naive)")
        if peft_config is not None:
            raise ValueError("minite rollout: LoRA adapters are not served; merge them "
                             "(actor_rollout_ref.model.lora.merge=true) or use vLLM")
        run_on_engine_thread(self.engine.begin_update)
        if hasattr(weights, "__aiter__"):
            async for name, tensor in weights:
                run_on_engine_thread(self.engine.load, name, tensor)
        else:
            for name, tensor in weights:
                run_on_engine_thread(self.engine.load, name, tensor)
        return run_on_engine_thread(self.engine.finish_update, global_steps)


def check_rollout_config(config: Any) -> None:
    """The verl settings the minite rollout needs (one GPU per replica, in-process weight updates)."""
    world = config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size
    if world != 1:
        raise ValueError(f"minite rollout: one GPU per replica; got tensor_model_parallel_size="
                         f"{config.tensor_model_parallel_size}, data_parallel_size={config.data_parallel_size}, "
                         f"pipeline_model_parallel_size={config.pipeline_model_parallel_size} (set each to 1; more "
                         "GPUs give more replicas)")
    backend = config.checkpoint_engine.backend
    if backend != "naive":
        raise ValueError(f"minite rollout: actor_rollout_ref.rollout.checkpoint_engine.backend={backend!r}; the "
                         "sampler lives in the actor worker and takes its weights in process: use naive")
