"""Training configuration: frozen dataclasses (defaults in code), YAML training recipes, Hydra-style overrides.

    python -m trainers.grpo recipe=triage_nvfp4 trainer.max_steps=50 +algorithm.triage.repair_coef=0.05

* ``recipe=NAME`` loads ``recipes/NAME.yaml`` (or a path to a YAML file). A recipe may start with
  ``defaults: [base]`` to inherit another recipe; later files override earlier ones.
* ``precision=NAME`` sets ``precision.learner`` and ``precision.sampler`` together.
* ``a.b=c`` sets an existing key (unknown key -> error naming the closest valid key); ``+a.b=c`` adds a key
  that does not exist yet (only meaningful inside sections that start empty, such as ``algorithm.triage``);
  ``~a.b`` resets a key to its code default.
* Values are parsed with OmegaConf's grammar (``null``, numbers, booleans, ``[a,b]`` lists).
* Every field is type-checked and every choice validated before anything runs.

The package, one concern a module (each imports only the ones before it):

- :mod:`~trainers.config.schema`: the dataclasses (:class:`Config` and its sections), :class:`ConfigError`, the
  schema's keys and YAML form;
- :mod:`~trainers.config.validation`: building a :class:`Config` from a mapping, typing every key and value,
  and the cross-field checks;
- :mod:`~trainers.config.overrides`: training recipe files and ``key=value`` overrides (:func:`load_config`).

Every name is re-exported here: ``from trainers.config import X``.
"""
from __future__ import annotations

from trainers.config.overrides import (
    REPO_ROOT,
    find_recipe,
    flatten,
    from_yaml_file,
    list_recipes,
    load_config,
    recipe_dirs,
)
from trainers.config.schema import (
    DEFAULT_RECIPE,
    SELF_BUILT,
    AlgorithmConfig,
    ArithmeticConfig,
    Config,
    ConfigError,
    DataConfig,
    EvalConfig,
    LoggerConfig,
    ModelConfig,
    OptimConfig,
    PrecisionConfig,
    RewardConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    TrainerConfig,
    VerlConfig,
    WandbConfig,
    all_keys,
    to_container,
    to_yaml,
)
from trainers.config.validation import build, validate

__all__ = [
    "DEFAULT_RECIPE",
    "REPO_ROOT",
    "SELF_BUILT",
    "AlgorithmConfig",
    "ArithmeticConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "LoggerConfig",
    "ModelConfig",
    "OptimConfig",
    "PrecisionConfig",
    "RewardConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "TrainerConfig",
    "VerlConfig",
    "WandbConfig",
    "all_keys",
    "build",
    "find_recipe",
    "flatten",
    "from_yaml_file",
    "list_recipes",
    "load_config",
    "recipe_dirs",
    "to_container",
    "to_yaml",
    "validate",
]
