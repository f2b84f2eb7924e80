"""Tests axlearn/common/traceback_util.py: annotations, summaries and the excepthook."""

import os
import subprocess
import sys
import textwrap
import unittest.mock

import pytest

from axlearn.common import traceback_util
from axlearn.common.traceback_util import (
    _walk_annotated_tb,
    annotate_stack,
    no_stack_summary,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _caught(fn):
    try:
        fn()
    except Exception as e:  # pylint: disable=broad-exception-caught
        return e
    raise AssertionError("no exception")


def test_walk_merges_contiguous_annotations_innermost_last():
    @annotate_stack(a=1, b=1)
    @annotate_stack(a=2)
    def outer():
        inner()

    def inner():
        raise RuntimeError("x")

    e = _caught(outer)
    walked = [(frame.f_code.co_name, aux) for frame, aux in _walk_annotated_tb(e.__traceback__)]
    # The annotation wrappers are not yielded; `inner` has no annotations of its own.
    assert walked[-2:] == [("outer", dict(a=2, b=1)), ("inner", {})]
    assert all(name != "stack_annotation_wrapper" for name, _ in walked)


def test_summary_drops_no_stack_summary_frames_and_shows_module_calls():
    class Layer:
        def forward(self, x, *, y):
            raise ValueError(f"bad {x} {y}")

    layer = Layer()

    @traceback_util.wrap
    def run():
        helper()

    @no_stack_summary
    def helper():
        call = annotate_stack(
            module_call=True,
            module_type=Layer,
            method_name="forward",
            arg_types=[int],
            kwarg_types=dict(y=str),
        )(lambda: layer.forward(3, y="z"))
        call()

    e = _caught(run)
    assert isinstance(e, ValueError)  # The original exception, unchanged.
    summary = e._stack_summary._format_summary()
    lines = summary.splitlines()
    assert lines[0] == "Stack Summary (most recent call last):"
    assert lines[-1] == "ValueError: bad 3 z"
    assert "in run" in summary and "in forward" in summary
    assert "in helper" not in summary
    assert "in_context_exception_wrapper" not in summary
    assert "stack_annotation_wrapper" not in summary
    qualname = f"{__name__}.{Layer.__qualname__}"
    assert f"  Wrapped call {qualname}.forward(int, y: str)" in lines
    # The "Wrapped call" line comes right before the annotated frame (the lambda).
    index = lines.index(f"  Wrapped call {qualname}.forward(int, y: str)")
    assert "in <lambda>" in lines[index + 1]
    assert summary in str(e._stack_summary)


def test_only_the_outermost_wrapper_builds_the_summary():
    made = []
    original = traceback_util._InContextException.of

    def recording_of(cause):
        made.append(cause)
        return original(cause)

    @traceback_util.wrap
    def outer():
        middle()

    @traceback_util.wrap
    def middle():
        raise KeyError("k")

    with unittest.mock.patch.object(traceback_util._InContextException, "of", recording_of):
        e = _caught(outer)
    assert len(made) == 1
    assert "in outer" in e._stack_summary._format_summary()


def test_disabled_by_environment(monkeypatch):
    def fn():
        pass

    monkeypatch.setenv("AXLEARN_ENABLE_STACK_SUMMARY", "false")
    assert traceback_util.wrap(fn) is fn
    assert annotate_stack(a=1)(fn) is fn
    monkeypatch.setenv("AXLEARN_ENABLE_STACK_SUMMARY", "yes")
    with pytest.raises(ValueError, match="AXLEARN_ENABLE_STACK_SUMMARY must be"):
        traceback_util.is_stack_summary_enabled()


def test_excepthook_prints_the_summary_when_there_is_one():
    hook = unittest.mock.MagicMock()
    e = RuntimeError("plain")
    traceback_util._excepthook(RuntimeError, e, None, hook)
    hook.assert_called_once_with(RuntimeError, e, None)
    summary = traceback_util._InContextException.of(e)
    e._stack_summary = summary
    traceback_util._excepthook(RuntimeError, e, None, hook)
    hook.assert_called_with(traceback_util._InContextException, summary, None)


def test_an_uncaught_exception_prints_raw_traceback_then_summary():
    script = textwrap.dedent(
        """
        from axlearn.common import traceback_util

        @traceback_util.wrap
        def top():
            hidden()

        @traceback_util.no_stack_summary
        def hidden():
            bottom()

        def bottom():
            raise ZeroDivisionError("boom")

        top()
        """
    )
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, AXLEARN_ENABLE_STACK_SUMMARY="true")
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 1
    err = result.stderr
    raw, _, summary = err.partition("Stack Summary (most recent call last):")
    assert "in hidden" in raw  # The raw traceback keeps every frame.
    assert "The above exception was the direct cause" in raw
    assert "in top" in summary and "in bottom" in summary
    assert "in hidden" not in summary
    assert summary.rstrip().endswith("ZeroDivisionError: boom")


def test_module_method_errors_carry_a_summary_naming_the_calls():
    """An exception in a module method called through `functional` gets a stack summary that
    names each wrapped module call with its argument types and leaves out module.py's context
    plumbing; the exception itself is unchanged."""
    # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp

    from axlearn.common.base_layer import BaseLayer
    from axlearn.common.config import config_class
    from axlearn.common.module import functional

    class _Inner(BaseLayer):
        def forward(self, x):
            raise ValueError(f"bad input of shape {x.shape}")

    class _Outer(BaseLayer):
        @config_class
        class Config(BaseLayer.Config):
            """Configures _Outer."""

        def __init__(self, cfg, *, parent):
            super().__init__(cfg, parent=parent)
            self._add_child("inner", _Inner.default_config())

        def forward(self, x, *, scale):
            return self.inner(x * scale)

    layer = _Outer.default_config().set(name="outer").instantiate(parent=None)
    e = _caught(
        lambda: functional(
            layer, None, {}, dict(x=jnp.ones(2), scale=2.0), is_training=False, method="forward"
        )
    )
    assert isinstance(e, ValueError) and str(e) == "bad input of shape (2,)"
    text = str(e._stack_summary)  # pylint: disable=protected-access
    outer_call = f"Wrapped call {_Outer.__module__}.{_Outer.__qualname__}.forward("
    inner_call = f"Wrapped call {_Inner.__module__}.{_Inner.__qualname__}.forward("
    assert outer_call in text and inner_call in text
    assert text.index(outer_call) < text.index(inner_call)
    assert "scale: float" in text
    # Below the first module call, only the methods' own frames remain (no context plumbing,
    # thunks or `Module.__call__`).
    below = text[text.index(outer_call) :]
    assert "_call_method_in_context" not in text and "module.py" not in below
    assert below.count('File "') == 2
    assert text.rstrip().endswith("ValueError: bad input of shape (2,)")
