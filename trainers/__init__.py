"""GRPO trainers: ``python -m trainers.grpo recipe=NAME [key=value ...]``.

Layout: ``config`` (schema, recipes, overrides), ``models`` (loading, tiny test models), ``data``, ``rollout``
(our KV-cache sampler), ``learner`` (log-probs, verl's advantages and policy losses), ``rewards``,
``checkpoint``, ``tracking``, ``engines`` (``local``; ``verl``).
"""
