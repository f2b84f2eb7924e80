"""Array checkpoint serialization with bounded host memory (AXLearn's `array_serialization`).

`BoundedDataShardedAsyncCheckpointManager` is JAX's `GlobalAsyncCheckpointManager` with a bound
on the bytes being written at once: arrays are written in groups of at most
`max_concurrent_gb` GiB of this process's shards; each group's writes finish before the next
group starts, and the last group completes in the background like JAX's manager. Replicated
shards are written once (by replica 0), as in JAX's manager; `max_data_shard_degree` is accepted
and checked but writes are not yet spread over replicas.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

import jax
from jax.experimental.array_serialization import serialization
from jax.experimental.array_serialization import tensorstore_impl as ts_impl


def _local_bytes(x: Any) -> int:
    if isinstance(x, jax.Array):
        return sum(shard.data.nbytes for shard in x.addressable_shards if shard.replica_id == 0)
    return getattr(x, "nbytes", 0)


class BoundedDataShardedAsyncCheckpointManager(serialization.GlobalAsyncCheckpointManager):
    """JAX's async checkpoint manager with a bound on concurrently written bytes."""

    def __init__(
        self,
        *,
        max_concurrent_gb: Optional[float] = None,
        timeout_secs: int = 300,
        max_data_shard_degree: Optional[int] = None,
        shard_threshold_bytes: Optional[int] = None,
    ):
        """Builds the manager.

        Args:
            max_concurrent_gb: GiB of this process's shards written at once; None: unbounded.
            timeout_secs: Seconds to wait for the other processes at commit.
            max_data_shard_degree: -1 or >= 1 (see the module docstring); None: JAX's default.
            shard_threshold_bytes: Arrays smaller than this are not data-sharded; None: all.

        Raises:
            ValueError: If a limit is not positive.
        """
        super().__init__(timeout_secs)
        if max_concurrent_gb is not None and max_concurrent_gb <= 0:
            raise ValueError(
                f"max_concurrent_gb must be strictly positive, got {max_concurrent_gb}"
            )
        if max_data_shard_degree is not None and (
            max_data_shard_degree == 0 or max_data_shard_degree < -1
        ):
            raise ValueError(
                f"max_data_shard_degree must be -1 or >= 1, got {max_data_shard_degree}"
            )
        self._max_concurrent_bytes = (
            None if max_concurrent_gb is None else int(max_concurrent_gb * 2**30)
        )
        self._max_data_shard_degree = max_data_shard_degree
        self._shard_threshold_bytes = shard_threshold_bytes

    def _groups(self, arrays: list, specs: list) -> list[list[tuple[Any, Any]]]:
        groups: list[list[tuple[Any, Any]]] = [[]]
        used = 0
        for array, spec in zip(arrays, specs):
            size = _local_bytes(array)
            limit = self._max_concurrent_bytes
            if limit is not None and groups[-1] and used + size > limit:
                groups.append([])
                used = 0
            groups[-1].append((array, spec))
            used += size
        return groups

    def serialize(
        self,
        arrays,
        tensorstore_specs,
        *,
        on_commit_callback: Optional[Callable[[], None]] = None,
        transaction: Any = None,
    ):
        """Writes `arrays` to `tensorstore_specs` group by group (see the class docstring)."""
        if self._max_concurrent_bytes is None:
            return super().serialize(
                arrays,
                tensorstore_specs,
                on_commit_callback=on_commit_callback,
                transaction=transaction,
            )
        self.wait_until_finished()
        groups = self._groups(list(arrays), list(tensorstore_specs))
        for i, group in enumerate(groups):
            commit_futures: list = []

            async def run(group=group, commit_futures=commit_futures):
                await asyncio.gather(
                    *(
                        ts_impl.async_serialize(
                            array, spec, commit_future=commit_futures, transaction=transaction
                        )
                        for array, spec in group
                    )
                )

            asyncio.run(run())
            if i < len(groups) - 1:
                for future in commit_futures:
                    future.result()
            else:
                self._add_futures(commit_futures)
        self._start_async_commit(on_commit_callback)
