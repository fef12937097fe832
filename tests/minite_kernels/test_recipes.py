"""Precision recipes: registry contents, validation (errors name the field), selection order, layer selection."""

from __future__ import annotations

import dataclasses

import pytest

from minite_kernels import recipes as R
from minite_kernels.recipes import BF16, GemmSpec, OperandSpec, PrecisionRecipe, RecipeError

REQUIRED = (
    "bf16",
    "nvfp4_per_tensor",
    "nvfp4_per_token",
    "nvfp4_per_token_bf16_bwd",
    "nvfp4_per_token_mxfp8_bwd",
    "w4a16_nvfp4",
    "mxfp8",
)


def test_registry_has_required_recipes_with_groups():
    names = R.recipe_names()
    for n in REQUIRED:
        assert n in names
    for r in R.list_recipes():
        assert r.group in R.GROUPS and r.description
    assert {r.name for r in R.list_recipes("common")} >= {
        "bf16",
        "nvfp4_per_token",
        "nvfp4_per_token_bf16_bwd",
    }


def test_nvfp4_per_token_matches_te_defaults():
    r = R.get_qlinear_params("nvfp4_per_token")
    # fprop: per-token 1x16 activations, per-tensor 16x16 weights, no RHT / SR
    assert (r.fprop.a.format, r.fprop.a.scaling, r.fprop.a.tile) == ("nvfp4", "per_token", (1, 16))
    assert (r.fprop.b.scaling, r.fprop.b.tile) == ("per_tensor", (16, 16))
    assert not any(s.rht or s.stochastic_rounding for s in (r.fprop.a, r.fprop.b))
    # backward: SR on both gradient operands, RHT on both wgrad operands only, 2-D weight in dgrad
    assert r.dgrad.a.stochastic_rounding and r.wgrad.a.stochastic_rounding
    assert not r.dgrad.b.stochastic_rounding and not r.wgrad.b.stochastic_rounding
    assert r.wgrad.a.rht and r.wgrad.b.rht and not r.dgrad.a.rht
    assert r.dgrad.b.tile == (16, 16)
    assert r.backward_operands == "quantized"


def test_bf16_bwd_recipe_and_w4a16():
    r = R.get_qlinear_params("nvfp4_per_token_bf16_bwd")
    assert r.fprop == R.get_qlinear_params("nvfp4_per_token").fprop
    assert not r.dgrad.quantized and not r.wgrad.quantized
    assert r.backward_operands == "dequantized_forward"
    w = R.get_qlinear_params("w4a16_nvfp4")
    assert not w.fprop.a.quantized and w.fprop.b.format == "nvfp4"
    assert not w.dgrad.quantized and not w.wgrad.quantized
    m = R.get_qlinear_params("nvfp4_per_token_mxfp8_bwd")
    assert {m.dgrad.a.format, m.dgrad.b.format, m.wgrad.a.format, m.wgrad.b.format} == {"mxfp8"}


def test_operand_defaults_and_summary():
    s = OperandSpec("nvfp4")
    assert (s.scaling, s.tile, s.block_k) == ("per_tensor", (1, 16), 16)
    assert OperandSpec("mxfp8").tile == (1, 32) and OperandSpec("mxfp8").block_k == 32
    assert BF16.tile is None and BF16.block_k == 1 and not BF16.quantized
    assert (
        OperandSpec("nvfp4", "per_token", rht=True, stochastic_rounding=True).summary() == "nvfp4/tok/rht/sr"
    )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"format": "fp4"}, "OperandSpec.format"),
        ({"format": "nvfp4", "scaling": "per_row"}, "OperandSpec.scaling"),
        ({"format": "nvfp4", "tile": (32, 32)}, "OperandSpec.tile"),
        ({"format": "nvfp4", "scaling": "per_token", "tile": (16, 16)}, "OperandSpec.tile"),
        ({"format": "mxfp8", "rht": True}, "OperandSpec.rht"),
        ({"format": "bf16", "stochastic_rounding": True}, "OperandSpec.stochastic_rounding"),
    ],
)
def test_bad_operand_spec_names_the_field(kwargs, field):
    with pytest.raises(RecipeError, match=field.replace(".", r"\.")):
        OperandSpec(**kwargs)


def test_unknown_format_lists_valid_values_and_closest():
    with pytest.raises(RecipeError) as e:
        OperandSpec("nvfp3")
    assert "bf16, nvfp4, mxfp8" in str(e.value) and "did you mean 'nvfp4'?" in str(e.value)


NV = OperandSpec("nvfp4")


@pytest.mark.parametrize(
    "gemms, field",
    [
        (
            {"fprop": GemmSpec(NV, OperandSpec("nvfp4", stochastic_rounding=True))},
            "fprop.b.stochastic_rounding",
        ),
        (
            {"fprop": GemmSpec(OperandSpec("nvfp4", stochastic_rounding=True), NV)},
            "fprop.a.stochastic_rounding",
        ),
        (
            {"wgrad": GemmSpec(NV, OperandSpec("nvfp4", stochastic_rounding=True))},
            "wgrad.b.stochastic_rounding",
        ),
        ({"fprop": GemmSpec(OperandSpec("nvfp4", rht=True), OperandSpec("nvfp4", rht=True))}, "fprop.a.rht"),
        ({"dgrad": GemmSpec(OperandSpec("nvfp4", rht=True), OperandSpec("nvfp4", rht=True))}, "dgrad.a.rht"),
        ({"wgrad": GemmSpec(OperandSpec("nvfp4", rht=True), NV)}, "wgrad: rht is set on one operand"),
        ({"fprop": GemmSpec(NV, OperandSpec("mxfp8"))}, "fprop: operands 'nvfp4' and 'mxfp8'"),
    ],
)
def test_contradictory_recipe_names_the_field(gemms, field):
    with pytest.raises(RecipeError, match=field.replace(".", r"\.")):
        PrecisionRecipe("bad", **gemms)


def test_backward_operands_validation():
    with pytest.raises(RecipeError, match="backward_operands='original'"):
        PrecisionRecipe("bad", dgrad=GemmSpec(NV, NV), backward_operands="original")
    with pytest.raises(RecipeError, match="did you mean 'dequantized_forward'\\?"):
        PrecisionRecipe("bad", backward_operands="dequantised_forward")
    with pytest.raises(RecipeError, match="PrecisionRecipe.group"):
        PrecisionRecipe("bad", group="prod")


def test_recipes_are_frozen():
    r = R.get_qlinear_params("mxfp8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.name = "x"  # type: ignore[misc]


def test_selection_order_explicit_env_default():
    env = {"MINITE_RECIPE": "mxfp8"}
    assert R.resolve_recipe("bf16", env=env) == (R.get_qlinear_params("bf16", env={}), "explicit")
    assert R.resolve_recipe(None, env=env)[0].name == "mxfp8"
    assert R.resolve_recipe(None, env=env)[1] == "env:MINITE_RECIPE"
    assert R.resolve_recipe(None, env={}) == (R.get_qlinear_params(R.DEFAULT_RECIPE, env={}), "default")
    assert R.DEFAULT_RECIPE == "nvfp4_per_token_bf16_bwd"


def test_unknown_name_gives_valid_names_and_closest_match():
    with pytest.raises(RecipeError) as e:
        R.get_qlinear_params("nvfp4_per_tokn", env={})
    msg = str(e.value)
    assert "did you mean 'nvfp4_per_token'?" in msg and "w4a16_nvfp4" in msg
    with pytest.raises(RecipeError, match=r"from \$MINITE_RECIPE"):
        R.get_qlinear_params(None, env={"MINITE_RECIPE": "nvfp5"})


def test_disable_backward_quant_bypass():
    r = R.get_qlinear_params("nvfp4_per_token", env={"DISABLE_BACKWARD_QUANT": "1"})
    assert r.backward_bypass and r.backward_operands == "original"
    assert not r.dgrad.quantized and not r.wgrad.quantized
    assert r.fprop == R.get_qlinear_params("nvfp4_per_token", env={}).fprop
    assert "DISABLE_BACKWARD_QUANT" in r.backward_precision
    assert not R.get_qlinear_params("nvfp4_per_token", env={"DISABLE_BACKWARD_QUANT": "0"}).backward_bypass


def test_register_recipe_rejects_duplicates():
    with pytest.raises(RecipeError, match="already registered"):
        R.register_recipe(R.get_qlinear_params("bf16", env={}))


def test_feature_alignment():
    assert R.get_qlinear_params("bf16", env={}).feature_alignment() == (1, 1)
    assert R.get_qlinear_params("nvfp4_per_token", env={}).feature_alignment() == (16, 16)
    assert R.get_qlinear_params("nvfp4_per_token_mxfp8_bwd", env={}).feature_alignment() == (16, 32)
    assert R.get_qlinear_params("w4a16_nvfp4", env={}).feature_alignment() == (16, 1)


def test_layer_index_and_patterns():
    assert R.layer_index("model.layers.3.mlp.up_proj") == 3
    assert R.layer_index("transformer.h.11.attn.c_attn") == 11
    assert R.layer_index("lm_head") is None
    assert R.name_matches("*.mlp.*", "model.layers.0.mlp.down_proj")
    assert not R.name_matches("*.self_attn.*", "model.layers.0.mlp.down_proj")
    assert R.name_matches(r"re:layers\.[01]\.mlp", "model.layers.1.mlp.up_proj")


def test_layer_selector_overrides_and_exclusions():
    sel = R.LayerSelector.build(
        "nvfp4_per_token",
        overrides={"*.down_proj": "mxfp8", "re:q_proj$": "bf16"},
        exclude=[-1, "*.k_proj"],
        num_layers=4,
        env={},
    )
    assert sel.select("model.layers.0.mlp.down_proj")[0].name == "mxfp8"
    assert sel.select("model.layers.0.self_attn.q_proj")[0].name == "bf16"
    assert sel.select("model.layers.2.mlp.up_proj")[0].name == "nvfp4_per_token"
    r, why = sel.select("model.layers.3.mlp.up_proj")  # -1 = last of 4 blocks
    assert r is None and "excluded layer 3" in why
    assert sel.select("model.layers.1.self_attn.k_proj")[0] is None
    with pytest.raises(RecipeError, match="out of range"):
        R.LayerSelector.build("bf16", exclude=[7], num_layers=4, env={})
    with pytest.raises(RecipeError, match="not a valid regex"):
        R.LayerSelector.build("bf16", overrides={"re:(": "bf16"}, env={})
    with pytest.raises(RecipeError, match="did you mean 'mxfp8'\\?"):
        R.LayerSelector.build("bf16", overrides={"*": "mxfp9"}, env={})


def test_to_dict_is_json_ready():
    import json

    d = R.get_qlinear_params("nvfp4_per_token", env={}).to_dict()
    assert json.loads(json.dumps(d))["fprop"]["b"]["tile"] == [16, 16]


def test_recipes_round_trip_through_their_fields_and_json():
    """``from_dict(to_dict(r)) == r`` for every registered recipe and its backward bypass, through JSON too; the
    derived summaries are ignored, unknown or bad fields raise naming them, missing ones take their defaults."""
    import json

    from minite_kernels.recipes import GemmSpec, OperandSpec, PrecisionRecipe

    for r in R.list_recipes():
        for recipe in (r, r.with_backward_bypass()):
            assert PrecisionRecipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    assert PrecisionRecipe.from_dict({"name": "plain"}) == PrecisionRecipe("plain")
    assert GemmSpec.from_dict({"a": {"format": "nvfp4"}}) == GemmSpec(OperandSpec("nvfp4"))
    with pytest.raises(RecipeError, match="OperandSpec has no field 'fromat'.*did you mean 'format'"):
        PrecisionRecipe.from_dict({"name": "x", "fprop": {"a": {"fromat": "nvfp4"}}})
    with pytest.raises(RecipeError, match="OperandSpec.tile=\\(4, 4\\) is invalid"):
        OperandSpec.from_dict({"format": "nvfp4", "tile": [4, 4]})
    with pytest.raises(RecipeError, match="GemmSpec takes a mapping of its fields, got list"):
        GemmSpec.from_dict([1])


def test_the_kernel_choice_is_part_of_the_recipe_and_travels_with_it():
    """``kernels`` defaults to the first valid value of each field, changes by ``with_kernels`` (same name, same
    GEMM specs), round-trips through JSON, and refuses unknown fields and values in one line naming the choices."""
    import json

    from minite_kernels.recipes import KERNEL_CHOICES, KernelChoice

    r = R.get_qlinear_params("nvfp4_per_token_bf16_bwd", env={})
    assert r.kernels == KernelChoice() and KernelChoice().to_dict() == {k: v[0] for k, v in KERNEL_CHOICES.items()}
    exact = r.with_kernels(gemm="exact", lane="off")
    assert exact.kernels == KernelChoice(gemm="exact", lane="off") and exact.kernels.summary() == "gemm=exact lane=off"
    assert (exact.name, exact.fprop, exact.dgrad, exact.wgrad) == (r.name, r.fprop, r.dgrad, r.wgrad)
    assert exact != r and hash(exact) != hash(r)
    assert PrecisionRecipe.from_dict(json.loads(json.dumps(exact.to_dict()))) == exact
    assert exact.with_backward_bypass().kernels == exact.kernels
    assert KernelChoice().summary() == "default"
    with pytest.raises(RecipeError, match=r"KernelChoice.gemm='exakt' is unknown; valid: dequant, exact, exact_fused; "
                                          r"did you mean 'exact'\?"):
        r.with_kernels(gemm="exakt")
    with pytest.raises(RecipeError, match=r"KernelChoice has no field 'gem'; valid: gemm, decode, lane, "
                                          r"save_activations; did you mean 'gemm'\?"):
        r.with_kernels(gem="exact")
    with pytest.raises(RecipeError, match="KernelChoice has no field 'fused'"):
        PrecisionRecipe.from_dict({"name": "x", "kernels": {"fused": "on"}})
    with pytest.raises(RecipeError, match="PrecisionRecipe.kernels must be a KernelChoice, got dict"):
        PrecisionRecipe("x", kernels={"gemm": "exact"})


def test_a_recipe_given_by_its_fields_resolves_to_that_object():
    """A mapping, or a JSON object as the name or in ``$MINITE_RECIPE``, resolves to the recipe those fields
    describe, registered or not; ``DISABLE_BACKWARD_QUANT`` still applies; a broken JSON object says so."""
    import dataclasses
    import json

    custom = dataclasses.replace(R.get_qlinear_params("nvfp4_per_token"), name="not_registered")
    fields = json.dumps(custom.to_dict())
    assert R.resolve_recipe(custom.to_dict(), env={}) == (custom, "explicit")
    assert R.resolve_recipe(fields, env={}) == (custom, "explicit")
    assert R.resolve_recipe(None, env={"MINITE_RECIPE": fields}) == (custom, "env:MINITE_RECIPE")
    bypass = R.resolve_recipe(None, env={"MINITE_RECIPE": fields, "DISABLE_BACKWARD_QUANT": "1"})[0]
    assert bypass == custom.with_backward_bypass()
    with pytest.raises(RecipeError, match=r"recipe \(from \$MINITE_RECIPE\) starts like a JSON object but is not"):
        R.resolve_recipe(None, env={"MINITE_RECIPE": "{name: 1}"})
