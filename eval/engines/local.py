"""``engine=local``: a transformers model (optionally with a minite precision recipe) sampled by the
trainer's own sampler (``rollout.make_sampler``: the CUDA-graph engine on a GPU, the batched
KV-cache loop on CPU).

Batching: the k samples of every prompt are laid out adjacent, prompts sorted by token length (less
padding), and cut into batches of ``batch_size`` sequences; batch b of a task is sampled with seed
``seed + b``, so a run is reproducible for a given batch size.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eval.engines.base import Engine, Generation, GenerationParams
from minite_util.choices import did_you_mean


def apply_precision(model, precision: str, exclude: tuple[int | str, ...] = (), backend: str = "auto") -> dict:
    """Swap the model's linears for the named minite precision recipe (``exclude``: module-name patterns and
    block indices kept in high precision, as the trainer's ``precision.exclude``); returns the report."""
    from minite_kernels import quantize_model
    from minite_kernels.recipes import list_recipes

    names = [r.name for r in list_recipes()]
    if precision not in names:
        raise ValueError(f"unknown precision recipe {precision!r}{did_you_mean(precision, names)}; "
                         f"valid: {', '.join(names)}")
    report = quantize_model(model, precision, exclude=list(exclude) or None, backend=backend)
    return report.to_dict()


class LocalEngine(Engine):
    name = "local"

    def __init__(self, model, tokenizer, *, precision: str | None = None, alignment: str = "default",
                 info: dict | None = None, exclude: tuple[int | str, ...] = ()) -> None:
        from rollout import make_sampler
        from rollout.local import ALIGNMENTS  # strict: a prompt's bits do not depend on its batch

        if alignment not in ALIGNMENTS:  # before the model is patched
            raise ValueError(f"unknown alignment {alignment!r}; valid: {', '.join(ALIGNMENTS)}")
        self.alignment = alignment
        self.model = model
        self.tokenizer = tokenizer
        self.precision = precision
        if exclude and not precision:
            raise ValueError("--exclude applies to a --precision recipe; none was given")
        backend = "auto"
        if alignment == "strict":  # dequantized GEMMs as plain matmuls, which StrictMode computes
            from minite_kernels.strict import linear_backend

            backend = linear_backend()
        self.quantization = apply_precision(model, precision, exclude, backend) if precision else None
        self.sampler = make_sampler(model, tokenizer, alignment=alignment)
        self.info = dict(info or {})

    @classmethod
    def of_sampler(cls, sampler, tokenizer, *, precision: str | None, alignment: str, quantization: dict | None,
                   info: dict | None = None) -> LocalEngine:
        """An engine around a sampler that already exists, whose model already runs ``precision`` (a training
        run's own sampler: the policy exactly as it samples rollouts)."""
        self = cls.__new__(cls)
        self.model, self.tokenizer, self.sampler = sampler.model, tokenizer, sampler
        self.precision, self.alignment, self.quantization = precision, alignment, quantization
        self.info = dict(info or {})
        return self

    @classmethod
    def from_pretrained(cls, model: str, *, dtype: str | None = None, device: str | None = None,
                        precision: str | None = None, alignment: str = "default",
                        exclude: tuple[int | str, ...] = ()) -> LocalEngine:
        import torch

        from rollout.models import load_model_and_tokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
        m, tok = load_model_and_tokenizer(model, dtype=dtype, device=device)
        return cls(m, tok, precision=precision, alignment=alignment, exclude=exclude,
                   info={"model": model, "dtype": dtype, "device": device})

    def generate(self, prompt_ids: list[list[int]], k: int, params: GenerationParams,
                 progress: Callable[[int], None] | None = None) -> list[list[Generation]]:
        from rollout.local import SamplingParams

        items = sorted(((len(p), i, s) for i, p in enumerate(prompt_ids) for s in range(k)))
        out: list[list[Generation | None]] = [[None] * k for _ in prompt_ids]
        for b, start in enumerate(range(0, len(items), params.batch_size)):
            chunk = items[start:start + params.batch_size]
            sp = SamplingParams(temperature=params.temperature, top_k=params.top_k,
                                top_p=1.0 if params.temperature == 0 else params.top_p,  # greedy: skip the sort
                                max_new_tokens=params.max_new_tokens, seed=params.seed + b)
            comps = self.sampler.generate([prompt_ids[i] for _, i, _ in chunk], sp)  # strict: under StrictMode
            for (_, i, s), c in zip(chunk, comps):
                ids = c.token_ids[:-1] if c.finish_reason == "stop" else c.token_ids
                out[i][s] = Generation(text=self.tokenizer.decode(ids, skip_special_tokens=True),
                                       num_tokens=len(c.token_ids), finish_reason=c.finish_reason)
            if progress is not None:
                progress(len(chunk))
        return out  # type: ignore[return-value]

    def describe(self) -> dict[str, Any]:
        import torch

        p = next(self.model.parameters())
        return {"engine": "local", "sampler": self.sampler.describe(), **self.info,
                "dtype": str(p.dtype).replace("torch.", ""), "device": str(p.device),
                "precision": self.precision or "none (model dtype)", "quantization": self.quantization,
                "alignment": self.alignment,
                "torch": torch.__version__,
                "batching": "k samples per prompt adjacent, prompts sorted by length; batch b uses seed+b"}
