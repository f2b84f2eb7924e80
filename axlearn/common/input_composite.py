"""Inputs made of other inputs: `ConcatenatedInput` (one after another) and `ZipInput` (side by
side).

Each child is a tf.data input config (e.g. `input_tf_data.Input`); its `is_training` is set from
the composite's. Iterating a composite yields NumPy batches (`input_base.Input.__iter__`).

TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from axlearn.common import input_base
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.module import Module

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf


def _element_spec(ds: tf.data.Dataset) -> Any:
    import jax  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    def to_struct(spec):
        dtype = object if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype)
        return jax.ShapeDtypeStruct(tuple(spec.shape), dtype)

    return tf.nest.map_structure(to_struct, ds.element_spec)


class ConcatenatedInput(input_base.Input):
    """Yields the batches of its inputs one input after another, in the given order.

    Every input but the last must be finite (a repeated input never ends).
    """

    @config_class
    class Config(input_base.Input.Config):
        """Configures ConcatenatedInput."""

        # Whether the inputs are for training; set on every input.
        is_training: Required[bool] = REQUIRED
        # The input configs, in iteration order (at least one).
        inputs: Sequence[InstantiableConfig] = []

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not cfg.inputs:
            raise ValueError(
                f"Empty inputs for ConcatenatedInput: set {self.path() or 'input'}.inputs to one "
                "or more input configs."
            )
        self._inputs = [
            self._add_child(f"input_{i}", input_cfg.clone(is_training=cfg.is_training))
            for i, input_cfg in enumerate(cfg.inputs)
        ]

    def dataset(self) -> tf.data.Dataset:
        """Returns the inputs' batches as one tf.data.Dataset, the inputs concatenated."""
        ds = self._inputs[0].dataset()
        for child in self._inputs[1:]:
            ds = ds.concatenate(child.dataset())
        return ds

    def element_spec(self) -> Any:
        """Returns the batches' `jax.ShapeDtypeStruct`s (those of the first input)."""
        return _element_spec(self.dataset())


class ZipInput(input_base.Input):
    """Yields `{name: batch of that input}` from several inputs read in step.

    Iteration stops when any input is exhausted.
    """

    @config_class
    class Config(input_base.Input.Config):
        """Configures ZipInput."""

        # Whether the inputs are for training; set on every input.
        is_training: Required[bool] = REQUIRED
        # {name: input config}; each batch is {name: that input's batch}.
        inputs: dict[str, InstantiableConfig] = {}

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._names = list(cfg.inputs)
        self._inputs = [
            self._add_child(f"input_{name}", input_cfg.clone(is_training=cfg.is_training))
            for name, input_cfg in cfg.inputs.items()
        ]

    def dataset(self) -> tf.data.Dataset:
        """Returns the zipped batches as one tf.data.Dataset of {name: batch}."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        names = list(self._names)
        zipped = tf.data.Dataset.zip(tuple(child.dataset() for child in self._inputs))
        return zipped.map(lambda *parts: dict(zip(names, parts)))

    def element_spec(self) -> Any:
        """Returns {name: that input's batch `jax.ShapeDtypeStruct`s}."""
        return _element_spec(self.dataset())
