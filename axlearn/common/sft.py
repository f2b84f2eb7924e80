"""Supervised fine-tuning (SFT) inputs: instruction records -> packed causal-LM batches whose loss
covers the response tokens only.

A record is `{"prompt": str, "response": str}`. `ChatTemplate` renders it as the text of the
prompt part and the text of the response part; `CharVocabulary` (or any object with `encode`,
`eos_id` and `pad_id`) turns each into ids. The example's token sequence is

    s = [EOS] + prompt_ids + response_ids + [EOS]

(EOS doubles as the begin-of-sequence token, as in the GRPO toy task), and the causal-LM example
is `input_ids = s[:-1]`, `target_labels = s[1:]` with the labels of every position whose target
is a prompt token set to -1 (`causal_lm.Model` skips negative labels): the loss and every
per-token metric cover the response tokens and the final EOS, exactly.

`pack_examples` packs examples in order into rows of `max_len` tokens (next fit) with
`input_segment_ids` (1, 2, ... per example, 0 on padding) and `input_positions` (0-based inside
each example), so attention stays inside an example and positions restart.

`SftInput` is the trainer input (NumPy, no TensorFlow): the records of a JSON file (a list of
records), split into train and validation by index, tokenized, shuffled per epoch (training),
packed and batched.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterator, Sequence
from typing import Any, Optional, Union

import numpy as np

from axlearn.common import file_access, post_training_data
from axlearn.common.config import REQUIRED, Configurable, Required, config_class
from axlearn.common.file_access.reads import parse_json
from axlearn.common.file_access.resolve import FileAccessError
from axlearn.common.module import Module, nowrap

# The ids CharVocabulary reserves: padding and end-of-sequence (also the begin token).
PAD_ID, EOS_ID = 0, 1
# The default alphabet of CharVocabulary: digits, letters, punctuation, space and newline.
DEFAULT_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"
# The label of a position without a target (prompt tokens and padding).
IGNORE_LABEL = -1
# The largest records file `load_records` reads (a bigger one is refused, not read).
MAX_RECORDS_BYTES = 256 << 20


class CharVocabulary(Configurable):
    """A character vocabulary: id 0 pads, id 1 is EOS, id 2 + i is `alphabet[i]`."""

    @config_class
    class Config(Configurable.Config):
        """Configures CharVocabulary."""

        # The characters, each once; character i has id 2 + i.
        alphabet: str = DEFAULT_ALPHABET

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        alphabet = self.config.alphabet
        if not alphabet or len(set(alphabet)) != len(alphabet):
            raise ValueError(
                f"{type(self).__name__}.alphabet must be non-empty with each character once, "
                f"got {alphabet!r}"
            )
        self._ids = {c: i + 2 for i, c in enumerate(alphabet)}

    @property
    def pad_id(self) -> int:
        """The padding id (0)."""
        return PAD_ID

    @property
    def eos_id(self) -> int:
        """The end-of-sequence id (1)."""
        return EOS_ID

    @property
    def vocab_size(self) -> int:
        """The number of ids (2 + the alphabet's size)."""
        return 2 + len(self.config.alphabet)

    def encode(self, text: str) -> list[int]:
        """Returns the ids of `text`.

        Args:
            text: Characters of the alphabet.

        Returns:
            One id per character.

        Raises:
            ValueError: If a character is not in the alphabet.
        """
        try:
            return [self._ids[c] for c in text]
        except KeyError as e:
            raise ValueError(
                f"{type(self).__name__}.alphabet has no character {e.args[0]!r} (in {text!r})"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        """Returns the text of `ids` (padding and EOS dropped).

        Args:
            ids: Token ids.

        Returns:
            The characters.
        """
        alphabet = self.config.alphabet
        return "".join(alphabet[i - 2] for i in ids if i >= 2)


class ChatTemplate(Configurable):
    """Renders a record's prompt and response texts (the parts the loss skips and covers)."""

    @config_class
    class Config(Configurable.Config):
        """Configures ChatTemplate."""

        # The prompt part; "{prompt}" is replaced with the record's prompt.
        prompt_format: str = "User: {prompt}\nAssistant: "
        # The response part (the loss covers it and the final EOS); "{response}" is replaced.
        response_format: str = "{response}"

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        cfg = self.config
        if "{prompt}" not in cfg.prompt_format:
            raise ValueError(
                f"{type(self).__name__}.prompt_format={cfg.prompt_format!r} must contain "
                "'{prompt}'"
            )
        if "{response}" not in cfg.response_format:
            raise ValueError(
                f"{type(self).__name__}.response_format={cfg.response_format!r} leaves no "
                "response token: it must contain '{response}'"
            )

    def render(self, prompt: str, response: str) -> tuple[str, str]:
        """Returns (prompt text, response text) of a record.

        Args:
            prompt: The record's prompt.
            response: The record's response.

        Returns:
            The two rendered parts.
        """
        cfg = self.config
        return (
            cfg.prompt_format.replace("{prompt}", prompt),
            cfg.response_format.replace("{response}", response),
        )


def sft_example(
    prompt_ids: Sequence[int], response_ids: Sequence[int], *, eos_id: int
) -> dict[str, np.ndarray]:
    """One causal-LM example whose targets are the response tokens and the final EOS only.

    Args:
        prompt_ids: The prompt part's ids.
        response_ids: The response part's ids.
        eos_id: The EOS id (also put first, as the begin token).

    Returns:
        {"input_ids", "target_labels"}: int32 [len(prompt_ids) + len(response_ids) + 1];
        target_labels[t] is -1 where the target is a prompt token.
    """
    seq = np.asarray([eos_id, *prompt_ids, *response_ids, eos_id], np.int32)
    labels = seq[1:].copy()
    labels[: len(prompt_ids)] = IGNORE_LABEL
    return dict(input_ids=seq[:-1], target_labels=labels)


def pack_examples(
    examples: Sequence[dict[str, np.ndarray]], *, max_len: int, pad_id: int
) -> dict[str, np.ndarray]:
    """Packs examples in order into rows of `max_len` tokens (next fit), with segment ids.

    Args:
        examples: From `sft_example` (each at most `max_len` tokens).
        max_len: Tokens per row.
        pad_id: The input id of padding (its label is -1, its segment id 0).

    Returns:
        {"input_ids", "target_labels", "input_segment_ids", "input_positions"}: int32 [rows,
        max_len].

    Raises:
        ValueError: If an example is longer than `max_len`.
    """
    rows: list[list[dict[str, np.ndarray]]] = []
    used = max_len
    for i, ex in enumerate(examples):
        n = len(ex["input_ids"])
        if n > max_len:
            raise ValueError(f"pack_examples: example {i} has {n} tokens > max_len={max_len}")
        if used + n > max_len:
            rows.append([])
            used = 0
        rows[-1].append(ex)
        used += n
    out = dict(
        input_ids=np.full([len(rows), max_len], pad_id, np.int32),
        target_labels=np.full([len(rows), max_len], IGNORE_LABEL, np.int32),
        input_segment_ids=np.zeros([len(rows), max_len], np.int32),
        input_positions=np.zeros([len(rows), max_len], np.int32),
    )
    for r, row in enumerate(rows):
        start = 0
        for segment, ex in enumerate(row, start=1):
            n = len(ex["input_ids"])
            out["input_ids"][r, start : start + n] = ex["input_ids"]
            out["target_labels"][r, start : start + n] = ex["target_labels"]
            out["input_segment_ids"][r, start : start + n] = segment
            out["input_positions"][r, start : start + n] = np.arange(n)
            start += n
    return out


def load_records(path: str, *, fields: Sequence[str], what: str) -> list[dict[str, Any]]:
    """Reads a JSON list of records and checks that each has `fields` as strings.

    Args:
        path: The JSON file (a list of objects), a local path or `axlearn-data:<relative path>`
            for a set shipped in the package (see `post_training_data.resolve_data_path`).
        fields: The required string fields.
        what: Names the records in messages (e.g. a config path).

    Returns:
        The records.

    Raises:
        ValueError: If the file cannot be read (missing, not a regular file, a link, bigger than
            MAX_RECORDS_BYTES, not JSON), is not a list, or a record lacks a field (naming the
            record).
    """
    local = post_training_data.resolve_data_path(path)
    try:
        records = file_access.read_json(
            os.path.dirname(local) or ".", os.path.basename(local), max_bytes=MAX_RECORDS_BYTES
        )
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e}") from None
    if not isinstance(records, list):
        raise ValueError(f"{what}: {path} must hold a JSON list of records")
    for i, record in enumerate(records):
        missing = [k for k in fields if not isinstance(record, dict) or k not in record]
        if missing:
            raise ValueError(f"{what}: record {i} of {path} has no {missing[0]!r}: {record!r}")
        bad = [k for k in fields if not isinstance(record[k], str)]
        if bad:
            raise ValueError(f"{what}: record {i} of {path}: {bad[0]!r} must be a string")
    return records


def split_records(records: list[Any], *, split: str, holdout_every: int) -> list[Any]:
    """The records of a split: record i is held out (validation) when i % holdout_every == 0.

    Args:
        records: All records.
        split: "train", "validation" or "all".
        holdout_every: The held-out period (>= 2).

    Returns:
        The split's records, in order.

    Raises:
        ValueError: On an unknown split.
    """
    if split == "all":
        return list(records)
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train', 'validation' or 'all', got {split!r}")
    held = split == "validation"
    return [r for i, r in enumerate(records) if (i % holdout_every == 0) == held]


class RowBatchIterator:
    """Iterates batches of packed rows: per epoch (shuffled for training), rows in batches."""

    def __init__(self, owner: Any, rows_fn: Any, *, rows: range):
        self._owner = owner
        self._rows_fn = rows_fn
        self._rows = rows
        self._num_batches = 0
        self._epoch = -1
        self._epoch_rows: Optional[dict[str, np.ndarray]] = None
        self._offset = 0

    def __iter__(self) -> RowBatchIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        cfg = self._owner.config
        if cfg.total_num_batches is not None and self._num_batches >= cfg.total_num_batches:
            raise StopIteration
        batch = cfg.global_batch_size
        if self._epoch_rows is None or self._offset >= _num_rows(self._epoch_rows):
            if not cfg.is_training and self._epoch_rows is not None:
                raise StopIteration  # Evaluation: one pass.
            self._epoch += 1
            self._epoch_rows = self._rows_fn(self._epoch)
            self._offset = 0
        take = {k: v[self._offset : self._offset + batch] for k, v in self._epoch_rows.items()}
        self._offset += batch
        short = batch - _num_rows(take)
        if short:  # The last batch of a pass: empty rows (no targets) fill it.
            take = {
                k: np.concatenate([v, np.full((short, *v.shape[1:]), _fill(k), v.dtype)])
                for k, v in take.items()
            }
        self._num_batches += 1
        lo, hi = self._rows.start, self._rows.stop
        return {k: v[lo:hi] for k, v in take.items()}

    def get_state(self) -> bytes:
        """The position (batches yielded, epoch, offset in the epoch's rows) as JSON bytes.

        An epoch's rows are a function of the epoch (its shuffle is seeded by it), so the
        position is all a restore needs.

        Returns:
            The state.
        """
        state = dict(num_batches=self._num_batches, epoch=self._epoch, offset=self._offset)
        return json.dumps(state).encode("utf-8")

    def set_state(self, states: Union[bytes, list]) -> None:
        """Restores a position from `get_state()` (or a list of processes' states).

        Args:
            states: The state bytes (or a list of them; this process's is the first).

        Raises:
            ValueError: If the state is not such a position (naming what is wrong).
        """
        if isinstance(states, (list, tuple)):
            states = states[0]
        try:
            state = parse_json(bytes(states), "input iterator state", max_depth=4)
        except (TypeError, FileAccessError) as e:
            raise ValueError(f"input iterator state is not JSON of a position: {e}") from e
        fields = ("num_batches", "epoch", "offset")
        if not isinstance(state, dict) or sorted(state) != sorted(fields):
            raise ValueError(f"input iterator state must be a dict of {fields}, got {state!r}")
        bad = [
            k for k in fields if type(state[k]) is not int or state[k] < (-1 if k == "epoch" else 0)
        ]
        if bad:
            raise ValueError(f"input iterator state: {bad} must be integers >= 0 in {state!r}")
        self._num_batches, self._epoch, self._offset = (state[k] for k in fields)
        self._epoch_rows = None if self._epoch < 0 else self._rows_fn(self._epoch)


class RowInputMixin:
    """`SftInput`'s and `PreferenceInput`'s iteration (RowBatchIterator over `_epoch_rows`),
    checkpointable: `iterator_state` / `restore_iterator` save and restore its position."""

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return RowBatchIterator(self, self._epoch_rows, rows=self._rows)

    @nowrap
    def dataset(self) -> Iterator[dict[str, np.ndarray]]:
        """Returns a new iterator from the start."""
        return iter(self)

    @nowrap
    def batches(self, it: Iterator[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
        """Yields the batches of `it`."""
        yield from it

    @nowrap
    def iterator_state(self, it: RowBatchIterator) -> bytes:
        """Returns the position of `it` as bytes (see `RowBatchIterator.get_state`)."""
        return it.get_state()

    @nowrap
    def restore_iterator(self, states: Union[bytes, list], **kwargs) -> RowBatchIterator:
        """Returns a new iterator positioned where the saved one was."""
        del kwargs
        it = iter(self)
        it.set_state(states)
        return it


def _num_rows(tree: dict[str, np.ndarray]) -> int:
    return len(next(iter(tree.values())))


def _fill(key: str) -> int:
    return IGNORE_LABEL if key.endswith("target_labels") else 0


class SftInput(RowInputMixin, Module):
    """Packed SFT batches of a JSON instruction file; see the module docstring.

    Keys: input_ids, target_labels (-1 on prompt tokens and padding), input_segment_ids,
    input_positions: int32 [batch, max_len].
    """

    @config_class
    class Config(Module.Config):
        """Configures SftInput."""

        # Whether the input is for training (repeats, shuffled per epoch) or eval (one pass).
        is_training: Required[bool] = REQUIRED
        # The JSON file: a list of {"prompt": str, "response": str}.
        path: Required[str] = REQUIRED
        # Rows per global batch (divisible by the process count).
        global_batch_size: Required[int] = REQUIRED
        # "train", "validation" (record i with i % holdout_every == 0) or "all".
        split: str = "train"
        # The held-out period of `split` (>= 2).
        holdout_every: int = 5
        # Tokens per row.
        max_len: int = 64
        # Whether to pack several examples per row (else one example per row).
        pack: bool = True
        # The shuffle seed (training: the records are shuffled each epoch).
        seed: int = 0
        # The number of batches; None: unlimited (training) or one pass (eval).
        total_num_batches: Optional[int] = None
        # The tokenizer: encode(text) -> ids, eos_id, pad_id.
        vocab: Configurable.Config = CharVocabulary.default_config()
        # The chat template.
        template: ChatTemplate.Config = ChatTemplate.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        import jax  # pylint: disable=import-outside-toplevel

        count, index = jax.process_count(), jax.process_index()
        if cfg.global_batch_size <= 0 or cfg.global_batch_size % count:
            raise ValueError(
                f"{self.path()}.global_batch_size={cfg.global_batch_size} must be positive and "
                f"divisible by the process count ({count})"
            )
        if cfg.holdout_every < 2:
            raise ValueError(f"{self.path()}.holdout_every={cfg.holdout_every} must be >= 2")
        per = cfg.global_batch_size // count
        self._rows = range(index * per, (index + 1) * per)
        self._vocab = cfg.vocab.instantiate()
        try:
            self._template = cfg.template.instantiate()
        except ValueError as e:
            raise ValueError(f"{self.path()}.template: {e}") from None
        records = load_records(cfg.path, fields=("prompt", "response"), what=self.path())
        records = split_records(records, split=cfg.split, holdout_every=cfg.holdout_every)
        self._examples = [self._tokenize(i, r) for i, r in enumerate(records)]

    def _tokenize(self, index: int, record: dict[str, str]) -> dict[str, np.ndarray]:
        cfg = self.config
        prompt, response = self._template.render(record["prompt"], record["response"])
        ex = sft_example(
            self._vocab.encode(prompt), self._vocab.encode(response), eos_id=self._vocab.eos_id
        )
        if len(ex["input_ids"]) > cfg.max_len:
            raise ValueError(
                f"{self.path()}: {cfg.split} record {index} has {len(ex['input_ids'])} tokens > "
                f"max_len={cfg.max_len} (its response would be cut): {record!r}"
            )
        return ex

    @property
    def examples(self) -> list[dict[str, np.ndarray]]:
        """The split's tokenized examples, in record order."""
        return self._examples

    def _epoch_rows(self, epoch: int) -> dict[str, np.ndarray]:
        cfg = self.config
        order = np.arange(len(self._examples))
        if cfg.is_training:
            order = np.random.default_rng([cfg.seed, epoch]).permutation(order)
        examples = [self._examples[i] for i in order]
        if cfg.pack:
            return pack_examples(examples, max_len=cfg.max_len, pad_id=self._vocab.pad_id)
        return pad_rows(examples, max_len=cfg.max_len, pad_id=self._vocab.pad_id)

    @nowrap
    def element_spec(self) -> dict[str, Any]:
        """This process's batch shapes (`jax.ShapeDtypeStruct`s)."""
        import jax  # pylint: disable=import-outside-toplevel

        shape = (len(self._rows), self.config.max_len)
        keys = ("input_ids", "target_labels", "input_segment_ids", "input_positions")
        return {k: jax.ShapeDtypeStruct(shape, np.int32) for k in keys}


def pad_rows(
    examples: Sequence[dict[str, np.ndarray]], *, max_len: int, pad_id: int
) -> dict[str, np.ndarray]:
    """One example per row, right-padded to `max_len` (segment id 1 on its tokens).

    Args:
        examples: From `sft_example` (each at most `max_len` tokens).
        max_len: Tokens per row.
        pad_id: The input id of padding.

    Returns:
        As `pack_examples`.
    """
    rows = [pack_examples([ex], max_len=max_len, pad_id=pad_id) for ex in examples]
    if not rows:
        return pack_examples([], max_len=max_len, pad_id=pad_id)
    return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
