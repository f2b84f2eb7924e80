"""Tests axlearn/common/step_timer.py: fake clocks, and a real pipelined loop with sleeps."""

import statistics
import time

import jax
import jax.numpy as jnp
import pytest

from axlearn.common.step_timer import StepTimer, StepTimerError


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_intervals_and_overheads_fake_clock():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    timer.start()
    with timer.overhead("compile"):
        clock.advance(3.0)
    with timer.overhead("input"):
        clock.advance(0.01)
    clock.advance(0.2)  # Device time of step 1.
    t1 = timer.end_step(1)
    assert t1.wall_s == pytest.approx(3.21)
    assert t1.overheads == pytest.approx({"compile": 3.0, "input": 0.01})
    assert t1.excluded_reason == "compile"
    assert t1.describe() == "3.210 s (compile 3.000 s, input 0.010 s)"

    clock.advance(0.2)
    t2 = timer.end_step(2)
    assert (t2.wall_s, t2.overheads, t2.excluded_reason) == (pytest.approx(0.2), {}, None)

    # Eval and checkpoint in step 3's interval are charged to step 3 only.
    clock.advance(0.2)
    with timer.overhead("eval"):
        clock.advance(2.0)
        with timer.overhead("summary"):  # Nested: counted once, inside eval.
            clock.advance(0.5)
    timer.add_overhead("checkpoint", 1.0)
    clock.advance(1.0)
    t3 = timer.end_step(3)
    assert t3.wall_s == pytest.approx(3.7)
    assert t3.overheads == pytest.approx({"eval": 2.5, "checkpoint": 1.0})
    assert t3.overhead_s == pytest.approx(3.5)
    assert t3.excluded_reason == "eval"
    clock.advance(0.2)
    t4 = timer.end_step(4)
    assert t4.wall_s == pytest.approx(0.2) and not t4.overheads
    assert t4.to_dict()["step"] == 4


def test_misuse_errors():
    timer = StepTimer(clock=FakeClock())
    with pytest.raises(StepTimerError, match="before start"):
        timer.end_step(0)
    timer.start()
    timer.end_step(5)
    with pytest.raises(StepTimerError, match="must increase"):
        timer.end_step(5)
    with pytest.raises(StepTimerError, match="inside an overhead"):
        with timer.overhead("eval"):
            timer.end_step(6)
    with pytest.raises(ValueError, match="negative"):
        timer.add_overhead("eval", -1.0)


def test_pipelined_loop_charges_sleeps_to_the_paying_step():
    """A real pipelined loop: step N+1 is dispatched before step N's loss is read.

    An eval sleep at step 4 and a checkpoint sleep at step 7 (each after draining the step) must
    show up as those steps' overheads, and no other step may grow by more than the noise.
    """
    sleep_s = 0.5
    margin = 0.5 * sleep_s  # Far above this workload's noise, far below the sleep.
    x = jnp.ones((256, 256), jnp.float32)

    @jax.jit
    def train_step(state):
        for _ in range(3):
            state = jnp.tanh(state @ x / 256.0)
        return state, jnp.mean(state)

    state, loss = train_step(x)  # Compile outside the timed loop.
    loss.block_until_ready()
    timer = StepTimer()
    timer.start()
    timings = {}
    pending = None
    for step in range(1, 11):
        state, loss = train_step(state)
        if pending is not None:
            float(pending[1])  # Host sync on step N-1's loss while step N runs.
            timings[pending[0]] = timer.end_step(pending[0])
        pending = (step, loss)
        if step in (4, 7):
            float(loss)  # Drain: step N is done before its overhead is measured.
            with timer.overhead("eval" if step == 4 else "checkpoint"):
                time.sleep(sleep_s)
    float(pending[1])
    timings[pending[0]] = timer.end_step(pending[0])

    assert timings[4].overheads["eval"] == pytest.approx(sleep_s, rel=0.1)
    assert timings[7].overheads["checkpoint"] == pytest.approx(sleep_s, rel=0.1)
    assert timings[4].excluded_reason == "eval" and timings[7].excluded_reason == "checkpoint"
    clean = [t.wall_s for s, t in timings.items() if s not in (4, 7)]
    typical = statistics.median(clean)
    for s in (4, 7):
        assert timings[s].wall_s >= sleep_s
        assert timings[s].wall_s - timings[s].overhead_s < typical + margin
    for s, t in timings.items():
        if s not in (4, 7):
            assert not t.overheads
            assert t.wall_s < typical + margin, (s, t.wall_s, typical)
