"""Rematerialization (`jax.checkpoint`) policies: save, offload or recompute by name or primitive.

Part of the `axlearn.common.utils` API, as in AXLearn: `axlearn.common.utils` re-exports every
public name here, and each reports `axlearn.common.utils` as its `__module__`, so configs dump
them as e.g. 'axlearn.common.utils.offload_dots_saveable'.
"""

from __future__ import annotations

import re
import types
from typing import Any, Callable, NamedTuple, Optional, Union

from axlearn.common.config import maybe_instantiate

# The module whose API these names belong to (their dumped module name).
PUBLIC_MODULE = "axlearn.common.utils"


# A regex (full match) over checkpoint names, or None for "no names".
SavePattern = Optional[Union[str, re.Pattern]]


class _RematDecisions(NamedTuple):
    saveable: Any
    recompute: Any
    offloadable: Callable[..., Any]


def _remat_decisions() -> _RematDecisions:
    from jax._src.interpreters import partial_eval as pe  # pylint: disable=import-outside-toplevel

    return _RematDecisions(pe.Saveable, pe.Recompute, pe.Offloadable)


def save_and_offload_only_these_names_regex(
    *,
    names_which_can_be_saved: SavePattern,
    names_which_can_be_offloaded: SavePattern,
    offload_src: str = "device",
    offload_dst: str = "pinned_host",
) -> Callable[..., Any]:
    """A `jax.checkpoint` policy keeping only tensors tagged with names that match regexes.

    Tensors tagged by `jax.ad_checkpoint.checkpoint_name` (see `BaseLayer._remat_name`) whose name
    fully matches `names_which_can_be_saved` are saved for the backward pass; those matching
    `names_which_can_be_offloaded` are offloaded from `offload_src` to `offload_dst` memory; all
    others are recomputed.

    Args:
        names_which_can_be_saved: Regex of names to save, or None.
        names_which_can_be_offloaded: Regex of names to offload, or None.
        offload_src: Memory kind to offload from.
        offload_dst: Memory kind to offload to.

    Returns:
        The policy function for `jax.checkpoint(policy=...)`.
    """
    from jax._src.ad_checkpoint import name_p  # pylint: disable=import-outside-toplevel

    decisions = _remat_decisions()
    saved = re.compile(names_which_can_be_saved) if names_which_can_be_saved else None
    offloaded = re.compile(names_which_can_be_offloaded) if names_which_can_be_offloaded else None

    def policy(prim, *_, **params):
        if prim is name_p:
            name = params["name"]
            if saved is not None and saved.fullmatch(name):
                return decisions.saveable
            if offloaded is not None and offloaded.fullmatch(name):
                return decisions.offloadable(src=offload_src, dst=offload_dst)
        return decisions.recompute

    policy.__module__ = PUBLIC_MODULE
    return policy


def offload_dots_saveable(offload_src: str, offload_dst: str) -> Callable[..., Any]:
    """A `jax.checkpoint` policy offloading the results of dot products (matmuls) to host memory.

    The result of every `dot_general` with no batch dimensions is offloaded from `offload_src` to
    `offload_dst` memory (like `jax.checkpoint_policies.dots_with_no_batch_dims_saveable`, but
    offloaded instead of kept on device); everything else is recomputed.

    Args:
        offload_src: Memory kind to offload from, e.g. "device".
        offload_dst: Memory kind to offload to, e.g. "pinned_host".

    Returns:
        The policy.
    """
    from jax import lax  # pylint: disable=import-outside-toplevel

    decisions = _remat_decisions()

    def policy(prim, *_, **params):
        if prim is lax.dot_general_p:
            (_, _), (lhs_batch, rhs_batch) = params["dimension_numbers"]
            if not lhs_batch and not rhs_batch:
                return decisions.offloadable(src=offload_src, dst=offload_dst)
        return decisions.recompute

    policy.__module__ = PUBLIC_MODULE
    return policy


def default_remat_combine_fn(preferred_remat_type: Any = None) -> Callable[..., Any]:
    """Returns the default way `combine_remat_policies` merges two policies' decisions.

    For each primitive: a policy that does not recompute wins over one that does; if both keep
    the value in different ways (e.g. save vs. offload), `preferred_remat_type` wins, and without
    one it is an error.

    Args:
        preferred_remat_type: The decision to take when the policies conflict; None: raise.

    Returns:
        combine_fn(prim, p1, p2, args, kwargs) -> decision.
    """
    decisions = _remat_decisions()
    recompute = decisions.recompute

    def normalize(decision):
        # JAX's built-in policies answer True (save) / False (recompute).
        if decision is True:
            return decisions.saveable
        if decision is False:
            return recompute
        return decision

    def combine_fn(prim, p1, p2, args, kwargs):
        del args, kwargs
        p1, p2 = normalize(p1), normalize(p2)
        if p1 is recompute:
            return p2
        if p2 is recompute or p1 == p2:
            return p1
        if preferred_remat_type is None:
            raise RuntimeError(
                f"Conflicting remat decisions for {prim}: {p1} vs {p2}; pass "
                "default_remat_combine_fn(preferred_remat_type=...) to choose one"
            )
        return preferred_remat_type

    combine_fn.__module__ = PUBLIC_MODULE
    return combine_fn


def combine_remat_policies(
    policy_1: Any, policy_2: Any, *, combine_fn: Any = default_remat_combine_fn()
) -> Callable[..., Any]:
    """Returns a remat policy combining two policies' decisions with `combine_fn`.

    Args:
        policy_1: A remat policy (or a config of one).
        policy_2: A remat policy (or a config of one).
        combine_fn: Merges the two decisions per primitive (see `default_remat_combine_fn`).

    Returns:
        The combined policy.
    """
    policy_1 = maybe_instantiate(policy_1)
    policy_2 = maybe_instantiate(policy_2)
    combine_fn = maybe_instantiate(combine_fn)

    def policy(prim, *args, **kwargs):
        return combine_fn(
            prim, policy_1(prim, *args, **kwargs), policy_2(prim, *args, **kwargs), args, kwargs
        )

    policy.__module__ = PUBLIC_MODULE
    return policy


# AXLearn's namespace of checkpoint policies beyond `jax.checkpoint_policies`.
extended_checkpoint_policies = types.SimpleNamespace(
    offload_dots_saveable=offload_dots_saveable,
    save_and_offload_only_these_names_regex=save_and_offload_only_these_names_regex,
)

for _fn in (
    save_and_offload_only_these_names_regex,
    offload_dots_saveable,
    default_remat_combine_fn,
    combine_remat_policies,
):
    _fn.__module__ = PUBLIC_MODULE
