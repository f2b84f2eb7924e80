"""Tests of axlearn.common.multi_stream_model with toy encoders and fusion networks."""

import jax
import numpy as np
import pytest

from axlearn.common.config import config_class
from axlearn.common.module import functional as F
from axlearn.common.multi_stream_model import FusionNetwork, MultiStreamModel, StreamEncoder


class _Scale(StreamEncoder):
    """Multiplies input_batch["x"] by `factor`."""

    @config_class
    class Config(StreamEncoder.Config):
        """Configures _Scale."""

        factor: float = 1.0  # The multiplier.

    def forward(self, input_batch):
        return {"y": input_batch["x"] * self.config.factor}


class _SumOf(FusionNetwork):
    """Loss: the sum of the `encoder`'s outputs."""

    @config_class
    class Config(FusionNetwork.Config):
        """Configures _SumOf."""

        encoder: str = ""  # The stream encoder whose outputs are summed.

    def forward(self, input_batch):
        total = input_batch[self.config.encoder]["y"].sum()
        return total, {"total": total}


def _model(**kwargs):
    return (
        MultiStreamModel.default_config()
        .set(
            name="msm",
            stream_encoder={
                "a": _Scale.default_config().set(factor=2.0),
                "b": _Scale.default_config().set(factor=-1.0),
            },
            fusion_network={
                "la": _SumOf.default_config().set(encoder="a"),
                "lb": _SumOf.default_config().set(encoder="b"),
            },
            **kwargs,
        )
        .instantiate(parent=None)
    )


def _run(model, method="forward", **inputs):
    return F(
        model,
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
        state={},
        inputs=inputs,
        method=method,
    )


def test_loss_is_weighted_sum_and_summaries():
    x = np.arange(4.0)
    (loss, aux), collections = _run(
        _model(loss_weights={"lb": 3.0}), input_batch={"input": {"x": x}}
    )
    assert aux == {}
    assert float(loss) == pytest.approx(2 * x.sum() + 3 * -x.sum())
    assert float(collections.summaries["loss_la"]) == pytest.approx(2 * x.sum())
    assert float(collections.summaries["loss_lb"]) == pytest.approx(-x.sum())


def test_predict_and_single_encoder():
    x = np.arange(3.0)
    out, _ = _run(_model(), method="predict", input_batch={"input": {"x": x}})
    np.testing.assert_allclose(out["a"]["y"], 2 * x)
    np.testing.assert_allclose(out["b"]["y"], -x)
    single, _ = _run(
        _model(),
        method="forward_single_stream_encoder",
        input_batch={"input": {"x": x}},
        encoder_name="a",
    )
    np.testing.assert_allclose(single["y"], 2 * x)
    with pytest.raises(ValueError, match=r"msm: c has not been found"):
        _run(
            _model(),
            method="forward_single_stream_encoder",
            input_batch={"input": {"x": x}},
            encoder_name="c",
        )


def test_errors_name_the_path():
    cfg = MultiStreamModel.default_config().set(
        name="msm",
        stream_encoder={"a": _Scale.default_config()},
        fusion_network={"a": _SumOf.default_config().set(encoder="a")},
    )
    with pytest.raises(ValueError, match=r"msm: stream_encoder and fusion_network share"):
        cfg.instantiate(parent=None)
    with pytest.raises(ValueError, match=r"msm: input_batch already holds 'a'"):
        _run(_model(), input_batch={"input": {"x": np.ones(2)}, "a": {}})
