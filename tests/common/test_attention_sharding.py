"""Tests of axlearn.common.attention.sharding: the set_*_partition_specs helpers."""

from axlearn.common.attention import (
    set_attention_partition_specs,
    set_double_shard_weights_config,
)
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

_KW = dict(num_layers=1, model_dim=16, num_heads=2, hidden_dim=32, vocab_size=50)
FSDP = ("expert", "fsdp", "seq")
BATCH = ("data", "expert", "fsdp")


def test_double_shard_matches_the_sharded_builder():
    """Applied to an unsharded layer, the helper gives the reference builder's specs."""
    expected = transformer_lm_config(**_KW, sharding=True).decoder.transformer.layer
    layer = transformer_lm_config(**_KW).decoder.transformer.layer
    assert layer.feed_forward.linear1.param_partition_spec == [None, "model"]
    set_double_shard_weights_config(
        layer,
        batch_axis_names=BATCH,
        fsdp_axis_names=FSDP,
        tp_axis_names="model",
        seq_axis_names="seq",
    )
    for path in (
        "self_attention.attention.input_linear.input_linear.layer.param_partition_spec",
        "self_attention.attention.output_linear.param_partition_spec",
        "feed_forward.linear1.param_partition_spec",
        "feed_forward.linear2.param_partition_spec",
        "feed_forward.linear1.output_partition_spec",
        "feed_forward.linear2.output_partition_spec",
    ):
        got, want = layer, expected
        for part in path.split("."):
            got, want = getattr(got, part), getattr(want, part)
        assert got == want, path


def test_attention_partition_specs_on_a_list():
    layers = [transformer_lm_config(**_KW).decoder.transformer.layer for _ in range(2)]
    set_double_shard_weights_config(layers)
    for layer in layers:
        attention = layer.self_attention.attention
        assert attention.output_linear.param_partition_spec == ("fsdp", "model", None)
        assert layer.feed_forward.linear2.param_partition_spec == ("model", "fsdp")
    attention = transformer_lm_config(**_KW).decoder.transformer.layer.self_attention.attention
    set_attention_partition_specs(attention, fsdp_axis_names="data", tp_axis_names="model")
    inner = attention.input_linear.input_linear.layer
    assert inner.param_partition_spec == ("data", "model", None)
