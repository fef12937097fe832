"""``python -m eval {run,score,compare,tasks}``."""
from __future__ import annotations

import argparse
import json
import sys

from eval.engines import ENGINES, GenerationParams

PROTOCOLS = ("auto", "report", "quick")
QUICK_MAX_NEW_TOKENS = 256  # a CPU answers a GSM8K question in about this many tokens, or not at all


def _parse_datasets(items: list[str] | None) -> dict[str, str]:
    from eval.task import get_task

    out = {}
    for item in items or []:
        name, sep, src = item.partition("=")
        if not sep or not src:
            raise ValueError(f"--dataset {item!r} must look like TASK=PATH_OR_HF_ID (e.g. math500=hf:HuggingFaceH4/MATH-500)")
        out[get_task(name).name] = src
    return out


def _parse_template_kwargs(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--chat-template-kwargs must be a JSON object, got {text!r} ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"--chat-template-kwargs must be a JSON object, got {type(value).__name__}")  # noqa: TRY004
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval", description="Score checkpoints and response files on "
                                "AIME24, AIME25, MATH-500, AMC23, GSM8K and IFEval (report §6.2.2 protocol).")
    sub = p.add_subparsers(dest="command", required=True)
    d = GenerationParams()

    r = sub.add_parser("run", help="generate with a model and score it")
    r.add_argument("model", help="local HF model dir, checkpoint dir, 'smollm2-135m-instruct' (bundled) or hub id")
    r.add_argument("--tasks", default="aime24,aime25,math500,gsm8k,ifeval",
                   help="comma-separated tasks (default: the report's Table 6-8 set)")
    r.add_argument("--samples", default=None, help="k per task, e.g. aime24=6,math500=4 (default: report §6.2.2)")
    r.add_argument("--engine", default="local", choices=ENGINES)
    r.add_argument("--precision", default=None, help="minite precision recipe (bf16, nvfp4_per_token, ...)")
    r.add_argument("--exclude", default="", metavar="LIST",
                   help="with --precision: comma-separated module patterns and block indices kept unquantized, "
                        "e.g. 0,-1 (the first and last block), as the trainer's precision.exclude")
    r.add_argument("--alignment", default="default", choices=("default", "strict"),
                   help="strict: batch-invariant generation (one fixed reduction order: fp64 on CPU, "
                        "batch-invariant Triton kernels on CUDA; local engine)")
    r.add_argument("--limit", type=int, default=None, help="evaluate only the first N rows of each task")
    r.add_argument("--output-dir", default=None, help="default: outputs/eval/<model>-<time>")
    unstated = "(the report does not state it; library default %(default)s)"
    r.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"default: {d.max_new_tokens} with --protocol report (the report does not state it), "
                        f"{QUICK_MAX_NEW_TOKENS} with quick")
    r.add_argument("--protocol", default="auto", choices=PROTOCOLS,
                   help="report: each task's k from report §6.2.2 and 8192 new tokens; quick: k=1 and "
                        f"{QUICK_MAX_NEW_TOKENS} new tokens, minutes on a CPU; auto (default): report on a GPU, "
                        "quick on the CPU. --samples and --max-new-tokens override either")
    r.add_argument("--temperature", type=float, default=d.temperature, help=unstated + "; 0 = greedy")
    r.add_argument("--top-p", type=float, default=d.top_p, help=unstated)
    r.add_argument("--top-k", type=int, default=d.top_k)
    r.add_argument("--seed", type=int, default=d.seed)
    r.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per batch (local engine)")
    r.add_argument("--data-dir", default=None, help="directory with <task>/test.jsonl or <task>.jsonl")
    r.add_argument("--dataset", action="append", metavar="TASK=SRC",
                   help="per-task jsonl file or Hugging Face id (hf:ORG/NAME[:SPLIT]); repeatable")
    r.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)")
    r.add_argument("--dtype", default=None, help="model dtype (default: bfloat16 on GPU, float32 on CPU)")
    r.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                   help="send raw prompts instead of the tokenizer's chat template")
    r.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help='extra chat-template variables, e.g. \'{"enable_thinking": false}\' for Qwen3')
    r.add_argument("--quiet", action="store_true", help="no progress bar")

    s = sub.add_parser("score", help="score a predictions jsonl produced elsewhere")
    s.add_argument("task")
    s.add_argument("predictions")
    s.add_argument("--json", action="store_true", help="print exactly one JSON line")
    s.add_argument("--data-dir", default=None)
    s.add_argument("--dataset", default=None, help="jsonl path or hf:ORG/NAME[:SPLIT] for the task's data")

    c = sub.add_parser("compare", help="tasks side by side with percentage-point differences (Table 6-8 style)")
    c.add_argument("runs", nargs="+", help="`eval run` output directories or results.json files")
    c.add_argument("--names", default=None, help="comma-separated row names (default: directory names)")
    c.add_argument("--json", action="store_true")

    sub.add_parser("tasks", help="list the available tasks")
    return p


def _parse_exclude(spec: str) -> tuple[int | str, ...]:
    """``"lm_head,0,-1"`` -> ``("lm_head", 0, -1)``: integers are block indices, the rest name patterns."""
    out: list[int | str] = []
    for part in (p.strip() for p in spec.split(",")):
        if part:
            out.append(int(part) if part.lstrip("-").isdigit() else part)
    return tuple(out)


def _device_is_cuda(device: str | None) -> bool:
    if device is not None:
        return device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


def _cmd_run(a: argparse.Namespace) -> int:
    from eval.report import pct
    from eval.runner import RunConfig, parse_samples, run_eval

    tasks = tuple(t.strip() for t in a.tasks.split(",") if t.strip())
    protocol = a.protocol
    if protocol == "auto":
        protocol = "report" if _device_is_cuda(a.device) else "quick"
    samples = parse_samples(a.samples)
    max_new = a.max_new_tokens
    if protocol == "quick":
        from eval.task import get_task

        samples = {**{get_task(t).name: 1 for t in tasks}, **samples}
        max_new = max_new if max_new is not None else QUICK_MAX_NEW_TOKENS
    elif max_new is None:
        max_new = GenerationParams().max_new_tokens
    params = GenerationParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                              max_new_tokens=max_new, seed=a.seed, batch_size=a.batch_size)
    cfg = RunConfig(model=a.model, tasks=tasks, protocol=protocol,
                    samples=samples, engine=a.engine, precision=a.precision, alignment=a.alignment,
                    exclude=_parse_exclude(a.exclude),
                    limit=a.limit,
                    output_dir=a.output_dir, params=params, data_dir=a.data_dir, datasets=_parse_datasets(a.dataset),
                    device=a.device, dtype=a.dtype, chat_template=a.chat_template,
                    chat_template_kwargs=_parse_template_kwargs(a.chat_template_kwargs))
    res = run_eval(cfg, show_progress=not a.quiet)
    for s in res["tasks"].values():
        print(f"{s['title']:>10}  avg@{s['k']} {pct(s['mean'])} ± {pct(s['std'])}  ({s['primary_metric']}, n={s['n']})")
    print(f"{'Average':>10}  {pct(res['average']['mean'])}   -> {res['output_dir']}")
    return 0


def _cmd_score(a: argparse.Namespace) -> int:
    from eval.scoring import score_predictions
    from eval.task import get_task

    out = score_predictions(get_task(a.task), a.predictions, data_dir=a.data_dir, dataset=a.dataset)
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {100 * v:.2f}%" if isinstance(v, float) else f"{k}: {v}")
    return 0


def _cmd_compare(a: argparse.Namespace) -> int:
    from eval.report import compare_table, load_run

    runs = [load_run(p) for p in a.runs]
    names = [n.strip() for n in a.names.split(",")] if a.names else None
    if names and len(names) != len(runs):
        raise ValueError(f"--names has {len(names)} names for {len(runs)} runs")
    table, data = compare_table(runs, names)
    print(json.dumps(data) if a.json else table, end="" if not a.json else "\n")
    return 0


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Bad input and missing optional dependencies: reported in one line, without a traceback."""
    errors: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, ImportError)
    models = sys.modules.get("rollout.models")
    return errors + ((models.ModelLoadError,) if models is not None else ())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "score":
            return _cmd_score(args)
        if args.command == "compare":
            return _cmd_compare(args)
        from eval.task import get_task, task_names

        for n in task_names():
            t = get_task(n)
            print(f"{n:10} {t.title:10} k={t.default_samples}  metric={t.primary_metric}")
        return 0
    except _expected_errors() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
