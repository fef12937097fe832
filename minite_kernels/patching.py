"""``quantize_model``: swap a Hugging Face causal LM's linears for recipe-quantized modules (report §4.3, §7.1).

What is swapped:
  - every ``nn.Linear`` (attention q/k/v/o, MLP gate/up/down, MoE shared experts...) → :class:`Linear`
    sharing the same parameters (no copy, meta tensors fine);
  - fused MoE experts (a module with 3-D ``gate_up_proj`` ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]``
    parameters and an ``act_fn``, e.g. transformers 5.x ``Qwen3MoeExperts``) → :class:`GroupedExperts`.
What stays BF16: embeddings (lookups, not GEMMs), MoE routers (not ``nn.Linear`` in transformers 5), and
``lm_head`` unless ``lm_head=True``; layers excluded by index or name; layers whose dims the recipe's
blocks do not divide (e.g. K % 16 != 0 for NVFP4): these are left in BF16 and reported as ``skipped`` with
the reason, never silently padded.

The :class:`QuantizationReport` lists every linear with its recipe and forward/backward settings, and the
coverage ``quantized linear parameters / all linear parameters`` (lm_head and experts included, embeddings
not). With ``run_dir`` it is merged into ``run_dir/run_meta.json`` under the key ``"quantization"``
(atomic write; other keys in an existing file are kept).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from minite_kernels.modules.functional import WeightCache
from minite_kernels.modules.linear import Linear, check_features
from minite_kernels.modules.moe import GroupedExperts
from minite_kernels.options import options, resolve_kernels
from minite_kernels.recipes import (
    ENV_DISABLE_BACKWARD_QUANT,
    ENV_RECIPE,
    LayerSelector,
    PrecisionRecipe,
    layer_index,
    resolve_recipe,
)
from minite_util.fileio import atomic_write_json

RUN_META = "run_meta.json"


@dataclass(frozen=True)
class LayerEntry:
    name: str
    kind: str  # "Linear" | "GroupedExperts"
    status: str  # "quantized" | "bf16" | "skipped"
    recipe: str
    params: int
    forward: str
    backward: str
    reason: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class QuantizationReport:
    recipe: str
    recipe_source: str
    backward_bypass: bool
    backend: str
    layers: list[LayerEntry] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)
    #: the execution options active when the model was patched (``minite_kernels.options``)
    options: dict[str, str] = field(default_factory=dict)
    #: the recipe's kernel choice with those options' overrides: what its linears run
    kernels: dict[str, str] = field(default_factory=dict)
    recipe_spec: dict = field(default_factory=dict)
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def linear_params(self) -> int:
        return sum(e.params for e in self.layers)

    @property
    def quantized_params(self) -> int:
        return sum(e.params for e in self.layers if e.status == "quantized")

    @property
    def coverage(self) -> float:
        return self.quantized_params / self.linear_params if self.linear_params else 0.0

    @property
    def swapped(self) -> list[str]:
        return [e.name for e in self.layers if e.status == "quantized"]

    @property
    def skipped(self) -> list[LayerEntry]:
        return [e for e in self.layers if e.status == "skipped"]

    def to_dict(self) -> dict:
        return {
            "recipe": self.recipe,
            "recipe_source": self.recipe_source,
            "backward_bypass": self.backward_bypass,
            "backend": self.backend,
            "coverage": self.coverage,
            "quantized_params": self.quantized_params,
            "linear_params": self.linear_params,
            "num_swapped": len(self.swapped),
            "num_skipped": len(self.skipped),
            "env": self.env,
            "options": self.options,
            "kernels": self.kernels,
            "recipe_spec": self.recipe_spec,
            "versions": self.versions,
            "layers": [e.to_dict() for e in self.layers],
        }

    def summary(self) -> str:
        bypass = ", DISABLE_BACKWARD_QUANT" if self.backward_bypass else ""
        lines = [
            (
                f"recipe {self.recipe} ({self.recipe_source}{bypass}), backend {self.backend}: "
                f"{len(self.swapped)} layers quantized, coverage {self.coverage:.1%} of {self.linear_params:,} "
                "linear params"
            )
        ]
        for e in self.layers:
            if e.status != "quantized" or e.recipe != self.recipe:
                lines.append(f"  {e.name}: {e.status} ({e.recipe}) - {e.reason}")
        return "\n".join(lines)

    def write(self, run_dir: str | os.PathLike) -> Path:
        """Merge into ``run_dir/run_meta.json`` under ``"quantization"`` (atomic: temp file + os.replace)."""
        return update_run_meta(run_dir, {"quantization": self.to_dict()})


def update_run_meta(run_dir: str | os.PathLike, updates: Mapping[str, Any]) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_META
    meta: dict = {}
    if path.exists():
        try:
            meta = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} exists but is not valid JSON ({e}); refusing to overwrite it") from None
    meta.update(updates)
    atomic_write_json(path, meta, sort_keys=True, default=str, ensure_ascii=True)
    return path


def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _versions() -> dict[str, str | None]:
    from minite_kernels._version import __version__

    v: dict[str, str | None] = {"minite_kernels": __version__, "torch": torch.__version__}
    try:
        import transformers

        v["transformers"] = transformers.__version__
    except ImportError:
        v["transformers"] = None
    v["source_revision"] = _git_revision()
    return v


def is_fused_experts(module: nn.Module) -> bool:
    """HF fused experts: 3-D ``gate_up_proj`` and ``down_proj`` parameters plus an ``act_fn``."""
    gu, dp = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (
        isinstance(gu, nn.Parameter)
        and isinstance(dp, nn.Parameter)
        and gu.dim() == 3
        and dp.dim() == 3
        and hasattr(module, "act_fn")
    )


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _num_layers(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    n = getattr(cfg, "num_hidden_layers", None)
    if n is None and cfg is not None and hasattr(cfg, "get_text_config"):
        n = getattr(cfg.get_text_config(), "num_hidden_layers", None)
    if n is None:
        idx = [layer_index(name) for name, _ in model.named_modules()]
        idx = [i for i in idx if i is not None]
        n = max(idx) + 1 if idx else None
    return n


def _patch_one(
    model: nn.Module, name: str, module: nn.Module, selector: LayerSelector, *, lm_head: bool, backend: str
) -> LayerEntry:
    """Replace one linear / fused-experts module if its recipe applies; return its report entry."""
    kind = "GroupedExperts" if is_fused_experts(module) else "Linear"
    if kind == "GroupedExperts":
        params = module.gate_up_proj.numel() + module.down_proj.numel()
    else:
        params = module.weight.numel()

    def bf16(status: str, reason: str) -> LayerEntry:
        return LayerEntry(name, kind, status, "bf16", params, "bf16", "bf16", reason)

    if name.split(".")[-1] == "lm_head" and not lm_head:
        return bf16("bf16", "lm_head stays BF16 (pass lm_head=True to quantize it)")
    r, why = selector.select(name)
    if r is None or not r.quantized:
        return bf16("bf16", why if r is None else f"{why}: recipe {r.name} is BF16")
    try:
        if kind == "GroupedExperts":
            new = GroupedExperts.from_hf(module, r, backend=backend)
        else:
            check_features(r, module.in_features, module.out_features, name)
            new = Linear.from_linear(module, r, backend=backend)
    except ValueError as e:
        return bf16("skipped", f"recipe {r.name} does not fit, left BF16: {e}")
    _set_module(model, name, new)
    return LayerEntry(name, kind, "quantized", r.name, params, r.forward_precision, r.backward_precision, why)


def quantize_model(
    model: nn.Module,
    recipe: str | PrecisionRecipe | None = None,
    *,
    overrides: Mapping[str, str | PrecisionRecipe]
    | Iterable[tuple[str, str | PrecisionRecipe]]
    | None = None,
    exclude: Iterable[int | str] | int | str | None = None,
    run_dir: str | os.PathLike | None = None,
    lm_head: bool = False,
    backend: str = "auto",
) -> QuantizationReport:
    """Swap ``model``'s linears in place for recipe-quantized modules and return the report.

    ``recipe``: name or :class:`PrecisionRecipe`; None resolves ``$MINITE_RECIPE``, then the default.
    ``overrides``: ``{pattern: recipe}`` with glob or ``re:regex`` patterns on module names (first match wins;
    ``"bf16"`` keeps a layer unquantized). ``exclude``: block indices (negative from the end, e.g.
    ``[-1, -2]`` keeps the last two blocks in BF16) or name patterns. ``lm_head=True`` also quantizes the
    output head. Modules already quantized by this library are left as they are.
    """
    base, source = resolve_recipe(recipe)
    selector = LayerSelector.build(base, overrides, exclude, num_layers=_num_layers(model))
    report = QuantizationReport(
        recipe=base.name,
        recipe_source=source,
        backward_bypass=base.backward_bypass,
        backend=backend,
        env={k: os.environ.get(k) for k in (ENV_RECIPE, ENV_DISABLE_BACKWARD_QUANT)},
        options=options().to_dict(),
        kernels=resolve_kernels(base.kernels).to_dict(),
        recipe_spec=base.to_dict(),
        versions=_versions(),
    )

    targets: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, (Linear, GroupedExperts)) or getattr(module, "_weight_cache", None) is not None:
            continue
        if isinstance(module, nn.Linear) or is_fused_experts(module):
            targets.append((name, module))
    for name, module in targets:
        report.layers.append(_patch_one(model, name, module, selector, lm_head=lm_head, backend=backend))

    if run_dir is not None:
        report.write(run_dir)
    return report


def invalidate_quantized_weights(model: nn.Module) -> int:
    """Drop every cached quantized weight in ``model`` (normally automatic via the weight version counter;
    use after replacing parameter storage out-of-band). Returns the number of caches cleared."""
    n = 0
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, WeightCache):
                value.clear()
                n += 1
    return n
