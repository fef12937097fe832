"""The minite rollout backend for verl (``rollout.verl_backend``) on the CPU, without Ray: generate, weight updates,
sleep / wake and abort against the project's local sampler, the parameter translation, the settings that travel
through verl's config, and the registration in verl's registries."""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
import types

import pytest
import torch

pytest.importorskip("verl")

from rollout import LocalSampler, SamplingParams
from rollout.verl_backend.engine import MiniteEngine, batch_seed
from rollout.verl_backend.params import Lengths, request_params
from rollout.verl_backend.server import MiniteServer, engine_call
from rollout.verl_backend.settings import MiniteRolloutSettings

NVFP4 = "nvfp4_per_token_w1x16_bf16_bwd"
#: what verl's agent loop sends with every request (``calculate_log_probs=true``)
VERL_PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
LENGTHS = Lengths(prompt_length=32, response_length=6)


def _settings(recipe: str = "bf16", sampler: str = "loop", **kw) -> MiniteRolloutSettings:
    return MiniteRolloutSettings(recipe=recipe, backend="emulated", sampler=sampler, batch_wait_ms=5.0, **kw)


def _engine(tiny_model, recipe: str = "bf16", sampler: str = "loop", base_seed: int = 7) -> MiniteEngine:
    model, tok = tiny_model
    return MiniteEngine(copy.deepcopy(model), tok, _settings(recipe, sampler), base_seed=base_seed)


def _reference(model, tok, recipe: str) -> LocalSampler:
    """The local engine's sampler copy: the model patched by ``trainers.engines.local.apply_precision``."""
    from trainers.config import load_config
    from trainers.engines.local import apply_precision

    ref = copy.deepcopy(model).requires_grad_(False).eval()
    cfg = load_config([f"precision={recipe}", "precision.backend=emulated"])
    apply_precision(ref, cfg, None, side="sampler")
    return LocalSampler(ref, tok)


def _prompts(tok) -> list[list[int]]:
    return [tok.encode(t) for t in ("a b c", "one", "the quick brown fox", "x y")]


def _same(got, ref, atol: float = 2e-6) -> None:
    """The same tokens, and log-probs equal up to fp32 rounding: the CPU kernels may round a reduction's last bit
    differently for another copy of the same weights (another alignment in memory)."""
    assert [list(g.token_ids) for g in got] == [r.token_ids for r in ref]
    for g, r in zip(got, ref):
        lp = g.log_probs if hasattr(g, "log_probs") else g.logprobs
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(r.logprobs), atol=atol, rtol=0)


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def hf_model_config(tiny_model_dir):
    """verl's model config of the tiny model's HF directory (loading its tokenizer takes seconds: built once)."""
    from verl.workers.config import HFModelConfig

    return HFModelConfig(path=str(tiny_model_dir))


# ---------------------------------------------------------------------------------------------- settings, params


def test_settings_travel_through_verls_config_and_refuse_bad_values():
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    s = MiniteRolloutSettings(recipe=NVFP4, exclude=("lm_head", r"re:layers\.0\."), batch_size=4, fp4_weights="off")
    parser = OverridesParser.create()
    conf = OmegaConf.create({})
    for item in s.overrides():
        o = parser.parse_override(item)
        assert o.is_add()
        OmegaConf.update(conf, o.key_or_group, o.value(), force_add=True)
    assert MiniteRolloutSettings.from_rollout_config(conf.actor_rollout_ref.rollout) == s
    # the recipe itself (its fields), as engine=verl sends it: the same recipe back in the worker, a custom one too
    from minite_kernels import PrecisionRecipe, get_qlinear_params

    custom = dataclasses.replace(get_qlinear_params(NVFP4), name="driver_only_custom")
    s = MiniteRolloutSettings(recipe=custom.to_dict())
    conf = OmegaConf.create({})
    for item in s.overrides():
        o = parser.parse_override(item)
        OmegaConf.update(conf, o.key_or_group, o.value(), force_add=True)
    back = MiniteRolloutSettings.from_rollout_config(conf.actor_rollout_ref.rollout)
    assert back == s and PrecisionRecipe.from_dict(back.recipe) == custom
    with pytest.raises(ValueError, match="minite rollout: recipe fields: OperandSpec.format='nvfp5' is unknown"):
        MiniteRolloutSettings(recipe={**custom.to_dict(), "fprop": {"a": {"format": "nvfp5"}}})
    with pytest.raises(ValueError, match="did you mean 'batch_size'.*valid: recipe, exclude"):
        MiniteRolloutSettings.from_mapping({"batch_sise": 2})
    with pytest.raises(ValueError, match="alignment='strcit'.*valid choices: default, strict"):
        MiniteRolloutSettings(alignment="strcit")
    with pytest.raises(ValueError, match="sampler='cuda'.*valid choices: auto, graph, loop"):
        MiniteRolloutSettings(sampler="cuda")
    with pytest.raises(ValueError, match="fp4_weights='yes'.*valid choices: auto, on, off"):
        MiniteRolloutSettings(fp4_weights="yes")


def test_request_params_follow_vllms_server_and_refuse_what_the_sampler_cannot_do():
    rp = request_params(VERL_PARAMS, 10, LENGTHS)
    assert rp.params == SamplingParams(temperature=1.0, max_new_tokens=6) and rp.logprobs and rp.seed is None
    assert request_params(VERL_PARAMS, 30, LENGTHS).params.max_new_tokens == 6  # min(6, 32 + 6 - 30)
    assert request_params(VERL_PARAMS, 35, LENGTHS).params.max_new_tokens == 3  # the context's room
    p = request_params({"max_tokens": 99, "top_k": 0, "seed": 3, "logprobs": False}, 10, LENGTHS)
    assert p.params.max_new_tokens == 28 and p.params.top_k == -1 and p.seed == 3 and not p.logprobs
    assert p.batch_key() != rp.batch_key()
    for bad, match in (({"presence_penalty": 1.0}, "not supported.*accepted: temperature"),
                       ({"repetition_penalty": 1.1}, "repetition_penalty=1.1"),
                       ({"ignore_eos": True}, "ignore_eos"), ({"logprobs": 5}, "alternatives")):
        with pytest.raises(ValueError, match=match):
            request_params(bad, 10, LENGTHS)
    with pytest.raises(ValueError, match="leaves no room"):
        request_params(VERL_PARAMS, 38, LENGTHS)


# ---------------------------------------------------------------------------------------------- generate


@pytest.mark.parametrize("recipe,sampler", [("bf16", "loop"), (NVFP4, "loop"), (NVFP4, "graph")])
def test_engine_samples_what_the_local_engines_sampler_samples(tiny_model, recipe, sampler):
    """Same recipe (the local engine's apply_precision), same seed: the same tokens and log-probs (the graph
    engine, eager on the CPU, within fp32 rounding)."""
    model, tok = tiny_model
    engine = _engine(tiny_model, recipe, sampler)
    params = SamplingParams(max_new_tokens=6, seed=11, temperature=0.8)
    got, info = engine.generate(_prompts(tok), params, derive_seed=False)
    assert info == {"global_steps": None, "seed": 11}
    _same(got, _reference(model, tok, recipe).generate(_prompts(tok), params), atol=2e-6 if sampler == "loop" else 1e-5)
    if recipe != "bf16":
        assert engine.precision["patched"] and engine.precision["quantized_layers"] == 14


def test_server_batches_requests_and_returns_the_local_samplers_tokens_and_processed_logprobs(tiny_model):
    model, tok = tiny_model
    engine = _engine(tiny_model, base_seed=7)
    prompts = _prompts(tok)
    params = dict(VERL_PARAMS, temperature=0.7)

    async def main():
        server = MiniteServer(engine_call(engine, thread=False), lengths=LENGTHS, batch_wait_ms=20)
        outs = await asyncio.gather(*[server.generate(prompt_ids=p, sampling_params=dict(params), request_id=f"r{i}")
                                      for i, p in enumerate(prompts)])
        seeded = await asyncio.gather(*[server.generate(prompt_ids=p, sampling_params=dict(params, seed=5),
                                                        request_id=f"s{i}") for i, p in enumerate(prompts)])
        return outs, seeded, dict(server.stats)

    outs, seeded, stats = _run(main())
    assert stats["batches"] == 2 and stats["requests"] == 8  # one sampler call per burst
    assert all(o.stop_reason == "completed" and len(o.log_probs) == len(o.token_ids) for o in outs)
    seed = batch_seed(7, None, 0)
    assert outs[0].extra_fields["seed"] == seed and outs[0].extra_fields["global_steps"] is None
    ref = _reference(model, tok, "bf16")
    sp = SamplingParams(temperature=0.7, max_new_tokens=6)
    _same(outs, ref.generate(prompts, SamplingParams(**{**sp.__dict__, "seed": seed})))
    _same(seeded, ref.generate(prompts, SamplingParams(**{**sp.__dict__, "seed": 5})))
    # the log-probs are the processed distribution's: log_softmax(logits / T) of the learner's full forward
    o, p = outs[2], prompts[2]
    with torch.no_grad():
        logits = model(torch.tensor([p + o.token_ids])).logits[0, len(p) - 1:-1].float()
    full = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(o.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(o.log_probs), full, atol=1e-4, rtol=0)
    # a second batch of the same step draws from another seed
    assert batch_seed(7, None, 1) != seed and batch_seed(7, 3, 0) != seed


# ---------------------------------------------------------------------------------------------- weights


def _perturbed(model, scale: float = 0.02):
    g = torch.Generator().manual_seed(1)
    new = copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return new


@pytest.mark.parametrize("recipe", ["bf16", NVFP4])
def test_update_weights_writes_in_place_and_generate_follows_the_new_weights(tiny_model, hf_model_config, recipe):
    """Through verl's BaseRollout: the learner's state dict (fp32, every name) in; the sampler then samples what
    a fresh local sampler on the new weights samples, its parameters keep their addresses and the NVFP4
    weights are re-quantized."""
    from verl.workers.config import RolloutConfig

    from rollout.verl_backend.rollout import MiniteRollout

    model, tok = tiny_model
    engine = _engine(tiny_model, recipe)
    config = RolloutConfig(name="minite", tensor_model_parallel_size=1, prompt_length=32, response_length=6,
                           engine_kwargs={"minite": _settings(recipe).to_dict()})
    rollout = MiniteRollout(config, hf_model_config, None, engine=engine)
    prompts, params = _prompts(tok), SamplingParams(max_new_tokens=6, seed=3)
    before, _ = engine.generate(prompts, params, derive_seed=False)
    addresses = [p.data_ptr() for p in engine.model.parameters()]

    new = _perturbed(model)
    metrics = _run(rollout.update_weights(iter(new.state_dict().items()), global_steps=4))
    assert [p.data_ptr() for p in engine.model.parameters()] == addresses
    assert engine.global_steps == 4 and engine.next_seed() == batch_seed(7, 4, 0)
    if recipe != "bf16":
        assert metrics["perf/requantized_weights"] == 14  # every quantized linear re-made for the new weights
    after, info = engine.generate(prompts, params, derive_seed=False)
    assert info["global_steps"] == 4
    _same(after, _reference(new, tok, recipe).generate(prompts, params))
    assert [c.token_ids for c in after] != [c.token_ids for c in before]

    async def weights():  # an async iterator (verl's checkpoint engines may hand one over)
        for item in model.state_dict().items():
            yield item

    _run(rollout.update_weights(weights(), global_steps=5))
    _same(engine.generate(prompts, params, derive_seed=False)[0], _reference(model, tok, recipe).generate(prompts, params))


def test_update_weights_refuses_partial_unknown_and_unsupported_updates(tiny_model):
    from verl.workers.config import RolloutConfig
    from verl.workers.config.rollout import CheckpointEngineConfig

    from rollout.verl_backend.rollout import MiniteRollout, check_rollout_config

    model, _ = tiny_model
    engine = _engine(tiny_model)
    rollout = MiniteRollout.__new__(MiniteRollout)  # the adapter's update path, without verl's model config
    rollout.engine = engine
    items = list(model.state_dict().items())
    with pytest.raises(ValueError, match=f"left 1 of 24 parameters .* unwritten .*first: '{items[-3][0]}'"):
        _run(rollout.update_weights(iter(items[:-3] + items[-2:])))
    with pytest.raises(ValueError, match="'model.layers.0.mlp.gate_proj.weight_packed', which is not in the sampler.*"
                                         "qat.enable=false"):
        _run(rollout.update_weights(iter([("model.layers.0.mlp.gate_proj.weight_packed", torch.zeros(1))])))
    with pytest.raises(ValueError, match="shape"):
        _run(rollout.update_weights(iter([("lm_head.weight", torch.zeros(3, 3))])))
    with pytest.raises(ValueError, match="wire_format='delta_flush'"):
        _run(rollout.update_weights(iter(items), wire_format="delta_flush"))
    with pytest.raises(ValueError, match="LoRA"):
        _run(rollout.update_weights(iter(items), peft_config={"r": 8}))
    with pytest.raises(ValueError, match="one GPU per replica"):
        check_rollout_config(RolloutConfig(name="minite", tensor_model_parallel_size=2))
    with pytest.raises(ValueError, match="backend='nccl'.*use naive"):
        check_rollout_config(RolloutConfig(name="minite", tensor_model_parallel_size=1,
                                           checkpoint_engine=CheckpointEngineConfig(backend="nccl")))


# ---------------------------------------------------------------------------------------------- sleep / wake


def test_sleep_releases_the_kv_cache_and_quantized_weights_and_wake_samples_the_same(tiny_model):
    _, tok = tiny_model
    engine = _engine(tiny_model, NVFP4, "graph")
    prompts = _prompts(tok)

    async def main():
        server = MiniteServer(engine_call(engine), lengths=LENGTHS, batch_wait_ms=5)
        first = await server.generate(prompt_ids=prompts[0], sampling_params=dict(VERL_PARAMS, seed=2),
                                      request_id="a")
        assert engine.sampler._state is not None
        await server.sleep()
        assert engine.asleep and engine.sampler._state is None
        assert all(len(m._weight_cache) == 0 for m in engine.model.modules() if hasattr(m, "_weight_cache"))
        await server.wake_up(tags=["weights"])
        assert engine.asleep  # the weights never left; the KV cache wakes with its tag
        await server.resume_kv_cache()
        assert not engine.asleep
        again = await server.generate(prompt_ids=prompts[0], sampling_params=dict(VERL_PARAMS, seed=2),
                                      request_id="b")
        return first, again

    first, again = _run(main())
    assert engine.stats["releases"] == 1
    assert again.token_ids == first.token_ids and again.log_probs == first.log_probs
    with pytest.raises(ValueError, match="resume tag 'kv'.*valid: weights, kv_cache"):
        engine.resume(["kv"])


# ---------------------------------------------------------------------------------------------- abort


class _Gated:
    """An engine whose batches wait for ``go`` (so a test can abort while one runs)."""

    def __init__(self, engine):
        self.engine, self.go, self.started = engine, threading.Event(), threading.Event()

    def generate(self, *a, **kw):
        self.started.set()
        assert self.go.wait(30)
        return self.engine.generate(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_abort_returns_aborted_requests_cleanly_and_later_requests_work(tiny_model):
    model, tok = tiny_model
    gated = _Gated(_engine(tiny_model))
    prompts = _prompts(tok)

    async def main():
        server = MiniteServer(engine_call(gated), lengths=LENGTHS, batch_wait_ms=1)

        def gen(i, **extra):
            return asyncio.create_task(server.generate(prompt_ids=prompts[i], sampling_params=dict(VERL_PARAMS, **extra),
                                                       request_id=f"r{i}"))

        running = gen(0)
        while not gated.started.is_set():
            await asyncio.sleep(0.005)
        queued = gen(1)
        await asyncio.sleep(0.01)
        assert (await server.abort_request("nope"))["aborted"] is False
        abort = asyncio.create_task(server.abort_all_requests())
        out_queued = await queued  # a queued request returns at once
        assert out_queued.stop_reason == "aborted" and out_queued.token_ids == [] and not abort.done()
        parked = gen(2)  # the gate is closed: it waits for resume_generation
        await asyncio.sleep(0.02)
        gated.go.set()  # the running batch ends; its result is discarded
        result = await abort
        out_running = await running
        assert out_running.stop_reason == "aborted" and out_running.token_ids == []
        assert sorted(result["request_ids"]) == ["r0", "r1"] and result["aborted_count"] == 2
        assert not parked.done()
        await server.resume_generation()
        out_parked = await parked
        assert out_parked.stop_reason == "completed" and len(out_parked.token_ids) == 6
        await server.abort_all_requests(reject_request=True)
        rejected = await gen(3)
        assert rejected.stop_reason == "aborted"
        await server.resume_generation()
        later = await gen(3, seed=1)
        return out_parked, later

    out_parked, later = _run(main())
    ref = LocalSampler(model, tok).generate([tok.encode("x y")], SamplingParams(max_new_tokens=6, seed=1))
    _same([later], ref)
    assert out_parked.extra_fields["seed"] == batch_seed(7, None, 1)  # the aborted batch drew with the first


def test_a_failing_batch_fails_its_requests_and_the_server_keeps_serving(tiny_model):
    _, tok = tiny_model
    engine = _engine(tiny_model)
    calls = {"n": 0}

    async def flaky(method, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return getattr(engine, method)(*args, **kwargs)

    async def main():
        server = MiniteServer(flaky, lengths=LENGTHS, batch_wait_ms=1)
        with pytest.raises(RuntimeError, match="simulated"):
            await server.generate(prompt_ids=tok.encode("a"), sampling_params=VERL_PARAMS, request_id="a")
        return await server.generate(prompt_ids=tok.encode("a"), sampling_params=VERL_PARAMS, request_id="b")

    assert _run(main()).stop_reason == "completed"


# ---------------------------------------------------------------------------------------------- verl wiring


def test_registered_in_verls_registries_through_the_entry_point():
    from importlib.metadata import entry_points

    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from rollout.verl_backend.replica import MiniteReplica
    from rollout.verl_backend.rollout import MiniteRollout

    assert any(ep.value == "rollout.verl_backend.register" for ep in entry_points(group="verl.plugins"))
    assert get_rollout_class("minite", "async") is MiniteRollout  # `import verl` loaded the plugin
    assert RolloutReplicaRegistry.get("minite") is MiniteReplica


def test_the_server_actor_forwards_to_the_engine_in_a_colocated_worker(tiny_model, hf_model_config):
    """The Ray wrapping without Ray: a stand-in for the worker handle runs ``__ray_call__`` in process, on a
    worker that holds the rollout inside a colocated ``worker_dict`` (verl's WorkerDict); the rollout loads the
    model from verl's HFModelConfig itself."""
    from verl.workers.config import RolloutConfig
    from verl.workers.rollout.replica import RolloutMode

    from rollout.verl_backend.replica import MiniteReplica, MiniteServerActor, call_engine
    from rollout.verl_backend.rollout import MiniteRollout

    model, tok = tiny_model
    config = RolloutConfig(name="minite", tensor_model_parallel_size=1, prompt_length=32, response_length=6,
                           dtype="float32", seed=9, engine_kwargs={"minite": {"sampler": "loop"}})
    rollout = MiniteRollout(config, hf_model_config, None)
    assert rollout.engine.base_seed == 9 and rollout.engine.describe()["dtype"] == "torch.float32"
    worker = types.SimpleNamespace(worker_dict={"actor_rollout": types.SimpleNamespace(rollout=rollout)})

    async def ray_call(fn, *args):
        return fn(worker, *args)

    handle = types.SimpleNamespace(__ray_call__=types.SimpleNamespace(remote=ray_call))

    async def main():
        server = MiniteServerActor(config, handle, replica_rank=0)
        # verl's LLMServerClient passes the multimodal arguments (None or empty for text)
        out = await server.generate(prompt_ids=tok.encode("one"), sampling_params=dict(VERL_PARAMS, seed=4),
                                    request_id="x", image_data=[], video_data=None)
        with pytest.raises(ValueError, match="multimodal inputs are not supported"):
            await server.generate(prompt_ids=tok.encode("one"), sampling_params=VERL_PARAMS, request_id="y",
                                  image_data=["an image"])
        await server.sleep()
        return out, (await server.describe())["engine"]

    out, described = _run(main())
    _same([out], LocalSampler(model, tok).generate([tok.encode("one")], SamplingParams(max_new_tokens=6, seed=4)))
    assert described["asleep"] and described["batches"] == 1
    with pytest.raises(ValueError, match="'load_weights' is not served"):
        call_engine(worker, "load_weights", (), {})
    with pytest.raises(RuntimeError, match="holds no MiniteRollout"):
        call_engine(types.SimpleNamespace(rollout=None), "describe", (), {})

    replica = MiniteReplica(0, config, hf_model_config, gpus_per_node=1)
    replica.rollout_mode = RolloutMode.COLOCATED
    with pytest.raises(RuntimeError, match="colocated mode is not served"):
        _run(replica.launch_servers())


def test_engine_calls_run_on_the_engine_thread_under_the_callers_grad_mode():
    """Ray runs an asyncio actor's synchronous calls on fibers with small stacks, and the sampler's first batch
    (torch.compile, CUDA-graph capture) overflowed one: SIGSEGV in the actor worker on an H100. So the server's
    calls and the weight updates run on the engine's own thread, under the caller's grad mode, and an error
    raised there reaches the caller."""
    from rollout.verl_backend.engine_thread import THREAD_NAME, run_on_engine_thread
    from rollout.verl_backend.replica import call_engine
    from rollout.verl_backend.rollout import MiniteRollout

    seen = []

    class Engine:
        def _note(self, what):
            seen.append((what, threading.current_thread().name, torch.is_grad_enabled()))

        def describe(self):
            self._note("describe")
            # a nested call on the engine thread runs directly (one worker: waiting on itself would deadlock)
            return run_on_engine_thread(threading.current_thread)

        def release(self):
            raise RuntimeError("engine failure")

        def begin_update(self):
            self._note("begin")

        def load(self, name, tensor):
            self._note(name)

        def finish_update(self, global_steps):
            self._note("finish")
            return {"steps": global_steps}

    rollout = MiniteRollout.__new__(MiniteRollout)  # the worker's adapter around an engine, without loading one
    rollout.engine = Engine()
    worker = types.SimpleNamespace(rollout=rollout)
    with torch.no_grad():
        thread = call_engine(worker, "describe", (), {})
    assert thread is not threading.current_thread() and thread.name.startswith(THREAD_NAME)
    assert seen == [("describe", thread.name, False)]
    with pytest.raises(RuntimeError, match="engine failure"):
        call_engine(worker, "release", (), {})
    seen.clear()
    assert _run(rollout.update_weights(iter([("w", torch.zeros(1))]), global_steps=3)) == {"steps": 3}
    assert [s[0] for s in seen] == ["begin", "w", "finish"] and {s[1] for s in seen} == {thread.name}
