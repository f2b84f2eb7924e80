"""Reading AXLearn's own checkpoint layout (as Apple's AXLearn `Checkpointer` writes it).

```
<dir>/step_00000006/
    index                       one line of JSON, a list of [path, value] pairs, written last
    gda/<leaf path>/            zarr v2 arrays: `.zarray` (zstd or no compressor), chunks
                                `0.0`, `1.0`, ... (a scalar's chunk is `0`)
    tf_<process>/<path>.index, .data-*   a tf.train.Checkpoint of each tf.data iterator
    python_<process>/<path>     msgpack of a Python savable (not restored here)
```

An index in this layout carries no checksums and no version. `layout.read_index_file` turns it
into the index dict of our own layout, with `"layout": "axlearn"` (leaves from `parse_pairs`), so
the rest of the checkpointer (restore, verify, list, GC) handles both. Every array's
`.zarray` is read (bounded, through `file_access`) and checked against the index here: dtype,
shape, a zarr v2 C-order array with no filters and a zstd or no compressor.

Chunks are read through `file_access` (below the step directory's descriptor, no link
followed: no window between a check and an open) and decoded in memory by TensorStore's zarr
driver over a `memory` key-value store (`decode_chunk`): TensorStore never opens a path.
`axlearn_layout_write` writes this layout.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

import numpy as np

from axlearn.common import file_access

# Marks an index parsed from AXLearn's layout.
LAYOUT_NAME = "axlearn"
# Largest `.zarray` read (AXLearn's are ~200 bytes).
MAX_ZARRAY_BYTES = 1 << 16
# Deepest nesting of a `.zarray` (its own is 3).
MAX_ZARRAY_DEPTH = 8
# The most bytes of one tf.data iterator checkpoint file read back.
MAX_TF_FILE_BYTES = 1 << 30
# How AXLearn writes a tensor's shape: a Python tuple, `()` for a scalar.
_SHAPE_RE = re.compile(r"^\((\s*\d+\s*(,\s*\d+\s*)*,?)?\)$")
# The class names of the tf.data iterators AXLearn saves with tf.train.Checkpoint.
_TF_ITERATOR_RE = re.compile(r"^<class 'tensorflow\.[\w.]*(OwnedIterator|Iterator\w*)'>$")
_CLASS_RE = re.compile(r"^<class '[\w.]+'>$")
# How a bytes leaf of ours appears in the list `index` of a step of ours (format version 2),
# whose `manifest.json` describes it.
OUR_BYTES_LEAF_ENTRY = "<class 'axlearn.checkpoint.BytesLeaf'>"
# Names of our index's leaf kinds and array folder (`layout`'s, which imports this module).
KIND_ARRAY = "array"
KIND_VALUE = "value"
KIND_BYTES = "bytes"
ARRAYS_DIR = "gda"
# Compressors our reader decodes.
_COMPRESSORS = (None, "zstd")


class AXLearnIndexError(ValueError):
    """An AXLearn-layout index, or a `.zarray` it names, breaks a rule of that layout."""


def is_axlearn_index(value: Any) -> bool:
    """Whether a parsed `index` JSON value is AXLearn's (a list of pairs, ours is a dict)."""
    return isinstance(value, list)


def parse_shape(text: Any, *, shown: str, path: str) -> list[int]:
    """Parses AXLearn's shape string, e.g. `"(32, 8)"`, `"(8,)"`, `"()"`.

    Args:
        text: The value of the index's `shape` field.
        shown: The index file (for the error).
        path: The leaf path (for the error).

    Returns:
        The dimensions.

    Raises:
        AXLearnIndexError: If it is not a tuple of non-negative ints.
    """
    if not isinstance(text, str) or not _SHAPE_RE.match(text):
        raise AXLearnIndexError(
            f"{shown}: leaf {path!r:.200} has shape {text!r:.60}; AXLearn's index writes a "
            'Python tuple of ints such as "(32, 8)" or "()"'
        )
    return [int(x) for x in text[1:-1].split(",") if x.strip()]


def _zarray_dtype(value: Any) -> Optional[np.dtype]:
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

    if not isinstance(value, str):
        return None
    try:
        return np.dtype(jnp.dtype(value))
    except TypeError:
        return None


def _check_zarray(meta: Any, *, shown: str, shape: list[int], dtype: np.dtype) -> list[int]:
    """Checks a `.zarray` against the index entry; returns its chunk shape."""

    def bad(rule: str) -> AXLearnIndexError:
        return AXLearnIndexError(f"{shown}: {rule}")

    if not isinstance(meta, dict):
        raise bad("is not a JSON object (a zarr v2 .zarray)")
    if meta.get("zarr_format") != 2:
        raise bad(f"zarr_format is {meta.get('zarr_format')!r:.30}, expected 2")
    if meta.get("shape") != shape:
        raise bad(
            f"shape {meta.get('shape')!r:.80} disagrees with the index's {shape}: the array and "
            "the index come from different saves; restore another step"
        )
    zdtype = _zarray_dtype(meta.get("dtype"))
    if zdtype is None or zdtype != dtype:
        raise bad(f"dtype {meta.get('dtype')!r:.40} disagrees with the index's {dtype.name}")
    chunks = meta.get("chunks")
    if (
        not isinstance(chunks, list)
        or len(chunks) != len(shape)
        or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in chunks)
    ):
        raise bad(f"chunks {chunks!r:.80} is not one positive int per dimension of {shape}")
    compressor = meta.get("compressor")
    name = compressor.get("id") if isinstance(compressor, dict) else compressor
    if name not in _COMPRESSORS:
        raise bad(f"compressor {compressor!r:.80} is not zstd or none (the ones read here)")
    if meta.get("filters") not in (None, []):
        raise bad(f"filters {meta.get('filters')!r:.80} are not supported (expected null)")
    if meta.get("order", "C") != "C":
        raise bad(f"order {meta.get('order')!r:.10} is not C")
    if meta.get("dimension_separator", ".") != ".":
        raise bad(f"dimension_separator {meta.get('dimension_separator')!r:.10} is not '.'")
    return chunks


def _tf_processes(root: file_access.RunDir, path: str) -> dict[str, dict]:
    """{process: entry} of every `tf_<process>/<path>.index` in the step directory."""
    result = {}
    for name in file_access.listdir(root):
        match = re.match(r"^tf_(\d+)$", name)
        if match and file_access.is_regular(root, f"{name}/{path}.index"):
            result[str(int(match.group(1)))] = {"file": f"{name}/{path}", "axlearn_tf": True}
    return result


def parse_pairs(value: list, *, root: file_access.RunDir, shown: str) -> tuple[int, list[dict]]:
    """Parses AXLearn's list `index` into (step, leaves in our index's form).

    Args:
        value: The parsed JSON of the index (a list).
        root: The step directory, open (its `.zarray` files are read below it).
        shown: The index file's path (for errors).

    Returns:
        (step, leaves): arrays with `chunk_shape` from their `.zarray`, `compressor`, and
        `checksum` None; tf.data iterators as per-process bytes leaves; other values as value
        leaves.

    Raises:
        AXLearnIndexError: Naming the file and the rule broken.
    """
    step = None
    leaves = []
    seen = set()
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise AXLearnIndexError(
                f"{shown}: entry {item!r:.100} is not a [path, value] pair (AXLearn's index "
                "is a list of them)"
            )
        path, entry = item
        if path in seen:
            raise AXLearnIndexError(f"{shown}: leaf {path!r:.200} is listed twice")
        seen.add(path)
        if path == "step":
            if not isinstance(entry, int) or isinstance(entry, bool):
                raise AXLearnIndexError(f"{shown}: step {entry!r:.40} is not an int")
            step = entry
            continue
        if not path or any(not p or p.startswith(".") or "\0" in p for p in path.split("/")):
            raise AXLearnIndexError(
                f"{shown}: leaf path {path!r:.200} cannot name a file (empty or dot-leading part)"
            )
        leaves.append(_parse_leaf(root, path, entry, step_dir=root.path, shown=shown))
    if step is None:
        raise AXLearnIndexError(f'{shown}: has no ["step", N] entry (AXLearn writes it first)')
    return step, leaves


def _parse_leaf(root: file_access.RunDir, path: str, entry: Any, *, step_dir: str, shown: str):
    if isinstance(entry, dict) and set(entry) == {"dtype", "shape"}:
        shape = parse_shape(entry["shape"], shown=shown, path=path)
        dtype = _zarray_dtype(entry["dtype"])
        if dtype is None:
            raise AXLearnIndexError(
                f"{shown}: leaf {path!r:.200} has dtype {entry['dtype']!r:.40}, not a dtype name"
            )
        zarray_rel = f"{ARRAYS_DIR}/{path}/.zarray"
        zarray_shown = f"{step_dir}/{zarray_rel}"
        try:
            meta = file_access.read_json(
                root, zarray_rel, max_bytes=MAX_ZARRAY_BYTES, max_depth=MAX_ZARRAY_DEPTH
            )
        except file_access.FileAccessError as e:
            raise AXLearnIndexError(
                f"{zarray_shown} (leaf {path!r:.200}): {e.rule}; every array the index names "
                "has a .zarray"
            ) from e
        chunks = _check_zarray(meta, shown=zarray_shown, shape=shape, dtype=dtype)
        compressor = meta.get("compressor")
        return dict(
            path=path,
            kind=KIND_ARRAY,
            dtype=dtype.name,
            shape=shape,
            chunk_shape=chunks,
            file=f"{ARRAYS_DIR}/{path}",
            checksum=None,
            compressor=compressor.get("id") if isinstance(compressor, dict) else compressor,
        )
    if entry == OUR_BYTES_LEAF_ENTRY:
        raise AXLearnIndexError(
            f"{shown}: leaf {path!r:.200} is a bytes leaf of this checkpointer, described by "
            f"manifest.json beside the index, which is missing; restore the step's "
            "manifest.json (or a target without this leaf)"
        )
    if isinstance(entry, str) and _CLASS_RE.match(entry):
        if not _TF_ITERATOR_RE.match(entry):
            raise AXLearnIndexError(
                f"{shown}: leaf {path!r:.200} is a savable of class {entry[8:-2]!r:.100}, which "
                "this checkpointer cannot restore (it restores tf.data iterators); restore with "
                "a target without this leaf"
            )
        per_process = _tf_processes(root, path)
        if not per_process:
            raise AXLearnIndexError(
                f"{shown}: leaf {path!r:.200} is a tf.data iterator but no tf_<process>/"
                f"{path}.index exists in {step_dir}"
            )
        return dict(path=path, kind=KIND_BYTES, per_process=per_process)
    if isinstance(entry, (dict, list)):
        raise AXLearnIndexError(
            f"{shown}: leaf {path!r:.200} has value {entry!r:.80}, neither a tensor "
            '{"dtype", "shape"} nor a savable\'s class'
        )
    return dict(path=path, kind=KIND_VALUE, value=entry)


def max_chunk_file_bytes(raw_bytes: int) -> int:
    """The most bytes a zstd chunk of `raw_bytes` may take (zstd's worst-case bound)."""
    return raw_bytes + (raw_bytes >> 8) + 1024


def decode_chunk(
    data: bytes, *, compressor: Optional[str], dtype: np.dtype, chunk_shape: tuple[int, ...]
) -> np.ndarray:
    """Decodes one zarr v2 chunk file's bytes into an array of `chunk_shape`.

    TensorStore's zarr driver decodes it from an in-memory key-value store: no path is opened.

    Args:
        data: The chunk file's bytes.
        compressor: "zstd" or None.
        dtype: The array's dtype.
        chunk_shape: The chunk's full shape (edge chunks are stored padded to it).

    Returns:
        The chunk.

    Raises:
        ValueError: If the bytes do not decode to a chunk of that shape and dtype.
    """
    import tensorstore as ts  # pylint: disable=import-outside-toplevel

    if compressor is None:
        expected = int(np.prod(chunk_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if len(data) != expected:
            raise ValueError(f"{len(data)} bytes, expected {expected}")
        return np.frombuffer(data, dtype=dtype).reshape(chunk_shape).copy()
    shape = list(chunk_shape)
    meta = {
        "zarr_format": 2,
        "shape": shape,
        "chunks": shape,
        "dtype": dtype.name if dtype.str[1] == "V" else dtype.str,  # e.g. "bfloat16", "<f4".
        "compressor": {"id": compressor, "level": 1},
        "fill_value": None,
        "filters": None,
        "order": "C",
        "dimension_separator": ".",
    }
    context = ts.Context()
    store = ts.KvStore.open({"driver": "memory"}, context=context).result()
    store[".zarray"] = json.dumps(meta).encode()
    store[".".join("0" for _ in shape) or "0"] = data
    try:
        array = ts.open(
            {"driver": "zarr", "kvstore": {"driver": "memory"}}, context=context, open=True
        ).result()
        return np.asarray(array.read().result())
    except ValueError as e:
        raise ValueError(f"does not decode as a {compressor} zarr chunk: {e}") from e
