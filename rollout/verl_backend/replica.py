"""verl's ``RolloutReplica`` for ``rollout.name=minite`` (``verl.workers.rollout.replica``; registered in
``RolloutReplicaRegistry``), and the thin Ray actor around :class:`~rollout.verl_backend.server.MiniteServer`.

One replica per actor worker (one GPU each), in verl's hybrid mode only: ``launch_servers`` starts one server
actor on the worker's node, named ``minite_server_<replica>_0``, whose handle verl's ``LLMServerClient`` calls
(``generate``, ``sleep``, ``wake_up``, ``abort_all_requests``, ...). The server forwards each batch to the
engine inside the worker with Ray's ``__ray_call__`` (:func:`call_engine`), which runs it on the engine's own
thread (Ray would run it on a fiber with a small stack). There is no HTTP endpoint: ``server_address`` is the
actor's name.

Not served (an error at launch): colocated and standalone modes (``init_colocated`` / ``init_standalone``, e.g. a
reward or teacher model rolled out by a separate server), since the sampler lives in the actor worker.
"""
from __future__ import annotations

from typing import Any

import ray
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from rollout.verl_backend.engine_thread import run_on_engine_thread
from rollout.verl_backend.params import Lengths
from rollout.verl_backend.server import ENGINE_METHODS, MiniteServer
from rollout.verl_backend.settings import MiniteRolloutSettings

SERVER_PREFIX = "minite_"


def find_rollout(worker: Any) -> Any:
    """The worker's minite rollout: ``worker.rollout``, or that of one of the workers a colocated (fused) worker
    holds (``worker_dict`` / ``fused_worker_dict``)."""
    from rollout.verl_backend.rollout import MiniteRollout

    candidates = [worker]
    for attr in ("worker_dict", "fused_worker_dict"):
        candidates.extend((getattr(worker, attr, None) or {}).values())
    for w in candidates:
        rollout = getattr(w, "rollout", None)
        if isinstance(rollout, MiniteRollout):
            return rollout
    raise RuntimeError("minite rollout: the actor worker holds no MiniteRollout (set "
                       "actor_rollout_ref.rollout.name=minite, so verl builds it in ActorRolloutRefWorker.init_model)")


def call_engine(worker: Any, method: str, args: tuple, kwargs: dict) -> Any:
    """Inside the actor worker (run by ``worker.__ray_call__``, on a Ray fiber): one method of its minite engine,
    run on the engine's own thread (:mod:`~rollout.verl_backend.engine_thread`)."""
    if method not in ENGINE_METHODS:
        raise ValueError(f"minite rollout: engine method {method!r} is not served; valid: {', '.join(ENGINE_METHODS)}")
    return run_on_engine_thread(getattr(find_rollout(worker).engine, method), *args, **kwargs)


class MiniteServerActor(MiniteServer):
    """The server actor: :class:`MiniteServer` whose engine calls go to ``worker`` (an actor handle)."""

    def __init__(self, config: Any, worker: Any, replica_rank: int) -> None:
        settings = MiniteRolloutSettings.from_rollout_config(config)

        async def call(method: str, *args: Any, **kwargs: Any) -> Any:
            return await worker.__ray_call__.remote(call_engine, method, args, kwargs)

        super().__init__(call, lengths=Lengths.from_rollout_config(config), batch_wait_ms=settings.batch_wait_ms,
                         max_batch=config.max_num_seqs, config=config)
        self.replica_rank = replica_rank


class MiniteReplica(RolloutReplica):
    """One minite server per actor worker (see the module docstring)."""

    def __init__(self, replica_rank: int, config: Any, model_config: Any, gpus_per_node: int = 8,
                 is_reward_model: bool = False, is_teacher_model: bool = False, name_suffix: str = "") -> None:
        super().__init__(replica_rank, config, model_config, gpus_per_node, is_reward_model, is_teacher_model,
                         name_suffix)
        self.server_class = ray.remote(MiniteServerActor)

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID:
            raise RuntimeError(f"minite rollout: {self.rollout_mode.value} mode is not served; the sampler lives in "
                               "the actor worker (hybrid engine). Roll out reward or teacher models with vLLM or "
                               "SGLang")
        if self.world_size != 1 or len(self.workers) != 1:
            raise RuntimeError(f"minite rollout: one GPU per replica, got a world size of {self.world_size} (set "
                               "actor_rollout_ref.rollout.tensor_model_parallel_size=1)")
        worker = self.workers[0]
        node_id = await worker.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
        name = f"{SERVER_PREFIX}server_{self.replica_rank}_0{self.name_suffix}"
        server = self.server_class.options(
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node_id,
                                                                                              soft=False),
            name=name,
            max_concurrency=self.max_concurrency,
        ).remote(config=self.config, worker=worker, replica_rank=self.replica_rank)
        await server.__ray_ready__.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name
