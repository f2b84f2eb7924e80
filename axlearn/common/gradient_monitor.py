"""Per-token activation-gradient monitoring and clipping between layers.

`GradientMonitorAndClipLayer` is an identity in the forward pass whose backward pass (a
`jax.custom_vjp`) sees the activation gradient dL/dy of the layer output it wraps. A `clip_fn`
maps that gradient to (a possibly modified gradient, statistics): e.g. `top_k_clip_fn` zeroes
the k tokens with the largest gradient norms, which changes the parameter gradients of every
layer below (dL/dθ = dL/dy · dy/dθ) without changing the forward pass.

The statistics cannot be written as summaries from the backward pass (no invocation context
there), so they travel as the "gradient" of a parameter, `stats`: the backward pass returns them
as the cotangent of `stats`, a learner built by `gradient_monitoring_learner_cfg_modifier`
replaces the parameter's value by that "gradient" (`optimizers.replace_with_updates`), and the
next forward pass writes the stored statistics as summaries (`stats_log_fn`). The summaries of
step t thus describe the gradients of step t - 1.

    cfg = convert_to_monitored_layer_config(TransformerFeedForwardLayer.default_config())
    learner_cfg = gradient_monitoring_learner_cfg_modifier(learner_cfg)

`create_monitored_layer_class(Base)` is `Base` with a `gradient_monitor` child applied to its
output; only the leaves of the output at `supported_paths` (keystr paths: "" for a plain tensor
such as a feed-forward output, ".data" for an attention output) are clipped and measured.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Literal, Optional, Sequence, Union

import jax
import numpy as np
from jax import numpy as jnp

from axlearn.common import learner, optimizers
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import InstantiableConfig, config_class, config_for_function
from axlearn.common.module import Module
from axlearn.common.param_init import constant_initializer
from axlearn.common.summary import CallbackSummary, ImageSummary
from axlearn.common.utils import Nested, Tensor

DEFAULT_PERCENTILES = (50, 99.9, 99.99, 99.999)
# Output paths (jax.tree_util.keystr) clipped and measured: "" for FFN, ".data" for attention.
GRADIENT_CLIPPING_PATHS = ("", ".data")

ClipFn = Callable[[Tensor], tuple[Tensor, Tensor]]


def _token_norms(g: Tensor) -> Tensor:
    """The L2 norm of each token's gradient (over the last axis), in float32."""
    return jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32)), axis=-1))


def compute_grad_percentile_no_clip_fn(
    stats_arr: Sequence[float] = DEFAULT_PERCENTILES,
) -> ClipFn:
    """Returns a clip_fn that leaves gradients unchanged and measures per-token norm percentiles.

    Args:
        stats_arr: The percentiles (0..100) of the per-token gradient norms to report.

    Returns:
        `fn(g) -> (g, percentiles)`, with one statistic per entry of `stats_arr`.
    """
    percentiles = tuple(float(p) for p in stats_arr)

    def fn(g: Tensor) -> tuple[Tensor, Tensor]:
        return g, jnp.percentile(_token_norms(g), jnp.asarray(percentiles))

    return fn


def _top_k_clipping(
    g: Tensor, k: int = 4, method: Literal["approx", "topk", "sort"] = "approx"
) -> tuple[Tensor, Tensor, Tensor]:
    """Zeroes the gradients of the k tokens with the largest norms.

    Args:
        g: The gradient, [..., dim] (every axis but the last indexes tokens).
        k: The number of tokens to zero.
        method: "approx" (`jax.lax.approx_max_k`; exactly the k found tokens are zeroed),
            "topk" (`jax.lax.top_k`) or "sort" (`argsort`); with the last two every token whose
            norm is >= the k-th largest is zeroed (ties may zero more than k).

    Returns:
        (the clipped gradient, the k largest norms in decreasing order, their flat token indices).

    Raises:
        ValueError: If k is not in [1, number of tokens) or method is unknown.
    """
    norms = _token_norms(g)
    flat = norms.reshape(-1)
    if not 1 <= k < flat.shape[0]:
        raise ValueError(f"top-k clipping needs 1 <= k < token count ({flat.shape[0]}), got k={k}")
    if method == "approx":
        top, ids = jax.lax.approx_max_k(flat, k, recall_target=0.99)
        keep = jnp.ones(flat.shape, bool).at[ids].set(False).reshape(norms.shape)
    elif method in ("topk", "sort"):
        if method == "topk":
            top, ids = jax.lax.top_k(flat, k)
        else:
            ids = jnp.argsort(-flat)[:k]
            top = flat[ids]
        keep = norms < top[k - 1]
    else:
        raise ValueError(f"Unknown top-k method {method!r} (approx, topk or sort)")
    return jnp.where(keep[..., None], g, jnp.zeros_like(g)), top, ids


def encode_int32_to_bf16_bytes(x: Tensor) -> Tensor:
    """Encodes int32 values as their 4 bytes, each exact in bfloat16 (0..255).

    Args:
        x: An int array of shape [k].

    Returns:
        A bfloat16 array [4, k]: row i holds byte i (least significant first) of the two's
        complement bits, so any int32 (e.g. a token position) survives a bfloat16 parameter.
    """
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.int32), jnp.uint32)
    shifts = jnp.arange(4, dtype=jnp.uint32)[:, None] * 8
    return ((bits[None, :] >> shifts) & 0xFF).astype(jnp.bfloat16)


def top_k_clip_fn(
    k: int = 4, method: Literal["approx", "topk", "sort"] = "approx", log_pos: bool = False
) -> ClipFn:
    """Returns a clip_fn zeroing the gradients of the k tokens with the largest gradient norms.

    Args:
        k: The number of tokens zeroed per call.
        method: How to find them (see `_top_k_clipping`).
        log_pos: Also report the flat positions of those tokens.

    Returns:
        `fn(g) -> (clipped g, stats)`: stats is the k norms [k], or with `log_pos` a [5, k]
        array: the norms, then the positions' 4 bytes (`encode_int32_to_bf16_bytes`).
    """

    def fn(g: Tensor) -> tuple[Tensor, Tensor]:
        clipped, top, ids = _top_k_clipping(g, k, method)
        if not log_pos:
            return clipped, top
        positions = encode_int32_to_bf16_bytes(ids).astype(top.dtype)
        return clipped, jnp.concatenate([top[None, :], positions], axis=0)

    return fn


def gradient_clipping_impl(
    g: Union[Tensor, Nested[Tensor]],
    *,
    clip_fn: ClipFn,
    prev_stats: Optional[Tensor] = None,
    supported_paths: Sequence[str] = GRADIENT_CLIPPING_PATHS,
) -> tuple[Union[Tensor, Nested[Tensor]], Tensor]:
    """Applies `clip_fn` to the leaf of `g` at one of `supported_paths`.

    Args:
        g: The gradient of a layer's output (a tensor or a tree, e.g. an attention Output).
        clip_fn: Maps a tensor to (its clipped version, statistics).
        prev_stats: The previous statistics (unused by the built-in clip functions).
        supported_paths: `jax.tree_util.keystr` paths of the leaves to clip ("" is the whole
            output, ".data" an attribute, "['k']" a key); other leaves pass unchanged.

    Returns:
        (the gradient with that leaf clipped, its statistics).

    Raises:
        ValueError: If not exactly one leaf is at a supported path, or it is not an array.
    """
    del prev_stats
    leaves, treedef = jax.tree_util.tree_flatten_with_path(g)
    wanted = set(supported_paths)
    out, stats = [], []
    for path, leaf in leaves:
        key = jax.tree_util.keystr(path)
        if key not in wanted:
            out.append(leaf)
            continue
        if not hasattr(leaf, "shape"):
            raise ValueError(f"The gradient at {key!r} is not an array: {type(leaf)}")
        clipped, leaf_stats = clip_fn(leaf)
        out.append(clipped)
        stats.append(leaf_stats)
    found = [jax.tree_util.keystr(p) for p, _ in leaves if jax.tree_util.keystr(p) in wanted]
    if len(stats) != 1:
        raise ValueError(
            f"Exactly one output leaf must be at supported_paths={tuple(supported_paths)}; "
            f"found {found} among {[jax.tree_util.keystr(p) for p, _ in leaves]}"
        )
    return jax.tree_util.tree_unflatten(treedef, out), stats[0]


def _default_top_norms_from_stats(stats: Tensor) -> Tensor:
    """The norms row of `stats` ([k], or row 0 of [5, k])."""
    return stats[0] if stats.ndim > 1 else stats


def _default_token_pos_from_stats(stats: Tensor) -> Tensor:
    """The position-byte rows of `stats` (rows 1.. of [5, k]; empty for [k])."""
    return stats[1:] if stats.ndim > 1 else jnp.zeros((0,), stats.dtype)


def _bytes_text(rows: Any) -> str:
    """The position bytes as text, one line per byte row, e.g. "255 127 0 42"."""
    return "\n".join(" ".join(str(int(v)) for v in row) for row in np.asarray(rows))


def default_stats_logging_fn(
    log_pos: bool = False,
    top_norms_fn: Callable[[Tensor], Tensor] = _default_top_norms_from_stats,
    token_pos_fn: Callable[[Tensor], Tensor] = _default_token_pos_from_stats,
) -> Callable[[Any, Tensor], None]:
    """Returns the default `stats_log_fn(layer, stats)` of `GradientMonitorAndClipLayer`.

    Without `log_pos` it adds the norms as the summary "top_norms_hist" (a histogram). With
    `log_pos` it adds "max_norm", "clip_threshold" (the largest and the k-th norm), "top_norms"
    (the norms scaled to [0, 1] between those two, as a 1 x k image, so raw values survive) and
    "clipped_token_pos" (the position bytes as text).

    Args:
        log_pos: Whether `stats` carries token positions (keep in sync with the clip_fn's).
        top_norms_fn: Extracts the norms from `stats`.
        token_pos_fn: Extracts the position bytes from `stats` (read only with `log_pos`).

    Returns:
        The function; it raises ValueError when `log_pos` is set but `stats` has no positions.
    """

    def fn(layer: Any, stats: Tensor) -> None:
        norms = top_norms_fn(stats)
        if not log_pos:
            layer.add_summary("top_norms_hist", norms)
            return
        positions = token_pos_fn(stats)
        if positions.size == 0:
            raise ValueError(
                "default_stats_logging_fn: log_pos=True but stats hold no token positions; "
                "set the same log_pos on clip_fn and stats_log_fn, and stats_shape=(5, k)."
            )
        layer.add_summary("clipped_token_pos", CallbackSummary(_bytes_text, positions))
        max_norm, threshold = norms[0], norms[-1]  # Decreasing order.
        span = max_norm - threshold
        scaled = jnp.where(span > 0, (norms - threshold) / jnp.where(span > 0, span, 1), 0.0)
        layer.add_summary("max_norm", max_norm)
        layer.add_summary("clip_threshold", threshold)
        layer.add_summary("top_norms", ImageSummary(scaled[None, None, :, None]))

    return fn


class GradientMonitorAndClipLayer(BaseLayer):
    """Identity forward; its backward clips and measures the gradient of the wrapped output.

    Usage, inside a layer: `return self.gradient_monitor(output)` (see
    `create_monitored_layer_class`). Its parameter `stats` holds the statistics of the previous
    backward pass (replaced by the learner, see the module docstring).
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures GradientMonitorAndClipLayer."""

        # keystr paths of the output leaves to clip and measure ("" FFN, ".data" attention).
        supported_paths: Sequence[str] = GRADIENT_CLIPPING_PATHS
        # The shape of the statistics clip_fn returns (the `stats` parameter's shape).
        stats_shape: tuple = (4,)
        # A config of a function returning clip_fn(g) -> (clipped g, stats).
        clip_fn: InstantiableConfig = config_for_function(top_k_clip_fn)
        # A config of a function returning stats_log_fn(layer, stats) (adds summaries).
        stats_log_fn: InstantiableConfig = config_for_function(default_stats_logging_fn)

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        log_cfg = cfg.stats_log_fn
        # The logging function reads token positions exactly when clip_fn writes them.
        if "log_pos" in cfg.clip_fn and "log_pos" in log_cfg:
            log_cfg = log_cfg.clone(log_pos=cfg.clip_fn.log_pos)
        self._clip_fn = cfg.clip_fn.instantiate()
        self._stats_log_fn = log_cfg.instantiate()
        self._clip_gradient = self._make_clip_gradient()

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        return dict(
            stats=ParameterSpec(
                shape=tuple(cfg.stats_shape),
                mesh_axes=cfg.param_partition_spec,
                initializer=constant_initializer(0.0),
                weight_decay_scale=0.0,
            )
        )

    def _make_clip_gradient(self) -> Callable[[Any, Tensor], Any]:
        """Returns `f(x, prev_stats) = x` whose backward gives (clipped dL/dx, new stats)."""
        cfg = self.config

        @jax.custom_vjp
        def clip_gradient(x, prev_stats):
            del prev_stats
            return x

        def fwd(x, prev_stats):
            return x, prev_stats

        def bwd(prev_stats, g):
            # Looked up at trace time (not bound here), so that tests can replace it.
            clipped, stats = gradient_clipping_impl(
                g,
                clip_fn=self._clip_fn,
                prev_stats=prev_stats,
                supported_paths=cfg.supported_paths,
            )
            if tuple(stats.shape) != tuple(prev_stats.shape):
                raise ValueError(
                    f"{self.path()}: clip_fn returned stats of shape {tuple(stats.shape)}, but "
                    f"stats_shape is {tuple(prev_stats.shape)}; set {self.path()}.stats_shape"
                )
            return clipped, stats.astype(prev_stats.dtype)

        clip_gradient.defvjp(fwd, bwd)
        return clip_gradient

    def forward(self, x: Any) -> Any:
        """Returns `x`; summarizes the previous step's statistics.

        Args:
            x: The wrapped layer's output (a tensor or a tree).

        Returns:
            `x` (its gradient is clipped in the backward pass).
        """
        stats = self.parameters["stats"]
        self._stats_log_fn(self, stats)
        return self._clip_gradient(x, stats)


@functools.cache
def create_monitored_layer_class(base_class: type[BaseLayer]) -> type[BaseLayer]:
    """Returns `base_class` with its output passed through a `gradient_monitor` child.

    The class is made once per base class (the same class for repeated calls). Setting the
    config's `gradient_monitor` to None gives the base layer's behaviour.

    Args:
        base_class: A layer class.

    Returns:
        A subclass named "Monitored<base class name>".
    """

    class MonitoredLayer(base_class):
        """`base_class` whose output is wrapped by a GradientMonitorAndClipLayer."""

        @config_class
        class Config(base_class.Config):
            """Configures the monitored layer."""

            # The monitor of the output's gradient (None: no monitoring).
            gradient_monitor: Optional[GradientMonitorAndClipLayer.Config] = (
                GradientMonitorAndClipLayer.default_config()
            )

        def __init__(self, cfg, *, parent: Optional[Module] = None):
            super().__init__(cfg, parent=parent)
            if self.config.gradient_monitor is not None:
                self._add_child("gradient_monitor", self.config.gradient_monitor)

        def forward(self, *args, **kwargs):
            output = super().forward(*args, **kwargs)
            if self.config.gradient_monitor is None:
                return output
            return self.gradient_monitor(output)

    name = f"Monitored{base_class.__name__}"
    MonitoredLayer.__name__ = name
    MonitoredLayer.__qualname__ = name
    return MonitoredLayer


def convert_to_monitored_layer_config(
    cfg: InstantiableConfig,
    gradient_monitor_cfg: Optional[GradientMonitorAndClipLayer.Config] = None,
) -> InstantiableConfig:
    """Returns a config of `create_monitored_layer_class(cfg.klass)` with `cfg`'s field values.

    Args:
        cfg: A layer config (`cfg` itself is unchanged; its values are copied).
        gradient_monitor_cfg: The monitor's config; None: the default one.

    Returns:
        The monitored layer's config.
    """
    source = cfg.clone()
    monitored_cfg = create_monitored_layer_class(source.klass).default_config()
    for name, value in source.items():
        if name != "klass":
            setattr(monitored_cfg, name, value)
    if gradient_monitor_cfg is None:
        gradient_monitor_cfg = GradientMonitorAndClipLayer.default_config()
    return monitored_cfg.set(gradient_monitor=gradient_monitor_cfg)


def gradient_monitoring_learner_cfg_modifier(
    learner_cfg: learner.Learner.Config,
) -> learner.CompositeLearner.Config:
    """Returns a learner for a model with gradient monitors: `learner_cfg` for all parameters
    but the monitors' `stats`, whose values are replaced by their "gradients".

    Args:
        learner_cfg: The model's learner (its EMA moves to the composite learner; this config
            is changed: its `ema.decay` is set to None).

    Returns:
        A CompositeLearner config with sub-learners "inner" and "gradient_monitor_stats".
    """
    stats_learner = learner.Learner.default_config().set(
        optimizer=config_for_function(optimizers.replace_with_updates)
    )
    ema_decay = learner_cfg.ema.decay
    learner_cfg.ema.decay = None
    cfg = learner.CompositeLearner.default_config().set(
        learners={"inner": learner_cfg, "gradient_monitor_stats": stats_learner},
        rules=[(".*gradient_monitor/stats", "gradient_monitor_stats"), (".*", "inner")],
    )
    cfg.ema.decay = ema_decay
    return cfg
