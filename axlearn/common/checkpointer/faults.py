"""Deterministic fault injection into checkpoint saves, for crash-safety tests.

Set in the environment of the process to fault:

- `AXLEARN_CHECKPOINT_FAULT=<point>` or `<point>@<step>`: the point of the save (optionally only
  the save of that step) at which the fault fires. Points, in the order a save reaches them:
  `before_arrays` (directories prepared, no array written), `mid_arrays` (about half of this
  process's chunks written), `after_arrays` (all of this process's arrays written, index not yet
  written), `after_index` (index written: the step is committed). Saves whose snapshot has device
  copies (snapshot "device" or "partial") also reach, between `before_arrays` and `mid_arrays`,
  `mid_transfer` (about half of the device copies' shards moved to the host) and
  `after_transfer` (every device copy on the host and released, nothing written yet).
- `AXLEARN_CHECKPOINT_FAULT_ACTION=kill|hang|raise` (default `kill`): `kill` sends SIGKILL to
  the process itself (a crash: no clean-up runs), `hang` blocks the saving thread forever (a
  stuck process), `raise` raises `InjectedFault` (for in-process tests).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Optional

from absl import logging

FAULT_ENV = "AXLEARN_CHECKPOINT_FAULT"
FAULT_ACTION_ENV = "AXLEARN_CHECKPOINT_FAULT_ACTION"
FAULT_POINTS = ("before_arrays", "mid_arrays", "after_arrays", "after_index")
# Points reached only by saves that move device copies to the host (see the module docstring).
TRANSFER_FAULT_POINTS = ("mid_transfer", "after_transfer")
FAULT_ACTIONS = ("kill", "hang", "raise")


class InjectedFault(RuntimeError):
    """Raised at a fault point when the action is `raise`."""


def _parse(spec: str) -> tuple[str, Optional[int]]:
    point, _, step = spec.partition("@")
    if point not in FAULT_POINTS + TRANSFER_FAULT_POINTS:
        raise ValueError(
            f"{FAULT_ENV}={spec!r}: the point must be one of {FAULT_POINTS + TRANSFER_FAULT_POINTS}"
        )
    if step and not step.isdigit():
        raise ValueError(f"{FAULT_ENV}={spec!r}: the step after '@' must be an integer")
    return point, (int(step) if step else None)


def configured_fault() -> Optional[tuple[str, Optional[int], str]]:
    """Returns (point, step or None, action) from the environment, or None when unset.

    Raises:
        ValueError: On a malformed setting.
    """
    spec = os.environ.get(FAULT_ENV, "").strip()
    if not spec:
        return None
    point, step = _parse(spec)
    action = os.environ.get(FAULT_ACTION_ENV, "kill").strip() or "kill"
    if action not in FAULT_ACTIONS:
        raise ValueError(f"{FAULT_ACTION_ENV}={action!r}: must be one of {FAULT_ACTIONS}")
    return point, step, action


def maybe_inject_fault(point: str, *, step: int) -> None:
    """Fires the configured fault if it names `point` (and `step`, when it names one).

    Args:
        point: One of `FAULT_POINTS` or `TRANSFER_FAULT_POINTS`.
        step: The step being saved.

    Raises:
        InjectedFault: When the configured action is `raise`.
    """
    assert point in FAULT_POINTS + TRANSFER_FAULT_POINTS, point
    fault = configured_fault()
    if fault is None:
        return
    fault_point, fault_step, action = fault
    if fault_point != point or (fault_step is not None and fault_step != step):
        return
    logging.warning("Injecting checkpoint fault %r at %s of step %d.", action, point, step)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "hang":
        threading.Event().wait()
    raise InjectedFault(f"Injected checkpoint fault at {point} of step {step}")
