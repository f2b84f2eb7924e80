"""File-system functions over local paths and cloud URLs (AXLearn's `file_system`).

Local paths use `os`/`shutil`; paths with a scheme (`gs://`, `s3://`, ...) go through
`tf.io.gfile` (TensorFlow is imported only then). Names: `open`, `exists`, `isdir`, `listdir`,
`glob`, `makedirs`, `remove`, `rmtree`, `rename`, `copy`, `readfile`.
"""

from __future__ import annotations

import builtins
import glob as _glob
import os
import shutil
from typing import IO, Any


def _is_remote(path: str) -> bool:
    return "://" in str(path)


def _gfile() -> Any:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf.io.gfile


def open(path: str, mode: str = "r") -> IO:  # pylint: disable=redefined-builtin
    """Opens `path` like the builtin `open` (text unless "b" is in `mode`).

    Args:
        path: A local path or URL.
        mode: "r", "w", "a", "rb", "wb", ...

    Returns:
        A file object (a context manager).
    """
    if _is_remote(path):
        return _gfile().GFile(path, mode)
    return builtins.open(path, mode)  # pylint: disable=unspecified-encoding


def readfile(path: str) -> str:
    """Returns the text of the file at `path`."""
    with open(path) as f:
        return f.read()


def exists(path: str) -> bool:
    """Whether `path` exists (file or directory)."""
    return _gfile().exists(path) if _is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    """Whether `path` is a directory."""
    return _gfile().isdir(path) if _is_remote(path) else os.path.isdir(path)


def listdir(path: str) -> list[str]:
    """The names of the entries in directory `path` (sorted; directories without "/").

    Raises:
        FileNotFoundError: If `path` is not a directory.
    """
    if _is_remote(path):
        names = _gfile().listdir(path)
    else:
        names = os.listdir(path)
    return sorted(name.rstrip("/") for name in names)


def glob(pattern: str) -> list[str]:
    """The paths matching the glob `pattern`, sorted."""
    return sorted(_gfile().glob(pattern) if _is_remote(pattern) else _glob.glob(pattern))


def makedirs(path: str) -> None:
    """Creates directory `path` and its parents (no error if it exists)."""
    if _is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
    """Deletes the file `path`.

    Raises:
        FileNotFoundError: If it does not exist.
    """
    if _is_remote(path):
        _gfile().remove(path)
    else:
        os.remove(path)


def rmtree(path: str) -> None:
    """Deletes the directory `path` recursively (no error if it does not exist)."""
    if _is_remote(path):
        if _gfile().exists(path):
            _gfile().rmtree(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def rename(src: str, dst: str, overwrite: bool = False) -> None:
    """Renames `src` to `dst`.

    Raises:
        FileExistsError: If `dst` exists and `overwrite` is False.
    """
    if not overwrite and exists(dst):
        raise FileExistsError(f"rename: {dst} exists (pass overwrite=True to replace it)")
    if _is_remote(src) or _is_remote(dst):
        _gfile().rename(src, dst, overwrite=overwrite)
    else:
        os.replace(src, dst)


def copy(src: str, dst: str, overwrite: bool = False) -> None:
    """Copies the file `src` to `dst`.

    Raises:
        FileExistsError: If `dst` exists and `overwrite` is False.
    """
    if not overwrite and exists(dst):
        raise FileExistsError(f"copy: {dst} exists (pass overwrite=True to replace it)")
    if _is_remote(src) or _is_remote(dst):
        _gfile().copy(src, dst, overwrite=overwrite)
    else:
        shutil.copyfile(src, dst)
