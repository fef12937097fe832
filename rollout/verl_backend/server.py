"""The minite rollout's server logic: what verl's rollout server actor answers (the methods
``verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer`` offers and ``RolloutReplica`` calls),
written as plain asyncio so that it runs, and is tested, without Ray.

    server = MiniteServer(engine_call(engine), lengths=Lengths(512, 512))
    out = await server.generate(prompt_ids=[...], sampling_params={"temperature": 1.0, "logprobs": True},
                                request_id="r0")     # -> verl's TokenOutput(token_ids, log_probs, stop_reason)

``call(method, *args, **kwargs)`` runs one :class:`~rollout.verl_backend.engine.MiniteEngine` method where the
engine lives: in this process (:func:`engine_call`) or, under verl, in the actor worker that owns it
(``replica.MiniteServerActor``).

Batching: verl sends one ``generate`` per sample, concurrently. Requests queue; the server waits
``batch_wait_ms`` after the first one, then runs every queued request of the same kind (same sampling params;
at most ``max_batch``) as one sampler call, in arrival order (row ``i`` of the call is the ``i``-th request).
Requests that arrive meanwhile form the next batch.

Abort (``abort_all_requests`` / ``abort_request``): queued requests return at once with
``stop_reason="aborted"`` and no tokens. A batch that is running cannot be cut short (the sampler has no
stop hook): its aborted requests return ``aborted`` when it ends and their tokens are discarded;
``abort_all_requests`` returns only after that, so nothing samples with the old weights afterwards. After
``abort_all_requests`` the admission gate is closed: new requests wait for ``resume_generation`` (or, with
``reject_request=True``, return ``aborted`` at once), as in verl's vLLM server.

Sleep / wake: ``sleep`` and ``release_kv_cache`` wait for the queue to drain, then release the engine's KV cache
(``MiniteEngine.release``); ``wake_up`` and ``resume_kv_cache`` resume it. ``clear_kv_cache`` has nothing to do: the
KV cache lives only inside one batch (no prefix cache survives a request).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from verl.workers.rollout.replica import TokenOutput

from rollout.verl_backend.params import Lengths, RequestParams, request_params

logger = logging.getLogger(__name__)

#: the engine methods a server may call
ENGINE_METHODS = ("generate", "release", "resume", "describe")

Call = Callable[..., Awaitable[Any]]


def engine_call(engine: Any, *, thread: bool = True) -> Call:
    """``call`` for an engine in this process; ``thread``: run it off the event loop (so aborts and new requests
    are answered while a batch runs)."""

    async def call(method: str, *args: Any, **kwargs: Any) -> Any:
        if method not in ENGINE_METHODS:
            raise ValueError(f"minite rollout: engine method {method!r} is not served; valid: "
                             f"{', '.join(ENGINE_METHODS)}")
        fn = getattr(engine, method)
        return await asyncio.to_thread(fn, *args, **kwargs) if thread else fn(*args, **kwargs)

    return call


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt: list[int]
    params: RequestParams
    future: asyncio.Future
    aborted: bool = False
    extra: dict = field(default_factory=dict)


class MiniteServer:
    """verl's rollout server contract on a minite engine (see the module docstring)."""

    def __init__(self, call: Call, *, lengths: Lengths, batch_wait_ms: float = 20.0, max_batch: int | None = None,
                 config: Any = None) -> None:
        self._call = call
        self.lengths = lengths
        self.batch_wait_s = float(batch_wait_ms) / 1000.0
        self.max_batch = max_batch
        self.config = config
        self.global_steps: int | None = None
        self._queue: list[_Request] = []
        self._running: list[_Request] = []
        self._task: asyncio.Task | None = None
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()  # the admission gate
        self._open.set()
        self._rejecting = False
        self.stats = {"requests": 0, "batches": 0, "aborted": 0}

    # ------------------------------------------------------------------------------------------ generate
    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                       mm_processor_kwargs: dict | None = None, priority: int = 0, **kwargs: Any) -> TokenOutput:
        """One request: token ids in, ``TokenOutput`` out (the sampled tokens, their processed log-probs when
        ``sampling_params["logprobs"]`` asks for them, ``stop_reason`` ``completed`` or ``aborted``)."""
        if any(_given(x) for x in (image_data, video_data, audio_data, mm_processor_kwargs)):
            raise ValueError("minite rollout: multimodal inputs are not supported (text token ids only)")
        if kwargs:
            raise ValueError(f"minite rollout: generate() argument {min(kwargs)!r} is not supported")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("minite rollout: a request needs at least one prompt token")
        params = request_params(sampling_params, len(prompt), self.lengths)
        while not self._open.is_set():
            if self._rejecting:
                return self._aborted()
            await self._open.wait()
        # no await between the gate check and the append: an abort sees every admitted request
        req = _Request(str(request_id), prompt, params, asyncio.get_running_loop().create_future())
        self._queue.append(req)
        self.stats["requests"] += 1
        self._arrived.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._serve())
        return await req.future

    async def _serve(self) -> None:
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            if self.batch_wait_s > 0:
                await asyncio.sleep(self.batch_wait_s)
            if not self._queue:
                continue
            key = self._queue[0].params.batch_key()
            batch = [r for r in self._queue if r.params.batch_key() == key][: self.max_batch or None]
            taken = set(map(id, batch))
            self._queue = [r for r in self._queue if id(r) not in taken]
            self._running = batch
            self._idle.clear()
            first = batch[0].params
            try:
                completions, info = await self._call("generate", [r.prompt for r in batch], first.params,
                                                     derive_seed=first.seed is None)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - every request of the batch gets the engine's error
                for r in batch:
                    if not r.future.done():
                        if r.aborted:
                            r.future.set_result(self._aborted())
                        else:
                            r.future.set_exception(e)
            else:
                self.global_steps = info.get("global_steps")
                self.stats["batches"] += 1
                for r, c in zip(batch, completions):
                    if not r.future.done():
                        r.future.set_result(self._aborted() if r.aborted else self._output(c, r.params, info))
            finally:
                self._running = []
                self._idle.set()

    def _output(self, completion: Any, params: RequestParams, info: dict) -> TokenOutput:
        return TokenOutput(token_ids=list(completion.token_ids),
                           log_probs=list(completion.logprobs) if params.logprobs else None,
                           stop_reason="completed",
                           extra_fields={"global_steps": info.get("global_steps"),
                                         "finish_reason": completion.finish_reason, "seed": info.get("seed")})

    def _aborted(self) -> TokenOutput:
        self.stats["aborted"] += 1
        return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted",
                           extra_fields={"global_steps": self.global_steps})

    # ------------------------------------------------------------------------------------------ abort
    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False
                                 ) -> dict[str, Any]:
        """Abort every queued and running request and close the admission gate (see the module docstring)."""
        self._open.clear()
        self._rejecting = bool(reject_request)
        pending, self._queue = self._queue, []
        for r in pending:
            r.aborted = True
            if not r.future.done():
                r.future.set_result(self._aborted())
        running = list(self._running)
        for r in running:
            r.aborted = True
        await self._idle.wait()
        ids = [r.request_id for r in pending + running]
        if ids:
            logger.info("minite rollout: aborted %d requests", len(ids))
        return {"aborted_count": len(ids), "request_ids": ids}

    async def resume_generation(self) -> None:
        """Open the admission gate after ``abort_all_requests``."""
        self._rejecting = False
        self._open.set()

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict[str, Any]:
        """Abort one request: a queued one returns ``aborted`` now, a running one when its batch ends."""
        for r in self._queue:
            if r.request_id == request_id:
                self._queue.remove(r)
                r.aborted = True
                if not r.future.done():
                    r.future.set_result(self._aborted())
                return {"aborted": True, "request_id": request_id}
        for r in self._running:
            if r.request_id == request_id:
                r.aborted = True
                return {"aborted": True, "request_id": request_id}
        return {"aborted": False, "request_id": request_id, "error": f"Request {request_id} not found"}

    async def wait_for_requests_to_drain(self) -> None:
        while self._queue or self._running:
            await self._idle.wait()
            await asyncio.sleep(0.005)  # a queued batch may still be in its gathering window

    # ------------------------------------------------------------------------------------------ memory
    async def sleep(self) -> None:
        await self.wait_for_requests_to_drain()
        await self._call("release")

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._call("resume", tags)

    async def release_kv_cache(self) -> None:
        await self.wait_for_requests_to_drain()
        await self._call("release")

    async def resume_kv_cache(self) -> None:
        await self._call("resume", ["kv_cache"])

    async def clear_kv_cache(self) -> None:
        """Nothing to clear: the KV cache lives inside one batch, so no prefix cache outlives a weight update."""

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # ------------------------------------------------------------------------------------------ misc
    def get_rollout_config(self) -> Any:
        return self.config

    async def describe(self) -> dict[str, Any]:
        return {"server": dict(self.stats, queued=len(self._queue), running=len(self._running)),
                "engine": await self._call("describe")}

    async def start_profile(self, **kwargs: Any) -> None:
        raise RuntimeError("minite rollout: the rollout profiler is not supported; drop the rollout profiler "
                           "steps (global_profiler.steps / actor_rollout_ref.rollout.profiler) or use vLLM")

    async def stop_profile(self) -> None:
        raise RuntimeError("minite rollout: the rollout profiler is not supported")


def _given(x: Any) -> bool:
    """A multimodal argument that carries something (verl passes None or an empty list for text)."""
    return x is not None and (not hasattr(x, "__len__") or len(x) > 0)
