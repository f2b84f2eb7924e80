"""Tests of axlearn.common.lora_config_modifier on Fuji configs."""

import functools
import re

import jax
import numpy as np
import pytest

from axlearn.common import utils
from axlearn.common.config import config_for_function
from axlearn.common.learner import UpdateType
from axlearn.common.lora_config_modifier import ADAPTER_PARAM_REGEX, LoraConfigModifier
from axlearn.common.module import functional as F
from axlearn.common.trainer_metrics import format_trainable_counts, trainable_parameter_counts
from axlearn.experiments.text.gpt import fuji

# fuji-tiny-v3's shapes (fuji_tiny.tiny_model_kwargs): 2 layers, dim 64, 4 heads of 16, 2 KV heads.
LAYERS, DIM, HEADS, KV_HEADS, PER_HEAD = 2, 64, 4, 2, 16


def _not_a_learner() -> None:
    """A function whose config has no update_rules."""


def _tiny():
    return fuji.named_trainer_configs()["fuji-tiny-v3"]()


def _lora(**kwargs):
    return LoraConfigModifier.default_config().set(**kwargs).instantiate()(_tiny())


def test_lora_model_starts_as_the_base_model_and_only_adapters_train():
    rank = 4
    base_cfg, lora_cfg = _tiny(), _lora(rank=rank, alpha=8.0)
    assert lora_cfg.learner.update_rules == [
        (ADAPTER_PARAM_REGEX, UpdateType.ALL_UPDATES),
        (".*", UpdateType.NO_UPDATE),
    ]
    base = base_cfg.model.set(name="model").instantiate(parent=None)
    lora = lora_cfg.model.set(name="model").instantiate(parent=None)
    # Random base weights; adapters: random down projections, zero up projections (as init).
    rng = np.random.default_rng(0)

    def random_params(model):
        return jax.tree.map(
            lambda spec: (0.1 * rng.standard_normal(spec.shape)).astype(np.float32),
            model.create_parameter_specs_recursively(),
        )

    base_params = random_params(base)
    base_flat = dict(utils.flatten_items(base_params))
    # Every base parameter is in the LoRA model, under <proj>/layer/ when wrapped.
    flat = {}
    for path, value in utils.flatten_items(random_params(lora)):
        if "/adapter/" in path:
            flat[path] = np.zeros_like(value) if "/lora_up/" in path else value
            continue
        base_path = path.replace("/i_proj/i_proj/layer/", "/i_proj/i_proj/")
        base_path = base_path.replace("/o_proj/layer/", "/o_proj/")
        flat[path] = base_flat.pop(base_path)
    assert not base_flat
    params = jax.tree_util.tree_map_with_path(
        lambda kp, v: flat[jax.tree_util.keystr(kp, simple=True, separator="/")],
        lora.create_parameter_specs_recursively(),
    )
    batch = dict(
        input_ids=np.arange(2 * 16, dtype=np.int32).reshape(2, 16) % 4096,
        target_labels=np.ones((2, 16), np.int32),
    )

    def loss(model, state):
        (value, _), _ = jax.jit(functools.partial(F, model, is_training=False))(
            state=state, prng_key=jax.random.PRNGKey(2), inputs=dict(input_batch=batch)
        )
        return float(value)

    # The up projections start at zero: the LoRA model computes the base model's loss.
    np.testing.assert_allclose(loss(lora, params), loss(base, base_params), rtol=1e-6)
    # Trainable: exactly the adapters, with the size of rank-`rank` factors (NumPy formula).
    learner = lora_cfg.learner.set(name="learner").instantiate(parent=None)
    specs = lora.create_parameter_specs_recursively()
    mask = dict(utils.flatten_items(learner.should_update_with_optimizers(specs)))
    assert {p for p, keep in mask.items() if keep} == {p for p in mask if "/adapter/" in p}
    qkv = DIM * 3 * rank + rank * (HEADS + 2 * KV_HEADS) * PER_HEAD
    out = rank * HEADS * PER_HEAD + rank * DIM
    counts = trainable_parameter_counts(
        specs, learner=learner, learner_state_specs=learner.create_state_partition_specs(specs)
    )
    assert counts["trainable"] == LAYERS * (qkv + out)
    assert counts["total"] == utils.count_model_params(specs)
    assert counts["trainable"] + counts["frozen"] == counts["total"]
    # AdamW keeps two moments per trained value (plus scalar step counts).
    assert 2 * counts["trainable"] <= counts["optimizer_state"] <= 2 * counts["trainable"] + 8
    line = format_trainable_counts(counts)
    assert re.fullmatch(
        r"Trainable parameters: [\d,]+ of [\d,]+ \(\d+\.\d\d%\); frozen: [\d,]+; "
        r"optimizer state: [\d,]+ values",
        line,
    ), line


def test_feed_forward_and_query_only():
    cfg = _lora(
        feed_forward=True,
        output_projection=False,
        enable_lora=dict(query=True, key=False, value=False),
    )
    model = cfg.model.set(name="model").instantiate(parent=None)
    paths = [p for p, _ in utils.flatten_items(model.create_parameter_specs_recursively())]
    adapters = sorted({re.sub(r"layer\d", "layerN", p) for p in paths if "/adapter/" in p})
    prefix = "decoder/transformer/layerN/"
    assert adapters == sorted(
        [
            prefix + "feed_forward/" + f"{lin}/adapter/lora_{d}/weight"
            for lin in ("linear1_0", "linear1_1", "linear2")
            for d in ("down", "up")
        ]
        + [
            prefix + "self_attention/attention/i_proj/i_proj/adapter/lora_down/weight",
            # Query only: the non-grouped fused up projection (one enabled projection).
            prefix + "self_attention/attention/i_proj/i_proj/adapter/lora_up/weight",
        ]
    )


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(model_path="learner"), "no attention layer"),
        (dict(enable_lora=dict(query=True)), "keys query, key, value"),
    ],
)
def test_bad_modifier_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _lora(**kwargs)


def test_applying_twice_and_learner_without_rules_fail():
    modifier = LoraConfigModifier.default_config().instantiate()
    cfg = modifier(_tiny())
    with pytest.raises(ValueError, match="apply the modifier once"):
        modifier(cfg)
    cfg = _tiny()
    cfg.learner = config_for_function(_not_a_learner)  # A config without update_rules.
    with pytest.raises(ValueError, match="update_rules"):
        modifier(cfg)
