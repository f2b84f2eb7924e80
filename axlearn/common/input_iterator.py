"""The iterator of `input_tf_data.Input`: NumPy batches and an exactly restorable position.

`InputIterator` runs one tf.data iterator per local feed (see `axlearn.common.input_feed`) and
yields the concatenation of their batches as a dict of NumPy arrays: this process's slice of
the global batch.

State: `get_state()` returns bytes (no pickle):

    b"AXINPUT1" | uint32 little-endian header length | JSON header | feed payloads

The header records the number of feeds, the process count/index that wrote it, the number of
batches consumed, the Input config dump (to detect a changed pipeline), and per feed its index,
mode, skipped-record count and payload slice. A payload is tf.data's own serialization of the
feed's iterator (`SerializeIterator`, stored as a serialized `TensorProto`): buffers of shuffle,
prefetch and packing ops are saved, so a restored iterator continues with exactly the batches the
saved one would have produced. Pipelines that call Python (`from_generator`, `py_function`) cannot
be serialized; their feeds use mode "skip": the payload is empty and restoring replays the saved
number of batches from a fresh iterator (exact when the pipeline is deterministic).

Restoring on a different process count works when `num_feeds` is unchanged: pass the states of
all processes (`set_state([state_0, state_1, ...])`) and each process picks its own feeds.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Union

import numpy as np
from absl import logging

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

_MAGIC = b"AXINPUT1"
_FORMAT = "axlearn.input_state"
_VERSION = 1
# Op types that run Python; a pipeline containing them cannot be serialized by tf.data.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


class InputError(RuntimeError):
    """Reading or processing input failed; the message names the input and its source."""


class InputStateError(ValueError):
    """An input iterator state cannot be restored into this input; the message says why."""


def _graph_ops(ds: tf.data.Dataset) -> set[str]:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    graph = tf.compat.v1.GraphDef()
    # pylint: disable-next=protected-access
    graph.ParseFromString(ds._as_serialized_graph(external_state_policy=policy).numpy())
    ops = {node.op for node in graph.node}
    for fn in graph.library.function:
        ops.update(node.op for node in fn.node_def)
    return ops


def is_serializable(ds: tf.data.Dataset) -> bool:
    """Returns whether tf.data can checkpoint iterators of `ds` (no Python ops inside).

    Args:
        ds: The dataset.

    Returns:
        True if no op of the pipeline calls into Python.
    """
    return not _graph_ops(ds) & _PYTHON_OPS


class Feed:
    """One tf.data pipeline of an Input and its iterator."""

    def __init__(self, *, index: int, dataset: tf.data.Dataset, counter: Any, description: str):
        self.index = index
        self.dataset = dataset
        self.counter = counter
        self.description = description
        self.serializable = is_serializable(dataset)
        self.iterator = iter(dataset)

    def num_malformed(self) -> int:
        return int(self.counter.numpy()) if self.counter is not None else 0

    def serialize(self) -> bytes:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        variant = tf.raw_ops.SerializeIterator(
            # pylint: disable-next=protected-access
            resource_handle=self.iterator._iterator_resource,
            external_state_policy=1,  # IGNORE: resources (e.g. tokenizers) are rebuilt.
        )
        return tf.io.serialize_tensor(variant).numpy()

    def deserialize(self, payload: bytes) -> None:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        variant = tf.io.parse_tensor(payload, out_type=tf.variant)
        # pylint: disable-next=protected-access
        tf.raw_ops.DeserializeIterator(
            resource_handle=self.iterator._iterator_resource, serialized=variant
        )


def _to_numpy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_numpy(v) for v in tree)
    return tree._numpy() if hasattr(tree, "_numpy") else np.asarray(tree)  # pylint: disable=protected-access


def _concat(parts: list) -> Any:
    first = parts[0]
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts]) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(_concat([p[i] for p in parts]) for i in range(len(first)))
    return np.concatenate(parts, axis=0)


def encode_state(header: dict, payloads: Sequence[bytes]) -> bytes:
    """Packs a header and feed payloads into state bytes (see the module docstring).

    Args:
        header: The JSON header; its "feeds" entries get "offset" and "size" filled in.
        payloads: One payload per header["feeds"] entry.

    Returns:
        The state bytes.
    """
    offset = 0
    for feed, payload in zip(header["feeds"], payloads):
        feed["offset"], feed["size"] = offset, len(payload)
        offset += len(payload)
    head = json.dumps(header, sort_keys=True).encode("utf-8")
    return b"".join([_MAGIC, struct.pack("<I", len(head)), head, *payloads])


def decode_state(state: bytes) -> tuple[dict, bytes]:
    """Unpacks state bytes into (header, payload region).

    Args:
        state: Bytes from `InputIterator.get_state()`.

    Returns:
        (header dict, the bytes after the header).

    Raises:
        InputStateError: If `state` is not an input iterator state.
    """
    state = bytes(state)
    if not state.startswith(_MAGIC) or len(state) < len(_MAGIC) + 4:
        raise InputStateError(
            f"Not an axlearn input iterator state (expected it to start with {_MAGIC!r}; the "
            f"{len(state)} bytes given do not, and their content is not shown)"
        )
    (head_len,) = struct.unpack("<I", state[len(_MAGIC) : len(_MAGIC) + 4])
    start = len(_MAGIC) + 4
    try:
        header = json.loads(state[start : start + head_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputStateError(f"Corrupt input iterator state header: {e}") from e
    if header.get("format") != _FORMAT or header.get("version") != _VERSION:
        raise InputStateError(
            f"Unsupported input iterator state {header.get('format')} v{header.get('version')}"
        )
    return header, state[start + head_len :]


class InputIterator:
    """Yields this process's slices of the global batches; checkpointable via get/set_state."""

    def __init__(
        self,
        *,
        feeds: list[Feed],
        num_feeds: int,
        process_index: int,
        process_count: int,
        config_dump: str,
        name: str,
        rebuild: Callable[[int], Feed],
    ):
        self._feeds = feeds
        self._num_feeds = num_feeds
        self._process_index = process_index
        self._process_count = process_count
        self._config_dump = config_dump
        self._name = name
        self._rebuild = rebuild
        self._num_batches = 0
        self._reported_malformed = 0
        # Whether no batch has been read yet (the feeds' iterators are at the start).
        self._fresh = True

    def __iter__(self) -> InputIterator:
        return self

    @property
    def num_batches(self) -> int:
        """The number of batches yielded so far (restored with the state)."""
        return self._num_batches

    @property
    def num_malformed_records(self) -> int:
        """The number of malformed records skipped so far by this process's feeds.

        Counted when read, so records read ahead into prefetch buffers are included.
        """
        return sum(feed.num_malformed() for feed in self._feeds)

    def _next_from(self, feed: Feed) -> Any:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        try:
            return next(feed.iterator)
        except tf.errors.OutOfRangeError as e:  # pragma: no cover (next() raises StopIteration)
            raise StopIteration from e
        except tf.errors.OpError as e:
            raise InputError(
                f"Input '{self._name}' (feed {feed.index} of {self._num_feeds}, source "
                f"{feed.description}) failed after {self._num_batches} batches: "
                f"{type(e).__name__}: {e.message}"
            ) from e

    def __next__(self) -> dict[str, np.ndarray]:
        self._fresh = False
        parts = [_to_numpy(self._next_from(feed)) for feed in self._feeds]
        self._num_batches += 1
        malformed = self.num_malformed_records
        if malformed > self._reported_malformed:
            logging.warning(
                "Input '%s': skipped %d malformed records so far.", self._name, malformed
            )
            self._reported_malformed = malformed
        return parts[0] if len(parts) == 1 else _concat(parts)

    def get_state(self) -> bytes:
        """Returns the position of this iterator as bytes (see the module docstring).

        Returns:
            The state of this process's feeds.
        """
        header = {
            "format": _FORMAT,
            "version": _VERSION,
            "name": self._name,
            "num_feeds": self._num_feeds,
            "process_index": self._process_index,
            "process_count": self._process_count,
            "num_batches": self._num_batches,
            "config": self._config_dump,
            "feeds": [],
        }
        payloads = []
        for feed in self._feeds:
            mode = "tf" if feed.serializable else "skip"
            payloads.append(feed.serialize() if mode == "tf" else b"")
            header["feeds"].append(
                {"index": feed.index, "mode": mode, "num_malformed": feed.num_malformed()}
            )
        return encode_state(header, payloads)

    def set_state(self, states: Union[bytes, Sequence[bytes]], *, check_config: bool = True):
        """Restores the position saved by `get_state()`.

        Args:
            states: This process's saved state, or the saved states of all processes of the run
                that saved them (needed when the process count changed; each process picks the
                feeds it runs).
            check_config: Whether to refuse a state saved by an Input with a different config.

        Raises:
            InputStateError: If the states do not hold this process's feeds, were saved with a
                different `num_feeds`, or (with check_config) by a differently configured input.
        """
        if isinstance(states, (bytes, bytearray, memoryview)):
            states = [bytes(states)]
        found: dict[int, tuple[dict, dict, bytes]] = {}
        num_batches = set()
        for state in states:
            header, body = decode_state(state)
            if header["num_feeds"] != self._num_feeds:
                raise InputStateError(
                    f"Input '{self._name}': the saved iterator state has "
                    f"{header['num_feeds']} feeds (saved by {header['process_count']} "
                    f"processes) but this input has {self._num_feeds} (input.num_feeds, default: "
                    f"the process count {self._process_count}). To resume exactly, set "
                    f"input.num_feeds={header['num_feeds']} (it must be a multiple of the "
                    f"process count), or start the input from the beginning by not restoring "
                    f"its state."
                )
            if check_config and header["config"] != self._config_dump:
                old, new = header["config"].splitlines(), self._config_dump.splitlines()
                diff = sorted(set(old) ^ set(new))
                raise InputStateError(
                    f"Input '{self._name}': the saved iterator state belongs to a differently "
                    f"configured input; restoring it would not be exact. Differing lines: "
                    f"{diff}. Pass check_config=False to restore anyway."
                )
            num_batches.add(header["num_batches"])
            for feed in header["feeds"]:
                payload = body[feed["offset"] : feed["offset"] + feed["size"]]
                found[feed["index"]] = (header, feed, payload)
        missing = [feed.index for feed in self._feeds if feed.index not in found]
        if missing:
            raise InputStateError(
                f"Input '{self._name}': no saved state for feed(s) {missing} of process "
                f"{self._process_index}; the states given hold feeds {sorted(found)}. When the "
                f"process count changed, pass the saved states of all processes."
            )
        if len(num_batches) != 1:
            raise InputStateError(
                f"Input '{self._name}': the states were saved at different positions "
                f"({sorted(num_batches)} batches)"
            )
        (self._num_batches,) = num_batches
        for i, feed in enumerate(self._feeds):
            header, entry, payload = found[feed.index]
            # Start from a fresh iterator so restoring never depends on this one's position.
            if not self._fresh:
                feed = self._feeds[i] = self._rebuild(feed.index)
            if entry["mode"] == "tf":
                if not feed.serializable:
                    raise InputStateError(
                        f"Input '{self._name}': feed {feed.index} was saved by tf.data but its "
                        f"pipeline now calls Python and cannot be restored that way"
                    )
                feed.deserialize(payload)
            else:
                for _ in range(header["num_batches"]):
                    self._next_from(feed)
            if feed.counter is not None:
                feed.counter.assign(entry["num_malformed"])
        self._reported_malformed = self.num_malformed_records
        self._fresh = False
