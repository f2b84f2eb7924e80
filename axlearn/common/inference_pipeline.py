"""Helpers of AXLearn's inference pipeline: string tensors kept out of the device computation.

Input batches from a `tf.data` input may hold TF string tensors (e.g. example ids), which
cannot go to the device. `pop_string_tensors` splits a batch into its non-string part and its
string part, and `merge_with_string_tensors` puts them back together (e.g. to write records of
the inputs next to the outputs with `inference_output.InputOutputRecordWriter`).

AXLearn's `InferencePipeline` (input -> `InferenceRunner.create_method_runner` -> output writer)
is not here: our `InferenceRunner` has no method-runner API.
"""

from typing import Any

from axlearn.common.utils import NestedTensor


def _is_string_tensor(x: Any) -> bool:
    """Whether `x` is a TF tensor of dtype string (TF is not imported for the check)."""
    return (
        type(x).__module__.startswith("tensorflow")
        and getattr(getattr(x, "dtype", None), "name", None) == "string"
    )


def _split(batch: NestedTensor, *, strings: bool) -> NestedTensor:
    """The dict tree of `batch` keeping only the string (or only the other) leaves."""
    if not isinstance(batch, dict):
        return batch if _is_string_tensor(batch) == strings else None
    out = {}
    for key, value in batch.items():
        if isinstance(value, dict):
            sub = _split(value, strings=strings)
            if sub:
                out[key] = sub
        elif _is_string_tensor(value) == strings:
            out[key] = value
    return out


def pop_string_tensors(batch: NestedTensor) -> tuple[NestedTensor, NestedTensor]:
    """Splits a (dict tree) batch into its non-string leaves and its TF string tensors.

    Args:
        batch: A dict tree whose leaves are arrays or TF tensors.

    Returns:
        (the batch without string tensors, a dict tree of only the string tensors); subtrees
        left empty are dropped from each.
    """
    return _split(batch, strings=False), _split(batch, strings=True)


def merge_with_string_tensors(t1: NestedTensor, t2: NestedTensor) -> NestedTensor:
    """Adds the string tensors `t2` back into `t1` (the inverse of `pop_string_tensors`).

    `t1` and `t2` must have disjoint leaf paths; `t1` is updated in place.

    Args:
        t1: A dict tree without string tensors.
        t2: A dict tree of string tensors.

    Returns:
        `t1` with the leaves of `t2` added.

    Raises:
        ValueError: If either is a leaf (a path holds a leaf in one and a value in the other).
    """
    if not isinstance(t1, dict) or not isinstance(t2, dict):
        raise ValueError(
            f"Expect args to be non-leaf nodes. Got t1={t1}, t2={t2}: a path holds a leaf in one "
            "tree and a value in the other."
        )
    for key, value in t2.items():
        t1[key] = merge_with_string_tensors(t1[key], value) if key in t1 else value
    return t1
