"""Input feeds: how a global batch is split across independent tf.data pipelines and processes.

The global batch of an `input_tf_data.Input` is the concatenation, in feed order, of the batches of
`num_feeds` independent pipelines ("feeds"). Feed `f` reads shard `f` of `num_feeds` of every
source (examples split evenly), processes it and batches `global_batch_size // num_feeds`
examples. With `P` processes, process `p` runs feeds `[p * F / P, (p + 1) * F / P)` and yields
their concatenation: its slice of the global batch. So

- the global batches do not depend on the process count, only on `num_feeds` (which defaults to
  the process count); and
- each process reads and processes only its own shards.

While a feed's pipeline is built, `current_feed()` returns its `FeedContext`; sources, processors
and batchers read it to shard, seed and size themselves. Outside an `Input`, it describes this
process as the only feed of its own shard (`jax.process_count()` feeds), like a plain pipeline.

This module imports neither TensorFlow nor seqio.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from typing import Any, Optional

# The seed used when neither the Input nor a source sets one: pipelines are deterministic.
DEFAULT_SEED = 0
# Malformed-record policies.
MALFORMED_FAIL = "fail"
MALFORMED_SKIP = "skip"


@dataclasses.dataclass(frozen=True)
class FeedContext:
    """Describes the feed whose pipeline is being built.

    Attributes:
        num_feeds: The number of feeds the global batch is split across.
        feed_index: This feed's index in [0, num_feeds).
        seed: The base seed of the pipeline (per-op seeds derive from it, the feed and a salt).
        malformed_records: "fail" or "skip" (see `input_tf_data.handle_malformed`).
        source_description: A short description of the source, used in error messages.
        malformed_counter: A tf.Variable counting skipped records of this feed, or None.
        eval_num_batches: For evaluation inputs: the number of batches every feed pads to.
        eval_num_examples: For evaluation inputs: this feed's example count (already counted).
        claims: Records sources that sharded themselves (see `claim_shard`); internal.
    """

    num_feeds: int
    feed_index: int
    seed: int = DEFAULT_SEED
    malformed_records: str = MALFORMED_FAIL
    source_description: str = "input source"
    malformed_counter: Any = None
    eval_num_batches: Optional[int] = None
    eval_num_examples: Optional[int] = None
    claims: list = dataclasses.field(default_factory=list, compare=False)


_local = threading.local()


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def default_feed() -> FeedContext:
    """Returns the context used outside an Input: one feed per JAX process.

    Returns:
        FeedContext(num_feeds=jax.process_count(), feed_index=jax.process_index()).
    """
    import jax  # pylint: disable=import-outside-toplevel

    return FeedContext(num_feeds=jax.process_count(), feed_index=jax.process_index())


def current_feed() -> FeedContext:
    """Returns the innermost active feed context, or `default_feed()`.

    Returns:
        The context.
    """
    stack = _stack()
    return stack[-1] if stack else default_feed()


@contextlib.contextmanager
def feed_scope(context: FeedContext):
    """Makes `context` the current feed while the block builds a pipeline.

    Args:
        context: The feed context.

    Yields:
        `context`.

    Raises:
        ValueError: If the feed index is out of range.
    """
    if not 0 <= context.feed_index < context.num_feeds:
        raise ValueError(
            f"feed_index {context.feed_index} is out of range for num_feeds {context.num_feeds}"
        )
    stack = _stack()
    stack.append(context)
    try:
        yield context
    finally:
        stack.pop()


def claim_shard(source: str) -> tuple[int, int]:
    """Returns (num_shards, shard_index) for a source that reads only its feed's shard.

    A source that shards itself calls this; `Input` shards the examples of sources that do not
    (`ds.shard(num_feeds, feed_index)`), so feeds never read the same examples.

    Args:
        source: A name for the source (for logs).

    Returns:
        (the number of feeds, this feed's index).
    """
    ctx = current_feed()
    ctx.claims.append(source)
    return ctx.num_feeds, ctx.feed_index


def derive_seed(salt: str, seed: Optional[int] = None) -> int:
    """Returns a deterministic 31-bit seed for one random op of the current feed.

    Different feeds and salts get independent seeds; the same (seed, feed, salt) always gets the
    same one.

    Args:
        salt: Distinguishes ops of one feed (e.g. "tfds_dataset/shuffle/<name>").
        seed: An explicit seed; defaults to the feed context's seed.

    Returns:
        An int in [0, 2**31).
    """
    ctx = current_feed()
    base = ctx.seed if seed is None else seed
    key = f"{base}/{ctx.num_feeds}/{ctx.feed_index}/{salt}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little") & 0x7FFFFFFF


def local_feed_indices(*, num_feeds: int, process_index: int, process_count: int) -> range:
    """Returns the feeds process `process_index` of `process_count` runs.

    Args:
        num_feeds: The total number of feeds.
        process_index: This process.
        process_count: The number of processes.

    Returns:
        A contiguous range of feed indices.

    Raises:
        ValueError: If `num_feeds` is not a positive multiple of `process_count`.
    """
    if num_feeds <= 0 or num_feeds % process_count != 0:
        raise ValueError(
            f"input.num_feeds ({num_feeds}) must be a positive multiple of the process count "
            f"({process_count}); each process runs num_feeds / process_count feeds"
        )
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} out of range [0, {process_count})")
    per_process = num_feeds // process_count
    return range(process_index * per_process, (process_index + 1) * per_process)
