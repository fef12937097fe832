"""``rollout.name=minite``: the project's own sampler as a verl 0.9.1 rollout backend.

verl's vLLM rollout samples NVFP4 as W4A16 (Marlin) or BF16, which is not the learner's recipe; this backend
samples with the learner's own precision recipe (W4A4 NVFP4 with minite's quantizers, BF16, or any other minite
recipe), through ``rollout.select.make_sampler`` (the CUDA-graph engine on CUDA, the reference loop on CPU), and
returns the processed log-prob of every sampled token (verl's ``logprobs_mode=processed_logprobs``).

Modules, each one concern (verl is imported only by the last three):

- ``settings``: :class:`MiniteRolloutSettings`, the typed sampler settings carried in
  ``actor_rollout_ref.rollout.engine_kwargs.minite`` (standard library only);
- ``params``: verl's per-request sampling-params dict -> the project's ``SamplingParams``;
- ``engine``: :class:`MiniteEngine`, the sampler and its model: batches, weight updates written in place,
  sleep / wake (plain Python, no verl, no Ray);
- ``server``: :class:`MiniteServer`, the server logic: one ``generate`` call per request, concurrent requests
  batched into one sampler call, abort, the admission gate; verl's ``TokenOutput`` (asyncio, no Ray);
- ``rollout``: :class:`MiniteRollout`, verl's ``BaseRollout`` in the actor worker: it owns the engine
  (resume / release / ``update_weights``);
- ``replica``: :class:`MiniteReplica`, verl's ``RolloutReplica``, and the thin Ray actor around the server;
- ``register``: adds ``minite`` to verl's registries; loaded through the ``verl.plugins`` entry point.

Where the sampler lives: in the actor worker process (verl's hybrid engine), next to the FSDP learner, so a
weight update is an in-process copy into the sampler's parameters (``MiniteEngine.load_weights``) and the
server actor forwards each batch to that worker. One GPU per replica (``tensor_model_parallel_size=1``).
"""

NAME = "minite"
