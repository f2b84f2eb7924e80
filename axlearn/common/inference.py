"""InferenceRunner: a trained model on a device mesh, its parameters restored from a checkpoint.

    runner = InferenceRunner.from_trainer_dir("/tmp/gpt-tiny")        # the run's config
    step = runner.restore()                                            # latest step (or step=N)
    logits = runner.predict(input_ids)                                 # [batch, len, vocab]
    out = runner.sample_decode(prompts, max_new_tokens=40, temperature=0.8, top_k=40, seed=0)
    out = runner.beam_search_decode(prompts, max_new_tokens=20, num_beams=4)
    metrics = runner.run_evalers()                                     # the experiment's evalers

The runner is built from a trainer config (`InferenceRunner.config_from_trainer`), or from a
trainer dir, whose run's config is rebuilt from its `launch_trainer_flags` and checked against
its `trainer_config` dump (`launch_trainer.trainer_config_from_dir`). `restore` reads only the
`model/...` arrays (and the PRNG key) of a trainer checkpoint: no optimizer state, no input
iterator. The mesh is the trainer's mesh rule for the devices at hand; the saved shards are
resharded onto it, so a checkpoint of any mesh restores on any other.

AXLearn's API is here too. With `init_state_builder` pointing at a checkpoint (e.g.
`TensorStoreStateStorageBuilder` with `dir` set to one step's directory, or a
`RestoreAndConvertBuilder` with `EmaParamsConverter` for the EMA weights), the state (PRNG key
and model) is built when the runner is constructed: any checkpoint holding at least that state
restores, also when dtypes differ (`CONTAINS_STATE_UP_TO_DTYPE`). A state can also be passed to
the constructor (`inference_runner_state`). Then

    for batch in runner.run(batches, method="predict"):   # {"inputs", "outputs", ...}
        ...
    method_runner = runner.create_method_runner(method="predict")   # MethodRunner
    output = method_runner(input_batch)

run a model method on input batches placed with `input_batch_partition_spec`; outputs are
resharded with `output_batch_partition_spec`. `inference_dtype` casts the parameters and the
float inputs before the method runs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common import utils
from axlearn.common.checkpointer import (
    Checkpointer,
    CheckpointValidationType,
    check_metadata,
    layout,
)
from axlearn.common.checkpointer.recovery import CorruptCheckpointError, corrupt_message
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
)
from axlearn.common.config.paths import ConfigPathError, lookup_path
from axlearn.common.evaler import SpmdEvaler

# Token generation and the method-runner API: public under this module's path too.
from axlearn.common.inference_decoding import (  # noqa: F401
    BeamResult,
    DecodingMixin,
    logits_modifier,
)
from axlearn.common.inference_method_runner import (  # noqa: F401
    MethodRunner,
    _InferenceRunnerState,
    reshard,
)
from axlearn.common.mesh_resolution import build_mesh
from axlearn.common.module import Module
from axlearn.common.module import functional as F
from axlearn.common.state_builder import (
    BaseStateStorageBuilder,
    Builder,
    TensorStoreStateStorageBuilder,
)

# Text in, text out on top of the runner: public under this module's path too.
from axlearn.common.text_generator import (  # noqa: F401
    TextGenerator,
    find_text_source,
    sentencepiece_model_file,
)
from axlearn.common.trainer import SpmdTrainer
from axlearn.common.trainer_utils import is_unset, shardings_of_specs
from axlearn.common.utils import DataPartitionType, NestedTensor, Tensor, TensorSpec
from axlearn.common.utils_spmd import (
    HybridMeshShape,
    MeshShape,
)

# The prefix of the model parameters' leaves in a trainer checkpoint.
_MODEL_PREFIX = "model/"
# The checkpoint leaf of the trainer's PRNG key.
_PRNG_KEY_PATH = "prng_key"


def _builder_is_configured(cfg: Optional[Builder.Config]) -> bool:
    """Whether `init_state_builder` names a state to build (a storage builder needs a dir)."""
    if cfg is None:
        return False
    if issubclass(cfg.klass, BaseStateStorageBuilder):
        return getattr(cfg, "dir", None) is not None or cfg.base_dir is not None
    return True


class InferenceRunner(DecodingMixin, Module):
    """Runs a model's methods with parameters restored from a checkpoint.

    See the module docstring: `restore` (a trainer checkpoint through `checkpointer`) or
    `init_state_builder` (at construction) gives the parameters; `predict`, the decoding
    methods, `run_method`, `run` and `create_method_runner` use them.
    """

    @config_class
    class Config(Module.Config):
        """Configures InferenceRunner."""

        # The mesh shape (one -1 is inferred from the device count), or a HybridMeshShape.
        mesh_shape: Required[Union[MeshShape, HybridMeshShape]] = REQUIRED
        # The mesh axis names, one per mesh_shape entry.
        mesh_axis_names: Required[Sequence[str]] = REQUIRED
        # The mesh axes over which input batches of `predict`/`run_method`/decoding are split.
        batch_axis_names: Optional[Union[str, Sequence[str]]] = "data"
        # The model (e.g. causal_lm.Model).
        model: Required[InstantiableConfig] = REQUIRED
        # The checkpointer whose `dir` holds the step directories `restore` reads (None: none).
        checkpointer: Optional[InstantiableConfig] = None
        # Evalers by name, run by `run_evalers` (their summary writers need `dir` set).
        evalers: dict[str, SpmdEvaler.Config] = {}
        # Builds the state at construction; a storage builder without dir/base_dir builds none.
        init_state_builder: Optional[Builder.Config] = (
            TensorStoreStateStorageBuilder.default_config().set(
                validation=CheckpointValidationType.CONTAINS_STATE_UP_TO_DTYPE
            )
        )
        # Casts the parameters and float inputs to this dtype before a method runs (None: no).
        inference_dtype: Optional[jnp.dtype] = None
        # How `run`/`create_method_runner` place (host) input batches on the mesh.
        input_batch_partition_spec: DataPartitionType = DataPartitionType.FULL
        # How `run`/`create_method_runner` shard the output batches.
        output_batch_partition_spec: DataPartitionType = DataPartitionType.BATCH

    @classmethod
    def config_from_trainer(cls, trainer_cfg: SpmdTrainer.Config) -> Config:
        """The runner config of a trainer config: its mesh, model, checkpointer and evalers.

        Args:
            trainer_cfg: The trainer config (its `dir` set).

        Returns:
            The runner config; evaler summaries go to `<dir>/summaries/eval_only/<name>`.
        """
        checkpointer = trainer_cfg.checkpointer.clone()
        if is_unset(getattr(checkpointer, "dir", None)):
            checkpointer.dir = f"{trainer_cfg.dir.rstrip('/')}/checkpoints"
        evalers = {}
        for name, evaler_cfg in trainer_cfg.evalers.items():
            evaler_cfg = evaler_cfg.clone()
            evaler_cfg.summary_writer.dir = (
                f"{trainer_cfg.dir.rstrip('/')}/summaries/eval_only/{name}"
            )
            evalers[name] = evaler_cfg
        return cls.default_config().set(
            name=trainer_cfg.name or "inference_runner",
            mesh_shape=trainer_cfg.mesh_shape,
            mesh_axis_names=trainer_cfg.mesh_axis_names,
            batch_axis_names=trainer_cfg.batch_axis_names,
            model=trainer_cfg.model.clone(),
            checkpointer=checkpointer,
            evalers=evalers,
        )

    @classmethod
    def from_trainer_dir(
        cls,
        trainer_dir: str,
        *,
        config_overrides: Sequence[str] = (),
        evalers: Optional[Sequence[str]] = None,
        step: Optional[int] = None,
        module: Optional[str] = None,
    ) -> InferenceRunner:
        """Builds the runner of the run in `trainer_dir` (see the module docstring).

        Args:
            trainer_dir: The run's trainer dir.
            config_overrides: `PATH=VALUE` overrides of the trainer config (e.g. to change an
                evaler's input).
            evalers: The evalers to build (names); None: all of the experiment's.
            step: The checkpoint step that will be restored (None: the newest): the config is
                rebuilt from the run record that step was made with.
            module: The experiment module the user named (`--module`): a run record's module
                outside `axlearn.experiments` is imported only when it is this one (or the same
                module under another import path).

        Returns:
            The runner (parameters not yet restored).

        Raises:
            launch_trainer.TrainerDirError: If the run's config cannot be rebuilt.
            ValueError: If an evaler name is not one of the experiment's.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.launch_trainer import trainer_config_from_dir

        trainer_cfg = trainer_config_from_dir(
            trainer_dir, config_overrides=config_overrides, step=step, module=module
        )
        cfg = cls.config_from_trainer(trainer_cfg)
        if evalers is not None:
            unknown = [n for n in evalers if n not in cfg.evalers]
            if unknown:
                raise ValueError(
                    f"Unknown evaler(s) {unknown}; the experiment has {sorted(cfg.evalers)}"
                )
            cfg.evalers = {n: cfg.evalers[n] for n in evalers}
        runner = cfg.instantiate(parent=None)
        runner.trainer_config = trainer_cfg
        return runner

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module] = None,
        devices: Optional[Union[np.ndarray, Sequence[Any]]] = None,
        inference_runner_state: Union[_InferenceRunnerState, bool] = False,
    ):
        """Builds the mesh, the model and (if configured) the state.

        Args:
            cfg: The config.
            parent: The parent module, if any.
            devices: The devices of the mesh (default: all).
            inference_runner_state: A state (`_InferenceRunnerState`, e.g. another runner's
                `inference_runner_state`) to use instead of building one; True: a state of
                `jax.ShapeDtypeStruct`s (nothing is read; for lowering); False: build the state
                with `init_state_builder` if that is configured.

        Raises:
            ValueError: If `inference_dtype` is not a float dtype.
        """
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.inference_dtype is not None:
            utils.validate_float_dtype(cfg.inference_dtype)
        self._mesh, cfg.mesh_shape = build_mesh(
            cfg.mesh_shape, cfg.mesh_axis_names, devices=devices, config_path=self.path()
        )
        logging.info("%s: mesh %s", self.path(), self._mesh)
        self._params: Optional[NestedTensor] = None
        self._prng_key: Optional[Tensor] = None
        self._jit_cache: dict[tuple, Callable] = {}
        # The trainer config the runner was built from, if known (see `from_trainer_dir`).
        self.trainer_config: Optional[SpmdTrainer.Config] = None
        self._step: Optional[int] = None
        with jax.set_mesh(self._mesh):
            self._add_child("model", cfg.model)
            if cfg.checkpointer is not None:
                self._add_child("checkpointer", cfg.checkpointer)
            self._param_specs = self._inference_cast(
                self.model.create_parameter_specs_recursively()
            )
            self._param_shardings = shardings_of_specs(self._mesh, self._param_specs)
            partition_specs = jax.tree.map(lambda s: s.spec, self._param_shardings)
            key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
            self._state_specs = _InferenceRunnerState(
                prng_key=TensorSpec(
                    shape=key.shape, dtype=key.dtype, mesh_axes=PartitionSpec(None)
                ),
                model=self._param_specs,
            )
            self._evalers: dict[str, SpmdEvaler] = {}
            for name, evaler_cfg in cfg.evalers.items():
                self._evalers[name] = self._add_child(
                    name, evaler_cfg, model=self.model, model_param_partition_specs=partition_specs
                )
            if inference_runner_state is True:
                state = jax.tree.map(
                    lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), self._state_specs
                )
                self._params, self._prng_key = state.model, state.prng_key
            elif inference_runner_state is not False:
                self._params = inference_runner_state.model
                self._prng_key = inference_runner_state.prng_key
            elif _builder_is_configured(cfg.init_state_builder):
                self._build_state(cfg.init_state_builder)

    def _build_state(self, builder_cfg: Builder.Config) -> None:
        """Builds the state with `builder_cfg` (see `init_state_builder`)."""
        logging.info("%s: building the state with %s", self.path(), builder_cfg.klass.__name__)
        builder = builder_cfg.clone(name="init_state_builder").instantiate(parent=None)
        if builder.input_state_type() != Builder.StateType.TENSOR_SPECS:
            logging.warning(
                "init_state_builder %s expects StateType.TENSORS, but the runner gives it "
                "StateType.TENSOR_SPECS.",
                builder_cfg.klass.__name__,
            )
        built = builder(Builder.State(step=0, trainer_state=self._state_specs, built_keys=set()))
        state: _InferenceRunnerState = built.trainer_state
        self._params, self._prng_key, self._step = state.model, state.prng_key, built.step

    def mesh(self) -> jax.sharding.Mesh:
        """The device mesh (also usable as `with runner.mesh():`).

        Returns:
            The mesh.
        """
        return self._mesh

    @property
    def inference_runner_state(self) -> _InferenceRunnerState:
        """The state: the PRNG key and the model parameters (as restored or set).

        Raises:
            RuntimeError: If no parameters were restored or set.
        """
        prng_key = self._prng_key
        if prng_key is None:
            prng_key = jax.random.PRNGKey(0)
        return _InferenceRunnerState(prng_key=prng_key, model=self.params)

    @property
    def step(self) -> Optional[int]:
        """The step of the restored parameters (None before `restore`)."""
        return self._step

    @property
    def params(self) -> NestedTensor:
        """The model parameters (after `restore` or `set_params`)."""
        if self._params is None:
            raise RuntimeError(f"{self.path()}: call restore() (or set_params) first.")
        return self._params

    @property
    def context_length(self) -> Optional[int]:
        """The longest sequence (prompt plus new tokens) generation allows, None if unbounded.

        A learned positional embedding's size if the decoder has one, else the sequence length
        the run trained on (`input.source.max_sequence_length` of its trainer config): the model
        has seen no position beyond it, and a KV cache sized by an absurd request would not fit
        in memory (the process would abort instead of failing with a message).
        """
        bounds = []
        pos_emb = _config_get(self.config.model, "decoder.emb.pos_emb")
        if pos_emb is not None:
            bounds.append(_config_get(pos_emb, "num_embeddings"))
        if self.trainer_config is not None:
            bounds.append(_config_get(self.trainer_config, "input.source.max_sequence_length"))
        bounds = [b for b in bounds if isinstance(b, int) and b > 0]
        return min(bounds) if bounds else None

    @property
    def evaler_names(self) -> list[str]:
        """The names of the evalers `run_evalers` can run."""
        return list(self._evalers)

    def set_params(self, params: NestedTensor, *, step: Optional[int] = None) -> None:
        """Uses `params` (host or device arrays of the model's structure), placed on the mesh.

        Float parameters are cast to `inference_dtype` if it is set.

        Args:
            params: The parameter tree.
            step: The step to report, if known.
        """
        # Cast to `inference_dtype` (if set), as restored parameters are.
        self._params = jax.device_put(self._inference_cast(params), self._param_shardings)
        self._step = step

    def restore(self, step: Optional[int] = None) -> int:
        """Restores the model parameters of a trainer checkpoint (latest committed or `step`).

        Only `model/...` arrays are read: optimizer state and input iterator are skipped.

        Args:
            step: The step; None: the newest committed one.

        Returns:
            The restored step.

        Raises:
            ValueError: If there is no committed checkpoint (or not at `step`).
            StateMismatchError: If the saved parameters do not match the model (naming them).
        """
        if self.config.checkpointer is None:
            raise ValueError(
                f"{self.path()}: restore() reads through `checkpointer`, which is not set; set "
                "it (config_from_trainer does), or restore with `init_state_builder`."
            )
        ckpt: Checkpointer = self.checkpointer
        base_dir = ckpt.config.dir
        if step is None:
            step = layout.latest_checkpoint_step(base_dir)
            if step is None:
                raise ValueError(
                    f"{self.path()}: No committed checkpoint under {base_dir}: the run saved "
                    "none (its checkpointer.save_policy did not fire before it stopped; "
                    f"`axlearn checkpoint list {base_dir}` shows what is there)."
                )
        step_dir = ckpt.ckpt_dir(step)
        if not layout.is_committed(step_dir):
            committed = [layout.parse_step_from_dir(p) for p in layout.checkpoint_paths(base_dir)]
            what = "its directory is uncommitted" if os.path.isdir(step_dir) else "no such step"
            raise ValueError(
                f"{self.path()}: Cannot restore step {step}: {what} under {base_dir}; committed "
                f"steps: {committed}. Pass "
                "one of them as --step (or leave --step out for the newest)."
            )
        try:
            index = layout.read_index_file(step_dir)
        except layout.CheckpointIndexError as e:
            raise ValueError(
                f"{self.path()}: Cannot restore step {step} from {step_dir}: {e}. Pass a committed "
                "step as --step (or leave --step out for the newest)."
            ) from e
        problems = check_metadata(step_dir, index)
        if problems:
            raise CorruptCheckpointError(corrupt_message(step_dir, "; ".join(problems)))
        leaves = [leaf for leaf in index["leaves"] if leaf["path"].startswith(_MODEL_PREFIX)]
        if not leaves:
            raise ValueError(
                f"{self.path()}: {step_dir} holds no model/... parameters (not a trainer "
                "checkpoint); point it at a trainer dir's checkpoints."
            )
        target = {
            "model": jax.tree.map(
                lambda spec, sharding: jax.ShapeDtypeStruct(
                    spec.shape, spec.dtype, sharding=sharding
                ),
                self._param_specs,
                self._param_shardings,
                is_leaf=lambda x: hasattr(x, "mesh_axes"),
            )
        }
        key_leaves = [leaf for leaf in index["leaves"] if leaf["path"] == _PRNG_KEY_PATH]
        key_spec = self._state_specs.prng_key
        if key_leaves and tuple(key_leaves[0].get("shape", ())) == tuple(key_spec.shape):
            leaves += key_leaves
            target[_PRNG_KEY_PATH] = jax.ShapeDtypeStruct(
                key_spec.shape, key_spec.dtype, sharding=NamedSharding(self._mesh, PartitionSpec())
            )
        # The parameters are cast to `inference_dtype` (if set) as they are read.
        validation = (
            CheckpointValidationType.EXACT
            if self.config.inference_dtype is None
            else CheckpointValidationType.EXACT_UP_TO_DTYPE
        )
        restored = ckpt.storage.restore_from_dir(
            step,
            target,
            ckpt_dir=step_dir,
            index=dict(index, leaves=leaves),
            validation=validation,
        )
        self._params, self._step = restored["model"], step
        if _PRNG_KEY_PATH in restored:
            self._prng_key = restored[_PRNG_KEY_PATH]
        logging.info("%s: restored the model parameters of %s.", self.path(), step_dir)
        return step

    def _batch_sharding(self, rank: int) -> NamedSharding:
        axes = self.config.batch_axis_names
        return NamedSharding(self._mesh, PartitionSpec(axes, *([None] * (rank - 1))))

    def _to_mesh(self, batch: NestedTensor) -> NestedTensor:
        """Places a host batch on the mesh (batch axis over `batch_axis_names` when it divides)."""
        batch_size = self._mesh_batch_size()

        def place(x):
            x = np.asarray(x)
            if x.ndim and x.shape[0] % batch_size == 0:
                return jax.device_put(x, self._batch_sharding(x.ndim))
            return jax.device_put(x, NamedSharding(self._mesh, PartitionSpec()))

        return jax.tree.map(place, batch)

    def _mesh_batch_size(self) -> int:
        axes = self.config.batch_axis_names
        axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
        return int(np.prod([self._mesh.shape[a] for a in axes])) if axes else 1

    def run_method(
        self,
        method: str,
        inputs: dict[str, Any],
        *,
        prng_key: Optional[Tensor] = None,
        jit: bool = True,
    ) -> Any:
        """Calls `model.<method>(**inputs)` with the parameters, in inference mode.

        Args:
            method: The model method (e.g. "predict", "forward").
            inputs: Its keyword arguments (host arrays are placed on the mesh).
            prng_key: The invocation's PRNG key; default PRNGKey(0).
            jit: Whether to jit the call.

        Returns:
            The method's outputs (device arrays).
        """
        if prng_key is None:
            prng_key = jax.random.PRNGKey(0)

        def call(params, inputs, prng_key):
            outputs, _ = F(
                self.model,
                prng_key=prng_key,
                state=params,
                inputs=inputs,
                is_training=False,
                method=method,
            )
            return outputs

        fn = self._cached_jit(("method", method), lambda: call) if jit else call
        with jax.set_mesh(self._mesh):
            return fn(self.params, self._to_mesh(inputs), prng_key)

    def predict(self, input_ids: Any) -> Tensor:
        """Returns the model's logits [batch, length, vocab] for `input_ids` [batch, length].

        Args:
            input_ids: Int token ids.

        Returns:
            The logits (float32 on the host).
        """
        outputs = self.run_method("predict", dict(input_batch=dict(input_ids=input_ids)))
        return np.asarray(jax.device_get(outputs["logits"]), np.float32)

    def _cached_jit(self, key: tuple, build: Callable[[], Callable], **jit_kwargs) -> Callable:
        """jax.jit(build()) once per `key` (the settings a decoding function closes over)."""
        if key not in self._jit_cache:
            self._jit_cache[key] = jax.jit(build(), **jit_kwargs)
        return self._jit_cache[key]

    def run_evalers(
        self,
        names: Optional[Sequence[str]] = None,
        *,
        prng_key: Optional[Tensor] = None,
        on_result: Optional[Callable[[str, dict[str, Any]], None]] = None,
    ) -> dict[str, dict[str, Any]]:
        """Runs evalers over their whole inputs with the restored parameters; trains nothing.

        Each evaler writes its summaries (at the restored step) to its summary writer and logs
        them, as in training.

        Args:
            names: The evalers to run; None: all.
            prng_key: The key passed to the evalers; default PRNGKey(0).
            on_result: Called with (name, summaries) after each evaler.

        Returns:
            {name: summaries (host values)}.
        """
        if prng_key is None:
            prng_key = jax.random.PRNGKey(0)
        step = self._step if self._step is not None else 0
        results = {}
        with jax.set_mesh(self._mesh):
            for name in names if names is not None else self.evaler_names:
                prng_key, summaries, _ = self._evalers[name].eval_step(
                    step, prng_key=prng_key, model_params=self.params, force_run=True
                )
                results[name] = summaries
                if on_result is not None:
                    on_result(name, summaries)
        return results

    def run(
        self,
        input_batches: Iterable[NestedTensor],
        *,
        method: str,
        prng_key: Optional[Tensor] = None,
        **kwargs,
    ) -> Generator[dict[str, NestedTensor], None, None]:
        """Runs `model.<method>` on each batch (see `create_method_runner`).

        Args:
            input_batches: The input batches (host arrays or global arrays).
            method: The model method; it takes `input_batch` and returns a tree of tensors
                with a leading batch axis.
            prng_key: The key of the first batch; default: the state's key.
            **kwargs: More keyword arguments of the method.

        Yields:
            Per batch, {"inputs": the input batch, "outputs": the method's outputs,
            "module_outputs": the kept module outputs}, as global arrays.

        Raises:
            AttributeError: If the model has no such method.
        """
        runner = self.create_method_runner(method=method, prng_key=prng_key, **kwargs)
        for input_batch in input_batches:
            logging.log_first_n(logging.INFO, "Input batch: %s", 3, input_batch)
            output = runner(input_batch)
            self.vlog(2, "Output batch: %s", output.output_batch)
            yield {
                "inputs": output.input_batch,
                "outputs": output.output_batch,
                "module_outputs": output.module_outputs,
            }

    def create_method_runner(
        self,
        *,
        method: str,
        prng_key: Optional[Tensor] = None,
        drop_module_outputs: Callable[[str], bool] = lambda _: True,
        **kwargs,
    ) -> MethodRunner:
        """A `MethodRunner` of `model.<method>`, jitted on the mesh with the state's parameters.

        Input batches are placed with `input_batch_partition_spec` and the outputs resharded
        with `output_batch_partition_spec`; float inputs and the parameters are cast to
        `inference_dtype` if it is set.

        Args:
            method: The model method; it takes `input_batch` and returns a tree of tensors
                with a leading batch axis.
            prng_key: The key of the first call; default: the state's key.
            drop_module_outputs: Called with each module output's path ("a/b"); True drops it.
                Default: drop all. Kept module outputs are replicated.
            **kwargs: More keyword arguments of the method (closed over by the jitted call).

        Returns:
            The MethodRunner.

        Raises:
            AttributeError: If the model has no such method.
            RuntimeError: If no parameters were restored or set.
        """
        cfg = self.config
        available = {m for m in dir(self.model) if not m.startswith("_")}
        if method not in available:
            raise AttributeError(
                f"{self.path()}.model does not have method {method}. "
                f"Available methods are {sorted(available)}."
            )
        state = self.inference_runner_state
        mesh = self._mesh
        with jax.set_mesh(mesh):
            input_spec = utils.data_partition_type_to_spec(cfg.input_batch_partition_spec)
            output_spec = utils.data_partition_type_to_spec(cfg.output_batch_partition_spec)
        replicated = NamedSharding(mesh, PartitionSpec(None))

        def run_on_batch(model_params, prng_key, input_batch):
            model_params = jax.lax.with_sharding_constraint(model_params, self._param_shardings)
            prng_key = jax.lax.with_sharding_constraint(prng_key, replicated)
            input_batch = jax.tree.map(lambda x: reshard(x, input_spec, mesh), input_batch)
            next_key, outputs, summaries, module_outputs = self._inference_iter(
                prng_key,
                model_params,
                input_batch,
                method=method,
                drop_module_outputs=drop_module_outputs,
                **kwargs,
            )
            outputs = jax.tree.map(lambda x: reshard(x, output_spec, mesh), outputs)
            next_key = jax.lax.with_sharding_constraint(next_key, replicated)
            return next_key, outputs, summaries, module_outputs

        jitted = jax.jit(run_on_batch)
        params = state.model

        def jit_run_on_batch(key, input_batch):
            return jitted(params, key, input_batch)

        return MethodRunner(
            prng_key=state.prng_key if prng_key is None else prng_key,
            mesh=mesh,
            input_batch_partition_spec=cfg.input_batch_partition_spec,
            jit_run_on_batch=jit_run_on_batch,
        )

    def _inference_cast(self, in_tree: NestedTensor) -> NestedTensor:
        """Casts the floats of a tree (tensors or specs) to `inference_dtype`, if set."""
        dtype = self.config.inference_dtype
        if dtype is None:
            return in_tree

        def cast(x: Any) -> Any:
            if isinstance(x, TensorSpec):
                if x.dtype is None or jnp.issubdtype(x.dtype, jnp.floating):
                    return dataclasses.replace(x, dtype=dtype)
                return x
            return utils.cast_floats(x, to_dtype=dtype)

        return jax.tree.map(cast, in_tree, is_leaf=lambda x: isinstance(x, TensorSpec))

    def _inference_iter(
        self,
        prng_key: Tensor,
        model_params: NestedTensor,
        input_batch: dict[str, Any],
        *,
        method: str,
        drop_module_outputs: Callable[[str], bool] = lambda _: True,
        **kwargs,
    ) -> tuple[Tensor, NestedTensor, NestedTensor, NestedTensor]:
        """One batch (traced): (next key, outputs, summaries, kept module outputs)."""
        next_key, iter_key = jax.random.split(prng_key)
        input_batch = utils.dispatch_input_batch(input_batch)
        outputs, collection = F(
            self.model,
            prng_key=iter_key,
            state=model_params,
            inputs={"input_batch": self._inference_cast(input_batch), **kwargs},
            is_training=False,
            method=method,
            drop_output_collections=(),
        )
        module_outputs = utils.prune_tree(
            collection.module_outputs, should_prune=lambda path, _: drop_module_outputs(path)
        )
        return next_key, outputs, collection.summaries, module_outputs


def _config_get(cfg: Any, path: str) -> Any:
    """The value at dotted `path` of a config (`config.paths.lookup_path`), None where a part is
    missing or None."""
    try:
        return lookup_path(cfg, path)
    except ConfigPathError:
        return None
