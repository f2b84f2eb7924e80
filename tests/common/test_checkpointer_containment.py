"""Tests that checkpoints never reach outside their directory (axlearn/common/checkpointer/
layout.py, verify.py, tensorstore_save.py, recovery.py, core.py): crafted index entries,
symlinked step directories and chunk files are refused, and nothing outside is read, written or
deleted (an outside sentinel file's bytes and mtime are checked)."""

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

from axlearn.cli.main import main
from axlearn.common import checkpointer as ckpt_lib
from axlearn.common.checkpointer import (
    CorruptCheckpointError,
    layout,
    state_tree,
)
from tests.common.checkpointer_test_utils import edit_our_index
from tests.common.test_checkpointer_recovery import _checkpointer, _state, _target
from tests.common.test_path_containment import Sentinel


def _save(ckpt_dir: str, steps) -> None:
    ckpt = _checkpointer(ckpt_dir)
    ckpt._config.keep_last_n = 10  # pylint: disable=protected-access
    for step in steps:
        ckpt.save(step=step, state=_state(step))
    ckpt.stop()


def _edit_index(step_dir: str, edit) -> None:
    def edit_leaves(index):
        for leaf in index["leaves"]:
            edit(leaf)

    edit_our_index(step_dir, edit_leaves)


def _assert_refused(ckpt_dir: str, capsys, *, expect: str, secret: bytes = b"") -> None:
    """verify exits 1 and restore refuses, both naming the index, the leaf and the rule."""
    assert main(["checkpoint", "verify", ckpt_dir]) == 1
    out = capsys.readouterr().out
    assert expect in out and "step_00000002/manifest.json" in out, out
    with pytest.raises(CorruptCheckpointError) as e:
        _checkpointer(ckpt_dir).restore(state=_target())
    message = str(e.value)
    assert expect in message and "stay inside it" in message and "--restore_fallback" in message
    if secret:
        assert secret.decode()[:6] not in out + message


@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_index_array_file_outside_the_step_is_refused(tmp_path, capsys, where):
    """Case: an index leaf `file` that is absolute or climbs out with `../`."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    # The outside copy is a complete, valid array (what a crafted index would point at).
    outside = tmp_path / "outside_w"
    shutil.copytree(os.path.join(ckpt_dir, "step_00000001", "gda", "w"), outside)
    chunk = Sentinel(str(outside / "0.0"), (outside / "0.0").read_bytes())
    entry = str(outside) if where == "absolute" else "../../outside_w"

    def edit(leaf):
        if leaf["path"] == "w":
            leaf["file"] = entry

    _edit_index(os.path.join(ckpt_dir, "step_00000002"), edit)
    expect = "is absolute" if where == "absolute" else "leaves the directory"
    _assert_refused(ckpt_dir, capsys, expect=expect)
    chunk.assert_untouched()


def test_index_bytes_file_at_a_system_file_with_matching_crc_is_refused(tmp_path, capsys):
    """Case: a bytes leaf pointed at a file outside with a matching CRC and size: refused, and no
    error shows the file's content."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    secret = Sentinel(str(tmp_path / "system_file"), b"root:x:0:0:SECRET-LINE\n")

    def edit(leaf):
        if leaf["kind"] == layout.KIND_BYTES:
            leaf["per_process"]["0"] = dict(
                file="../../system_file",
                size=len(secret.data),
                checksum=state_tree.crc32_hex(secret.data),
            )

    _edit_index(os.path.join(ckpt_dir, "step_00000002"), edit)
    _assert_refused(ckpt_dir, capsys, expect="leaf 'it', process 0", secret=secret.data)
    secret.assert_untouched()


def test_symlinked_chunk_or_index_is_never_read(tmp_path, capsys):
    """Case: a chunk file or an `index` that is a link out of the step: not read through."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    step2 = os.path.join(ckpt_dir, "step_00000002")
    outside = Sentinel(str(tmp_path / "chunk"), open(f"{step2}/gda/w/0.0", "rb").read())
    os.unlink(f"{step2}/gda/w/0.0")
    os.symlink(outside.path, f"{step2}/gda/w/0.0")
    assert main(["checkpoint", "verify", step2]) == 1
    assert "never opened through a symbolic link" in capsys.readouterr().out
    # An index that is a link (here to step 1's valid index) is refused as corrupt.
    step1 = os.path.join(ckpt_dir, "step_00000001")
    os.replace(f"{step2}/gda/w/0.0", f"{step2}/gda/w/0.0.link")  # Keep only the index case.
    shutil.copy(outside.path, f"{step2}/gda/w/0.0")
    os.replace(f"{step2}/index", str(tmp_path / "index2"))
    os.symlink(f"{step1}/index", f"{step2}/index")
    with pytest.raises(
        CorruptCheckpointError, match=r"index \(or its step directory\) is a symbolic link"
    ):
        _checkpointer(ckpt_dir).restore(state=_target())
    outside.assert_untouched()


def test_gc_never_follows_a_symlinked_step_into_another_run(tmp_path):
    """Case: a step directory that is a link into another run: GC, restore and the next save of
    that step leave the other run's committed step intact (its index bytes and mtime)."""
    other = str(tmp_path / "other_run")
    _save(other, [5])
    other_index = Sentinel(
        os.path.join(other, "step_00000005", "index"),
        open(os.path.join(other, "step_00000005", "index"), "rb").read(),
    )
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    os.symlink(os.path.join(other, "step_00000005"), os.path.join(ckpt_dir, "step_00000003"))
    os.symlink(os.path.join(other, "step_00000005"), os.path.join(ckpt_dir, "step_00000000"))
    ckpt = _checkpointer(ckpt_dir)
    assert ckpt.restore(state=_target())[0] == 2  # The link is not a step of this run.
    for step in (3, 4, 5):  # Step 3 is saved over the link: the link goes, not its target.
        ckpt.save(step=step, state=_state(step))
    ckpt.stop()
    ckpt.run_garbage_collection()
    other_index.assert_untouched()
    assert ckpt_lib.latest_checkpoint_step(other) == 5
    assert not os.path.islink(os.path.join(ckpt_dir, "step_00000003"))
    assert os.path.islink(os.path.join(ckpt_dir, "step_00000000"))  # Ignored, never followed.
    step, restored = _checkpointer(other).restore(state=_target())
    assert step == 5 and restored["it"] == b"pos5"


def test_interrupted_save_set_aside_is_removed_once_a_newer_step_commits(tmp_path):
    """Case: a save interrupted after its chunks, before its index: set aside as unindexed, then
    removed by garbage collection once a newer step has committed."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    os.remove(os.path.join(ckpt_dir, "step_00000002", "index"))  # As a kill before the index.
    ckpt = _checkpointer(ckpt_dir)
    assert ckpt.restore(state=_target())[0] == 1
    aside = ckpt_lib.set_aside_dirs(ckpt_dir)
    assert [os.path.basename(p)[:24] for p in aside] == ["step_00000002.unindexed-"]
    ckpt.save(step=2, state=_state(2))
    ckpt.wait_until_finished()
    assert os.path.isdir(aside[0])  # Step 2 itself is not newer than the set-aside step.
    ckpt.save(step=3, state=_state(3))
    ckpt.stop()
    ckpt.run_garbage_collection()
    assert ckpt_lib.set_aside_dirs(ckpt_dir) == []
    assert [os.path.basename(p) for p in ckpt_lib.checkpoint_paths(ckpt_dir)] == ["step_00000003"]


def test_a_manifest_naming_a_file_outside_the_step_is_refused(tmp_path):
    """Case: a per-process manifest (multi-process saves) whose bytes leaf `file` leaves the step
    directory is refused before it reaches the index; a manifest that is a link is not read."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.checkpointer.tensorstore_save import read_manifest
    from axlearn.common.path_containment import PathContainmentError

    step_dir = tmp_path / "ckpt" / "step_00000001"
    (step_dir / "manifests").mkdir(parents=True)
    secret = Sentinel(str(tmp_path / "secret"))
    good = {"chunks": {}, "bytes": {"it": {"file": "host/process_1/it", "size": 1, "checksum": ""}}}
    (step_dir / "manifests" / "process_1.json").write_text(json.dumps(good))
    assert read_manifest(str(step_dir), 1) == good
    bad = {"chunks": {}, "bytes": {"it": {"file": "../../secret", "size": 1, "checksum": ""}}}
    (step_dir / "manifests" / "process_1.json").write_text(json.dumps(bad))
    with pytest.raises(PathContainmentError) as e:
        read_manifest(str(step_dir), 1)
    assert "process_1.json: bytes leaf 'it' names the path '../../secret'" in str(e.value)
    assert "leaves the directory" in str(e.value)
    os.remove(step_dir / "manifests" / "process_1.json")
    os.symlink(secret.path, step_dir / "manifests" / "process_1.json")
    with pytest.raises(OSError, match="never opened through a symbolic link"):
        read_manifest(str(step_dir), 1)
    secret.assert_untouched()


# --------------------------------------------------------------------------------------------
# Issue 48, "Insecure" and "Unclear": every checkpoint file goes through axlearn.common.file_access.


def _run_with_deadline(fn, seconds: float = 20.0):
    """Runs `fn` in a daemon thread; fails (instead of hanging the suite) if it blocks."""
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # pylint: disable=broad-except
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for more than {seconds} s"
    if "error" in result:
        raise result["error"]
    return result.get("value")


def test_insecure_zarray_linked_outside_never_shows_its_content(tmp_path, capsys):
    """Insecure case: a `.zarray` that is a link to an outside JSON file: its values reach
    neither verify's output nor the trainer's error; the step is refused as corrupt."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    secret = Sentinel(
        str(tmp_path / "outside.json"),
        json.dumps({"shape": ["SECRET-VALUE-1"], "dtype": "SECRET-VALUE-2"}).encode(),
    )
    zarray = os.path.join(ckpt_dir, "step_00000002", "gda", "w", ".zarray")
    os.remove(zarray)
    os.symlink(secret.path, zarray)
    assert _run_with_deadline(lambda: main(["checkpoint", "verify", ckpt_dir])) == 1
    out = capsys.readouterr().out
    assert "gda/w/.zarray" in out and "symbolic link" in out and "SECRET" not in out
    with pytest.raises(CorruptCheckpointError) as e:
        _checkpointer(ckpt_dir).restore(state=_target())
    assert "symbolic link" in str(e.value) and "SECRET" not in str(e.value)
    secret.assert_untouched()


@pytest.mark.parametrize("where", ["zarray", "chunk", "index"])
def test_insecure_dev_zero_link_is_refused_at_once(tmp_path, capsys, where):
    """Insecure case: a `.zarray`, chunk or `index` linked to /dev/zero: refused at once (it was
    read until memory ran out, in verify and in GC's check)."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    step2 = os.path.join(ckpt_dir, "step_00000002")
    name = {"zarray": "gda/w/.zarray", "chunk": "gda/w/0.0", "index": "index"}[where]
    os.remove(os.path.join(step2, name))
    os.symlink("/dev/zero", os.path.join(step2, name))
    start = time.monotonic()
    assert _run_with_deadline(lambda: main(["checkpoint", "verify", step2])) == 1
    assert "symbolic link" in capsys.readouterr().out
    ckpt = _checkpointer(ckpt_dir)
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        _run_with_deadline(lambda: ckpt.restore(step=2, state=_target()))
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("where", ["zarray", "chunk", "index", "bytes"])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_unclear_fifo_or_directory_in_a_files_place_is_one_line(tmp_path, capsys, where, kind):
    """Unclear case: a FIFO or a directory where a checkpoint file is expected: one line naming
    the file and the rule (it hung, or was a traceback)."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    step2 = os.path.join(ckpt_dir, "step_00000002")
    name = {
        "zarray": "gda/w/.zarray",
        "chunk": "gda/w/0.0",
        "index": "index",
        "bytes": "host/process_0/it",
    }[where]
    os.remove(os.path.join(step2, name))
    if kind == "fifo":
        os.mkfifo(os.path.join(step2, name))
    else:
        os.mkdir(os.path.join(step2, name))
    expected = "a FIFO" if kind == "fifo" else "a directory"
    assert _run_with_deadline(lambda: main(["checkpoint", "verify", step2])) == 1
    out = capsys.readouterr().out
    assert f"{name}: " in out or f"{name} " in out, out
    assert expected in out and "Traceback" not in out, out
    with pytest.raises(CorruptCheckpointError, match=expected):
        _run_with_deadline(lambda: _checkpointer(ckpt_dir).restore(step=2, state=_target()))


def test_unclear_index_nested_too_deep_or_not_utf8_is_one_line(tmp_path):
    """Unclear case: an `index` nested 100,000 deep, or not UTF-8: refused as corrupt in one line
    naming the file (it was a RecursionError or a UnicodeDecodeError traceback)."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    index = os.path.join(ckpt_dir, "step_00000002", "index")
    for data, expected in (
        (b"[" * 100_000 + b"]" * 100_000, "nested 100000 deep"),
        (b'{"format": "\xff"}', "is not UTF-8 text"),
    ):
        with open(index, "wb") as f:
            f.write(data)
        with pytest.raises(CorruptCheckpointError, match=expected) as e:
            _checkpointer(ckpt_dir).restore(state=_target())
        assert "step_00000002/index" in str(e.value)


def _race(tmp_path, seconds: float) -> dict:
    """Restores step 2 while a thread swaps its array directory for a link to an outside copy.

    The index was edited (as an attacker who can write the step could) so that the outside
    chunk's checksum is the one it records: a restore that reads through the link succeeds and
    returns the outside values. The in-tree chunk then fails its checksum, so every restore
    either reads the link (an outside value) or fails; none may return the outside values.
    """
    ckpt_dir = str(tmp_path / "ckpt")
    _save(ckpt_dir, [1, 2])
    step2 = os.path.join(ckpt_dir, "step_00000002")
    outside_dir = tmp_path / "outside_w"
    shutil.copytree(os.path.join(step2, "gda", "w"), outside_dir)
    outside_values = np.full((8, 4), 777.0, np.float32)
    (outside_dir / "0.0").write_bytes(outside_values.tobytes())
    sentinels = [
        Sentinel(str(outside_dir / n), (outside_dir / n).read_bytes()) for n in ("0.0", ".zarray")
    ]

    def edit(leaf):
        if leaf["path"] == "w":
            leaf["checksum"]["crc32"]["0.0"] = state_tree.crc32_hex(outside_values)

    _edit_index(step2, edit)
    real, linked, parked = (
        os.path.join(step2, "gda", "w"),
        os.path.join(step2, "gda", "w.link"),
        os.path.join(step2, "gda", "w.real"),
    )
    os.symlink(outside_dir, linked)
    stop = threading.Event()
    swaps = [0]

    def swapper():
        while not stop.is_set():
            os.rename(real, parked)
            os.rename(linked, real)  # `gda/w` is now a link out of the step.
            time.sleep(0)
            os.rename(real, linked)
            os.rename(parked, real)
            swaps[0] += 1

    ckpt = _checkpointer(ckpt_dir)
    counts = dict(restores=0, outside=0, own=0, refused=0)
    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            counts["restores"] += 1
            try:
                _, restored = ckpt.restore(step=2, state=_target())
            except (CorruptCheckpointError, ValueError, OSError):
                counts["refused"] += 1
                continue
            w = np.asarray(restored["w"])
            if np.array_equal(w, outside_values):
                counts["outside"] += 1
            else:
                counts["own"] += 1
    finally:
        stop.set()
        thread.join()
    for sentinel in sentinels:
        sentinel.assert_untouched()
    counts["swaps"] = swaps[0]
    return counts


@pytest.mark.parametrize("seconds", [3, pytest.param(10, marks=pytest.mark.slow)])
def test_insecure_link_swapped_during_restores_never_returns_outside_values(tmp_path, seconds):
    """Insecure case (the race): a thread swaps the step's array directory for a link out of it
    while restores run; 0 restores return the outside values (before the file layer: 1,743 of
    7,177 tries in 10 s), and the outside files keep their bytes and mtime."""
    counts = _race(tmp_path, seconds)
    assert counts["outside"] == 0, counts
    assert counts["restores"] >= 20 and counts["swaps"] >= 20, counts
    # Nothing returns the step's own values either: its chunk fails the edited checksum.
    assert counts["own"] == 0 and counts["refused"] == counts["restores"], counts
