"""A tiny stand-in experiment module for the experiment registry and `axlearn config` tests.

Its configs are small Configurable trees, not real trainer configs: the registry and the CLI only
need something with `debug_string()`.
"""

from axlearn.common.config import REQUIRED, Configurable, Required, config_class


class FakeModel(Configurable):
    """A configurable with a few fields, standing in for a model."""

    @config_class
    class Config(Configurable.Config):
        """Configures FakeModel."""

        # Model width.
        dim: Required[int] = REQUIRED
        # Number of layers.
        num_layers: int = 2
        # Dropout rate.
        dropout: float = 0.0


class FakeTrainer(Configurable):
    """A configurable holding a model config, standing in for a trainer."""

    @config_class
    class Config(Configurable.Config):
        """Configures FakeTrainer."""

        # The model.
        model: FakeModel.Config = FakeModel.default_config()
        # Training steps.
        max_step: int = 10


def _fake_config(dim: int):
    def config_fn() -> FakeTrainer.Config:
        cfg = FakeTrainer.default_config()
        cfg.model.dim = dim
        return cfg

    return config_fn


def named_trainer_configs() -> dict:
    """Returns the named fake trainer configs."""
    return {"fake_tiny": _fake_config(8), "fake_small": _fake_config(64)}
