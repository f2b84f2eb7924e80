"""FlashAttention with AXLearn's config (`axlearn.common.flash_attention.layer`).

The attention core is `jax.nn.dot_product_attention`: its XLA path on CPU (numerically the plain
`GroupedQueryAttention` path), cuDNN's fused kernel on GPU for 16-bit inputs (see
`axlearn.common.attention.FlashAttention`). On top of that, this layer constrains the sharding of
the attention inputs and outputs by dim-string keys:

- `mha_dim_to_partition_spec`: "btnh" (queries [batch, target, heads, head_dim]), "bsnh"
  (keys/values) and "bnts" (biases [batch, heads, target, source]) inside the attention;
- `output_dim_to_partition_spec`: "btnh" for the context.

`backend_overrides` holds AXLearn's kernel options (the keys of `KNOWN_BACKEND_OVERRIDES`: the TPU
Pallas splash kernel's `splash_use_fused_bwd_kernel` and `splash_block_*` tile sizes). They are
checked (an unknown key or a bad value fails at instantiation, naming the layer) and kept for
config compatibility: our cores (XLA on CPU/TPU, cuDNN on GPU via `jax.nn.dot_product_attention`)
have no splash kernel and pick their own tiling, so no key changes the computed values. The
layer-wide output constraint is `MultiheadAttention.Config.o_partition_spec`.

`default_mha_dim_to_partition_spec(mesh_axis_names)` and
`default_output_dim_to_partition_spec(mesh_axis_names)` give AXLearn's defaults (heads over
"model", batch over the other axes). `tpu_block_size` / `gpu_block_size` are kept for config
compatibility (the kernel picks its own tiling).

`FlashBlockSizeModifier` (a trainer config modifier, used by AXLearn's mesh rules) sets the block
sizes of every FlashAttention layer in a trainer config.
"""

from collections.abc import Sequence
from typing import Any, Optional

from jax.sharding import PartitionSpec

from axlearn.common.attention import FlashAttention as _FusedAttention
from axlearn.common.attention_bias import add_biases, make_segment_mask
from axlearn.common.config import ConfigBase, ConfigModifier, config_class
from axlearn.common.flash_attention.context_parallel import (
    ContextParallelConfig,
    check_context_parallel_config,
    context_parallel_attention,
    context_parallel_degree,
)
from axlearn.common.module import Module
from axlearn.common.utils import Tensor, with_sharding_constraint

# AXLearn's backend-override keys and the check of their values. The splash keys configure
# AXLearn's TPU Pallas splash-attention kernel: whether its backward pass runs as one fused kernel,
# and its forward (q, kv, kv_compute), dK/dV (*_dkv) and dQ (*_dq) tile sizes.
_SPLASH_BLOCK_KEYS = (
    "splash_block_q",
    "splash_block_kv",
    "splash_block_kv_compute",
    "splash_block_q_dkv",
    "splash_block_kv_dkv",
    "splash_block_kv_dkv_compute",
    "splash_block_q_dq",
    "splash_block_kv_dq",
)
# "all_gather_attention" (AXLearn's TPUSplashAttentionWithAllGather switch): context parallelism
# in the all-gather form over the "seq" mesh axis (see `context_parallel`).
_BOOL_KEYS = ("splash_use_fused_bwd_kernel", "all_gather_attention")
KNOWN_BACKEND_OVERRIDES: tuple[str, ...] = (
    "splash_use_fused_bwd_kernel",
    *_SPLASH_BLOCK_KEYS,
    "all_gather_attention",
)


def check_backend_overrides(overrides: Optional[dict[str, Any]], *, path: str) -> None:
    """Raises a one-line ValueError for an unknown key or a bad value of `backend_overrides`.

    Args:
        overrides: The `backend_overrides` dict (None: nothing to check).
        path: The config path of the field, for the error message.

    Raises:
        ValueError: On an unknown key, a non-bool `splash_use_fused_bwd_kernel` or
            `all_gather_attention`, or a block size
            that is not a positive multiple of 128.
    """
    for key, value in (overrides or {}).items():
        if key not in KNOWN_BACKEND_OVERRIDES:
            raise ValueError(
                f"{path}: unknown key {key!r}; known keys: {', '.join(KNOWN_BACKEND_OVERRIDES)}"
            )
        if key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise ValueError(f"{path}[{key!r}]={value!r} must be True or False")
        elif isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % 128:
            raise ValueError(f"{path}[{key!r}]={value!r} must be a positive multiple of 128")


def _constrain(x: Optional[Tensor], spec: Optional[PartitionSpec]) -> Optional[Tensor]:
    if x is None or spec is None or x.ndim != len(spec):
        return x
    return with_sharding_constraint(x, spec)


class FlashAttention(_FusedAttention):
    """Grouped-query attention with a fused attention core and explicit input/output shardings."""

    @config_class
    class Config(_FusedAttention.Config):
        """Configures FlashAttention."""

        # Partition specs of q ("btnh"), k/v ("bsnh") and biases ("bnts") in the attention.
        mha_dim_to_partition_spec: dict[str, Optional[PartitionSpec]] = {}
        # Partition specs of the outputs: the context ("btnh").
        output_dim_to_partition_spec: dict[str, Optional[PartitionSpec]] = {}
        # Kept for AXLearn config compatibility (the fused kernel picks its own tiling).
        tpu_block_size: int = 512
        # Kept for AXLearn config compatibility; None: the kernel's choice.
        gpu_block_size: Optional[int] = None
        # AXLearn's kernel options {key: value}, keys in KNOWN_BACKEND_OVERRIDES (checked, no
        # effect on our XLA/cuDNN cores); None: none.
        backend_overrides: Optional[dict[str, Any]] = None
        # Splits self-attention over a mesh axis (ring or all-gather form, see
        # `axlearn.common.flash_attention.context_parallel`); None: off (unless
        # backend_overrides["all_gather_attention"]).
        context_parallel: Optional[ContextParallelConfig] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        check_backend_overrides(cfg.backend_overrides, path=f"{self.path()}.backend_overrides")
        self._cp = cfg.context_parallel
        self._cp_path = f"{self.path()}.context_parallel"
        if self._cp is None and (cfg.backend_overrides or {}).get("all_gather_attention"):
            # AXLearn's switch: the all-gather form over "seq" (skipped where "seq" is 1).
            self._cp = ContextParallelConfig(mesh_axis="seq", form="all_gather")
            self._cp_path = f"{self.path()}.backend_overrides['all_gather_attention']"
        if self._cp is not None:
            check_context_parallel_config(self._cp, path=self._cp_path)
            self._check_context_parallel_support()

    def _check_context_parallel_support(self):
        """Raises a one-line ValueError for a layer setting the context-parallel path lacks."""
        cfg = self.config
        problems = []
        if cfg.logit_sink:
            problems.append(("logit_sink", cfg.logit_sink, "unset logit_sink"))
        if cfg.implementation not in (None, "xla"):
            problems.append(
                ("implementation", cfg.implementation, "set implementation=None or 'xla'")
            )
        for field, value, fix in problems:
            raise ValueError(
                f"{self.path()}.{field}={value!r} cannot run with {self._cp_path} set (the "
                f"context-parallel attention is computed by XLA); {fix} or unset "
                f"context_parallel."
            )

    def _segment_ids_in_mask(self) -> bool:
        return self._cp is not None

    def _compute_attention(self, *, q_proj, k_proj, v_proj, biases, mask, need_probs):
        cfg = self.config
        specs = cfg.mha_dim_to_partition_spec
        q_proj = _constrain(q_proj, specs.get("btnh"))
        k_proj = _constrain(k_proj, specs.get("bsnh"))
        v_proj = _constrain(v_proj, specs.get("bsnh"))
        biases = _constrain(biases, specs.get("bnts"))
        if self._use_context_parallel(q_proj, k_proj, mask):
            dropout_rate = getattr(cfg.dropout, "rate", None) or 0.0
            if need_probs or biases is not None or (self.is_training and dropout_rate > 0):
                what = (
                    "attention probabilities were requested"
                    if need_probs
                    else "attention_logit_biases were passed (e.g. a decoder attention_mask)"
                    if biases is not None
                    else f"dropout rate {dropout_rate} is active"
                )
                raise ValueError(
                    f"{self.path()} ({self._cp_path}): {what}, which context parallelism cannot "
                    "do; mask with "
                    "the layer's causal/mask fields and segment ids, without probs or dropout, "
                    "or unset context_parallel."
                )
            context = context_parallel_attention(
                q_proj,
                k_proj,
                v_proj,
                segment_ids=mask.segment_ids,
                mask_fn=mask.mask_fn,
                cfg=self._cp,
                path=self._cp_path,
                logit_cap=cfg.atten_logit_cap,
            )
            return _constrain(context, cfg.output_dim_to_partition_spec.get("btnh")), None
        if mask.segment_ids is not None:
            # Not split (one device, decoding or cross-attention): segment ids as a bias.
            segments = mask.segment_ids
            biases = add_biases(
                biases, make_segment_mask(source_segments=segments, target_segments=segments)
            )
            mask = mask._replace(segment_ids=None)
        context, probs = super()._compute_attention(
            q_proj=q_proj,
            k_proj=k_proj,
            v_proj=v_proj,
            biases=biases,
            mask=mask,
            need_probs=need_probs,
        )
        return _constrain(context, cfg.output_dim_to_partition_spec.get("btnh")), probs

    def _use_context_parallel(self, q_proj: Tensor, k_proj: Tensor, mask) -> bool:
        """Whether this call splits the attention: a full-sequence self-attention forward
        under a mesh whose context-parallel axis is larger than 1 (decoding never is)."""
        if self._cp is None or not mask.default_positions or q_proj.shape[1] != k_proj.shape[1]:
            return False
        degree = context_parallel_degree(self._cp.mesh_axis, path=self._cp_path)
        if self._cp.degree is not None and self._cp.degree != degree:
            # Let the attention raise its one-line mismatch error.
            return True
        return degree > 1


def default_mha_dim_to_partition_spec(
    mesh_axis_names: Sequence[str],
) -> dict[str, Optional[PartitionSpec]]:
    """Heads over "model" (if a mesh axis), batch over the other axes, inside the attention.

    Args:
        mesh_axis_names: The mesh axis names.

    Returns:
        {"btnh", "bsnh", "bnts": PartitionSpec}.
    """
    batch = tuple(a for a in mesh_axis_names if a != "model")
    tp = "model" if "model" in mesh_axis_names else None
    return {
        "btnh": PartitionSpec(batch, None, tp, None),
        "bsnh": PartitionSpec(batch, None, tp, None),
        "bnts": PartitionSpec(batch, tp, None, None),
    }


def default_output_dim_to_partition_spec(
    mesh_axis_names: Sequence[str],
) -> dict[str, Optional[PartitionSpec]]:
    """Like `default_mha_dim_to_partition_spec`, for the outputs ("btnh" context, "bnts").

    Args:
        mesh_axis_names: The mesh axis names.

    Returns:
        {"btnh", "bnts": PartitionSpec}.
    """
    batch = tuple(a for a in mesh_axis_names if a != "model")
    tp = "model" if "model" in mesh_axis_names else None
    return {
        "btnh": PartitionSpec(batch, None, tp, None),
        "bnts": PartitionSpec(batch, tp, None, None),
    }


def set_flash_block_sizes(
    cfg: ConfigBase, *, tpu_block_size: Optional[int], gpu_block_size: Optional[int]
) -> int:
    """Sets the block sizes of every FlashAttention config in the tree `cfg` (in place).

    Args:
        cfg: A config tree, e.g. a trainer config.
        tpu_block_size: The TPU block size; None keeps each layer's.
        gpu_block_size: The GPU block size; None keeps each layer's.

    Returns:
        The number of FlashAttention configs changed.
    """
    found = []

    def enter(key: str, value, children):
        if key == "mesh_rules":
            return None  # The rules' own configs are not layers of this model.
        if isinstance(value, ConfigBase) and isinstance(getattr(value, "klass", None), type):
            if issubclass(value.klass, FlashAttention):
                found.append(value)
        return children

    cfg.visit(visit_fn=lambda key, value: None, enter_fn=enter)
    for attention_cfg in found:
        if tpu_block_size is not None:
            attention_cfg.tpu_block_size = tpu_block_size
        if gpu_block_size is not None:
            attention_cfg.gpu_block_size = gpu_block_size
    return len(found)


class FlashBlockSizeModifier(ConfigModifier):
    """Sets `tpu_block_size` / `gpu_block_size` of every FlashAttention layer of a trainer config.

    A config without FlashAttention layers is left unchanged (mesh rules apply the same modifier
    to the flash and non-flash variants of an experiment).
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures FlashBlockSizeModifier."""

        # The TPU block size to set; None keeps each layer's.
        tpu_block_size: Optional[int] = 512
        # The GPU block size to set; None keeps each layer's.
        gpu_block_size: Optional[int] = 128

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Sets the block sizes (in place).

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.
        """
        set_flash_block_sizes(
            cfg,
            tpu_block_size=self.config.tpu_block_size,
            gpu_block_size=self.config.gpu_block_size,
        )
        return cfg
