"""Recurrent layers: an LSTM cell, stacks of cells, and a repeated (scanned) cell stack.

Every cell is a `BaseRNNCell`: `init_states(batch_size=...)` gives the zero state,
`extend_step(cached_states=..., data=[batch, input_dim])` advances it by one step and returns
`(new_states, outputs [batch, output_dim])`, and `forward(time_major_inputs)` runs the whole
sequence ([seq_len, batch, input_dim] -> [seq_len, batch, output_dim]) as a scan over
`extend_step`, so streaming one step at a time gives exactly the full-sequence outputs. The
final states of `forward` are a module output named "final_states".

`LSTMCell` follows the Lingvo-style LSTM AXLearn uses: no biases, one `MultiLinear` projection
of `[x, m]` to the four gates (i, f, g, o) of width `hidden_dim`, an optional normalization of
the gate pre-activations, an optional clip of the cell value, and an optional output
projection `hidden_dim -> output_dim` (present when `hidden_dim` is set):

    c' = sigmoid(f) * c + sigmoid(g) * tanh(i)
    m' = output_proj(sigmoid(o) * tanh(c'))
"""

from collections.abc import Sequence
from typing import Optional

import jax
from jax import numpy as jnp

from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.layers import Linear, MultiLinear
from axlearn.common.module import Module, nowrap, scan_in_context
from axlearn.common.repeat import Repeat
from axlearn.common.utils import Nested, Tensor, VDict, get_or_none, split_prng_key


def _time_major_shape(path: str, inputs: Tensor) -> tuple[int, int]:
    """Returns (seq_len, batch_size) of time-major inputs [seq_len, batch, dim]."""
    if not hasattr(inputs, "ndim") or inputs.ndim != 3:
        raise ValueError(
            f"{path}: time_major_inputs must be a [seq_len, batch_size, input_dim] tensor, got "
            f"shape {getattr(inputs, 'shape', type(inputs))}"
        )
    return inputs.shape[0], inputs.shape[1]


class BaseRNNCell(BaseLayer):
    """The interface of recurrent cells: `init_states`, `extend_step` and a scanned `forward`.

    Subclasses implement `init_states`, `extend_step`, `_batch_size` and `_seq_len`.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseRNNCell."""

        # Input feature dim.
        input_dim: Required[int] = REQUIRED
        # Output feature dim; None means input_dim.
        output_dim: Optional[int] = None

    @property
    def output_dim(self) -> int:
        """The output feature dim (`output_dim`, or `input_dim` when unset)."""
        cfg = self.config
        return cfg.input_dim if cfg.output_dim is None else cfg.output_dim

    @nowrap
    def init_states(self, *, batch_size: int) -> Nested[Tensor]:
        """Returns the states before the first step.

        Args:
            batch_size: The batch size.

        Returns:
            A nested structure of tensors with leading dim batch_size.
        """
        raise NotImplementedError(type(self))

    def extend_step(
        self, *, cached_states: Nested[Tensor], data: Tensor
    ) -> tuple[Nested[Tensor], Tensor]:
        """Advances the states by one step.

        Args:
            cached_states: States from `init_states()` or a previous `extend_step()`.
            data: [batch_size, input_dim], this step's inputs.

        Returns:
            (updated states, outputs [batch_size, output_dim]).
        """
        raise NotImplementedError(type(self))

    def forward(self, time_major_inputs: Tensor) -> Tensor:
        """Runs the cell over a whole sequence (a scan of `extend_step`).

        Also adds the final states as the module output "final_states".

        Args:
            time_major_inputs: [seq_len, batch_size, input_dim].

        Returns:
            [seq_len, batch_size, output_dim].
        """
        batch_size = self._batch_size(time_major_inputs)
        seq_len = self._seq_len(time_major_inputs)
        states = self.init_states(batch_size=batch_size)
        xs = dict(xs=time_major_inputs)
        if self.prng_key is not None:
            xs["prng_key"] = split_prng_key(self.prng_key, seq_len).keys

        def step(carry, x_t):
            return self.extend_step(cached_states=carry, data=x_t)

        final_states, outputs = scan_in_context(step, carry=states, xs=xs, child_name_prefix="iter")
        self.add_module_output("final_states", final_states)
        return outputs

    def _batch_size(self, inputs: Tensor) -> int:
        """The batch size of `forward`'s inputs."""
        raise NotImplementedError(type(self))

    def _seq_len(self, inputs: Tensor) -> int:
        """The sequence length of `forward`'s inputs."""
        raise NotImplementedError(type(self))


class _TimeMajorTensorCell(BaseRNNCell):
    """A cell whose `forward` takes one time-major tensor [seq_len, batch, dim]."""

    def _batch_size(self, inputs: Tensor) -> int:
        return _time_major_shape(self.path(), inputs)[1]

    def _seq_len(self, inputs: Tensor) -> int:
        return _time_major_shape(self.path(), inputs)[0]


class LSTMCell(_TimeMajorTensorCell):
    """A bias-free LSTM with optional gate normalization, cell clipping and output projection.

    States: `m` [batch, output_dim] (the output, PyTorch's h) and `c` [batch, hidden_dim].
    Parameters: `input_proj/weight` [input_dim + output_dim, 4, hidden_dim] (gates i, f, g, o),
    `output_proj/weight` [hidden_dim, output_dim] when `hidden_dim` is set, and the norm's.
    """

    @config_class
    class Config(BaseRNNCell.Config):
        """Configures LSTMCell."""

        # Width of the cell state and gates; None means output_dim and no output projection.
        hidden_dim: Optional[int] = None
        # Projection of [inputs, m] to the four gates (i, f, g, o).
        input_proj: MultiLinear.Config = MultiLinear.default_config().set(bias=False)
        # Projection hidden_dim -> output_dim, used when hidden_dim is set.
        output_proj: Linear.Config = Linear.default_config().set(bias=False)
        # Optional normalization of the gate pre-activations [batch, 4, hidden_dim].
        norm: Optional[BaseLayer.Config] = None
        # If set, the cell state is clipped to [-max_cell_value, max_cell_value].
        max_cell_value: Optional[float] = None

    @property
    def hidden_dim(self) -> int:
        """The cell-state width (`hidden_dim`, or the output dim when unset)."""
        cfg = self.config
        return self.output_dim if cfg.hidden_dim is None else cfg.hidden_dim

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "input_proj",
            cfg.input_proj.set(
                input_dim=cfg.input_dim + self.output_dim,
                num_outputs=4,
                output_dim=self.hidden_dim,
            ),
        )
        if cfg.hidden_dim:
            if cfg.output_proj is None:
                raise ValueError(
                    f"{self.path()}: output_proj is None but hidden_dim={cfg.hidden_dim} needs "
                    "it; set output_proj to a Linear config or hidden_dim to None"
                )
            self._add_child(
                "output_proj",
                cfg.output_proj.set(input_dim=self.hidden_dim, output_dim=self.output_dim),
            )
        if cfg.norm is not None:
            self._add_child("norm", cfg.norm.set(input_dim=self.hidden_dim))

    @nowrap
    def init_states(self, *, batch_size: int) -> Nested[Tensor]:
        dtype = self.config.dtype
        return dict(
            m=jnp.zeros([batch_size, self.output_dim], dtype=dtype),
            c=jnp.zeros([batch_size, self.hidden_dim], dtype=dtype),
        )

    def extend_step(
        self, *, cached_states: Nested[Tensor], data: Tensor
    ) -> tuple[Nested[Tensor], Tensor]:
        cfg = self.config
        # [batch, 4, hidden_dim].
        gates = self.input_proj(jnp.concatenate([data, cached_states["m"]], axis=-1))
        if "norm" in self.children:
            gates = self.norm(gates)
        gate_i, gate_f, gate_g, gate_o = (gates[:, k, :] for k in range(4))
        new_c = jax.nn.sigmoid(gate_f) * cached_states["c"] + jax.nn.sigmoid(gate_g) * jnp.tanh(
            gate_i
        )
        if cfg.max_cell_value is not None:
            new_c = jnp.clip(new_c, -cfg.max_cell_value, cfg.max_cell_value)
        new_m = jax.nn.sigmoid(gate_o) * jnp.tanh(new_c)
        if "output_proj" in self.children:
            new_m = self.output_proj(new_m)
        return dict(m=new_m, c=new_c), new_m


class StackedRNNLayer(BaseRNNCell):
    """A stack of (possibly different) cells `layer0`, `layer1`, ..., each feeding the next.

    Its states are the list of the layers' states; `output_dim` is the last layer's.
    """

    @config_class
    class Config(BaseRNNCell.Config):
        """Configures StackedRNNLayer."""

        # The cells, bottom first; each one's input_dim is set from the previous output dim.
        layers: Required[Sequence[BaseRNNCell.Config]] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not cfg.layers:
            raise ValueError(f"{self.path()}: layers must hold at least one cell config")
        self._layers = []
        dim = cfg.input_dim
        for i, layer_cfg in enumerate(cfg.layers):
            layer = self._add_child(f"layer{i}", layer_cfg.set(input_dim=dim))
            self._layers.append(layer)
            dim = layer.output_dim
        if cfg.output_dim is not None and cfg.output_dim != dim:
            raise ValueError(
                f"{self.path()}: output_dim={cfg.output_dim} differs from the last layer's "
                f"output dim {dim}; set output_dim to None or to {dim}"
            )

    @property
    def output_dim(self) -> int:
        """The last layer's output dim."""
        last = self.config.layers[-1]
        return last.input_dim if last.output_dim is None else last.output_dim

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[Nested[Tensor]] = None
    ) -> Nested[Tensor]:
        # One key per layer, split from `prng_key` (as a Repeat of the same cells splits it).
        keys = split_prng_key(prng_key, len(self._layers)).keys
        return {
            layer.name: layer.initialize_parameters_recursively(
                jax.tree.map(lambda k, i=i: k[i], keys), prebuilt=get_or_none(prebuilt, layer.name)
            )
            for i, layer in enumerate(self._layers)
        }

    @nowrap
    def init_states(self, *, batch_size: int) -> list[Nested[Tensor]]:
        """Returns the list of the layers' initial states."""
        return [layer.init_states(batch_size=batch_size) for layer in self._layers]

    def extend_step(  # pytype: disable=signature-mismatch
        self, *, cached_states: list[Nested[Tensor]], data: Tensor
    ) -> tuple[list[Nested[Tensor]], Tensor]:
        """Runs one step through every layer.

        Args:
            cached_states: The list of the layers' states.
            data: [batch_size, input_dim].

        Returns:
            (the list of updated states, the last layer's outputs [batch_size, output_dim]).
        """
        new_states = []
        outputs = data
        for layer, states in zip(self._layers, cached_states):
            states, outputs = layer.extend_step(cached_states=states, data=outputs)
            new_states.append(states)
        return new_states, outputs

    def _batch_size(self, inputs: Tensor) -> int:
        return self._layers[0]._batch_size(inputs)  # pylint: disable=protected-access

    def _seq_len(self, inputs: Tensor) -> int:
        return self._layers[0]._seq_len(inputs)  # pylint: disable=protected-access


class _RNNRepeat(Repeat):
    """A `Repeat` of one cell: states stacked on a leading [num_layers] axis."""

    @nowrap
    def init_states(self, *, batch_size: int) -> Nested[Tensor]:
        """Returns the layers' initial states, each leaf with leading axis num_layers."""
        states = self.layer.init_states(batch_size=batch_size)
        return VDict(
            jax.tree.map(lambda x: jnp.broadcast_to(x, (self.config.num_layers, *x.shape)), states)
        )

    def extend_step(
        self, *, cached_states: Nested[Tensor], data: Tensor
    ) -> tuple[Nested[Tensor], Tensor]:
        """Runs one step through the repeated layers (a scan over the layer axis).

        Args:
            cached_states: The stacked states.
            data: [batch_size, input_dim].

        Returns:
            (the stacked updated states, the last layer's outputs).
        """

        def layer_fn(carry, states):
            new_states, outputs = self.layer.extend_step(cached_states=states, data=carry)
            return outputs, VDict(new_states)

        out = self._run(layer_fn, carry=data, xs=cached_states)
        return out.ys, out.carry


class RepeatedRNNLayer(BaseRNNCell):
    """`num_layers` copies of one cell, parameters stacked under `repeat/layer` and scanned.

    The cell's input and output dims must agree past the first layer (so `output_dim` equals
    `input_dim`). Initialized from the same key, it gets the parameters a `StackedRNNLayer` of
    the same cells gets, stacked.
    """

    @config_class
    class Config(BaseRNNCell.Config):
        """Configures RepeatedRNNLayer."""

        # Number of repeated cells.
        num_layers: Required[int] = REQUIRED
        # The repeated cell; its input_dim is set from this layer's.
        layer: BaseRNNCell.Config = LSTMCell.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.num_layers <= 0:
            raise ValueError(f"{self.path()}: num_layers={cfg.num_layers} must be > 0")
        self._add_child(
            "repeat",
            _RNNRepeat.default_config().set(
                layer=cfg.layer.set(input_dim=cfg.input_dim), num_layers=cfg.num_layers
            ),
        )

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[Nested[Tensor]] = None
    ) -> Nested[Tensor]:
        # The repeat gets `prng_key` itself, so that its per-layer keys are StackedRNNLayer's.
        return dict(
            repeat=self.repeat.initialize_parameters_recursively(
                prng_key, prebuilt=get_or_none(prebuilt, "repeat")
            )
        )

    @nowrap
    def init_states(self, *, batch_size: int) -> Nested[Tensor]:
        return self.repeat.init_states(batch_size=batch_size)

    def extend_step(
        self, *, cached_states: Nested[Tensor], data: Tensor
    ) -> tuple[Nested[Tensor], Tensor]:
        return self.repeat.extend_step(cached_states=cached_states, data=data)

    def _batch_size(self, inputs: Tensor) -> int:
        return self.repeat.layer._batch_size(inputs)  # pylint: disable=protected-access

    def _seq_len(self, inputs: Tensor) -> int:
        return self.repeat.layer._seq_len(inputs)  # pylint: disable=protected-access


class IdentityCell(_TimeMajorTensorCell):
    """A stateless cell whose outputs are its inputs."""

    def __init__(self, cfg: BaseRNNCell.Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.output_dim and cfg.output_dim != cfg.input_dim:
            raise ValueError(
                f"{self.path()}: IdentityCell needs output_dim == input_dim, got "
                f"input_dim={cfg.input_dim}, output_dim={cfg.output_dim}; unset output_dim"
            )

    @nowrap
    def init_states(self, *, batch_size: int) -> Nested[Tensor]:
        return {}

    def extend_step(
        self, *, cached_states: Nested[Tensor], data: Tensor
    ) -> tuple[Nested[Tensor], Tensor]:
        return {}, data
