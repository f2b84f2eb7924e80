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
from axlearn.common.config import ConfigBase, ConfigModifier, config_class
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
KNOWN_BACKEND_OVERRIDES: tuple[str, ...] = ("splash_use_fused_bwd_kernel", *_SPLASH_BLOCK_KEYS)


def check_backend_overrides(overrides: Optional[dict[str, Any]], *, path: str) -> None:
    """Raises a one-line ValueError for an unknown key or a bad value of `backend_overrides`.

    Args:
        overrides: The `backend_overrides` dict (None: nothing to check).
        path: The config path of the field, for the error message.

    Raises:
        ValueError: On an unknown key, a non-bool `splash_use_fused_bwd_kernel`, or a block size
            that is not a positive multiple of 128.
    """
    for key, value in (overrides or {}).items():
        if key not in KNOWN_BACKEND_OVERRIDES:
            raise ValueError(
                f"{path}: unknown key {key!r}; known keys: {', '.join(KNOWN_BACKEND_OVERRIDES)}"
            )
        if key == "splash_use_fused_bwd_kernel":
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

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        check_backend_overrides(
            self.config.backend_overrides, path=f"{self.path()}.backend_overrides"
        )

    def _compute_attention(self, *, q_proj, k_proj, v_proj, biases, mask, need_probs):
        cfg = self.config
        specs = cfg.mha_dim_to_partition_spec
        q_proj = _constrain(q_proj, specs.get("btnh"))
        k_proj = _constrain(k_proj, specs.get("bsnh"))
        v_proj = _constrain(v_proj, specs.get("bsnh"))
        biases = _constrain(biases, specs.get("bnts"))
        context, probs = super()._compute_attention(
            q_proj=q_proj,
            k_proj=k_proj,
            v_proj=v_proj,
            biases=biases,
            mask=mask,
            need_probs=need_probs,
        )
        return _constrain(context, cfg.output_dim_to_partition_spec.get("btnh")), probs


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
