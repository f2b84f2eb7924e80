"""Masked language modeling (MLM) inputs: masking strategies and the BERT/RoBERTa text pipeline.

Every token (or, with whole-word masking, every word) gets an `MLMAction`:

- `DO_NOTHING`: unchanged, and its target is ignored (`ignore_target_id`);
- `MASK`: replaced by the mask token;
- `SWAP`: replaced by a token drawn uniformly from the vocabulary;
- `KEEP`: unchanged, but predicted.

With the defaults (`select_token_prob=0.15`, `mask_selected_prob=0.8`,
`swap_selected_prob=0.1`), 15% of the tokens are predicted, and of those 80% are masked, 10%
swapped and 10% kept (BERT's recipe). `iid_mlm_actions` draws each token's action
independently; `roberta_mlm_actions` selects exactly `floor(p * len + U[0, 1))` tokens, as
fairseq's RoBERTa does; `roberta_mlm_actions_combinatorial_ngram` masks every n-gram in turn,
one output example per n-gram.

`text_to_mlm_input` is RoBERTa's "full-sentences" pipeline: normalize, tokenize with EOS, drop
(or truncate) over-long lines, pack lines up to `max_len - 1`, prepend BOS, mask.

TensorFlow and seqio are imported lazily: importing this module does not import them.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Callable, Optional

from axlearn.common.config import InstantiableConfig, config_for_function
from axlearn.common.input_processors import rekey, shuffle
from axlearn.common.input_text import infer_bos_id, tokenize

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from axlearn.common.input_processors import DatasetToDatasetFn

# A word starts at a piece beginning with "▁" (SentencePiece's space), "[" or "<".
_WORD_START_PATTERN = b"^(\xe2\x96\x81|\\[|<).*$"


def _ids_to_word_starts(inputs: Any, vocab: Any) -> tf.Tensor:
    """The positions of the pieces that start a word.

    Args:
        inputs: int token ids [seq_len].
        vocab: A seqio SentencePiece vocabulary.

    Returns:
        int64 [num_words]: the indices whose piece starts with "▁", "[" or "<".
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    pieces = vocab.tf_tokenizer.id_to_string(inputs)
    starts = tf.where(tf.strings.regex_full_match(pieces, _WORD_START_PATTERN))
    return tf.reshape(starts, [-1])


class MLMAction(enum.Enum):
    """What MLM does to a token (the values are the action ids in the actions tensors).

    DO_NOTHING: unchanged, target ignored. MASK: replaced by the mask id, predicted.
    SWAP: replaced by a random token, predicted. KEEP: unchanged, predicted.
    """

    DO_NOTHING = 0
    MASK = 1
    SWAP = 2
    KEEP = 3


def _validate_mlm_actions(
    *, select_token_prob: float, mask_selected_prob: float, swap_selected_prob: float
):
    for name, value in (
        ("select_token_prob", select_token_prob),
        ("mask_selected_prob", mask_selected_prob),
        ("swap_selected_prob", swap_selected_prob),
    ):
        if not 0 <= value <= 1:
            raise ValueError(f"Expected {name} to be in [0,1], got {value}.")
    if mask_selected_prob + swap_selected_prob > 1:
        raise ValueError(
            "Expected mask_selected_prob + swap_selected_prob <= 1, got "
            f"{mask_selected_prob} + {swap_selected_prob}."
        )


def iid_mlm_actions(
    *,
    select_token_prob: float = 0.15,
    mask_selected_prob: float = 0.8,
    swap_selected_prob: float = 0.1,
) -> Callable[[Any], tf.Tensor]:
    """Draws each token's action independently.

    P(MASK) = select * mask_selected, P(SWAP) = select * swap_selected,
    P(KEEP) = select * (1 - mask_selected - swap_selected), P(DO_NOTHING) = 1 - select.

    Args:
        select_token_prob: Probability that a token is predicted.
        mask_selected_prob: Probability that a predicted token is masked.
        swap_selected_prob: Probability that a predicted token is swapped for a random one.

    Returns:
        A function from seq_len to int64 actions [seq_len] (`MLMAction` values).

    Raises:
        ValueError: If a probability is outside [0, 1] or mask + swap > 1.
    """
    _validate_mlm_actions(
        select_token_prob=select_token_prob,
        mask_selected_prob=mask_selected_prob,
        swap_selected_prob=swap_selected_prob,
    )
    probs = {
        MLMAction.DO_NOTHING: 1.0 - select_token_prob,
        MLMAction.MASK: select_token_prob * mask_selected_prob,
        MLMAction.SWAP: select_token_prob * swap_selected_prob,
        MLMAction.KEEP: select_token_prob * (1.0 - mask_selected_prob - swap_selected_prob),
    }
    ordered = [probs[action] for action in sorted(MLMAction, key=lambda a: a.value)]

    def generate_actions(seq_len):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        # Categorical takes log-probabilities; log(0) = -inf never gets drawn.
        return tf.random.categorical(tf.math.log([ordered]), seq_len)[0]

    return generate_actions


def _split_selected(mask: tf.Tensor, *, keep_prob: float, swap_or_keep_prob: float) -> tf.Tensor:
    """Actions for selected positions (`mask`, bool): KEEP, SWAP or MASK by one uniform draw.

    A draw u < keep_prob keeps, keep_prob <= u < swap_or_keep_prob swaps, the rest masks.
    `mask` may be [n] (a draw per position) or [E, n] with one draw per row.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    actions = tf.cast(mask, tf.int32) * MLMAction.MASK.value
    if swap_or_keep_prob <= 0:
        return actions
    shape = tf.shape(mask)
    if mask.shape.rank == 2:
        decisions = tf.random.uniform([shape[0], 1])
    else:
        decisions = tf.random.uniform(shape)
    keep = tf.logical_and(mask, decisions < keep_prob)
    swap = tf.logical_and(
        mask, tf.logical_and(decisions >= keep_prob, decisions < swap_or_keep_prob)
    )
    actions = tf.where(keep, MLMAction.KEEP.value, actions)
    return tf.where(swap, MLMAction.SWAP.value, actions)


def roberta_mlm_actions(
    *,
    select_token_prob: float = 0.15,
    mask_selected_prob: float = 0.8,
    swap_selected_prob: float = 0.1,
) -> Callable[[Any], tf.Tensor]:
    """Selects a fixed number of tokens, as fairseq's RoBERTa does, then splits them.

    `floor(select_token_prob * seq_len + u)`, u ~ U[0, 1), positions are drawn without
    replacement; each selected one is kept with probability `1 - mask - swap`, swapped with
    `swap`, masked otherwise.

    Args:
        select_token_prob: Fraction of tokens predicted.
        mask_selected_prob: Probability that a selected token is masked.
        swap_selected_prob: Probability that a selected token is swapped for a random one.

    Returns:
        A function from seq_len to int32 actions [seq_len].

    Raises:
        ValueError: If a probability is outside [0, 1] or mask + swap > 1.
    """
    _validate_mlm_actions(
        select_token_prob=select_token_prob,
        mask_selected_prob=mask_selected_prob,
        swap_selected_prob=swap_selected_prob,
    )
    swap_or_keep_prob = 1.0 - mask_selected_prob
    keep_prob = swap_or_keep_prob - swap_selected_prob

    def generate_actions(seq_len):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        num_selected = tf.cast(
            select_token_prob * tf.cast(seq_len, tf.float32) + tf.random.uniform([]), tf.int32
        )
        num_selected = tf.minimum(num_selected, seq_len)
        # A uniformly random subset of exactly num_selected positions.
        order = tf.argsort(tf.random.uniform([seq_len]))
        rank = tf.math.invert_permutation(order)
        mask = rank < num_selected
        return _split_selected(mask, keep_prob=keep_prob, swap_or_keep_prob=swap_or_keep_prob)

    return generate_actions


def roberta_mlm_actions_combinatorial_ngram(
    *, mask_prob: float = 1.0, swap_prob: float = 0.0, n: int = 1
) -> Callable[[Any], tf.Tensor]:
    """Acts on every n-gram in turn: row i acts on positions [i, i + n).

    Each row's n-gram is masked, swapped (probability `swap_prob`) or kept
    (`1 - mask_prob - swap_prob`) as a whole; other positions get DO_NOTHING.

    Args:
        mask_prob: Probability of masking an n-gram.
        swap_prob: Probability of swapping an n-gram with random tokens.
        n: The n-gram length.

    Returns:
        A function from seq_len to int32 actions [seq_len - n + 1, seq_len].

    Raises:
        ValueError: If the probabilities are outside [0, 1] or sum to more than 1.
    """
    keep_prob = 1.0 - (mask_prob + swap_prob)
    if not (0 <= mask_prob <= 1 and 0 <= swap_prob <= 1 and keep_prob >= 0):
        raise ValueError(
            "Expected sum of probabilities to be equal to 1: mask_prob and swap_prob in [0, 1] "
            f"with mask_prob + swap_prob <= 1, got {mask_prob} and {swap_prob}."
        )
    swap_or_keep_prob = 1.0 - mask_prob

    def generate_actions(seq_len):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        starts = tf.range(seq_len - n + 1)[:, None]
        positions = tf.range(seq_len)[None, :]
        mask = tf.logical_and(positions >= starts, positions < starts + n)
        return _split_selected(mask, keep_prob=keep_prob, swap_or_keep_prob=swap_or_keep_prob)

    return generate_actions


def _check_mask_id(mask_id: int, ignore_input_ids: list[int], vocab: Any) -> None:
    if mask_id == vocab.unk_id:
        raise ValueError(
            f"Mask token ID ({mask_id}) should be different from unk ID ({vocab.unk_id}): "
            "set apply_mlm_mask.mask_id to the mask piece's id."
        )
    if mask_id in ignore_input_ids:
        raise ValueError(
            f"Mask token ID ({mask_id}) should not be ignored ({ignore_input_ids}): remove it "
            "from apply_mlm_mask.ignore_input_ids."
        )
    if int(_ids_to_word_starts([mask_id], vocab).shape[0]) != 1:
        raise ValueError(
            f"Mask token ID ({mask_id}) should constitute a start-of-word (its piece must start "
            "with '▁', '[' or '<')."
        )


def _word_ids(inputs: tf.Tensor, vocab: Any, whole_word_mask: bool) -> tuple[tf.Tensor, Any]:
    """Maps each token to its word: ([seq_len] word index, number of words).

    Without whole-word masking, or when the tokens hold at most one word start, every token is
    its own word. Otherwise a word runs from one word-start piece to the next; tokens before the
    first word start join the first word.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    seq_len = tf.shape(inputs)[0]
    every_token = tf.ones([seq_len], dtype=tf.bool)
    if whole_word_mask:
        starts = _ids_to_word_starts(inputs, vocab)
        marks = tf.scatter_nd(
            starts[:, None], tf.ones_like(starts, dtype=tf.int32), [tf.cast(seq_len, tf.int64)]
        )
        # Position 0 (the dummy word start put in front by the caller) always starts a word.
        is_start = tf.logical_or(marks > 0, tf.range(seq_len) == 0)
        is_start = tf.cond(tf.size(starts) > 1, lambda: is_start, lambda: every_token)
    else:
        is_start = every_token
    word_ids = tf.cumsum(tf.cast(is_start, tf.int32)) - 1
    return word_ids, tf.reduce_sum(tf.cast(is_start, tf.int32))


def _ignored_words(inputs: tf.Tensor, ignore_input_ids: list[int], word_ids, num_words):
    """bool [num_words]: whether a word holds an ignored id."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    ignored = tf.zeros_like(inputs, dtype=tf.bool)
    for token_id in ignore_input_ids:
        ignored = tf.logical_or(ignored, tf.equal(inputs, token_id))
    per_word = tf.math.unsorted_segment_max(tf.cast(ignored, tf.int32), word_ids, num_words)
    return per_word > 0


def _apply_actions(
    inputs: Any,
    actions: Any,
    *,
    vocab_size: int,
    mask_id: int,
    ignore_target_id: int,
    is_translation_style: bool,
) -> tuple[Any, Any]:
    """Applies per-token MLM actions: MASK -> mask_id, SWAP -> a uniform random token.

    Args:
        inputs: Token ids (a tf.Tensor).
        actions: `MLMAction` values, of the shape of `inputs`.
        vocab_size: Random tokens are drawn from [0, vocab_size).
        mask_id: The mask token's id.
        ignore_target_id: The target of a token left alone (unless translation style).
        is_translation_style: Whether every target is the input token.

    Returns:
        (masked inputs, targets).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    random_tokens = tf.random.uniform(
        tf.shape(inputs), minval=0, maxval=vocab_size, dtype=inputs.dtype
    )
    masked = tf.where(actions == MLMAction.MASK.value, tf.constant(mask_id, inputs.dtype), inputs)
    masked = tf.where(actions == MLMAction.SWAP.value, random_tokens, masked)
    targets = inputs
    if not is_translation_style:
        targets = tf.where(
            actions == MLMAction.DO_NOTHING.value,
            tf.constant(ignore_target_id, inputs.dtype),
            inputs,
        )
    return masked, targets


def apply_mlm_mask(
    *,
    whole_word_mask: bool = False,
    input_key: str = "input_ids",
    target_key: str = "target_labels",
    ignore_input_ids: list[int],
    ignore_target_id: int,
    mask_id: int,
    vocab_cfg: InstantiableConfig,
    actions_cfg: InstantiableConfig = config_for_function(iid_mlm_actions),
    is_translation_style: bool = False,
) -> DatasetToDatasetFn:
    """Applies dynamic MLM masking (a new mask each time an example is read).

    A dummy word-start token (`mask_id`) is put in front of the sequence and dropped at the end,
    so that the first position always starts a word; tokens before the sequence's first word
    start are grouped with it (a word cut from the previous document). The number of words given
    to the actions function counts the dummy.

    Args:
        whole_word_mask: If True, all pieces of a word get the word's action.
        input_key: The int32 [seq_len] field to mask.
        target_key: The field the targets are written to (same shape).
        ignore_input_ids: Ids that always get DO_NOTHING (e.g. padding); a word holding one
            does too.
        ignore_target_id: The target of DO_NOTHING positions.
        mask_id: The mask token's id; must differ from unk, not be ignored, and start a word.
        vocab_cfg: Config of the seqio SentencePiece vocabulary (swaps draw from
            [0, vocab_size); word starts come from its pieces).
        actions_cfg: The action strategy (a function of seq_len; see `iid_mlm_actions`).
        is_translation_style: If True, DO_NOTHING positions keep their token as target.

    Returns:
        A DatasetToDatasetFn adding `target_key` and masking `input_key`.

    Raises:
        ValueError: If `mask_id` is invalid.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from axlearn.common.input_field_processors import (  # pylint: disable=import-outside-toplevel
        preserve_element_spec,
    )

    ignore_input_ids = list(ignore_input_ids)
    vocab = vocab_cfg.instantiate()
    actions_fn = actions_cfg.instantiate()
    _check_mask_id(mask_id, ignore_input_ids, vocab)

    def example_fn(example):
        inputs = example[input_key]
        tf.debugging.assert_equal(tf.rank(inputs), 1, message=f"{input_key} must be 1D")
        inputs = tf.concat([tf.constant([mask_id], dtype=inputs.dtype), inputs], axis=0)
        word_ids, num_words = _word_ids(inputs, vocab, whole_word_mask)
        actions = tf.cast(actions_fn(num_words), tf.int32)
        ignored = _ignored_words(inputs, ignore_input_ids, word_ids, num_words)
        actions = tf.where(ignored, MLMAction.DO_NOTHING.value, actions)
        actions = tf.gather(actions, word_ids)

        masked, targets = _apply_actions(
            inputs,
            actions,
            vocab_size=vocab.vocab_size,
            mask_id=mask_id,
            ignore_target_id=ignore_target_id,
            is_translation_style=is_translation_style,
        )
        example[input_key] = masked[1:]
        example[target_key] = targets[1:]
        return example

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        return ds.map(example_fn, num_parallel_calls=tf.data.AUTOTUNE)

    return preserve_element_spec(process, key_map={target_key: input_key})


def apply_mlm_mask_combinatorial_ngram(
    *,
    whole_word_mask: bool = False,
    input_key: str = "input_ids",
    target_key: str = "target_labels",
    ignore_input_ids: list[int],
    ignore_target_id: int,
    mask_id: int,
    vocab_cfg: InstantiableConfig,
    actions_cfg: InstantiableConfig = config_for_function(roberta_mlm_actions_combinatorial_ngram),
    is_translation_style: bool = False,
    n: int = 1,
) -> DatasetToDatasetFn:
    """Masks every n-gram (of tokens, or of words) of each example in turn.

    An example of W tokens (words) becomes W - n + 1 examples; the i-th has its i-th n-gram
    acted on (see `roberta_mlm_actions_combinatorial_ngram`). With whole-word masking the
    sequence must start with a word start.

    Args:
        whole_word_mask: If True, n-grams are of words.
        input_key: The int32 [seq_len] field to mask.
        target_key: The field the targets are written to.
        ignore_input_ids: Ids that always get DO_NOTHING.
        ignore_target_id: The target of DO_NOTHING positions.
        mask_id: The mask token's id (checked as in `apply_mlm_mask`).
        vocab_cfg: Config of the seqio SentencePiece vocabulary.
        actions_cfg: The n-gram action strategy; its `n` is set to `n`.
        is_translation_style: If True, DO_NOTHING positions keep their token as target.
        n: The n-gram length; examples shorter than n fail (InvalidArgumentError).

    Returns:
        A DatasetToDatasetFn yielding W - n + 1 examples per input example.

    Raises:
        ValueError: If `mask_id` is invalid.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    ignore_input_ids = list(ignore_input_ids)
    vocab = vocab_cfg.instantiate()
    actions_fn = actions_cfg.set(n=n).instantiate()
    _check_mask_id(mask_id, ignore_input_ids, vocab)

    def example_fn(example):
        inputs = example[input_key]
        tf.debugging.assert_equal(tf.rank(inputs), 1, message=f"{input_key} must be 1D")
        seq_len = tf.shape(inputs)[0]
        if whole_word_mask:
            starts = _ids_to_word_starts(inputs, vocab)
            starts = tf.cond(
                tf.size(starts) > 1, lambda: starts, lambda: tf.range(seq_len, dtype=tf.int64)
            )
            tf.debugging.assert_equal(
                tf.cast(starts[0], tf.int32), 0, message="whole-word n-grams need a word start at 0"
            )
            is_start = tf.scatter_nd(
                starts[:, None], tf.ones_like(starts, dtype=tf.int32), [tf.cast(seq_len, tf.int64)]
            )
            word_ids = tf.cumsum(is_start) - 1
            num_words = tf.reduce_sum(is_start)
        else:
            word_ids, num_words = tf.range(seq_len), seq_len
        tf.debugging.assert_greater_equal(num_words, n, "n (ngram) needs to be <= seq_len")
        actions = tf.cast(actions_fn(num_words), tf.int32)  # [E, num_words]
        ignored = _ignored_words(inputs, ignore_input_ids, word_ids, num_words)
        actions = tf.where(ignored[None, :], MLMAction.DO_NOTHING.value, actions)
        actions = tf.gather(actions, word_ids, axis=1)  # [E, seq_len]
        num_examples = tf.shape(actions)[0]

        tiled = tf.tile(inputs[None, :], [num_examples, 1])
        masked, targets = _apply_actions(
            tiled,
            actions,
            vocab_size=vocab.vocab_size,
            mask_id=mask_id,
            ignore_target_id=ignore_target_id,
            is_translation_style=is_translation_style,
        )
        example = dict(example)
        example[input_key] = masked
        example[target_key] = targets
        others = [k for k in example if k not in (input_key, target_key)]
        for key in others:
            example[key] = tf.repeat(example[key][None], num_examples, axis=0)
        return example

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        return ds.map(example_fn, num_parallel_calls=tf.data.AUTOTUNE).unbatch()

    return process


def text_to_mlm_input(
    *,
    is_training: bool,
    sentence_piece_vocab: InstantiableConfig,
    normalization: InstantiableConfig,
    max_len: int,
    apply_mlm_mask: InstantiableConfig,  # pylint: disable=redefined-outer-name
    shuffle_buffer_size: int,
    mask_token: str = "[MASK]",
    ignore_target_id: int = 0,
    truncation: Optional[InstantiableConfig] = None,
    bos_token: Optional[str] = None,
) -> DatasetToDatasetFn:
    """RoBERTa's "full-sentences" MLM input: packed lines of one or more documents, masked.

    Input examples are `{"text": line}`: one or more sentences of a document per line, an empty
    line ending the document (so the input must be unshuffled or shuffled by document). Each
    line is tokenized with EOS (an empty line becomes a lone EOS, so two documents are separated
    by two EOS), lines longer than `max_len - 1` are dropped (or cut by `truncation`), lines are
    packed up to `max_len - 1` tokens, one BOS is prepended, and every position (BOS and EOS
    included, as in fairseq) may be masked.

    Args:
        is_training: Unused (kept for the processor signature).
        sentence_piece_vocab: Config of the seqio SentencePiece vocabulary.
        normalization: Config of the text normalization processor (e.g. `bert_normalize`).
        max_len: Tokens per output example.
        apply_mlm_mask: Config of `apply_mlm_mask`; its ignore/mask ids and vocab are set here.
        shuffle_buffer_size: Shuffle buffer after packing; <= 0: no shuffling.
        mask_token: The mask piece.
        ignore_target_id: The target of unpredicted positions (must be 0, the pad id).
        truncation: Config of a processor taking `max_len` that cuts long lines (e.g.
            `input_text.random_chunking`); None drops them.
        bos_token: The BOS piece; None: the vocabulary's BOS, or EOS (`infer_bos_id`).

    Returns:
        A DatasetToDatasetFn to `{"input_ids", "target_labels"}` int32 [max_len] examples.

    Raises:
        ValueError: If the pad, EOS, mask and unk ids are not distinct, or padding is not 0.
    """
    import seqio  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from axlearn.common.input_tf_data import chain  # pylint: disable=import-outside-toplevel

    del is_training
    vocab = sentence_piece_vocab.instantiate()
    pad_id, eos_id, unk_id = vocab.pad_id, vocab.eos_id, vocab.unk_id
    mask_id = vocab.tokenizer.piece_to_id(mask_token)
    bos_id = vocab.tokenizer.piece_to_id(bos_token) if bos_token else infer_bos_id(vocab)
    if not pad_id == ignore_target_id == 0:
        raise ValueError(
            f"text_to_mlm_input: pad id ({pad_id}) and ignore_target_id ({ignore_target_id}) "
            "must be 0 (SeqIO packs with zeros)."
        )
    ids = [pad_id, eos_id, mask_id, unk_id]
    if len(set(ids)) != len(ids):
        raise ValueError(
            f"text_to_mlm_input: pad, eos, mask and unk ids must be distinct, got {ids} "
            f"(mask_token={mask_token!r})."
        )
    body_len = max_len - 1  # Room for BOS.

    def drop_long(ds: tf.data.Dataset) -> tf.data.Dataset:
        return ds.filter(lambda x: tf.shape(x["input_ids"])[0] <= body_len)

    def pack(ds: tf.data.Dataset) -> tf.data.Dataset:
        return seqio.trim_and_pack_dataset(ds, feature_lengths={"input_ids": body_len})

    def prepend_bos(ds: tf.data.Dataset) -> tf.data.Dataset:
        def fn(example):
            bos = tf.constant([bos_id], dtype=example["input_ids"].dtype)
            return {"input_ids": tf.concat([bos, example["input_ids"]], axis=0)}

        return ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)

    return chain(
        normalization,
        rekey({"input_ids": "text"}),
        tokenize(
            output_features={"input_ids": seqio.Feature(vocab, add_eos=True, dtype=tf.int32)},
            with_eos=True,
        ),
        truncation.set(max_len=body_len) if truncation else drop_long,
        pack,
        prepend_bos,
        apply_mlm_mask.set(
            ignore_input_ids=[pad_id],
            ignore_target_id=ignore_target_id,
            mask_id=mask_id,
            vocab_cfg=sentence_piece_vocab,
        ),
        shuffle(shuffle_buffer_size=shuffle_buffer_size),
    )
