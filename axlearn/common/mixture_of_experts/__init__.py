"""Mixture-of-experts feed-forward layers (AXLearn's `axlearn.common.mixture_of_experts`).

Split over submodules: `gating` (routers: Top2Gating, TopKGating, TopKDropFreeGating,
TopKBiasGating, AdaptiveLoadBalanceLoss), `layer` (TransformerFeedForwardMoE, capacity based),
`drop_free` (TransformerFeedForwardDropFreeMoE and ApproximateTokenDropFreeMoE on grouped matmuls)
and `conversion` (dense-to-MoE parameters, outer batch of a mesh). Every public name lives at
`axlearn.common.mixture_of_experts.<Name>`, which is also its `__module__`, so configs dump it as
e.g. 'axlearn.common.mixture_of_experts.Top2Gating'.
"""

from axlearn.common.mixture_of_experts.conversion import (
    _convert_feedforward_to_moe_parameters,
    convert_dense_to_moe_parameters,
    get_outer_batch_from_mesh,
)
from axlearn.common.mixture_of_experts.drop_free import (
    ApproximateTokenDropFreeMoE,
    GMMBackend,
    TransformerFeedForwardDropFreeMoE,
    _all_to_all_combine,
    _all_to_all_dispatch,
    _custom_gather,
)
from axlearn.common.mixture_of_experts.gating import (
    AdaptiveLoadBalanceLoss,
    BaseGating,
    GateNoise,
    Top2Gating,
    TopKBiasGating,
    TopKDropFreeGating,
    TopKGating,
    _cap_logits,
    _compute_expert_capacity,
    _router_z_loss,
    approx_max_k,
    sigmoid,
)
from axlearn.common.mixture_of_experts.layer import TransformerFeedForwardMoE


def _claim_public_names():
    """Sets `__module__` of the classes and functions defined in the submodules to this package."""
    for value in list(globals().values()):
        module = getattr(value, "__module__", None)
        if isinstance(module, str) and module.startswith(__name__ + "."):
            try:
                value.__module__ = __name__
            except (AttributeError, TypeError):
                pass


_claim_public_names()

__all__ = [
    "AdaptiveLoadBalanceLoss",
    "ApproximateTokenDropFreeMoE",
    "BaseGating",
    "GMMBackend",
    "GateNoise",
    "Top2Gating",
    "TopKBiasGating",
    "TopKDropFreeGating",
    "TopKGating",
    "TransformerFeedForwardDropFreeMoE",
    "TransformerFeedForwardMoE",
    "_all_to_all_combine",
    "_all_to_all_dispatch",
    "_cap_logits",
    "_compute_expert_capacity",
    "_convert_feedforward_to_moe_parameters",
    "_custom_gather",
    "_router_z_loss",
    "approx_max_k",
    "convert_dense_to_moe_parameters",
    "get_outer_batch_from_mesh",
    "sigmoid",
]
