"""Tests axlearn/common/trainer_config_modifier.py on a real SpmdTrainer config."""

import pytest

from axlearn.common import attention, learner
from axlearn.common.base_layer import RematSpec
from axlearn.common.config import config_for_function
from axlearn.common.gradient_accumulation import with_minibatch_steps
from axlearn.common.trainer import SpmdTrainer, select_mesh_config
from axlearn.common.trainer_config_modifier import (
    ChainConfigModifier,
    GradientAccumulationModifier,
    MeshShapeModifier,
    ModuleConfigModifier,
    PartitionSpecModifier,
    PipelineModifier,
    RematSpecModifier,
    find_config,
)
from axlearn.common.utils_spmd import HybridMeshShape
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

LAYER = "model.decoder.transformer.layer"


def _trainer_config() -> SpmdTrainer.Config:
    cfg = SpmdTrainer.default_config().set(
        name="trainer",
        mesh_axis_names=("data", "fsdp", "model"),
        mesh_shape=(-1, 1, 1),
    )
    cfg.model = transformer_lm_config(
        num_layers=2,
        model_dim=64,
        num_heads=2,
        num_kv_heads=1,
        hidden_dim=128,
        vocab_size=128,
        rope_theta=5e5,
        qk_norm=True,
        sharding=True,
    )
    cfg.learner = learner.Learner.default_config()
    return cfg


def test_mesh_shape_modifier():
    cfg = (
        MeshShapeModifier.default_config()
        .set(mesh_shape=(2, 4, 1))
        .instantiate()(_trainer_config())
    )
    assert tuple(cfg.mesh_shape) == (2, 4, 1)
    hybrid = HybridMeshShape(ici_mesh_shape=(1, 4, 1), dcn_mesh_shape=(2, 1, 1))
    cfg = MeshShapeModifier.default_config().set(mesh_shape=hybrid).instantiate()(cfg)
    assert cfg.mesh_shape == hybrid


def test_remat_spec_modifier():
    spec = RematSpec(prevent_cse=False, policy=None)
    modifier = RematSpecModifier.default_config().set(remat_policies={LAYER: spec}).instantiate()
    cfg = modifier(_trainer_config())
    assert find_config(cfg, LAYER).remat_spec == spec
    assert "model.decoder.transformer.layer.remat_spec['prevent_cse']: False" in (
        cfg.debug_string()
    )
    bad = RematSpecModifier.default_config().set(remat_policies={"model.decoder.nope": spec})
    with pytest.raises(ValueError, match=r"model\.decoder\.nope.*no field 'nope'"):
        bad.instantiate()(_trainer_config())
    no_field = RematSpecModifier.default_config().set(remat_policies={"model.decoder.dim": spec})
    with pytest.raises(ValueError, match="model.decoder.dim has no remat_spec"):
        no_field.instantiate()(_trainer_config())


def test_gradient_accumulation_modifier():
    cfg = (
        GradientAccumulationModifier.default_config()
        .set(grad_acc_steps=4)
        .instantiate()(_trainer_config())
    )
    transformation = cfg.learner.forward_fn_transformation
    assert transformation.fn is with_minibatch_steps and transformation.steps == 4
    # The global batch and the number of optimizer steps are unchanged.
    assert cfg.max_step == _trainer_config().max_step
    with pytest.raises(ValueError, match="grad_acc_steps must be >= 1"):
        GradientAccumulationModifier.default_config().set(grad_acc_steps=0).instantiate()(
            _trainer_config()
        )


def test_module_config_modifier_swaps_class_keeps_fields():
    cfg = _trainer_config()
    old = cfg.model.decoder.transformer
    modifier = ModuleConfigModifier.default_config().set(
        target_config="model.decoder.transformer",
        modification=attention.StackedTransformerLayer.default_config(),
    )
    cfg = modifier.instantiate()(cfg)
    new = cfg.model.decoder.transformer
    assert new.klass is attention.StackedTransformerLayer
    assert new.num_layers == old.num_layers == 2
    assert new.layer == old.layer
    with pytest.raises(ValueError, match="model.decoder.missing"):
        ModuleConfigModifier.default_config().set(
            target_config="model.decoder.missing",
            modification=attention.StackedTransformerLayer.default_config(),
        ).instantiate()(_trainer_config())


def test_partition_spec_modifier():
    path = f"{LAYER}.feed_forward.linear1"
    modifier = PartitionSpecModifier.default_config().set(
        partition_specs={path: dict(param_partition_spec=("fsdp", "model"))}
    )
    cfg = modifier.instantiate()(_trainer_config())
    assert tuple(find_config(cfg, path).param_partition_spec) == ("fsdp", "model")
    bad = PartitionSpecModifier.default_config().set(
        partition_specs={path: dict(no_such_spec=("fsdp",))}
    )
    with pytest.raises(ValueError, match="has no field 'no_such_spec'"):
        bad.instantiate()(_trainer_config())


def test_chain_through_mesh_rules():
    chain = ChainConfigModifier.default_config().set(
        config_modifiers=[
            MeshShapeModifier.default_config().set(mesh_shape=(1, -1, 1)),
            GradientAccumulationModifier.default_config().set(grad_acc_steps=2),
            RematSpecModifier.default_config().set(
                remat_policies={LAYER: RematSpec(prevent_cse=True)}
            ),
        ]
    )
    cfg = _trainer_config().set(
        mesh_rules=[("cpu-fsdp", chain), ("cpu-.*", (2, -1, 1)), ("cpu-fsdp", (8, 1, 1))]
    )
    selected = select_mesh_config(cfg.clone(), mesh_selector="cpu-fsdp")  # First match wins.
    assert tuple(selected.mesh_shape) == (1, -1, 1)
    assert selected.learner.forward_fn_transformation.steps == 2
    assert find_config(selected, LAYER).remat_spec == RematSpec(prevent_cse=True)
    other = select_mesh_config(cfg.clone(), mesh_selector="cpu-data")
    assert tuple(other.mesh_shape) == (2, -1, 1)
    assert other.learner.forward_fn_transformation is None
    # Full match only: a prefix does not select.
    unmatched = select_mesh_config(cfg.clone(), mesh_selector="xcpu-fsdp")
    assert tuple(unmatched.mesh_shape) == (-1, 1, 1)


def test_find_config_dict_entries():
    cfg = _trainer_config()
    cfg.learner.forward_fn_transformation = config_for_function(with_minibatch_steps)
    assert find_config(cfg, "learner.forward_fn_transformation.fn") is with_minibatch_steps
    cfg.evalers = {}
    with pytest.raises(ValueError, match="evalers.validation: no entry 'validation'"):
        find_config(cfg, "evalers.validation")


def test_pipeline_modifier_through_a_mesh_rule():
    chain = ChainConfigModifier.default_config().set(
        config_modifiers=[
            PipelineModifier.default_config().set(
                num_stages=2, num_microbatches=4, num_virtual_stages=1
            ),
            MeshShapeModifier.default_config().set(mesh_shape=(1, 2, -1)),
        ]
    )
    cfg = _trainer_config().set(mesh_rules=[("cpu-pipe", chain)])
    layer_before = cfg.model.decoder.transformer.layer.clone()
    selected = select_mesh_config(cfg, mesh_selector="cpu-pipe")
    stack = selected.model.decoder.transformer
    assert stack.klass is attention.PipelinedTransformerLayer
    assert (stack.num_layers, stack.num_stages, stack.num_microbatches) == (2, 2, 4)
    assert stack.layer.debug_string() == layer_before.debug_string()
    with pytest.raises(ValueError, match=r"model.decoder.emb is not a transformer stack config"):
        PipelineModifier.default_config().set(
            target_config="model.decoder.emb", num_stages=2, num_microbatches=2
        ).instantiate()(_trainer_config())


def test_remat_spec_modifier_by_name():
    """A remat choice name (attention.REMAT_CHOICES) resolves against the layer's stack."""
    remat_name_of, remat_spec_by_name = attention.remat_name_of, attention.remat_spec_by_name
    cfg = _trainer_config()
    modifier = RematSpecModifier.default_config().set(remat_policies={LAYER: "save_context"})
    modifier.instantiate()(cfg)
    spec = find_config(cfg, LAYER).remat_spec
    assert remat_name_of(spec) == "save_context"
    stack = find_config(cfg, LAYER.rsplit(".", 1)[0])
    assert spec == remat_spec_by_name("save_context", stack_cfg=stack)
    modifier = RematSpecModifier.default_config().set(remat_policies={LAYER: "none"})
    assert find_config(modifier.instantiate()(cfg), LAYER).remat_spec is None
    bad = RematSpecModifier.default_config().set(remat_policies={LAYER: "most"})
    with pytest.raises(ValueError) as e:
        bad.instantiate()(cfg)
    assert str(e.value) == (
        f"RematSpecModifier.remat_policies[{LAYER!r}]='most' is not a remat choice; choose one "
        "of none, save_matmuls, save_context, full."
    )


def test_chain_dumps_under_trainer_config_modifier():
    chain = ChainConfigModifier.default_config().set(
        config_modifiers=[MeshShapeModifier.default_config().set(mesh_shape=(-1, 2, 1))]
    )
    assert "klass: 'axlearn.common.trainer_config_modifier.ChainConfigModifier'" in (
        chain.debug_string().splitlines()
    )


def _flash_trainer_config(flash: bool) -> SpmdTrainer.Config:
    from axlearn.experiments.text.gpt import fuji
    from axlearn.experiments.text.gpt.fuji_tiny import tiny_model_kwargs

    cfg = _trainer_config()
    cfg.model = fuji.model_config(**tiny_model_kwargs(), flash_attention=flash)
    return cfg


def test_flash_block_size_modifiers():
    from axlearn.common.flash_attention.layer import FlashAttention, FlashBlockSizeModifier
    from axlearn.experiments.trainer_config_utils import V6eFlashConfigModifier

    attention = "model.decoder.transformer.layer.self_attention.attention"
    cfg = _flash_trainer_config(flash=True)
    # A FlashAttention config inside a mesh rule is not a layer of the model: left alone.
    rule_attention = FlashAttention.default_config()
    cfg.mesh_rules = [("x", ChainConfigModifier.default_config().set(config_modifiers=[]))]
    cfg.mesh_rules[0][1].config_modifiers.append(
        ModuleConfigModifier.default_config().set(
            target_config=attention, modification=rule_attention
        )
    )
    cfg = FlashBlockSizeModifier.default_config().set(gpu_block_size=64).instantiate()(cfg)
    assert (
        find_config(cfg, attention).tpu_block_size,
        find_config(cfg, attention).gpu_block_size,
    ) == (512, 64)
    cfg = V6eFlashConfigModifier.default_config().instantiate()(cfg)
    assert (
        find_config(cfg, attention).tpu_block_size,
        find_config(cfg, attention).gpu_block_size,
    ) == (1024, 64)
    assert (rule_attention.tpu_block_size, rule_attention.gpu_block_size) == (512, None)
    # Without FlashAttention layers nothing changes.
    plain = _flash_trainer_config(flash=False)
    before = plain.debug_string()
    FlashBlockSizeModifier.default_config().instantiate()(plain)
    assert plain.debug_string() == before


def test_fp8_config_modifier():
    from axlearn.common.quantized_dot_general.layers import (
        DotGeneralQuantizationType,
        get_all_fp8_param_names,
    )
    from axlearn.common.trainer_config_modifier import FP8ConfigModifier
    from axlearn.common.update_transformation import OverrideInplaceUpdateTransformation

    cfg = _trainer_config()
    inner = cfg.learner.optimizer
    modifier = FP8ConfigModifier.default_config().set(fp8_amax_history_length=16).instantiate()
    cfg = modifier(cfg)
    opt = cfg.learner.optimizer
    assert isinstance(opt, OverrideInplaceUpdateTransformation.Config)
    assert opt.rules == [f".*/{x}" for x in get_all_fp8_param_names()]
    assert opt.transformation is inner
    q = find_config(cfg, f"{LAYER}.feed_forward.linear1").quantized_dot_general
    assert q.quantization_type == DotGeneralQuantizationType.FP_8
    assert q.fp8_amax_history_length == 16
    # Applying it twice does not nest the wrapper or repeat rules.
    cfg = modifier(cfg)
    assert cfg.learner.optimizer.transformation is inner
    assert len(cfg.learner.optimizer.rules) == len(get_all_fp8_param_names())
    assert "FP8ConfigModifier" in modifier.config.debug_string()


def test_fp8_config_modifier_without_matmul_layers():
    from axlearn.common.base_model import BaseModel
    from axlearn.common.trainer_config_modifier import FP8ConfigModifier

    cfg = _trainer_config()
    cfg.model = BaseModel.default_config()
    modifier = FP8ConfigModifier.default_config().set(fp8_amax_history_length=16).instantiate()
    with pytest.raises(ValueError, match=r"FP8ConfigModifier: model \(BaseModel\) has no matmul"):
        modifier(cfg)


def test_missing_paths_and_fields_list_the_existing_keys():
    from axlearn.common.trainer_config_modifier import ModifierPathError

    cfg = _trainer_config()
    decoder_keys = sorted(cfg.model.decoder.keys())
    with pytest.raises(ModifierPathError) as e:
        find_config(cfg, "model.decoder.nope")
    # Both a ValueError and an AttributeError; names the path, the missing key and the keys.
    assert isinstance(e.value, ValueError) and isinstance(e.value, AttributeError)
    assert e.value.prefix == "model.decoder.nope"
    assert f"nope (keys are {decoder_keys})" in str(e.value)
    path = f"{LAYER}.feed_forward.linear1"
    bad = PartitionSpecModifier.default_config().set(partition_specs={path: dict(no_spec=None)})
    with pytest.raises(AttributeError, match=r"no_spec \(keys are \[") as e:
        bad.instantiate()(_trainer_config())
    assert e.value.prefix == f"{path}.no_spec"
    bad = ModuleConfigModifier.default_config().set(
        target_config="model.nope", modification=attention.StackedTransformerLayer.default_config()
    )
    with pytest.raises(AttributeError, match=r"model\.nope.*nope \(keys are"):
        bad.instantiate()(_trainer_config())


def test_learner_modifiers_fill_an_unset_learner():
    from axlearn.common.trainer_config_modifier import (
        FP8ConfigModifier,
        OverrideInplaceUpdateTransformation,
    )
    from axlearn.common.update_transformation import (
        OverrideInplaceUpdateTransformation as FromUpdateTransformation,
    )

    assert OverrideInplaceUpdateTransformation is FromUpdateTransformation
    cfg = _trainer_config().set(learner=SpmdTrainer.default_config().learner)  # REQUIRED.
    cfg = GradientAccumulationModifier.default_config().set(grad_acc_steps=2).instantiate()(cfg)
    assert cfg.learner.klass is learner.Learner
    assert cfg.learner.forward_fn_transformation.steps == 2
    cfg = _trainer_config().set(learner=SpmdTrainer.default_config().learner)
    cfg = FP8ConfigModifier.default_config().set(fp8_amax_history_length=4).instantiate()(cfg)
    assert cfg.learner.klass is learner.Learner
    assert isinstance(cfg.learner.optimizer, OverrideInplaceUpdateTransformation.Config)
