"""Tests axlearn.common.input_state_check against zlib and hand-built files."""

import os
import zlib

import pytest

from axlearn.common import input_state_check
from axlearn.common.input_iterator import InputStateError
from axlearn.common.input_state_check import (
    check_sources,
    file_fingerprint,
    parse_state_json,
    require_int,
)


def test_small_file_fingerprint_is_crc_of_all(tmp_path):
    path = tmp_path / "f"
    data = bytes(range(256)) * 100
    path.write_bytes(data)
    fp = file_fingerprint(str(path))
    assert fp["size"] == len(data) and fp["crc32"] == f"{zlib.crc32(data):08x}"
    assert fp["mtime_ns"] == os.stat(path).st_mtime_ns


def test_large_file_fingerprint_reads_head_tail_and_blocks(tmp_path):
    path = tmp_path / "f"
    size = 10 * 2**20
    data = bytearray(os.urandom(size))
    path.write_bytes(bytes(data))
    ranges = input_state_check._sample_ranges(size)
    expected = 0
    for offset, length in ranges:
        expected = zlib.crc32(bytes(data[offset : offset + length]), expected)
    fp = file_fingerprint(str(path))
    assert fp["crc32"] == f"{expected:08x}"
    # 2 x 64 KiB + 16 x 4 KiB read, sorted and inside the file, the last block ending at the tail.
    assert sum(length for _, length in ranges) == 2 * 65536 + 16 * 4096
    assert ranges == sorted(ranges) and ranges[-1] == (size - 65536, 65536)
    # A byte changed in the head, the tail or a sampled block changes it.
    for offset in (10, size - 10, ranges[5][0] + 7):
        changed = bytearray(data)
        changed[offset] ^= 1
        path.write_bytes(bytes(changed))
        assert file_fingerprint(str(path))["crc32"] != fp["crc32"]


def test_check_sources(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    saved = [file_fingerprint(str(path))]
    check_sources(saved, [file_fingerprint(str(path))], what="S", fix="FIX")
    check_sources(None, [], what="S", fix="FIX")  # An older state: unchecked.
    path.write_bytes(b"abd")
    with pytest.raises(InputStateError, match=r"S: source file .*f changed .*size 3 -> 3.*FIX"):
        check_sources(saved, [file_fingerprint(str(path))], what="S", fix="FIX")
    with pytest.raises(InputStateError, match="saved reading 1 source files but .* reads 0"):
        check_sources(saved, [], what="S", fix="FIX")
    with pytest.raises(InputStateError, match="'sources' must be a list of objects, got str"):
        check_sources("x", [], what="S", fix="FIX")


def test_unreadable_sources(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputStateError, match="fifo: not a regular file"):
        file_fingerprint(str(tmp_path / "fifo"))
    with pytest.raises(InputStateError, match="missing: cannot be opened"):
        file_fingerprint(str(tmp_path / "missing"))
    (tmp_path / "real").write_bytes(b"data")
    os.symlink(tmp_path / "real", tmp_path / "link")  # Data sets may be linked: followed.
    assert file_fingerprint(str(tmp_path / "link"))["size"] == 4
    assert input_state_check.source_fingerprints(["gs://b/f"]) == [{"path": "gs://b/f"}]


def test_parse_and_require():
    assert parse_state_json(b'{"a": "[[[["}', what="S", fix="F") == {"a": "[[[["}
    for data, match in [
        (b"[" * 65 + b"]" * 65, "nests deeper than 64"),
        (b"\xff", "not UTF-8 .byte 0."),
        (b"{", "not valid JSON at line 1"),
        (b"1" * 5000, "not valid JSON"),
        (b" " * 100, "not valid JSON"),
    ]:
        with pytest.raises(InputStateError, match=match):
            parse_state_json(data, what="S", fix="F")
    with pytest.raises(InputStateError, match="100 bytes, more than the 10"):
        parse_state_json(b" " * 100, what="S", fix="F", max_bytes=10)
    assert require_int({"n": 3}, "n", what="S", fix="F") == 3
    assert require_int({"n": None}, "n", what="S", fix="F", allow_none=True) is None
    for state, match in [
        ({}, "has no field 'n'"),
        ({"n": None}, "must be an integer, got NoneType"),
        ({"n": 1.5}, "must be an integer, got float"),
        ({"n": False}, "got bool"),
        ({"n": 2**63}, "outside"),
        ({"n": 0}, "0, outside .1,"),
    ]:
        with pytest.raises(InputStateError, match=match):
            require_int(state, "n", what="S", fix="F", minimum=1)
