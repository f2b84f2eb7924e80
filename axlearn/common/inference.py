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

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common import decoding, logit_modifiers
from axlearn.common.checkpointer import Checkpointer, check_metadata, layout
from axlearn.common.checkpointer.recovery import CorruptCheckpointError, corrupt_message
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
)
from axlearn.common.config.paths import ConfigPathError, lookup_path
from axlearn.common.evaler import SpmdEvaler
from axlearn.common.mesh_resolution import build_mesh
from axlearn.common.module import Module
from axlearn.common.module import functional as F

# Text in, text out on top of the runner: public under this module's path too.
from axlearn.common.text_generator import (  # noqa: F401
    TextGenerator,
    find_text_source,
    sentencepiece_model_file,
)
from axlearn.common.trainer import SpmdTrainer
from axlearn.common.trainer_utils import is_unset, shardings_of_specs
from axlearn.common.utils import NestedTensor, Tensor
from axlearn.common.utils_spmd import (
    HybridMeshShape,
    MeshShape,
)

# The prefix of the model parameters' leaves in a trainer checkpoint.
_MODEL_PREFIX = "model/"


class BeamResult(NamedTuple):
    """The best beam of a prompt.

    Fields:
        tokens: The generated ids (without EOS) of the best finished beam, or of the best live
            beam if none finished.
        score: Its (length-normalized, if finished) log-probability.
        live_tokens: The best live (unfinished) beam's ids; with one beam this is greedy
            decoding.
        live_score: Its log-probability.
    """

    tokens: list[int]
    score: float
    live_tokens: list[int]
    live_score: float


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

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None, devices=None):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._mesh, cfg.mesh_shape = build_mesh(
            cfg.mesh_shape, cfg.mesh_axis_names, devices=devices, config_path=self.path()
        )
        self._params: Optional[NestedTensor] = None
        self._jit_cache: dict[tuple, Callable] = {}
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

    def _check_length(self, prefix_length: int, max_new_tokens: int) -> int:
        """Returns the decoders' `max_sequence_length` for `max_new_tokens` new tokens.

        The decoders' outputs hold input positions 1..length (position j holds input position
        j + 1), so the new tokens after a prompt of `prefix_length` tokens fill
        `prefix_length - 1 + max_new_tokens` positions (asking for one more would decode, and for
        beam search score, a token the caller never sees).
        """
        if max_new_tokens < 1:
            raise ValueError(
                f"{self.path()}: max_new_tokens must be >= 1, got {max_new_tokens}; pass 1 or more."
            )
        context = self.context_length
        if context is not None and prefix_length + max_new_tokens > context:
            raise ValueError(
                f"max_new_tokens={max_new_tokens}: the prompt ({prefix_length} tokens) plus the "
                f"new tokens exceed the model's context of {context} tokens (the sequence length "
                f"it was trained on); ask for at most {max(0, context - prefix_length)} new tokens "
                "(or a shorter prompt)."
            )
        return prefix_length - 1 + max_new_tokens

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

    @property
    def pad_token_id(self) -> int:
        """The decoder's padding id."""
        return int(self.config.model.decoder.pad_token_id)

    @property
    def eos_token_id(self) -> int:
        """The decoder's end-of-sequence id (also the experiments' prompt token)."""
        return int(self.config.model.decoder.eos_token_id)

    def _decoder_call(
        self, params: NestedTensor, method: str, inputs: dict[str, Any], prng_key: Tensor
    ) -> Any:
        """Calls `model.decoder.<method>(**inputs)` with the model parameters `params`."""
        outputs, _ = F(
            self.model.decoder,
            prng_key=prng_key,
            state=params["decoder"],
            inputs=inputs,
            is_training=False,
            method=method,
        )
        return outputs

    def sample_decode(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        stop_tokens: Optional[Sequence[int]] = None,
        seed: int = 0,
    ) -> list[list[int]]:
        """Samples a continuation of each prompt with `decoding.sample_decode` on the KV cache.

        Args:
            prompts: Token ids, each starting with a prompt token (e.g. BOS; the experiments
                use the EOS id), of any lengths (batched together, right-padded).
            max_new_tokens: The most tokens generated per prompt.
            temperature: 0 is greedy decoding; see `logits_modifier`.
            top_k: See `logits_modifier`.
            top_p: See `logits_modifier`.
            stop_tokens: A row stops after any of these; default: the EOS id.
            seed: The sampling seed; the same seed gives the same tokens.

        Returns:
            Per prompt, the generated ids (without the stop token).

        Raises:
            ValueError: On an empty prompt or a value out of range.
        """
        if max_new_tokens < 1:
            raise ValueError(
                f"{self.path()}: max_new_tokens must be >= 1, got {max_new_tokens}; pass 1 or more."
            )
        modifier = logits_modifier(temperature=temperature, top_k=top_k, top_p=top_p)
        stops = list(stop_tokens) if stop_tokens is not None else [self.eos_token_id]
        prefix = _pad_prompts(prompts, pad_id=self.pad_token_id)
        length = self._check_length(prefix.shape[1], max_new_tokens)
        stop = decoding.StopOnSubsequence([[t] for t in stops]) if stops else _never_stop

        def fn(params, prefix, prng_key):
            return self._decoder_call(
                params,
                "sample_decode",
                dict(
                    input_batch=dict(prefix=prefix),
                    max_sequence_length=length,
                    num_decodes=1,
                    logits_modifier=modifier,
                    stop_decoding_condition=stop,
                ),
                prng_key,
            )

        with jax.set_mesh(self._mesh):
            jitted = self._cached_jit(
                ("sample", length, temperature, top_k, top_p, tuple(stops)), lambda: fn
            )
            outputs = jitted(self.params, self._to_mesh(prefix), jax.random.PRNGKey(seed))
        sequences = np.asarray(jax.device_get(outputs.sequences))[:, 0]
        # Output position j holds input position j + 1: prompt i's first new token is at
        # len(prompt) - 1.
        return [
            _cut(sequences[i, len(p) - 1 : len(p) - 1 + max_new_tokens], stops)
            for i, p in enumerate(prompts)
        ]

    def stream_sample(
        self,
        prompt: Sequence[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        stop_tokens: Optional[Sequence[int]] = None,
        seed: int = 0,
    ) -> Iterator[int]:
        """Yields the tokens of `sample_decode([prompt], ...)` one by one as they are sampled.

        Each step is one jitted call of the decoder's `extend_step` on the KV cache, followed by
        the same key split and draw as `decoding.sample_decode`, so the same seed gives the same
        tokens.

        Args:
            prompt: Token ids starting with a prompt token.
            max_new_tokens: See `sample_decode`.
            temperature: See `sample_decode`.
            top_k: See `sample_decode`.
            top_p: See `sample_decode`.
            stop_tokens: See `sample_decode`.
            seed: See `sample_decode`.

        Yields:
            Token ids (the stop token is not yielded).
        """
        if max_new_tokens < 1:
            raise ValueError(
                f"{self.path()}: max_new_tokens must be >= 1, got {max_new_tokens}; pass 1 or more."
            )
        modifier = logits_modifier(temperature=temperature, top_k=top_k, top_p=top_p)
        stops = list(stop_tokens) if stop_tokens is not None else [self.eos_token_id]
        prefix = _pad_prompts([prompt], pad_id=self.pad_token_id)
        length = self._check_length(prefix.shape[1], max_new_tokens)
        input_ids = np.full((1, length), self.pad_token_id, np.int32)
        input_ids[:, : prefix.shape[1]] = prefix
        time_step = np.asarray([len(prompt) - 1], np.int32)

        def prefill(params, input_ids, time_step, prng_key):
            states, _ = self._decoder_call(
                params,
                "prefill_states",
                dict(time_step=time_step, input_batch=dict(input_ids=input_ids)),
                prng_key,
            )
            return states

        def step(params, states, token, prng_key):
            states, outputs = self._decoder_call(
                params,
                "extend_step",
                dict(cached_states=states, input_ids=token[:, None]),
                prng_key,
            )
            log_probs = jax.nn.log_softmax(outputs["logits"][:, -1].astype(jnp.float32), axis=-1)
            scores = modifier(log_probs) if modifier is not None else log_probs
            prng_key, sample_key = jax.random.split(prng_key)
            token = jax.random.categorical(sample_key, scores, axis=-1).astype(jnp.int32)
            return states, token, prng_key

        key = jax.random.PRNGKey(seed)
        settings = (length, temperature, top_k, top_p)
        step_fn = self._cached_jit(("stream_step", *settings), lambda: step, donate_argnums=(1,))
        with jax.set_mesh(self._mesh):
            states = self._cached_jit(("stream_prefill", length), lambda: prefill)(
                self.params, self._to_mesh(input_ids), self._to_mesh(time_step), key
            )
            token = jnp.asarray(input_ids[:, len(prompt) - 1])
            for _ in range(max_new_tokens):
                states, token, key = step_fn(self.params, states, token, key)
                value = int(jax.device_get(token)[0])
                if value in stops:
                    return
                yield value

    def beam_search_decode(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        num_beams: int,
        length_penalty: float = 0.0,
    ) -> list[BeamResult]:
        """The best beam of each prompt by `decoding.beam_search_decode` on the KV cache.

        Args:
            prompts: As in `sample_decode`.
            max_new_tokens: The most tokens generated per prompt.
            num_beams: The number of beams.
            length_penalty: Scores are divided by ((5 + length) / 6) ** length_penalty.

        Returns:
            Per prompt, the best finished beam (ending with EOS) or, if none finished, the best
            live one: its tokens (without EOS) and score.

        Raises:
            ValueError: On an empty prompt or a value out of range.
        """
        if max_new_tokens < 1:
            raise ValueError(
                f"{self.path()}: max_new_tokens must be >= 1, got {max_new_tokens}; pass 1 or more."
            )
        if num_beams < 1:
            raise ValueError(
                f"{self.path()}: num_beams must be >= 1, got {num_beams}; pass 1 or more."
            )
        prefix = _pad_prompts(prompts, pad_id=self.pad_token_id)
        length = self._check_length(prefix.shape[1], max_new_tokens)
        penalty = decoding.brevity_penalty_fn(alpha=length_penalty)

        def fn(params, prefix, prng_key):
            return self._decoder_call(
                params,
                "beam_search_decode",
                dict(
                    input_batch=dict(prefix=prefix),
                    max_sequence_length=length,
                    num_decodes=num_beams,
                    brevity_penalty=penalty,
                ),
                prng_key,
            )

        with jax.set_mesh(self._mesh):
            jitted = self._cached_jit(("beam", length, num_beams, length_penalty), lambda: fn)
            outputs = jax.device_get(
                jitted(self.params, self._to_mesh(prefix), jax.random.PRNGKey(0))
            )
        results = []
        # A search that ends early pads the rest of its beams.
        stop_and_pad = [self.eos_token_id, self.pad_token_id]
        for i, prompt in enumerate(prompts):
            start = len(prompt) - 1
            if outputs.scores[i, 0] > decoding.NEG_INF / 2:
                seq, score = outputs.sequences[i, 0], float(outputs.scores[i, 0])
            else:
                seq, score = outputs.live_sequences[i, 0], float(outputs.live_scores[i, 0])
            live = outputs.live_sequences[i, 0, start : start + max_new_tokens]
            results.append(
                BeamResult(
                    tokens=_cut(seq[start : start + max_new_tokens], stop_and_pad),
                    score=score,
                    live_tokens=_cut(live, stop_and_pad),
                    live_score=float(outputs.live_scores[i, 0]),
                )
            )
        return results

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


def logits_modifier(
    *, temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None
) -> Optional[logit_modifiers.LogitsToLogitsFn]:
    """The logit modifier of a sampling setting: temperature, then top-k, then top-p.

    Args:
        temperature: 0 is greedy decoding (top-1); otherwise the softmax temperature.
        top_k: Keep the k most likely tokens.
        top_p: Keep the nucleus of probability p.

    Returns:
        The modifier, or None (plain sampling at temperature 1).

    Raises:
        ValueError: If a value is out of range.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logit_modifiers.top_k_logits(1, break_ties="lowest-token-id")
    mods = []
    if temperature != 1:
        mods.append(logit_modifiers.scale_by(temperature))
    if top_k is not None:
        mods.append(logit_modifiers.top_k_logits(top_k))
    if top_p is not None:
        mods.append(logit_modifiers.top_p_logits(top_p))
    if not mods:
        return None
    return mods[0] if len(mods) == 1 else logit_modifiers.chain(*mods)


def _pad_prompts(prompts: Sequence[Sequence[int]], *, pad_id: int) -> np.ndarray:
    if not prompts:
        raise ValueError("No prompts given.")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"Prompt {i} is empty: it needs at least a prompt token (e.g. BOS).")
        if pad_id in prompt:
            raise ValueError(f"Prompt {i} contains the pad id {pad_id}: {list(prompt)}")
    width = max(len(p) for p in prompts)
    out = np.full((len(prompts), width), pad_id, np.int32)
    for i, prompt in enumerate(prompts):
        out[i, : len(prompt)] = prompt
    return out


def _never_stop(*, index: Tensor, sequences: Tensor, prefix_len: Tensor) -> Tensor:
    """A stop condition that never fires (`stop_tokens=[]`)."""
    del index, prefix_len
    return jnp.zeros(sequences.shape[:2], bool)


def _cut(tokens: Sequence[int], stop_tokens: Sequence[int]) -> list[int]:
    """Tokens up to (excluding) the first stop token."""
    out = []
    for t in tokens:
        if t in stop_tokens:
            break
        out.append(int(t))
    return out


def _config_get(cfg: Any, path: str) -> Any:
    """The value at dotted `path` of a config (`config.paths.lookup_path`), None where a part is
    missing or None."""
    try:
        return lookup_path(cfg, path)
    except ConfigPathError:
        return None
