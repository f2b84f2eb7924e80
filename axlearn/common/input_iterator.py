"""The iterator of `input_tf_data.Input`: NumPy batches and an exactly restorable position.

`InputIterator` runs one tf.data iterator per local feed (see `axlearn.common.input_feed`) and
yields the concatenation of their batches as a dict of NumPy arrays: this process's slice of
the global batch.

State: `get_state()` returns bytes (no pickle):

    b"AXINPUT1" | uint32 little-endian header length | JSON header | feed payloads

The header records the number of feeds, the process count/index that wrote it, the number of
batches consumed, the Input config dump (to detect a changed pipeline), and per feed its index,
mode, skipped-record count, payload slice, rows per batch and `sources`: the local files its
pipeline reads (string constants of its graph naming regular files), each with its size and
fingerprint (`axlearn.common.input_state_check`). A restore onto files that changed since the
save is refused naming the file; every header field is validated (one line naming it).
Version 1 states (without sources and rows) still restore, without the source check.

A payload is tf.data's own serialization of the
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
import os
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import numpy as np
from absl import logging

from axlearn.common import input_state_check

# Defined with the state checks (which raise it); this is its documented import path.
from axlearn.common.input_state_check import InputStateError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

_MAGIC = b"AXINPUT1"
_FORMAT = "axlearn.input_state"
# Version 2 adds per feed "sources" (files read, fingerprinted) and "rows_per_batch".
_VERSION = 2
_READABLE_VERSIONS = (1, 2)
# What to do with a state that cannot be restored (appended to refusals).
_STATE_FIX = (
    "resume from a checkpoint saved with the data and input this run has, or set the trainer's "
    "save_input_iterator=False to start the input from its beginning"
)
# Op types that run Python; a pipeline containing them cannot be serialized by tf.data.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


class InputError(RuntimeError):
    """Reading or processing input failed; the message names the input and its source."""


# The `format` of a FakeLmInput state (JSON), the input --data_dir=FAKE puts in a run.
FAKE_STATE_FORMAT = "axlearn.fake_input_state"
# The `format` of a Grain input state (JSON).
GRAIN_STATE_FORMAT = "axlearn.grain_input_state"

_FAKE_INPUT = "FakeLmInput (a run with --data_dir=FAKE)"
_REAL_INPUT = "an input reading real data (a run without --data_dir=FAKE)"


def saved_input_kind(state: bytes) -> str:
    """Names the kind of input that wrote an input iterator state, from its format marker only.

    Args:
        state: The saved state bytes.

    Returns:
        E.g. "FakeLmInput (a run with --data_dir=FAKE)"; the state's content is never included.
        A JSON state is decoded with `input_state_check.parse_state_json` (bounded in size and
        depth); one it refuses, or whose "format" is not a string this code writes, is "an
        unknown input".
    """
    state = bytes(state)
    if state.startswith(_MAGIC):
        return "a tf.data input reading real data (a run without --data_dir=FAKE)"
    fmt = None
    if state.lstrip()[:1] == b"{":
        # Bounded (size, depth): a huge or deeply nested state is named unknown, not parsed.
        try:
            parsed = input_state_check.parse_state_json(state, what="input state", fix="")
        except InputStateError:
            parsed = None
        fmt = parsed.get("format") if isinstance(parsed, dict) else None
    if fmt == FAKE_STATE_FORMAT:
        return _FAKE_INPUT
    if fmt == GRAIN_STATE_FORMAT:
        return "a Grain input reading real data (a run without --data_dir=FAKE)"
    return f"an unknown input ({len(state)} bytes that no axlearn input writes)"


def foreign_state_message(state: bytes, *, name: str, reader: str) -> str:
    """The one-line error for a checkpoint whose input state another kind of input wrote.

    Args:
        state: The saved state bytes.
        name: The restoring input's name or config path.
        reader: What the restoring input is (e.g. "a tf.data input reading real data").

    Returns:
        The message naming both inputs and the fix; the state's content is not shown.
    """
    saved = saved_input_kind(state)
    if saved == _FAKE_INPUT:
        same = "--data_dir=FAKE again"
    elif "real data" in saved:
        same = "the --data_dir of the run that saved it (not FAKE)"
    else:
        same = "the input that saved it"
    return (
        f"Input '{name}': the checkpoint's input position was saved by {saved}, but this run "
        f"reads with {reader}; resume with {same}, or train in a fresh --trainer_dir."
    )


def _graph_nodes(ds: tf.data.Dataset) -> list:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    graph = tf.compat.v1.GraphDef()
    # pylint: disable-next=protected-access
    graph.ParseFromString(ds._as_serialized_graph(external_state_policy=policy).numpy())
    return list(graph.node) + [node for fn in graph.library.function for node in fn.node_def]


def _graph_ops(ds: tf.data.Dataset) -> set[str]:
    return {node.op for node in _graph_nodes(ds)}


def _string_constants(tensor: Any) -> list[bytes]:
    """The values of a DT_STRING TensorProto (string_val, or tensor_content's string list)."""
    if tensor.string_val:
        return list(tensor.string_val)
    count = 1
    for dim in tensor.tensor_shape.dim:
        count *= dim.size
    buf, pos, lengths = tensor.tensor_content, 0, []
    if not buf or count > len(buf):
        return []
    for _ in range(count):  # Varint32 lengths, then the strings (TF's EncodeStringList).
        value, shift = 0, 0
        while pos < len(buf):
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        lengths.append(value)
    out = []
    for length in lengths:
        out.append(buf[pos : pos + length])
        pos += length
    return out


def is_serializable(ds: tf.data.Dataset) -> bool:
    """Returns whether tf.data can checkpoint iterators of `ds` (no Python ops inside).

    Args:
        ds: The dataset.

    Returns:
        True if no op of the pipeline calls into Python.
    """
    return not _graph_ops(ds) & _PYTHON_OPS


def pipeline_files(ds: tf.data.Dataset, *, nodes: Optional[list] = None) -> list[str]:
    """The local files a tf.data pipeline names: its string constants that are regular files.

    File-reading datasets (TFRecord, TFDS, text lines) hold their file names as string
    constants of the pipeline's graph; those naming an existing absolute path of a regular file
    are the pipeline's source files.

    Args:
        ds: The dataset.
        nodes: Its graph's nodes, if already parsed.

    Returns:
        The paths, each once, in graph order.
    """
    _dt_string = 7  # tensorflow.core.framework.types_pb2.DT_STRING
    paths = []
    for node in nodes if nodes is not None else _graph_nodes(ds):
        if node.op != "Const" or "value" not in node.attr:
            continue
        tensor = node.attr["value"].tensor
        if tensor.dtype != _dt_string:
            continue
        for value in _string_constants(tensor):
            if not value.startswith(b"/") or len(value) > 4096:
                continue
            path = value.decode("utf-8", errors="replace")
            if path not in paths and os.path.isfile(path):
                paths.append(path)
    return paths


class Feed:
    """One tf.data pipeline of an Input and its iterator."""

    def __init__(self, *, index: int, dataset: tf.data.Dataset, counter: Any, description: str):
        self.index = index
        self.dataset = dataset
        self.counter = counter
        self.description = description
        nodes = _graph_nodes(dataset)
        self.serializable = not {node.op for node in nodes} & _PYTHON_OPS
        # The files this feed reads, fingerprinted when it was built (saved with the state).
        self.sources = input_state_check.source_fingerprints(pipeline_files(dataset, nodes=nodes))
        # Rows of this feed's batches (from the first batch read; None before).
        self.rows_per_batch: Optional[int] = None
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


def _leaves(tree: Any) -> list:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, (list, tuple)):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


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


def decode_state(
    state: bytes, *, what: str = "The saved input iterator state", name: str = "input"
) -> tuple[dict, bytes]:
    """Unpacks and validates state bytes into (header, payload region).

    Args:
        state: Bytes from `InputIterator.get_state()`.
        what: Names the state in messages.
        name: The restoring input's name, for the message about a state another input wrote.

    Returns:
        (header dict, the bytes after the header): every header field the restore uses has its
        JSON type, counters are in range and payload slices lie inside the payload region.

    Raises:
        InputStateError: One line naming the field and the fix if `state` is not an input
            iterator state (content is never shown).
    """
    state = bytes(state)
    if not state.startswith(_MAGIC) or len(state) < len(_MAGIC) + 4:
        if not state.startswith(_MAGIC):
            raise InputStateError(
                foreign_state_message(state, name=name, reader="a tf.data input of real data")
            )
        raise InputStateError(
            f"Not an axlearn input iterator state (expected it to start with {_MAGIC!r}; the "
            f"{len(state)} bytes given do not, and their content is not shown)"
        )
    (head_len,) = struct.unpack("<I", state[len(_MAGIC) : len(_MAGIC) + 4])
    start = len(_MAGIC) + 4
    if start + head_len > len(state):
        raise InputStateError(
            f"{what}: its header length {head_len} runs past its {len(state)} bytes (truncated); "
            f"{_STATE_FIX}"
        )
    fields = dict(what=what, fix=_STATE_FIX)
    header = input_state_check.parse_state_json(state[start : start + head_len], **fields)
    if not isinstance(header, dict):
        raise InputStateError(f"{what}: the header is not a JSON object; {_STATE_FIX}")
    if header.get("format") != _FORMAT or header.get("version") not in _READABLE_VERSIONS:
        raise InputStateError(
            f"Unsupported input iterator state {str(header.get('format'))[:40]} "
            f"v{str(header.get('version'))[:20]} (this code reads {_FORMAT} "
            f"v{list(_READABLE_VERSIONS)}); {_STATE_FIX}"
        )
    body = state[start + head_len :]
    num_feeds = input_state_check.require_int(header, "num_feeds", minimum=1, **fields)
    input_state_check.require_int(header, "process_count", minimum=1, **fields)
    input_state_check.require_int(header, "process_index", **fields)
    input_state_check.require_int(header, "num_batches", **fields)
    if not isinstance(header.get("config"), str):
        raise InputStateError(f"{what}: field 'config' must be a string; {_STATE_FIX}")
    feeds = header.get("feeds")
    if not isinstance(feeds, list) or not all(isinstance(f, dict) for f in feeds):
        raise InputStateError(f"{what}: field 'feeds' must be a list of objects; {_STATE_FIX}")
    for i, feed in enumerate(feeds):
        entry = dict(what=f"{what} (feeds[{i}])", fix=_STATE_FIX)
        if input_state_check.require_int(feed, "index", **entry) >= num_feeds:
            raise InputStateError(
                f"{what}: feeds[{i}].index is {feed['index']}, not below num_feeds={num_feeds}; "
                f"{_STATE_FIX}"
            )
        if feed.get("mode") not in ("tf", "skip"):
            raise InputStateError(f"{what}: feeds[{i}].mode must be 'tf' or 'skip'; {_STATE_FIX}")
        input_state_check.require_int(feed, "num_malformed", **entry)
        offset = input_state_check.require_int(feed, "offset", **entry)
        if offset + input_state_check.require_int(feed, "size", **entry) > len(body):
            raise InputStateError(
                f"{what}: feeds[{i}]'s payload runs past the state's end (truncated); {_STATE_FIX}"
            )
        if header["version"] >= 2:
            input_state_check.require_int(
                feed, "rows_per_batch", minimum=1, allow_none=True, **entry
            )
            if "sources" not in feed:
                raise InputStateError(f"{what}: feeds[{i}] has no 'sources'; {_STATE_FIX}")
    return header, body


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
        for feed, part in zip(self._feeds, parts):
            if feed.rows_per_batch is None:
                leaves = [x for x in _leaves(part) if np.ndim(x)]
                feed.rows_per_batch = int(np.shape(leaves[0])[0]) if leaves else None
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
                {
                    "index": feed.index,
                    "mode": mode,
                    "num_malformed": feed.num_malformed(),
                    "rows_per_batch": feed.rows_per_batch,
                    "sources": feed.sources,
                }
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
        what = f"Input '{self._name}': the saved iterator state"
        for state in states:
            header, body = decode_state(state, what=what, name=self._name)
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
            # Version 1 states (no "sources") restore unchecked.
            input_state_check.check_sources(
                entry.get("sources"),
                feed.sources,
                what=f"{what} (feed {feed.index})",
                fix=_STATE_FIX,
            )
            feed.rows_per_batch = entry.get("rows_per_batch")
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
