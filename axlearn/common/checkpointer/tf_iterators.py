"""tf.data iterators as checkpoint state: saved as per-process bytes, restored in place.

A state leaf that is a `tf.data.Iterator` is written with `tf.train.Checkpoint` into a temporary
folder whose files are packed into one uncompressed tar archive: that archive is the leaf's
bytes (saved per process, like an input iterator's state). On restore, a target leaf that is a
`tf.data.Iterator` reads its bytes back into that iterator, which is returned in the restored
tree, positioned where the saved one was.

TensorFlow is never imported here: an iterator can only exist if TensorFlow already is.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import tempfile
from typing import Any

import jax

_PREFIX = "iterator"
# Prefix of an iterator saved by AXLearn (`tf.train.Checkpoint(iterator)`, the root object).
AXLEARN_PREFIX = "axlearn_root"


def is_tf_iterator(x: Any) -> bool:
    """Whether `x` is a tf.data iterator (False without importing TensorFlow)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return False
    return isinstance(x, tf.data.Iterator)


def serialize(iterator: Any) -> bytes:
    """Returns the state of a tf.data iterator as bytes (a tar archive of its TF checkpoint).

    Args:
        iterator: The tf.data iterator.

    Returns:
        The bytes.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    with tempfile.TemporaryDirectory() as tmp:
        tf.train.Checkpoint(iterator=iterator).write(os.path.join(tmp, _PREFIX))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name in sorted(os.listdir(tmp)):
                tar.add(os.path.join(tmp, name), arcname=name)
        return buffer.getvalue()


def pack_files(files: dict[str, bytes]) -> bytes:
    """Returns an uncompressed tar archive of `files` ({name: content}), names sorted.

    Args:
        files: The files of one TF checkpoint prefix.

    Returns:
        The archive's bytes (what `restore` reads).
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            tar.addfile(info, io.BytesIO(files[name]))
    return buffer.getvalue()


def restore(iterator: Any, data: bytes) -> Any:
    """Restores `serialize` bytes into `iterator` (in place) and returns it.

    Args:
        iterator: A tf.data iterator over the same pipeline as the saved one.
        data: Bytes from `serialize`.

    Returns:
        `iterator`.

    Raises:
        ValueError: If `data` is not an iterator archive.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    with tempfile.TemporaryDirectory() as tmp:
        try:
            with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r") as tar:
                for member in tar.getmembers():
                    if not member.isfile() or os.path.basename(member.name) != member.name:
                        raise ValueError(f"unexpected archive member {member.name!r}")
                tar.extractall(tmp, filter="data")
        except tarfile.TarError as e:
            raise ValueError(
                f"The saved state ({len(data)} bytes) is not a tf.data iterator checkpoint: {e}"
            ) from e
        if os.path.exists(os.path.join(tmp, f"{AXLEARN_PREFIX}.index")):
            # AXLearn's layout: the iterator is the checkpoint's root object.
            tf.train.Checkpoint(iterator).read(os.path.join(tmp, AXLEARN_PREFIX)).assert_consumed()
        else:
            checkpoint = tf.train.Checkpoint(iterator=iterator)
            checkpoint.read(os.path.join(tmp, _PREFIX)).assert_consumed()
    return iterator


def to_saved_state(state: Any) -> Any:
    """`state` with every tf.data iterator leaf replaced by its `serialize` bytes."""
    return jax.tree.map(lambda x: serialize(x) if is_tf_iterator(x) else x, state)


def to_restore_target(state: Any) -> Any:
    """The restore target of `state`: tf.data iterator leaves become bytes leaves."""
    return jax.tree.map(lambda x: b"" if is_tf_iterator(x) else x, state)


def restore_iterators(target: Any, restored: Any) -> Any:
    """Restores each tf.data iterator of `target` from its bytes in `restored`.

    Args:
        target: The restore target given by the caller (may hold tf.data iterators).
        restored: The restored tree of `to_restore_target(target)`.

    Returns:
        `restored` with the iterators (now positioned) in place of their bytes.
    """
    if not any(is_tf_iterator(x) for x in jax.tree.leaves(target)):
        return restored
    return jax.tree.map(lambda t, r: restore(t, r) if is_tf_iterator(t) else r, target, restored)
