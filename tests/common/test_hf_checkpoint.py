"""Tests axlearn/common/hf_checkpoint.py's reading of Hugging Face directories: the `weight_map`
never reaches outside the directory, and malformed safetensors files or indexes are one-line
errors naming the file (no traceback from the safetensors library, nothing allocated from a
lying header)."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from axlearn.common.hf_checkpoint import (
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX_FILE,
    HfConversionError,
    load_hf_state_dict,
)
from tests.common.test_path_containment import Sentinel


def _write_index(hf_dir, weight_map) -> None:
    with open(os.path.join(hf_dir, SAFETENSORS_INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def test_sharded_directory_reads_and_hf_cache_links_are_followed(tmp_path):
    hf_dir = tmp_path / "hf"
    blobs = tmp_path / "blobs"
    hf_dir.mkdir()
    blobs.mkdir()
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.int32)
    save_file({"a": a}, str(hf_dir / "model-00001-of-00002.safetensors"))
    # As the Hugging Face cache: the weight file is a link into a blob store.
    save_file({"b": b}, str(blobs / "sha"))
    (hf_dir / "model-00002-of-00002.safetensors").symlink_to(blobs / "sha")
    _write_index(
        hf_dir,
        {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    )
    state = load_hf_state_dict(str(hf_dir))
    np.testing.assert_array_equal(state["a"], a)
    np.testing.assert_array_equal(state["b"], b)


@pytest.mark.parametrize(
    "entry,reason",
    [
        ("../elsewhere/model.safetensors", "leaves the directory"),
        ("ABSOLUTE", "is absolute"),
        ("linked_dir/model.safetensors", "crosses a symbolic link out"),
    ],
)
def test_weight_map_outside_the_directory_is_refused(tmp_path, entry, reason):
    """Case: `hf import` of a `weight_map` entry outside the directory: refused before reading."""
    hf_dir = tmp_path / "hf"
    elsewhere = tmp_path / "elsewhere"
    hf_dir.mkdir()
    elsewhere.mkdir()
    save_file({"w": np.zeros(3, np.float32)}, str(elsewhere / "model.safetensors"))
    outside = Sentinel(
        str(elsewhere / "model.safetensors"), (elsewhere / "model.safetensors").read_bytes()
    )
    (hf_dir / "linked_dir").symlink_to(elsewhere)
    if entry == "ABSOLUTE":
        entry = outside.path
    _write_index(hf_dir, {"model.embed_tokens.weight": entry})
    with pytest.raises(HfConversionError) as e:
        load_hf_state_dict(str(hf_dir))
    message = str(e.value)
    assert SAFETENSORS_INDEX_FILE in message and "'model.embed_tokens.weight'" in message
    assert reason in message and "stay inside it" in message
    outside.assert_untouched()


def _header_file(path, header: dict, data: bytes = b"", claimed_len=None) -> None:
    raw = json.dumps(header).encode()
    length = len(raw) if claimed_len is None else claimed_len
    with open(path, "wb") as f:
        f.write(length.to_bytes(8, "little") + raw + data)


@pytest.mark.parametrize(
    "damage,expect",
    [
        ("empty", "shorter than the 8-byte header length"),
        ("truncated", "its header claims"),
        ("huge_header", "its header claims 1152921504606846976 bytes"),
        ("lying_offsets", "claims the bytes [0, 4000000000]"),
        ("not_json", "header is not JSON"),
        ("bad_dtype", "is not a valid safetensors file"),
    ],
)
def test_malformed_safetensors_is_one_line_naming_the_file(tmp_path, damage, expect):
    """Case: truncated or lying safetensors headers are errors naming the file."""
    path = tmp_path / SAFETENSORS_FILE
    if damage == "empty":
        path.write_bytes(b"\x01\x02")
    elif damage == "truncated":
        save_file({"w": np.zeros(100, np.float32)}, str(path))
        path.write_bytes(path.read_bytes()[:20])
    elif damage == "huge_header":
        _header_file(path, {}, claimed_len=2**60)
    elif damage == "lying_offsets":
        _header_file(path, {"w": dict(dtype="F32", shape=[10**9], data_offsets=[0, 4 * 10**9])})
    elif damage == "not_json":
        path.write_bytes((4).to_bytes(8, "little") + b"\xff\xfe{[")
    else:
        _header_file(path, {"w": dict(dtype="NOPE", shape=[1], data_offsets=[0, 4])}, b"abcd")
    with pytest.raises(HfConversionError) as e:
        load_hf_state_dict(str(tmp_path))
    assert str(path) in str(e.value) and expect in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("index", [{"metadata": {}}, {"weight_map": []}, [1, 2], "not json"])
def test_index_without_weight_map_names_the_file(tmp_path, index):
    """Case: an `index.json` without `weight_map` (or not JSON) is an error naming it."""
    path = tmp_path / SAFETENSORS_INDEX_FILE
    path.write_text(index if isinstance(index, str) else json.dumps(index))
    with pytest.raises(HfConversionError, match=SAFETENSORS_INDEX_FILE.replace(".", r"\.")):
        load_hf_state_dict(str(tmp_path))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p: p.write_bytes(b"{" + b" " * (2 << 20) + b"}"), "over|bytes"),
        (lambda p: p.write_bytes(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "nested"),
        (lambda p: p.write_bytes(b'{"model_type": "\xff"}'), "UTF-8"),
        (lambda p: os.mkfifo(p), "regular file"),
        (lambda p: os.symlink(p.parent / "nowhere", p), "does not exist|cannot|No such"),
    ],
)
def test_config_json_is_read_bounded_through_the_file_layer(tmp_path, make, match):
    """Unclear cases: hf import's config.json huge, deeply nested, non-UTF-8, a FIFO, a link."""
    from axlearn.common.hf_checkpoint import check_hf_config

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    make(hf_dir / "config.json")
    with pytest.raises(HfConversionError, match=match) as e:
        check_hf_config(str(hf_dir), model_cfg=None)
    assert "\n" not in str(e.value) and "config.json" in str(e.value)


def test_config_json_linked_as_in_the_hf_cache_is_read(tmp_path):
    from axlearn.common.hf_checkpoint import check_hf_config

    hf_dir, blobs = tmp_path / "hf", tmp_path / "blobs"
    hf_dir.mkdir()
    blobs.mkdir()
    (blobs / "sha").write_text(json.dumps({"model_type": "bert"}), encoding="utf-8")
    (hf_dir / "config.json").symlink_to(blobs / "sha")
    with pytest.raises(HfConversionError, match="model_type is 'bert', not 'llama'"):
        check_hf_config(str(hf_dir), model_cfg=None)
    (hf_dir / SAFETENSORS_INDEX_FILE).write_bytes(b"[" * 100_000)
    with pytest.raises(HfConversionError, match="nested") as e:
        load_hf_state_dict(str(hf_dir))
    assert "\n" not in str(e.value)
