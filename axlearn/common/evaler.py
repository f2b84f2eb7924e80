"""Evalers: run a model over a whole eval set on the device mesh and report accumulated metrics.

`SpmdEvaler` is a child of the trainer, built inside the trainer's mesh as

    trainer._add_child(name, evaler_cfg, model=model,
                       model_param_partition_specs=param_partition_specs)

and called after a train step as

    prng_key, summaries, outputs = evaler.eval_step(step, prng_key=key, model_params=params)

It runs when its `eval_policy` says so (or with `force_run=True`): it iterates over its input
from the start, turns each host batch into global arrays sharded over the batch axes, and calls
`metric_calculator.forward` per batch (a jitted functional forward of `model_method`, with floats
cast to `eval_dtype`). `ModelSummaryAccumulator` accumulates the model's summaries over batches
with a `MetricAccumulator`: every `WeightedScalar` summary becomes the weighted mean over the whole
eval set (e.g. the loss per target token); plain tensors are dropped. The results, plus
`eval_time_secs` and `num_eval_batches`, go to the evaler's summary writer and to the log, and are
returned as host values (so the eval's device work has finished when `eval_step` returns).
"""

from __future__ import annotations

import contextlib
import graphlib
import re
import time
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np
from absl import logging
from jax.sharding import PartitionSpec

from axlearn.common import utils
from axlearn.common.config import (
    REQUIRED,
    ConfigBase,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
)
from axlearn.common.metrics import MetricAccumulator, WeightedScalar
from axlearn.common.module import Module, OutputCollection
from axlearn.common.module import functional as F
from axlearn.common.summary_writer import SummaryWriter, fetch_to_host
from axlearn.common.utils import NestedPartitionSpec, NestedTensor, Tensor

# (step, train_summaries) -> whether to eval at `step`.
EvalPolicy = Callable[..., bool]


def every_n_steps_policy(
    n: int = 1, *, min_step: int = 1, max_step: Optional[int] = None
) -> EvalPolicy:
    """Returns a policy that evals at steps divisible by `n`, not before `min_step`.

    With `max_step` set, it also evals at every step >= `max_step` (so the last step is
    evaluated even when it is not a multiple of `n`).

    Args:
        n: The eval period in steps (>= 1).
        min_step: The first step at which eval may run.
        max_step: If set, eval at any step >= max_step.

    Returns:
        A function `(*, step, train_summaries=None) -> bool`.

    Raises:
        ValueError: If n < 1 or max_step < min_step.
    """
    if n < 1:
        raise ValueError(f"every_n_steps_policy: n must be >= 1, got {n}")
    if max_step is not None and max_step < min_step:
        raise ValueError(f"every_n_steps_policy: max_step {max_step} < min_step {min_step}")

    def fn(*, step: int, train_summaries: Optional[dict[str, Any]] = None) -> bool:
        del train_summaries
        if step < min_step:
            return False
        return step % n == 0 or (max_step is not None and step >= max_step)

    return fn


def _current_mesh_or_none() -> Optional[jax.sharding.Mesh]:
    return utils.current_mesh()


def _mesh_context(mesh: Optional[jax.sharding.Mesh]):
    """A context in which `mesh` is the current mesh (a no-op context for None)."""
    if mesh is None:
        return contextlib.nullcontext()
    set_mesh = getattr(jax, "set_mesh", None)
    return set_mesh(mesh) if set_mesh is not None else mesh


class BaseMetricCalculator(Module):
    """Computes eval metrics batch by batch.

    Protocol (per eval run): `state = init_state(prng_key=, model_params=)`; for each batch
    `out = forward(batch, model_params=, state=state)`, `state = out["state"]`, keep
    `out["output"]`; finally `get_summaries(model_params=, state=, all_forward_outputs=)`.
    """

    @config_class
    class Config(Module.Config):
        """Configures BaseMetricCalculator."""

        # Cast float inputs and parameters to this dtype for the eval step; None: no cast.
        eval_dtype: Optional[Any] = None
        # Optional prefix of metric names ("<prefix>/<name>").
        prefix: Optional[str] = None

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module],
        model: Module,
        model_param_partition_specs: NestedPartitionSpec,
    ):
        super().__init__(cfg, parent=parent)
        self._model = model
        self._model_param_partition_specs = model_param_partition_specs
        self._mesh = _current_mesh_or_none()

    def init_state(self, *, prng_key: Tensor, model_params: NestedTensor) -> NestedTensor:
        """Returns the state passed to the first `forward` of an eval run."""
        raise NotImplementedError(type(self))

    def forward(
        self, input_batch: NestedTensor, *, model_params: NestedTensor, state: NestedTensor
    ) -> dict[str, NestedTensor]:
        """Processes one batch; returns {"state": new state, "output": per-batch outputs}."""
        raise NotImplementedError(type(self))

    def get_summaries(
        self,
        *,
        model_params: NestedTensor,
        state: NestedTensor,
        all_forward_outputs: list[NestedTensor],
    ) -> dict[str, Any]:
        """Returns the summaries of the eval run."""
        raise NotImplementedError(type(self))

    def formatted_metric_name(self, metric_name: str) -> str:
        """Returns `<prefix>/<metric_name>` if a prefix is configured, else `metric_name`."""
        prefix = self.config.prefix
        return f"{prefix}/{metric_name}" if prefix is not None else metric_name

    def _eval_cast(self, tree: NestedTensor) -> NestedTensor:
        return utils.cast_floats(tree, to_dtype=_resolve_dtype(self.config.eval_dtype))

    def _call_model(
        self,
        *,
        method: str,
        prng_key: Tensor,
        model_params: NestedTensor,
        input_batch: NestedTensor,
        **kwargs,
    ) -> tuple[Any, OutputCollection]:
        """Runs `model.<method>(input_batch=..., **kwargs)` functionally (is_training=False)."""
        return F(
            self._model,
            method=method,
            prng_key=prng_key,
            state=self._eval_cast(model_params),
            inputs=dict(input_batch=self._eval_cast(input_batch), **kwargs),
            is_training=False,
        )


def _resolve_dtype(dtype: Any) -> Any:
    """Accepts a dtype or its dumped name ('jax.numpy.bfloat16')."""
    if isinstance(dtype, str):
        import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

        return jnp.dtype(dtype.rsplit(".", 1)[-1])
    return dtype


class ModelSummaryAccumulator(BaseMetricCalculator):
    """Accumulates the model's `WeightedScalar` summaries over all eval batches."""

    @config_class
    class Config(BaseMetricCalculator.Config):
        """Configures ModelSummaryAccumulator."""

        # The model method to call with input_batch=...
        model_method: str = "forward"
        # Extra keyword arguments of the model method.
        model_method_kwargs: dict[str, Any] = {}
        # Accumulates summaries over batches.
        metric_accumulator: InstantiableConfig = MetricAccumulator.default_config()

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module],
        model: Module,
        model_param_partition_specs: NestedPartitionSpec,
    ):
        super().__init__(
            cfg, parent=parent, model=model, model_param_partition_specs=model_param_partition_specs
        )
        self._metric_accumulator: Optional[MetricAccumulator] = None
        self._jit_forward = jax.jit(self._forward_in_jit)

    def init_state(self, *, prng_key: Tensor, model_params: NestedTensor) -> NestedTensor:
        del model_params
        self._metric_accumulator = self.config.metric_accumulator.instantiate()
        return dict(prng_key=prng_key)

    def forward(
        self, input_batch: NestedTensor, *, model_params: NestedTensor, state: NestedTensor
    ) -> dict[str, NestedTensor]:
        with _mesh_context(self._mesh):
            outputs = self._jit_forward(model_params, state["prng_key"], input_batch)
        self._process_summaries(outputs["summaries"])
        return dict(state=dict(prng_key=outputs["prng_key"]), output=outputs["per_example"])

    def _process_summaries(self, summaries: dict[str, Any]) -> None:
        """Accumulates one batch's model summaries (after `init_state`)."""
        self._metric_accumulator.update(summaries)

    def _forward_in_jit(
        self, model_params: NestedTensor, prng_key: Tensor, input_batch: NestedTensor
    ) -> dict[str, NestedTensor]:
        cfg = self.config
        next_key, forward_key = jax.random.split(prng_key)
        model_outputs, collection = self._call_model(
            method=cfg.model_method,
            prng_key=forward_key,
            model_params=model_params,
            input_batch=input_batch,
            **cfg.model_method_kwargs,
        )
        return dict(
            prng_key=next_key,
            summaries=collection.summaries,
            per_example=self._per_example_outputs(model_outputs),
        )

    def _per_example_outputs(self, model_outputs: Any) -> NestedTensor:
        """Per-example outputs kept for `get_summaries`; none by default."""
        del model_outputs
        return {}

    def get_summaries(
        self,
        *,
        model_params: NestedTensor,
        state: NestedTensor,
        all_forward_outputs: list[NestedTensor],
    ) -> dict[str, Any]:
        del model_params, state, all_forward_outputs
        summaries = self._metric_accumulator.summaries()
        if self.config.prefix is None:
            return summaries
        return {self.formatted_metric_name(k): v for k, v in summaries.items()}


class CompositeMetricCalculator(BaseMetricCalculator):
    """Runs several named metric calculators on each batch, optionally feeding one to another.

    Summaries are those of each calculator, named "<calculator name>/<summary name>". A
    `Dependency(src, dst, dst_key)` adds calculator `src`'s per-batch output to the input batch
    of every calculator whose name fully matches the regex `dst`, under `dst_key` (default: the
    src name); calculators run in an order where sources come first.
    """

    @config_class
    class Dependency(ConfigBase):
        """An edge: `src`'s outputs go into the input batch of calculators matching `dst`."""

        # The source calculator's name.
        src: Required[str] = REQUIRED
        # A regex fully matching the destination calculators' names.
        dst: Required[str] = REQUIRED
        # The input batch key of the outputs; None: the src name.
        dst_key: Optional[str] = None

    @config_class
    class Config(BaseMetricCalculator.Config):
        """Configures CompositeMetricCalculator."""

        # The calculators by name.
        metric_calculators: Required[dict[str, BaseMetricCalculator.Config]] = REQUIRED
        # Edges feeding one calculator's outputs to others (see the class docstring).
        dependencies: Sequence[Any] = []

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module],
        model: Module,
        model_param_partition_specs: NestedPartitionSpec,
    ):
        super().__init__(
            cfg, parent=parent, model=model, model_param_partition_specs=model_param_partition_specs
        )
        cfg = self.config
        self._calculators: dict[str, BaseMetricCalculator] = {}
        for name, calc_cfg in cfg.metric_calculators.items():
            self._calculators[name] = self._add_child(
                name,
                calc_cfg,
                model=model,
                model_param_partition_specs=model_param_partition_specs,
            )
        # {dst: {dst_key: src}}.
        self._inputs: dict[str, dict[str, str]] = {name: {} for name in self._calculators}
        key_sources: dict[str, str] = {}
        edges = set()
        for dep in cfg.dependencies:
            if dep.src not in self._calculators:
                raise ValueError(f"{self.path()}.dependencies: unknown src calculator {dep.src}")
            key = dep.dst_key or dep.src
            if key_sources.setdefault(key, dep.src) != dep.src:
                raise ValueError(
                    f"{self.path()}.dependencies: {key_sources[key]} and {dep.src} produce key "
                    f"{key}; give the edges different dst_key values"
                )
            dsts = [n for n in self._calculators if re.fullmatch(dep.dst, n)]
            if not dsts:
                raise ValueError(
                    f"{self.path()}.dependencies: dst {dep.dst!r} matches no calculator"
                )
            for dst in dsts:
                if (dep.src, dst) in edges:
                    raise ValueError(
                        f"{self.path()}.dependencies: duplicate edge ({dep.src}, {dst})"
                    )
                edges.add((dep.src, dst))
                self._inputs[dst][key] = dep.src
        sorter = graphlib.TopologicalSorter(
            {dst: set(srcs.values()) for dst, srcs in self._inputs.items()}
        )
        self._order = list(sorter.static_order())  # Raises graphlib.CycleError on a cycle.

    def init_state(self, *, prng_key: Tensor, model_params: NestedTensor) -> NestedTensor:
        return {
            name: calc.init_state(prng_key=prng_key, model_params=model_params)
            for name, calc in self._calculators.items()
        }

    def forward(
        self, input_batch: NestedTensor, *, model_params: NestedTensor, state: NestedTensor
    ) -> dict[str, NestedTensor]:
        outputs, new_state = {}, {}
        for name in self._order:
            batch = dict(input_batch)
            for key, src in self._inputs[name].items():
                if key in batch:
                    raise ValueError(
                        f"{self.path()}: {name} already has key {key}; set dst_key of the "
                        f"dependency on {src} to another name"
                    )
                batch[key] = outputs[src]
            out = self._calculators[name].forward(
                batch, model_params=model_params, state=state[name]
            )
            outputs[name], new_state[name] = out["output"], out["state"]
        return dict(output=outputs, state=new_state)

    def get_summaries(
        self,
        *,
        model_params: NestedTensor,
        state: NestedTensor,
        all_forward_outputs: list[NestedTensor],
    ) -> dict[str, Any]:
        summaries = {}
        for name, calc in self._calculators.items():
            calc_summaries = calc.get_summaries(
                model_params=model_params,
                state=state[name],
                all_forward_outputs=[out[name] for out in all_forward_outputs],
            )
            for key, value in calc_summaries.items():
                summaries[f"{name}/{key}"] = value
        return summaries


class PredictionOutputs(NamedTuple):
    """One batch's inputs and the model's predictions (GlobalMetricCalculator's outputs)."""

    input_batch: NestedTensor
    predict_outputs: NestedTensor


class GlobalMetricCalculator(BaseMetricCalculator):
    """Collects the model's predictions over all eval batches, then computes metrics on them.

    Each batch runs `model.<predict_method>(input_batch=...)` (on `input_batch[
    predict_input_field]` if set); `get_summaries` concatenates the host copies of all batches
    and calls `_calculate_metrics`, which subclasses implement (e.g. AUC or retrieval metrics
    that need every example at once).
    """

    @config_class
    class Config(BaseMetricCalculator.Config):
        """Configures GlobalMetricCalculator."""

        # The model method computing predictions.
        predict_method: str = "predict"
        # If set, the model method gets input_batch[predict_input_field] instead of the batch.
        predict_input_field: Optional[str] = None

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module],
        model: Module,
        model_param_partition_specs: NestedPartitionSpec,
    ):
        super().__init__(
            cfg, parent=parent, model=model, model_param_partition_specs=model_param_partition_specs
        )
        self._jit_predict = jax.jit(self._predict_in_jit)

    def init_state(self, *, prng_key: Tensor, model_params: NestedTensor) -> NestedTensor:
        del model_params
        return dict(prng_key=prng_key)

    def _predict_in_jit(
        self, model_params: NestedTensor, prng_key: Tensor, input_batch: NestedTensor
    ) -> tuple[Tensor, NestedTensor]:
        cfg = self.config
        next_key, predict_key = jax.random.split(prng_key)
        model_inputs = input_batch
        if cfg.predict_input_field is not None:
            model_inputs = input_batch[cfg.predict_input_field]
        outputs, _ = self._call_model(
            method=cfg.predict_method,
            prng_key=predict_key,
            model_params=model_params,
            input_batch=model_inputs,
        )
        return next_key, outputs

    def forward(
        self, input_batch: NestedTensor, *, model_params: NestedTensor, state: NestedTensor
    ) -> dict[str, NestedTensor]:
        with _mesh_context(self._mesh):
            next_key, outputs = self._jit_predict(model_params, state["prng_key"], input_batch)
        return dict(
            state=dict(prng_key=next_key),
            output=PredictionOutputs(
                input_batch=utils.replicate_to_local_data(input_batch),
                predict_outputs=utils.replicate_to_local_data(outputs),
            ),
        )

    def get_summaries(
        self,
        *,
        model_params: NestedTensor,
        state: NestedTensor,
        all_forward_outputs: list[NestedTensor],
    ) -> dict[str, Any]:
        del model_params, state
        if not all_forward_outputs:
            return {}
        merged = jax.tree.map(
            lambda *xs: np.concatenate([np.atleast_1d(x) for x in xs], axis=0),
            *all_forward_outputs,
        )
        # A leaf with an empty axis (e.g. [num_examples, 0] negatives) becomes None, as in
        # AXLearn: "no such input" for _calculate_metrics.
        merged = jax.tree.map(lambda x: x if all(d > 0 for d in x.shape) else None, merged)
        summaries = self._calculate_metrics(merged)
        return {self.formatted_metric_name(k): v for k, v in summaries.items()}

    def _calculate_metrics(self, outputs: PredictionOutputs) -> dict[str, Any]:
        """Computes the summaries from all batches' inputs and predictions (concatenated).

        Raises:
            NotImplementedError: Subclasses implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement _calculate_metrics")


def _iterate_input(input_module: Any):
    """Yields host batches of an input module, from the start of its data.

    Uses `input.batches(iter(input))` when the input is iterable (axlearn inputs), else the
    batches of `input.dataset()` (as NumPy for tf.data datasets).
    """
    if hasattr(type(input_module), "__iter__"):
        it = iter(input_module)
        if hasattr(input_module, "batches"):
            yield from input_module.batches(it)
        else:
            yield from it
        return
    dataset = input_module.dataset() if hasattr(input_module, "dataset") else input_module
    if hasattr(dataset, "as_numpy_iterator"):
        yield from dataset.as_numpy_iterator()
    else:
        yield from dataset


def _set_if_field(cfg: Any, **kwargs) -> Any:
    cfg = cfg.clone()
    for k, v in kwargs.items():
        if k in cfg:
            setattr(cfg, k, v)
    return cfg


def _scalar_text(value: Any) -> Optional[str]:
    if isinstance(value, WeightedScalar):
        value = value.mean
    if np.ndim(value) == 0 and isinstance(value, (int, float, np.generic, np.ndarray)):
        return f"{float(value):.6g}"
    return None


class SpmdEvaler(Module):
    """Evaluates the model over its whole input with GSPMD, on its `eval_policy`."""

    @config_class
    class Config(Module.Config):
        """Configures SpmdEvaler."""

        # The eval input (its is_training is set to False).
        input: Required[InstantiableConfig] = REQUIRED
        # Writes the eval summaries; dir is set by the trainer (<trainer dir>/summaries/<name>).
        summary_writer: InstantiableConfig = SummaryWriter.default_config()
        # When to run: (*, step, train_summaries) -> bool.
        eval_policy: InstantiableConfig = config_for_function(every_n_steps_policy)
        # Eval batch indices to trace with jax.profiler (one batch each, at most 3 eval runs).
        trace_at_iters: Sequence[int] = []
        # Cast float inputs and parameters to this dtype for eval; None: no cast.
        eval_dtype: Optional[Any] = None
        # Computes the metrics.
        metric_calculator: BaseMetricCalculator.Config = ModelSummaryAccumulator.default_config()
        # If set, writes input batches and metric_calculator outputs.
        output_writer: Optional[InstantiableConfig] = None

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module],
        model: Module,
        model_param_partition_specs: NestedPartitionSpec,
    ):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._mesh = _current_mesh_or_none()
        self._add_child("input", _set_if_field(cfg.input, is_training=False))
        self._add_child(
            "metric_calculator",
            cfg.metric_calculator.clone(eval_dtype=cfg.eval_dtype),
            model=model,
            model_param_partition_specs=model_param_partition_specs,
        )
        self._add_child("summary_writer", cfg.summary_writer)
        if cfg.output_writer is not None:
            self._add_child("output_writer", cfg.output_writer)
        self._eval_policy: EvalPolicy = cfg.eval_policy.instantiate()
        self._trace_steps: set[int] = set()
        self._batch_partition: Optional[PartitionSpec] = None

    @property
    def eval_policy(self) -> EvalPolicy:
        """The instantiated eval policy."""
        return self._eval_policy

    def _batch_axis_names(self) -> Any:
        parent_cfg = getattr(self.parent, "config", None)
        if parent_cfg is not None and "batch_axis_names" in parent_cfg:
            return parent_cfg.batch_axis_names
        return None

    def _to_global(self, host_batch: NestedTensor) -> NestedTensor:
        """Host batch -> global arrays sharded over the batch axes (replicated without a mesh)."""
        if self._mesh is None:
            return jax.tree.map(np.asarray, host_batch)
        from axlearn.common import utils_spmd  # pylint: disable=import-outside-toplevel

        if self._batch_partition is None:
            global_batch_size = utils_spmd.global_batch_size_of(host_batch)
            self._batch_partition = utils_spmd.batch_partition_spec(
                global_batch_size, mesh=self._mesh, batch_axis_names=self._batch_axis_names()
            )
        return utils_spmd.host_to_global_array(
            host_batch, mesh=self._mesh, partition=self._batch_partition
        )

    def _stop_trace(self, step: int, forward_outputs: Any):
        """Stops the profiler trace once `forward_outputs` are computed; records `step`."""
        jax.block_until_ready(forward_outputs)
        jax.profiler.stop_trace()
        self._trace_steps.add(step)

    def eval_step(
        self,
        step: int,
        *,
        prng_key: Tensor,
        model_params: NestedTensor,
        return_aux: bool = False,
        train_summaries: Optional[NestedTensor] = None,
        force_run: bool = False,
    ) -> tuple[Tensor, Optional[dict[str, Any]], Optional[list[NestedTensor]]]:
        """Runs eval at `step` if the policy says so (or `force_run`).

        Args:
            step: The current train step.
            prng_key: The PRNG key (returned unchanged, for the caller's next use).
            model_params: The model parameters.
            return_aux: Whether to return the per-batch outputs.
            train_summaries: The latest train summaries, for the policy.
            force_run: Run regardless of the policy.

        Returns:
            (prng_key, summaries, outputs): summaries are host values (None if eval did not run);
            outputs are the per-batch metric_calculator outputs if `return_aux`.
        """
        cfg = self.config
        if not force_run and not self._eval_policy(
            step=step, train_summaries=train_summaries or {}
        ):
            return prng_key, None, None
        start = time.perf_counter()
        calc_state = self.metric_calculator.init_state(prng_key=prng_key, model_params=model_params)
        all_outputs = []
        stop_trace_at = None
        num_batches = 0
        forward_outputs = None
        for batch_ix, host_batch in enumerate(_iterate_input(self.input)):
            if batch_ix == stop_trace_at:
                self._stop_trace(step, forward_outputs)
                stop_trace_at = None
            if batch_ix in cfg.trace_at_iters and len(self._trace_steps) < 3:
                jax.profiler.start_trace(self.summary_writer.config.dir)
                stop_trace_at = batch_ix + 1
            global_batch = self._to_global(host_batch)
            forward_outputs = self.metric_calculator.forward(
                global_batch, model_params=model_params, state=calc_state
            )
            calc_state = forward_outputs["state"]
            all_outputs.append(forward_outputs["output"])
            if "output_writer" in self.children:
                self.output_writer.write(
                    input_batch=global_batch, output_batch=forward_outputs["output"]
                )
            num_batches += 1
        if stop_trace_at is not None:
            self._stop_trace(step, forward_outputs)
        summaries = self.metric_calculator.get_summaries(
            model_params=model_params, state=calc_state, all_forward_outputs=all_outputs
        )
        summaries = fetch_to_host(summaries)  # Also waits for the eval's device work.
        elapsed = time.perf_counter() - start
        if num_batches == 0:
            logging.warning("%s: the eval input yielded no batches at step %d.", self.path(), step)
        self.summary_writer(
            step, {**summaries, "eval_time_secs": elapsed, "num_eval_batches": num_batches}
        )
        parts = []
        for path, value in utils.flatten_items(
            summaries, is_leaf=lambda x: isinstance(x, WeightedScalar)
        ):
            text = _scalar_text(value)
            if text is not None:
                parts.append(f"{path}={text}")
        logging.info(
            "%s step %d: %s (%d batches, %.3f s)",
            self.path(),
            step,
            ", ".join(parts) or "no metrics",
            num_batches,
            elapsed,
        )
        return prng_key, summaries, (all_outputs if return_aux else None)
