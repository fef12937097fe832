"""A study's outputs: table.md, summary.json and the figures (:func:`write_outputs`), and the closing
text the command prints (:func:`table`, :func:`where`)."""
from __future__ import annotations

import json
import math
from typing import Any

from minite_util.fileio import atomic_write_text
from trainers.study.config import StudyConfig, train_args
from trainers.study.results import _metric_order, read_metrics


def _cell(a: dict | None, fmt: str) -> str:
    if a is None:
        return "n/a"
    s = format(a["mean"], fmt)
    return s + (f" ± {format(a['std'], fmt)}" if a["n"] > 1 else "")


def code_line(code: dict) -> str:
    """Which code the runs ran (``results.code_versions``), in one paragraph."""
    def names(runs: list[str]) -> str:
        return ", ".join(runs[:6]) + (f" and {len(runs) - 6} more" if len(runs) > 6 else "")

    versions = code["versions"]
    if len(versions) == 1 and not code["mixed"] and not code["unrecorded"]:
        return f"\nCode (`trainers/provenance.py`): every run ran `{next(iter(versions))}`."
    parts = [f"`{d}`: {names(runs)}" for d, runs in versions.items()]
    if code["mixed"]:
        parts.append(f"several versions within the run: {names(code['mixed'])}")
    if code["unrecorded"]:
        parts.append(f"not recorded (run before the trainer recorded it): {names(code['unrecorded'])}")
    if len(versions) > 1 or code["mixed"]:
        head = "the runs ran more than one version of the code; compare them knowing it"
    else:
        head = "not every run recorded its code, so one version is not known"
    return f"\nCode (`trainers/provenance.py`): {head}. " + "; ".join(parts) + "."


def table(summary: dict) -> str:
    arms = summary["arms"]
    first = next(iter(arms.values()))
    reward_cols = [k for k in first if k.startswith("reward@")]
    head = (["arm", "seeds", "steps"] + [f"reward {k.split('@')[1]}" for k in reward_cols] +
            ["held-out acc", "mean abs δ", "q05 δ", "gated tokens", "gate grad shift", "repair loss", "step s"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, a in arms.items():
        st = a.get("steps")
        steps = "n/a" if st is None else (f"{st['min']:.0f}" if st["min"] == st["max"] else
                                          f"{st['min']:.0f}-{st['max']:.0f}")
        planned = a.get("seeds_planned", a["seeds"])
        seeds = str(a["seeds"]) if planned == a["seeds"] else f"{a['seeds']} of {planned}"
        cells = [arm, seeds, steps] + [_cell(a.get(k), ".3f") for k in reward_cols]
        cells += [_cell(a.get("eval_accuracy"), ".3f"), _cell(a.get("abs_gap_mean"), ".3g"),
                  _cell(a.get("gap_q05"), ".3g"), _cell(a.get("gated_token_frac"), ".3g"),
                  _cell(a.get("gate_grad_shift"), ".3g"), _cell(a.get("repair_loss"), ".3g"),
                  _cell(a.get("step_s"), ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    w = summary["config"]["window"]
    lines.append(f"\nMean ± sample std over seeds; steps: the steps the runs reached. Reward: mean of `reward/mean` over the {w} steps ending at the "
                 "step. Held-out accuracy: the eval of each run's highest evaluated step, by its own sampler precision "
                 "(in the run with eval.every, else an `eval run` of its checkpoint; the steps can differ between "
                 "runs: the table below compares them at equal steps). "
                 "δ, gated tokens, gate grad shift (share of gradient weight the gate moves between tokens) and "
                 "repair loss: means over all steps; step s: median step time.")
    borrowed = summary["config"].get("borrow") or []
    if borrowed:
        lines.append("\nBorrowed, not run by this study: " + "; ".join(
            f"`{arm}` is the recorded runs of `{where}` (the same trainer settings, checked run by run)"
            for arm, where in borrowed) + ".")
    if summary.get("code"):
        lines.append(code_line(summary["code"]))
    # with one checkpoint step and no baseline, the held-out column above already compares at equal steps
    lines += by_step_table(arms, "eval_by_step", "eval_step0", "Held-out accuracy by checkpoint step, each arm "
                           "under its own sampler precision (mean ± std over the seeds evaluated there, n seeds; "
                           "step 0: the untrained model under the arm's precision):")
    common = summary["config"].get("eval") and summary["config"]["eval"].get("precision")
    if common:
        lines += by_step_table(arms, "eval_common_by_step", "eval_common_step0", f"Held-out accuracy by checkpoint "
                               f"step, every arm under one precision, `{common}` (the trainer's eval.precision: "
                               "lm_head kept high, default alignment; step 0: the untrained model under it):")
    if summary.get("vs_baseline"):
        lines += comparison_table(summary["vs_baseline"])
    if summary.get("paired"):
        lines += paired_table(summary["paired"])
    return "\n".join(lines) + "\n"


def by_step_table(arms: dict, key: str, step0_key: str, title: str) -> list[str]:
    """Held-out accuracy per arm at each evaluated step (``key``: the per-step aggregates), step 0 first."""
    steps = sorted({int(k) for a in arms.values() for k in a.get(key, {})})
    step0 = any(a.get(step0_key) is not None for a in arms.values())
    if len(steps) + step0 <= 1:
        return []
    lines = ["", title, "", "| arm | " + " | ".join(f"step {k}" for k in [0] * step0 + steps) + " |",
             "|" + "---|" * (len(steps) + step0 + 1)]
    for arm, a in arms.items():
        got = {int(k): v for k, v in a.get(key, {}).items()}
        cells = [f"{_cell(got[k], '.3f')} (n={got[k]['n']})" if got.get(k) else "-" for k in steps]
        if step0:
            acc = a.get(step0_key)
            cells.insert(0, "-" if acc is None else f"{acc:.3f} (untrained)")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def _p(p: float) -> str:
    """A sign-flip p-value to three places; below 0.001 (10,000 random flips resolve down to 1e-4) as "<0.001",
    not as a 0 the test cannot give."""
    return f"{p:.3f}" if p >= 0.001 else "<0.001"


def paired_table(paired: list[dict]) -> list[str]:
    """The "paired by seed" section of table.md (``trainers.paired``): one row per contrast and eval precision."""
    from trainers.paired import LEVEL

    rows = [(c["arm"], c["against"], name, c[name]) for c in paired for name in ("own", "common") if name in c]
    if not rows:
        return []
    pct = f"{LEVEL:.0%}"
    note = ("Contrasts paired by seed (`trainers/paired.py`; every arm against the baseline, then the study's "
            "`pairs`): the area under each run's held-out curve (its mean height over the steps every compared "
            "run was evaluated at, step 0 the untrained model where evaluated) and the accuracy at the last of "
            "those steps; the mean paired "
            f"difference with its {pct} bootstrap CI, the sign-flip p-value, the effect size d_z and the seeds a "
            "paired test needs for 80% power at that effect (alpha 0.05). Eval: `own` = each run's sampler "
            "precision, `common` = the study's eval.precision.")
    head = ("| arm | against | eval | seeds | steps | AUC arm | AUC against | ΔAUC [CI] | p | d_z | seeds for 80% "
            "| Δlast [CI] | p |")
    lines = ["", note, "", head, "|" + "---|" * 13]
    for arm, base, name, r in rows:
        a, last = r["auc"], r["last"]
        need = "-" if a["seeds_for_80"] is None else str(a["seeds_for_80"])
        lines.append(f"| {arm} | {base} | {name} | {len(r['seeds'])} | {','.join(map(str, r['steps']))} | "
                     f"{a['arm']:.3f} | {a['base']:.3f} | {a['diff']:+.3f} [{a['ci'][0]:+.3f}, {a['ci'][1]:+.3f}] | {_p(a['p'])} | "
                     f"{a['dz']:+.2f} | {need} | {last['diff']:+.3f} [{last['ci'][0]:+.3f}, {last['ci'][1]:+.3f}] | "
                     f"{_p(last['p'])} |")
    return lines


def comparison_table(vs: dict) -> list[str]:
    """The "against the baseline" section of table.md: one row per arm, one column per compared metric."""
    keys = sorted({k for cmp in vs["arms"].values() for k in cmp}, key=_metric_order)
    if not keys:
        return []
    names = {"eval": "held-out", "reward": "reward"}
    head = ["arm"] + [f"{names.get(k.split('@')[0], k.split('@')[0])} {k.split('@')[1]}" for k in keys]
    from trainers.compare import min_p

    n_a, n_b = max((tuple(c["n"]) for cmp in vs["arms"].values() for c in cmp.values() if c), key=sum)
    note = (f"Against `{vs['baseline']}` at equal steps: difference of the seed means ± its Welch standard error, "
            f"and the exact two-sided permutation p-value over the seeds (`trainers/compare.py`; with {n_a} against "
            f"{n_b} seeds the smallest possible p is {min_p(n_a, n_b):.2f}):")
    lines = ["", note, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, cmp in vs["arms"].items():
        cells = [arm]
        for k in keys:
            c = cmp.get(k)
            if c is None:
                cells.append("-")
                continue
            cell = f"{c['diff']:+.3f}" + (f" ± {c['se']:.3f}" if c["se"] is not None else "")
            cells.append(cell + (f" (p {c['p']:.2f})" if c["p"] is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_outputs(cfg: StudyConfig, summary: dict) -> None:
    from trainers.plots import HELDOUT, plot_groups

    atomic_write_text(cfg.root / "summary.json", json.dumps(_clean(summary), indent=1) + "\n")
    atomic_write_text(cfg.root / "table.md", f"# Study `{cfg.name}`\n\n" + table(summary))
    groups = {arm: [cfg.run_dir(arm, s) for s in cfg.seeds if read_metrics(cfg.run_dir(arm, s))]
              for arm in cfg.compared_arms}
    groups = {k: v for k, v in groups.items() if v}
    if groups:
        plot_groups(groups, cfg.root / "reward.png", cfg.window, title=f"{cfg.name}: reward", panels=1)
        plot_groups(groups, cfg.root / "panels.png", cfg.window, title=cfg.name)
        if any("val/average" in r for runs in groups.values() for run in runs for r in read_metrics(run)):
            common = cfg.eval.precision if cfg.eval is not None else None
            panels = [("val/average", "held-out accuracy, own sampler")] if common else HELDOUT
            if common:  # the same evals read at one precision for every arm, beside each arm's own
                panels.append((f"val@{common}/average", f"held-out accuracy, all at {common}"))
            plot_groups(groups, cfg.root / "heldout.png", 1, title=f"{cfg.name}: held-out accuracy",
                        panels=panels)


def where(cfg: StudyConfig) -> str:
    """Each run's closing summary (``trainers.summary``: reward first to last, the gap, TRIAGE's gate, where its
    files are, the eval to run next), then where the study's own table and figures are."""
    from trainers.checkpoint import latest_checkpoint
    from trainers.config import load_config
    from trainers.losses import loss_mode
    from trainers.summary import run_summary

    out = []
    for arm in cfg.arms:
        for seed in cfg.seeds:
            run = cfg.run_dir(arm, seed)
            rows = read_metrics(run)
            if not rows:
                continue
            ckpt = latest_checkpoint(run / "checkpoints")
            curves = run / "curves.png"
            mode = loss_mode(load_config(train_args(cfg, arm, seed)).algorithm.loss_mode)
            out.append(f"[{arm}/seed{seed}] " + run_summary(
                run, rows, str(ckpt) if ckpt else "", curves if curves.is_file() else None, triage=mode.reports_gate))
    out.append(f"[study] table: {cfg.root / 'table.md'}   figures: {cfg.root / 'reward.png'}, "
               f"{cfg.root / 'panels.png'}   summary: {cfg.root / 'summary.json'}")
    return "\n".join(out)


def _clean(o: Any) -> Any:
    """NaN and inf become null, so that summary.json is strict JSON."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o
