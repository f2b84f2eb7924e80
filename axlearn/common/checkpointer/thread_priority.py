"""Lowers the CPU priority of the threads that write a checkpoint in the background.

On a CPU-only machine the training step already keeps every core busy, so whatever CPU a save
takes (copies into the write buffers, checksums, writes) comes out of training time. Running the
save's threads at a higher niceness lets the kernel give them the cores' idle moments first and
training the rest; the save takes a little longer in wall time, which the trainer does not wait
for. The checkpoint writer thread and each chunk-writer pool thread renice themselves (the
caller's thread never is). Linux only (per-thread niceness); elsewhere it does nothing.
"""

from __future__ import annotations

import os
import threading


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
