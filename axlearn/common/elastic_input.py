"""Input iterators for elastic training (AXLearn's `elastic_input`).

When slices are lost, the remaining processes also read the feeds of the lost ones.
`ElasticDatasetIterator` pairs a process's own (primary) iterator with an optional elastic
iterator over a lost feed, and says under which process ids each is checkpointed: the primary
under the process's own id, the elastic iterator (by the process marked
`is_primary_for_checkpoint`) under each id in `elastic_process_ids`, so a later run with all
processes resumes every feed where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Optional


class ElasticDatasetIterator:
    """Iterates a primary iterator and, in elastic mode, an extra one over a lost feed.

    `next()` returns the primary batch, or (primary batch, elastic batch) when an elastic
    iterator is set.
    """

    def __init__(
        self,
        *,
        primary_iterator: Iterator,
        elastic_iterator: Optional[Iterator],
        elastic_process_ids: Sequence[int],
        is_primary_for_checkpoint: bool,
    ):
        if elastic_iterator is None and elastic_process_ids:
            raise ValueError(
                f"ElasticDatasetIterator: elastic_process_ids={list(elastic_process_ids)} "
                "needs an elastic_iterator"
            )
        self.primary_iterator = primary_iterator
        self.elastic_iterator = elastic_iterator
        self.elastic_process_ids = list(elastic_process_ids)
        self.is_primary_for_checkpoint = is_primary_for_checkpoint

    def __iter__(self) -> ElasticDatasetIterator:
        return self

    def __next__(self) -> Any:
        primary = next(self.primary_iterator)
        if self.elastic_iterator is None:
            return primary
        return primary, next(self.elastic_iterator)

    def savables(self, process_index: int) -> dict[int, Iterator]:
        """{process id: iterator} to checkpoint from process `process_index`.

        Args:
            process_index: This process's index.

        Returns:
            The primary iterator under `process_index`, plus the elastic iterator under each
            elastic process id if this process is primary for checkpointing.
        """
        out = {process_index: self.primary_iterator}
        if self.is_primary_for_checkpoint and self.elastic_iterator is not None:
            for pid in self.elastic_process_ids:
                out[pid] = self.elastic_iterator
        return out
