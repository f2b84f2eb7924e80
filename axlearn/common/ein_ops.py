"""Einstein-notation reshapes: `rearrange(x, "b t (h d) -> b h t d", h=4)`.

A pattern is `"<input axes> -> <output axes>"`. Axes are names separated by spaces; `(a b)`
groups axes into one (its size is the product; all but one size of a group being split must be
given as keywords); `1` (or `()`) is an axis of size 1, dropped on the input side and inserted on
the output side. Both sides must name the same axes, each once.

`repeat(x, "b t 1 -> b t n", n=4)` is the same with new output axes (sizes given as keywords)
that tile `x`.
"""

import math
import re

from jax import numpy as jnp

from axlearn.common.utils import Tensor

_TOKEN = re.compile(r"\([^)]*\)|\S+")


def _parse_side(side: str, pattern: str) -> list[list[str]]:
    groups = []
    for token in _TOKEN.findall(side):
        if token.startswith("("):
            names = token[1:-1].split()
        elif token == "1":
            names = []
        else:
            names = [token]
        for name in names:
            if not name.isidentifier():
                raise ValueError(f"rearrange pattern {pattern!r}: bad axis name {name!r}")
        groups.append(names)
    return groups


def rearrange(x: Tensor, pattern: str, **axis_sizes: int) -> Tensor:
    """Reshapes and transposes `x` as `pattern` describes (see the module docstring).

    Args:
        x: The input tensor.
        pattern: "<input axes> -> <output axes>".
        **axis_sizes: Sizes of axes that a group on the input side splits.

    Returns:
        The rearranged tensor.

    Raises:
        ValueError: If the pattern does not match `x`'s rank or the two sides differ.
    """
    if pattern.count("->") != 1:
        raise ValueError(f"rearrange pattern {pattern!r} must contain one '->'")
    left, right = (_parse_side(side, pattern) for side in pattern.split("->"))
    x = jnp.asarray(x)
    if len(left) != x.ndim:
        raise ValueError(f"rearrange pattern {pattern!r} has {len(left)} input axes, x {x.shape}")
    sizes = dict(axis_sizes)
    for group, dim in zip(left, x.shape):
        unknown = [name for name in group if name not in sizes]
        known = math.prod(sizes[name] for name in group if name in sizes)
        if len(unknown) > 1:
            raise ValueError(f"rearrange pattern {pattern!r}: give the sizes of {unknown[1:]}")
        if unknown:
            sizes[unknown[0]] = dim // known
            known *= sizes[unknown[0]]
        if known != dim:
            raise ValueError(f"rearrange pattern {pattern!r}: axes {group or '1'} != size {dim}")
    in_names = [name for group in left for name in group]
    out_names = [name for group in right for name in group]
    if sorted(in_names) != sorted(out_names) or len(set(in_names)) != len(in_names):
        raise ValueError(f"rearrange pattern {pattern!r}: both sides must name the same axes")
    x = x.reshape([sizes[name] for name in in_names])
    x = jnp.transpose(x, [in_names.index(name) for name in out_names])
    return x.reshape([math.prod(sizes[name] for name in group) for group in right])


def repeat(x: Tensor, pattern: str, **axis_sizes: int) -> Tensor:
    """Like `rearrange`, with output axes absent from the input repeating `x` along them.

    Args:
        x: The input tensor.
        pattern: "<input axes> -> <output axes>"; each new output axis needs its size as a
            keyword.
        **axis_sizes: Sizes of the new axes (and of split input axes).

    Returns:
        The repeated tensor.

    Raises:
        ValueError: If a new axis has no size or the pattern does not match `x`.
    """
    if pattern.count("->") != 1:
        raise ValueError(f"repeat pattern {pattern!r} must contain one '->'")
    left_text, right_text = pattern.split("->")
    left, right = _parse_side(left_text, pattern), _parse_side(right_text, pattern)
    in_names = {name for group in left for name in group}
    new_names = [name for group in right for name in group if name not in in_names]
    missing = [name for name in new_names if name not in axis_sizes]
    if missing:
        raise ValueError(f"repeat pattern {pattern!r}: give the sizes of new axes {missing}")
    # Rearrange to the output order with each new axis as size 1, then broadcast.
    kept = " ".join("1" if name in new_names else name for group in right for name in group)
    x = rearrange(
        x, f"{left_text} -> {kept}", **{k: v for k, v in axis_sizes.items() if k in in_names}
    )
    x = jnp.broadcast_to(
        x,
        [
            axis_sizes[name] if name in new_names else x.shape[i]
            for i, name in enumerate(n for group in right for n in group)
        ],
    )
    sizes = [
        math.prod(x.shape[i] for i in range(start, start + len(group)))
        for start, group in zip([sum(len(g) for g in right[:k]) for k in range(len(right))], right)
    ]
    return x.reshape(sizes)
