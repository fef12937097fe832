"""The minite rollout under real Ray actors, without verl's trainer: the wiring the CPU tests replace with
stand-ins (tests/rollout/test_verl_backend.py). Prints one JSON object; exits 1 when a check fails.

    python scripts/verl_rollout_check.py                      # CPU, a tiny random Qwen3, about 40 s on 2 cores
    python scripts/verl_rollout_check.py --device cuda --recipe nvfp4_per_token_w1x16_bf16_bwd

It starts a local Ray instance, an async actor shaped like verl's colocated worker (``WorkerDict``: the hybrid
worker under ``worker_dict``, holding a ``MiniteRollout`` that loads the model from verl's ``HFModelConfig``), and
``MiniteReplica`` from verl's ``RolloutReplicaRegistry`` (so the ``verl.plugins`` entry point must be installed:
``pip install -e .``). Then, as verl's trainer drives it: concurrent ``generate`` calls on the server actor
(checked against the sampler this process builds from the settings the server reads, on the same device),
``sleep``, a weight update through the worker (``resume(["weights"])``, ``update_weights``,
``resume(["kv_cache"])``, verl's naive path), ``wake_up``, generate again (checked the same way on the new
weights), ``abort_all_requests`` / ``resume_generation``.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "assets" / "qwen3_tokenizer"
PROMPTS = ("a b c", "one", "the quick brown fox", "x y")
VERL_PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def _local(model, tok, settings, device: str):
    """The reference: the sampler of a ``MiniteEngine`` in this process, on a copy of ``model`` on ``device``, from
    the settings the server's engine reads from the same config (recipe, excluded modules, backend, engine), so
    that what is checked is the Ray wiring around it."""
    from rollout.verl_backend.engine import MiniteEngine

    return MiniteEngine(copy.deepcopy(model).to(device), tok, settings).sampler


def _agree(outs, ref) -> dict:
    """Up to each row's first differing token the log-probs agree within 1e-4, and at least half of all tokens
    come before such a parting. The tiny random model's distributions are nearly uniform over 151k tokens, so a
    last-bit difference between two processes' reductions can move one draw (the graph sampler's tests accept
    the same; ``same_tokens`` says whether it happened)."""
    worst, before, total = 0.0, 0, 0
    for o, r in zip(outs, ref):
        n = next((i for i, (x, y) in enumerate(zip(o.token_ids, r.token_ids)) if x != y), len(r.token_ids))
        before, total = before + n, total + len(r.token_ids)
        worst = max([worst] + [abs(a - b) for a, b in zip(o.log_probs[:n], r.logprobs[:n])])
    same = [list(o.token_ids) for o in outs] == [r.token_ids for r in ref]
    return {"same_tokens": same, "tokens_before_a_parting": f"{before}/{total}", "max_logprob_gap": worst,
            "ok": worst < 1e-4 and before >= total / 2}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="bf16")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--max-new-tokens", type=int, default=6)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()

    import ray
    import torch
    import verl  # noqa: F401 - loads the verl.plugins entry points, ours included
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode, RolloutReplicaRegistry

    from rollout import SamplingParams
    from rollout.models import tiny_random_qwen3
    from rollout.verl_backend.settings import MiniteRolloutSettings

    model_dir = tempfile.mkdtemp(prefix="minite_rollout_check_")
    model, tok = tiny_random_qwen3(TOKENIZER, seed=0)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    engine_kwargs = {"minite": {"recipe": args.recipe, "backend": args.backend,
                                "sampler": "loop" if args.device == "cpu" else "auto"}}
    config = RolloutConfig(name="minite", tensor_model_parallel_size=1, prompt_length=32,
                           response_length=args.max_new_tokens, dtype="float32", seed=3, n_gpus_per_node=1,
                           engine_kwargs=engine_kwargs)
    settings = MiniteRolloutSettings.from_rollout_config(config)  # what the server's engine reads
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env})
    torch.set_num_threads(1)  # as Ray's workers (OMP_NUM_THREADS=1): the same reduction order where it matters

    class Hybrid:
        def __init__(self, path: str) -> None:
            from rollout.verl_backend.rollout import MiniteRollout

            self.rollout = MiniteRollout(config, HFModelConfig(path=path), None)

    class WorkerDict:
        """verl's colocated worker shape; async, as verl's (its update_weights is a coroutine)."""

        def __init__(self, path: str) -> None:
            self.worker_dict = {"actor_rollout": Hybrid(path)}

        async def update_weights(self, items: list, global_steps: int) -> int:
            r = self.worker_dict["actor_rollout"].rollout
            await r.resume(tags=["weights"])
            await r.update_weights(iter(items), global_steps=global_steps)
            await r.resume(tags=["kv_cache"])
            return r.engine.global_steps

    worker_cls = ray.remote(num_gpus=1 if args.device == "cuda" else 0)(WorkerDict)
    checks: dict = {}

    async def run() -> None:
        worker = worker_cls.remote(model_dir)
        replica = RolloutReplicaRegistry.get("minite")(replica_rank=0, config=config,
                                                        model_config=HFModelConfig(path=model_dir), gpus_per_node=1)
        replica.rollout_mode = RolloutMode.HYBRID
        replica.workers = [worker]
        await replica.launch_servers()
        checks["server"] = replica.server_address
        server = replica.server_handle
        prompts = [tok.encode(t) for t in PROMPTS]
        # one seed per request: the server batches requests of equal seed in arrival order, which Ray does not
        # fix, and row i of a batch draws stream (seed, i); alone in its batch, request i draws (5 + i, 0)
        def reference(sampler):
            return [sampler.generate([p], SamplingParams(max_new_tokens=args.max_new_tokens, seed=5 + i))[0]
                    for i, p in enumerate(prompts)]

        outs = await asyncio.gather(*[server.generate.remote(prompt_ids=p, request_id=f"r{i}",
                                                             sampling_params=dict(VERL_PARAMS, seed=5 + i))
                                      for i, p in enumerate(prompts)])
        ref = _local(model, tok, settings, args.device)
        checks["generate"] = _agree(outs, reference(ref))
        checks["generate"]["batches"] = (await server.describe.remote())["server"]["batches"]

        await replica.sleep()
        checks["asleep_after_sleep"] = (await server.describe.remote())["engine"]["asleep"]
        new = copy.deepcopy(model)
        with torch.no_grad():
            for p in new.parameters():
                p.add_(0.02 * torch.randn_like(p))
        checks["global_steps_after_update"] = await worker.update_weights.remote(list(new.state_dict().items()), 7)
        await replica.wake_up()
        outs = await asyncio.gather(*[server.generate.remote(prompt_ids=p, request_id=f"n{i}",
                                                             sampling_params=dict(VERL_PARAMS, seed=5 + i))
                                      for i, p in enumerate(prompts)])
        ref = _local(new, tok, settings, args.device)
        checks["generate_after_update"] = _agree(outs, reference(ref))
        checks["global_steps_in_output"] = outs[0].extra_fields["global_steps"]

        aborted = await server.abort_all_requests.remote()
        parked = server.generate.remote(prompt_ids=prompts[0], sampling_params=dict(VERL_PARAMS), request_id="p")
        await replica.resume_generation()
        out = await parked
        checks["abort_then_resume"] = {"aborted_count": aborted["aborted_count"], "later": out.stop_reason}

    try:
        asyncio.run(run())
    finally:
        ray.shutdown()
    ok = (checks["generate"]["ok"] and checks["generate_after_update"]["ok"] and checks["asleep_after_sleep"]
          and checks["global_steps_after_update"] == 7 == checks["global_steps_in_output"]
          and checks["abort_then_resume"]["later"] == "completed")
    print(json.dumps({"ok": bool(ok), "recipe": args.recipe, "device": args.device, "checks": checks,
                      "seconds": round(time.perf_counter() - t0, 1)}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
