"""Readable stack summaries for exceptions raised inside wrapped calls.

An exception raised under a function decorated with `wrap` gets a `_stack_summary` attribute:
an `_InContextException` whose text is the traceback without the frames marked
`@no_stack_summary`, without the frames JAX hides, and without this module's own wrappers, where
frames can carry annotations (e.g. "Wrapped call my_module.Layer.forward(Tensor)" for a module
method called with given argument types). The exception itself is re-raised unchanged (code that
catches it sees the original type); only the process's `sys.excepthook`, replaced when this
module is imported, prints the summary (chained after the original traceback) instead.

    @traceback_util.wrap
    def run():
        step()                      # A failure here prints a summary when uncaught.

    @no_stack_summary
    def step():                     # Left out of the summary (its callees are kept).
        annotate_stack(module_call=True, module_type=Layer, method_name="forward",
                       arg_types=[int], kwarg_types={})(layer.forward)(3)

Annotations: `annotate_stack(**aux)(fn)` returns a function whose call frame carries `aux`;
`_walk_annotated_tb(tb)` yields `(frame, aux)` for each real frame of a traceback, `aux` merged
from the contiguous annotation frames just above it (the innermost decorator wins on a clash).
Keys read by the summary: `include_stack_summary` (bool), and `module_call`, `module_type`,
`method_name`, `arg_types`, `kwarg_types` for the "Wrapped call" lines.

`AXLEARN_ENABLE_STACK_SUMMARY=false` turns `wrap` and `annotate_stack` into no-ops (checked when
they decorate); any value but "true" or "false" is an error.
"""

from __future__ import annotations

import builtins
import functools
import linecache
import os
import sys
import traceback
import types
from collections.abc import Iterator
from typing import Any, Callable, Optional

_ENV = "AXLEARN_ENABLE_STACK_SUMMARY"
_THIS_FILE = os.path.abspath(__file__).removesuffix("c")


def is_stack_summary_enabled() -> bool:
    """Returns whether stack summaries are on (`AXLEARN_ENABLE_STACK_SUMMARY`, default "true").

    Returns:
        True unless the variable is "false".

    Raises:
        ValueError: If the variable is set to anything but "true" or "false".
    """
    value = os.environ.get(_ENV, "true")
    if value not in ("true", "false"):
        raise ValueError(f"{_ENV} must be 'true', 'false' or unset, got {value!r}.")
    return value == "true"


def _annotated(aux: dict[str, Any], fn: Callable) -> Callable:
    """Returns `fn` called through a frame whose local `aux_` holds `aux`.

    Every wrapper made here shares one code object, which is how annotation frames are told
    apart from other frames (a traceback gives frames, never the functions).
    """

    @functools.wraps(fn)
    def stack_annotation_wrapper(*args, **kwargs):
        aux_ = aux  # noqa: F841 (read from the frame's locals by _walk_annotated_tb)
        return fn(*args, **kwargs)

    return stack_annotation_wrapper


_ANNOTATION_CODE = _annotated({}, lambda: None).__code__


def annotate_stack(**aux) -> Callable[[Callable], Callable]:
    """Returns a decorator whose functions' calls carry the annotations `aux`.

    Args:
        **aux: The annotations (see the module docstring for the keys the summary reads).

    Returns:
        The decorator (the identity when stack summaries are disabled).
    """
    if not is_stack_summary_enabled():
        return lambda fn: fn
    return functools.partial(_annotated, dict(aux))


def no_stack_summary(fn: Callable) -> Callable:
    """Marks `fn` so that its frames are left out of stack summaries (not of raw tracebacks).

    Args:
        fn: The function.

    Returns:
        The marked function.
    """
    return annotate_stack(include_stack_summary=False)(fn)


def _is_annotation_frame(frame: types.FrameType) -> bool:
    """Returns whether `frame` is the frame of a wrapper made by `annotate_stack`.

    Args:
        frame: A frame.

    Returns:
        Whether it is an annotation frame.
    """
    return frame.f_code is _ANNOTATION_CODE


def _walk_annotated_tb(tb: Optional[types.TracebackType]) -> Iterator[tuple[Any, dict]]:
    """Yields `(frame, aux)` for the frames of `tb` that are not annotation frames.

    `aux` merges, outermost first, the annotations of the contiguous annotation frames right
    above the frame (an empty dict if there are none).

    Args:
        tb: A traceback (None yields nothing).

    Returns:
        An iterator of (frame, aux) pairs, outermost frame first.
    """
    pending: dict[str, Any] = {}
    for frame, _ in traceback.walk_tb(tb):
        if _is_annotation_frame(frame):
            pending.update(frame.f_locals["aux_"])
            continue
        yield frame, pending
        pending = {}


def _qualified_name(cls: Any) -> str:
    name = getattr(cls, "__qualname__", repr(cls))
    module = getattr(cls, "__module__", "builtins")
    return name if module == "builtins" else f"{module}.{name}"


def _hide_jax_frames(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """`tb` without the frames JAX filters from its own tracebacks (if JAX offers that)."""
    try:
        from jax._src import traceback_util as jax_traceback_util  # pylint: disable=import-outside-toplevel
    except ImportError:  # pragma: no cover
        return tb
    return jax_traceback_util.filter_traceback(tb)


class _InContextException(Exception):
    """The stack summary of an exception (its `__cause__`) raised inside a `wrap`ped call."""

    @classmethod
    def wrap(cls, fn: Callable) -> Callable:
        """Returns `fn` such that an exception escaping it gets `_stack_summary` set.

        Only the outermost such wrapper on the stack sets it: nested wrapped calls do nothing.

        Args:
            fn: The function.

        Returns:
            The wrapped function.
        """

        @no_stack_summary
        @functools.wraps(fn)
        def in_context_exception_wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                here = sys._getframe()  # pylint: disable=protected-access
                outer = here.f_back
                while outer is not None and outer.f_code is not here.f_code:
                    outer = outer.f_back
                if outer is None and not hasattr(e, "_stack_summary"):
                    e._stack_summary = cls.of(e)  # pylint: disable=protected-access
                raise

        return in_context_exception_wrapper

    @classmethod
    def of(cls, cause: BaseException) -> _InContextException:
        """Returns the summary of `cause` (its traceback is read when the summary is printed).

        Args:
            cause: The exception.

        Returns:
            The summary exception, chained to `cause`.
        """
        summary = cls()
        summary.__cause__ = cause
        summary.__suppress_context__ = True
        return summary

    def __str__(self) -> str:
        return (
            "\n\nAn exception was raised in a wrapped call; above is its raw traceback, below a "
            "summary without the frames marked @no_stack_summary or hidden by JAX, with the "
            "argument types of annotated module calls.\n\n" + self._format_summary()
        )

    def _format_summary(self) -> str:
        """Returns the summary text: the kept frames, then the exception's own lines."""
        cause = self.__cause__
        lines = ["Stack Summary (most recent call last):"]
        for frame, aux in _walk_annotated_tb(_hide_jax_frames(cause.__traceback__)):
            code = frame.f_code
            if aux.get("module_call", False):
                arg_names = [_qualified_name(t) for t in aux.get("arg_types", ())]
                arg_names += [
                    f"{k}: {_qualified_name(t)}" for k, t in aux.get("kwarg_types", {}).items()
                ]
                lines.append(
                    f"  Wrapped call {_qualified_name(aux['module_type'])}."
                    f"{aux['method_name']}({', '.join(arg_names)})"
                )
            if not aux.get("include_stack_summary", True):
                continue
            if os.path.abspath(code.co_filename) == _THIS_FILE:
                continue  # This module's own wrappers.
            lineno = frame.f_lineno
            lines.append(f'  File "{code.co_filename}", line {lineno}, in {code.co_name}')
            lines.append("    " + linecache.getline(code.co_filename, lineno).strip())
        lines.append("".join(traceback.format_exception_only(type(cause), cause)).rstrip("\n"))
        return "\n".join(lines)


def wrap(fn: Callable) -> Callable:
    """Returns `fn` such that an exception escaping it carries a stack summary.

    The exception is re-raised unchanged, with `_stack_summary` (an `_InContextException`) set
    by the outermost wrapped call on the stack; the excepthook this module installs prints it.

    Args:
        fn: The function.

    Returns:
        The wrapped function (`fn` itself when stack summaries are disabled).
    """
    if not is_stack_summary_enabled():
        return fn
    return _InContextException.wrap(fn)


def _excepthook(
    type: builtins.type[BaseException],  # noqa: A002 (sys.excepthook's signature)
    value: BaseException,
    traceback: Optional[types.TracebackType],  # pylint: disable=redefined-outer-name
    old_excepthook: Callable = sys.excepthook,
) -> Any:
    """Prints `value`'s stack summary (with `value` chained above it) if it has one.

    Args:
        type: The exception's type.
        value: The exception.
        traceback: Its traceback.
        old_excepthook: The hook that prints (by default `sys.excepthook` at import time).

    Returns:
        What `old_excepthook` returns.
    """
    summary = getattr(value, "_stack_summary", None)
    if summary is not None:
        return old_excepthook(builtins.type(summary), summary, summary.__traceback__)
    return old_excepthook(type, value, traceback)


sys.excepthook = _excepthook
