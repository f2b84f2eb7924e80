"""benchmarks/g1_config.py: `fp8=True` puts G1's dense matmuls in fp8 (FP8ConfigModifier, 128):
the feed-forward and the attention projections."""

import os
import sys

from axlearn.common.quantized_dot_general.layers import (
    DenseGeneralBaseLayer,
    DotGeneralQuantizationType,
)
from axlearn.common.update_transformation import OverrideInplaceUpdateTransformation
from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import g1_config  # noqa: E402  pylint: disable=wrong-import-position


def _linears(cfg) -> dict:
    """Every DenseGeneralBaseLayer config (a matmul that may be quantized) under `cfg`, by path."""
    found = {}

    def enter_fn(path, value, children):
        if isinstance(value, DenseGeneralBaseLayer.Config):
            found[path] = value
        return children

    cfg.visit(visit_fn=lambda path, value: None, enter_fn=enter_fn)
    return found


def test_fp8_option():
    bf16 = g1_config.g1_trainer_config("/tmp/unused", tiny=True)
    fp8 = g1_config.g1_trainer_config("/tmp/unused", tiny=True, fp8=True)
    assert g1_config.FP8_AMAX_HISTORY_LENGTH == 128
    bf16_linears, fp8_linears = _linears(bf16.model), _linears(fp8.model)
    layer = "decoder.transformer.layer."
    assert (
        set(fp8_linears)
        == set(bf16_linears)
        == {
            layer + "feed_forward.linear1",
            layer + "feed_forward.linear2",
            layer + "self_attention.attention.input_linear.input_linear.layer",  # Fused q/k/v.
            layer + "self_attention.attention.output_linear",
        }
    )
    for path, linear in fp8_linears.items():
        qdg = linear.quantized_dot_general
        assert qdg.quantization_type == DotGeneralQuantizationType.FP_8, path
        assert qdg.fp8_amax_history_length == 128, path
        assert bf16_linears[path].quantized_dot_general is None, path
    # The fp8 scales and histories take their new values instead of being optimized.
    optimizer = fp8.learner.optimizer
    assert isinstance(optimizer, OverrideInplaceUpdateTransformation.Config)
    assert ".*/input_scale" in optimizer.rules
    assert optimizer.transformation.fn is bf16.learner.optimizer.fn
    assert not isinstance(bf16.learner.optimizer, OverrideInplaceUpdateTransformation.Config)
