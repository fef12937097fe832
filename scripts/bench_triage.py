"""Time the TRIAGE loss (forward + backward) against verl's vanilla PPO loss x token TIS, in one process.

    python scripts/bench_triage.py                       # 256 x 8192 on CPU
    python scripts/bench_triage.py --device cuda         # the same on a GPU (CUDA events)

Prints one JSON line. ``ratio`` = median(triage_policy_loss, with the §6 diagnostics) / median(vanilla + TIS);
on CUDA that is the fused pass replayed as a CUDA graph (``TriageConfig.cuda_graphs``, the default), and
``ratio_eager`` the same loss with its kernels launched one by one; ``ratio_nodiag`` without the diagnostics; ``ratio_verl`` the registered verl loss "triage" called as
``ppo_loss`` calls it (what verl runs; only where verl is installed); ``ratio_local`` the same loss as the local
trainer calls it: the sampler's log-probs directly, the §6 diagnostics left to the once-per-step pass. The baseline is verl's
``compute_policy_loss_vanilla`` under ``seq-mean-token-mean`` with token TIS weights (C = 2) computed inline;
without verl (the GPU machine) it is ``triage.baselines.vanilla_tis_loss``, the same operations, tested equal.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch
from timing import interleaved_ms  # scripts/ is on sys.path when run as a script


def make_inputs(batch: int, seqlen: int, device: str, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    old = -torch.rand(batch, seqlen, generator=g) * 4
    logp = old + 0.05 * torch.randn(batch, seqlen, generator=g)
    sampler = old + 0.8 * torch.randn(batch, seqlen, generator=g) + 0.6 * torch.rand(batch, 1, generator=g)
    adv = torch.randn(batch, generator=g)
    lengths = torch.randint(seqlen // 2, seqlen + 1, (batch,), generator=g)
    mask = torch.arange(seqlen).unsqueeze(0) < lengths.unsqueeze(1)
    cast = lambda x: x.to(device=device, dtype=dtype)
    return cast(logp), cast(old), cast(sampler), cast(adv), mask.to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="dtype of the log-prob tensors")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    p.add_argument("--profile", action="store_true",
                   help="also run 5 calls of triage (diagnostics on, graphed and eager) and of triage_nodiag "
                        "under torch.profiler: "
                        "their costliest kernels in the JSON line (profile)")
    args = p.parse_args()
    if args.iters < 20:
        p.error("--iters must be >= 20 (median of at least 20 runs)")
    if args.threads:
        torch.set_num_threads(args.threads)

    from triage import TriageConfig, triage_policy_loss
    from triage.baselines import vanilla_tis_loss

    try:  # verl is absent on the GPU machine: fall back to the tested pure-torch copy of its vanilla loss
        import verl
        from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, get_policy_loss_fn
        from verl.workers.config import ActorConfig

        import triage.verl as tv
    except ImportError:
        verl = None

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    logp0, old, sampler, adv, mask = make_inputs(args.batch, args.seqlen, args.device, dtype)
    adv_bt = adv.unsqueeze(-1) * mask
    logp = logp0.clone().requires_grad_()
    mode = "seq-mean-token-mean"
    full, nodiag, eager = TriageConfig(), TriageConfig(diagnostics=False), TriageConfig(cuda_graphs=False)

    def ours(cfg):
        def run():
            logp.grad = None
            loss, _ = triage_policy_loss(logp, old, sampler, adv, mask, cfg)
            loss.backward()

        return run

    cands = {}
    if verl is not None:

        def actor(triage=None):
            return ActorConfig(
                strategy="fsdp",
                rollout_n=1,
                ppo_micro_batch_size_per_gpu=1,
                loss_agg_mode=mode,
                policy_loss=tv.TriagePolicyLossConfig(triage=triage or {}),
            )

        cfg = actor()
        raw_w = tv.make_rollout_is_weights(old, sampler, mask)  # what verl hands the loss (once per step)
        triage_fn = get_policy_loss_fn("triage")

        def vanilla():
            logp.grad = None
            with torch.no_grad():
                w = torch.exp((old.float() - sampler.float()).clamp(-20, 20)).clamp(max=2.0) * mask
            loss, _ = compute_policy_loss_vanilla(old, logp, adv_bt, mask, mode, cfg, w)
            loss.backward()

        def registered(config, **route):  # the verl loss "triage" called as ppo_loss calls it
            def run():
                logp.grad = None
                loss, _ = triage_fn(old_log_prob=old, log_prob=logp, advantages=adv_bt, response_mask=mask,
                                    loss_agg_mode=mode, config=config, **route)
                loss.backward()

            return run

        through_verl = registered(cfg, rollout_is_weights=raw_w)
        # trainers.learner.actor: the sampler's log-probs, the diagnostics once per step elsewhere
        local_trainer = registered(actor({"diagnostics": False}), sampler_log_prob=sampler)

        cands = {
            "vanilla_tis": vanilla,
            "triage": ours(full),
            "triage_eager": ours(eager),
            "triage_nodiag": ours(nodiag),
            "triage_verl": through_verl,
            "triage_local": local_trainer,
        }
        baseline = "verl.compute_policy_loss_vanilla"
    else:

        def vanilla():
            logp.grad = None
            loss, _ = vanilla_tis_loss(logp, old, sampler, adv_bt, mask)
            loss.backward()

        cands = {"vanilla_tis": vanilla, "triage": ours(full), "triage_eager": ours(eager),
                 "triage_nodiag": ours(nodiag)}
        baseline = (
            "triage.baselines.vanilla_tis_loss (verl not installed; tested equal to verl's vanilla x TIS)"
        )

    samples = interleaved_ms(cands, iters=args.iters, warmup=args.warmup, device=args.device)
    med = {name: statistics.median(ts) for name, ts in samples.items()}
    base = med["vanilla_tis"]
    out = {
        "bench": "triage_loss_fwd_bwd",
        "device": torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"cpu x{torch.get_num_threads()}",
        "batch": args.batch,
        "seqlen": args.seqlen,
        "dtype": args.dtype,
        "iters": len(samples["triage"]),
        "baseline": baseline,
        "vanilla_tis_ms": round(base, 3),
        "triage_ms": round(med["triage"], 3),
        "triage_eager_ms": round(med["triage_eager"], 3),
        "triage_nodiag_ms": round(med["triage_nodiag"], 3),
        "triage_verl_ms": round(med["triage_verl"], 3) if "triage_verl" in med else None,
        "ratio": round(med["triage"] / base, 3),
        "ratio_eager": round(med["triage_eager"] / base, 3),
        "ratio_nodiag": round(med["triage_nodiag"] / base, 3),
        "ratio_verl": round(med["triage_verl"] / base, 3) if "triage_verl" in med else None,
        "triage_local_ms": round(med["triage_local"], 3) if "triage_local" in med else None,
        "ratio_local": round(med["triage_local"] / base, 3) if "triage_local" in med else None,
        "torch": torch.__version__,
        "verl": verl.__version__ if verl is not None else None,
    }
    if args.profile:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        from profile_table import profiled

        dev = torch.device(args.device)
        out["profile"] = {}
        for name in ("triage", "triage_eager", "triage_nodiag"):
            _, summary = profiled(dev, lambda fn=cands[name]: [fn() for _ in range(5)], None, name, top=15)
            out["profile"][name] = {"busy_ms_per_call": round(summary["busy_s"] * 1e3 / 5, 3),
                                    "kernels": [k | {"ms": round(k["ms"] / 5, 4)} for k in summary["kernels"]]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
