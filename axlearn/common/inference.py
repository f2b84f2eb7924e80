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
`model/...` arrays of a trainer checkpoint: no optimizer state, no input iterator. The mesh is
the trainer's mesh rule for the devices at hand; the saved shards are resharded onto it, so a
checkpoint of any mesh restores on any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common.checkpointer import Checkpointer, layout
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.evaler import SpmdEvaler
from axlearn.common.module import Module
from axlearn.common.module import functional as F
from axlearn.common.trainer import SpmdTrainer
from axlearn.common.trainer_utils import is_unset, shardings_of_specs
from axlearn.common.utils import NestedTensor, Tensor
from axlearn.common.utils_spmd import (
    HybridMeshShape,
    MeshShape,
    create_device_mesh,
    infer_mesh_shape,
)

# The prefix of the model parameters' leaves in a trainer checkpoint.
_MODEL_PREFIX = "model/"


class InferenceRunner(Module):
    """Runs a model's methods with parameters restored from a trainer checkpoint."""

    @config_class
    class Config(Module.Config):
        """Configures InferenceRunner."""

        # The mesh shape (one -1 is inferred from the device count), or a HybridMeshShape.
        mesh_shape: Required[Union[MeshShape, HybridMeshShape]] = REQUIRED
        # The mesh axis names, one per mesh_shape entry.
        mesh_axis_names: Required[Sequence[str]] = REQUIRED
        # The mesh axes over which input batches are split.
        batch_axis_names: Optional[Union[str, Sequence[str]]] = "data"
        # The model (e.g. causal_lm.Model).
        model: Required[InstantiableConfig] = REQUIRED
        # The checkpointer whose `dir` holds the step directories to restore from.
        checkpointer: Required[InstantiableConfig] = REQUIRED
        # Evalers by name, run by `run_evalers` (their summary writers need `dir` set).
        evalers: dict[str, SpmdEvaler.Config] = {}

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
    ) -> InferenceRunner:
        """Builds the runner of the run in `trainer_dir` (see the module docstring).

        Args:
            trainer_dir: The run's trainer dir.
            config_overrides: `PATH=VALUE` overrides of the trainer config (e.g. to change an
                evaler's input).
            evalers: The evalers to build (names); None: all of the experiment's.

        Returns:
            The runner (parameters not yet restored).

        Raises:
            launch_trainer.TrainerDirError: If the run's config cannot be rebuilt.
            ValueError: If an evaler name is not one of the experiment's.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.launch_trainer import trainer_config_from_dir

        trainer_cfg = trainer_config_from_dir(trainer_dir, config_overrides=config_overrides)
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

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None, devices=None):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        mesh_devices = devices if devices is not None else create_device_mesh(cfg.mesh_shape)
        if not isinstance(cfg.mesh_shape, HybridMeshShape):
            cfg.mesh_shape = infer_mesh_shape(cfg.mesh_shape, num_devices=mesh_devices.size)
        self._mesh = jax.sharding.Mesh(mesh_devices, tuple(cfg.mesh_axis_names))
        self._params: Optional[NestedTensor] = None
        # The trainer config the runner was built from, if known (see `from_trainer_dir`).
        self.trainer_config: Optional[SpmdTrainer.Config] = None
        self._step: Optional[int] = None
        with jax.set_mesh(self._mesh):
            self._add_child("model", cfg.model)
            self._add_child("checkpointer", cfg.checkpointer)
            self._param_specs = self.model.create_parameter_specs_recursively()
            self._param_shardings = shardings_of_specs(self._mesh, self._param_specs)
            partition_specs = jax.tree.map(lambda s: s.spec, self._param_shardings)
            self._evalers: dict[str, SpmdEvaler] = {}
            for name, evaler_cfg in cfg.evalers.items():
                self._evalers[name] = self._add_child(
                    name, evaler_cfg, model=self.model, model_param_partition_specs=partition_specs
                )

    @property
    def mesh(self) -> jax.sharding.Mesh:
        """The device mesh."""
        return self._mesh

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
    def evaler_names(self) -> list[str]:
        """The names of the evalers `run_evalers` can run."""
        return list(self._evalers)

    def set_params(self, params: NestedTensor, *, step: Optional[int] = None) -> None:
        """Uses `params` (host or device arrays of the model's structure), placed on the mesh.

        Args:
            params: The parameter tree.
            step: The step to report, if known.
        """
        self._params = jax.device_put(params, self._param_shardings)
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
        ckpt: Checkpointer = self.checkpointer
        base_dir = ckpt.config.dir
        if step is None:
            step = layout.latest_checkpoint_step(base_dir)
            if step is None:
                raise ValueError(f"No committed checkpoint under {base_dir}.")
        step_dir = ckpt.ckpt_dir(step)
        try:
            index = layout.read_index_file(step_dir)
        except layout.CheckpointIndexError as e:
            raise ValueError(f"Cannot restore step {step} from {step_dir}: {e}") from e
        leaves = [leaf for leaf in index["leaves"] if leaf["path"].startswith(_MODEL_PREFIX)]
        if not leaves:
            raise ValueError(
                f"{step_dir} holds no model/... parameters (not a trainer checkpoint)."
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
        restored = ckpt.storage.restore_from_dir(
            step, target, ckpt_dir=step_dir, index=dict(index, leaves=leaves)
        )
        self._params, self._step = restored["model"], step
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

        fn = jax.jit(call) if jit else call
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


def find_vocab_config(trainer_cfg: Any) -> Optional[Any]:
    """The vocabulary config of a trainer config's inputs: the first `vocab_cfg` field found.

    Args:
        trainer_cfg: The trainer config (or None).

    Returns:
        The vocabulary config (instantiate it for a seqio vocabulary), or None.
    """
    found = []

    def visit(node):
        if found or node is None:
            return
        if isinstance(node, dict):
            for value in node.values():
                visit(value)
        elif hasattr(node, "keys") and hasattr(node, "klass") or hasattr(node, "fn"):
            for key in node.keys():
                value = getattr(node, key)
                if key == "vocab_cfg" and value is not None:
                    found.append(value)
                    return
                visit(value)

    if trainer_cfg is not None:
        visit(trainer_cfg.input)
        visit(trainer_cfg.evalers)
    return found[0] if found else None


def sentencepiece_model_file(trainer_cfg: Any) -> Optional[str]:
    """The sentencepiece model file of a trainer config's vocabulary, if it has one.

    Args:
        trainer_cfg: The trainer config (or None).

    Returns:
        The file path, or None (no vocabulary found, or not a sentencepiece one).
    """
    vocab_cfg = find_vocab_config(trainer_cfg)
    if vocab_cfg is None:
        return None
    vocab = vocab_cfg.instantiate()
    return getattr(vocab, "sentencepiece_model_file", None)
