"""Stacks of transformer layers: StackedTransformerLayer and RepeatedTransformerLayer.

Public names are re-exported by `axlearn.common.attention`.

Both compute the same function given the same weights: `StackedTransformerLayer` has children
`layer0 ... layer{N-1}` (parameter paths `transformer/layer{i}/...`), while
`RepeatedTransformerLayer` has one child `repeat` (a `_TransformerRepeat`) whose `layer`
parameters are stacked on a leading axis (paths `transformer/repeat/layer/...`) and runs the
layers with `jax.lax.scan`.
"""

from collections.abc import Sequence
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp

from axlearn.common.attention.cache_kwargs import accepts_empty_cache_kwargs
from axlearn.common.attention.transformer import BaseTransformerLayer, TransformerLayer
from axlearn.common.base_layer import RematSpec
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
)
from axlearn.common.layers import get_stochastic_depth_linear_rate, stochastic_depth_rate_scale
from axlearn.common.module import Module, child_context
from axlearn.common.repeat import Repeat
from axlearn.common.utils import (
    NestedTensor,
    SavePattern,
    StackedKeyArray,
    Tensor,
    VDict,
    get_or_none,
    split_prng_key,
)
from axlearn.common.utils import save_and_offload_only_these_names_regex as _save_offload


def _aggregate(outputs: Sequence[BaseTransformerLayer.Output]) -> BaseTransformerLayer.Output:
    """The last layer's data, with auxiliary outputs stacked on a leading layer axis."""
    fields = {}
    for name in BaseTransformerLayer.Output._fields:
        if name == "data":
            continue
        values = [getattr(o, name) for o in outputs]
        fields[name] = (
            None if values[0] is None else jax.tree.map(lambda *xs: jnp.stack(xs), *values)
        )
    return BaseTransformerLayer.Output(data=outputs[-1].data, **fields)


class BaseStackedTransformerLayer(BaseTransformerLayer):
    """The interface of transformer stacks (a stack is itself a transformer layer)."""

    @config_class
    class Config(BaseTransformerLayer.Config):
        """Configures BaseStackedTransformerLayer."""

        # Number of layers in the stack.
        num_layers: Required[int] = REQUIRED
        # The config of each layer (input_dim is set by the stack).
        layer: InstantiableConfig = TransformerLayer.default_config()
        # The fields of each layer's Output passed to the next layer (as keyword arguments,
        # besides `data`, which is always carried); None means ("data",).
        carry: Optional[Sequence[str]] = None
        # Names of layer keyword arguments whose leading axis is the layer axis
        # ([num_layers, ...]): layer i receives row i. None: none.
        scan_kwargs: Optional[Sequence[str]] = None
        # If set (in [0, 1)), layer i of N gets the stochastic depth (drop-path) rate
        # peak * (i + 1) / N in its self_attention and feed_forward; None or 0: as configured.
        peak_stochastic_depth_rate: Optional[float] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        peak = cfg.peak_stochastic_depth_rate
        if peak is not None and not 0 <= peak < 1:
            raise ValueError(
                f"{self.path()}.peak_stochastic_depth_rate={peak} must be in [0, 1) (or None)."
            )
        fields = BaseTransformerLayer.Output._fields
        bad = [name for name in cfg.carry or () if name not in fields]
        if bad or (cfg.carry is not None and "data" not in cfg.carry):
            raise ValueError(
                f"{self.path()}.carry={tuple(cfg.carry)!r} must include 'data' and name fields "
                f"of the layer Output {fields}; fix or unset carry."
            )

    def _with_stochastic_depth_rate(
        self, layer_cfg: InstantiableConfig, rate: float, *, index: str
    ) -> InstantiableConfig:
        """A clone of `layer_cfg` whose self_attention and feed_forward drop paths at `rate`."""
        layer_cfg = layer_cfg.clone()
        for name in ("self_attention", "feed_forward"):
            child = getattr(layer_cfg, name, None)
            if child is None or "stochastic_depth" not in child:
                raise ValueError(
                    f"{self.path()}.peak_stochastic_depth_rate needs layer{index}.{name}."
                    f"stochastic_depth, which {type(layer_cfg).__qualname__} lacks; use "
                    "TransformerLayer layers or unset peak_stochastic_depth_rate."
                )
            child.stochastic_depth.rate = rate
        return layer_cfg

    def _extra_carry(self) -> tuple[str, ...]:
        """The carried Output fields besides data."""
        return tuple(name for name in self.config.carry or () if name != "data")

    def _split_scan_kwargs(self, layer_kwargs: dict) -> tuple[dict, dict]:
        """(per-layer kwargs {name: [num_layers, ...]}, the other kwargs)."""
        names = tuple(self.config.scan_kwargs or ())
        missing = [name for name in names if name not in layer_kwargs]
        if missing:
            raise ValueError(
                f"{self.path()}.scan_kwargs names {missing}, which were not passed to forward; "
                "pass them or drop them from scan_kwargs."
            )
        per_layer = {name: layer_kwargs[name] for name in names}
        others = {k: v for k, v in layer_kwargs.items() if k not in names}
        return per_layer, others


class StackedTransformerLayer(BaseStackedTransformerLayer):
    """A stack of separately-parameterized layers `layer0`, `layer1`, ... run in sequence."""

    @config_class
    class Config(BaseStackedTransformerLayer.Config):
        """Configures StackedTransformerLayer."""

        # One config shared by all layers, or a sequence of num_layers configs.
        layer: Union[InstantiableConfig, Sequence[InstantiableConfig]] = (
            TransformerLayer.default_config()
        )
        # Optional config of a function returning `merge(data, all_layer_outputs) -> data`, the
        # input of the next layer from the previous layer's output data and the outputs so far
        # (e.g. `update_data_with_skip_connection`); None: the previous layer's output data.
        data_merger: Optional[InstantiableConfig] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if isinstance(cfg.layer, (list, tuple)):
            if len(cfg.layer) != cfg.num_layers:
                raise ValueError(
                    f"{self.path()}: {len(cfg.layer)} layer configs for num_layers={cfg.num_layers}"
                )
            layer_cfgs = list(cfg.layer)
        else:
            layer_cfgs = [cfg.layer] * cfg.num_layers
        if cfg.peak_stochastic_depth_rate:
            layer_cfgs = [
                self._with_stochastic_depth_rate(
                    layer_cfg,
                    get_stochastic_depth_linear_rate(
                        cfg.peak_stochastic_depth_rate, i + 1, cfg.num_layers
                    ),
                    index=f"[{i}]",
                )
                for i, layer_cfg in enumerate(layer_cfgs)
            ]
        self._layers = [
            self._add_child(f"layer{i}", layer_cfg.clone(input_dim=cfg.input_dim))
            for i, layer_cfg in enumerate(layer_cfgs)
        ]
        self._data_merger = None if cfg.data_merger is None else cfg.data_merger.instantiate()

    def initialize_parameters_recursively(
        self, prng_key: Union[Tensor, StackedKeyArray], *, prebuilt: Optional[NestedTensor] = None
    ) -> NestedTensor:
        """Layer i gets the i-th of `num_layers` successive splits of `prng_key` (as AXLearn).

        Args:
            prng_key: A key, or keys already split per layer (a StackedKeyArray, e.g. from a
                PipelinedTransformerLayer), so stacked, repeated and pipelined stacks draw alike.
            prebuilt: See `BaseLayer.initialize_parameters_recursively`.

        Returns:
            {"layer0": params, ...}.
        """
        keys = split_prng_key(prng_key, self.config.num_layers).keys
        return {
            layer.name: layer.initialize_parameters_recursively(
                jax.tree.map(lambda x, i=i: x[i], keys), prebuilt=get_or_none(prebuilt, layer.name)
            )
            for i, layer in enumerate(self._layers)
        }

    def forward(self, data: Tensor, **layer_kwargs) -> BaseTransformerLayer.Output:
        """Runs the layers in order; see `TransformerLayer.forward` for `layer_kwargs`.

        `scan_kwargs` arguments are sliced per layer; `carry` fields of each layer's Output
        are passed to the next layer as keyword arguments.
        """
        per_layer, layer_kwargs = self._split_scan_kwargs(layer_kwargs)
        outputs = []
        for i, layer in enumerate(self._layers):
            sliced = jax.tree.map(lambda x, i=i: x[i], per_layer)
            out = layer(data, **layer_kwargs, **sliced)
            outputs.append(out)
            data = out.data
            for name in self._extra_carry():
                layer_kwargs[name] = getattr(out, name)
            if self._data_merger is not None:
                data = self._data_merger(data, outputs)
        return self._aggregate_layer_outputs(outputs)

    def _aggregate_layer_outputs(
        self, layer_outputs: Sequence[BaseTransformerLayer.Output]
    ) -> BaseTransformerLayer.Output:
        """The stack's Output: the last layer's data, aux outputs stacked on a layer axis."""
        return _aggregate(layer_outputs)

    @accepts_empty_cache_kwargs(input_name="data", dim_field="input_dim")
    def init_states(
        self, *, time_step: Optional[Tensor] = None, data=None, **layer_kwargs
    ) -> tuple[list[NestedTensor], Optional[BaseTransformerLayer.Output]]:
        """Per-layer caches (a list): empty if time_step is None, else prefilled from `data`."""
        states, outputs = [], []
        for layer in self._layers:
            state, out = layer.init_states(time_step=time_step, data=data, **layer_kwargs)
            states.append(state)
            if out is not None:
                outputs.append(out)
                data = out.data
        return states, (_aggregate(outputs) if outputs else None)

    def extend_step(
        self, cached_states: list[NestedTensor], data: Tensor, **layer_kwargs
    ) -> tuple[list[NestedTensor], BaseTransformerLayer.Output]:
        """One decoding step through every layer."""
        states, outputs = [], []
        for layer, layer_state in zip(self._layers, cached_states):
            state, out = layer.extend_step(layer_state, data, **layer_kwargs)
            states.append(state)
            outputs.append(out)
            data = out.data
        return states, _aggregate(outputs)


class _TransformerRepeat(Repeat):
    """A Repeat of a transformer layer: carries `data` across layers."""

    @config_class
    class Config(Repeat.Config):
        """Configures _TransformerRepeat."""

        # If True, the layer's StochasticDepth rates are scaled by (i + 1) / num_layers in
        # iteration i (set by RepeatedTransformerLayer for peak_stochastic_depth_rate).
        linear_stochastic_depth: Optional[bool] = None

    def _scan(self, method: str, data, xs, layer_kwargs):
        num_layers = self.config.num_layers
        scaled = bool(self.config.linear_stochastic_depth)
        if scaled:
            xs = dict(xs=xs, order=jnp.arange(1, num_layers + 1, dtype=jnp.float32))

        def layer_fn(carry, x_i):
            if not scaled:
                return step_fn(carry, x_i)
            with stochastic_depth_rate_scale(x_i["order"] / num_layers):
                return step_fn(carry, x_i["xs"])

        def step_fn(carry, x_i):
            if method == "forward_per_layer":
                state, out = None, self.layer(carry, **layer_kwargs, **x_i)
            elif method == "forward":
                state, out = None, self.layer(carry, **layer_kwargs)
            elif method == "init_states":
                state, out = self.layer.init_states(time_step=x_i, data=carry, **layer_kwargs)
            else:
                state, out = self.layer.extend_step(x_i, carry, **layer_kwargs)
            ys = {k: v for k, v in out._asdict().items() if k != "data" and v is not None}
            if state is not None:
                ys["cached_states"] = state
            return out.data, ys

        result = self._run(layer_fn, carry=data, xs=xs)
        ys = dict(result.ys)
        states = ys.pop("cached_states", None)
        return states, BaseTransformerLayer.Output(data=result.carry, **ys)

    def forward(self, data: Tensor, **layer_kwargs) -> BaseTransformerLayer.Output:
        """Runs the repeated layer over `data`; aux outputs get a leading layer axis."""
        return self._scan("forward", data, None, layer_kwargs)[1]

    def forward_with_per_layer_kwargs(
        self, data: Tensor, per_layer: dict[str, Tensor], **layer_kwargs
    ) -> BaseTransformerLayer.Output:
        """`forward`, with layer i also receiving {name: value[i]} of `per_layer`."""
        return self._scan("forward_per_layer", data, per_layer, layer_kwargs)[1]

    def init_states(
        self, *, time_step: Optional[Tensor], data, **layer_kwargs
    ) -> tuple[NestedTensor, Optional[BaseTransformerLayer.Output]]:
        """Caches stacked on a leading layer axis: empty if time_step is None, else prefilled."""
        num_layers = self.config.num_layers
        if time_step is None:
            with child_context("layer", module=self.layer):
                state, _ = self.layer.init_states(time_step=None, data=data, **layer_kwargs)
            stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_layers, *x.shape)), state)
            return stacked, None
        xs = jnp.broadcast_to(time_step, (num_layers, *time_step.shape))
        return self._scan("init_states", data, xs, layer_kwargs)

    def extend_step(
        self, cached_states: NestedTensor, data: Tensor, **layer_kwargs
    ) -> tuple[NestedTensor, BaseTransformerLayer.Output]:
        """One decoding step; `cached_states` leaves have a leading layer axis."""
        return self._scan("extend_step", data, cached_states, layer_kwargs)


class RepeatedTransformerLayer(BaseStackedTransformerLayer):
    """A stack whose layers share one stacked parameter tree and run in a `jax.lax.scan`.

    The compiled program size does not grow with the number of layers.
    """

    @config_class
    class Config(BaseStackedTransformerLayer.Config):
        """Configures RepeatedTransformerLayer."""

        # The repeat layer config (layer and num_layers are set from this config).
        repeat: InstantiableConfig = _TransformerRepeat.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        repeat_cfg = cfg.repeat.clone(
            layer=cfg.layer.clone(input_dim=cfg.input_dim), num_layers=cfg.num_layers
        )
        if cfg.peak_stochastic_depth_rate:
            # The shared layer drops at the peak rate, scaled per iteration by (i + 1) / N.
            repeat_cfg.layer = self._with_stochastic_depth_rate(
                repeat_cfg.layer, cfg.peak_stochastic_depth_rate, index=""
            )
            repeat_cfg.linear_stochastic_depth = True
        self._add_child("repeat", repeat_cfg)
        if self._extra_carry():
            raise NotImplementedError(
                f"{self.path()}.carry={tuple(self.config.carry)!r}: a RepeatedTransformerLayer "
                "carries only 'data'; use StackedTransformerLayer to carry other fields."
            )

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[NestedTensor] = None
    ) -> NestedTensor:
        """Passes `prng_key` to `repeat` unsplit (as AXLearn), so the draws equal a stacked one's.

        Args:
            prng_key: The key.
            prebuilt: See `BaseLayer.initialize_parameters_recursively`.

        Returns:
            {"repeat": {"layer": params stacked on a leading layer axis}}.
        """
        return dict(
            repeat=self.repeat.initialize_parameters_recursively(
                prng_key, prebuilt=get_or_none(prebuilt, "repeat")
            )
        )

    def forward(self, data: Tensor, **layer_kwargs) -> BaseTransformerLayer.Output:
        """See `_TransformerRepeat.forward`; `scan_kwargs` arguments are scanned per layer."""
        per_layer, layer_kwargs = self._split_scan_kwargs(layer_kwargs)
        if per_layer:
            return self.repeat.forward_with_per_layer_kwargs(data, per_layer, **layer_kwargs)
        return self.repeat(data, **layer_kwargs)

    @accepts_empty_cache_kwargs(input_name="data", dim_field="input_dim")
    def init_states(self, *, time_step: Optional[Tensor] = None, data=None, **layer_kwargs):
        """Returns ({"repeat": VDict of caches stacked on a leading layer axis}, output or None).

        The VDict lets `utils.vectorized_tree_map` (e.g. in `decoding`) see per-layer caches.
        """
        states, output = self.repeat.init_states(time_step=time_step, data=data, **layer_kwargs)
        return dict(repeat=_to_vdict(states)), output

    def extend_step(self, cached_states: NestedTensor, data: Tensor, **layer_kwargs):
        """One decoding step; returns ({"repeat": caches}, output)."""
        states, output = self.repeat.extend_step(
            _from_vdict(cached_states["repeat"]), data, **layer_kwargs
        )
        return dict(repeat=_to_vdict(states)), output


def _to_vdict(states):
    """The repeated layer's caches as VDicts: the dict, or each dict of a nested stack's list."""
    if isinstance(states, (list, tuple)):
        return [VDict(s) for s in states]
    return VDict(states)


def _from_vdict(states):
    """The inverse of `_to_vdict` (plain dicts, or a list of them)."""
    if isinstance(states, (list, tuple)):
        return [dict(s) for s in states]
    return dict(states)


def _save_and_offload_only_these_names_regex(
    *,
    names_which_can_be_saved: SavePattern,
    names_which_can_be_offloaded: SavePattern,
    offload_src: str,
    offload_dst: str,
) -> Any:
    """Remat policy saving tensors whose remat names match a regex (others are recomputed).

    Names are those given by `BaseLayer._remat_name`, e.g. "GroupedQueryAttention.q_proj",
    "GroupedQueryAttention.context", "TransformerFeedForwardLayer.linear1_0".

    Args:
        names_which_can_be_saved: Regex (full match) of names to keep for the backward pass.
        names_which_can_be_offloaded: Regex of names to offload to `offload_dst` memory, or None.
        offload_src: Memory kind offloaded from, e.g. "device".
        offload_dst: Memory kind offloaded to, e.g. "pinned_host".

    Returns:
        A `jax.checkpoint` policy.
    """
    return _save_offload(
        names_which_can_be_saved=names_which_can_be_saved,
        names_which_can_be_offloaded=names_which_can_be_offloaded,
        offload_src=offload_src,
        offload_dst=offload_dst,
    )


def build_remat_spec(
    stack_cfg: InstantiableConfig,
    save_pattern: SavePattern = ".*([qkvo]_proj|context)",
    offload_pattern: SavePattern = None,
    offload_dst: str = "pinned_host",
) -> RematSpec:
    """A RematSpec for the layers of a transformer stack: save attention projections/context.

    Args:
        stack_cfg: The stack config (prevent_cse is True only for StackedTransformerLayer,
            since inside a scan CSE cannot undo remat).
        save_pattern: Regex of remat names to save.
        offload_pattern: Regex of remat names to offload.
        offload_dst: Offload destination memory kind.

    Returns:
        The RematSpec (set it on `stack_cfg.layer.remat_spec`).
    """
    policy = config_for_function(_save_and_offload_only_these_names_regex).set(
        names_which_can_be_saved=save_pattern,
        names_which_can_be_offloaded=offload_pattern,
        offload_src="device",
        offload_dst=offload_dst,
    )
    return RematSpec(prevent_cse=stack_cfg.klass is StackedTransformerLayer, policy=policy)


# Remat choices for the layers of a transformer stack, by name: name -> (regex of the remat names
# saved for the backward pass, or None; whether the layer is rematerialized at all).
REMAT_CHOICES: dict[str, tuple[Optional[str], bool]] = {
    # No remat: every activation the backward pass needs is kept (fastest, most memory).
    "none": (None, False),
    # Keep the outputs of the layer's matmuls (q/k/v/o projections, attention context, both
    # feed-forward projections); recompute norms, activations and attention probabilities.
    "save_matmuls": (r".*([qkvo]_proj|context|linear1_[01]|linear2)", True),
    # Keep only the attention context; recompute everything else (projections included).
    "save_context": (r".*context", True),
    # Keep nothing but the layer's input: the whole layer is recomputed (least memory).
    "full": (None, True),
}


def remat_spec_by_name(
    name: str, *, stack_cfg: Optional[InstantiableConfig] = None, config_path: str = "remat"
) -> Optional[RematSpec]:
    """The RematSpec of a named remat choice for the layers of a transformer stack.

    Args:
        name: A key of `REMAT_CHOICES`: "none", "save_matmuls", "save_context" or "full".
        stack_cfg: The stack's config (prevent_cse is True only for StackedTransformerLayer,
            since inside a scan CSE cannot undo remat); None: a RepeatedTransformerLayer.
        config_path: The setting named by errors.

    Returns:
        None for "none" (no remat), else the RematSpec to set on `stack_cfg.layer.remat_spec`.

    Raises:
        ValueError: If `name` is unknown; the message lists the choices.
    """
    if name not in REMAT_CHOICES:
        raise ValueError(
            f"{config_path}={name!r} is not a remat choice; choose one of "
            f"{', '.join(REMAT_CHOICES)}."
        )
    save_pattern, remat = REMAT_CHOICES[name]
    if not remat:
        return None
    stacked = stack_cfg is not None and stack_cfg.klass is StackedTransformerLayer
    if save_pattern is None:
        return RematSpec(prevent_cse=stacked, policy=None)
    spec = build_remat_spec(stack_cfg or RepeatedTransformerLayer.default_config(), save_pattern)
    return RematSpec(prevent_cse=stacked, policy=spec.policy)


def remat_name_of(remat_spec: Optional[RematSpec]) -> str:
    """The `REMAT_CHOICES` name a RematSpec was made from, or "custom" (None: "none").

    Args:
        remat_spec: A layer's `remat_spec`.

    Returns:
        "none", "save_matmuls", "save_context", "full" or "custom".
    """
    if remat_spec is None:
        return "none"
    policy = remat_spec.policy
    if policy is None:
        return "full"
    saved = getattr(policy, "names_which_can_be_saved", None)
    offloaded = getattr(policy, "names_which_can_be_offloaded", None)
    if offloaded is None:
        for name, (pattern, remat) in REMAT_CHOICES.items():
            if remat and pattern is not None and pattern == saved:
                return name
    return "custom"


def remat_choices_of(cfg: Any, prefix: str = "") -> dict[str, str]:
    """The remat choice name (`remat_name_of`) of every transformer layer config under `cfg`.

    Args:
        cfg: A config tree (e.g. a model config).
        prefix: The dotted path of `cfg`.

    Returns:
        {dotted path of a TransformerLayer config: "none" | "save_matmuls" | ... | "custom"}.
    """
    found: dict[str, str] = {}
    if isinstance(cfg, dict):
        items = cfg.items()
    elif hasattr(cfg, "klass") and hasattr(cfg, "items"):
        if isinstance(cfg.klass, type) and issubclass(cfg.klass, BaseTransformerLayer):
            if "remat_spec" in cfg and "layer" not in cfg:  # A layer, not a stack of them.
                found[prefix] = remat_name_of(cfg.remat_spec)
        items = cfg.items()
    elif isinstance(cfg, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(cfg))
    else:
        return found
    for key, value in items:
        if key == "klass":
            continue
        found.update(remat_choices_of(value, f"{prefix}.{key}" if prefix else str(key)))
    return found
