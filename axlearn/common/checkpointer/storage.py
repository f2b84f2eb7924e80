"""State storages: how a checkpointer writes and reads the state of one step directory."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import time
import zlib
from typing import Any, Callable, Optional

import jax
from absl import logging

from axlearn.common.checkpointer import (
    host_transfer,
    layout,
    snapshot_choice,
    state_tree,
    tensorstore_restore,
    tensorstore_save,
    thread_priority,
)
from axlearn.common.checkpointer.tensorstore_restore import CheckpointValidationType
from axlearn.common.checkpointer.tensorstore_save import SaveResult
from axlearn.common.config import Configurable, InstantiableConfig, config_class

# Host staging budget when `max_concurrent_gb` is None.
_DEFAULT_CONCURRENT_GB = 1.0


@dataclasses.dataclass
class SaveStats:
    """What a `save` call cost its caller (returned as soon as `save` returns).

    Attributes:
        step: The step saved.
        blocking_s: Seconds the caller was blocked in `save`, everything included: charge this
            to the step that called it.
        wait_for_previous_s: Part of `blocking_s` spent waiting for the previous save to finish
            (at most one save is in flight).
        snapshot_s: Part of `blocking_s` spent taking the snapshot (device-to-host copy, or
            dispatching the on-device copy).
        snapshot: Where the snapshot lives until its bytes are on the host: "device",
            "partial", "host", or "reference" (no copy: the caller's arrays, see `alias_arrays`).
        num_bytes: Bytes of array data this process writes.
        host_bytes: Upper bound of host memory this save holds on this process.
        async_save: Whether the write continues in the background.
        choice: The snapshot choice in effect (None for "reference" saves), with its numbers.
        previous: The previous save's result (its write time and throughput), if it finished
            since the last `save`/`wait_until_finished` collected it.
        waited: Whether this save had to wait for the previous save's write to end (then
            `wait_for_previous_s` is that wait, and `previous.write_gb_per_s` says how fast the
            disk took it: saves come more often than the disk writes them).
    """

    step: int
    blocking_s: float
    wait_for_previous_s: float
    snapshot_s: float
    snapshot: str
    num_bytes: int
    host_bytes: int
    async_save: bool
    choice: Optional[snapshot_choice.SnapshotChoice] = None
    previous: Optional[SaveResult] = None
    waited: bool = False

    @property
    def other_s(self) -> float:
        """The rest of `blocking_s`: neither waiting for the previous save nor the snapshot."""
        return max(0.0, self.blocking_s - self.wait_for_previous_s - self.snapshot_s)

    def describe_wait(self) -> str:
        """'' if the save did not wait; else what it waited for and the write's throughput."""
        if not self.waited or self.previous is None:
            return ""
        prev = self.previous
        return (
            f"waited {self.wait_for_previous_s:.3f}s for the previous save's write (step "
            f"{prev.step}: {prev.num_bytes / 1e9:.3f} GB in {prev.write_s:.2f}s, "
            f"{prev.write_gb_per_s:.2f} GB/s): saves come more often than the disk writes them"
        )


class StateStorage(Configurable):
    """Writes and reads the state of one step directory."""

    def save_to_dir(
        self,
        *,
        step: int,
        state: Any,
        ckpt_dir: str,
        on_commit_callback: Optional[Callable[[int, str], None]] = None,
        async_save: bool = True,
        precondition: Optional[Callable[[], None]] = None,
        alias_arrays: bool = False,
    ) -> SaveStats:
        """Saves `state` into `ckpt_dir`; with `async_save`, the write finishes in the background.

        Args:
            step: The step.
            state: The state tree.
            ckpt_dir: The step directory.
            on_commit_callback: Called as `(step, ckpt_dir)` on process 0 after the commit.
            async_save: Whether to return before the write is done.
            precondition: Called before anything is written (in the background for async saves);
                if it raises, the save writes nothing and fails with that error.
            alias_arrays: If True, take no snapshot copy: the save reads the state's jax.Arrays
                while it writes, and the caller must not donate or modify them afterwards.

        Returns:
            The cost to the caller.
        """
        raise NotImplementedError(type(self))

    def choose_snapshot(
        self, state: Any, *, step_peak_bytes: Optional[int] = None
    ) -> Optional[snapshot_choice.SnapshotChoice]:
        """Chooses where the snapshots of `state` live, for this and later saves.

        Args:
            state: The state tree to be saved (arrays or ShapeDtypeStructs with shardings).
            step_peak_bytes: The train step's peak memory per device (compiled memory analysis).

        Returns:
            The choice, or None if this storage does not choose.
        """
        del state, step_peak_bytes
        return None

    def device_snapshot_bytes(self) -> int:
        """Bytes the save in flight holds on the fullest device (0 once on the host)."""
        return 0

    def prepare_host_transfer(self, state: Any) -> int:
        """Sets up, before training, what the first save's move to host memory would allocate.

        Args:
            state: The state tree to be saved (jax.Arrays), after `choose_snapshot`.

        Returns:
            The bytes moved to set it up (0: nothing to do).
        """
        del state
        return 0

    def wait_until_finished(self) -> Optional[SaveResult]:
        """Waits for the save in flight, if any; re-raises its error.

        Returns:
            The result of the save that finished, or None if none was in flight.
        """
        raise NotImplementedError(type(self))

    def writing_dir(self) -> Optional[str]:
        """The step directory being written, if any."""
        raise NotImplementedError(type(self))

    def restore_from_dir(
        self,
        step: int,
        state: Any,
        *,
        ckpt_dir: str,
        validation: CheckpointValidationType = CheckpointValidationType.EXACT,
        index: Optional[dict] = None,
    ) -> Any:
        """Restores the state saved in `ckpt_dir` into the structure/shardings of `state`.

        Args:
            step: The step (checked against the index).
            state: The target tree.
            ckpt_dir: The committed step directory.
            validation: How strictly `state` must match the checkpoint: EXACT (default),
                EXACT_UP_TO_DTYPE (values cast to the target dtypes), CONTAINS_STATE (the
                checkpoint may hold more leaves) or CONTAINS_STATE_UP_TO_DTYPE.
            index: Its parsed index, if already read.

        Returns:
            The restored tree.
        """
        raise NotImplementedError(type(self))


class TensorStoreStateStorage(StateStorage):
    """One zarr array per array leaf (TensorStore's format), a CRC-32 per chunk, `index` last.

    See `axlearn.common.checkpointer.tensorstore_save` and `...tensorstore_restore`.
    """

    @config_class
    class Config(StateStorage.Config):
        """Configures TensorStoreStateStorage."""

        # Time-out in seconds of each cross-process barrier and each chunk write or read.
        timeout_secs: float = 3600
        # Max GB of host buffers a save holds while moving a device snapshot to the host and
        # writing it (in pieces if the state is larger), and of chunks in flight while reading.
        # None: half the host's available memory when saving, 1 GB when reading.
        max_concurrent_gb: Optional[float] = None
        # Max GB of chunks in flight while restoring (AXLearn's field); None: max_concurrent_gb,
        # or 1 GB when that is None too.
        max_concurrent_restore_gb: Optional[float] = None
        # Where the consistent copy lives until its bytes are on the host: "device", "partial"
        # or "host". None: chosen from the step's memory and each device's limit
        # (checkpointer/snapshot_choice.py).
        snapshot: Optional[str] = None
        # A config instantiating to a function (device) -> memory limit in bytes or None, used
        # to choose the snapshot. None: memory_stats()["bytes_limit"] (CPU: available RAM).
        memory_limit: Optional[InstantiableConfig] = None
        # How snapshot bytes reach host memory: "pinned_host" (XLA's asynchronous DMA into
        # page-locked memory) or "numpy" (np.asarray, which holds Python's GIL during the copy
        # on GPUs and stalls the training loop). None: "pinned_host" on accelerators that have
        # it, else "numpy".
        host_transfer: Optional[str] = None
        # Niceness (0..19) of the background write's threads (the writer and its chunk
        # writers), so a save takes idle CPU before training's. None: 19 on CPU backends, where
        # training uses every core, else 0 (unchanged).
        writer_niceness: Optional[int] = None
        # AXLearn's option to spread the writing of replicated shards over up to this many
        # replicas. Only None/1 is supported: each replicated shard is written once, by one
        # process. (None, not 1, by default so the reference config dump is unchanged.)
        max_data_shard_degree: Optional[int] = None
        # AXLearn's threshold below which a replicated shard is not split over replicas when
        # max_data_shard_degree > 1; accepted (None or >= 0) and without effect here, since
        # shards are not split (max_data_shard_degree is 1).
        shard_threshold_bytes: Optional[int] = None

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        cfg = self._config
        if cfg.snapshot is not None and cfg.snapshot not in snapshot_choice.SNAPSHOT_MODES:
            raise ValueError(
                f"checkpointer.storage.snapshot={cfg.snapshot!r} is not a snapshot mode: use one "
                f"of {snapshot_choice.SNAPSHOT_MODES}, or None to choose from memory numbers"
            )
        if cfg.writer_niceness is not None and not 0 <= cfg.writer_niceness <= 19:
            raise ValueError(
                f"TensorStoreStateStorage.writer_niceness must be in [0, 19], got "
                f"{cfg.writer_niceness!r}"
            )
        if cfg.max_data_shard_degree not in (None, 1):
            raise ValueError(
                "TensorStoreStateStorage.max_data_shard_degree: only 1 is supported (each "
                "replicated shard is written once, by one process), got "
                f"{cfg.max_data_shard_degree!r}"
            )
        if cfg.shard_threshold_bytes is not None and cfg.shard_threshold_bytes < 0:
            raise ValueError(
                "TensorStoreStateStorage.shard_threshold_bytes must be None or >= 0, got "
                f"{cfg.shard_threshold_bytes!r}"
            )
        if cfg.max_concurrent_restore_gb is not None and cfg.max_concurrent_restore_gb <= 0:
            raise ValueError(
                "TensorStoreStateStorage.max_concurrent_restore_gb must be strictly positive, "
                f"got {cfg.max_concurrent_restore_gb}"
            )
        if cfg.max_concurrent_gb is not None and cfg.max_concurrent_gb <= 0:
            raise ValueError(
                f"TensorStoreStateStorage.max_concurrent_gb must be > 0, got "
                f"{cfg.max_concurrent_gb}"
            )
        if cfg.host_transfer is not None:
            for device in jax.local_devices():  # Raises naming the value, or the device.
                host_transfer.resolve_host_transfer(cfg.host_transfer, device)
        # The writer thread, started now so that the first save does not pay for it.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="axlearn_checkpoint_writer"
        )
        self._executor.submit(lambda: None)
        self._future: Optional[concurrent.futures.Future] = None
        self._writing_dir: Optional[str] = None
        self._lock = threading.Lock()
        self._save_count = 0
        self._previous_prefix: Optional[str] = None
        self._last_result: Optional[SaveResult] = None
        self.last_restore_stats: Optional[tensorstore_restore.RestoreStats] = None
        self._memory_limit: snapshot_choice.MemoryLimitFn = (
            cfg.memory_limit.instantiate()
            if cfg.memory_limit is not None
            else snapshot_choice.device_memory_limit
        )
        self._choice: Optional[snapshot_choice.SnapshotChoice] = None
        # The train step's peak memory per device, as last given to `choose_snapshot`.
        self._step_peak_bytes: Optional[int] = None
        # (leaf paths, per-device bytes) the choice was made for.
        self._choice_key: Optional[tuple] = None
        self._plan: Optional[tensorstore_save.SavePlan] = None

    @property
    def _budget_bytes(self) -> int:
        """The host budget of a save (see `max_concurrent_gb`)."""
        return snapshot_choice.host_budget_bytes(self._config.max_concurrent_gb)

    @property
    def _read_budget_bytes(self) -> int:
        gb = self._config.max_concurrent_restore_gb
        if gb is None:
            gb = self._config.max_concurrent_gb
        return int((_DEFAULT_CONCURRENT_GB if gb is None else gb) * 1e9)

    def snapshot_mode(self) -> Optional[str]:
        """The snapshot mode in effect: the last choice's, else the configured one (or None)."""
        return self._choice.mode if self._choice is not None else self._config.snapshot

    @property
    def snapshot_choice(self) -> Optional[snapshot_choice.SnapshotChoice]:
        """The last snapshot choice (see `choose_snapshot`), if any."""
        return self._choice

    def choose_snapshot(
        self, state: Any, *, step_peak_bytes: Optional[int] = None
    ) -> snapshot_choice.SnapshotChoice:
        """See `StateStorage.choose_snapshot`; logs the choice when it differs from the last.

        Without `step_peak_bytes`, the last one given is used (a save of a state whose shardings
        changed chooses again against the same step).
        """
        if step_peak_bytes is None:
            step_peak_bytes = self._step_peak_bytes
        self._step_peak_bytes = step_peak_bytes
        leaf_bytes = snapshot_choice.leaf_bytes_per_device(state)
        devices = {d for per in leaf_bytes.values() for d in per}
        choice = snapshot_choice.choose_snapshot(
            leaf_bytes=leaf_bytes,
            step_peak_bytes=step_peak_bytes,
            limit_bytes={d: self._memory_limit(d) for d in devices},
            configured=self._config.snapshot,
        )
        self._check_budget(leaf_bytes, choice)
        if choice != self._choice:
            if choice.source == "no memory limit":
                logging.warning("%s", choice.describe())
            else:
                logging.info("%s", choice.describe())
        self._choice = choice
        self._choice_key = _state_key(state)
        return choice

    def prepare_host_transfer(self, state: Any) -> int:
        """See `StateStorage.prepare_host_transfer`: on accelerators whose snapshots reach the
        host through pinned memory, moves the state's shards there once and frees them
        (`host_transfer.reserve_pinned_host`, within the host budget), logging the bytes and
        seconds; a failure is a warning (the first save then allocates the memory itself). Every
        snapshot mode moves every leaf through host memory: device-snapshot leaves in the
        writer, host-snapshot leaves before `save` returns."""
        pairs, _ = state_tree.flatten_state(state)
        arrays = [leaf for _, leaf in pairs if isinstance(leaf, jax.Array)]
        start = time.perf_counter()
        try:
            moved = host_transfer.reserve_pinned_host(
                arrays, host_transfer=self._config.host_transfer, budget_bytes=self._budget_bytes
            )
        except Exception as e:  # pylint: disable=broad-except
            logging.warning(
                "Checkpoint: setting up pinned host memory for snapshot transfers at start failed "
                "(%s); the first save's transfer allocates it instead.",
                e,
            )
            return 0
        if moved:
            logging.info(
                "Checkpoint: pinned host memory for snapshot transfers set up at start: %.4g GB "
                "in %.2f s (otherwise the first save's transfer allocates it while steps run).",
                moved / 1e9,
                time.perf_counter() - start,
            )
        return moved

    def device_snapshot_bytes(self) -> int:
        plan, future = self._plan, self._future
        if plan is None or future is None or future.done():
            return 0
        return plan.device_bytes_held

    def _check_budget(self, leaf_bytes: dict, choice: snapshot_choice.SnapshotChoice) -> None:
        """Raises ValueError if one device-snapshot shard exceeds the host budget."""
        budget = self._budget_bytes
        largest, where = 0, None
        for path in choice.device_paths:
            shard = max(leaf_bytes[path].values(), default=0)
            if shard > largest:
                largest, where = shard, path
        if largest > budget:
            gb = self._config.max_concurrent_gb
            source = (
                f"checkpointer.storage.max_concurrent_gb={gb}"
                if gb is not None
                else "half the host's available memory (max_concurrent_gb=None)"
            )
            raise ValueError(
                f"The host-memory budget of a save, {budget / 1e9:.4g} GB from {source}, is "
                f"below one chunk: leaf {where!r} has a {largest / 1e9:.4g} GB shard; set "
                f"checkpointer.storage.max_concurrent_gb >= {largest / 1e9:.4g} (or shard the "
                "leaf more finely)"
            )

    def _writer_niceness(self) -> int:
        niceness = self._config.writer_niceness
        if niceness is None:
            niceness = 19 if jax.default_backend() == "cpu" else 0
        return niceness

    def writing_dir(self) -> Optional[str]:
        with self._lock:
            return self._writing_dir

    def _wait(self) -> Optional[SaveResult]:
        future = self._future
        if future is None:
            return None
        try:
            result = future.result()
        finally:
            self._future = None
            with self._lock:
                self._writing_dir = None
        self._last_result = result
        return result

    def wait_until_finished(self) -> Optional[SaveResult]:
        return self._wait()

    def save_to_dir(
        self,
        *,
        step: int,
        state: Any,
        ckpt_dir: str,
        on_commit_callback: Optional[Callable[[int, str], None]] = None,
        async_save: bool = True,
        precondition: Optional[Callable[[], None]] = None,
        alias_arrays: bool = False,
    ) -> SaveStats:
        cfg = self._config
        start = time.perf_counter()
        in_flight = self._future is not None and not self._future.done()
        previous = self._wait()
        waited = time.perf_counter()
        choice = None
        if not alias_arrays:
            choice = self._choice
            if choice is None or self._choice_key != _state_key(state):
                choice = self.choose_snapshot(state)
        self._save_count += 1
        dir_key = f"{zlib.crc32(os.path.abspath(ckpt_dir).encode()):08x}"
        prefix = f"axlearn_ckpt/{dir_key}/{self._save_count}"
        plan = tensorstore_save.snapshot_state(
            step=step,
            state=state,
            ckpt_dir=ckpt_dir,
            barrier_prefix=prefix,
            snapshot_mode=choice.mode if choice is not None else snapshot_choice.SNAPSHOT_HOST,
            previous_barrier_prefix=self._previous_prefix,
            alias_arrays=alias_arrays,
            device_paths=choice.device_paths if choice is not None else None,
            host_transfer=cfg.host_transfer,
        )
        self._plan = plan
        self._previous_prefix = prefix
        snapshotted = time.perf_counter()
        write = dict(
            # Only the background writer thread is reniced, never the caller's.
            niceness=self._writer_niceness() if async_save else 0,
            budget_bytes=self._budget_bytes,
            timeout_s=float(cfg.timeout_secs),
            on_commit=on_commit_callback,
            host_transfer=cfg.host_transfer,
        )
        with self._lock:
            self._writing_dir = ckpt_dir
        if async_save:
            if self._executor is None:
                raise RuntimeError("save_to_dir called after close()")
            self._future = self._executor.submit(_write_if, precondition, plan, **write)
        else:
            try:
                self._last_result = _write_if(precondition, plan, **write)
            finally:
                with self._lock:
                    self._writing_dir = None
        host_bytes = plan.snapshot_host_bytes
        if plan.snapshot_mode != "host":
            host_bytes += min(self._budget_bytes, plan.num_bytes)
        done = time.perf_counter()
        return SaveStats(
            step=step,
            blocking_s=done - start,
            wait_for_previous_s=waited - start,
            snapshot_s=snapshotted - waited,
            snapshot=plan.snapshot_mode,
            num_bytes=plan.num_bytes,
            host_bytes=host_bytes,
            async_save=async_save,
            choice=choice,
            previous=previous,
            waited=in_flight,
        )

    def restore_from_dir(
        self,
        step: int,
        state: Any,
        *,
        ckpt_dir: str,
        validation: CheckpointValidationType = CheckpointValidationType.EXACT,
        index: Optional[dict] = None,
    ) -> Any:
        """See `StateStorage.restore_from_dir` (arguments and result).

        Raises:
            layout.CheckpointIndexError: If the index is missing/unreadable or names another step.
            tensorstore_restore.StateMismatchError: If the target does not match.
            tensorstore_restore.CheckpointCorruptionError: If a file is missing or corrupt.
        """
        if index is None:
            index = layout.read_index_file(ckpt_dir)
        if index["step"] != step:
            raise layout.CheckpointIndexError(
                f"{ckpt_dir}/{layout.INDEX_FILE} is for step {index['step']}, expected {step}"
            )
        restored, stats = tensorstore_restore.restore_state(
            ckpt_dir=ckpt_dir,
            index=index,
            state=state,
            budget_bytes=self._read_budget_bytes,
            timeout_s=float(self._config.timeout_secs),
            validation=validation,
        )
        self.last_restore_stats = stats
        return restored

    @property
    def last_save_result(self) -> Optional[SaveResult]:
        """The result of the last save that finished (after `wait_until_finished`)."""
        return self._last_result

    def close(self) -> None:
        """Waits for the save in flight and stops the writer thread."""
        try:
            self._wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


def _state_key(state: Any) -> tuple:
    """What a snapshot choice depends on: the (shape, dtype, sharding) of each array leaf."""
    return tuple(
        (tuple(leaf.shape), str(leaf.dtype), leaf.sharding)
        for leaf in jax.tree.leaves(state)
        if getattr(leaf, "sharding", None) is not None and hasattr(leaf, "shape")
    )


def _write_if(
    precondition: Optional[Callable[[], None]],
    plan: tensorstore_save.SavePlan,
    *,
    niceness: int,
    **write,
) -> SaveResult:
    """Runs `precondition` (its error abandons the save before anything is written), then writes."""
    thread_priority.lower_current_thread_priority(niceness)
    if precondition is not None:
        precondition()
    return tensorstore_save.write_snapshot(plan, niceness=niceness, **write)
