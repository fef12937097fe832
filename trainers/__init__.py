"""GRPO trainers: ``python -m trainers.grpo recipe=NAME [key=value ...]``.

Layout: ``config`` (schema, recipes, overrides), ``data``, ``learner`` (log-probs, verl's advantages and policy
losses), ``rewards``, ``checkpoint``, ``tracking``, ``heldout`` (evals inside a run), ``engines`` (``local``;
``verl``). The samplers and the model loader are the top-level ``rollout`` package, which eval uses too.
"""
