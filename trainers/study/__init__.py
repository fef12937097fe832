"""``python -m trainers.study STUDY.yaml [--train-seconds N] [key=value ...]``: a grid of GRPO runs, then its
summary and figures.

A study is training recipes (arms) x seeds on one task. Each cell is an ordinary ``trainers.grpo`` run directory
``<output_dir>/<arm>/seed<k>``, then an ``eval run`` of its last checkpoint under the arm's own sampler precision
(the policy as it was trained and sampled) in ``<run>/eval/<checkpoint>``, unless the run evaluated that step itself
(``eval.every``: every run evaluates at the same steps, inside its process), and of the untrained model once per
distinct eval setting in ``<output_dir>/step0/`` (the baseline; ``eval.step0: false`` skips it). ``--train-seconds N`` stops training
after N seconds: each run gets SIGTERM, finishes and saves the step in progress (killed if it takes longer than
``STOP_GRACE_S``), resumes from there next time, and what was reached is evaluated. At the end the study writes

    summary.json   {"runs": [{recipe, seed, steps, final_reward, eval_accuracy, abs_gap_mean, ...}], "arms": {...}}
    table.md       per arm, mean +- sample std over seeds: reward at equal steps, held-out accuracy (of the last
                   checkpoints, and by checkpoint step), mean |delta|,
                   q05(delta), gated-token fraction, the gate's gradient shift, repair loss, step time, and
                   which code the runs ran (each run's ``code.json``, ``trainers/provenance.py``: seeds added in
                   blocks over several sessions show there if they ran other code)
    reward.png     reward per arm: each seed raw (thin), the seed mean of each run's moving mean (thick), arm colours
                   fixed by role (``trainers.palette``)
    panels.png     the report's Figure-2 panels (reward, entropy, mean |gap|, negative tail) the same way
    heldout.png    held-out accuracy (``val/average``) per arm at the eval steps, when the runs evaluate themselves

Resuming: a run whose ``metrics.jsonl`` reaches ``trainer.max_steps`` is not started again, an interrupted one
continues from its checkpoint (``trainer.resume=auto``), and an eval with a ``results.json`` is reused, so the
same command finishes an interrupted grid.

Study file (``recipes/study_arithmetic.yaml``)::

    name: arithmetic
    output_dir: runs/study_arithmetic
    arms: [bf16, nvfp4, tis_nvfp4, triage_nvfp4]
    seeds: [0, 1, 2]
    parallel: 1                 # runs at once (processes); each gets cpu_count // parallel threads
    gpu_gb_per_run: 0           # > 0: GB one CUDA run holds; caps parallel at what the GPU holds
    train: {trainer.max_steps: 200, rollout.max_new_tokens: 256}   # key=value for every run
    eval: {tasks: arithmetic, temperature: 0.0, max_new_tokens: 64}
    steps_at: [50, 100, 200]    # "reward at equal steps" columns (default: quarters of max_steps)
    window: 10                  # steps in each moving mean
    baseline: nvfp4             # optional: every other arm against it at equal steps (difference, Welch se,
                                # permutation p; trainers/compare.py), in summary.json and table.md
    defaults: [other_study]     # optional: start from other_study.yaml beside this file (keys here win)
"""
from __future__ import annotations

# The package, one concern a module (each imports only the ones before it; the docstring above is the
# command's --help, so the layout is told here):
#
# - trainers.study.config: the study file (StudyConfig, EvalSpec, StudyError, load_study) and each run's trainer
#   arguments (train_args, max_steps);
# - trainers.study.evals: the `eval run` command lines of a run's last checkpoint and of the untrained model;
# - trainers.study.results: metrics and eval results read back, per-run records, the statistics over seeds and
#   the arms against the baseline (summarize);
# - trainers.study.tables: table.md, summary.json and the figures (write_outputs), the closing text (where);
# - trainers.study.runner: the processes, `parallel` at a time, and the whole grid (run_study);
# - trainers.study.cli: the command line (main), run by __main__.
#
# The names below are re-exported here: `from trainers.study import X`. A test that patches a name a function
# looks up patches the module that function lives in (trainers.study.runner._run_all, not trainers.study's).
from trainers.study.config import (
    EvalSpec,
    StudyConfig,
    StudyError,
    load_study,
    max_steps,
    study_threads,
    train_args,
)
from trainers.study.evals import _eval_due, eval_args, eval_dir, step0_args
from trainers.study.results import (
    STEP_MEANS,
    comparisons,
    eval_accuracies,
    eval_accuracy,
    is_complete,
    read_metrics,
    results_dir,
    reward_at,
    run_record,
    steps_at,
    summarize,
)
from trainers.study.runner import STOP_GRACE_S, _run_all, run_study
from trainers.study.tables import comparison_table, table, where, write_outputs

__all__ = [
    "STEP_MEANS",
    "STOP_GRACE_S",
    "EvalSpec",
    "StudyConfig",
    "StudyError",
    "_eval_due",
    "_run_all",
    "comparison_table",
    "comparisons",
    "eval_accuracies",
    "eval_accuracy",
    "eval_args",
    "eval_dir",
    "is_complete",
    "load_study",
    "max_steps",
    "read_metrics",
    "results_dir",
    "reward_at",
    "run_record",
    "run_study",
    "step0_args",
    "steps_at",
    "study_threads",
    "summarize",
    "table",
    "train_args",
    "where",
    "write_outputs",
]
