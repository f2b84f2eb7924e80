"""Tests of axlearn.common.file_system on local paths."""

import os

import pytest

from axlearn.common import file_system as fs


def test_local_operations(tmp_path):
    root = str(tmp_path)
    fs.makedirs(os.path.join(root, "a", "b"))
    with fs.open(os.path.join(root, "a", "f.txt"), "w") as f:
        f.write("hello")
    assert fs.readfile(os.path.join(root, "a", "f.txt")) == "hello"
    assert fs.listdir(os.path.join(root, "a")) == ["b", "f.txt"]
    assert fs.isdir(os.path.join(root, "a", "b")) and fs.exists(os.path.join(root, "a", "f.txt"))
    assert fs.glob(os.path.join(root, "a", "*.txt")) == [os.path.join(root, "a", "f.txt")]
    fs.copy(os.path.join(root, "a", "f.txt"), os.path.join(root, "g.txt"))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        fs.copy(os.path.join(root, "a", "f.txt"), os.path.join(root, "g.txt"))
    fs.rename(os.path.join(root, "g.txt"), os.path.join(root, "h.txt"))
    assert not fs.exists(os.path.join(root, "g.txt"))
    fs.remove(os.path.join(root, "h.txt"))
    fs.rmtree(os.path.join(root, "a"))
    fs.rmtree(os.path.join(root, "missing"))  # No error.
    assert fs.listdir(root) == []
