"""Rematerialization policies for FlashAttention layers (AXLearn's `flash_attention.remat`).

`save_or_offload_flash_attention_policy()` returns a `jax.checkpoint` policy that keeps the
attention context (the output of the fused attention core, tagged "context" by the attention
layer, see `BaseLayer._remat_name`) instead of recomputing the attention in the backward pass; every
other tensor is left to the next policy (combine it with another via
`axlearn.common.utils.combine_remat_policies`).
"""

from typing import Any, Callable, Optional

from axlearn.common.utils_remat import _remat_decisions

# Regex (full match) of the checkpoint names the policy keeps: the fused attention's output.
FLASH_ATTENTION_NAMES = ".*context"


def save_or_offload_flash_attention_policy(
    remat_type: Optional[str] = None,
    *,
    offload_src: str = "device",
    offload_dst: str = "pinned_host",
) -> Callable[..., Any]:
    """Returns a remat policy saving (or offloading) the FlashAttention context.

    Args:
        remat_type: None or "save": save the context on device; "offload": offload it from
            `offload_src` to `offload_dst` memory.
        offload_src: Memory kind to offload from.
        offload_dst: Memory kind to offload to.

    Returns:
        The policy `policy(prim, *args, **params)` for `jax.checkpoint(policy=...)`.

    Raises:
        ValueError: On an unknown remat_type.
    """
    import re  # pylint: disable=import-outside-toplevel

    from jax._src.ad_checkpoint import name_p  # pylint: disable=import-outside-toplevel

    if remat_type not in (None, "save", "offload"):
        raise ValueError(
            f"save_or_offload_flash_attention_policy: remat_type must be None, 'save' or "
            f"'offload', got {remat_type!r}"
        )
    decisions = _remat_decisions()
    names = re.compile(FLASH_ATTENTION_NAMES)
    keep = (
        decisions.offloadable(src=offload_src, dst=offload_dst)
        if remat_type == "offload"
        else decisions.saveable
    )

    def policy(prim, *_, **params):
        if prim is name_p and names.fullmatch(params["name"]):
            return keep
        return decisions.recompute

    return policy
