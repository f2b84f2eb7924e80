"""A source reading a registered seqio Task or Mixture (this feed's shard of it).

Tasks and mixtures must be registered (`seqio.TaskRegistry.add`, `seqio.MixtureRegistry.add`)
before the source is built; `modules_to_import` names modules whose import registers them, so a
config alone is enough. A mixture samples its tasks with the registered rates, seeded from the
Input's seed.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from axlearn.common.input_feed import claim_shard, derive_seed

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from axlearn.common.input_tf_data import BuildDatasetFn


def seqio_source(
    mixture_or_task_name: str,
    *,
    split: str,
    is_training: bool,
    task_feature_lengths: Optional[dict[str, int]] = None,
    train_shuffle: bool = True,
    use_cached: bool = False,
    num_epochs: Optional[int] = None,
    seed: Optional[int] = None,
    modules_to_import: Sequence[str] = (),
) -> BuildDatasetFn:
    """Returns a source of the examples of a seqio Task or Mixture.

    Args:
        mixture_or_task_name: The registered name.
        split: The split.
        is_training: Whether for training (shuffled when `train_shuffle`, repeated forever).
        task_feature_lengths: seqio's `sequence_length` (feature name -> max length), passed to
            the task's preprocessors.
        train_shuffle: Whether to shuffle when training.
        use_cached: Whether to read seqio's offline cache.
        num_epochs: Epochs to read; None: forever when training, once otherwise.
        seed: Seed of shuffling and mixing; None: the Input's seed.
        modules_to_import: Modules imported first (they register the task or mixture).

    Returns:
        A BuildDatasetFn.
    """
    for module in modules_to_import:
        importlib.import_module(module)

    def fn() -> tf.data.Dataset:
        import seqio  # pylint: disable=import-outside-toplevel

        try:
            provider = seqio.get_mixture_or_task(mixture_or_task_name)
        except ValueError as e:
            raise ValueError(
                f"seqio_source: {mixture_or_task_name!r} is not a registered Task or Mixture "
                f"(register it, or list its module in modules_to_import): {e}"
            ) from e
        num_shards, shard_index = claim_shard(f"seqio_source({mixture_or_task_name})")
        shard_info = (
            seqio.ShardInfo(index=shard_index, num_shards=num_shards) if num_shards > 1 else None
        )
        epochs = num_epochs if num_epochs is not None else (None if is_training else 1)
        return provider.get_dataset(
            sequence_length=task_feature_lengths,
            split=split,
            use_cached=use_cached,
            shuffle=is_training and train_shuffle,
            seed=derive_seed(f"seqio_source/{mixture_or_task_name}", seed),
            shard_info=shard_info,
            num_epochs=epochs,
        )

    return fn
