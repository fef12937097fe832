"""The minite rollout's engine: the sampler's model and the sampler, without verl or Ray.

    engine = MiniteEngine.from_pretrained(path, MiniteRolloutSettings(recipe="nvfp4_per_token_w1x16_bf16_bwd"),
                                          dtype="bfloat16", device="cuda", base_seed=0)
    completions, info = engine.generate(prompts, SamplingParams(max_new_tokens=256), derive_seed=True)
    engine.load_weights(learner_state_items, global_steps=3)   # in place, then re-quantized
    engine.release()            # sleep: the KV cache, graphs and quantized-weight caches go
    engine.resume(["kv_cache"])

The sampler is ``rollout.select.make_sampler`` on the engine's own copy of the model, patched with the
learner's recipe (``rollout.precision.patch_precision``, as the local engine patches): the CUDA-graph engine on CUDA, the reference loop on the
CPU, each returning the processed log-prob of every sampled token.

Weight updates follow the local engine's path for its sampler copy (``trainers.engines.local``:
``_copy_to_sampler`` then ``_weight_sync``): each incoming tensor is copied *in place* into the parameter of the
same name (so the graph engine's captured graphs, which read those addresses, stay valid), then the quantized
weights are re-made: by the grouped re-quantizer (``minite_kernels.modules.weight_sync.ModelWeightSync``) where
minite's Triton kernels run, and by a 1-token forward for whatever it does not cover
(``rollout.precision.Requantizer``, the local engine's too). An update must name every
parameter of the model once (tied weights: either name); an unknown name, a shape mismatch or a missing parameter
is an error, so the sampler never runs on a half-updated model.

Seeds: a request may carry its own seed; otherwise batch ``k`` after the update of step ``s`` draws with
``batch_seed(s, k)`` (from the rollout's base seed), and row ``i`` of a batch with the counter stream
``(seed, i)`` (``rollout.rng``), so a batch's samples do not depend on the batch size, the device or the engine,
and a resumed run draws what the uninterrupted one drew for the same step.

Sleep (``release``): the graph engine's static KV cache and captured graphs, and every module's cached quantized
weights, are dropped and the CUDA caching allocator returns the memory; the next batch allocates them again
(after a weight update the re-quantization already re-made the weights). The parameters stay on the device:
``resume(["weights"])`` has nothing to restore.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from rollout.local import Completion, SamplingParams
from rollout.precision import Requantizer, patch_precision
from rollout.select import make_sampler
from rollout.verl_backend.settings import MiniteRolloutSettings

TAGS = ("weights", "kv_cache")
_MIX = 1_000_003


def batch_seed(base_seed: int, global_steps: int | None, batch: int) -> int:
    """The seed of batch ``batch`` (0, 1, ...) after the weight update of step ``global_steps``."""
    return ((int(base_seed) * _MIX + int(global_steps or 0)) * _MIX) + int(batch)


class MiniteEngine:
    """The sampler and its model (see the module docstring). ``model`` is patched in place with
    ``settings.recipe`` and put in eval mode without gradients."""

    def __init__(self, model, tokenizer, settings: MiniteRolloutSettings, *, base_seed: int = 0) -> None:
        self.settings = settings
        self.model = model.requires_grad_(False).eval()
        self.tokenizer = tokenizer
        self.precision = patch_precision(self.model, settings.recipe, exclude=settings.exclude,
                                         backend=settings.backend, alignment=settings.alignment)
        self.sampler = make_sampler(self.model, tokenizer, batch_size=settings.batch_size, engine=settings.sampler,
                                    alignment=settings.alignment, norm_quant=settings.norm_quant,
                                    fp4_weights=settings.fp4_weights)
        self.base_seed = int(base_seed)
        #: every name a parameter answers to (tied weights: all their names), and the model's persistent buffers
        #: (state-dict entries a learner may send too); one name per parameter, which an update must cover
        state = self.model.state_dict(keep_vars=True)
        self._by_name = dict(self.model.named_parameters(remove_duplicate=False))
        self._by_name.update((n, b) for n, b in self.model.named_buffers(remove_duplicate=False) if n in state)
        self._unique = dict(self.model.named_parameters())
        self.global_steps: int | None = None
        self.asleep = False
        self._batch = 0  # batches since the last weight update
        self._written: set[int] | None = None  # ids of the parameters written by the update in progress
        self._requantize = Requantizer(self.model, self.pad_id, mode=self._alignment_mode)
        self.stats = {"batches": 0, "rows": 0, "weight_updates": 0, "releases": 0}

    @classmethod
    def from_pretrained(cls, path: str, settings: MiniteRolloutSettings, *, dtype: str = "bfloat16",
                        device: str | torch.device = "cpu", base_seed: int = 0) -> MiniteEngine:
        """Load an HF model directory (or hub id, or the embedded alias) and build the engine on ``device``."""
        from rollout.models import load_model_and_tokenizer

        model, tok = load_model_and_tokenizer(path, dtype=dtype, device=str(device))
        return cls(model, tok, settings, base_seed=base_seed)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def pad_id(self) -> int:
        return self.sampler.pad_id

    # ------------------------------------------------------------------------------------------ generate
    def next_seed(self) -> int:
        return batch_seed(self.base_seed, self.global_steps, self._batch)

    def generate(self, prompts: list[list[int]], params: SamplingParams, *, derive_seed: bool = True
                 ) -> tuple[list[Completion], dict[str, Any]]:
        """One sampler call over ``prompts`` (row ``i`` draws from stream ``(seed, i)``). ``derive_seed``: the
        seed is the engine's next batch seed, else ``params.seed``. Returns the completions and
        ``{"global_steps", "seed"}``."""
        if derive_seed:
            params = dataclasses.replace(params, seed=self.next_seed())
            self._batch += 1
        completions = self.sampler.generate(prompts, params)
        self.asleep = False
        self.stats["batches"] += 1
        self.stats["rows"] += len(prompts)
        return completions, {"global_steps": self.global_steps, "seed": params.seed}

    # ------------------------------------------------------------------------------------------ weights
    def begin_update(self) -> None:
        self._written = set()

    def load(self, name: str, tensor: torch.Tensor) -> None:
        """Copy one incoming tensor into the parameter ``name``, in place (any dtype or device)."""
        if self._written is None:
            raise RuntimeError("minite rollout: load() outside a weight update; call begin_update() first")
        p = self._by_name.get(name)
        if p is None:
            hint = (" (packed NVFP4 tensors: set actor_rollout_ref.actor.fsdp_config.qat.enable=false, the minite "
                    "rollout quantizes with its own recipe)" if any(s in name for s in ("_packed", "_scale")) else "")
            raise ValueError(f"minite rollout: update_weights sent {name!r}, which is not in the sampler's "
                             f"model{hint}")
        if tuple(tensor.shape) != tuple(p.shape):
            raise ValueError(f"minite rollout: update_weights sent {name!r} with shape {tuple(tensor.shape)}; the "
                             f"sampler's parameter has shape {tuple(p.shape)}")
        with torch.no_grad():
            p.copy_(tensor)
        self._written.add(id(p))

    def finish_update(self, global_steps: int | None = None) -> dict[str, float]:
        """Check that every parameter was written, re-quantize, and start the step's seed sequence."""
        written, self._written = self._written, None
        if written is None:
            raise RuntimeError("minite rollout: finish_update() without begin_update()")
        missing = [n for n, p in self._unique.items() if id(p) not in written]
        if missing:
            raise ValueError(f"minite rollout: update_weights left {len(missing)} of {len(self._unique)} parameters "
                             f"of the sampler's model unwritten (first: {missing[0]!r}); a full update sends them all")
        metrics = self._requantize() if self.precision.get("patched") else {}
        self.global_steps = global_steps
        self._batch = 0
        self.stats["weight_updates"] += 1
        return metrics

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *, global_steps: int | None = None
                     ) -> dict[str, float]:
        """A whole update: every ``(name, tensor)`` in place, then :meth:`finish_update`."""
        self.begin_update()
        for name, tensor in weights:
            self.load(name, tensor)
        return self.finish_update(global_steps)

    def _alignment_mode(self):
        from minite_kernels import StrictMode, strict_active

        strict = self.settings.alignment == "strict" and not strict_active()
        return StrictMode() if strict else contextlib.nullcontext()

    # ------------------------------------------------------------------------------------------ sleep / wake
    def release(self) -> dict[str, int]:
        """Sleep: drop the KV cache, the captured graphs and the cached quantized weights (see the module
        docstring). Returns how much was dropped."""
        from rollout.graph_sampler import GraphSampler

        dropped = {"kv_cache_bytes": 0, "weight_caches": 0}
        s = self.sampler
        if isinstance(s, GraphSampler):
            st = s._state
            if st is not None:
                dropped["kv_cache_bytes"] = sum(t.numel() * t.element_size() for t in (*st.keys, *st.values))
            # the engine has no public release: dropping its graphs and static state is what a re-allocation
            # (a longer call) does too; the next batch builds both again
            s._drop_graphs()
            s._state = None
        from minite_kernels import WeightCache

        for m in self.model.modules():
            cache = WeightCache.of(m)
            if cache is not None and len(cache):
                cache.clear()
                dropped["weight_caches"] += 1
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.asleep = True
        self.stats["releases"] += 1
        return dropped

    def resume(self, tags: Iterable[str] | None = None) -> None:
        """Wake: the parameters never left the device, and the next batch allocates its KV cache again."""
        tags = list(TAGS if tags is None else tags)
        bad = [t for t in tags if t not in TAGS]
        if bad:
            raise ValueError(f"minite rollout: resume tag {bad[0]!r} is not valid; valid: {', '.join(TAGS)}")
        if "kv_cache" in tags:
            self.asleep = False

    def describe(self) -> dict[str, Any]:
        return {"rollout": "minite", "settings": self.settings.to_dict(), "precision": self.precision,
                "sampler": self.sampler.describe(), "global_steps": self.global_steps, "asleep": self.asleep,
                "device": str(self.device), "dtype": str(next(self.model.parameters()).dtype), **self.stats}
