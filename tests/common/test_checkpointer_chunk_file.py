"""Tests for axlearn/common/checkpointer/chunk_file.py: exact bytes with and without O_DIRECT."""

from __future__ import annotations

import errno
import os
import zlib

import numpy as np
import pytest

from axlearn.common.checkpointer import chunk_file
from axlearn.common.file_access import resolve as fa_resolve

# Empty, one byte, exactly one block, one block and a byte, several bounce buffers and a tail.
SIZES = [0, 1, 4096, 4097, 3 * (8 << 20) + 123]


@pytest.mark.parametrize("size", SIZES)
def test_writes_exact_bytes(tmp_path, size):
    data = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8)
    path = str(tmp_path / "chunk")
    with open(path, "wb") as f:  # A longer file is truncated.
        f.write(b"x" * (size + 9000))
    written = chunk_file.write_file_durably(path, data)
    with open(path, "rb") as f:
        assert f.read() == data.tobytes()
    assert written.crc32 == f"{zlib.crc32(data.tobytes()):08x}"


def test_writes_any_array_in_c_order(tmp_path):
    data = np.arange(24, dtype=np.float32).reshape(4, 6).T  # Not C-contiguous.
    path = str(tmp_path / "chunk")
    chunk_file.write_file_durably(path, data)
    np.testing.assert_array_equal(np.fromfile(path, np.float32).reshape(6, 4), data)


def test_direct_on_this_disk_and_fallback_where_refused(tmp_path, monkeypatch):
    """ext4 (this machine's disk) takes O_DIRECT; a filesystem that refuses it (EINVAL at open,
    as older tmpfs or some network filesystems do) gets the same bytes through the page cache."""
    data = np.random.default_rng(0).integers(0, 256, size=10_000, dtype=np.uint8)
    direct = chunk_file.write_file_durably(str(tmp_path / "direct"), data).direct
    real_open = os.open

    # The component-by-component resolver opens with os.open (openat2 is a raw syscall).
    monkeypatch.setitem(fa_resolve._openat2_state, "fn", None)
    monkeypatch.setitem(fa_resolve._openat2_state, "checked", True)

    def open_without_direct(path, flags, *args, **kwargs):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_without_direct)
    buffered = chunk_file.write_file_durably(str(tmp_path / "buffered"), data)
    assert buffered.direct is False
    assert buffered.crc32 == f"{zlib.crc32(data.tobytes()):08x}"
    for name in ("direct", "buffered"):
        with open(tmp_path / name, "rb") as f:
            assert f.read() == data.tobytes()
    print(f"O_DIRECT used on {tmp_path}: {direct}")


@pytest.mark.parametrize("size", SIZES)
def test_reads_exact_bytes_into_page_aligned_buffer(tmp_path, size):
    data = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8)
    path = str(tmp_path / "chunk")
    chunk_file.write_file_durably(path, data)
    read, file_size = chunk_file.read_file(path, size)
    assert file_size == size
    assert read.dtype == np.uint8 and read.flags.c_contiguous and read.flags.writeable
    assert size == 0 or read.ctypes.data % 4096 == 0  # An empty array has no buffer to align.
    np.testing.assert_array_equal(read, data)


@pytest.mark.parametrize("actual", [0, 4095, 4097, 8192])
def test_read_reports_wrong_size_without_data(tmp_path, actual):
    path = str(tmp_path / "chunk")
    chunk_file.write_file_durably(path, np.ones(actual, np.uint8))
    read, file_size = chunk_file.read_file(path, 4096)
    assert file_size == actual and read.size == 0


def test_read_of_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        chunk_file.read_file(str(tmp_path / "missing"), 10)


@pytest.mark.parametrize("refused_at", ["open", "read"])
def test_read_falls_back_to_page_cache_where_direct_is_refused(tmp_path, monkeypatch, refused_at):
    """The same bytes come back when O_DIRECT is refused at open (a filesystem without it) or at
    the first read (e.g. an unaligned transfer)."""
    size = 3 * 4096 + 5
    data = np.random.default_rng(1).integers(0, 256, size=size, dtype=np.uint8)
    path = str(tmp_path / "chunk")
    chunk_file.write_file_durably(path, data)
    direct = getattr(os, "O_DIRECT", 0)
    real_open, real_preadv, direct_fds, flags_seen = os.open, os.preadv, set(), []

    monkeypatch.setitem(fa_resolve._openat2_state, "fn", None)  # Open with os.open.
    monkeypatch.setitem(fa_resolve._openat2_state, "checked", True)

    def fake_open(file, flags, *args, **kwargs):
        if flags & os.O_DIRECTORY:  # The file layer opening the directory: not the file.
            return real_open(file, flags, *args, **kwargs)
        flags_seen.append(flags)
        if refused_at == "open" and flags & direct:
            raise OSError(errno.EINVAL, "Invalid argument", file)
        fd = real_open(file, flags, *args, **kwargs)
        if flags & direct:
            direct_fds.add(fd)
        return fd

    def fake_preadv(fd, buffers, offset):
        if fd in direct_fds:
            direct_fds.discard(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "preadv", fake_preadv)
    read, file_size = chunk_file.read_file(path, size)
    assert file_size == size
    np.testing.assert_array_equal(read, data)
    # The last open was a plain one.
    assert not flags_seen[-1] & direct
    if direct:
        assert flags_seen[0] & direct


def test_read_chunk_views_the_valid_region_of_an_edge_chunk(tmp_path):
    chunk = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)  # Full chunk, padding included.
    path = str(tmp_path / "1.1")
    chunk_file.write_file_durably(path, chunk)
    data = chunk_file.read_chunk(
        path, dtype=np.dtype(np.float32), chunk_shape=(4, 6), extent=(3, 2)
    )
    np.testing.assert_array_equal(data, chunk[:3, :2])
    with pytest.raises(FileNotFoundError):
        chunk_file.read_chunk(
            str(tmp_path / "0.0"), dtype=np.dtype(np.float32), chunk_shape=(4, 6), extent=(4, 6)
        )
    os.truncate(path, 4 * 6 * 4 - 8)
    with pytest.raises(chunk_file.ChunkSizeError, match="88 bytes, expected 96") as e:
        chunk_file.read_chunk(path, dtype=np.dtype(np.float32), chunk_shape=(4, 6), extent=(3, 2))
    assert (e.value.size, e.value.expected) == (88, 96)
