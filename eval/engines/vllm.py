"""``engine=vllm``: ``vllm.LLM`` with the same rendered prompt token ids and sampling settings as ``local``.

Precision: vLLM cannot apply a minite recipe on the fly; it runs what the checkpoint declares. For an
NVFP4 ``--precision`` the checkpoint must be an NVFP4 export (``quantization_config`` in config.json);
on GPUs below compute capability 10.0 vLLM serves such checkpoints as weight-only FP4 (Marlin W4A16),
which the protocol records. Each prompt gets ``n=k`` samples from one request seeded ``seed + index``.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from eval.engines.base import Engine, Generation, GenerationParams


def import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise ImportError("engine 'vllm' needs vLLM: pip install 'minite-rl[vllm]' (or use --engine local)") from exc
    return vllm


def checkpoint_quantization(model: str) -> dict | None:
    cfg = os.path.join(model, "config.json")
    if not os.path.isfile(cfg):
        return None
    with open(cfg, encoding="utf-8") as f:
        return json.load(f).get("quantization_config")


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(self, llm, tokenizer, info: dict) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.info = info

    @classmethod
    def from_pretrained(cls, model: str, *, dtype: str | None = None, device: str | None = None,
                        precision: str | None = None, exclude: tuple = (), **llm_kwargs: Any) -> VLLMEngine:
        if exclude:
            raise ValueError("--exclude applies to --engine local; a vLLM checkpoint carries its own ignore list "
                             "(quantization_config.ignore in config.json)")
        vllm = import_vllm()
        quant = checkpoint_quantization(model)
        if precision and precision.startswith(("nvfp4", "w4a16")) and not quant:
            raise ValueError(f"--precision {precision} with --engine vllm needs an NVFP4 checkpoint (config.json "
                             f"with quantization_config); {model} has none. Export one, or use --engine local.")
        import torch

        cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
        llm = vllm.LLM(model=model, dtype=dtype or "auto", **llm_kwargs)
        info = {"engine": "vllm", "vllm": vllm.__version__, "model": model, "dtype": dtype or "auto",
                "precision": precision or "as in checkpoint", "checkpoint_quantization": quant,
                "gpu_capability": list(cap) if cap else None}
        if quant and cap and cap < (10, 0):
            info["note"] = "FP4 checkpoint on a GPU below sm_100: vLLM runs it weight-only (W4A16, Marlin)"
        return cls(llm, llm.get_tokenizer(), info)

    def generate(self, prompt_ids: list[list[int]], k: int, params: GenerationParams,
                 progress: Callable[[int], None] | None = None) -> list[list[Generation]]:
        vllm = import_vllm()
        sps = [vllm.SamplingParams(n=k, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                                   max_tokens=params.max_new_tokens, seed=params.seed + i)
               for i in range(len(prompt_ids))]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids], sps, use_tqdm=False)
        result = [[Generation(text=o.text, num_tokens=len(o.token_ids),
                              finish_reason="stop" if o.finish_reason == "stop" else "length") for o in r.outputs]
                  for r in outs]
        if progress is not None:
            progress(len(prompt_ids) * k)
        return result

    def describe(self) -> dict:
        return dict(self.info)
