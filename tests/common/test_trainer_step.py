"""Tests for axlearn/common/trainer_step.py: the XSC steps of `xsc_check_policy`."""

from __future__ import annotations

import jax

from axlearn.common import trainer_step
from axlearn.common.compiler_options import infer_xsc_compiler_options
from axlearn.common.trainer_step import XscSteps


def test_xsc_steps_compile_once_with_the_checker_options_on_tpu(monkeypatch):
    monkeypatch.setattr(trainer_step.jax, "default_backend", lambda: "tpu")
    compiles = []

    def compile_fn(batch, *, compiler_options):
        compiles.append((batch, compiler_options))
        return f"xsc-step-{len(compiles)}"

    xsc = XscSteps(lambda step: step in (2, 4), path="trainer")
    got = [xsc.step_fn(step, "batch", compile_fn=compile_fn) for step in range(1, 6)]
    assert got == [None, "xsc-step-1", None, "xsc-step-1", None]
    expected = infer_xsc_compiler_options(device_kind=jax.devices()[0].device_kind)
    assert compiles == [("batch", expected)]
    assert expected["xla_tpu_enable_sdc_checker"] is True
    assert xsc.checked_steps == [2, 4]


def test_xsc_steps_without_a_policy_or_off_tpu_never_compile(caplog):
    def compile_fn(*args, **kwargs):
        raise AssertionError("compiled")

    for policy in (None, lambda step: True):
        xsc = XscSteps(policy, path="trainer")
        assert [xsc.step_fn(s, None, compile_fn=compile_fn) for s in (1, 2)] == [None, None]
        assert xsc.checked_steps == []
    assert caplog.text.count("trainer.xsc_check_policy is set") == 1
