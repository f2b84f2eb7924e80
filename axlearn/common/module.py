"""Modules: a tree of stateless, configurable computation nodes, invoked functionally.

A `Module` holds no tensors. Its parameters and other state, its PRNG key, whether it is
training, and where its summaries go are all in an `InvocationContext`, a thread-local stack of
which is maintained while a module runs. The root context is created by `functional()`:

    outputs, output_collection = functional(
        model, prng_key=key, state=params, inputs=dict(x=x), is_training=True
    )

Every public method defined by a `Module` subclass is wrapped so that calling it from a parent
(`self.child.forward(...)`, or `self.child(...)`) first enters the child's context: the child
sees `self.state == parent_state[child_name]`, a PRNG key derived from the parent's key and the
child's *name*, and a fresh output collection stored under the child's name in the parent's.
Helpers that must not be wrapped are decorated with `@nowrap`.

Each child context may be created only once per parent context. To call the same child twice,
give each call its own context with `child_context(name, module=child)`.

This module imports neither TensorFlow nor seqio.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional, Protocol, TypeVar, Union, runtime_checkable

import jax
from absl import logging

from axlearn.common import traceback_util
from axlearn.common.config import (
    REQUIRED,
    Configurable,
    Required,
    RequiredFieldValue,
    config_class,
    instantiation_scope,
)
from axlearn.common.invocation_context import (  # noqa: F401  (re-exported public names)
    ContextModule,
    InvocationContext,
    OutputCollection,
    OutputConflictError,
    _copy_tree,
    _Functional,
    _generate_seed_from_name,
    _global_context_stack,
    _validate_name,
    child_context,
    clone_context_stack,
    current_context,
    install_context_stack,
    new_output_collection,
    propagate_repeated_output_collections,
    set_current_context,
)
from axlearn.common.traceback_util import annotate_stack, no_stack_summary
from axlearn.common.utils import NestedTensor, Tensor, partial_with_fn_metadata, prune_tree

_T = TypeVar("_T")


@runtime_checkable  # So that `isinstance(x, Summable)` works.
class Summable(Protocol):
    """A value that can be added to another of its type (a summary accumulated over steps)."""

    def __add__(self, other: _T) -> _T: ...


class ChildNameConflictError(ValueError):
    """`_add_child` was called twice with the same name."""


def _current_instantiation_scope() -> list[str]:
    """The names currently in `config.instantiation_scope` (outermost first)."""
    try:
        from axlearn.common.config.instantiable import (  # pylint: disable=import-outside-toplevel
            _current_scope,
        )
    except ImportError:  # config as a single module.
        from axlearn.common.config import _current_scope  # pylint: disable=import-outside-toplevel
    return _current_scope()


# --------------------------------------------------------------------------------------------
# Method wrapping.
# --------------------------------------------------------------------------------------------


def nowrap(fn: Callable) -> Callable:
    """Marks a public module method as a plain helper: it is not run in the module's context.

    Args:
        fn: The method.

    Returns:
        `fn`, marked.
    """
    fn._nowrap = True  # pylint: disable=protected-access
    return fn


@traceback_util.wrap
@no_stack_summary
def _call_method_in_context(
    module: Module, *args, method_fn: Callable, method_name: str, **kwargs
) -> Any:
    """Calls `method_fn(module, *args, **kwargs)` in `module`'s context.

    If the current context belongs to an ancestor of `module`, child contexts are entered along
    the path from that ancestor; if it belongs to `module` itself, none is entered. If `module`
    is a module shared (`_share_with_descendants`) by an ancestor of the current context, one
    child context named by its shared name is entered, with the shared module's state.

    An exception escaping the outermost such call carries a stack summary
    (`traceback_util.wrap`): the context plumbing's frames are left out and each module method
    call is named with its argument types ("Wrapped call pkg.Layer.forward(Tensor)").
    """
    with contextlib.ExitStack() as stack:
        context = current_context()
        if context is not None and context.module is not module:
            shared = _find_shared_module(context, module)
            if shared is not None:
                stack.enter_context(child_context(shared[0], module=module, state=shared[1]))
            else:
                for name in context.module.path_to_descendant_module(module):
                    stack.enter_context(child_context(name))
        # The call's types are recorded on the method's own frame, for the stack summary.
        annotated = annotate_stack(
            module_call=True,
            module_type=type(module),
            method_name=method_name,
            arg_types=[type(a) for a in args],
            kwarg_types={k: type(v) for k, v in kwargs.items()},
        )(method_fn)
        thunk = module._call_thunk(*args, method_fn=annotated, **kwargs)  # pylint: disable=protected-access
        return no_stack_summary(thunk)()


def _find_shared_module(context: InvocationContext, module: Module) -> Optional[tuple[str, Any]]:
    """(shared name, state) if an ancestor context's module shares `module`, else None.

    Only used when `module` is not a descendant of the current context's module.
    """
    node = module
    while node is not None and node is not context.module:
        node = node.parent
    if node is context.module:
        return None  # A plain descendant.
    ancestor = context
    while ancestor is not None:
        owner = ancestor.module
        for shared_name, path in owner._paths_to_shared_modules.items():  # pylint: disable=protected-access
            target, state = owner, ancestor.state
            for part in path:
                target = target.children.get(part)
                state = state.get(part) if isinstance(state, dict) else None
                if target is None:
                    break
            if target is module:
                return shared_name, state
        ancestor = ancestor.parent
    return None


def _wrap_method_with_auto_child_context(*, method_fn: Callable, method_name: str) -> Callable:
    """Returns an unbound wrapper of `method_fn` that runs it in the module's context."""

    @no_stack_summary
    @functools.wraps(method_fn)
    def wrapper(self, *args, **kwargs):
        return _call_method_in_context(
            self, *args, method_fn=method_fn, method_name=method_name, **kwargs
        )

    wrapper._auto_child_context = True  # pylint: disable=protected-access
    return wrapper


class _PostInitMeta(type):
    """Metaclass calling `instance.__post_init__()` after `__init__`."""

    def __call__(cls, *args, **kwargs):
        instance = super().__call__(*args, **kwargs)
        post_init = getattr(instance, "__post_init__", None)
        if callable(post_init):
            post_init()
        return instance


class Module(Configurable, metaclass=_PostInitMeta):
    """A node in a tree of modules. See the module docstring."""

    @config_class
    class Config(Configurable.Config):
        """Configures Module."""

        # The module name; set by the parent's `_add_child` (the root must set it).
        name: Required[str] = REQUIRED
        # The maximum vlog level; None disables vlog.
        vlog: Optional[int] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg)
        cfg = self._config
        self._name = cfg.name
        self._parent = parent
        self._children: dict[str, Module] = {}
        self._paths_to_shared_modules: dict[str, list[str]] = {}
        self._vlog_level = cfg.vlog

    def __post_init__(self):
        # Wrap public methods once __init__ (which may add children) is done.
        for method_name, method_fn in self._wrapped_methods_for_auto_child_context().items():
            setattr(self, method_name, method_fn)

    def _wrapped_methods_for_auto_child_context(self) -> dict[str, Callable]:
        """Returns {name: bound wrapper} for the methods to run in this module's context."""
        wrapped = {}
        for method_name, method_fn in self._methods_to_wrap_for_auto_child_context().items():
            fn = _wrap_method_with_auto_child_context(method_fn=method_fn, method_name=method_name)
            wrapped[method_name] = partial_with_fn_metadata(fn, self)
        return wrapped

    def _methods_to_wrap_for_auto_child_context(self) -> dict[str, Callable]:
        """Returns {name: unbound function} of public methods defined by subclasses of Module.

        Methods marked `@nowrap`, private methods, properties, static/class methods and methods
        that `Module` itself defines are not wrapped.
        """
        methods = {}
        for name in dir(type(self)):
            if name.startswith("_") or hasattr(Module, name):
                continue
            fn = inspect.getattr_static(type(self), name, None)
            if not inspect.isfunction(fn) or getattr(fn, "_nowrap", False):
                continue
            if "self" not in inspect.signature(fn).parameters:
                continue
            methods[name] = fn
        return methods

    def _call_thunk(self, *args, method_fn: Callable, **kwargs) -> Callable[[], Any]:
        """Returns a nullary function that runs `method_fn(self, *args, **kwargs)`.

        Subclasses may override it to transform the call (e.g. BaseLayer applies remat).
        """
        return lambda: method_fn(self, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only called when regular attribute lookup fails: look up children.
        if name.startswith("_"):
            try:
                return self.__dict__[name]
            except KeyError as e:
                raise AttributeError(name) from e
        children = self.__dict__.get("_children", {})
        if name in children:
            return children[name]
        raise AttributeError(f"{name} is not an attribute or child of {self}")

    @property
    def parent(self) -> Optional[Module]:
        """The parent module (None for the root)."""
        return self._parent

    @property
    def name(self) -> str:
        """The module name."""
        return self._name

    @property
    def children(self) -> dict[str, Module]:
        """The child modules by name, in creation order."""
        return self._children

    def path(self) -> str:
        """The dotted path of names from the root module, e.g. `model.decoder.emb`."""
        if self.parent is None:
            return self.name
        return f"{self.parent.path()}.{self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}@{self.path()}"

    __str__ = __repr__

    def vlog_is_on(self, level: int) -> bool:
        """Whether `vlog(level, ...)` logs."""
        return self._vlog_level is not None and level <= self._vlog_level

    def vlog(self, level: int, msg: str, *args, **kwargs) -> None:
        """Logs `msg % args` with the module path if `level <= cfg.vlog`."""
        if self.vlog_is_on(level):
            logging.info(f"@{self.path()} {msg}", *args, **kwargs)

    def vprint(self, level: int, msg: str, *args, **kwargs) -> None:
        """`jax.debug.print`s `msg` (which may format tensors) if `level <= cfg.vlog`."""
        if self.vlog_is_on(level):
            jax.debug.print(f"@{self.path()} {msg}", *args, **kwargs)

    def _add_child(self, name: str, child_config: Module.Config, **kwargs) -> Module:
        """Instantiates `child_config` as the child `name` of this module.

        Missing REQUIRED fields are reported with their full path (e.g. `model.decoder.dim`).

        Args:
            name: The child name, [a-z][a-z0-9_]*.
            child_config: The child's Module config (copied; the caller's is not modified).
            **kwargs: Extra arguments for the child's `__init__`.

        Returns:
            The child module.

        Raises:
            ValueError: On an invalid name or a config whose name differs from `name`.
            TypeError: If `child_config` is not a Module config.
            ChildNameConflictError: If a child `name` already exists.
        """
        _validate_name(name, "child")
        if not isinstance(child_config, Module.Config):
            raise TypeError(
                f"_add_child({name!r}) of {self.path()} expects a Module config, "
                f"got {type(child_config).__name__}"
            )
        if name in self._children:
            raise ChildNameConflictError(f"Child {name} already exists in {self.path()}")
        child_config = copy.deepcopy(child_config)
        if not isinstance(child_config.name, RequiredFieldValue) and child_config.name != name:
            raise ValueError(
                f"{self.path()}: child_config already has a different name: {child_config.name} "
                f"vs. {name}; leave the child config's name unset (or set it to {name!r})."
            )
        child_config.name = name

        # Missing REQUIRED fields are reported relative to the root module (whose config is the
        # root of the tree the user edits): `model.decoder.dim` for the root's child "model".
        # Nested _add_child calls already have the ancestors in scope; otherwise enter them.
        scope = _current_instantiation_scope()
        ancestors = self.path().split(".")[1:]
        with contextlib.ExitStack() as stack:
            if ancestors and scope[len(scope) - len(ancestors) :] != ancestors:
                for n in ancestors:
                    stack.enter_context(instantiation_scope(n))
            stack.enter_context(instantiation_scope(name))
            module = child_config.instantiate(parent=self, **kwargs)
        self._children[name] = module
        return module

    def path_to_descendant_module(self, module: Module) -> list[str]:
        """Returns the child names from `self` down to `module`.

        Raises:
            ValueError: If `module` is not a descendant of `self`.
        """
        relative = []
        node = module
        while node is not None and node is not self:
            relative.append(node.name)
            node = node.parent
        if node is None:
            raise ValueError(
                f"Module {module.path()} is not a descendant of {self.path()}: it cannot be "
                "called from this context"
            )
        return list(reversed(relative))

    def _share_with_descendants(self, module: Module, *, shared_module_name: str) -> None:
        """Lets descendants find `module` (a descendant of self) via `get_shared_module`."""
        relative = self.path_to_descendant_module(module)
        if shared_module_name in self._paths_to_shared_modules:
            raise ValueError(
                f"{self.path()}: a shared module already exists under name "
                f"{shared_module_name!r}; share each module under its own name."
            )
        self._paths_to_shared_modules[shared_module_name] = relative

    class SharedModuleInfo(NamedTuple):
        """A shared module and its state."""

        module: Module
        state: NestedTensor

    def get_shared_module(self, shared_module_name: str) -> SharedModuleInfo:
        """Returns the module (and state) shared under `shared_module_name` by the nearest ancestor.

        Raises:
            ValueError: If no ancestor shares that name, or the state lacks the path to it.
        """
        context = self.get_invocation_context()
        while context is not None and shared_module_name not in (
            context.module._paths_to_shared_modules  # pylint: disable=protected-access
        ):
            context = context.parent
        if context is None:
            raise ValueError(
                f"Module '{self.path()}' has no ancestor that shares '{shared_module_name}'"
            )
        target, state = context.module, context.state
        for part in context.module._paths_to_shared_modules[shared_module_name]:  # pylint: disable=protected-access
            if not isinstance(state, dict) or part not in state:
                raise ValueError(
                    f"Module '{target.path()}': state does not contain '{part}', the path to "
                    f"shared module '{shared_module_name}'; pass state with an entry per child."
                )
            target, state = target.children[part], state[part]
        return Module.SharedModuleInfo(module=target, state=state)

    def get_invocation_context(self) -> InvocationContext:
        """Returns the current context, which must belong to this module.

        Raises:
            RuntimeError: Outside `functional(...)`, or if the current context belongs to another
                module.
        """
        context = current_context()
        if context is None:
            raise RuntimeError(
                f"No invocation context for {self.path()}. "
                "Did you invoke the module inside functional(...)?"
            )
        if context.module is not self:
            raise RuntimeError(
                f"Module mismatch: the current context belongs to {context.module}, not {self}. "
                "Are the module methods wrapped for auto child context (not @nowrap)?"
            )
        return context

    @property
    def is_training(self) -> bool:
        """Whether the current invocation is in training mode."""
        return self.get_invocation_context().is_training

    @property
    def prng_key(self) -> Tensor:
        """The PRNG key of the current invocation."""
        return self.get_invocation_context().prng_key

    @property
    def state(self) -> NestedTensor:
        """The module's state in the current invocation."""
        return self.get_invocation_context().state

    def add_summary(self, name: str, value: Any) -> None:
        """Adds a summary (tensor, Summary, or tree) named `name` to the current invocation."""
        self.get_invocation_context().add_summary(name, value)

    def add_state_update(self, name: str, value: Any) -> None:
        """Adds a state update to the current invocation."""
        self.get_invocation_context().add_state_update(name, value)

    def add_module_output(self, name: str, value: Any) -> None:
        """Adds a module output to the current invocation."""
        self.get_invocation_context().add_module_output(name, value)

    def get_module_outputs(self) -> NestedTensor:
        """The module outputs added so far in the current invocation."""
        return self.get_invocation_context().get_module_outputs()

    @no_stack_summary
    def __call__(self, *args, **kwargs) -> Any:
        """Shortcut for `self.forward(*args, **kwargs)`."""
        return self.forward(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# Functional invocation.
# --------------------------------------------------------------------------------------------


def functional(
    module: Module,
    prng_key: Optional[Tensor],
    state: NestedTensor,
    inputs: Union[Sequence[Any], dict[str, Any]],
    *,
    method: str = "forward",
    is_training: bool,
    drop_output_collections: Sequence[str] = ("module_outputs",),
) -> tuple[Any, OutputCollection]:
    """Invokes `module.<method>` as a pure function of its arguments.

    Works under `jax.jit`, `jax.grad`, `jax.vmap` and `jax.lax.scan` (call it inside the
    transformed function).

    Args:
        module: The (root) module to invoke.
        prng_key: The PRNG key, or None if the computation needs no randomness.
        state: The module's state, e.g. parameters from `initialize_parameters_recursively`.
        inputs: Keyword arguments (a dict) or positional arguments (a sequence) of the method.
        method: The method name.
        is_training: Whether to run in training mode.
        drop_output_collections: Names of OutputCollection fields to return empty.

    Returns:
        (method_outputs, output_collection).

    Raises:
        ValueError: If `drop_output_collections` names an unknown collection.
    """
    unknown = set(drop_output_collections) - set(OutputCollection._fields)
    if unknown:
        raise ValueError(f"Unknown output collections {sorted(unknown)}")
    context = InvocationContext(
        name="root",
        parent=None,
        module=module,
        state=state,
        is_training=is_training,
        prng_key=prng_key,
        output_collection=new_output_collection(),
    )
    if isinstance(inputs, dict):
        args, kwargs = (), inputs
    else:
        args, kwargs = tuple(inputs), {}
    # A root context may be entered inside another module's context (e.g. a trainer's loss
    # function calling functional(model) inside functional(learner)): it starts a new tree.
    fn = _Functional(method_fn=getattr(module, method), context=context, require_parent=False)
    outputs, output_collection = fn(*args, **kwargs)
    for name in drop_output_collections:
        getattr(output_collection, name).clear()
    return outputs, output_collection


def scan_in_context(
    fn: Callable,
    *,
    carry: NestedTensor,
    xs: NestedTensor,
    drop_output: Optional[Callable[[str], bool]] = None,
    child_name_prefix: str = "iter",
    unroll: Union[int, bool] = 1,
    remat_kwargs: Optional[dict[str, Any]] = None,
    merge_summaries: bool = False,
) -> tuple[NestedTensor, NestedTensor]:
    """`jax.lax.scan` of `fn(carry, x) -> (carry, y)` in a child context of the current module.

    Iteration i runs in a context whose output collection is stacked by the scan; summaries of
    iteration i end up under `f"{child_name_prefix}{i}"`, module outputs and state updates
    (stacked) under `child_name_prefix`.

    Args:
        fn: The scan body.
        carry: The initial carry.
        xs: A dict with key "xs" (the per-iteration inputs, leading axis N) and optionally other
            context fields per iteration, e.g. "prng_key" ([N] keys) or "state".
        drop_output: Optional predicate over output paths ("summaries/..."); True drops it.
        child_name_prefix: Child name for the iteration outputs.
        unroll: `jax.lax.scan`'s unroll: iterations per loop step (True: all, False: 1).
        remat_kwargs: If set, the scan body is wrapped in `jax.checkpoint(**remat_kwargs)`
            (e.g. dict(policy=...)); `prevent_cse=True` is refused (a scan needs no CSE guard).
        merge_summaries: If True, the iterations' summaries are combined under
            `child_name_prefix` (see `propagate_repeated_output_collections`) instead of being
            kept per iteration.

    Returns:
        (final carry, stacked ys).

    Raises:
        ValueError: Outside an invocation context, or remat_kwargs with prevent_cse=True.
    """
    ctx = current_context()
    if ctx is None:
        raise ValueError(
            "Expected current_context() to be set: scan_in_context() needs a current invocation "
            "context (call it inside functional(...) or a module method)"
        )

    def body(carry_i, scan_i):
        scan_i = dict(scan_i)
        x_i = scan_i.pop("xs")
        collection_i = new_output_collection()
        with child_context(
            child_name_prefix, module=ctx.module, output_collection=collection_i, **scan_i
        ):
            carry_i, y_i = fn(carry_i, x_i)
        if drop_output is not None:
            pruned = prune_tree(collection_i._asdict(), lambda path, _: drop_output(path))
            collection_i = OutputCollection(
                **{k: pruned.get(k, {}) for k in OutputCollection._fields}
            )
        return carry_i, dict(y_i=y_i, output_collection=collection_i)

    if remat_kwargs is not None:
        remat_kwargs = dict(remat_kwargs)
        if remat_kwargs.setdefault("prevent_cse", False):
            raise ValueError(
                "scan_in_context: remat_kwargs prevent_cse=True is not supported inside a scan "
                "(scan already prevents CSE); drop prevent_cse or set it to False."
            )
        body = jax.checkpoint(body, **remat_kwargs)
    carry, ys = jax.lax.scan(body, carry, xs, unroll=unroll)
    propagate_repeated_output_collections(
        ys["output_collection"],
        child_name_prefix=child_name_prefix,
        target_output_collection=ctx.output_collection,
        merge_summaries=merge_summaries,
    )
    return carry, ys["y_i"]
