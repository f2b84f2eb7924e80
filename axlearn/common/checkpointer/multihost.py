"""Cross-process coordination for checkpoints through jax.distributed's key-value store.

Barriers and broadcasts here run from any thread (they make no device computation), so the
background save thread can use them while the training loop keeps the devices busy. A barrier
that times out names the processes that never arrived.
"""

from __future__ import annotations

import time
from typing import Optional

import jax


class BarrierTimeoutError(TimeoutError):
    """Some processes did not reach a checkpoint barrier within the time-out."""


def _client():
    from jax._src import distributed  # pylint: disable=import-outside-toplevel

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError(
            "jax.process_count() > 1 but jax.distributed is not initialized: call "
            "jax.distributed.initialize() before using the checkpointer."
        )
    return client


def _arrived(client, name: str) -> set[int]:
    prefix = f"{name}/arrived/"
    try:
        entries = client.key_value_dir_get(prefix)
    except Exception:  # pylint: disable=broad-except
        return set()
    result = set()
    for key, _ in entries:
        tail = key.rsplit("/", 1)[-1]
        if tail.isdigit():
            result.add(int(tail))
    return result


def _timeout_error(client, name: str, timeout_s: float, what: str) -> BarrierTimeoutError:
    arrived = _arrived(client, name)
    missing = [p for p in range(jax.process_count()) if p not in arrived]
    if missing:
        who = ", ".join(f"process {p}" for p in missing)
        return BarrierTimeoutError(
            f"Checkpoint barrier {name!r} ({what}) timed out after {timeout_s:.1f}s on process "
            f"{jax.process_index()}: {who} did not arrive (of {jax.process_count()} processes)."
        )
    return BarrierTimeoutError(
        f"Checkpoint barrier {name!r} ({what}) timed out after {timeout_s:.1f}s on process "
        f"{jax.process_index()}: every process arrived but process 0 did not release the barrier."
    )


def barrier(name: str, *, timeout_s: float, what: str = "") -> None:
    """Blocks until every process has called `barrier(name)`, or raises after `timeout_s`.

    Single-process runs return at once. `name` must be unique per use and identical on all
    processes.

    Args:
        name: The barrier name.
        timeout_s: Seconds to wait.
        what: A short description for the error message (e.g. "shards written, step 100").

    Raises:
        BarrierTimeoutError: Naming the processes that did not arrive.
    """
    if jax.process_count() == 1:
        return
    client = _client()
    me = jax.process_index()
    deadline = time.monotonic() + timeout_s
    client.key_value_set(f"{name}/arrived/{me}", "1")

    def remaining_ms() -> int:
        return max(1, int((deadline - time.monotonic()) * 1000))

    try:
        if me == 0:
            for p in range(jax.process_count()):
                client.blocking_key_value_get(f"{name}/arrived/{p}", remaining_ms())
            client.key_value_set(f"{name}/released", "1")
        else:
            client.blocking_key_value_get(f"{name}/released", remaining_ms())
    except Exception as e:  # pylint: disable=broad-except
        if isinstance(e, BarrierTimeoutError):
            raise
        raise _timeout_error(client, name, timeout_s, what) from e


def delete_keys(prefix: str) -> None:
    """Deletes the key-value store entries under `prefix` (process 0 only; best effort).

    Call only once every process is past the barriers that use them.

    Args:
        prefix: A barrier name or key prefix.
    """
    if jax.process_count() == 1 or jax.process_index() != 0:
        return
    try:
        _client().key_value_delete(prefix)
    except Exception:  # pylint: disable=broad-except
        pass


def broadcast_from_process_0(name: str, value: Optional[str], *, timeout_s: float) -> str:
    """Returns process 0's `value` on every process.

    Args:
        name: A key unique per use, identical on all processes.
        value: The value (used on process 0 only).
        timeout_s: Seconds the other processes wait for it.

    Returns:
        Process 0's value.

    Raises:
        BarrierTimeoutError: If process 0 did not publish the value in time.
    """
    if jax.process_count() == 1:
        assert value is not None
        return value
    client = _client()
    if jax.process_index() == 0:
        assert value is not None
        client.key_value_set(f"{name}/value", value)
        return value
    try:
        return client.blocking_key_value_get(f"{name}/value", max(1, int(timeout_s * 1000)))
    except Exception as e:  # pylint: disable=broad-except
        raise BarrierTimeoutError(
            f"Process 0 did not publish {name!r} within {timeout_s:.1f}s"
        ) from e
