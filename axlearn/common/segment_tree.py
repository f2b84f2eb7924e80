"""Segment trees: range aggregates (sum, min, max) and first-match search over indices.

`SegmentTree` keeps one value per index in `[0, max_index]` in a complete binary tree stored as
an array (node `i` has children `2i` and `2i + 1`; the leaves start at `tree_size`), so that an
update, a range aggregate and a "first index whose value satisfies a predicate" search each take
O(log n) steps. `BestFitSegmentTree` uses a max tree over capacities for best-fit bin packing:
it finds the smallest remaining capacity that fits an item.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Optional, TypeVar

import numpy as np

T = TypeVar("T")


def _dtype_for(value: Any) -> Any:
    """The storage dtype for values like `value` (bool is checked before int: it is an int)."""
    if isinstance(value, (bool, np.bool_)):
        return np.bool_
    if isinstance(value, (int, np.integer)):
        return np.int32
    if isinstance(value, (float, np.floating)):
        return np.float64
    return object


class SegmentTree(Generic[T]):
    """A segment tree over indices `0..max_index` with an associative `operation`.

    `default_value` must be the identity of `operation` (0 for sum, -inf for max, inf for min;
    0 for max over non-negative values): empty ranges and unset indices hold it.
    """

    def __init__(
        self,
        max_index: int,
        operation: Callable[[T, T], T],
        default_value: T,
        dtype: Optional[np.dtype] = None,
    ) -> None:
        """Creates a tree whose values are all `default_value`.

        Args:
            max_index: The largest index (inclusive); the tree holds `max_index + 1` values.
            operation: The associative binary operation (e.g. `max`, `min`, addition).
            default_value: The identity of `operation`; the initial value of every index.
            dtype: The NumPy storage dtype; inferred from `default_value` when None.

        Raises:
            ValueError: If max_index is negative.
        """
        if max_index < 0:
            raise ValueError(f"max_index must be >= 0, got {max_index}")
        self.max_index = max_index
        self.size = max_index + 1
        self.operation = operation
        self.default_value = default_value
        # The number of leaves: the smallest power of two >= size.
        self.tree_size = 1 << (self.size - 1).bit_length()
        self.dtype = _dtype_for(default_value) if dtype is None else dtype
        self.tree = np.full(2 * self.tree_size, default_value, dtype=self.dtype)

    def _check_value(self, value: T) -> None:
        """Rejects negative values in a max tree whose default (identity) is non-negative."""
        default = self.default_value
        if (
            self.operation is max
            and isinstance(default, (int, float))
            and default >= 0
            and isinstance(value, (int, float))
            and value < 0
        ):
            raise ValueError(
                f"Negative value {value} not supported for max operations with "
                f"default_value={default}: the default is then not the identity of max and "
                "range queries would be wrong. Use default_value=float('-inf') for negative values."
            )

    def update(self, index: int, value: T) -> None:
        """Sets the value at `index` and recomputes the aggregates above it.

        Args:
            index: In `[0, max_index]`.
            value: The new value.

        Raises:
            IndexError: If index is out of range.
            ValueError: If value is negative in a max tree with a non-negative default.
        """
        if not 0 <= index < self.size:
            raise IndexError(f"Index {index} out of bounds for size {self.size}")
        self._check_value(value)
        node = self.tree_size + index
        self.tree[node] = value
        node >>= 1
        while node >= 1:
            self.tree[node] = self.operation(self.tree[2 * node], self.tree[2 * node + 1])
            node >>= 1

    def query_range(self, left: int, right: int) -> T:
        """Returns the aggregate of the values at `left..right` (inclusive).

        Args:
            left: The first index.
            right: The last index.

        Returns:
            The aggregate; `default_value` if the range is empty or out of bounds.
        """
        if left > right or left < 0 or right >= self.size:
            return self.default_value
        # Bottom-up: the left and right results are kept apart (operation need not commute).
        lo, hi = left + self.tree_size, right + self.tree_size + 1
        left_acc, right_acc = self.default_value, self.default_value
        while lo < hi:
            if lo & 1:
                left_acc = self.operation(left_acc, self.tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                right_acc = self.operation(self.tree[hi], right_acc)
            lo >>= 1
            hi >>= 1
        return self.operation(left_acc, right_acc)

    def find_first(self, predicate: Callable[[T], bool], start_index: int = 0) -> int:
        """Returns the smallest index >= `start_index` whose value satisfies `predicate`.

        `predicate` is also applied to aggregates to skip subtrees: it must hold for an aggregate
        whenever it holds for one of its values (e.g. `x >= w` in a max tree).

        Args:
            predicate: The test of a value.
            start_index: The smallest index to consider.

        Returns:
            The index, or -1 if there is none.
        """
        start_index = max(start_index, 0)
        if start_index >= self.size:
            return -1
        found = self._descend(1, 0, self.tree_size - 1, predicate, start_index)
        return found if found < self.size else -1

    def _descend(
        self, node: int, lo: int, hi: int, predicate: Callable[[T], bool], start: int
    ) -> int:
        """The first index in `[max(lo, start), hi]` under `node` satisfying `predicate`."""
        if hi < start or not predicate(self.tree[node]):
            return -1
        if lo == hi:
            return lo
        mid = (lo + hi) // 2
        found = self._descend(2 * node, lo, mid, predicate, start)
        if found != -1:
            return found
        return self._descend(2 * node + 1, mid + 1, hi, predicate, start)

    def get_value(self, index: int) -> T:
        """Returns the value at `index` (`default_value` if out of bounds).

        Args:
            index: The index.

        Returns:
            The value.
        """
        if not 0 <= index < self.size:
            return self.default_value
        return self.tree[self.tree_size + index]


class BestFitSegmentTree:
    """Best-fit bin packing: counts of bins per remaining capacity, in a max segment tree.

    Index `c` of the tree holds `c` while at least one bin has remaining capacity `c`, else 0, so
    the first index >= w holding a value >= w is the smallest capacity that fits an item of
    weight w. It starts with one empty bin of `max_capacity`.
    """

    def __init__(self, max_capacity: int):
        """Creates the tree with one bin of capacity `max_capacity`.

        Args:
            max_capacity: The capacity of a new bin (positive).

        Raises:
            ValueError: If max_capacity is not positive.
        """
        if max_capacity <= 0:
            raise ValueError(f"max_capacity must be positive, got {max_capacity}")
        self.max_capacity = max_capacity
        self.tree: SegmentTree[int] = SegmentTree(
            max_index=max_capacity, operation=max, default_value=0
        )
        self.bins_by_capacity = np.zeros(max_capacity + 1, dtype=np.int32)
        self.add_new_bin(max_capacity)

    def _refresh(self, capacity: int) -> None:
        self.tree.update(capacity, capacity if self.bins_by_capacity[capacity] > 0 else 0)

    def find_best_fit(self, item_weight: int) -> int:
        """Returns the smallest remaining capacity >= `item_weight` among the bins.

        Args:
            item_weight: The item's weight.

        Returns:
            The capacity, or -1 if no bin fits (or the weight is not in `[1, max_capacity]`).
        """
        if not 0 < item_weight <= self.max_capacity:
            return -1
        return self.tree.find_first(lambda c: c >= item_weight, start_index=item_weight)

    def update_capacity(self, old_capacity: int, new_capacity: int) -> None:
        """Moves one bin from `old_capacity` to `new_capacity` (e.g. after adding an item).

        Args:
            old_capacity: The bin's remaining capacity before (ignored if above max_capacity).
            new_capacity: The bin's remaining capacity after (ignored if above max_capacity).
        """
        if old_capacity < 0 or new_capacity < 0:
            return
        if old_capacity <= self.max_capacity:
            self.bins_by_capacity[old_capacity] = max(0, self.bins_by_capacity[old_capacity] - 1)
            self._refresh(old_capacity)
        if new_capacity <= self.max_capacity:
            self.add_new_bin(new_capacity)

    def add_new_bin(self, capacity: int) -> None:
        """Adds a bin with remaining capacity `capacity` (ignored if out of `[0, max_capacity]`).

        Args:
            capacity: The remaining capacity.
        """
        if 0 <= capacity <= self.max_capacity:
            self.bins_by_capacity[capacity] += 1
            self._refresh(capacity)

    def get_max_available_capacity(self) -> int:
        """Returns the largest remaining capacity of any bin (0 if none)."""
        return self.tree.query_range(0, self.max_capacity)

    def get_bin_by_capacity(self) -> np.ndarray:
        """Returns a copy of the bin counts per remaining capacity."""
        return self.bins_by_capacity.copy()

    def get_bin_count_at_capacity(self, capacity: int) -> int:
        """Returns the number of bins with remaining capacity `capacity` (0 if out of range)."""
        if 0 <= capacity <= self.max_capacity:
            return int(self.bins_by_capacity[capacity])
        return 0

    def get_tree_value_at_capacity(self, capacity: int) -> int:
        """Returns the tree's value at `capacity`: `capacity` if a bin has it, else 0."""
        return self.tree.get_value(capacity)
