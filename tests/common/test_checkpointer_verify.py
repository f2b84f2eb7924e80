"""Tests for axlearn/common/checkpointer/verify.py and the `axlearn checkpoint` command."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.cli.main import main
from axlearn.common import checkpointer as ckpt_lib
from axlearn.common.checkpointer import Checkpointer, every_n_steps_policy
from axlearn.common.config import config_for_function


@pytest.fixture(name="ckpt_dir")
def fixture_ckpt_dir(tmp_path):
    """Steps 1 and 2 committed, step 3 uncommitted."""
    cfg = Checkpointer.default_config().set(
        name="checkpointer",
        dir=str(tmp_path / "ckpt"),
        keep_last_n=5,
        save_policy=config_for_function(every_n_steps_policy).set(n=1),
    )
    ckpt = cfg.instantiate(parent=None)
    mesh = jax.make_mesh((8,), ("x",))
    state = dict(
        w=jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, PartitionSpec("x"))),
        b=jnp.arange(3, dtype=jnp.int32),
        it=b"state",
        step=0,
    )
    for step in (1, 2):
        ckpt.save(step=step, state=state)
    ckpt.stop()
    os.makedirs(os.path.join(cfg.dir, "step_00000003", "gda"))
    return cfg.dir


def test_list_and_verify(ckpt_dir):
    infos = ckpt_lib.list_checkpoints(ckpt_dir)
    assert [(i.step, i.committed, i.num_leaves) for i in infos] == [
        (1, True, 4),
        (2, True, 4),
        (3, False, None),
    ]
    assert infos[0].size_bytes > 8 * 4 * 4
    result = ckpt_lib.verify_checkpoint(os.path.join(ckpt_dir, "step_00000002"))
    assert result.ok and result.num_chunks == 9 and result.num_bytes == 8 * 4 * 4 + 3 * 4
    uncommitted = ckpt_lib.verify_checkpoint(os.path.join(ckpt_dir, "step_00000003"))
    assert not uncommitted.ok and not uncommitted.committed
    spec = ckpt_lib.read_state_spec(os.path.join(ckpt_dir, "step_00000001"))
    assert spec == dict(
        w=jax.ShapeDtypeStruct((8, 4), jnp.float32),
        b=jax.ShapeDtypeStruct((3,), jnp.int32),
        it=b"",
        step=0,
    )


def test_verify_finds_corruption(ckpt_dir):
    step_dir = os.path.join(ckpt_dir, "step_00000002")
    chunk = os.path.join(step_dir, "gda", "w", "4.0")
    with open(chunk, "r+b") as f:
        f.write(b"\x12\x34")
    os.remove(os.path.join(step_dir, "gda", "w", "6.0"))
    with open(os.path.join(step_dir, "host", "process_0", "it"), "ab") as f:
        f.write(b"!")
    result = ckpt_lib.verify_checkpoint(step_dir)
    assert not result.ok
    assert len(result.errors) == 3
    assert f"{chunk} (leaf 'w'): checksum mismatch" in result.errors
    assert any("6.0 (leaf 'w'): missing" in e for e in result.errors)
    assert any("(leaf 'it', process 0)" in e for e in result.errors)


def test_verify_finds_a_truncated_chunk(ckpt_dir):
    step_dir = os.path.join(ckpt_dir, "step_00000002")
    chunk = os.path.join(step_dir, "gda", "w", "1.0")
    size = os.path.getsize(chunk)
    os.truncate(chunk, size - 4)
    result = ckpt_lib.verify_checkpoint(step_dir)
    assert result.errors == [f"{chunk} (leaf 'w'): unreadable: {size - 4} bytes, expected {size}"]


def test_cli_list(ckpt_dir, capsys):
    assert main(["checkpoint", "list", ckpt_dir]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("step        1  committed") and lines[0].endswith("4 leaves")
    assert lines[2].startswith("step        3  uncommitted")


def test_cli_verify(ckpt_dir, capsys):
    assert main(["checkpoint", "verify", ckpt_dir]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("step        1  committed  OK  4 leaves, 9 chunks")
    assert out[2].startswith("step        3  uncommitted")
    with open(os.path.join(ckpt_dir, "step_00000001", "gda", "b", "0"), "r+b") as f:
        f.truncate(2)
    assert main(["checkpoint", "verify", ckpt_dir, "--step", "1"]) == 1
    out = capsys.readouterr().out
    assert "step        1  committed  FAILED  1 problem(s)" in out and "leaf 'b'" in out
    assert main(["checkpoint", "verify", os.path.join(ckpt_dir, "step_00000002")]) == 0
    assert main(["checkpoint", "verify", ckpt_dir, "--step", "9"]) == 1
    assert "No directory for step 9" in capsys.readouterr().err
    np.testing.assert_equal(main(["checkpoint", "list", "/nonexistent/dir"]), 1)


def test_read_state_spec_restores_a_trainer_checkpoint(tmp_path):
    """The documented restore without the model at hand works on a trainer's checkpoint, whose
    state includes the input iterator position (a bytes leaf) next to the arrays."""
    from tests.common import trainer_test_utils as tu  # pylint: disable=import-outside-toplevel

    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=2, checkpoint_every=2)
    cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    ckpt_dir = os.path.join(str(tmp_path), "checkpoints")
    step_dir = os.path.join(ckpt_dir, "step_00000002")
    spec = ckpt_lib.read_state_spec(step_dir)
    assert spec["input_iter"] == b""
    assert isinstance(spec["model"]["emb"]["weight"], jax.ShapeDtypeStruct)
    ckpt = Checkpointer.default_config().set(name="ckpt", dir=ckpt_dir).instantiate(parent=None)
    step, restored = ckpt.restore(state=spec, step=2)
    ckpt.stop()
    assert step == 2
    assert restored["input_iter"] != b""  # The saved iterator position, read back.
    weight = restored["model"]["emb"]["weight"]
    assert weight.shape == spec["model"]["emb"]["weight"].shape
    assert np.isfinite(np.asarray(weight)).all()


def test_cli_on_a_trainer_dir_points_to_its_checkpoints(tmp_path, capsys):
    """Issue 29 case 13: `axlearn checkpoint verify|list TRAINER_DIR` is an error that points to
    TRAINER_DIR/checkpoints, not "No step directories" with exit 0."""
    trainer_dir = tmp_path / "run"
    (trainer_dir / "checkpoints").mkdir(parents=True)
    for command in ("verify", "list"):
        assert main(["checkpoint", command, str(trainer_dir)]) == 1
        err = capsys.readouterr().err
        assert f"its checkpoints are in {trainer_dir / 'checkpoints'}" in err, err
    # A checkpoint dir without steps is still not an error.
    assert main(["checkpoint", "verify", str(trainer_dir / "checkpoints")]) == 0
    assert "No step directories" in capsys.readouterr().out


def test_cli_verify_during_a_live_run_reports_the_save_in_progress(tmp_path, capsys):
    """Issue 38: `verify` while a run saves (chunks written, index not yet) says a save is in
    progress and exits 0; the same directory without a live run is a failure (exit 1)."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.run_lock import RunLock

    trainer_dir = tmp_path / "run"
    ckpt_dir = str(trainer_dir / "checkpoints")
    cfg = Checkpointer.default_config().set(
        name="checkpointer",
        dir=ckpt_dir,
        keep_last_n=5,
        save_policy=config_for_function(every_n_steps_policy).set(n=1),
    )
    ckpt = cfg.instantiate(parent=None)
    for step in (1, 2):
        ckpt.save(step=step, state=dict(w=jnp.full((8, 4), float(step))))
    ckpt.stop()
    # Step 2 as a save in flight sees it: every chunk written, the index not yet.
    os.remove(os.path.join(ckpt_dir, "step_00000002", "index"))
    with RunLock(str(trainer_dir)):
        for target in (ckpt_dir, os.path.join(ckpt_dir, "step_00000002")):
            assert main(["checkpoint", "verify", target]) == 0
            out = capsys.readouterr().out
            assert "step        2  uncommitted  save in progress: a live run holds" in out, out
            assert "run.lock" in out
    assert main(["checkpoint", "verify", ckpt_dir]) == 1
    assert "its index is missing but every chunk" in capsys.readouterr().out


def test_cli_list_and_verify_say_what_their_sizes_count(ckpt_dir, capsys):
    """Issue 38: `list` shows the size on disk, `verify` the bytes of array data it checked."""
    assert main(["checkpoint", "list", ckpt_dir]) == 0
    listed = capsys.readouterr().out.splitlines()[0]
    assert main(["checkpoint", "verify", ckpt_dir, "--step", "1"]) == 0
    verified = capsys.readouterr().out.splitlines()[0]
    on_disk = sum(
        os.path.getsize(os.path.join(d, n))
        for d, _, names in os.walk(os.path.join(ckpt_dir, "step_00000001"))
        for n in names
    )
    assert f"{on_disk / 1e3:.2f} KB on disk" in listed, (listed, on_disk)
    # w: 8x4 float32, b: 3 int32 (the arrays' bytes, without .zarray files or the index).
    assert verified.endswith(f"{8 * 4 * 4 + 3 * 4} B of array data"), verified
