"""The controlled study's runner: snapshots, gradient quality against the on-policy reference, learning curves.

    python -m trainers.controlled recipes/studies/controlled.yaml [key=value ...]

Parts, each written atomically to ``work_dir`` as soon as it is done and skipped when it is already there with
the same settings (its fingerprint), so the same command finishes an interrupted study:

1. ``snapshots.pt``: one policy trained on-policy from scratch; its parameters at ``gradient.snapshots`` steps.
2. ``gradient/step<k>.json``, per snapshot k:
   - the reference ``g*``: the mean of ``gradient.reference_batches`` on-policy batch gradients;
   - ``gradient.seeds`` seeds, each one batch: the on-policy arm's estimate from the learner's own samples, and,
     for every mismatch (each kind at the study's magnitude and at its ``gradient.sweep`` magnitudes), the
     ``none``, ``tis`` and ``triage`` estimates from one shared mismatched batch;
   - per arm: the cosine to ``g*`` per seed, the bias of the mean and its debiased value, the relative MSE; per
     pair of arms, the paired difference (``trainers.stats``).
3. ``learning/<kind>_<arm>.json``: ``learning.seeds`` GRPO runs from scratch per (mismatch, arm), plus one set
   of on-policy runs; the learner's exact expected reward per seed every ``learning.eval_every`` steps
   (``trainers.controlled.learning``), with checkpoints in ``learning/<kind>_<arm>.pt``.

Then ``trainers.controlled.report`` writes ``results.json``, ``table.md`` and the figures to ``output_dir``.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import time
from collections.abc import Callable

import numpy as np
import torch

from minite_util.fileio import atomic_path, atomic_write_json
from trainers import stats
from trainers.controlled.arms import CORRECTED, PAIRS, learning_runs
from trainers.controlled.config import ControlledConfig
from trainers.controlled.gradient import (
    DIAGNOSTICS,
    gradient_stats,
    mean_metrics,
    per_seed_gradients,
    rollout,
)
from trainers.controlled.learning import train
from trainers.controlled.mismatch import ON_POLICY, Mismatch, draw
from trainers.controlled.policy import EnsembleMLP
from trainers.controlled.task import ChainTask


def _fp(obj) -> str:
    return hashlib.sha256(json.dumps(obj, default=repr, sort_keys=True).encode()).hexdigest()[:16]


def _read_json(path: pathlib.Path, fingerprint: str) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return None
    return data if data.get("fingerprint") == fingerprint else None


def conditions(cfg: ControlledConfig) -> list[tuple[Mismatch, bool]]:
    """Every (mismatch, is_headline) the gradient part measures: each kind at the study's magnitude, then at the
    sweep's other magnitudes."""
    out = []
    for kind in cfg.kinds:
        head = Mismatch.of(kind, cfg.mismatch)
        out.append((head, True))
        for level in sorted(set(float(v) for v in cfg.gradient.sweep.get(kind, ()))):
            m = Mismatch.of(kind, cfg.mismatch, level)
            if m != head:
                out.append((m, False))
    return out


# --- 1. snapshots ---------------------------------------------------------------------------------------------
def snapshots(cfg: ControlledConfig, work: pathlib.Path, say: Callable[[str], None],
              ) -> tuple[dict[int, EnsembleMLP], str]:
    """One on-policy run (seed 0 of purpose "snapshot"); its parameters at each ``gradient.snapshots`` step, and
    the fingerprint of the settings that made them."""
    path = work / "snapshots.pt"
    fp = _fp({"task": cfg.task, "policy": cfg.policy, "optim": cfg.optim, "seed": cfg.seed,
              "steps": sorted(cfg.gradient.snapshots)})
    if path.is_file():
        state = torch.load(path, weights_only=False)
        if state.get("fingerprint") == fp:
            return {int(k): EnsembleMLP.from_state_dict(v) for k, v in state["policies"].items()}, fp
    kept: dict[int, dict] = {}
    wanted = set(cfg.gradient.snapshots)

    def keep(step: int, policy: EnsembleMLP) -> None:
        if step in wanted:
            kept[step] = policy.state_dict()

    t0 = time.perf_counter()
    rec = train(cfg, ON_POLICY, "on_policy", [0], steps=max(wanted), purpose="snapshot", on_step=keep)
    say(f"snapshots at steps {sorted(kept)}: exact reward {[round(r[0], 3) for r in rec['exact_reward']][::5]} "
        f"({time.perf_counter() - t0:.0f} s)")
    with atomic_path(path) as tmp:
        torch.save({"fingerprint": fp, "policies": kept}, tmp)
    return {k: EnsembleMLP.from_state_dict(v) for k, v in kept.items()}, fp


# --- 2. gradient quality --------------------------------------------------------------------------------------
def _estimates(cfg: ControlledConfig, snap: EnsembleMLP, mismatch: Mismatch, arms: tuple[str, ...],
               purpose: str, seeds: range) -> tuple[dict[str, torch.Tensor], list[dict], torch.Tensor]:
    """Per-seed gradients ``{arm: [n, D]}`` of the arms on one batch per seed, the TRIAGE arm's metrics (or the
    first arm's), and the batches' mean rewards."""
    task = ChainTask(cfg.task.vocab, cfg.task.length)
    x = task.features()
    out: dict[str, list[torch.Tensor]] = {a: [] for a in arms}
    metrics: list[dict] = []
    rewards = []
    chunk = cfg.gradient.chunk
    for lo in range(seeds.start, seeds.stop, chunk):
        ids = list(range(lo, min(lo + chunk, seeds.stop)))
        policy = snap.replicate(0, len(ids))
        d = draw(task, ids, cfg.task.prompts, cfg.task.group, mismatch, cfg.seed, purpose, 0)
        batch = rollout(task, policy, x, mismatch, d, cfg.task.group)
        rewards.append(batch.rewards.mean(1))
        for a in arms:
            g, m = per_seed_gradients(task, policy, x, batch, a)
            out[a].append(g.double())
            if a == "triage" or (a == arms[0] and "triage" not in arms):
                metrics += m
    return {a: torch.cat(v) for a, v in out.items()}, metrics, torch.cat(rewards)


def reference(cfg: ControlledConfig, snap: EnsembleMLP, step: int) -> tuple[torch.Tensor, float]:
    """``g*`` (the mean of ``reference_batches`` on-policy batch gradients, fp64) and ``tr(Cov g) / R``, the
    reference's own noise."""
    r = cfg.gradient.reference_batches
    total = sq = None
    for lo in range(0, r, cfg.gradient.chunk):
        grads, _, _ = _estimates(cfg, snap, ON_POLICY, ("on_policy",), f"reference{step}",
                                 range(lo, min(lo + cfg.gradient.chunk, r)))
        g = grads["on_policy"]
        total = g.sum(0) if total is None else total + g.sum(0)
        sq = (g * g).sum(0) if sq is None else sq + (g * g).sum(0)
    mean = total / r
    var = (sq - r * mean * mean) / (r - 1) if r > 1 else torch.zeros_like(mean)
    return mean, float(var.sum()) / r


def _round(xs, nd: int = 4) -> list[float]:
    return [round(float(v), nd) for v in xs]


def gradient_part(cfg: ControlledConfig, step: int, snap: EnsembleMLP, snap_fp: str, work: pathlib.Path,
                  say: Callable[[str], None]) -> dict:
    path = work / "gradient" / f"step{step}.json"
    conds = conditions(cfg)
    fp = _fp({"snapshot": snap_fp, "step": step, "g": cfg.gradient,
              "task": cfg.task, "seed": cfg.seed, "conds": [m for m, _ in conds], "arms": cfg.arms,
              "stats": cfg.stats})
    done = _read_json(path, fp)
    if done is not None:
        return done
    t0 = time.perf_counter()
    st = cfg.stats
    n = cfg.gradient.seeds
    seeds = range(n)
    ref, ref_var = reference(cfg, snap, step)
    ref_sq = float(ref @ ref) - ref_var
    say(f"step {step}: reference from {cfg.gradient.reference_batches} on-policy batches, |g*| {ref_sq ** 0.5:.4g}, "
        f"its own noise {(ref_var / ref_sq) ** 0.5:.3f} of |g*| ({time.perf_counter() - t0:.0f} s)")
    purpose = f"gradient{step}"
    on, _, on_rewards = _estimates(cfg, snap, ON_POLICY, ("on_policy",), purpose, seeds)

    def arm_summary(g: torch.Tensor) -> tuple[dict, dict]:
        s = gradient_stats(g, ref, ref_var, st.level)
        summary = {key: stats.mean_ci(s[key], reps=st.bootstrap, level=st.level, seed=st.seed)
                   for key in ("cosine", "sq_err", "norm_ratio")}
        summary.update({k: s[k] for k in ("bias_raw", "noise_floor", "bias2", "bias", "mean_cosine",
                                          "mean_norm_ratio")})
        summary["per_seed_cosine"] = _round(s["cosine"])
        return summary, {"cosine": s["cosine"], "jackknife": s["jackknife"]}

    on_summary, on_raw = arm_summary(on["on_policy"])
    result = {"fingerprint": fp, "step": step, "reference_norm": ref_sq ** 0.5,
              "reference_noise": (ref_var / ref_sq) ** 0.5, "seeds": n,
              "on_policy_reward": float(on_rewards.mean()), "on_policy": on_summary, "conditions": []}
    arms = tuple(a for a in CORRECTED if a in cfg.arms)
    for mismatch, headline in conds:
        t1 = time.perf_counter()
        grads, metrics, rewards = _estimates(cfg, snap, mismatch, arms, purpose, seeds)
        summaries, raws = {"on_policy": on_summary}, {"on_policy": on_raw}
        for a in arms:
            summaries[a], raws[a] = arm_summary(grads[a])
        paired = {}
        for i, (a, b) in enumerate(PAIRS):
            if a not in raws or b not in raws:
                continue
            entry = {"cosine": stats.paired(raws[a]["cosine"], raws[b]["cosine"], reps=st.bootstrap,
                                            perms=st.permutations, level=st.level, seed=st.seed + 10 * i)}
            d = summaries[a]["bias2"]["value"] - summaries[b]["bias2"]["value"]
            se, lo, hi = stats.jackknife_ci(d, raws[a]["jackknife"] - raws[b]["jackknife"], st.level)
            entry["bias2"] = {"diff": d, "se": se, "ci": [lo, hi], "p": stats.normal_p(d / se) if se > 0 else 1.0}
            paired[f"{a}-{b}"] = entry
        diag = {k: float(np.mean(v)) for k, v in mean_metrics(metrics, DIAGNOSTICS).items()}
        if not headline:  # the figures show per-seed cosines of the headline magnitudes only
            for a in arms:
                summaries[a] = {k: v for k, v in summaries[a].items() if k != "per_seed_cosine"}
        result["conditions"].append({"kind": mismatch.kind, "level": mismatch.level, "label": mismatch.label(),
                                     "headline": headline, "reward": float(rewards.mean()), "diagnostics": diag,
                                     "arms": {a: summaries[a] for a in arms}, "paired": paired})
        c = {a: summaries[a]["cosine"]["mean"] for a in summaries}
        b = {a: summaries[a]["bias"]["value"] for a in summaries}
        say(f"step {step}: {mismatch.label()}: |delta| {diag.get('mismatch/abs_gap_mean', 0):.3f}, gated "
            f"{diag.get('triage/gated_token_frac', 0):.4f}; cosine " + ", ".join(f"{a} {v:.3f}" for a, v in c.items())
            + "; bias " + ", ".join(f"{a} {v:.3f}" for a, v in b.items()) + f" ({time.perf_counter() - t1:.0f} s)")
    atomic_write_json(path, result)
    return result


# --- 3. learning curves ---------------------------------------------------------------------------------------
def learning_part(cfg: ControlledConfig, work: pathlib.Path, say: Callable[[str], None]) -> dict[str, dict]:
    out = {}
    seeds = list(range(cfg.learning.seeds))
    for name, mismatch, arm in learning_runs(cfg):
        path = work / "learning" / f"{name}.json"
        fp = _fp({"learning": cfg.learning, "task": cfg.task, "policy": cfg.policy, "optim": cfg.optim,
                  "seed": cfg.seed, "mismatch": mismatch, "arm": arm})
        done = _read_json(path, fp)
        if done is None:
            t0 = time.perf_counter()
            rec = train(cfg, mismatch, arm, seeds, steps=cfg.learning.steps,
                        checkpoint=work / "learning" / f"{name}.pt")
            rec.pop("final_policy")
            rec["fingerprint"], rec["name"] = fp, name
            rec["exact_reward"] = [_round(r) for r in rec["exact_reward"]]
            atomic_write_json(path, rec)
            (work / "learning" / f"{name}.pt").unlink(missing_ok=True)
            final = np.asarray(rec["exact_reward"][-1])
            say(f"learning {name}: exact reward {np.mean(rec['exact_reward'][0]):.3f} -> {final.mean():.3f} "
                f"(seeds {final.min():.3f}-{final.max():.3f}), |delta| {np.mean(rec['gap_abs_mean']):.3f} "
                f"({time.perf_counter() - t0:.0f} s)")
            done = rec
        out[name] = done
    return out


def run(cfg: ControlledConfig, say: Callable[[str], None] = print) -> dict:
    """Every part (resuming what is done), then the report; returns the results dict."""
    from trainers.controlled.report import write_report

    threads = torch.get_num_threads()
    if cfg.threads:  # small ops: one thread each avoids OpenMP barriers stalling on a shared CPU
        torch.set_num_threads(cfg.threads)
    work = pathlib.Path(cfg.work_dir)
    t0 = time.perf_counter()
    try:
        snaps, snap_fp = snapshots(cfg, work, say)
        grad = [gradient_part(cfg, k, snaps[k], snap_fp, work, say) for k in sorted(snaps)]
        learning = learning_part(cfg, work, say)
        results = write_report(cfg, grad, learning)
    finally:
        torch.set_num_threads(threads)
    say(f"done in {time.perf_counter() - t0:.0f} s: {pathlib.Path(cfg.output_dir) / 'table.md'}")
    return results


__all__ = ["PAIRS", "conditions", "gradient_part", "learning_part", "learning_runs", "reference",
           "run", "snapshots"]
