"""An inference pipeline: an input, an `InferenceRunner` method, and an output writer.

`InferencePipeline.run()` reads every batch of its input, runs `runner.<model_method>` on it
through `InferenceRunner.create_method_runner`, writes each process's rows of the inputs and
outputs with its output writer (`inference_output`), and the method's summaries (at step = the
batch index) with its summary writer.

Input batches from a `tf.data` input may hold TF string tensors (e.g. example ids), which
cannot go to the device. `pop_string_tensors` splits a batch into its non-string part and its
string part, and `merge_with_string_tensors` puts them back together, so that the writer gets
them next to the outputs (e.g. `inference_output.InputOutputRecordWriter`).
"""

from __future__ import annotations

import time
from typing import Any, Optional

import jax
from absl import logging
from jax.experimental import multihost_utils

from axlearn.common import utils
from axlearn.common.config import InstantiableConfig, config_class
from axlearn.common.inference import InferenceRunner, MethodRunner
from axlearn.common.inference_method_runner import global_to_host_array
from axlearn.common.inference_output import BaseOutputWriter, OutputRecordWriter
from axlearn.common.input_tf_data import Input
from axlearn.common.module import Module
from axlearn.common.summary_writer import BaseWriter, SummaryWriter
from axlearn.common.utils import NestedTensor

# Batches between two progress log lines of `InferencePipeline.run`.
_LOG_EVERY_N_BATCHES = 10


def _is_string_tensor(x: Any) -> bool:
    """Whether `x` is a TF tensor of dtype string (TF is not imported for the check)."""
    return (
        type(x).__module__.startswith("tensorflow")
        and getattr(getattr(x, "dtype", None), "name", None) == "string"
    )


def _split(batch: NestedTensor, *, strings: bool) -> NestedTensor:
    """The dict tree of `batch` keeping only the string (or only the other) leaves."""
    if not isinstance(batch, dict):
        return batch if _is_string_tensor(batch) == strings else None
    out = {}
    for key, value in batch.items():
        if isinstance(value, dict):
            sub = _split(value, strings=strings)
            if sub:
                out[key] = sub
        elif _is_string_tensor(value) == strings:
            out[key] = value
    return out


def pop_string_tensors(batch: NestedTensor) -> tuple[NestedTensor, NestedTensor]:
    """Splits a (dict tree) batch into its non-string leaves and its TF string tensors.

    Args:
        batch: A dict tree whose leaves are arrays or TF tensors.

    Returns:
        (the batch without string tensors, a dict tree of only the string tensors); subtrees
        left empty are dropped from each.
    """
    return _split(batch, strings=False), _split(batch, strings=True)


def merge_with_string_tensors(t1: NestedTensor, t2: NestedTensor) -> NestedTensor:
    """Adds the string tensors `t2` back into `t1` (the inverse of `pop_string_tensors`).

    `t1` and `t2` must have disjoint leaf paths; `t1` is updated in place.

    Args:
        t1: A dict tree without string tensors.
        t2: A dict tree of string tensors.

    Returns:
        `t1` with the leaves of `t2` added.

    Raises:
        ValueError: If either is a leaf (a path holds a leaf in one and a value in the other).
    """
    if not isinstance(t1, dict) or not isinstance(t2, dict):
        raise ValueError(
            f"Expect args to be non-leaf nodes. Got t1={t1}, t2={t2}: a path holds a leaf in one "
            "tree and a value in the other."
        )
    for key, value in t2.items():
        t1[key] = merge_with_string_tensors(t1[key], value) if key in t1 else value
    return t1


class InferencePipeline(Module):
    """Runs a model method over a whole input and writes the outputs (see the module docstring).

    Each process reads its own part of the input and writes its own rows; `run` returns when
    every process has flushed.
    """

    @config_class
    class Config(Module.Config):
        """Configures InferencePipeline."""

        # The input; its `dataset()` yields this process's batches.
        input: InstantiableConfig = Input.default_config()
        # The runner computing the output batches.
        runner: InferenceRunner.Config = InferenceRunner.default_config()
        # The model method to run (takes `input_batch`).
        model_method: str = "predict"
        # The output writer; its batch_partition_spec is set to the runner's input one.
        output_writer: BaseOutputWriter.Config = OutputRecordWriter.default_config()
        # The writer of the method's summaries (step: the batch index).
        summary_writer: BaseWriter.Config = SummaryWriter.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("input", cfg.input)
        self._add_child("runner", cfg.runner)
        self._add_child(
            "output_writer",
            cfg.output_writer.clone(batch_partition_spec=cfg.runner.input_batch_partition_spec),
        )
        self._add_child("summary_writer", cfg.summary_writer)

    def run(self, **kwargs) -> None:
        """Runs the method on every input batch and writes the results.

        Args:
            **kwargs: Passed to `InferenceRunner.create_method_runner` (e.g. prng_key, or more
                arguments of the method).
        """
        cfg = self.config
        method_runner: MethodRunner = self.runner.create_method_runner(
            method=cfg.model_method, **kwargs
        )
        mesh = self.runner.mesh()
        start = time.perf_counter()
        for batch_index, input_batch in enumerate(self.input.dataset()):
            input_batch, string_tensors = pop_string_tensors(input_batch)
            input_batch = utils.as_numpy_array(input_batch)
            with jax.set_mesh(mesh):
                global_batch = utils.host_to_global_device_array(
                    input_batch, partition=cfg.runner.input_batch_partition_spec
                )
            output: MethodRunner.Output = method_runner(global_batch)
            output_batch = global_to_host_array(output.output_batch)
            if string_tensors:
                input_batch = merge_with_string_tensors(input_batch, string_tensors)
            self.output_writer.write(input_batch=input_batch, output_batch=output_batch)
            self.summary_writer(step=batch_index, values=output.summaries)
            if (batch_index + 1) % _LOG_EVERY_N_BATCHES == 0:
                leaves = jax.tree_util.tree_leaves(global_batch)
                batch_size = len(leaves[0]) if leaves else 0
                now = time.perf_counter()
                logging.info(
                    "Processed %d batches and %d examples; %.2f s per batch.",
                    batch_index + 1,
                    (batch_index + 1) * batch_size,
                    (now - start) / _LOG_EVERY_N_BATCHES,
                )
                start = now
        self.output_writer.flush()
        # Every process has flushed when run() returns.
        multihost_utils.sync_global_devices(self.path())
