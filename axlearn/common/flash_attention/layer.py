"""FlashAttention with AXLearn's config (`axlearn.common.flash_attention.layer`).

The attention core is `jax.nn.dot_product_attention`: its XLA path on CPU (numerically the plain
`GroupedQueryAttention` path), cuDNN's fused kernel on GPU for 16-bit inputs (see
`axlearn.common.attention.FlashAttention`). On top of that, this layer constrains the sharding of
the attention inputs and outputs by dim-string keys:

- `mha_dim_to_partition_spec`: "btnh" (queries [batch, target, heads, head_dim]), "bsnh"
  (keys/values) and "bnts" (biases [batch, heads, target, source]) inside the attention;
- `output_dim_to_partition_spec`: "btnh" for the context.

`default_mha_dim_to_partition_spec(mesh_axis_names)` and
`default_output_dim_to_partition_spec(mesh_axis_names)` give AXLearn's defaults (heads over
"model", batch over the other axes). `tpu_block_size` / `gpu_block_size` are kept for config
compatibility (the kernel picks its own tiling).
"""

from collections.abc import Sequence
from typing import Optional

from jax.sharding import PartitionSpec

from axlearn.common.attention import FlashAttention as _FusedAttention
from axlearn.common.config import config_class
from axlearn.common.utils import Tensor, with_sharding_constraint


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
        # Kept for AXLearn config compatibility.
        gpu_block_size: int = 128

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
