"""verl's per-request sampling params -> the project's ``SamplingParams``.

verl's agent loop sends every request with a dict such as ``{"temperature": 1.0, "top_p": 1.0, "top_k": -1,
"repetition_penalty": 1.0, "logprobs": True}`` (``verl.experimental.agent_loop.agent_loop``), optionally with
``max_tokens``. The response length follows vLLM's server (``vllm_async_server.vLLMHttpServer.generate``):
``max_tokens`` (or ``max_new_tokens``) when given, else ``min(response_length, prompt_length + response_length -
len(prompt))``, clamped to ``[1, max_model_len - len(prompt)]``.

What the project's sampler cannot do is refused with a one-line error, never silently ignored: a repetition
penalty other than 1, ``ignore_eos``, multimodal inputs.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minite_util.choices import did_you_mean
from rollout.local import SamplingParams

ACCEPTED = ("temperature", "top_p", "top_k", "max_tokens", "max_new_tokens", "logprobs", "repetition_penalty",
            "seed", "ignore_eos", "stop_token_ids")


@dataclass(frozen=True)
class RequestParams:
    """One request's sampling: ``params`` (its ``seed`` is 0 unless ``seed`` is set), whether verl asked for
    log-probs, and the request's own seed (None: the engine derives one per batch)."""

    params: SamplingParams
    logprobs: bool
    seed: int | None

    def batch_key(self) -> tuple:
        """Requests with equal keys can share one sampler call."""
        p = self.params
        return (p.temperature, p.top_p, p.top_k, p.max_new_tokens, p.stop_token_ids, self.seed)


@dataclass(frozen=True)
class Lengths:
    """The rollout config's lengths (``RolloutConfig.prompt_length / response_length / max_model_len``)."""

    prompt_length: int
    response_length: int
    max_model_len: int | None = None

    @classmethod
    def from_rollout_config(cls, config: Any) -> Lengths:
        get = config.get if hasattr(config, "get") else lambda k, d=None: getattr(config, k, d)
        return cls(int(get("prompt_length", 512)), int(get("response_length", 512)), get("max_model_len", None))

    @property
    def context(self) -> int:
        return int(self.max_model_len) if self.max_model_len else self.prompt_length + self.response_length


def request_params(sampling_params: Mapping[str, Any], prompt_len: int, lengths: Lengths) -> RequestParams:
    """The project's sampling params for one verl request of ``prompt_len`` prompt tokens."""
    sp = dict(sampling_params or {})
    unknown = [k for k in sp if k not in ACCEPTED]
    if unknown:
        raise ValueError(f"minite rollout: sampling param {unknown[0]!r} is not supported"
                         f"{did_you_mean(unknown[0], ACCEPTED)}; accepted: {', '.join(ACCEPTED)}")
    if float(sp.get("repetition_penalty", 1.0) or 1.0) != 1.0:
        raise ValueError(f"minite rollout: repetition_penalty={sp['repetition_penalty']} is not supported (the "
                         "sampler draws from the processed distribution that the learner recomputes); use 1.0")
    if sp.get("ignore_eos"):
        raise ValueError("minite rollout: ignore_eos=true is not supported (the sampler stops at the model's EOS "
                         "tokens); set actor_rollout_ref.rollout.ignore_eos=false")
    room = lengths.context - prompt_len
    if room < 1:
        raise ValueError(f"minite rollout: the prompt ({prompt_len} tokens) leaves no room to generate within "
                         f"the context of {lengths.context} tokens (rollout prompt_length + response_length, or "
                         "max_model_len)")
    if sp.get("max_tokens") is not None:
        max_tokens = int(sp["max_tokens"])
    elif sp.get("max_new_tokens") is not None:
        max_tokens = int(sp["max_new_tokens"])
    else:
        max_tokens = min(lengths.response_length, lengths.prompt_length + lengths.response_length - prompt_len)
    max_tokens = max(1, min(max_tokens, room))
    top_k = int(sp.get("top_k", -1))
    seed = sp.get("seed")
    params = SamplingParams(temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
                            top_k=-1 if top_k in (0, -1) else top_k,  # vLLM: 0 and -1 both mean off
                            max_new_tokens=max_tokens, seed=0 if seed is None else int(seed),
                            stop_token_ids=tuple(int(t) for t in sp.get("stop_token_ids") or ()))
    # vLLM's ``logprobs``: None/False = none; 0/True = the sampled token's (all verl reads); N >= 1 would add N
    # alternatives per token, which this sampler does not compute
    want = sp.get("logprobs")
    if not isinstance(want, bool) and want is not None and int(want) != 0:
        raise ValueError(f"minite rollout: logprobs={want!r} asks for alternatives per token; the sampler returns "
                         "the sampled token's log-prob only (logprobs=true or 0)")
    return RequestParams(params, want is not None and want is not False, None if seed is None else int(seed))
