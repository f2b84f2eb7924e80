"""Tests format 2 of axlearn/common/checkpointer/layout.py: AXLearn's list `index` as the commit
marker, our index (checksums, bytes leaves) in `manifest.json` beside it.

Each file read gets its hardening cases: `manifest.json` missing, truncated, of a wrong JSON
type, nested too deep, too large, a link, a FIFO, disagreeing with `index`, and rewritten by a
concurrent writer while it is read; a format-1 step (our index in `index`) still restores.
"""

import json
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import file_access
from axlearn.common.checkpointer import (
    Checkpointer,
    CorruptCheckpointError,
    every_n_steps_policy,
    layout,
)
from axlearn.common.checkpointer.verify import verify_checkpoint
from axlearn.common.config import config_for_function


def _checkpointer(ckpt_dir: str) -> Checkpointer:
    return (
        Checkpointer.default_config()
        .set(
            name="ckpt",
            dir=ckpt_dir,
            keep_last_n=5,
            save_policy=config_for_function(every_n_steps_policy).set(n=1),
        )
        .instantiate(parent=None)
    )


def _state(step: int, *, with_bytes: bool = True) -> dict:
    state = dict(
        w=jnp.arange(32, dtype=jnp.float32).reshape(8, 4) + step,
        b=jnp.asarray([1.5, -2.0], jnp.bfloat16),
        n=jnp.int32(step),
    )
    if with_bytes:
        state["it"] = f"pos{step}".encode()
    return state


def _target(*, with_bytes: bool = True) -> dict:
    target = dict(
        w=jax.ShapeDtypeStruct((8, 4), jnp.float32),
        b=jax.ShapeDtypeStruct((2,), jnp.bfloat16),
        n=jax.ShapeDtypeStruct((), jnp.int32),
    )
    if with_bytes:
        target["it"] = b""
    return target


def _save(ckpt_dir: str, steps=(1, 2), **kwargs) -> None:
    ckpt = _checkpointer(ckpt_dir)
    for step in steps:
        ckpt.save(step=step, state=_state(step, **kwargs))
    ckpt.stop()


def _assert_state(restored: dict, step: int) -> None:
    want = _state(step, with_bytes="it" in restored)
    for key, value in want.items():
        got = restored[key]
        if isinstance(value, bytes):
            assert got == value
        else:
            assert np.asarray(got).dtype == np.asarray(value).dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(value))


@pytest.fixture(name="ckpt_dir")
def fixture_ckpt_dir(tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir)
    return ckpt_dir


def _step2(ckpt_dir: str) -> str:
    return os.path.join(ckpt_dir, "step_00000002")


def test_index_is_axlearns_list_and_manifest_has_the_checksums(ckpt_dir):
    step_dir = _step2(ckpt_dir)
    with open(os.path.join(step_dir, "index"), encoding="utf-8") as f:
        pairs = json.load(f)
    with open(os.path.join(step_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert pairs[0] == ["step", 2]
    assert dict(pairs) == {
        "step": 2,
        "b": {"dtype": "bfloat16", "shape": "(2,)"},
        "it": "<class 'axlearn.checkpoint.BytesLeaf'>",
        "n": {"dtype": "int32", "shape": "()"},
        "w": {"dtype": "float32", "shape": "(8, 4)"},
    }
    assert manifest["version"] == 2 and manifest["step"] == 2
    index = layout.read_index_file(step_dir)
    assert index == manifest
    leaves = {leaf["path"]: leaf for leaf in index["leaves"]}
    assert set(leaves["w"]["checksum"]["crc32"]) == {"0.0"}
    result = verify_checkpoint(step_dir)
    assert result.ok and result.layout is None and result.num_chunks == 3, result.errors


def test_crash_after_manifest_before_index_is_uncommitted(ckpt_dir):
    """A save killed between `manifest.json` and `index` leaves an uncommitted step."""
    os.remove(os.path.join(_step2(ckpt_dir), "index"))
    assert not layout.is_committed(_step2(ckpt_dir))
    assert layout.latest_checkpoint_step(ckpt_dir) == 1
    step, restored = _checkpointer(ckpt_dir).restore(state=_target())
    assert step == 1
    _assert_state(restored, 1)


def test_missing_manifest_with_only_arrays_reads_as_axlearns_layout(tmp_path):
    """Without `manifest.json` the step is what AXLearn's `Checkpointer` writes (raw chunks):
    still restored, and verified without checksums (said so)."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, with_bytes=False)
    os.remove(os.path.join(_step2(ckpt_dir), "manifest.json"))
    index = layout.read_index_file(_step2(ckpt_dir))
    assert index["layout"] == "axlearn"
    assert all(leaf["checksum"] is None for leaf in index["leaves"])
    step, restored = _checkpointer(ckpt_dir).restore(state=_target(with_bytes=False))
    assert step == 2
    _assert_state(restored, 2)
    result = verify_checkpoint(_step2(ckpt_dir))
    assert result.ok and result.layout == "axlearn", result.errors


def test_missing_manifest_with_a_bytes_leaf_is_one_line(ckpt_dir):
    os.remove(os.path.join(_step2(ckpt_dir), "manifest.json"))
    with pytest.raises(layout.CheckpointIndexError) as e:
        layout.read_index_file(_step2(ckpt_dir))
    message = str(e.value)
    assert "step_00000002/index" in message and "'it'" in message
    assert "manifest.json" in message and "\n" not in message


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize(
    "damage,expected",
    [
        ("truncated", "is not a readable JSON index"),
        ("list", "is not an axlearn.checkpoint index"),
        ("string", "is not an axlearn.checkpoint index"),
        ("deep", "nested"),
        ("version", "has index version 7"),
        ("leaves_type", "lacks a valid step or leaves list"),
        ("shape_type", "has a malformed shape"),
    ],
)
def test_damaged_manifest_is_refused_naming_it(ckpt_dir, damage, expected):
    path = os.path.join(_step2(ckpt_dir), "manifest.json")
    with open(path, "rb") as f:
        data = f.read()
    value = json.loads(data)
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "list":
        data = b"[1, 2]"
    elif damage == "string":
        data = b'"axlearn.checkpoint"'
    elif damage == "deep":
        data = b"[" * 10_000 + b"]" * 10_000
    elif damage == "version":
        data = json.dumps(dict(value, version=7)).encode()
    elif damage == "leaves_type":
        data = json.dumps(dict(value, leaves={"w": 1})).encode()
    elif damage == "shape_type":
        for leaf in value["leaves"]:
            if leaf["path"] == "w":
                leaf["shape"] = "(8, 4)"
        data = json.dumps(value).encode()
    _write(path, data)
    with pytest.raises(layout.CheckpointIndexError, match=expected) as e:
        layout.read_index_file(_step2(ckpt_dir))
    assert "step_00000002/manifest.json" in str(e.value)
    # The trainer's restore calls it corrupt, naming the file; verify says the same.
    with pytest.raises(CorruptCheckpointError, match="manifest.json"):
        _checkpointer(ckpt_dir).restore(state=_target())
    result = verify_checkpoint(_step2(ckpt_dir))
    assert not result.ok and "manifest.json" in result.errors[0]


def test_huge_manifest_is_refused_unread(ckpt_dir, monkeypatch):
    """A `manifest.json` larger than the bound is refused unread (the bound lowered here to
    fall between the sizes of `index` and `manifest.json`)."""
    index_size = os.path.getsize(os.path.join(_step2(ckpt_dir), "index"))
    manifest_size = os.path.getsize(os.path.join(_step2(ckpt_dir), "manifest.json"))
    assert index_size < manifest_size
    monkeypatch.setattr(layout, "MAX_INDEX_BYTES", (index_size + manifest_size) // 2)
    with pytest.raises(layout.CheckpointIndexError, match="manifest.json") as e:
        layout.read_index_file(_step2(ckpt_dir))
    assert "\n" not in str(e.value)


def test_manifest_that_is_a_link_is_never_read(ckpt_dir):
    step2 = _step2(ckpt_dir)
    os.remove(os.path.join(step2, "manifest.json"))
    os.symlink(os.path.join(ckpt_dir, "step_00000001", "manifest.json"), f"{step2}/manifest.json")
    with pytest.raises(layout.CheckpointIndexError, match="manifest .* is a symbolic link"):
        layout.read_index_file(step2)


def test_manifest_that_is_a_fifo_is_refused_without_blocking(ckpt_dir):
    step2 = _step2(ckpt_dir)
    os.remove(os.path.join(step2, "manifest.json"))
    os.mkfifo(os.path.join(step2, "manifest.json"))
    done = []

    def read():
        try:
            layout.read_index_file(step2)
        except layout.CheckpointIndexError as e:
            done.append(str(e))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert done and "manifest.json" in done[0] and "FIFO" in done[0], done


def test_index_and_manifest_that_disagree_are_refused_naming_both(ckpt_dir):
    step2 = _step2(ckpt_dir)
    index_path = os.path.join(step2, "index")
    with open(index_path, encoding="utf-8") as f:
        good = f.read()
    pairs = json.loads(good)
    # A shape changed in `index` only.
    edited = [[p, dict(v, shape="(4, 8)") if p == "w" else v] for p, v in pairs]
    _write(index_path, json.dumps(edited).encode())
    with pytest.raises(layout.CheckpointIndexError) as e:
        layout.read_index_file(step2)
    message = str(e.value)
    assert "step_00000002/index and " in message and "manifest.json disagree on 'w'" in message
    assert "(4, 8)" in message and "(8, 4)" in message
    # A leaf dropped from `index` only.
    _write(index_path, json.dumps([p for p in pairs if p[0] != "b"]).encode())
    with pytest.raises(layout.CheckpointIndexError, match="disagree on 'b' \\(absent against"):
        layout.read_index_file(step2)
    # A pair listed twice.
    _write(index_path, json.dumps(pairs + [pairs[-1]]).encode())
    with pytest.raises(layout.CheckpointIndexError, match="is listed twice"):
        layout.read_index_file(step2)
    _write(index_path, good.encode())
    assert layout.read_index_file(step2)["step"] == 2


def test_concurrent_rewrites_of_the_manifest_never_give_a_torn_read(ckpt_dir):
    """A writer replaces `manifest.json` (atomically, as a save does) with a damaged and the
    good version in turn while readers read: each read gives the good index or refuses in one
    line, never a mix or another exception."""
    step2 = _step2(ckpt_dir)
    path = os.path.join(step2, "manifest.json")
    with open(path, "rb") as f:
        good = f.read()
    bad = json.dumps(dict(json.loads(good), version=9)).encode()
    expected = json.loads(good)
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            file_access.write_atomic(step2, "manifest.json", bad if i % 2 else good)
            i += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    outcomes = {"good": 0, "refused": 0}
    try:
        for _ in range(300):
            try:
                assert layout.read_index_file(step2) == expected
                outcomes["good"] += 1
            except layout.CheckpointIndexError as e:
                assert "has index version 9" in str(e) or "does not exist" in str(e), str(e)
                outcomes["refused"] += 1
    finally:
        stop.set()
        thread.join()
    file_access.write_atomic(step2, "manifest.json", good)
    assert outcomes["good"] + outcomes["refused"] == 300


def test_format_1_step_still_restores_and_verifies(ckpt_dir):
    """A step of our format 1 (our index in `index`, no manifest.json) is read as before."""
    step2 = _step2(ckpt_dir)
    with open(os.path.join(step2, "manifest.json"), encoding="utf-8") as f:
        index = json.load(f)
    index["version"] = 1
    os.remove(os.path.join(step2, "manifest.json"))
    layout.write_index_file(step2, index)  # Version 1: to `index` itself.
    assert not os.path.exists(os.path.join(step2, "manifest.json"))
    with open(os.path.join(step2, "index"), encoding="utf-8") as f:
        assert json.load(f)["version"] == 1
    step, restored = _checkpointer(ckpt_dir).restore(state=_target())
    assert step == 2
    _assert_state(restored, 2)
    result = verify_checkpoint(step2)
    assert result.ok and result.layout is None and result.num_chunks == 3, result.errors


def test_our_index_is_byte_for_byte_what_axlearn_wrote_for_the_same_state(tmp_path):
    """AXLearn's fuji-test-v3 step 6 (written by AXLearn's own trainer) restored and saved by
    our `Checkpointer`: the `index` it commits is the bytes AXLearn's `index` holds."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.checkpointer.verify import read_state_spec

    fixture = os.path.join(
        os.path.dirname(__file__),
        "..",
        "testdata",
        "axlearn_checkpoints",
        "fuji-test-v3",
        "checkpoints",
        "step_00000006",
    )
    spec = read_state_spec(fixture)
    reader = (
        Checkpointer.default_config()
        .set(name="ax", dir=os.path.dirname(fixture))
        .instantiate(parent=None)
    )
    step, state = reader.restore(step=6, state=spec)
    reader.stop()
    assert step == 6
    ours_dir = str(tmp_path / "ours")
    ckpt = _checkpointer(ours_dir)
    ckpt.save(step=6, state=state)
    ckpt.stop()
    with open(os.path.join(fixture, "index"), "rb") as f:
        theirs = f.read()
    with open(os.path.join(ours_dir, "step_00000006", "index"), "rb") as f:
        ours = f.read()
    assert json.loads(ours) == json.loads(theirs)
    assert ours == theirs
