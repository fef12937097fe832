"""``python -m minite_kernels {recipes, describe NAME, doctor, align}`` (report §4.3, §7.3).

``recipes`` and ``describe`` use only the standard library (plus rich, if installed, for tables): they never
import torch, so a configuration can be inspected before CUDA/TE/FlashInfer are set up. ``doctor`` imports
torch and reports the device, optional accelerators, and which backend will run each GEMM of a recipe
and why; it exits 1 when the recipe cannot run at all with the requested backend.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Sequence

from minite_kernels import recipes as R


def _console():
    try:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 140))
        return console
    except ImportError:  # plain-text fallback
        return None


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    console = _console()
    if console is not None:
        from rich.table import Table

        t = Table(title=title, show_lines=False)
        for i, c in enumerate(columns):
            t.add_column(c, overflow="fold", no_wrap=i == 0)
        for r in rows:
            t.add_row(*[str(v) for v in r])
        console.print(t)
        return
    widths = [
        max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(c) for i, c in enumerate(columns)
    ]
    print(title)
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))


def _selected_note() -> str:
    env = os.environ.get(R.ENV_RECIPE)
    note = f"default: {R.DEFAULT_RECIPE}"
    if env:
        note += f"; ${R.ENV_RECIPE}={env}"
    if R._truthy(os.environ.get(R.ENV_DISABLE_BACKWARD_QUANT)):
        note += f"; {R.ENV_DISABLE_BACKWARD_QUANT}=1 (backward bypass: BF16 dgrad/wgrad on original operands)"
    return note


def cmd_recipes(args: argparse.Namespace) -> int:
    items = R.list_recipes(args.group)
    if args.json:
        print(json.dumps([r.to_dict() for r in items], indent=2))
        return 0
    rows = [
        (
            r.name + (" *" if r.name == R.DEFAULT_RECIPE else ""),
            r.group,
            r.fprop.summary(),
            r.dgrad.summary(),
            r.wgrad.summary(),
            r.backward_operands,
        )
        for r in items
    ]
    _table(
        "precision recipes (* = default)", ("name", "group", "fprop", "dgrad", "wgrad", "bwd operands"), rows
    )
    print(R.SUMMARY_LEGEND)
    print(_selected_note())
    return 0


def _describe_rows(r: R.PrecisionRecipe) -> list[tuple[str, ...]]:
    rows = []
    for g in R.GEMMS:
        spec = r.gemm(g)
        for side, role, label, op in zip(("a", "b"), R.GEMM_ROLES[g], R.GEMM_OPERANDS[g], (spec.a, spec.b)):
            rows.append(
                (
                    g,
                    f"{side} = {label}",
                    role,
                    op.format,
                    op.scaling,
                    "x".join(map(str, op.tile or ())) or "-",
                    "yes" if op.rht else "no",
                    "yes" if op.stochastic_rounding else "no",
                )
            )
    return rows


def cmd_describe(args: argparse.Namespace) -> int:
    try:
        r = R.get_qlinear_params(args.name)
    except R.RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r.to_dict(), indent=2))
        return 0
    print(f"{r.name}  [{r.group}]" + ("  (DISABLE_BACKWARD_QUANT=1 applied)" if r.backward_bypass else ""))
    print(f"  {r.description}")
    print(f"  forward:  {r.forward_precision}")
    print(f"  backward: {r.backward_precision}")
    from minite_kernels.options import options, resolve_kernels

    run_as = resolve_kernels(r.kernels)
    over = f" (run as {run_as.summary()}: overridden by {options().overrides})" if run_as != r.kernels else ""
    print(f"  kernels:  {r.kernels.summary()}{over}")
    print(f"  requires: {', '.join(r.requires)}")
    k, n = r.feature_alignment()
    print(
        f"  layer dims: in_features % {k} == 0, out_features % {n} == 0 (else quantize_model keeps it BF16)"
    )
    print(
        "  alignment: default (each kernel's own reduction order) or strict: "
        "`with minite_kernels.strict.StrictMode():` gives every reduction one fixed order (CPU: fp64 rounded once; "
        "CUDA: batch-invariant Triton kernels), so a row's bits do not depend on its batch, padding or length, "
        "and the sampler's log-probs equal the learner's (trainer: precision.alignment=strict; "
        "eval: --alignment strict)"
    )
    _table(
        "operands (every GEMM is A @ B^T, both quantized along the contraction dim)",
        ("gemm", "operand", "role", "format", "scaling", "tile", "rht", "sr"),
        _describe_rows(r),
    )
    return 0


def _package_status(module: str, dist: str) -> dict:
    from importlib import metadata

    info = {
        "module": module,
        "installed": importlib.util.find_spec(module) is not None,
        "version": None,
        "importable": False,
        "error": None,
    }
    if info["installed"]:
        try:
            info["version"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
        try:
            importlib.import_module(module)
            info["importable"] = True
        except Exception as e:  # noqa: BLE001 - a broken optional dependency is a doctor finding, not a crash
            info["error"] = f"{type(e).__name__}: {e}"
    return info


def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        recipe, source = R.resolve_recipe(args.recipe)
    except R.RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as e:
        msg = f"torch is not importable ({e}); every recipe needs torch"
        print(json.dumps({"ok": False, "error": msg}) if args.json else f"error: {msg}")
        return 1
    from minite_kernels.backends import BACKEND_NAMES, NAMED_ONLY, backend_status, device_summary, plan_recipe

    try:
        dev = device_summary(args.device)
    except (RuntimeError, ValueError) as e:
        print(f"error: device {args.device!r}: {e}", file=sys.stderr)
        return 2
    packages = {
        name: _package_status(mod, dist)
        for name, mod, dist in (
            ("triton", "triton", "triton"),
            ("transformer_engine", "transformer_engine", "transformer-engine"),
            ("flashinfer", "flashinfer", "flashinfer-python"),
        )
    }
    backends = {
        name: dict(zip(("available", "reason"), backend_status(name, dev["device"])))
        for name in BACKEND_NAMES + NAMED_ONLY
    }
    try:
        plan = plan_recipe(recipe, args.backend, dev["device"])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ok = all(row["ok"] for row in plan)
    result = {
        "ok": ok,
        "recipe": recipe.name,
        "recipe_source": source,
        "backward_bypass": recipe.backward_bypass,
        "requested_backend": args.backend,
        "torch": torch.__version__,
        **dev,
        "packages": packages,
        "backends": backends,
        "plan": plan,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0 if ok else 1
    print(
        f"torch {torch.__version__}; device {dev['device']}"
        + (f" ({dev['gpu']}, {dev['capability']})" if dev["gpu"] else f" ({dev['capability']})")
    )
    print(f"native FP4/FP8 GEMMs: {'yes' if dev['native_fp4'] else 'no'} - {dev['native_fp4_reason']}")
    _table(
        "optional packages",
        ("package", "installed", "version", "importable", "note"),
        [
            (k, v["installed"], v["version"] or "-", v["importable"], v["error"] or "")
            for k, v in packages.items()
        ],
    )
    _table(
        "backends",
        ("backend", "available", "reason"),
        [(k, v["available"], v["reason"]) for k, v in backends.items()],
    )
    _table(
        f"recipe {recipe.name} ({source}) with backend={args.backend}",
        ("gemm", "operands", "spec", "backend", "why"),
        [
            (
                p["gemm"],
                p["operands"],
                p["spec"],
                p["backend"] if p["ok"] else f"CANNOT RUN ({p['backend']})",
                p["reason"],
            )
            for p in plan
        ],
    )
    print("ok: the recipe can run here" if ok else "error: the recipe cannot run with this backend here")
    return 0 if ok else 1


ALIGN_PROMPTS = ("What is 12 + 7? Answer:", "Write one sentence about the sea.", "List three colours:")


def _load_model(path: str):
    """(model, tokenizer) in fp32 on the CPU: the project's loader (``hf_models``: an HF dir or hub id, or the
    embedded ``smollm2-135m-instruct``)."""
    from minite_kernels.hf_models import load_model_and_tokenizer

    return load_model_and_tokenizer(path, dtype="float32", device="cpu")


def cmd_align(args: argparse.Namespace) -> int:
    """Sampler-shaped (KV-cache decode) vs learner-shaped (full forward) execution, layer by layer, in the
    default and the strict alignment mode (``alignment.execution_gap``)."""
    import torch

    from minite_kernels import quantize_model
    from minite_kernels.alignment import execution_gap
    from minite_kernels.strict import StrictMode

    try:
        r = R.get_qlinear_params(args.recipe)
    except R.RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model, tok = _load_model(args.model)
    if r.name != "bf16":
        quantize_model(model, r.name)
    prompts = [tok.encode(p) for p in (args.prompt or ALIGN_PROMPTS)]
    seqs = []
    with torch.no_grad(), StrictMode():  # one continuation per prompt, the same in both modes
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                 do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
            seqs.append(out[0].tolist())
    report = {}
    for mode in ("default", "strict"):
        with StrictMode() if mode == "strict" else torch.no_grad():
            report[mode] = execution_gap(model, seqs, [len(p) for p in prompts]).to_dict()
    if args.json:
        print(json.dumps({"model": args.model, "recipe": r.name, **report}, indent=2))
        return 0
    for mode in ("default", "strict"):
        g = report[mode]
        lp = g["logprob"]
        print(f"{mode}: next-token log-prob mean |delta| {lp['mean_abs_gap']:.3g}, max {lp['max_abs_gap']:.3g}; "
              f"first differing hidden state: {g['first_diff_layer']}, first with differing NVFP4 codes: "
              f"{g['first_code_diff_layer']}")
    _table(
        f"hidden states, KV-cache decode vs full forward ({args.model}, {r.name}; layer 0 = embeddings)",
        ("layer", "max |d| default", "codes differ default", "max |d| strict", "codes differ strict"),
        [(str(a["layer"]), f"{a['max_abs']:.3g}", f"{100 * a['code_diff_frac']:.3g}%", f"{b['max_abs']:.3g}",
          f"{100 * b['code_diff_frac']:.3g}%") for a, b in zip(report["default"]["layers"], report["strict"]["layers"])],
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m minite_kernels", description="miniTE precision recipes and checks"
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("recipes", help="list the precision recipes (no torch import)")
    s.add_argument("--group", choices=R.GROUPS)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_recipes)
    s = sub.add_parser("describe", help="show one recipe's fprop/dgrad/wgrad operands (no torch import)")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_describe)
    s = sub.add_parser("doctor", help="check torch/CUDA/backends and plan each GEMM of a recipe")
    s.add_argument(
        "--recipe", default=None, help=f"recipe name (default: ${R.ENV_RECIPE} or {R.DEFAULT_RECIPE})"
    )
    s.add_argument("--backend", default="auto", help="auto | emulated | triton | te | flashinfer | strict")
    s.add_argument("--device", default=None, help="torch device (default: current CUDA device, else cpu)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_doctor)
    s = sub.add_parser("align", help="sampler vs learner execution gap by layer, default and strict mode (runs on CPU)")
    s.add_argument("--model", default="smollm2-135m-instruct", help="HF model dir (or the embedded default)")
    s.add_argument("--recipe", default="nvfp4_per_token_bf16_bwd")
    s.add_argument("--prompt", action="append", help="a prompt (repeatable; default: three short ones)")
    s.add_argument("--new-tokens", type=int, default=16, help="greedy continuation compared per token")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_align)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
