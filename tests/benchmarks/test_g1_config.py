"""benchmarks/g1_config.py: `fp8=True` puts G1's dense matmuls in fp8 (FP8ConfigModifier, 128)."""

import os
import sys

from axlearn.common.layers import Linear
from axlearn.common.quantized_dot_general.layers import DotGeneralQuantizationType
from axlearn.common.update_transformation import OverrideInplaceUpdateTransformation
from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import g1_config  # noqa: E402  pylint: disable=wrong-import-position


def _linears(cfg) -> dict:
    """Every Linear config under `cfg`, by path."""
    found = {}

    def enter_fn(path, value, children):
        if isinstance(value, Linear.Config):
            found[path] = value
        return children

    cfg.visit(visit_fn=lambda path, value: None, enter_fn=enter_fn)
    return found


def test_fp8_option():
    bf16 = g1_config.g1_trainer_config("/tmp/unused", tiny=True)
    fp8 = g1_config.g1_trainer_config("/tmp/unused", tiny=True, fp8=True)
    assert g1_config.FP8_AMAX_HISTORY_LENGTH == 128
    bf16_linears, fp8_linears = _linears(bf16.model), _linears(fp8.model)
    ff = "decoder.transformer.layer.feed_forward."
    assert {ff + n for n in ("linear1", "linear2")} <= set(fp8_linears)
    assert set(fp8_linears) == set(bf16_linears)
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
