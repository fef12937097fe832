"""The controlled study's outputs: ``results.json``, ``table.md`` and the figures, from the parts of the run.

Tables (``table.md``): the mismatch each kind injects (TRIAGE.md §6 diagnostics of the TRIAGE arm); gradient
cosine and debiased bias per arm, kind and snapshot, with CIs; the paired differences between arms with CIs and
p-values; the magnitude sweep; the learning curves' endpoints (the learner's exact expected reward at the last
step, and its mean over all evaluated steps, "AUC") with paired differences, Holm-adjusted within each family;
and one verdict line per kind: TRIAGE against TIS and against no correction, read from the CIs (the CI of the
difference excludes 0 in TRIAGE's favour: "helps"; against it: "hurts"; else "no detectable difference").

Figures: one colour per arm in every study (``trainers.palette``), labelled axes, raw per-seed values under the
mean, and a caption saying what the lines and bands are (no smoothing anywhere).
"""
from __future__ import annotations

import math
import pathlib

import numpy as np

from minite_util.fileio import atomic_path, atomic_write_json, atomic_write_text
from trainers import stats
from trainers.controlled.arms import CORRECTED, PAIRS, learning_runs
from trainers.controlled.config import ARMS, ControlledConfig
from trainers.palette import LABELS, colour

#: better direction of each statistic: +1 higher is better, -1 lower is better
BETTER = {"cosine": 1, "bias": -1, "bias2": -1, "final": 1, "auc": 1}


def fmt(v: float, nd: int = 3) -> str:
    return f"{v:.{nd}f}" if abs(v) >= 10 ** -nd or v == 0 else f"{v:.1e}"


def sfmt(v: float) -> str:
    """Signed, three decimals, or two significant digits below 0.001: ``+0.093``, ``-4.4e-04``."""
    return f"{v:+.3f}" if abs(v) >= 1e-3 or v == 0 else f"{v:+.1e}"


def fmt_ci(value: float, ci, nd: int = 3) -> str:
    return f"{fmt(value, nd)} [{fmt(ci[0], nd)}, {fmt(ci[1], nd)}]"


def fmt_p(p: float, resolution: float) -> str:
    return f"<{resolution:.0e}" if p <= resolution else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def verdict(diff: float, ci, better: int, p: float | None = None, alpha: float = 0.05) -> str:
    """"helps" / "hurts" when the CI of a difference (TRIAGE minus another arm) excludes 0 and its (adjusted) p is
    below ``alpha``; "identical" when every seed gave the same value; else "no detectable difference"."""
    lo, hi = ci
    if diff == 0 and lo == 0 and hi == 0:
        return "identical"
    if (lo > 0 or hi < 0) and (p is None or p < alpha):
        return "helps" if diff * better > 0 else "hurts"
    return "no detectable difference"


def gradient_holm(grad: list[dict]) -> dict[tuple, float]:
    """Holm-adjusted p of every headline paired gradient comparison, per metric (cosine, bias2) over all kinds,
    pairs and snapshots: ``{(step, kind, pair, metric): p}``."""
    out = {}
    for metric in ("cosine", "bias2"):
        keys, ps = [], []
        for x in grad:
            for c in x["conditions"]:
                if c["headline"]:
                    for pair, e in c["paired"].items():
                        keys.append((x["step"], c["kind"], pair, metric))
                        ps.append(e[metric]["p"])
        out.update(zip(keys, stats.holm(ps)))
    return out


# --- learning summaries ---------------------------------------------------------------------------------------
def learning_summary(cfg: ControlledConfig, learning: dict[str, dict]) -> dict:
    st = cfg.stats
    runs = {}
    for name, rec in learning.items():
        curve = np.asarray(rec["exact_reward"])  # [evals, seeds]
        final, auc = curve[-1], curve.mean(0)
        band = [stats.mean_ci(row, reps=st.bootstrap, level=st.level, seed=st.seed)["ci"] for row in curve]
        runs[name] = {"arm": rec["arm"], "mismatch": rec["mismatch"], "eval_steps": rec["eval_steps"],
                      "mean": curve.mean(1).tolist(), "ci": band, "per_seed": curve.T.round(3).tolist(),
                      "start": float(curve[0].mean()),
                      "final": stats.mean_ci(final, reps=st.bootstrap, level=st.level, seed=st.seed),
                      "auc": stats.mean_ci(auc, reps=st.bootstrap, level=st.level, seed=st.seed),
                      "train_reward": [round(v, 4) for v in rec["train_reward"]],
                      "gap_abs_mean": float(np.mean(rec["gap_abs_mean"])), "gap_mean": float(np.mean(rec["gap_mean"])),
                      "gated_token_frac": float(np.mean(rec["triage/gated_token_frac"])),
                      "gate_grad_shift": float(np.mean(rec["triage/gate_grad_shift"]))}
    comparisons = {}
    for kind in cfg.kinds:
        for i, (a, b) in enumerate(PAIRS):
            na = "on_policy" if a == "on_policy" else f"{kind}_{a}"
            nb = "on_policy" if b == "on_policy" else f"{kind}_{b}"
            if na not in learning or nb not in learning:
                continue
            ca, cb = np.asarray(learning[na]["exact_reward"]), np.asarray(learning[nb]["exact_reward"])
            diff_curve = ca - cb
            comparisons[f"{kind}:{a}-{b}"] = {
                "kind": kind, "pair": f"{a}-{b}",
                "final": stats.paired(ca[-1], cb[-1], reps=st.bootstrap, perms=st.permutations, level=st.level,
                                      seed=st.seed + 10 * i),
                "auc": stats.paired(ca.mean(0), cb.mean(0), reps=st.bootstrap, perms=st.permutations,
                                    level=st.level, seed=st.seed + 10 * i + 5),
                "diff_mean": diff_curve.mean(1).tolist(),
                "diff_ci": [stats.mean_ci(row, reps=st.bootstrap, level=st.level, seed=st.seed)["ci"]
                            for row in diff_curve]}
    for key in ("final", "auc"):
        names = list(comparisons)
        adjusted = stats.holm([comparisons[n][key]["p"] for n in names])
        for n, p in zip(names, adjusted):
            comparisons[n][key]["p_holm"] = p
    return {"runs": runs, "comparisons": comparisons}


# --- tables ---------------------------------------------------------------------------------------------------
def _headline(grad: list[dict], kind: str) -> list[tuple[int, dict]]:
    return [(g["step"], c) for g in grad for c in g["conditions"] if c["kind"] == kind and c["headline"]]


def _p_res(cfg: ControlledConfig) -> float:
    return 1.0 / (1 + cfg.stats.permutations)


def tables(cfg: ControlledConfig, grad: list[dict], learn: dict, params: int) -> str:
    t, g, lc = cfg.task, cfg.gradient, cfg.learning
    steps = [x["step"] for x in grad]
    pct = round(100 * cfg.stats.level)
    res = _p_res(cfg)
    lines = [f"# Controlled study: {cfg.name}", "",
             f"Generated by `python -m trainers.controlled` (`trainers/controlled/`). Task: stride chains, vocabulary "
             f"{t.vocab}, responses of {t.length} tokens, batches of {t.prompts} prompts x {t.group} samples. Policy: "
             f"a two-layer tanh MLP, {params:,} parameters. Gradient quality: {g.seeds} seeds (one batch each) per "
             f"arm and mismatch at the parameters of on-policy steps {', '.join(map(str, steps))}, against a "
             f"reference from {g.reference_batches} on-policy batches. Learning: {lc.seeds} seeds per arm, "
             f"{lc.steps} steps, lr {cfg.optim.lr}. Intervals are {pct}% bootstrap CIs over seeds "
             f"({cfg.stats.bootstrap} resamples) for means and jackknife CIs for the bias; p-values are two-sided and "
             f"paired by seed (a sign-flip test with {cfg.stats.permutations} flips for means, a normal test on the "
             "jackknife for the bias), unadjusted unless marked Holm.",
             ""]
    lines += ["## The injected mismatch (TRIAGE arm's diagnostics, mean over seeds)", "",
              "| mismatch | step | reward | mean δ | mean \\|δ\\| | q05 δ | k3 KL | gated tokens | gate grad shift "
              "| repair-active segments | TIS clipped |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in grad:
        for c in x["conditions"]:
            d = c["diagnostics"]
            lines.append(f"| {c['label']} | {x['step']} | {c['reward']:.3f} | {d.get('mismatch/gap_mean', 0):.3f} | "
                         f"{d.get('mismatch/abs_gap_mean', 0):.3f} | {d.get('mismatch/gap_q05', 0):.2f} | "
                         f"{d.get('mismatch/k3_kl', 0):.3f} | {100 * d.get('triage/gated_token_frac', 0):.2f}% | "
                         f"{100 * d.get('triage/gate_grad_shift', 0):.2f}% | "
                         f"{100 * d.get('triage/repair_active_segment_frac', 0):.1f}% | "
                         f"{100 * d.get('tis/clip_frac', 0):.2f}% |")
    head = " | ".join(f"step {s}" for s in steps)
    def arm_table(intro: list[str], cell) -> None:
        """A table of ``cell(stats)`` per mismatch and arm (rows) and snapshot step (columns)."""
        lines.extend(["", *intro, "", f"| mismatch | arm | {head} |", "|---|---|" + "---|" * len(steps)])
        lines.append(f"| (none) | on_policy | {' | '.join(cell(x['on_policy']) for x in grad)} |")
        for kind in cfg.kinds:
            hl = _headline(grad, kind)
            for a in CORRECTED:
                if a in cfg.arms:
                    lines.append(f"| {hl[0][1]['label']} | {a} | {' | '.join(cell(c['arms'][a]) for _, c in hl)} |")

    arm_table(["## Gradient cosine to the on-policy gradient (higher is better)"],
              lambda s: fmt_ci(s["cosine"]["mean"], s["cosine"]["ci"]))
    arm_table(["## Gradient bias |E g - g*| / |g*| (U-statistic, noise floors taken out; lower is better)"],
              lambda s: fmt_ci(s["bias"]["value"], s["bias"]["ci"]))
    arm_table(["Raw bias |mean error| / |g*| as measured, and (in brackets) the noise floor sqrt(tr Cov / n) / |g*| "
               "that an unbiased estimator shows with these seeds:"],
              lambda s: f"{s['bias_raw']:.3f} ({s['noise_floor']:.3f})")
    arm_table(["What the bias is made of: the mean gradient's direction, cos(mean g, g*), and length, |mean g| / |g*| "
               "(1 and 1 for an unbiased estimator, up to the noise floor):"],
              lambda s: f"{s['mean_cosine']:.3f} / {s['mean_norm_ratio']:.3f}")
    lines += ["", "The reference's own noise (|ĝ* - g*| / |g*|, expected): "
              + ", ".join(f"step {x['step']} {x['reference_noise']:.3f}" for x in grad) + "."]
    lines += ["", "## Paired differences in gradient quality (a - b, same seeds)", "",
              f"| mismatch | a - b | {' | '.join(f'Δcosine, step {s}' for s in steps)} | "
              f"{' | '.join(f'Δbias², step {s}' for s in steps)} |", "|---|---|" + "---|" * (2 * len(steps))]
    adj = gradient_holm(grad)
    for kind in cfg.kinds:
        hl = _headline(grad, kind)
        for pair in hl[0][1]["paired"]:
            cells = []
            for metric, floor in (("cosine", res), ("bias2", 1e-12)):
                for step, c in hl:
                    q = c["paired"][pair][metric]
                    cells.append(f"{fmt_ci(q['diff'], q['ci'])} p {fmt_p(q['p'], floor)} "
                                 f"(Holm {fmt_p(adj[(step, kind, pair, metric)], floor)})")
            lines.append(f"| {hl[0][1]['label']} | {pair} | " + " | ".join(cells) + " |")
    lines += ["", "Δcosine: mean of the per-seed differences, sign-flip p. Δbias²: difference of the U-statistics "
              "(relative to |g*|²), jackknife CI and normal p. Holm: over every row and snapshot of this table, per "
              "metric."]
    sweep = [(x["step"], c) for x in grad for c in x["conditions"]]
    if any(not c["headline"] for _, c in sweep):
        arms = [a for a in CORRECTED if a in cfg.arms]
        lines += ["", "## Magnitude sweep: cosine / bias per arm", "",
                  f"| mismatch | step | {' | '.join(arms)} | TRIAGE - TIS, cosine | TRIAGE - TIS, bias² |",
                  "|---|---|" + "---|" * (len(arms) + 2)]
        for kind in cfg.kinds:
            rows = sorted(((s, c) for s, c in sweep if c["kind"] == kind),
                          key=lambda sc: (float(sc[1]["level"]) if not isinstance(sc[1]["level"], str) else 0,
                                          sc[0]))
            for s, c in rows:
                pr = c["paired"].get("triage-tis")
                extra = (f" | {fmt_ci(pr['cosine']['diff'], pr['cosine']['ci'])} | "
                         f"{fmt_ci(pr['bias2']['diff'], pr['bias2']['ci'])}") if pr else " | - | -"
                lines.append(f"| {c['label']} | {s} | "
                             + " | ".join(f"{c['arms'][a]['cosine']['mean']:.3f} / {c['arms'][a]['bias']['value']:.3f}"
                                          for a in arms) + extra + " |")
    lines += learning_tables(cfg, learn)
    lines += verdicts(cfg, grad, learn)
    return "\n".join(lines) + "\n"


def learning_tables(cfg: ControlledConfig, learn: dict) -> list[str]:
    if not learn["runs"]:
        return []
    res = _p_res(cfg)
    lc = cfg.learning
    lines = ["", f"## Learning curves: the learner's exact expected reward ({lc.seeds} seeds per arm, {lc.steps} steps)",
             "", "Final: at the last step. AUC: the mean over the evaluated steps 0, "
             f"{lc.eval_every}, ..., {lc.steps}. Mean [{round(100 * cfg.stats.level)}% CI] over seeds.", "",
             "| mismatch | arm | step 0 | final | AUC | mean \\|δ\\| | gated tokens |", "|---|---|---|---|---|---|---|"]
    for name, r in learn["runs"].items():
        lines.append(f"| {r['mismatch']} | {r['arm']} | {r['start']:.3f} | {fmt_ci(r['final']['mean'], r['final']['ci'])} | "
                     f"{fmt_ci(r['auc']['mean'], r['auc']['ci'])} | {r['gap_abs_mean']:.3f} | "
                     f"{100 * r['gated_token_frac']:.2f}% |")
    lines += ["", "Paired by seed (seed s of every arm starts from the same parameters and draws the same prompts "
              "and uniforms). Holm: adjusted over all the rows of this table, per column.", "",
              "| mismatch | a - b | Δ final | p | p Holm | dz | Δ AUC | p | p Holm | dz |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for c in learn["comparisons"].values():
        f, a = c["final"], c["auc"]
        lines.append(f"| {c['kind']} | {c['pair']} | {fmt_ci(f['diff'], f['ci'])} | {fmt_p(f['p'], res)} | "
                     f"{fmt_p(f['p_holm'], res)} | {f['dz']:.2f} | {fmt_ci(a['diff'], a['ci'])} | "
                     f"{fmt_p(a['p'], res)} | {fmt_p(a['p_holm'], res)} | {a['dz']:.2f} |")
    return lines


def verdicts(cfg: ControlledConfig, grad: list[dict], learn: dict) -> list[str]:
    """One line per kind and comparison: TRIAGE against TIS and against no correction, and its two parts alone."""
    adj = gradient_holm(grad)
    lines = ["", "## Verdicts", "",
             "Read off the tables above by one rule, the same for every cell: \"helps\" or \"hurts\" when the "
             f"{round(100 * cfg.stats.level)}% CI of the paired difference excludes 0 and its Holm-adjusted p is "
             "below 0.05 (the sign says which), \"identical\" when the two arms gave the same value on every seed, "
             "else \"no detectable difference\". The numbers are the differences (the first arm minus the second); "
             "bias² is relative to |g*|², lower is better. The last two lines of each mismatch are the ablations: "
             "TRIAGE's gate alone and its repair alone, each on top of TIS.", ""]
    for kind in cfg.kinds:
        head = next((c["label"] for _, c in _headline(grad, kind)), kind)
        for pair in ("triage-tis", "triage-none", "gate_only-tis", "repair_only-tis"):
            arm, other = pair.split("-", 1)
            parts = []
            for step, c in _headline(grad, kind):
                if pair not in c["paired"]:
                    continue
                q = c["paired"][pair]
                cos = verdict(q["cosine"]["diff"], q["cosine"]["ci"], 1, adj[(step, kind, pair, "cosine")])
                b2 = verdict(q["bias2"]["diff"], q["bias2"]["ci"], -1, adj[(step, kind, pair, "bias2")])
                parts.append(f"step {step}: cosine {sfmt(q['cosine']['diff'])} ({cos}), bias² "
                             f"{sfmt(q['bias2']['diff'])} ({b2})")
            lc = learn["comparisons"].get(f"{kind}:{pair}")
            if lc:
                parts.append("learning: AUC " + f"{sfmt(lc['auc']['diff'])} ("
                             + verdict(lc["auc"]["diff"], lc["auc"]["ci"], 1, lc["auc"]["p_holm"]) + "), final "
                             + f"{sfmt(lc['final']['diff'])} ("
                             + verdict(lc["final"]["diff"], lc["final"]["ci"], 1, lc["final"]["p_holm"]) + ")")
            if parts:
                lines.append(f"- **{head}, {LABELS[arm]} vs {LABELS[other]}**: " + "; ".join(parts) + ".")
    return lines


# --- figures --------------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, out: pathlib.Path, caption: str) -> None:
    import textwrap

    fig.text(0.01, 0.005, "\n".join(textwrap.wrap(caption, 190)), fontsize=7.5, va="bottom", ha="left")
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, dpi=80, format="png")
    finally:
        plt.close(fig)


def gradient_figure(cfg: ControlledConfig, grad: list[dict], out: pathlib.Path) -> None:
    plt = _plt()
    kinds = list(cfg.kinds)
    fig, axes = plt.subplots(2, len(kinds), figsize=(3.6 * len(kinds), 6.4), squeeze=False)
    arms = [a for a in ARMS if a in cfg.arms]
    steps = [x["step"] for x in grad]
    rng = np.random.default_rng(0)
    width = 0.8 / len(arms)
    for j, kind in enumerate(kinds):
        hl = dict(_headline(grad, kind))
        for i, a in enumerate(arms):
            xs = np.arange(len(steps)) + (i - (len(arms) - 1) / 2) * width
            col = colour(a)
            for k, x in enumerate(grad):
                s = x["on_policy"] if a == "on_policy" else hl[x["step"]]["arms"][a]
                pts = np.asarray(s["per_seed_cosine"])
                axes[0, j].scatter(xs[k] + rng.uniform(-width / 3, width / 3, len(pts)), pts, s=2, color=col,
                                   alpha=0.15, lw=0)
            for row, key in ((0, "cosine"), (1, "bias")):
                ss = [x["on_policy"] if a == "on_policy" else hl[x["step"]]["arms"][a] for x in grad]
                val = [s[key]["mean" if key == "cosine" else "value"] for s in ss]
                lo = [v - s[key]["ci"][0] for v, s in zip(val, ss)]
                hi = [s[key]["ci"][1] - v for v, s in zip(val, ss)]
                axes[row, j].errorbar(xs, val, yerr=[lo, hi], fmt="o", color=col, ms=5, capsize=3,
                                      label=LABELS.get(a, a) if j == 0 and row == 0 else None)
        label = next(iter(hl.values()))["label"]
        for row, ylabel in ((0, "cosine to on-policy gradient"), (1, "bias of the mean gradient / |g*|")):
            ax = axes[row, j]
            ax.set_xticks(range(len(steps)), [f"step {s}" for s in steps])
            ax.set_xlabel("parameters of on-policy training step")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0, j].set_title(label, fontsize=9)
    fig.legend(loc="upper center", ncol=len(arms), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    _save(plt, fig, out, f"Gradient quality per arm and mismatch. Top: cosine of each seed's one-batch gradient to the "
          f"on-policy reference g* (dots: the {cfg.gradient.seeds} seeds; markers: mean with "
          f"{round(100 * cfg.stats.level)}% bootstrap CI). Bottom: bias |E g - g*| / |g*| from the U-statistic over pairs "
          f"of seeds (noise floors taken out; 0 = unbiased), with {round(100 * cfg.stats.level)}% jackknife CI. No "
          "smoothing.")


def sweep_figure(cfg: ControlledConfig, grad: list[dict], out: pathlib.Path) -> bool:
    kinds = [k for k in cfg.kinds if any(not c["headline"] and c["kind"] == k for x in grad for c in x["conditions"])]
    if not kinds:
        return False
    plt = _plt()
    arms = [a for a in CORRECTED if a in cfg.arms]
    fig, axes = plt.subplots(2 * len(grad), len(kinds), figsize=(3.6 * len(kinds), 2.6 * 2 * len(grad)),
                             squeeze=False)
    xlabel = {"noise": "noise σ (logits)", "temperature": "sampler temperature τ", "burst": "burst logit b"}
    for r, x in enumerate(grad):
        for j, kind in enumerate(kinds):
            conds = sorted((c for c in x["conditions"] if c["kind"] == kind), key=lambda c: float(c["level"]))
            lv = [float(c["level"]) for c in conds]
            for row, key, ylabel in ((2 * r, "cosine", "cosine"), (2 * r + 1, "bias", "bias / |g*|")):
                ax = axes[row, j]
                for a in arms:
                    val = [c["arms"][a][key]["mean" if key == "cosine" else "value"] for c in conds]
                    ci = np.asarray([c["arms"][a][key]["ci"] for c in conds])
                    ax.plot(lv, val, "o-", color=colour(a), label=LABELS.get(a, a) if (r, j, row) == (0, 0, 0) else None)
                    ax.fill_between(lv, ci[:, 0], ci[:, 1], color=colour(a), alpha=0.2, lw=0)
                on = x["on_policy"][key]
                ax.axhline(on["mean" if key == "cosine" else "value"], color=colour("on_policy"), lw=1, ls="--",
                           label=LABELS["on_policy"] if (r, j, row) == (0, 0, 0) else None)
                ax.set_xlabel(xlabel[kind])
                ax.set_ylabel(f"{ylabel} (step {x['step']})")
                ax.grid(alpha=0.3)
    fig.legend(loc="upper center", ncol=len(arms) + 1, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    _save(plt, fig, out, f"Magnitude sweep: mean cosine and bias per arm (bands: {round(100 * cfg.stats.level)}% "
          f"bootstrap CI of the cosine over {cfg.gradient.seeds} seeds, jackknife CI of the bias), at the parameters of "
          "each snapshot step (rows). Dashed: the on-policy arm. No smoothing.")
    return True


def learning_figure(cfg: ControlledConfig, learn: dict, out: pathlib.Path) -> bool:
    runs = learn["runs"]
    if not runs:
        return False
    plt = _plt()
    kinds = list(cfg.kinds)
    fig, axes = plt.subplots(2, len(kinds), figsize=(3.8 * len(kinds), 6.8), squeeze=False)
    pct = round(100 * cfg.stats.level)
    for j, kind in enumerate(kinds):
        ax = axes[0, j]
        names = (["on_policy"] if "on_policy" in runs else []) + [f"{kind}_{a}" for a in CORRECTED
                                                                  if f"{kind}_{a}" in runs]
        for name in names:
            r = runs[name]
            col = colour(r["arm"])
            steps = r["eval_steps"]
            for seed_curve in r["per_seed"]:
                ax.plot(steps, seed_curve, color=col, lw=0.4, alpha=0.06)
            ci = np.asarray(r["ci"])
            ax.fill_between(steps, ci[:, 0], ci[:, 1], color=col, alpha=0.3, lw=0)
            ax.plot(steps, r["mean"], color=col, lw=2, label=LABELS.get(r["arm"], r["arm"]) if j == 0 else None)
        ax.set_title(runs[names[-1]]["mismatch"] if len(names) > 1 else kind, fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel("learner's expected reward (exact)")
        ax.grid(alpha=0.3)
        ax = axes[1, j]
        for pair in ("none-on_policy", "tis-none", "triage-none", "triage-tis", "gate_only-tis", "repair_only-tis"):
            c = learn["comparisons"].get(f"{kind}:{pair}")
            if not c:
                continue
            a, b = pair.split("-", 1)
            col = colour(a)
            ls = "--" if b == "tis" else "-"
            steps = runs[f"{kind}_{a}"]["eval_steps"]
            ci = np.asarray(c["diff_ci"])
            ax.fill_between(steps, ci[:, 0], ci[:, 1], color=col, alpha=0.2, lw=0)
            ax.plot(steps, c["diff_mean"], color=col, ls=ls, lw=1.8,
                    label=f"{LABELS.get(a, a)} - {LABELS.get(b, b)}" if j == 0 else None)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("training step")
        ax.set_ylabel("paired difference in expected reward")
        ax.grid(alpha=0.3)
    h0, l0 = axes[0, 0].get_legend_handles_labels()
    h1, l1 = axes[1, 0].get_legend_handles_labels()
    axes[0, 0].legend(h0, l0, fontsize=7, loc="lower right")
    axes[1, 0].legend(h1, l1, fontsize=7, loc="lower left")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    n = cfg.learning.seeds
    _save(plt, fig, out, f"Learning curves, one column per mismatch; the on-policy arm (black) is the same runs in "
          f"every column. Top: the learner's exact expected reward (its own policy, no sampling noise) every "
          f"{cfg.learning.eval_every} steps; thin lines: each of the {n} seeds; thick: the mean; band: {pct}% "
          f"bootstrap CI of the mean. Bottom: paired differences (seed s against seed s; dashed: against TIS) "
          f"with {pct}% CI. Arms that coincide (the gate and repair never fire) draw over each other. No smoothing.")
    return True


def write_report(cfg: ControlledConfig, grad: list[dict], learning: dict[str, dict]) -> dict:
    from trainers.controlled.policy import EnsembleMLP

    out = pathlib.Path(cfg.output_dir)
    params = EnsembleMLP.init([0], cfg.task.vocab, cfg.policy.hidden, cfg.seed).num_params()
    learn = learning_summary(cfg, learning)
    results = {"config": cfg.to_dict(), "policy_params": params, "gradient": _per_seed_rounded(grad, 3),
               "learning": learn, "learning_runs": [n for n, _, _ in learning_runs(cfg)]}
    atomic_write_json(out / "results.json", _finite(results), separators=(",", ":"), indent=None)
    atomic_write_text(out / "table.md", tables(cfg, grad, learn, params))
    gradient_figure(cfg, grad, out / "gradient.png")
    sweep_figure(cfg, grad, out / "sweep.png")
    learning_figure(cfg, learn, out / "learning.png")
    return results


def _per_seed_rounded(obj, nd: int):
    """A copy with every ``per_seed_cosine`` list rounded to ``nd`` decimals (the committed file stays small)."""
    if isinstance(obj, dict):
        return {k: [round(v, nd) for v in x] if k == "per_seed_cosine" else _per_seed_rounded(x, nd)
                for k, x in obj.items()}
    if isinstance(obj, list):
        return [_per_seed_rounded(v, nd) for v in obj]
    return obj


def _finite(obj):
    """JSON-safe: NaN/inf as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
