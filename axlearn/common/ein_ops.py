"""Einstein-notation reshapes for JAX: `rearrange(x, "b t (h d) -> b h t d", h=4)`.

A pattern is `"<input axes> -> <output axes>"`. Axis names follow Python identifiers in lower
case (`[_a-z][_a-z0-9]*`), separated by spaces:
- `(a b)` is one dimension made of several axes (its size is the product; when a group on the
  input side is split, all but one of its sizes must be given as keywords); groups do not nest
  and hold at least two names (or `...`);
- `1` is a dimension of size 1, dropped on the input side and inserted on the output side (no
  other numbers);
- `...` stands for the dimensions not named, once per side and on both sides; on the output side
  it may sit inside a group (`b ... -> b (...)` flattens them).

`rearrange` is reshape -> transpose -> reshape; `repeat(x, "b t -> b t n", n=4)` is reshape ->
broadcast -> reshape, where new output axes (sizes given as keywords) tile `x` and the input axes
keep their order. The shape plan of a (shape, pattern, sizes) is computed once and cached, so
tracing the same call again is cheap.
"""

import functools
import math
import re
from typing import NamedTuple, Union

from jax import numpy as jnp

from axlearn.common.utils import Tensor

# An axis: a name, "1", "..." or a group of names.
_Axis = Union[str, tuple[str, ...]]
_Axes = tuple[_Axis, ...]

_IDENTIFIER = r"[_a-z][_a-z0-9]*"
_ELLIPSIS = "..."
# One token of a side: a standalone "1", "...", a name, or a parenthesized group without nested
# parentheses. Whatever these do not cover is reported as unexpected.
_TOKEN = re.compile(r"(?:(?<=\s)|^)1(?=\s|$)" + r"|\.\.\." + "|" + _IDENTIFIER + r"|\([^()]*\)")
_NAME_OR_ELLIPSIS = re.compile(rf"{_IDENTIFIER}|\.\.\.")
# Prefix of the names standing for the dimensions an ellipsis covers.
_ELLIPSIS_PREFIX = "_ELLIPSIS_"


def _parse_axes(axes: str) -> _Axes:
    """Parses one side of a pattern: `"b t (g k) h"` -> `("b", "t", ("g", "k"), "h")`.

    Args:
        axes: The side's text.

    Returns:
        One entry per dimension: a name, "1", "..." or a tuple of names (a group).

    Raises:
        ValueError: On characters that form no token, a name that is not an identifier inside a
            group (a "1" there too), a group of fewer than two names, or a name given twice.
    """
    leftover = _TOKEN.sub("", axes).strip()
    if leftover:
        raise ValueError(f"Unexpected characters in pattern: '{leftover}'")
    seen = set()

    def check_once(name: str):
        if name != "1" and name in seen:
            raise ValueError(f"Duplicated axis name: '{name}' in axes={axes!r}.")
        seen.add(name)

    parsed = []
    for token in _TOKEN.findall(axes):
        if not token.startswith("("):
            check_once(token)
            parsed.append(token)
            continue
        names = token[1:-1].split()
        if len(names) < 2 and _ELLIPSIS not in names:
            raise ValueError(f"Group '{token}' must contain at least two axes.")
        for name in names:
            if not _NAME_OR_ELLIPSIS.fullmatch(name):
                raise ValueError(
                    f"Invalid axis name: '{name}'. Must match Python _IDENTIFIER='{_IDENTIFIER}'."
                )
            check_once(name)
        parsed.append(tuple(names))
    return tuple(parsed)


def _ellipsis_position(axes: _Axes) -> tuple[int, bool]:
    """(index of the entry holding "...", whether inside a group); (-1, False) when absent."""
    found = [
        (i, isinstance(axis, tuple))
        for i, axis in enumerate(axes)
        if axis == _ELLIPSIS or (isinstance(axis, tuple) and _ELLIPSIS in axis)
    ]
    if len(found) > 1:
        raise ValueError("Multiple ellipses '...' in a pattern are not allowed.")
    return found[0] if found else (-1, False)


def _expand_ellipsis(axes: _Axes, position: tuple[int, bool], names: tuple[str, ...]) -> _Axes:
    index, in_group = position
    if in_group:
        group = axes[index]
        at = group.index(_ELLIPSIS)
        return axes[:index] + (group[:at] + names + group[at + 1 :],) + axes[index + 1 :]
    return axes[:index] + names + axes[index + 1 :]


def _parse_pattern(*, pattern: str, in_shape: tuple[int, ...]) -> tuple[_Axes, _Axes]:
    """Parses `"lhs -> rhs"`, replacing "..." by names `_ELLIPSIS_<i>` of the dims it covers.

    Args:
        pattern: The pattern.
        in_shape: The input's shape (gives the number of dimensions "..." covers).

    Returns:
        (lhs axes, rhs axes) as `_parse_axes` gives them, without "...".

    Raises:
        ValueError: Without "->", with "..." on one side only, more than once a side or inside an
            input group, or with more input axes than `in_shape` has.
    """
    if "->" not in pattern:
        raise ValueError(f"pattern={pattern!r} doesn't have ->.")
    sides = pattern.split("->")
    if len(sides) != 2:
        raise ValueError(f"pattern={pattern!r} has more than one ->.")
    lhs, rhs = (_parse_axes(side.strip()) for side in sides)
    lhs_position, rhs_position = _ellipsis_position(lhs), _ellipsis_position(rhs)
    if lhs_position[1]:
        raise ValueError("Only rhs is allowed to have ... inside a group.")
    if (lhs_position[0] < 0) != (rhs_position[0] < 0):
        raise ValueError("lhs and rhs contain '...' asymmetrically.")
    if lhs_position[0] < 0:
        return lhs, rhs
    covered = len(in_shape) - (len(lhs) - 1)
    if covered < 0:
        raise ValueError(f"Too many axes in lhs pattern for input shape {in_shape}.")
    names = tuple(f"{_ELLIPSIS_PREFIX}{i}" for i in range(covered))
    return _expand_ellipsis(lhs, lhs_position, names), _expand_ellipsis(rhs, rhs_position, names)


def _get_input_reshape(
    *, shape: tuple[int, ...], lhs_axes: _Axes, axes_lengths: dict[str, int]
) -> dict[str, int]:
    """The size of every input axis, in input order.

    Args:
        shape: The input's shape.
        lhs_axes: The input side, as `_parse_pattern` gives it (no "...").
        axes_lengths: Sizes given by the caller (needed for all but one axis of a split group).

    Returns:
        {axis name: size}, in the order the names appear (size-1 "1" dims left out).

    Raises:
        ValueError: A group with two unknown sizes or one not dividing its dim, a "1" on a dim
            that is not 1, axis sizes whose product is not the input's, or a given size that
            differs from the input's.
    """
    sizes = {}
    for axis, dim in zip(lhs_axes, shape):
        if axis == "1":
            if dim != 1:
                raise ValueError(f"Expected singleton dim, got shape={shape} at axis_name='1'.")
        elif isinstance(axis, str):
            sizes[axis] = dim
        else:
            unknown = [name for name in axis if name not in axes_lengths]
            if len(unknown) > 1:
                raise ValueError(
                    f"Multiple unknown axes ({unknown[0]}, {unknown[1]}) in a group are not "
                    "allowed."
                )
            known = math.prod(axes_lengths[name] for name in axis if name in axes_lengths)
            for name in axis:
                if name in axes_lengths:
                    sizes[name] = axes_lengths[name]
                elif known == 0 or dim % known:
                    raise ValueError(f"Cannot infer unknown axis {name}, not divisible.")
                else:
                    sizes[name] = dim // known
    reshape = list(sizes.values())
    dims_match = len(lhs_axes) == len(shape) and all(
        (axis == "1" and dim == 1)
        or (isinstance(axis, str) and axis != "1")
        or (isinstance(axis, tuple) and math.prod(sizes[n] for n in axis) == dim)
        for axis, dim in zip(lhs_axes, shape)
    )
    if not dims_match or math.prod(reshape) != math.prod(shape):
        raise ValueError(f"Incompatible shape reshape: {shape} -> {reshape}")
    for name, size in axes_lengths.items():
        if name in sizes and sizes[name] != size:
            raise ValueError(
                f"Conflicting axis size for {name}: from tensor {sizes[name]}, from user {size}."
            )
    return sizes


def _names(axes: _Axes) -> list[str]:
    """The axis names of a side in order, groups flattened, "1" left out."""
    out = []
    for axis in axes:
        for name in axis if isinstance(axis, tuple) else (axis,):
            if name != "1":
                out.append(name)
    return out


def _dim_sizes(axes: _Axes, sizes: dict[str, int]) -> list[int]:
    """One size per entry of a side: a group's is the product of its axes, "1"'s is 1."""
    return [
        math.prod(sizes[name] for name in axis) if isinstance(axis, tuple) else sizes.get(axis, 1)
        for axis in axes
    ]


class _Plan(NamedTuple):
    """How a call reshapes: input_reshape, then the operand (a transpose's permutation, or the
    shape to broadcast to), then output_shape."""

    # Shape the input is reshaped to first: one dimension per input axis.
    input_reshape: list[int]
    # rearrange: the transpose permutation; repeat: the shape broadcast to.
    operand: list[int]
    # Final shape.
    output_shape: list[int]


@functools.lru_cache(maxsize=256)
def _rearrange_plan(in_shape: tuple[int, ...], pattern: str, lengths: tuple) -> _Plan:
    lhs, rhs = _parse_pattern(pattern=pattern, in_shape=in_shape)
    sizes = _get_input_reshape(shape=in_shape, lhs_axes=lhs, axes_lengths=dict(lengths))
    out_names = _names(rhs)
    for name in out_names:
        if name not in sizes:
            raise ValueError(f"Missing axis {name} in input.")
    if set(out_names) != set(sizes):
        raise ValueError(
            f"Mismatch between LHS axes and RHS axes: {set(out_names)} vs {set(sizes)}"
        )
    in_names = list(sizes)
    permutation = [in_names.index(name) for name in out_names]
    return _Plan(list(sizes.values()), permutation, _dim_sizes(rhs, sizes))


@functools.lru_cache(maxsize=256)
def _repeat_plan(in_shape: tuple[int, ...], pattern: str, lengths: tuple) -> _Plan:
    lhs, rhs = _parse_pattern(pattern=pattern, in_shape=in_shape)
    given = dict(lengths)
    in_lengths = {name: size for name, size in given.items() if name in _names(lhs)}
    sizes = _get_input_reshape(shape=in_shape, lhs_axes=lhs, axes_lengths=in_lengths)
    out_names = _names(rhs)
    kept = [name for name in out_names if name in sizes]
    if set(kept) != set(sizes):
        raise ValueError(f"lhs axes {set(sizes)} must be same to rhs axes {set(out_names)}.")
    if kept != list(sizes):
        raise ValueError("repeat doesn't allow reordering existing axes.")
    new = [name for name in out_names if name not in sizes]
    missing = [name for name in new if name not in given]
    if missing:
        raise ValueError(f"repeat pattern {pattern!r}: give the sizes of new axes {missing}.")
    all_sizes = {**sizes, **{name: given[name] for name in new}}
    # The input with a size-1 dim at each new axis, broadcast to every output axis's size.
    expanded = [sizes.get(name, 1) for name in out_names]
    broadcast = [all_sizes[name] for name in out_names]
    return _Plan(expanded, broadcast, _dim_sizes(rhs, all_sizes))


def rearrange(x: Tensor, pattern: str, **axes_lengths: int) -> Tensor:
    """Reshapes and transposes `x` as `pattern` says (see the module docstring).

    Args:
        x: The input tensor.
        pattern: `"<input axes> -> <output axes>"`, both naming the same axes.
        **axes_lengths: Sizes of axes that an input group splits (all but one per group).

    Returns:
        The rearranged tensor.

    Raises:
        ValueError: If the pattern is malformed or does not match `x`'s shape.
    """
    x = jnp.asarray(x)
    plan = _rearrange_plan(tuple(x.shape), pattern, tuple(sorted(axes_lengths.items())))
    if plan.input_reshape != list(x.shape):
        x = jnp.reshape(x, plan.input_reshape)
    if plan.operand != sorted(plan.operand):
        x = jnp.transpose(x, plan.operand)
    if plan.output_shape != list(x.shape):
        x = jnp.reshape(x, plan.output_shape)
    return x


def repeat(x: Tensor, pattern: str, **axes_lengths: int) -> Tensor:
    """Like `rearrange`, with new output axes tiling `x`; the input axes keep their order.

    Args:
        x: The input tensor.
        pattern: `"<input axes> -> <output axes>"`; each output axis absent from the input
            needs its size as a keyword.
        **axes_lengths: Sizes of the new axes.

    Returns:
        The repeated tensor.

    Raises:
        ValueError: If the pattern is malformed, reorders input axes, drops one, or a new axis
            has no size.
    """
    x = jnp.asarray(x)
    plan = _repeat_plan(tuple(x.shape), pattern, tuple(sorted(axes_lengths.items())))
    x = jnp.reshape(x, plan.input_reshape)
    x = jnp.broadcast_to(x, plan.operand)
    return jnp.reshape(x, plan.output_shape)
