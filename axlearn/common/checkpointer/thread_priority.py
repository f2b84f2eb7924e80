"""Lowers the CPU priority of the threads that write a checkpoint in the background.

On a CPU-only machine the training step already keeps every core busy, so whatever CPU a save
takes (TensorStore's copies and writes, checksums) comes out of training time. Running the
save's threads at a higher niceness lets the kernel give them the cores' idle moments first and
training the rest; the save takes a little longer in wall time, which the trainer does not wait
for. Linux only (per-thread niceness via /proc); elsewhere it does nothing.
"""

from __future__ import annotations

import os
import threading

# TensorStore's worker threads (its file I/O and data-copy pools) have this name.
TENSORSTORE_THREAD_NAME = "ts_pool_worker"


def _thread_ids_named(name: str) -> list[int]:
    tids = []
    try:
        entries = os.listdir("/proc/self/task")
    except OSError:
        return tids
    for tid in entries:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                if f.read().strip() == name:
                    tids.append(int(tid))
        except OSError:  # The thread exited meanwhile.
            continue
    return tids


def lower_current_thread_priority(niceness: int) -> bool:
    """Raises the calling thread's niceness to `niceness` (never lowers it).

    Args:
        niceness: The niceness, 0..19; 0 does nothing.

    Returns:
        Whether the niceness was changed.
    """
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return False
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
            return True
    except OSError:  # No per-thread niceness on this platform.
        pass
    return False


def lower_writer_priority(niceness: int) -> list[int]:
    """Sets `niceness` on the calling thread and on TensorStore's worker threads.

    Call it from the checkpoint writer thread at the start of each write (TensorStore creates
    its threads lazily). Only raises niceness (lowers priority); threads already at `niceness` or
    higher are left alone.

    Args:
        niceness: The niceness, 0..19; 0 does nothing.

    Returns:
        The thread ids whose niceness was changed.
    """
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return []
    changed = []
    for tid in [threading.get_native_id(), *_thread_ids_named(TENSORSTORE_THREAD_NAME)]:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
                changed.append(tid)
        except OSError:  # The thread exited, or the platform has no per-thread niceness.
            continue
    return changed
