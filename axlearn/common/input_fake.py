"""Fake inputs: deterministic random language-model batches, and `--data_dir=FAKE` support.

`FakeLmInput` needs no data, no TensorFlow and no network: row `r` of global batch `k` is drawn
from `numpy.random.default_rng([seed, k, r])`, so batches are identical across runs, each process
computes only its own rows (the union of the processes' slices is the global batch), and the
iterator state is just the batch count.

`replace_inputs_with_fake(trainer_cfg)` implements `--data_dir=FAKE`: every
`input_tf_data.Input` config in the tree is swapped for a `FakeLmInput` config with the same
global batch size and sequence length.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from axlearn.common import input_state_check
from axlearn.common.config import (
    REQUIRED,
    ConfigBase,
    Required,
    config_class,
    config_for_function,
)
from axlearn.common.input_fake_sources import (  # noqa: F401 (public re-exports)
    fake_serialized_json_source,
    fake_source,
    fake_text_source,
)
from axlearn.common.input_iterator import (
    FAKE_STATE_FORMAT,
    InputStateError,
    foreign_state_message,
)
from axlearn.common.module import Module, nowrap

# What FakeLmInput is, in the message for a checkpoint another input saved.
_FAKE_READER = "FakeLmInput (--data_dir=FAKE)"
# The fix named when a saved FakeLmInput state cannot be decoded.
_STATE_FIX = "resume from an earlier checkpoint, or train in a fresh --trainer_dir"

# Rows are seeded with (this, batch index, row index).
_FAKE_SEED = 1


class FakeLmIterator:
    """Iterates FakeLmInput batches; `get_state`/`set_state` save and restore the position."""

    def __init__(self, owner: FakeLmInput, *, rows: range):
        self._owner = owner
        self._rows = rows
        self._num_batches = 0

    def __iter__(self) -> FakeLmIterator:
        return self

    @property
    def num_batches(self) -> int:
        """The number of batches yielded so far."""
        return self._num_batches

    def __next__(self) -> dict[str, np.ndarray]:
        cfg = self._owner.config
        if cfg.total_num_batches is not None and self._num_batches >= cfg.total_num_batches:
            raise StopIteration
        k = self._num_batches
        tokens = np.stack(
            [
                np.random.default_rng([_FAKE_SEED, k, r]).integers(
                    1, cfg.max_token_id, size=[cfg.source_length + 1], dtype=np.int32
                )
                for r in self._rows
            ]
        )
        self._num_batches += 1
        return {
            "input_ids": tokens[:, :-1],
            "target_labels": tokens[:, 1:],
            "target_num_bytes": np.full([len(self._rows)], cfg.source_length, dtype=np.int32),
        }

    def get_state(self) -> bytes:
        """Returns the position as JSON bytes."""
        return json.dumps(
            {"format": FAKE_STATE_FORMAT, "num_batches": self._num_batches}
        ).encode()

    def set_state(self, states: Union[bytes, list], *, check_config: bool = True) -> None:
        """Restores a position from `get_state()` (one state or all processes' states).

        Args:
            states: State bytes, or a list of them (all hold the same batch count).
            check_config: Unused (kept for the Input iterator interface).
        """
        del check_config
        name = self._owner.path()
        if isinstance(states, (list, tuple)):
            if not states:
                raise InputStateError(
                    f"Input '{name}': the checkpoint holds no input state; {_STATE_FIX}"
                )
            states = states[0]
        states = bytes(states)
        state = None
        if states.lstrip()[:1] == b"{":
            # Bounded: too large, too deep or not JSON is one line naming the state.
            state = input_state_check.parse_state_json(
                states, what=f"Input '{name}': the checkpoint's input state", fix=_STATE_FIX
            )
        if not isinstance(state, dict) or state.get("format") != FAKE_STATE_FORMAT:
            raise InputStateError(foreign_state_message(states, name=name, reader=_FAKE_READER))
        self._num_batches = input_state_check.require_int(
            state,
            "num_batches",
            what=f"Input '{name}': the checkpoint's FakeLmInput state",
            fix=_STATE_FIX,
        )


class EmptyInput(Module):
    """An input that produces no batches (iterating it raises NotImplementedError).

    Stands in for the input of a trainer that is built only for its state specs (e.g. the source
    trainer of `state_builder.BaseConverterFromPretrainedModel`).
    """

    @config_class
    class Config(Module.Config):
        """Configures EmptyInput."""

        # Whether the input is for training (an evaluation input needs total_num_batches).
        is_training: Required[bool] = REQUIRED
        # Examples per global batch (0 is allowed: nothing is ever produced).
        global_batch_size: Required[int] = REQUIRED
        # The number of batches; None: unlimited.
        total_num_batches: Optional[int] = None
        # Tokens per example.
        source_length: int = 1024
        # The largest token id.
        max_token_id: int = 2048

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not cfg.is_training and cfg.total_num_batches is None:
            raise ValueError(f"{self.path()}: total_num_batches must be set when not is_training")

    def __iter__(self):
        return self

    def __next__(self):
        raise NotImplementedError(f"{type(self).__name__} produces no batches")

    @nowrap
    def dataset(self):
        """Returns an iterator that produces no batches."""
        return iter(self)


class FakeLmInput(Module):
    """Produces random language-model batches of `global_batch_size` x `source_length` tokens.

    Keys: `input_ids`, `target_labels` (int32 [B, T], ids in [1, max_token_id), so every target is
    live) and `target_num_bytes` ([B], one byte per token).
    """

    @config_class
    class Config(Module.Config):
        """Configures FakeLmInput."""

        # Whether the input is for training (an evaluation input needs total_num_batches).
        is_training: Required[bool] = REQUIRED
        # Examples per global batch (divisible by the process count).
        global_batch_size: Required[int] = REQUIRED
        # The number of batches; None: unlimited.
        total_num_batches: Optional[int] = None
        # Tokens per example.
        source_length: int = 1024
        # Token ids are drawn from [1, max_token_id).
        max_token_id: int = 2048

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module],
        process_index: Optional[int] = None,
        process_count: Optional[int] = None,
    ):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        import jax  # pylint: disable=import-outside-toplevel

        count = jax.process_count() if process_count is None else process_count
        index = jax.process_index() if process_index is None else process_index
        if not cfg.is_training and cfg.total_num_batches is None:
            raise ValueError(f"{self.path()}: total_num_batches must be set when not is_training")
        if cfg.global_batch_size <= 0 or cfg.global_batch_size % count != 0:
            raise ValueError(
                f"{self.path()}.global_batch_size ({cfg.global_batch_size}) must be positive and "
                f"divisible by the process count ({count})"
            )
        if cfg.max_token_id < 2:
            raise ValueError(f"{self.path()}.max_token_id must be >= 2, got {cfg.max_token_id}")
        per_process = cfg.global_batch_size // count
        self._rows = range(index * per_process, (index + 1) * per_process)

    def __iter__(self) -> FakeLmIterator:
        return FakeLmIterator(self, rows=self._rows)

    @nowrap
    def dataset(self) -> FakeLmIterator:
        """Returns a new iterator (there is no tf.data dataset)."""
        return iter(self)

    @nowrap
    def element_spec(self) -> dict[str, Any]:
        """Returns this process's batch shapes (`jax.ShapeDtypeStruct`s), as batches have them."""
        import jax  # pylint: disable=import-outside-toplevel

        cfg = self.config
        rows, length = len(self._rows), cfg.source_length
        return {
            "input_ids": jax.ShapeDtypeStruct((rows, length), np.int32),
            "target_labels": jax.ShapeDtypeStruct((rows, length), np.int32),
            "target_num_bytes": jax.ShapeDtypeStruct((rows,), np.int32),
        }

    @nowrap
    def batches(self, it: FakeLmIterator):
        """Yields the batches of `it`."""
        yield from it

    @nowrap
    def iterator_state(self, it: FakeLmIterator) -> bytes:
        """Returns the position of `it` as bytes."""
        return it.get_state()

    @nowrap
    def restore_iterator(self, states: Union[bytes, list], *, check_config: bool = True):
        """Returns a new iterator positioned where the saved one was."""
        it = iter(self)
        it.set_state(states, check_config=check_config)
        return it


def fake_grain_source(
    examples: Sequence[Any], *, repeat: Optional[int] = 1, shuffle_seed: Optional[int] = None
) -> Any:
    """AXLearn's fake Grain source: a `grain.MapDataset` of `examples`.

    Args:
        examples: The examples (any picklable values).
        repeat: Epochs; None: forever.
        shuffle_seed: If not None, each epoch is shuffled with this seed.

    Returns:
        A MapDataset.
    """
    import grain  # pylint: disable=import-outside-toplevel

    ds = grain.MapDataset.source(list(examples))
    if shuffle_seed is not None:
        ds = ds.shuffle(seed=shuffle_seed)
    if repeat != 1:
        ds = ds.repeat(repeat)
    return ds


class _FakeLmRow:
    """Global example index -> a deterministic random LM example (picklable for workers)."""

    def __init__(self, source_length: int, max_token_id: int):
        self._length, self._max_token_id = source_length, max_token_id

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        tokens = np.random.default_rng([_FAKE_SEED, int(index)]).integers(
            1, self._max_token_id, size=[self._length + 1], dtype=np.int32
        )
        return {
            "input_ids": tokens[:-1],
            "target_labels": tokens[1:],
            "target_num_bytes": np.int32(self._length),
        }


def fake_grain_lm_source(
    *,
    is_training: bool,
    global_batch_size: int,
    source_length: int,
    max_token_id: int = 2048,
    total_num_batches: Optional[int] = None,
) -> Any:
    """A BuildDatasetFn of fake LM batches for `input_grain.Input` (what `--data_dir=FAKE` sets).

    Example i of the global stream is drawn from `default_rng([1, i])`; feeds read interleaved
    shards (`input_grain.shard_dataset`), so it resumes exactly and elastically.

    Args:
        is_training: Whether for training (repeats forever) or evaluation.
        global_batch_size: Examples per global batch.
        source_length: Tokens per example.
        max_token_id: Token ids are drawn from [1, max_token_id).
        total_num_batches: Evaluation: the number of global batches (required).

    Returns:
        A BuildDatasetFn.

    Raises:
        ValueError: If an evaluation source has no total_num_batches.
    """
    if not is_training and total_num_batches is None:
        raise ValueError("fake_grain_lm_source: set total_num_batches for an evaluation input")

    def build(dispatch_config: Any) -> Any:
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.input_grain import per_feed_batch, shard_dataset

        num = global_batch_size * (total_num_batches or 1024)
        ds = fake_grain_source(range(num), repeat=None if is_training else 1)
        ds = shard_dataset(ds, dispatch_config).map(_FakeLmRow(source_length, max_token_id))
        return per_feed_batch(
            ds, global_batch_size=global_batch_size, dispatch_config=dispatch_config
        )

    return build


def _find_int(cfg: Any, keys: tuple[str, ...]) -> Optional[int]:
    """Returns the first int value of a field named in `keys` anywhere under `cfg`."""
    found: list[int] = []

    def enter_fn(_, child, default_kv):
        if isinstance(child, ConfigBase):
            for k in keys:
                if k in child and isinstance(getattr(child, k), int):
                    found.append(getattr(child, k))
        return default_kv

    if isinstance(cfg, ConfigBase):
        cfg.visit(visit_fn=lambda k, v: None, enter_fn=enter_fn)
    return found[0] if found else None


def replace_inputs_with_fake(
    cfg: ConfigBase,
    *,
    vocab_size: Optional[int] = None,
    source_length: Optional[int] = None,
    eval_num_batches: int = 2,
) -> ConfigBase:
    """Replaces every `input_tf_data.Input` config in a config tree with a `FakeLmInput` config.

    An Input whose class has a `with_fake_source(cfg, *, eval_num_batches)` classmethod (e.g.
    `axlearn.vision.input_image.ImagenetInput`) is given to it instead and keeps its class.

    This is what `--data_dir=FAKE` does. Each fake input keeps the original's `is_training`, name
    and global batch size; its sequence length is the `max_sequence_length` (or `max_len`) found
    in the original's source, else `source_length`, else the one found in another input of the
    tree; token ids stay below `vocab_size` (default: `model.decoder.vocab_size` of the tree, if
    any). Evaluation inputs get `eval_num_batches` batches.

    Args:
        cfg: A config tree, e.g. a trainer config (modified in place).
        vocab_size: Upper bound of fake token ids.
        source_length: Fallback sequence length.
        eval_num_batches: Batches of each fake evaluation input.

    Returns:
        `cfg` (the root is replaced and returned when it is itself an Input config).

    Raises:
        ValueError: If an input's global batch size or sequence length cannot be determined (the
            message names the config path).
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.input_grain import Input as GrainInput
    from axlearn.common.input_tf_data import Input  # pylint: disable=import-outside-toplevel

    if vocab_size is None:
        model = (
            getattr(cfg, "model", None) if isinstance(cfg, ConfigBase) and "model" in cfg else None
        )
        decoder = (
            getattr(model, "decoder", None)
            if isinstance(model, ConfigBase) and "decoder" in model
            else None
        )
        if isinstance(decoder, ConfigBase) and "vocab_size" in decoder:
            if isinstance(decoder.vocab_size, int):
                vocab_size = decoder.vocab_size
    fallback_length = source_length or _find_int(cfg, ("max_sequence_length", "max_len"))

    def fake_for(path: str, input_cfg: Input.Config) -> FakeLmInput.Config:
        batcher = input_cfg.batcher
        batch_size = (
            getattr(batcher, "global_batch_size", None) if "global_batch_size" in batcher else None
        )
        dispatcher = getattr(input_cfg, "input_dispatcher", None)
        if dispatcher is not None:  # Per-feed batching: the dispatcher's logical batch.
            batch_size = dispatcher.global_logical_batch_size
        if not isinstance(batch_size, int):
            raise ValueError(
                f"--data_dir=FAKE: cannot tell the global batch size of {path or 'the input'} "
                f"(its batcher has no global_batch_size and it has no input_dispatcher set)"
            )
        length = _find_int(input_cfg.source, ("max_sequence_length", "max_len"))
        length = length or source_length or fallback_length
        if length is None:
            raise ValueError(
                f"--data_dir=FAKE: cannot tell the sequence length of {path or 'the input'}; "
                f"pass source_length to replace_inputs_with_fake"
            )
        fake = FakeLmInput.default_config().set(
            is_training=input_cfg.is_training,
            global_batch_size=batch_size,
            source_length=length,
            total_num_batches=None if input_cfg.is_training else eval_num_batches,
        )
        if vocab_size is not None:
            fake.max_token_id = vocab_size
        if input_cfg.name is not REQUIRED:
            fake.name = input_cfg.name
        return fake

    def fake_grain_for(path: str, input_cfg: GrainInput.Config) -> GrainInput.Config:
        # The Input stays a Grain input (its state format, elastic rule and dispatch); only its
        # source is replaced.
        batch_size = _find_int(input_cfg.source, ("global_batch_size",))
        dispatcher = getattr(input_cfg, "input_dispatcher", None)
        if dispatcher is not None:
            batch_size = dispatcher.global_logical_batch_size
        length = _find_int(input_cfg.source, ("max_sequence_length", "max_len"))
        length = length or source_length or fallback_length
        if batch_size is None or length is None:
            raise ValueError(
                f"--data_dir=FAKE: cannot tell the global batch size or sequence length of "
                f"{path or 'the input'} (no global_batch_size / max_sequence_length field in its "
                f"source config); pass source_length to replace_inputs_with_fake"
            )
        is_training = "is_training" not in input_cfg.source or input_cfg.source.is_training
        fake = config_for_function(fake_grain_lm_source).set(
            is_training=bool(is_training),
            global_batch_size=batch_size,
            source_length=length,
            total_num_batches=None if is_training else eval_num_batches,
        )
        if vocab_size is not None:
            fake.max_token_id = vocab_size
        input_cfg.source = fake
        return input_cfg

    def walk(path: str, value: Any) -> Any:
        if isinstance(value, Input.Config):
            # An input that knows its own fake examples (e.g. ImagenetInput's fake images).
            own_fake = getattr(value.klass, "with_fake_source", None)
            if callable(own_fake):
                return own_fake(value, eval_num_batches=eval_num_batches)
            return fake_for(path, value)
        if isinstance(value, GrainInput.Config):
            return fake_grain_for(path, value)
        if isinstance(value, ConfigBase):
            for key in value.keys():
                child = getattr(value, key)
                new = walk(f"{path}.{key}" if path else key, child)
                if new is not child:
                    setattr(value, key, new)
            return value
        if isinstance(value, dict):
            for key in list(value):
                new = walk(f"{path}[{key!r}]", value[key])
                if new is not value[key]:
                    value[key] = new
            return value
        if isinstance(value, list):
            for i, item in enumerate(value):
                new = walk(f"{path}[{i}]", item)
                if new is not item:
                    value[i] = new
            return value
        return value

    return walk("", cfg)
