"""``eval run``: generate k responses per prompt for each task, score them, and write the results.

Output directory:
- ``results.json``: per-task avg@k with std over the k runs and every metric, the equal-weighted average,
  generation throughput and the protocol (prompt template, sampling settings, seeds, engine, precision,
  data sources, scorers, IFEval's NLTK deviation);
- ``results.md``: the same as a markdown table;
- ``samples.jsonl``: one record per response (task, index, sample, prompt, response, extracted answer, gold,
  correct, tokens, finish reason).
All three are written atomically (temp file, then ``os.replace``).

Defaults follow report §6.2.2 where it states one (k per task, IFEval prompt-level strict, equal task
weights); the report does not state the sampling settings, so temperature 0.6 / top-p 0.95 (Qwen3's
recommended reasoning settings) and 8192 new tokens are our defaults, and the protocol says so.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import pathlib
import re
import sys
import time
from dataclasses import asdict, dataclass, field

from eval.data import load_rows, resolve_source
from eval.engines import GenerationParams, get_engine
from eval.engines.base import Engine, render_prompt
from eval.metrics import equal_weighted_average, summarize_task
from eval.report import atomic_write_json, atomic_write_text, run_markdown
from eval.task import MATH_PROMPT_SUFFIX, Task, get_task
from minite_util.fileio import atomic_path, sha256_file

DEFAULT_TASKS = ("aime24", "aime25", "math500", "gsm8k", "ifeval")  # the report's Table 6-8 task set
SAMPLING_DEFAULTS_NOTE = ("report §6.2.2 states k per task but not the sampling settings; temperature 0.6, "
                          "top_p 0.95 and max_new_tokens 8192 are this library's defaults")


@dataclass(frozen=True)
class RunConfig:
    model: str
    tasks: tuple[str, ...] = DEFAULT_TASKS
    samples: dict[str, int] = field(default_factory=dict)  # overrides of each task's default k
    engine: str = "local"
    precision: str | None = None
    exclude: tuple[int | str, ...] = ()  # with precision: module patterns and block indices left unquantized
    # "report": each task's k (report §6.2.2) and the given token budget; "quick": the CPU defaults of
    # ``eval run`` (k = 1, a short budget), recorded so that a quick number is never mistaken for a report one
    protocol: str = "report"
    alignment: str = "default"
    limit: int | None = None
    output_dir: str | None = None
    params: GenerationParams = field(default_factory=GenerationParams)
    data_dir: str | None = None
    datasets: dict[str, str] = field(default_factory=dict)  # task -> jsonl path or hf:ID[:SPLIT]
    device: str | None = None
    dtype: str | None = None
    chat_template: bool = True
    chat_template_kwargs: dict = field(default_factory=dict)  # e.g. {"enable_thinking": False} for Qwen3

    def __post_init__(self) -> None:
        tasks = [get_task(t).name for t in self.tasks]  # raises with the valid names
        if not tasks:
            raise ValueError("no tasks given")
        for name, mapping in (("--samples", self.samples), ("--dataset", self.datasets)):
            for t in mapping:
                if t not in tasks:
                    raise ValueError(f"{name} names task {t!r}, which is not among the tasks being run "
                                     f"({', '.join(tasks)})")
        if self.alignment not in ("default", "strict"):
            raise ValueError(f"unknown alignment {self.alignment!r}; valid: default, strict")
        if self.alignment == "strict" and self.engine != "local":
            raise ValueError(f"alignment 'strict' needs the local engine (got --engine {self.engine})")
        for t, k in self.samples.items():
            if not isinstance(k, int) or k < 1:
                raise ValueError(f"--samples {t}={k!r}: the number of samples must be an integer >= 1")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")


def parse_samples(spec: str | None) -> dict[str, int]:
    """``"aime24=6,math500=4"`` -> ``{"aime24": 6, "math500": 4}``."""
    out: dict[str, int] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep or not value.strip().isdigit():
            raise ValueError(f"--samples entry {part!r} must look like TASK=K (e.g. aime24=6)")
        out[get_task(name).name] = int(value)
    return out


def _slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.basename(os.path.normpath(model)) or model)[:80]


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def _protocol(cfg: RunConfig, tasks: list[Task], ks: dict[str, int], engine: Engine, sources: dict) -> dict:
    proto = {
        "prompt_template": {
            "math": "{problem}" + MATH_PROMPT_SUFFIX,
            "ifeval": "{prompt} (unchanged)",
            "chat": ("tokenizer chat template, one user turn, add_generation_prompt=True"
                     + (f", {json.dumps(cfg.chat_template_kwargs)}" if cfg.chat_template_kwargs else ""))
                    if cfg.chat_template else "none: raw prompt text",
        },
        "temperature": cfg.params.temperature,
        "top_p": cfg.params.top_p,
        "top_k": cfg.params.top_k,
        "max_new_tokens": cfg.params.max_new_tokens,
        "seed": cfg.params.seed,
        "batch_size": cfg.params.batch_size,
        "sampling_defaults": SAMPLING_DEFAULTS_NOTE,
        "samples": {t.name: {"k": ks[t.name], "default_from": t.samples_source if t.name not in cfg.samples
                             else ("--samples or --protocol quick" if cfg.protocol == "quick" else "--samples")}
                    for t in tasks},
        "engine": engine.describe(),
        "precision": cfg.precision or "none",
        "exclude": list(cfg.exclude),
        "protocol": cfg.protocol,
        "alignment": cfg.alignment,
        "limit": cfg.limit,
        "data": sources,
        "aggregation": "per task: mean and sample std over the k runs; average: equal weight per task "
                       "(report §6.2.2)",
        "math_scoring": f"math-verify {_version('math-verify')}, gold first; final answer after </think>; "
                        "\\boxed{} (nested); GSM8K: boxed, else ####, else last number; integers normalised",
        "versions": {p: _version(p) for p in ("torch", "transformers", "math-verify", "if-verifiable", "vllm")},
    }
    if any(t.name == "ifeval" for t in tasks):
        from eval.ifeval_checkers import instruction_registry, punkt_status

        _, backend = instruction_registry()
        proto["ifeval_scoring"] = {"checkers": f"official IFEval checkers from {backend}",
                                   "primary_metric": "prompt_level_strict", "langdetect_seed": 0,
                                   "thinking": "text after the last </think> is checked",
                                   "checker_seeding": "checkers built under a seed from their id and arguments "
                                                      "(fixes the random letter of key 1122's letter_frequency)",
                                   **punkt_status()}
    return proto


def plan_text(cfg: RunConfig, tasks: list[Task], ks: dict[str, int], examples: dict[str, list]) -> str:
    """What a run will do, printed before the model loads: prompts x k per task, responses, the token budget."""
    parts = [f"{t.name} {len(examples[t.name])} x k={ks[t.name]}" for t in tasks]
    total = sum(len(examples[t.name]) * ks[t.name] for t in tasks)
    line = (f"[eval] plan: {', '.join(parts)} = {total} responses of up to {cfg.params.max_new_tokens} new tokens "
            f"(at most {total * cfg.params.max_new_tokens:,} tokens), protocol {cfg.protocol}")
    if cfg.protocol == "quick":
        line += ("; quick numbers are not the report's: pass --protocol report for each task's k (§6.2.2) and "
                 "8192 new tokens")
    return line


def run_eval(cfg: RunConfig, *, engine: Engine | None = None, show_progress: bool = True) -> dict:
    """Run the evaluation described by ``cfg``; returns the results dict that is also written to disk."""
    tasks = [get_task(t) for t in cfg.tasks]
    ks = {t.name: cfg.samples.get(t.name, t.default_samples) for t in tasks}
    examples, sources = {}, {}
    for t in tasks:  # load every data file before the model, so bad input fails fast
        rows = load_rows(t, data_dir=cfg.data_dir, dataset=cfg.datasets.get(t.name))
        examples[t.name] = t.examples(rows)[: cfg.limit] if cfg.limit else t.examples(rows)
        sources[t.name] = {"source": resolve_source(t, cfg.data_dir, cfg.datasets.get(t.name)),
                           "rows": len(rows), "evaluated": len(examples[t.name])}
    if any(t.name == "ifeval" for t in tasks):
        from eval.ifeval_checkers import instruction_registry

        instruction_registry()  # fail before generation if the checkers are missing
    if show_progress:
        print(plan_text(cfg, tasks, ks, examples), file=sys.stderr, flush=True)
    if engine is None:
        extra = {"alignment": cfg.alignment} if cfg.alignment != "default" else {}
        if cfg.exclude:
            extra["exclude"] = cfg.exclude
        engine = get_engine(cfg.engine, cfg.model, dtype=cfg.dtype, device=cfg.device, precision=cfg.precision,
                            **extra)
    out_dir = pathlib.Path(cfg.output_dir or os.path.join(
        "outputs", "eval", f"{_slug(cfg.model)}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"))
    out_dir.mkdir(parents=True, exist_ok=True)
    # an earlier run's results go first: a run killed before its own results.json is written then leaves
    # samples.jsonl without results (visibly incomplete), never results of one run beside samples of another
    for stale in [out_dir / "results.json", out_dir / "results.md", *out_dir.glob(".samples.jsonl.*.tmp"),
                  *out_dir.glob(".results.*.tmp")]:
        stale.unlink(missing_ok=True)

    from tqdm.auto import tqdm

    total = sum(len(examples[t.name]) * ks[t.name] for t in tasks)
    bar = tqdm(total=total, desc="eval", unit="resp", disable=not show_progress, dynamic_ncols=True)
    summaries: dict[str, dict] = {}
    gen_tokens, gen_seconds = 0, 0.0
    try:
        with atomic_path(out_dir / "samples.jsonl") as tmp_samples, \
                open(tmp_samples, "w", encoding="utf-8") as fsamples:
            for t in tasks:
                exs, k = examples[t.name], ks[t.name]
                bar.set_description(f"eval {t.name}")
                prompt_ids = [render_prompt(engine.tokenizer, e.prompt, chat_template=cfg.chat_template,
                                            template_kwargs=cfg.chat_template_kwargs) for e in exs]
                t0 = time.perf_counter()
                gens = engine.generate(prompt_ids, k, cfg.params, progress=bar.update)
                gen_seconds += time.perf_counter() - t0
                runs: list[list] = [[] for _ in range(k)]
                for e, per_prompt in zip(exs, gens):
                    for s, g in enumerate(per_prompt):
                        sc = t.score(g.text, e)
                        runs[s].append(sc)
                        gen_tokens += g.num_tokens
                        rec = {"task": t.name, "index": e.index, "sample": s, "prompt": e.prompt, "response": g.text,
                               "extracted": sc.extracted, "gold": e.gold, "correct": sc.correct,
                               "num_tokens": g.num_tokens, "finish_reason": g.finish_reason}
                        if sc.details:
                            rec["details"] = sc.details
                        fsamples.write(json.dumps(rec, ensure_ascii=False) + "\n")
                summaries[t.name] = summarize_task(t, runs)
                bar.set_postfix({t.name: f"{100 * summaries[t.name]['mean']:.1f}%"})
    finally:
        bar.close()

    results = {
        "model": cfg.model,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tasks": summaries,
        "average": equal_weighted_average(summaries),
        "generation": {"responses": total, "tokens": gen_tokens, "seconds": gen_seconds,
                       "tokens_per_s": gen_tokens / gen_seconds if gen_seconds > 0 else None},
        "protocol": _protocol(cfg, tasks, ks, engine, sources),
        "samples_sha256": sha256_file(out_dir / "samples.jsonl"),  # ties the two files together
        "config": {**{k: v for k, v in asdict(cfg).items() if k != "params"}, "params": asdict(cfg.params)},
    }
    atomic_write_json(out_dir / "results.json", results)
    atomic_write_text(out_dir / "results.md", run_markdown(results))
    results["output_dir"] = str(out_dir)
    return results

