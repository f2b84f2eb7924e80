"""Invocation contexts and output collections: the runtime state of module calls.

A module holds no tensors. While a module method runs, everything it may depend on or write to
(its state, PRNG key, training flag, and the output collection for summaries, state updates and
module outputs) is in an `InvocationContext`, kept on a thread-local stack. `axlearn.common.module`
re-exports every public name defined here.

This module imports neither TensorFlow nor seqio.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import threading
from typing import Any, Callable, NamedTuple, Optional, Protocol

import jax
import numpy as np

from axlearn.common.summary import Summary
from axlearn.common.utils import NestedTensor, Tensor


class ContextModule(Protocol):
    """What a context reads from its module (`axlearn.common.module.Module` provides it).

    Declared here, below `module`, so that this file needs nothing from the module system.
    """

    name: str
    parent: Optional[ContextModule]
    children: dict[str, ContextModule]

    def path(self) -> str:
        """The module's dotted path from the root."""


_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")

_HOW_TO_CALL_MODULE_MULTIPLE_TIMES = (
    "To call the same module multiple times, give each call its own context with "
    "`with child_context(unique_name, module=child): child.forward(...)`."
)


class OutputConflictError(ValueError):
    """An output (child context, module output) with the same name already exists."""

    def __init__(self, error_message: str):
        super().__init__(f"{error_message}. {_HOW_TO_CALL_MODULE_MULTIPLE_TIMES}")


def _generate_seed_from_name(name: str) -> np.int64:
    """Returns a stable seed in [0, 2**31 - 1) from `name` (independent of PYTHONHASHSEED).

    Args:
        name: The name (usually a child or parameter name).

    Returns:
        The seed.
    """
    digest = hashlib.md5(name.encode("utf-8")).hexdigest()
    return np.int64(int(digest, 16) % (2**31 - 1))


def _validate_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f'Invalid {what} name "{name}": must match [a-z][a-z0-9_]*')


# --------------------------------------------------------------------------------------------
# Output collections.
# --------------------------------------------------------------------------------------------


class OutputCollection(NamedTuple):
    """Implicit outputs of a module invocation, as nested dicts following child context names.

    `summaries` are values for logging; `state_updates` replace entries of the module's state
    (e.g. moving averages); `module_outputs` are intermediate values for the caller to inspect.
    """

    summaries: NestedTensor
    state_updates: NestedTensor
    module_outputs: NestedTensor

    def __contains__(self, name: str) -> bool:
        return name in self.summaries

    def add_child(self, name: str) -> OutputCollection:
        """Adds and returns an empty child collection under `name` in each of the three trees.

        Args:
            name: The child name.

        Returns:
            The child collection.

        Raises:
            ValueError: If `name` is invalid.
            OutputConflictError: If a child named `name` already exists.
        """
        _validate_name(name, "child context")
        if name in self:
            raise OutputConflictError(
                f"Context '{name}' was already entered in this invocation ({name} already present; "
                "module called twice?)"
            )
        child = new_output_collection()
        self.summaries[name] = child.summaries
        self.state_updates[name] = child.state_updates
        self.module_outputs[name] = child.module_outputs
        return child

    def update(self, collection: OutputCollection) -> None:
        """Merges `collection`'s top-level entries into this collection."""
        self.summaries.update(collection.summaries)
        self.state_updates.update(collection.state_updates)
        self.module_outputs.update(collection.module_outputs)


def new_output_collection() -> OutputCollection:
    """Returns an empty OutputCollection."""
    return OutputCollection(summaries={}, state_updates={}, module_outputs={})


def propagate_repeated_output_collections(
    repeated_output_collection: OutputCollection,
    *,
    child_name_prefix: str,
    target_output_collection: OutputCollection,
    merge_summaries: bool = False,
) -> None:
    """Adds the outputs of a vmapped/scanned computation to `target_output_collection`.

    `module_outputs` and `state_updates` (leaves of shape [N, ...]) go under
    `target[child_name_prefix]`; summaries are split so that `v[i]` goes under
    `target[f"{child_name_prefix}{i}"]`, or, with `merge_summaries`, combined over the N
    iterations under `target[child_name_prefix]`: a summary object (e.g. `WeightedSummary`) by
    its `accumulate`, a plain tensor by summation.

    Args:
        repeated_output_collection: Collection whose leaves have a leading axis of size N.
        child_name_prefix: The child name (prefix) to add outputs under.
        target_output_collection: The collection to add to.
        merge_summaries: Whether to merge the N iterations' summaries into one.
    """
    child = target_output_collection.add_child(child_name_prefix)
    child.module_outputs.update(repeated_output_collection.module_outputs)
    child.state_updates.update(repeated_output_collection.state_updates)
    leaves = jax.tree_util.tree_leaves(repeated_output_collection.summaries)
    if not leaves:
        return
    num = leaves[0].shape[0]
    if merge_summaries:
        child.summaries.update(_merge_repeated(repeated_output_collection.summaries, num))
        return
    for i in range(num):
        child_i = target_output_collection.add_child(f"{child_name_prefix}{i}")
        child_i.summaries.update(
            jax.tree.map(lambda x, i=i: x[i], repeated_output_collection.summaries)
        )


def _merge_repeated(summaries: Any, num: int) -> Any:
    """Combines summaries whose leaves have a leading axis of size `num` over that axis."""

    def merge(value):
        if isinstance(value, Summary):
            merged = jax.tree.map(lambda x: x[0], value)
            for i in range(1, num):
                merged = merged.accumulate(jax.tree.map(lambda x, i=i: x[i], value))
            return merged
        return value.sum(axis=0)

    return jax.tree.map(merge, summaries, is_leaf=lambda x: isinstance(x, Summary))


# --------------------------------------------------------------------------------------------
# Invocation contexts.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class InvocationContext:  # pylint: disable=too-many-instance-attributes
    """Everything a module invocation may depend on or write to.

    Attributes:
        name: The context name, unique among sibling contexts.
        parent: The parent context; None for a root context.
        module: The module this context belongs to.
        state: The module's state (parameters etc.), a nested dict (or None).
        is_training: Whether the invocation is in training mode.
        prng_key: The PRNG key, or None when the computation needs no randomness.
        output_collection: Where summaries, state updates and module outputs are added.
    """

    name: str
    parent: Optional[InvocationContext]
    module: Optional[ContextModule]
    state: NestedTensor
    is_training: bool
    prng_key: Optional[Tensor]
    output_collection: OutputCollection

    def path(self) -> str:
        """The dotted path of context names from the root."""
        if self.parent is None:
            return self.name
        return f"{self.parent.path()}.{self.name}"

    def add_child(self, name: str, **override_kwargs) -> InvocationContext:
        """Creates the child context `name`.

        Defaults for fields not in `override_kwargs`:
        - module: `self.module.children[name]`;
        - state: `self.state[child.name]` if module is a child of `self.module`, `self.state` if
          module is `self.module` (required explicitly otherwise);
        - is_training: `self.is_training`;
        - prng_key: `fold_in(self.prng_key, seed(name))` (None if `self.prng_key` is None);
        - output_collection: `self.output_collection.add_child(name)`.

        Args:
            name: The child context name.
            **override_kwargs: Field overrides.

        Returns:
            The child context.

        Raises:
            ValueError: If `parent` is overridden, `name` does not name a child module, or the
                state of a non-child module is not given.
            OutputConflictError: If a child context `name` was already created.
        """
        if "parent" in override_kwargs:
            raise ValueError("Overriding parent is not allowed")
        unknown = set(override_kwargs) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"Unknown InvocationContext fields: {sorted(unknown)}")
        if "module" in override_kwargs:
            module = override_kwargs["module"]
        else:
            children = self.module.children if self.module is not None else {}
            if name not in children:
                raise ValueError(
                    f"'{name}' is not a child of module {self.module.path()} "
                    f"(children: {sorted(children)}); pass module= to child_context()"
                )
            module = children[name]
        if "state" in override_kwargs:
            state = override_kwargs["state"]
        elif module is self.module:
            state = self.state
        elif module is not None and module.parent is self.module:
            state = None if self.state is None else self.state.get(module.name)
        else:
            raise ValueError(
                f"state must be given explicitly for module {module.path()} when creating a "
                f"child context of {self.path()} (module={self.module.path()})"
            )
        if "prng_key" in override_kwargs:
            prng_key = override_kwargs["prng_key"]
        elif self.prng_key is None:
            prng_key = None
        else:
            prng_key = jax.random.fold_in(self.prng_key, _generate_seed_from_name(name))
        if "output_collection" in override_kwargs:
            output_collection = override_kwargs["output_collection"]
        else:
            output_collection = self.output_collection.add_child(name)
        return InvocationContext(
            name=name,
            parent=self,
            module=module,
            state=state,
            is_training=override_kwargs.get("is_training", self.is_training),
            prng_key=prng_key,
            output_collection=output_collection,
        )

    def add_summary(self, name: str, value: Any) -> None:
        """Adds `value` (a tensor, a Summary or a tree of them) to the summaries as `name`.

        Leaves with a `validate()` method (Summary objects) are validated first.
        """

        def validate(leaf):
            validate_fn = getattr(leaf, "validate", None)
            if callable(validate_fn):
                validate_fn()
            return leaf

        jax.tree.map(validate, value, is_leaf=lambda x: callable(getattr(x, "validate", None)))
        self.output_collection.summaries[name] = value

    def add_state_update(self, name: str, value: Any) -> None:
        """Records `value` as the new value of state entry `name`."""
        self.output_collection.state_updates[name] = value

    def add_module_output(self, name: str, value: Any) -> None:
        """Adds `value` to the module outputs as `name`.

        Raises:
            OutputConflictError: If an output named `name` was already added in this context.
        """
        if name in self.output_collection.module_outputs:
            raise OutputConflictError(f"Outputs of name '{name}' already exist")
        self.output_collection.module_outputs[name] = value

    def set_state_update(self, value: Any) -> None:
        """Replaces this context's whole state update with `value` (e.g. a tuple)."""
        if self.parent is not None:
            self.parent.output_collection.state_updates[self.name] = value
        self.output_collection = self.output_collection._replace(state_updates=value)

    def get_summaries(self) -> NestedTensor:
        """The summaries added so far in this context."""
        return self.output_collection.summaries

    def get_state_updates(self) -> NestedTensor:
        """The state updates added so far in this context."""
        return self.output_collection.state_updates

    def get_module_outputs(self) -> NestedTensor:
        """The module outputs added so far in this context."""
        return self.output_collection.module_outputs

    def functional(self, method_fn: Callable) -> _Functional:
        """Returns `method_fn` as a pure function run in (a copy of) this context.

        The returned callable returns `(outputs, output_collection)`.
        """
        return _Functional(method_fn=method_fn, context=self, require_parent=False)


@dataclasses.dataclass
class _ContextStack(threading.local):
    """The per-thread stack of invocation contexts."""

    stack: list = dataclasses.field(default_factory=list)
    thread_id: int = dataclasses.field(default_factory=threading.get_ident)


_global_context_stack = _ContextStack()


def clone_context_stack() -> list[InvocationContext]:
    """Returns a copy of this thread's context stack (to install in another thread)."""
    return list(_global_context_stack.stack)


def install_context_stack(stack: list[InvocationContext]) -> None:
    """Installs `stack` (from `clone_context_stack()`) as the context stack of this thread.

    Args:
        stack: The context stack.

    Raises:
        ValueError: If called on the thread that owns the current stack.
    """
    if _global_context_stack.thread_id == threading.get_ident() and _global_context_stack.stack:
        raise ValueError("install_context_stack should only be called on a different thread")
    _global_context_stack.thread_id = threading.get_ident()
    _global_context_stack.stack = stack


def current_context() -> Optional[InvocationContext]:
    """The innermost invocation context of this thread, or None."""
    stack = _global_context_stack.stack
    return stack[-1] if stack else None


@contextlib.contextmanager
def set_current_context(context: InvocationContext, *, require_parent: bool = True):
    """Pushes `context` onto the context stack for the duration of the `with` block.

    Args:
        context: The context.
        require_parent: If True, `context.parent` must be the current context.

    Yields:
        The context.

    Raises:
        ValueError: If the context does not fit the stack.
    """
    stack = _global_context_stack.stack
    if stack:
        if require_parent and context.parent is not stack[-1]:
            raise ValueError(
                f"Context ({context.path()})'s parent must match the current context "
                f"({stack[-1].path()}). Did you create the context via child_context()?"
            )
    elif context.parent is not None:
        raise ValueError(
            "The first context in the stack must be a root context with parent=None. "
            "Usually a root context is created by functional()."
        )
    stack.append(context)
    try:
        if context.module is not None and context.name != "remat":
            with jax.named_scope(f"{context.name}[{type(context.module).__qualname__}]"):
                yield context
        else:
            yield context
    finally:
        stack.pop()


@contextlib.contextmanager
def child_context(name: str, **kwargs):
    """Enters a child context `name` of the current context (see `InvocationContext.add_child`).

    Use it to call the same child more than once (`module=child` with distinct names) or to run
    a module with substituted state.

    Args:
        name: The child context name, unique within the current context.
        **kwargs: Overrides of the child context fields (module, state, prng_key, ...).

    Yields:
        The child context.

    Raises:
        RuntimeError: If there is no current context or the stack belongs to another thread.
    """
    if _global_context_stack.thread_id != threading.get_ident():
        raise RuntimeError("Each thread should call install_context_stack() to install its stack.")
    parent = current_context()
    if parent is None:
        raise RuntimeError(
            "child_context() needs a current invocation context. "
            "Did you invoke the module inside functional(...)?"
        )
    with set_current_context(parent.add_child(name, **kwargs)) as context:
        yield context


def _copy_tree(tree: Any) -> Any:
    """Copies the containers of a tree (leaves are shared) so callees cannot mutate the caller's."""
    return jax.tree.map(lambda x: x, tree)


@dataclasses.dataclass
class _Functional:
    """A pure-functional call of `method_fn` in (a copy of) `context`."""

    method_fn: Callable
    context: InvocationContext
    require_parent: bool

    def __call__(self, *args, **kwargs) -> tuple[Any, OutputCollection]:
        context = dataclasses.replace(
            self.context,
            state=_copy_tree(self.context.state),
            output_collection=_copy_tree(self.context.output_collection),
        )
        args, kwargs = _copy_tree((args, kwargs))
        with set_current_context(context, require_parent=self.require_parent):
            outputs = self.method_fn(*args, **kwargs)
        return outputs, context.output_collection
