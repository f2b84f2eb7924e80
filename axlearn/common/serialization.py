"""State dicts of pytrees (AXLearn's `serialization`, the API of Flax's `serialization`).

`to_state_dict(tree)` turns a tree into nested dicts keyed by strings (lists and tuples by
their indices "0", "1", ...); `from_state_dict(target, state)` restores such a state into the
structure of `target`. Types are registered with `register_serialization_state(ty,
ty_to_state_dict, ty_from_state_dict)`; dict, list, tuple and `utils.VDict` are registered
here. Leaves pass through unchanged (no copy, no pickle).
"""

from __future__ import annotations

from typing import Any, Callable

from axlearn.common.utils import VDict

_REGISTRY: dict[type, tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]] = {}


def register_serialization_state(
    ty: type,
    ty_to_state_dict: Callable[[Any], dict[str, Any]],
    ty_from_state_dict: Callable[[Any, dict[str, Any]], Any],
    override: bool = False,
) -> None:
    """Registers how values of type `ty` convert to and from state dicts.

    Args:
        ty: The type.
        ty_to_state_dict: value -> state dict.
        ty_from_state_dict: (target value, state dict) -> restored value.
        override: Whether an existing registration of `ty` may be replaced.

    Raises:
        ValueError: If `ty` is registered already and `override` is False.
    """
    if ty in _REGISTRY and not override:
        raise ValueError(f"Serialization state of {ty} is registered already (use override=True)")
    _REGISTRY[ty] = (ty_to_state_dict, ty_from_state_dict)


def to_state_dict(target: Any) -> Any:
    """Returns the state dict of `target` (leaves of unregistered types unchanged).

    Args:
        target: A tree.

    Returns:
        Nested dicts with string keys, or `target` itself for a leaf.
    """
    handlers = _REGISTRY.get(type(target))
    return handlers[0](target) if handlers else target


def from_state_dict(target: Any, state: Any, name: str = ".") -> Any:
    """Restores `state` into the structure of `target`.

    Args:
        target: A tree giving the structure (types); a leaf (or an unregistered type, or a
            class) means "take the state as it is".
        state: A state dict from `to_state_dict`.
        name: The path of `target`, for error messages.

    Returns:
        The restored tree.
    """
    handlers = _REGISTRY.get(type(target))
    if handlers is None:
        return state
    try:
        return handlers[1](target, state)
    except KeyError as e:
        raise ValueError(f"State at {name} lacks the key {e} that the target has") from e


def _dict_state_dict(xs: dict) -> dict[str, Any]:
    """The state dict of a dict: string keys, values converted recursively."""
    out = {str(key): to_state_dict(value) for key, value in xs.items()}
    if len(out) != len(xs):
        raise ValueError(f"Dict keys are not unique as strings: {list(xs)}")
    return out


def _restore_dict(xs: dict, states: dict[str, Any]) -> dict[str, Any]:
    """Restores a dict's values from `states` (keys as strings)."""
    return {
        key: from_state_dict(value, states[str(key)], name=str(key)) for key, value in xs.items()
    }


def _list_state_dict(xs: list | tuple) -> dict[str, Any]:
    return {str(i): to_state_dict(value) for i, value in enumerate(xs)}


def _restore_list(xs: list, states: dict[str, Any]) -> list:
    if len(states) != len(xs):
        raise ValueError(f"Expected a state of {len(xs)} items, got {len(states)}")
    return [from_state_dict(value, states[str(i)], name=str(i)) for i, value in enumerate(xs)]


register_serialization_state(dict, _dict_state_dict, _restore_dict)
register_serialization_state(
    VDict, _dict_state_dict, lambda xs, states: VDict(_restore_dict(xs, states))
)
register_serialization_state(list, _list_state_dict, _restore_list)
register_serialization_state(
    tuple, _list_state_dict, lambda xs, states: tuple(_restore_list(list(xs), states))
)
