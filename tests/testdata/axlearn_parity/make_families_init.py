"""Initializes small layers of several families from PRNGKey(0); runs on AXLearn and on ours.

`families_init.npz` was written by running this file with AXLearn HEAD 34aed43c (jax 0.8.3,
CPU, Python 3.12), with `AXSTUB` naming the folder of a stub module (not shipped) that lets
AXLearn's imports of TensorFlow-family packages resolve: `python make_families_init.py
families_init.npz`. Our tests import `families()` and `init_family()` from here.
"""

import os
import sys

if os.environ.get("AXSTUB"):
    sys.path.insert(0, os.environ["AXSTUB"])
    import stubs  # noqa: F401
import jax
import numpy as np

from axlearn.common import attention, convolution, layers, mixture_of_experts
from axlearn.common.utils import flatten_items
from axlearn.vision import resnet


def attn(klass, input_linear, **kw):
    return klass.default_config().set(
        query_dim=16, key_dim=16, value_dim=16, num_heads=4, input_linear=input_linear, **kw
    )


def tlayer():
    cfg = attention.TransformerLayer.default_config()
    cfg.self_attention.attention.set(num_heads=2)
    cfg.feed_forward.hidden_dim = 32
    return cfg


def families():
    f = {}
    f["mha"] = attn(attention.MultiheadAttention, attention.QKVLinear.default_config())
    f["mha_fused"] = attn(attention.MultiheadAttention, attention.FusedQKVLinear.default_config())
    f["gqa"] = attn(
        attention.GroupedQueryAttention,
        attention.FusedGroupedQKVLinear.default_config().set(num_kv_heads=2),
    )
    f["gqa_grouped"] = attn(
        attention.GroupedQueryAttention,
        attention.GroupedQKVLinear.default_config().set(num_kv_heads=2),
    )
    f["rope_gqa"] = attn(
        attention.GroupedQueryAttention,
        attention.RoFormerQKVLinear.default_config().set(
            rotary_value=False,
            input_linear=attention.FusedGroupedQKVLinear.default_config().set(num_kv_heads=2),
        ),
    )
    f["transformer_layer"] = tlayer().set(input_dim=16)
    f["stacked"] = attention.StackedTransformerLayer.default_config().set(
        input_dim=16, num_layers=4, layer=tlayer()
    )
    f["repeated"] = attention.RepeatedTransformerLayer.default_config().set(
        input_dim=16, num_layers=4, layer=tlayer()
    )
    f["pipelined"] = attention.PipelinedTransformerLayer.default_config().set(
        input_dim=16, num_layers=4, num_stages=2, num_microbatches=2, layer=tlayer()
    )
    f["moe"] = mixture_of_experts.TransformerFeedForwardMoE.default_config().set(
        input_dim=8, hidden_dim=16, num_experts=4, num_groups=1, activation=("nn.silu", "linear")
    )
    f["conv2d"] = convolution.Conv2D.default_config().set(window=(3, 3), input_dim=4, output_dim=8)
    f["conv1d"] = convolution.Conv1D.default_config().set(window=3, input_dim=4, output_dim=8)
    f["conv2d_depthwise"] = convolution.Conv2D.default_config().set(
        window=(3, 3), input_dim=4, output_dim=4, num_input_dim_groups=4
    )
    f["linear"] = layers.Linear.default_config().set(input_dim=8, output_dim=16)
    # A small ResNet-18-shaped net (stem and stages of the resnet18 config, narrower).
    f["resnet_small"] = resnet.ResNet.resnet18_config().set(
        hidden_dim=8, num_blocks_per_stage=[1, 1]
    )
    f["resnet50_small"] = resnet.ResNet.resnet50_config().set(
        hidden_dim=8, num_blocks_per_stage=[1, 1]
    )
    from axlearn.common import param_init

    WEIGHT = param_init.PARAM_REGEXP_WEIGHT

    for dist in ["normal", "truncated_normal", "uniform"]:
        for fan in ["fan_in", "fan_out", "fan_avg", None]:
            cfg = layers.Linear.default_config().set(input_dim=24, output_dim=40)
            cfg.param_init = param_init.DefaultInitializer.default_config().set(
                init_by_param_name={
                    WEIGHT: param_init.WeightInitializer.default_config().set(
                        fan=fan, distribution=dist, scale=0.7
                    )
                }
            )
            f[f"linear_{dist}_{fan}"] = cfg
    g = layers.Linear.default_config().set(input_dim=24, output_dim=40)
    g.param_init = param_init.DefaultInitializer.default_config().set(
        init_by_param_name={
            param_init.PARAM_REGEXP_WEIGHT: param_init.GaussianInitializer.default_config().set(
                std=0.3
            )
        }
    )
    f["linear_gaussian"] = g
    return f


def init_family(name, cfg):
    """{f"{name}/{path}": array} of `cfg`'s layer initialized from PRNGKey(0) (eagerly)."""
    layer = cfg.set(name=name).instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    return {f"{name}/{k}": np.asarray(v) for k, v in flatten_items(params)}


if __name__ == "__main__":
    out = {}
    for family, family_cfg in families().items():
        out.update(init_family(family, family_cfg))
    np.savez_compressed(sys.argv[1], **out)
