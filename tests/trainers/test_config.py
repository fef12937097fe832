"""Config: recipes, Hydra-style overrides, validation with the closest valid key / choices."""
from __future__ import annotations

import pytest

from trainers.config import AlgorithmConfig, Config, ConfigError, all_keys, list_recipes, load_config, to_yaml
from triage import TriageConfig

REQUIRED = ["trainer.max_steps", "trainer.output_dir", "trainer.save_every", "trainer.resume", "trainer.seed",
            "model.path", "logger.wandb.mode", "engine"]


def test_required_keys_exist():
    keys = all_keys()
    assert all(k in keys for k in REQUIRED)


def test_default_is_embedded_cpu_run():
    cfg = load_config([])
    assert cfg.recipe == "default" and cfg.engine == "local"
    assert cfg.model.path == "smollm2-135m-instruct" and cfg.data.task == "arithmetic"
    assert cfg.rollout.top_p == 1.0 and cfg.rollout.top_k == -1


@pytest.mark.parametrize("name", ["triage_nvfp4", "tis_nvfp4", "nvfp4", "strict_nvfp4", "bf16", "triage_bf16",
                                  "default", "rollout_nvfp4", "tis_rollout_nvfp4", "triage_rollout_nvfp4"])
def test_every_training_recipe_loads(name):
    assert name in list_recipes()
    cfg = load_config([f"recipe={name}"])
    assert isinstance(cfg, Config) and cfg.recipe == name


def test_recipes_mean_what_they_say():
    t = load_config(["recipe=triage_nvfp4"])
    assert (t.precision.learner, t.precision.sampler) == ("nvfp4_per_token_w1x16_bf16_bwd",) * 2
    assert t.algorithm.loss_mode == "triage" and t.algorithm.triage.tis_cap == 2.0
    tis = load_config(["recipe=tis_nvfp4"])
    assert tis.algorithm.loss_mode == "vanilla" and tis.algorithm.rollout_correction.rollout_is == "token"
    assert load_config(["recipe=nvfp4"]).algorithm.rollout_correction.rollout_is is None
    assert load_config(["recipe=bf16"]).precision.learner == "bf16"
    for name, loss, tis in (("rollout_nvfp4", "vanilla", None), ("tis_rollout_nvfp4", "vanilla", "token"),
                            ("triage_rollout_nvfp4", "triage", None)):
        r = load_config([f"recipe={name}"])
        assert (r.precision.learner, r.precision.sampler) == ("bf16", "nvfp4_per_token_w1x16_bf16_bwd")
        assert r.algorithm.loss_mode == loss and r.algorithm.rollout_correction.rollout_is == tis


def test_overrides_grammar():
    cfg = load_config(["recipe=triage_bf16", "trainer.max_steps=3", "+algorithm.triage.repair_coef=0.05",
                       "data.arithmetic.levels=[1,3]", "trainer.output_dir=null", "~optim.lr"])
    assert cfg.trainer.max_steps == 3 and cfg.algorithm.triage == TriageConfig(repair_coef=0.05)
    assert cfg.data.arithmetic.levels == (1, 3) and cfg.trainer.output_dir is None
    assert cfg.optim.lr == Config().optim.lr
    assert load_config(["precision=nvfp4_per_token"]).precision.sampler == "nvfp4_per_token"


@pytest.mark.parametrize("args,match", [
    (["trainer.max_step=3"], r"unknown config key 'trainer.max_step'; did you mean 'trainer.max_steps'\?"),
    (["trainer.max_steps=3", "+trainer.seed=1"], r"\+trainer.seed: key already exists"),
    (["engine=vlm"], r"engine='vlm' is not valid.*valid choices: 'local', 'verl'"),
    (["recipe=triage_nvfp"], r"unknown recipe 'triage_nvfp'; did you mean 'triage_nvfp4'\?"),
    (["model.dtype=float64"], r"model.dtype='float64' is not valid"),
    (["rollout.n=two"], r"rollout.n='two' must be an integer"),
    (["rollout.n=0"], r"rollout.n=0 must be > 0"),
    (["algorithm.micro_batch_tokens=-8"], r"algorithm.micro_batch_tokens=-8 must be >= 0"),
    (["algorithm.log_prob_micro_batch_size=-1"], r"algorithm.log_prob_micro_batch_size=-1 must be >= 0"),
    (["rollout.top_p=0.9"], r"truncated sampling is refused"),
    (["precision.learner=nvfp4_per_token", "precision.alignment=strict"], (r"strict alignment makes the sampler "
                                                                           r"compute the learner's bits")),
    (["precision=nvfp4_per_tokn"], r"did you mean 'nvfp4_per_token'\?"),
    (["recipe=triage_bf16", "+algorithm.triage.repair_coeff=1"], r"did you mean 'repair_coef'\?"),
    (["algorithm.triage.gate=false"], r"algorithm.loss_mode='vanilla'"),
    (["recipe=triage_nvfp4", "algorithm.rollout_correction.rollout_is=token"], r"applies its own TIS cap"),
    (["trainer.resume=/no/such/dir"], r"'auto', 'force', 'never' or an existing checkpoint directory"),
    (["reward.fn=nocolon"], r"package.module:function"),
    (["algorithm.mini_batches=3"], r"must divide"),
    (["--verbose"], r"unknown option"),
    (["trainer.max_steps"], r"must look like key=value"),
    (["eval.every=5", "eval.tasks=[arithmetc]"], r"eval.tasks: unknown task 'arithmetc'; did you mean 'arithmetic'\?"),
    (["eval.every=5", "eval.tasks=[]"], r"must list distinct tasks; valid tasks: "),
    (["eval.every=-1"], r"eval.every=-1 must be >= 0"),
    (["eval.batch_size=0"], r"eval.batch_size=0 must be > 0"),
    (["eval.every=5", "engine=verl"], r"eval.every=5 runs on engine=local"),
    (["trainer.logprob_kernel=triton"], r"trainer.logprob_kernel='triton' is not valid.*'auto', 'torch'"),
])
def test_bad_config_errors(args, match):
    with pytest.raises(ConfigError, match=match):
        load_config(args)


def test_recipe_with_unknown_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults: [base]\ntrainer:\n  max_stepz: 3\n")
    with pytest.raises(ConfigError, match="did you mean 'trainer.max_steps'"):
        load_config([f"recipe={bad}"])


def test_yaml_roundtrip(tmp_path):
    from trainers.config import from_yaml_file

    cfg = load_config(["recipe=triage_nvfp4", "trainer.max_steps=7"])
    p = tmp_path / "config.yaml"
    p.write_text(to_yaml(cfg))
    assert from_yaml_file(p) == cfg


def test_optim_impl_is_validated_and_minite_is_local_only():
    with pytest.raises(ConfigError, match=r"optim.impl='fused' is not valid; valid choices: 'auto', 'torch', 'minite'"):
        load_config(["optim.impl=fused"])
    with pytest.raises(ConfigError, match=r"optim.impl='minite' applies to engine=local"):
        load_config(["engine=verl", "optim.impl=minite"])
    assert load_config(["optim.impl=minite"]).optim.impl == "minite"


def test_precision_exclude_takes_block_indices_and_names():
    cfg = load_config(["recipe=nvfp4", "precision.exclude=[lm_head,0,-1]"])
    assert cfg.precision.exclude == ("lm_head", 0, -1)
    with pytest.raises(ConfigError, match="block indices apply to engine=local"):
        load_config(["recipe=nvfp4", "engine=verl", "precision.exclude=[lm_head,0]"])


@pytest.mark.parametrize("override", ["optim.lr=1e400", "optim.lr=.nan", "rollout.temperature=-1e999"])
def test_non_finite_numbers_are_refused(override):
    with pytest.raises(ConfigError, match="must be a finite number"):
        load_config([override])


def test_algorithm_triage_is_a_triage_config_built_once():
    """algorithm.triage is typed: the recipe's fields over TriageConfig's defaults, built when the config is."""
    assert AlgorithmConfig().triage == TriageConfig()
    cfg = load_config(["recipe=triage_nvfp4", "+algorithm.triage.repair_coef=0.05", "algorithm.triage.gate=false",
                       "~algorithm.triage.gate"])
    assert isinstance(cfg.algorithm.triage, TriageConfig)
    assert cfg.algorithm.triage == TriageConfig(tis_cap=2.0, repair_coef=0.05)
    assert load_config(["recipe=triage_nvfp4", "algorithm.triage.gate=false"]).algorithm.triage.gate is False


@pytest.mark.parametrize("override,match", [
    ("+algorithm.triage.repair_coeff=1", (r"algorithm.triage: unknown TriageConfig field 'repair_coeff'; did you "
                                          r"mean 'repair_coef'\?; valid fields: gate_segment_len, .*repair_coef, "
                                          r".*cuda_graphs$")),
    ("+algorithm.triage.gate_segment_len=0", r"algorithm.triage: TriageConfig.gate_segment_len must be a positive int"),
    ("algorithm.triage.gate=maybe", r"algorithm.triage: TriageConfig.gate must be a bool"),
    ("algorithm.triage=3", r"algorithm.triage: TriageConfig.from_mapping expects a mapping"),
])
def test_bad_algorithm_triage_is_one_line_naming_the_key(override, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(["recipe=triage_bf16", override])
    assert "\n" not in str(e.value)


def test_algorithm_triage_roundtrips_through_yaml(tmp_path):
    from trainers.config import from_yaml_file

    cfg = load_config(["recipe=triage_bf16", "+algorithm.triage.repair_coef=0.05"])
    p = tmp_path / "config.yaml"
    p.write_text(to_yaml(cfg))
    assert from_yaml_file(p).algorithm.triage == TriageConfig(repair_coef=0.05)
    # a vanilla run's config.yaml lists TriageConfig's defaults: still "not set" for a non-TRIAGE loss
    vanilla = tmp_path / "vanilla.yaml"
    vanilla.write_text(to_yaml(load_config([])))
    assert from_yaml_file(vanilla).algorithm.triage == TriageConfig()


@pytest.mark.parametrize("value, want", [("on", "on"), ("off", "off"), ("auto", "auto"), ("true", "on"), ("false", "off")])
def test_on_off_switches_take_yaml_booleans(value, want):
    """``rollout.fp4_weights=off`` as typed on a command line: YAML 1.1 reads an unquoted on / off as a boolean,
    which a field whose choices are the strings "on" and "off" takes back as that string."""
    assert load_config([f"rollout.fp4_weights={value}"]).rollout.fp4_weights == want
    with pytest.raises(ConfigError, match="rollout.fp4_weights='yes' is not valid.*valid choices: 'auto', 'on', 'off'"):
        load_config(["rollout.fp4_weights='yes'"])
