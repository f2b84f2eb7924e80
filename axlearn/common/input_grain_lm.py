"""Language-model processing on Grain (AXLearn's `input_grain_lm`), in NumPy.

Emits the batch keys of docs/inputs.md (int32): `input_ids` [T], `target_labels` [T] (pad id 0
where there is no target), `target_num_bytes` [], and with streaming packing also
`input_segment_ids` [T] (1, 2, ... per document chunk, 0 on padding) and `input_positions` [T].
A document `t1 .. tn` becomes inputs `EOS t1 .. tn` and targets `t1 .. tn EOS`, as in
`axlearn.common.input_lm` (the tf.data version), whose semantics these functions follow:

- `packing="windowed"` (default): windows of `window_size` documents are concatenated (EOS after
  each) and cut into `max_len` rows (`input_lm.concatenate_and_split`);
- `packing="streaming"`: documents are cut into `max_len` chunks packed next-fit into rows with
  segment ids and positions (`input_lm.pack`); every token appears exactly once.

AXLearn's lower-level steps are here too: `_make_autoregressive_inputs` (inputs = targets shifted
right within each packed window or chunk) with `windowed_packing` or `streaming_packing` (chunks
of up to `max_len` tokens emitted as soon as they fill, flushed every `window_size` examples),
`_trim_or_pad_and_batch` and `_drop_empty_targets`.

Every stage is a checkpointable Grain IterDataset: a restored iterator continues exactly, also
mid-window and mid-row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import grain
import numpy as np

from axlearn.common.config import ConfigOr, maybe_instantiate
from axlearn.common.input_grain import (
    BuildDatasetFn,
    Dataset,
    DispatchConfig,
    Tensor,
    array_record_dataset,
    maybe_to_iter_dataset,
    pad_for_evaluation,
    per_feed_batch,
    prefetch_dataset,
    shard_dataset,
    unbatch,
)

PACKING_WINDOWED = "windowed"
PACKING_STREAMING = "streaming"


def _byte_table(vocab: Any, replace_newlines_with: str) -> np.ndarray:
    from axlearn.common import input_lm  # pylint: disable=import-outside-toplevel

    piece = None if replace_newlines_with == "\n" else replace_newlines_with
    return input_lm.vocab_byte_lengths(vocab, newline_piece=piece)


class _Tokenize:
    """{"text": str} -> {"tokens": int32 [n]} (picklable for prefetch workers)."""

    def __init__(self, vocab: Any, replace_newlines_with: str, text_key: str):
        self._vocab = vocab
        self._replace = replace_newlines_with
        self._key = text_key

    def __call__(self, example: Any) -> dict:
        text = example[self._key] if isinstance(example, dict) else example
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if self._replace != "\n":
            text = text.replace("\n", self._replace)
        return {"tokens": np.asarray(self._vocab.encode(text), dtype=np.int32)}


def tokenize(
    ds: Dataset, *, vocab: Any, replace_newlines_with: str = "\n", text_key: str = "text"
) -> Dataset:
    """Tokenizes documents: {text_key: str or bytes} (or a bare str) -> {"tokens": int32 [n]}.

    Args:
        ds: A dataset of documents.
        vocab: A vocabulary with `encode(str) -> list[int]` (e.g. a seqio vocabulary).
        replace_newlines_with: Newlines are replaced with this string first.
        text_key: The text field.

    Returns:
        The tokenized dataset.
    """
    return ds.map(_Tokenize(vocab, replace_newlines_with, text_key))


class _SplitWindow:
    """A window of tokenized documents -> rows of concatenate-and-split."""

    def __init__(self, *, max_len: int, pad_id: int, eos_id: int, min_tail: int, table):
        self._max_len, self._pad_id, self._eos_id = max_len, pad_id, eos_id
        self._min_tail, self._table = min_tail, table

    def __call__(self, docs: list) -> dict:
        max_len = self._max_len
        eos = np.array([self._eos_id], np.int32)
        stream = np.concatenate([part for d in docs for part in (d["tokens"], eos)])
        inputs = np.roll(stream, 1)
        n, rem = len(stream), len(stream) % max_len
        length = n + (max_len - rem) % max_len if rem > self._min_tail else n - rem

        def fit(x):
            x = np.concatenate([x, np.full([max_len], self._pad_id, np.int32)])[:length]
            return x.reshape([-1, max_len])

        targets = fit(stream)
        return {
            "input_ids": fit(inputs),
            "target_labels": targets,
            "target_num_bytes": self._table[targets].sum(axis=-1).astype(np.int32),
        }


class _Chunks:
    """A tokenized document -> its `max_len` chunks (inputs, targets, length)."""

    def __init__(self, *, max_len: int, pad_id: int, eos_id: int):
        self._max_len, self._pad_id, self._eos_id = max_len, pad_id, eos_id

    def __call__(self, doc: dict) -> dict:
        max_len = self._max_len
        eos = np.array([self._eos_id], np.int32)
        tokens = np.asarray(doc["tokens"], np.int32)
        inputs, targets = np.concatenate([eos, tokens]), np.concatenate([tokens, eos])
        n = len(inputs)
        num_chunks = -(-n // max_len)
        pad = np.full([num_chunks * max_len - n], self._pad_id, np.int32)
        return {
            "inputs": np.concatenate([inputs, pad]).reshape([-1, max_len]),
            "targets": np.concatenate([targets, pad]).reshape([-1, max_len]),
            "length": np.minimum(max_len, n - np.arange(num_chunks) * max_len).astype(np.int32),
        }


class _PackIterator(grain.DatasetIterator):
    """Next-fit packing of a chunk stream; state: the stream's state before the row's chunks."""

    def __init__(self, parent: grain.DatasetIterator, *, max_len: int, pad_id: int, table):
        super().__init__(parent)
        self._max_len, self._pad_id, self._table = max_len, pad_id, table
        # A chunk read but not yet placed (it did not fit the previous row), and the stream's
        # state before it was read.
        self._pending: Optional[dict] = None
        self._pending_state: Optional[dict] = None

    def _read(self) -> Optional[dict]:
        if self._pending is not None:
            chunk, self._pending = self._pending, None
            return chunk
        try:
            return next(self._parent)
        except StopIteration:
            return None

    def __next__(self) -> dict:
        max_len = self._max_len
        inputs = np.full([max_len], self._pad_id, np.int32)
        targets = np.full([max_len], self._pad_id, np.int32)
        segments = np.zeros([max_len], np.int32)
        positions = np.zeros([max_len], np.int32)
        used, segment = 0, 0
        while True:
            state_before = self._pending_state if self._pending is not None else None
            if state_before is None:
                state_before = self._parent.get_state()
            chunk = self._read()
            if chunk is None:
                break
            length = int(chunk["length"])
            if used + length > max_len:
                self._pending, self._pending_state = chunk, state_before
                break
            segment += 1
            inputs[used : used + length] = chunk["inputs"][:length]
            targets[used : used + length] = chunk["targets"][:length]
            segments[used : used + length] = segment
            positions[used : used + length] = np.arange(length)
            used += length
        if used == 0:
            raise StopIteration
        return {
            "input_ids": inputs,
            "target_labels": targets,
            "target_num_bytes": np.int32(self._table[targets].sum()),
            "input_segment_ids": segments,
            "input_positions": positions,
        }

    def get_state(self) -> dict:
        if self._pending is not None:
            return {"parent": self._pending_state}
        return {"parent": self._parent.get_state()}

    def set_state(self, state: dict):
        self._parent.set_state(state["parent"])
        self._pending, self._pending_state = None, None


class _PackIterDataset(grain.IterDataset):
    def __init__(self, parent: grain.IterDataset, *, max_len: int, pad_id: int, table):
        super().__init__(parent)
        self._max_len, self._pad_id, self._table = max_len, pad_id, table

    def __iter__(self) -> grain.DatasetIterator:
        return _PackIterator(
            self._parent.__iter__(), max_len=self._max_len, pad_id=self._pad_id, table=self._table
        )


def text_to_lm_training_input(
    ds: Dataset,
    *,
    vocab: Any,
    max_len: int,
    replace_newlines_with: str = "\n",
    window_size: int = 128,
    max_padding_fraction: float = 1.0,
    packing: str = PACKING_WINDOWED,
    shuffle_window: int = 0,
    seed: int = 0,
    tokenized: bool = False,
    read_options: Optional[grain.ReadOptions] = None,
) -> grain.IterDataset:
    """Turns documents into language-model training examples of `max_len` tokens.

    Args:
        ds: Documents ({"text"}), or tokenized documents ({"tokens"}) with `tokenized=True`;
            shuffle, repeat and shard them before (as MapDatasets).
        vocab: The vocabulary (pad_id, eos_id, encode; byte lengths for `target_num_bytes`).
        max_len: Tokens per example.
        replace_newlines_with: Newlines become this string before tokenizing.
        window_size: "windowed": documents concatenated per window.
        max_padding_fraction: "windowed": a window's tail row is kept (padded) when it has more
            than max_len * (1 - max_padding_fraction) tokens, else dropped.
        packing: "windowed" (concatenate-and-split) or "streaming" (next-fit packing with
            `input_segment_ids`/`input_positions`).
        shuffle_window: If > 0, examples are shuffled in windows of this many (Grain's
            checkpointable window shuffle).
        seed: The window shuffle's seed.
        tokenized: Whether `ds` already holds {"tokens"}.
        read_options: Threads and buffer reading (and tokenizing) a MapDataset `ds` ahead.

    Returns:
        An IterDataset of examples.

    Raises:
        ValueError: If `packing` or `max_padding_fraction` is invalid.
    """
    if packing not in (PACKING_WINDOWED, PACKING_STREAMING):
        raise ValueError(
            f"text_to_lm_training_input: packing={packing!r}; use {PACKING_WINDOWED!r} or "
            f"{PACKING_STREAMING!r}"
        )
    if not 0 <= max_padding_fraction <= 1:
        raise ValueError(
            f"text_to_lm_training_input: max_padding_fraction={max_padding_fraction} must be in "
            f"[0, 1]"
        )
    table = _byte_table(vocab, replace_newlines_with)
    if not tokenized:
        ds = tokenize(ds, vocab=vocab, replace_newlines_with=replace_newlines_with)
    ds = maybe_to_iter_dataset(ds, read_options=read_options)
    pad_id, eos_id = int(vocab.pad_id), int(vocab.eos_id)
    if packing == PACKING_WINDOWED:
        split = _SplitWindow(
            max_len=max_len,
            pad_id=pad_id,
            eos_id=eos_id,
            min_tail=int(max_len * (1 - max_padding_fraction)),
            table=table,
        )
        ds = unbatch(ds.batch(window_size, batch_fn=list).map(split), skip_empty_batch=True)
    else:
        chunks = unbatch(
            ds.map(_Chunks(max_len=max_len, pad_id=pad_id, eos_id=eos_id)), skip_empty_batch=True
        )
        ds = _PackIterDataset(chunks, max_len=max_len, pad_id=pad_id, table=table)
    if shuffle_window > 0:
        ds = grain.experimental.WindowShuffleIterDataset(ds, window_size=shuffle_window, seed=seed)
    return ds


class _EvalWindows:
    """A tokenized document -> its strided eval windows (each target scored once)."""

    def __init__(self, *, max_len: int, stride: int, pad_id: int, eos_id: int, table):
        self._max_len, self._stride = max_len, stride
        self._pad_id, self._eos_id, self._table = pad_id, eos_id, table

    def __call__(self, doc: dict) -> dict:
        max_len, stride, pad_id = self._max_len, self._stride, self._pad_id
        eos = np.array([self._eos_id], np.int32)
        tokens = np.asarray(doc["tokens"], np.int32)
        inputs, targets = np.concatenate([eos, tokens]), np.concatenate([tokens, eos])
        n = len(inputs)
        total = -(-n // max_len) * max_len
        pad = np.full([total - n], pad_id, np.int32)
        inputs, targets = np.concatenate([inputs, pad]), np.concatenate([targets, pad])
        starts = np.arange(0, total - max_len + 1, stride)
        if starts[-1] < total - max_len:
            starts = np.append(starts, total - max_len)
        prev_end = np.concatenate([[0], starts[:-1] + max_len])
        pos = starts[:, None] + np.arange(max_len)[None, :]
        window_targets = np.where(pos >= prev_end[:, None], targets[pos], pad_id).astype(np.int32)
        nbytes = self._table[window_targets].sum(axis=-1).astype(np.int32)
        keep = nbytes > 0
        return {
            "input_ids": inputs[pos][keep],
            "target_labels": window_targets[keep],
            "target_num_bytes": nbytes[keep],
        }


def text_to_lm_eval_input(
    ds: Dataset,
    *,
    vocab: Any,
    max_len: int,
    replace_newlines_with: str = "\n",
    stride: Optional[int] = None,
    tokenized: bool = False,
    read_options: Optional[grain.ReadOptions] = None,
) -> grain.IterDataset:
    """Turns each document into strided `max_len` eval windows; every token is scored once.

    Same windows as `input_lm.text_to_lm_eval_input`: starts 0, stride, 2 * stride, ... (and a
    last one ending at the padded end); a target is scored by the first window covering it.

    Args:
        ds: Documents ({"text"}) or tokenized documents with `tokenized=True` (read once).
        vocab: The vocabulary.
        max_len: Tokens per window.
        replace_newlines_with: Newlines become this string before tokenizing.
        stride: Window stride in (0, max_len]; None: max_len.
        tokenized: Whether `ds` already holds {"tokens"}.
        read_options: Threads and buffer reading (and tokenizing) a MapDataset `ds` ahead.

    Returns:
        An IterDataset of windows.

    Raises:
        ValueError: If `stride` is out of range.
    """
    stride = max_len if stride is None else stride
    if not 0 < stride <= max_len:
        raise ValueError(
            f"text_to_lm_eval_input: stride={stride} must be in (0, max_len={max_len}]"
        )
    table = _byte_table(vocab, replace_newlines_with)
    if not tokenized:
        ds = tokenize(ds, vocab=vocab, replace_newlines_with=replace_newlines_with)
    windows = _EvalWindows(
        max_len=max_len,
        stride=stride,
        pad_id=int(vocab.pad_id),
        eos_id=int(vocab.eos_id),
        table=table,
    )
    return unbatch(
        maybe_to_iter_dataset(ds, read_options=read_options).map(windows), skip_empty_batch=True
    )


def array_record_lm_source(
    *,
    is_training: bool,
    vocab_cfg: ConfigOr[Any],
    max_sequence_length: int,
    global_batch_size: int,
    split: str = "train",
    paths: Optional[Sequence[str]] = None,
    replace_newlines_with: str = "\n",
    packing: str = PACKING_WINDOWED,
    window_size: int = 128,
    shuffle_window: int = 1024,
    eval_stride: Optional[int] = None,
    seed: int = 1,
    num_workers: int = 0,
    read_num_threads: int = 1,
    read_prefetch_buffer_size: int = 16,
) -> BuildDatasetFn:
    """Returns a BuildDatasetFn of language-model batches from ArrayRecord files of documents.

    Training: the documents (UTF-8 text records) are shuffled per epoch and repeated (the global
    order), sharded over feeds (`shard_dataset`), tokenized, packed (`text_to_lm_training_input`),
    window-shuffled and batched. Evaluation: each feed's documents are read once in strided
    windows (`text_to_lm_eval_input`), padded to whole batches with all-zero examples.

    Args:
        is_training: Whether for training.
        vocab_cfg: The vocabulary (a config or instance).
        max_sequence_length: Tokens per example.
        global_batch_size: The global (logical) batch size.
        split: The embedded corpus's split, when `paths` is None (its ArrayRecord file is written
            into the cache at first use: `embedded_array_record.prepare_array_record`).
        paths: ArrayRecord files of documents; None: the embedded corpus's `split`.
        replace_newlines_with: Newlines become this string before tokenizing.
        packing: "windowed" or "streaming" (see `text_to_lm_training_input`).
        window_size: Documents per window of windowed packing.
        shuffle_window: Training examples are shuffled in windows of this many (0: not).
        eval_stride: Evaluation window stride; None: max_sequence_length // 4.
        seed: Seed of the document shuffle and the window shuffle.
        num_workers: Prefetch worker processes (`prefetch_dataset`; 0: none).
        read_num_threads: Threads reading and tokenizing documents ahead (per process or
            worker); Grain's default of 16 is slower here (tokenizing holds the GIL).
        read_prefetch_buffer_size: Documents read ahead (Grain's default of 500 costs a scan of
            500 futures per document).

    Returns:
        A BuildDatasetFn for `input_grain.Input.source`.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.embedded_array_record import prepare_array_record

    def build(dispatch_config: DispatchConfig) -> Dataset:
        vocab = maybe_instantiate(vocab_cfg)
        read_options = grain.ReadOptions(
            num_threads=read_num_threads, prefetch_buffer_size=read_prefetch_buffer_size
        )
        files = list(paths) if paths else [prepare_array_record(split)]
        ds = array_record_dataset(files, seed=seed)
        if is_training:
            ds = shard_dataset(ds.shuffle().repeat(), dispatch_config)
            ds = text_to_lm_training_input(
                ds,
                vocab=vocab,
                max_len=max_sequence_length,
                replace_newlines_with=replace_newlines_with,
                window_size=window_size,
                packing=packing,
                shuffle_window=shuffle_window,
                seed=seed,
                read_options=read_options,
            )
            ds = per_feed_batch(
                ds, global_batch_size=global_batch_size, dispatch_config=dispatch_config
            )
        else:
            ds = text_to_lm_eval_input(
                shard_dataset(ds, dispatch_config),
                vocab=vocab,
                max_len=max_sequence_length,
                replace_newlines_with=replace_newlines_with,
                stride=eval_stride or max(1, max_sequence_length // 4),
                read_options=read_options,
            )
            per_feed = global_batch_size // dispatch_config.num_shards
            ds = pad_for_evaluation(ds, per_feed_batch_size=per_feed)
            ds = per_feed_batch(
                ds,
                global_batch_size=global_batch_size,
                dispatch_config=dispatch_config,
                drop_remainder=False,
            )
        return prefetch_dataset(
            ds, multiprocessing_options=grain.MultiprocessingOptions(num_workers=num_workers)
        )

    return build


def _trim_or_pad_and_batch(
    ids: np.ndarray, *, max_len: int, max_padding_fraction: float = 1, pad_id: int = -1
) -> np.ndarray:
    """Cuts flat `ids` [n] into rows [n // max_len (+1), max_len].

    A last partial row longer than `max_len * (1 - max_padding_fraction)` is padded with
    `pad_id`; a shorter one is dropped (so 1 keeps every token, 0 drops any partial row).

    Args:
        ids: A rank-1 array.
        max_len: The row length.
        max_padding_fraction: The largest fraction of a row that may be padding.
        pad_id: The padding value.

    Returns:
        The rows.

    Raises:
        ValueError: If `ids` is not rank 1.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"_trim_or_pad_and_batch: expected rank-1 ids, got shape {ids.shape}.")
    remainder = ids.shape[0] % max_len
    if remainder > int(max_len * (1 - max_padding_fraction)):
        ids = np.concatenate([ids, np.full(max_len - remainder, pad_id, dtype=ids.dtype)])
    elif remainder:
        ids = ids[: ids.shape[0] - remainder]
    return ids.reshape(-1, max_len)


def windowed_packing(
    ds: Dataset,
    *,
    max_len: Optional[int] = None,
    inner: Optional[Any] = None,
    window_size: Optional[int] = None,
    input_key: str = "target_labels",
    read_options: grain.ReadOptions = grain.ReadOptions(num_threads=1, prefetch_buffer_size=16),
) -> Dataset:
    """Groups `window_size` consecutive examples into a list, applies `inner`, then unbatches.

    Args:
        ds: The examples (a MapDataset or IterDataset).
        max_len: Unused here (`inner` cuts rows); kept for a uniform packing signature.
        inner: Maps a list of examples to a dict of [rows, ...] arrays (None: no mapping).
        window_size: Examples per window.
        input_key: Unused here; kept for a uniform packing signature.
        read_options: Grain's read options for the conversion to an IterDataset.

    Returns:
        An IterDataset of single rows.
    """
    del max_len, input_key
    ds = ds.batch(window_size or 1, drop_remainder=False, batch_fn=list)
    if inner is not None:
        ds = ds.map(inner)
    return unbatch(maybe_to_iter_dataset(ds, read_options=read_options), skip_empty_batch=True)


class _StreamingPackIterator(grain.DatasetIterator):
    """Cuts the concatenated `input_key` tokens of a stream into chunks of up to `max_len`.

    Tokens are buffered across examples; a full `max_len` chunk is emitted as soon as it exists.
    With `window_size`, the buffer is flushed (in chunks, the last one possibly short) after every
    `window_size` examples, so no chunk mixes two windows (as `windowed_packing` cuts them). The
    stream's end flushes the buffer too.

    State: the parent's state before the first buffered example, the number of buffered examples
    and the number of buffered tokens (a suffix of their concatenation); a restore re-reads those
    examples, so the state stays small whatever the buffer holds.
    """

    def __init__(
        self,
        parent: grain.DatasetIterator,
        *,
        max_len: int,
        window_size: Optional[int],
        input_key: str,
    ):
        super().__init__(parent)
        self._max_len, self._window_size, self._key = max_len, window_size, input_key
        self._num_read = 0  # Examples read from the parent (counts windows).
        self._pieces: list[np.ndarray] = []  # The buffered tokens, in order.
        self._num_tokens = 0
        # The parent's state before each buffered example, and each one's unconsumed tokens.
        self._sources: list[list] = []

    def _window_done(self) -> bool:
        return bool(self._window_size) and self._num_read % self._window_size == 0

    def _emit(self) -> dict:
        tokens = np.concatenate(self._pieces, axis=-1)
        chunk, rest = tokens[: self._max_len], tokens[self._max_len :]
        self._pieces = [rest] if rest.size else []
        self._num_tokens = int(rest.size)
        consumed = int(chunk.size)
        while self._sources and consumed >= self._sources[0][1]:
            consumed -= self._sources.pop(0)[1]
        if self._sources:
            self._sources[0][1] -= consumed
        if not self._pieces:
            self._sources = []
        return {self._key: chunk}

    def _read(self) -> bool:
        state = self._parent.get_state()
        try:
            example = next(self._parent)
        except StopIteration:
            return False
        tokens = np.asarray(example[self._key])
        self._num_read += 1
        if tokens.size:
            self._pieces.append(tokens)
            self._num_tokens += int(tokens.size)
            self._sources.append([state, int(tokens.size)])
        return True

    def __next__(self) -> dict:
        while True:
            if self._num_tokens >= self._max_len or (self._num_tokens and self._window_done()):
                return self._emit()
            if not self._read():
                if self._num_tokens:
                    return self._emit()
                raise StopIteration

    def get_state(self) -> dict:
        return {
            "parent": self._parent.get_state(),
            "num_read": self._num_read,
            "buffer_start": self._sources[0][0] if self._sources else None,
            "buffer_examples": len(self._sources),
            "buffer_tokens": self._num_tokens,
        }

    def set_state(self, state: dict):
        self._num_read = state["num_read"]
        self._pieces, self._sources, self._num_tokens = [], [], 0
        if not state["buffer_examples"]:
            self._parent.set_state(state["parent"])
            return
        self._parent.set_state(state["buffer_start"])
        for _ in range(state["buffer_examples"]):
            before = self._parent.get_state()
            tokens = np.asarray(next(self._parent)[self._key])
            self._pieces.append(tokens)
            self._sources.append([before, int(tokens.size)])
        # Drop the tokens of the first example that were emitted before the state was taken.
        extra = sum(n for _, n in self._sources) - state["buffer_tokens"]
        if not 0 <= extra < self._sources[0][1]:
            raise ValueError(
                f"streaming_packing: the state's buffer ({state['buffer_tokens']} tokens of "
                f"{state['buffer_examples']} examples) does not match the data; restore a state "
                "saved with the same data"
            )
        self._pieces[0] = self._pieces[0][extra:]
        self._sources[0][1] -= extra
        self._num_tokens = state["buffer_tokens"]


class _StreamingPackIterDataset(grain.IterDataset):
    def __init__(self, parent, *, max_len: int, window_size: Optional[int], input_key: str):
        super().__init__(parent)
        self._max_len, self._window_size, self._key = max_len, window_size, input_key

    def __str__(self) -> str:
        return f"StreamingPackIterDataset(max_len={self._max_len})"

    def __iter__(self) -> grain.DatasetIterator:
        return _StreamingPackIterator(
            self._parent.__iter__(),
            max_len=self._max_len,
            window_size=self._window_size,
            input_key=self._key,
        )


class _ProcessChunk:
    """Applies `inner` to a chunk; keeps its single row, or None if `inner` dropped it."""

    def __init__(self, inner: Any, input_key: str):
        self._inner, self._key = inner, input_key

    def __call__(self, chunk: dict) -> Optional[dict]:
        out = self._inner(chunk)
        if np.size(out[self._key]) == 0:
            return None
        for key, value in out.items():
            if np.shape(value)[0] != 1:
                raise ValueError(
                    f"streaming_packing: inner returned {np.shape(value)[0]} rows for {key!r} "
                    f"from one chunk of at most max_len tokens; expected 1 (or 0 to drop it)"
                )
        return {key: value[0] for key, value in out.items()}


def _is_not_none(x: Any) -> bool:
    return x is not None


def streaming_packing(
    ds: Dataset,
    *,
    max_len: int,
    inner: Any,
    window_size: Optional[int] = None,
    input_key: str = "target_labels",
    read_options: grain.ReadOptions = grain.ReadOptions(num_threads=1, prefetch_buffer_size=16),
) -> grain.IterDataset:
    """Packs the `input_key` tokens of consecutive examples into chunks of `max_len`, streaming.

    Unlike `windowed_packing`, no window of examples is held: a chunk is emitted as soon as
    `max_len` tokens are buffered. With `window_size`, the buffer is also flushed after every
    `window_size` examples, which gives the rows of `windowed_packing` with the same `inner`.
    Each chunk ({input_key: [<= max_len]}) goes through `inner`, which returns [1, ...] arrays
    (or [0, ...] to drop the chunk, e.g. a short tail); the output rows have the leading axis
    removed.

    Args:
        ds: Examples with a rank-1 `input_key` (other keys are not kept).
        max_len: Tokens per chunk.
        inner: Maps {input_key: tokens} to a dict of [1 or 0, ...] arrays.
        window_size: Examples per flush; None: flush only at the end of the stream.
        input_key: The key of the tokens.
        read_options: Grain's read options for the conversion to an IterDataset.

    Returns:
        An IterDataset of `inner`'s rows (checkpointable mid-buffer).

    Raises:
        ValueError: If `max_len` or `window_size` is not positive.
    """
    if max_len <= 0 or (window_size is not None and window_size <= 0):
        raise ValueError(
            f"streaming_packing: max_len={max_len} and window_size={window_size} must be "
            "positive (window_size may be None)"
        )
    ds = maybe_to_iter_dataset(ds, read_options=read_options)
    ds = _StreamingPackIterDataset(
        ds, max_len=max_len, window_size=window_size, input_key=input_key
    )
    return ds.map(_ProcessChunk(inner, input_key)).filter(_is_not_none)


def _drop_empty_targets(example: dict[str, Tensor]) -> dict[str, Tensor]:
    """Keeps the rows of a batch whose `target_num_bytes` is positive.

    Args:
        example: A dict of arrays sharing a leading (row) axis, with "target_num_bytes" [rows].

    Returns:
        The same keys, with only the rows that have target bytes.
    """
    keep = np.asarray(example["target_num_bytes"]) > 0
    return {key: np.asarray(value)[keep] for key, value in example.items()}


def _make_autoregressive_inputs(
    ds: Dataset,
    *,
    max_len: int,
    packing_fn: Any,
    input_key: str = "target_labels",
    split_fn: Optional[ConfigOr[Any]] = None,
    read_options: grain.ReadOptions = grain.ReadOptions(num_threads=1, prefetch_buffer_size=16),
    window_size: int = 1,
) -> Dataset:
    """Adds `input_ids`: the packed `input_key` tokens shifted right by one (cyclically).

    Within each packed window the flat targets `t1 .. tn` give inputs `tn t1 .. t(n-1)`; both are
    cut into rows by `split_fn` (default: one row of the whole window).

    Args:
        ds: Examples with a flat int `input_key` [len] (lengths may differ).
        max_len: The row length, passed to `split_fn` and `packing_fn`.
        packing_fn: E.g. `windowed_packing`; called as
            `packing_fn(ds, max_len=, inner=, window_size=, read_options=)`.
        input_key: The key of the targets.
        split_fn: `split_fn(flat_ids, max_len=)` -> [rows, max_len] (or a config of it).
        read_options: Grain's read options for the conversion to an IterDataset.
        window_size: Examples per packing window.

    Returns:
        An IterDataset of {"input_ids": [max_len], "target_labels": [max_len]}.
    """
    split = maybe_instantiate(split_fn)
    if split is None:

        def split(ids, **_):
            return ids[None]

    def process(examples):
        if not isinstance(examples, Sequence):
            examples = [examples]
        targets = np.concatenate([x[input_key] for x in examples], axis=-1)
        inputs = np.roll(targets, 1, axis=0)
        return dict(
            input_ids=split(inputs, max_len=max_len), target_labels=split(targets, max_len=max_len)
        )

    return packing_fn(
        ds, max_len=max_len, inner=process, window_size=window_size, read_options=read_options
    )
