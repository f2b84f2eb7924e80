"""Tests for axlearn/common/checkpointer/chunk_file.py: exact bytes with and without O_DIRECT."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from axlearn.common.checkpointer import chunk_file

# Empty, one byte, exactly one block, one block and a byte, several bounce buffers and a tail.
SIZES = [0, 1, 4096, 4097, 3 * (8 << 20) + 123]


@pytest.mark.parametrize("size", SIZES)
def test_writes_exact_bytes(tmp_path, size):
    data = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8)
    path = str(tmp_path / "chunk")
    with open(path, "wb") as f:  # A longer file is truncated.
        f.write(b"x" * (size + 9000))
    chunk_file.write_file_durably(path, data)
    with open(path, "rb") as f:
        assert f.read() == data.tobytes()


def test_writes_any_array_in_c_order(tmp_path):
    data = np.arange(24, dtype=np.float32).reshape(4, 6).T  # Not C-contiguous.
    path = str(tmp_path / "chunk")
    chunk_file.write_file_durably(path, data)
    np.testing.assert_array_equal(np.fromfile(path, np.float32).reshape(6, 4), data)


def test_direct_on_this_disk_and_fallback_where_refused(tmp_path, monkeypatch):
    """ext4 (this machine's disk) takes O_DIRECT; a filesystem that refuses it (EINVAL at open,
    as older tmpfs or some network filesystems do) gets the same bytes through the page cache."""
    data = np.random.default_rng(0).integers(0, 256, size=10_000, dtype=np.uint8)
    direct = chunk_file.write_file_durably(str(tmp_path / "direct"), data)
    real_open = os.open

    def open_without_direct(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_without_direct)
    assert chunk_file.write_file_durably(str(tmp_path / "buffered"), data) is False
    for name in ("direct", "buffered"):
        with open(tmp_path / name, "rb") as f:
            assert f.read() == data.tobytes()
    print(f"O_DIRECT used on {tmp_path}: {direct}")
