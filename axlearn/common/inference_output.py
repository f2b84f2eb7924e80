"""Writing per-example eval/inference outputs to files (AXLearn's `inference_output`).

`SpmdEvaler.Config.output_writer = OutputRecordWriter.default_config().set(sink=...)` writes,
for every eval batch, one record per example of the metric calculator's outputs: each process
writes the examples of its own part of the batch (`batch_partition_spec`) to its own file
(`output_path` is formatted with `data_dir`, `process_index` and `process_count`). A record is
a flat dict {"path/of/leaf": value}. Sinks: `TfExampleRecordSink` (TFRecord of tf.train.Example)
and `JsonlExampleRecordSink` (one JSON object per line).
"""

from __future__ import annotations

import json
from typing import Any, Optional

import jax
import numpy as np

from axlearn.common import file_system as fs
from axlearn.common.config import REQUIRED, Configurable, Required, config_class
from axlearn.common.module import Module
from axlearn.common.utils import (
    DataPartitionType,
    NestedTensor,
    data_partition_type_to_spec,
    flatten_items,
    get_data_dir,
)


class BaseRecordSink(Configurable):
    """Writes records (flat dicts of per-example values) to one file per process."""

    @config_class
    class Config(Configurable.Config):
        """Configures BaseRecordSink."""

        # The file path; may contain {data_dir}, {process_index} and {process_count}.
        output_path: Required[str] = REQUIRED

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self._path = cfg.output_path.format(
            data_dir=get_data_dir(),
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        parent = self._path.rsplit("/", 1)[0] if "/" in self._path else ""
        if parent:
            fs.makedirs(parent)

    @property
    def path(self) -> str:
        """This process's output file."""
        return self._path

    def write(self, record: dict[str, Any]) -> None:
        """Writes one record."""
        raise NotImplementedError(type(self))

    def flush(self) -> None:
        """Flushes what was written to the file."""
        raise NotImplementedError(type(self))


class TfExampleRecordSink(BaseRecordSink):
    """Writes each record as a `tf.train.Example` to a TFRecord file.

    Floats become float_list, integers and booleans int64_list, strings/bytes bytes_list (all
    values flattened).
    """

    def __init__(self, cfg: BaseRecordSink.Config):
        super().__init__(cfg)
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        self._tf = tf
        self._writer = tf.io.TFRecordWriter(self._path)

    def _feature(self, value: Any) -> Any:
        train = self._tf.train
        array = np.asarray(value)
        if array.dtype.kind in "SUO":
            items = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
            return train.Feature(bytes_list=train.BytesList(value=items))
        if array.dtype.kind == "f" or array.dtype.name == "bfloat16":
            flat = array.astype(np.float32).reshape(-1)
            return train.Feature(float_list=train.FloatList(value=flat))
        if array.dtype.kind in "iub":
            flat = array.astype(np.int64).reshape(-1)
            return train.Feature(int64_list=train.Int64List(value=flat))
        raise ValueError(f"TfExampleRecordSink: cannot encode dtype {array.dtype}")

    def write(self, record: dict[str, Any]) -> None:
        features = {key: self._feature(value) for key, value in record.items()}
        example = self._tf.train.Example(features=self._tf.train.Features(feature=features))
        self._writer.write(example.SerializeToString())

    def flush(self) -> None:
        self._writer.flush()


def _json_feature(value: Any) -> Any:
    """A JSON-ready value of an array (or a TF tensor): strings decoded, arrays as lists.

    Args:
        value: A NumPy/JAX array, a TF tensor (its `.numpy()` is taken), or bytes.

    Returns:
        A scalar (int, float, bool, str) or a nested list of them.
    """
    if not isinstance(value, (np.ndarray, jax.Array, bytes)) and hasattr(value, "numpy"):
        value = value.numpy()  # A TF tensor.
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return _json_ready(value)


def _json_ready(value: Any) -> Any:
    array = np.asarray(value)
    if array.dtype.name == "bfloat16":
        array = array.astype(np.float32)
    if array.dtype.kind in "SO":
        if array.ndim == 0:
            item = array.item()
            return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else item
        decode = np.vectorize(
            lambda b: b.decode("utf-8", errors="replace") if isinstance(b, bytes) else b,
            otypes=[object],
        )
        return decode(array).tolist()
    return array.tolist()


class JsonlExampleRecordSink(BaseRecordSink):
    """Writes each record as one JSON object per line (arrays as nested lists)."""

    def __init__(self, cfg: BaseRecordSink.Config):
        super().__init__(cfg)
        self._file = fs.open(self._path, "w")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({k: _json_ready(v) for k, v in record.items()}) + "\n")

    def flush(self) -> None:
        self._file.flush()


def _process_rows(x: Any) -> np.ndarray:
    """The rows (leading axis) of a global array that this process's devices hold, in order."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    shards = {}
    for shard in x.addressable_shards:
        start = shard.index[0].start or 0 if shard.index else 0
        shards.setdefault(start, np.asarray(shard.data))
    return np.concatenate([shards[k] for k in sorted(shards)], axis=0)


class BaseOutputWriter(Module):
    """Writes records of inference input/output batches (subclasses say which and how)."""

    @config_class
    class Config(Module.Config):
        """Configures BaseOutputWriter."""

        # How the batches are partitioned over processes (a DataPartitionType or spec).
        batch_partition_spec: Required[Any] = REQUIRED

    def write(self, *, input_batch: NestedTensor, output_batch: NestedTensor) -> None:
        """Writes the records of one batch.

        Args:
            input_batch: The batch the outputs were computed from.
            output_batch: The outputs.
        """
        raise NotImplementedError(type(self))

    def flush(self) -> None:
        """Flushes what was written."""
        raise NotImplementedError(type(self))


class OutputRecordWriter(BaseOutputWriter):
    """Writes one record per example of each batch's outputs (see the module docstring)."""

    @config_class
    class Config(BaseOutputWriter.Config):
        """Configures OutputRecordWriter."""

        # Where the records go (default: a TFRecord file of tf.train.Examples).
        sink: Required[BaseRecordSink.Config] = TfExampleRecordSink.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        spec = cfg.batch_partition_spec
        if not isinstance(spec, DataPartitionType):
            data_partition_type_to_spec(spec)  # Raises for an unsupported value.
        self._sink: BaseRecordSink = cfg.sink.instantiate()

    @property
    def sink(self) -> BaseRecordSink:
        """The record sink."""
        return self._sink

    def write(self, *, input_batch: NestedTensor, output_batch: NestedTensor) -> None:
        """Writes one record per example of `output_batch` held by this process.

        Args:
            input_batch: The batch the outputs were computed from (not written).
            output_batch: A tree of arrays whose leading axis is the example axis.
        """
        if self.config.batch_partition_spec == DataPartitionType.REPLICATED and (
            jax.process_index() != 0
        ):
            return
        items = self._record_items(input_batch=input_batch, output_batch=output_batch)
        if not items:
            return
        num_examples = {value.shape[0] for _, value in items}
        if len(num_examples) != 1:
            raise ValueError(
                f"{self.path()}: outputs have different example counts {sorted(num_examples)}"
            )
        for i in range(num_examples.pop()):
            self._sink.write({path: value[i] for path, value in items})

    def _record_items(
        self, *, input_batch: NestedTensor, output_batch: NestedTensor
    ) -> list[tuple[str, np.ndarray]]:
        """(path, this process's rows) of the leaves a record holds: the outputs."""
        del input_batch
        return [(path, _process_rows(leaf)) for path, leaf in flatten_items(output_batch)]

    def flush(self) -> None:
        """Flushes the sink."""
        self._sink.flush()


class InputOutputRecordWriter(OutputRecordWriter):
    """Writes one record per example of its inputs and outputs: {"input/...", "output/..."}.

    Input leaves may be TF (e.g. string) tensors; they are taken as this process's rows.
    """

    def _record_items(
        self, *, input_batch: NestedTensor, output_batch: NestedTensor
    ) -> list[tuple[str, np.ndarray]]:
        """(path, this process's rows) of the inputs under "input/", the outputs under "output/"."""

        def rows(leaf):
            if not isinstance(leaf, (np.ndarray, jax.Array)) and hasattr(leaf, "numpy"):
                return np.asarray(leaf.numpy())
            return _process_rows(leaf)

        batch = dict(input=input_batch, output=output_batch)
        return [(path, rows(leaf)) for path, leaf in flatten_items(batch)]
