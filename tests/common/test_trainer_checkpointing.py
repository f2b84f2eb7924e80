"""Tests for axlearn/common/trainer_checkpointing.py: the trainer's snapshot choice, the split
of the checkpoint overhead, and the error when a snapshot holds the memory a step needs.

The trainers are tiny (tests/common/trainer_test_utils.BigramLm) on the 8 CPU devices; device
memory limits are injected through `checkpointer.storage.memory_limit`.
"""

import json
import logging
import os

import jax
import numpy as np
import pytest

from axlearn.common.checkpointer import Checkpointer
from axlearn.common.checkpointer.snapshot_choice import MARGIN_FRACTION, fixed_memory_limit
from axlearn.common.config import config_for_function
from axlearn.common.trainer_checkpointing import (
    SnapshotMemoryError,
    snapshot_memory_message,
)
from tests.common.trainer_test_utils import bigram_trainer_config

MAX_STEP = 6
EVERY = 2


def _config(trainer_dir, *, limit=None, max_step=MAX_STEP, host_transfer=None):
    cfg = bigram_trainer_config(str(trainer_dir), max_step=max_step, checkpoint_every=EVERY)
    cfg.evalers = {}
    cfg.checkpointer.keep_last_n = 10
    cfg.checkpointer.storage.host_transfer = host_transfer
    if limit is not None:
        cfg.checkpointer.storage.memory_limit = config_for_function(fixed_memory_limit).set(
            limit_bytes=limit
        )
    return cfg


def _run(trainer_dir, **kwargs):
    trainer = _config(trainer_dir, **kwargs).instantiate(parent=None)
    trainer.run(jax.random.PRNGKey(1))
    return trainer


def _records(trainer_dir):
    with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _assert_checkpoint_equals(trainer_dir, step, state):
    """The checkpoint of `step` in `trainer_dir` is bit-identical to `state` (a TrainerState)."""
    ckpt = (
        Checkpointer.default_config()
        .set(name="ckpt", dir=os.path.join(trainer_dir, "checkpoints"))
        .instantiate(parent=None)
    )
    state = state._asdict()
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    target["input_iter"] = b""
    _, restored = ckpt.restore(step=step, state=target)
    for key in ("prng_key", "model", "learner"):
        expected_leaves, actual_leaves = jax.tree.leaves(state[key]), jax.tree.leaves(restored[key])
        assert len(expected_leaves) == len(actual_leaves)
        for expected, actual in zip(expected_leaves, actual_leaves):
            expected, actual = np.asarray(expected), np.asarray(actual)
            assert actual.dtype == expected.dtype
            np.testing.assert_array_equal(
                actual.reshape(-1).view(np.uint8), expected.reshape(-1).view(np.uint8)
            )
    ckpt.stop()


def test_overhead_split_in_metrics_step_log_and_run_summary(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        trainer = _run(tmp_path)
    choice = trainer._checkpoints.snapshot_choice  # pylint: disable=protected-access
    # On CPU the host's memory is the device's: a copy of this tiny state fits.
    assert choice.mode == "device" and choice.source == "chosen"
    assert choice.peak_bytes > 0 and choice.state_bytes > 0
    logged = [r.getMessage() for r in caplog.records]
    assert sum("checkpoint snapshot: device" in m for m in logged) == 1
    saves = [r for r in _records(tmp_path) if "perf/overhead/checkpoint" in r]
    assert [r["step"] for r in saves] == [2, 4, 6]
    for r in saves:
        parts = [r[f"perf/checkpoint/{k}"] for k in ("snapshot_s", "wait_for_previous_s")]
        rest = r["perf/checkpoint/other_s"]
        assert min(parts + [rest]) >= 0
        # The parts add up to the step's checkpoint overhead.
        assert sum(parts) + rest == pytest.approx(r["perf/overhead/checkpoint"], abs=1e-9)
        assert r["checkpoint_snapshot"].startswith("reference (CPU")
    lines = [m for m in logged if m.startswith("step 4/6")]
    assert len(lines) == 1 and "checkpoint " in lines[0]
    assert "[snapshot " in lines[0] and "waiting for the previous save" in lines[0]
    with open(os.path.join(tmp_path, "run_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    ckpt = summary["checkpoint"]
    assert ckpt["saves"] == 3
    total = sum(r["perf/overhead/checkpoint"] for r in saves)
    assert ckpt["blocking_s"] == pytest.approx(total)
    assert ckpt["snapshot_s"] + ckpt["wait_for_previous_s"] + ckpt["other_s"] == pytest.approx(
        total
    )
    assert ckpt["end_of_run_wait_s"] >= 0
    assert summary["checkpoint_snapshot"]["mode"] == "device"
    block = [m for m in logged if "Run summary" in m]
    assert block and "Checkpoints" in block[-1] and "3 saves blocked" in block[-1]


def test_pinned_host_route_is_set_up_before_the_first_step(tmp_path, caplog):
    """With the accelerators' route (forced here on CPU devices), the first save's transfer
    into pinned host memory is made once before the first step, and logged."""
    with caplog.at_level(logging.INFO):
        trainer = _run(tmp_path, host_transfer="pinned_host")
    logged = [r.getMessage() for r in caplog.records]
    setup = [i for i, m in enumerate(logged) if "set up at start" in m]
    first_step = min(i for i, m in enumerate(logged) if m.startswith("step 1/"))
    assert len(setup) == 1 and setup[0] < first_step
    _assert_checkpoint_equals(tmp_path, MAX_STEP, trainer.trainer_state)


@pytest.mark.slow  # Four trainer runs.
def test_injected_limits_choose_partial_and_host_and_restore_bit_identical(tmp_path):
    """The checkpoint of step 4 (taken while training went on to step 6, donating the state)
    equals the final state of a run that stopped at step 4, in every snapshot mode."""
    probe = _run(tmp_path / "probe", limit=10**12, max_step=4)
    choice = probe._checkpoints.snapshot_choice  # pylint: disable=protected-access
    assert choice.mode == "device"
    largest = max(max(per.values()) for per in _leaf_bytes(probe).values())
    # Room for the largest leaf but not the whole state: partial.
    partial_limit = int((choice.peak_bytes + largest) / (1 - MARGIN_FRACTION)) + 64
    for name, limit, mode in (
        ("device", 10**12, "device"),
        ("partial", partial_limit, "partial"),
        ("host", 1, "host"),
    ):
        trainer = _run(tmp_path / name, limit=limit)
        got = trainer._checkpoints.snapshot_choice  # pylint: disable=protected-access
        assert got.mode == mode, got.describe()
        assert got.peak_bytes == choice.peak_bytes
        saves = [r for r in _records(tmp_path / name) if "checkpoint_snapshot" in r]
        assert [r["step"] for r in saves] == [2, 4, 6]
        # On CPU a device choice references the state (the next step does not donate it).
        prefix = "reference" if mode == "device" else mode
        assert all(r["checkpoint_snapshot"].startswith(prefix) for r in saves)
        _assert_checkpoint_equals(str(tmp_path / name), 4, probe.trainer_state)
        _assert_checkpoint_equals(str(tmp_path / name), 6, trainer.trainer_state)


def _leaf_bytes(trainer):
    from axlearn.common.checkpointer.snapshot_choice import (  # pylint: disable=C0415
        leaf_bytes_per_device,
    )

    return leaf_bytes_per_device(trainer.trainer_state._asdict())


def test_snapshot_memory_error_names_both_numbers():
    message = snapshot_memory_message(
        step=11,
        error=RuntimeError(
            "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 45406535680 bytes.\nmore"
        ),
        held_bytes=12_530_000_000,
        saved_step=10,
        peak_bytes=55_300_000_000,
        limit_bytes=76_000_000_000,
    )
    assert "\n" not in message
    assert "Step 11 could not allocate device memory (RESOURCE_EXHAUSTED" in message
    assert "snapshot of step 10 held 12.53 GB per device" in message
    assert "the step needs 55.30 GB (compiled peak) of the 76.00 GB limit" in message
    assert "checkpointer.storage.snapshot='host'" in message


def test_step_failing_to_allocate_beside_a_held_snapshot_raises_snapshot_memory_error(tmp_path):
    trainer = _config(tmp_path).instantiate(parent=None)

    class _Storage:
        def device_snapshot_bytes(self):
            return 3_000_000_000

    def failing_step(state, batch):
        del state, batch
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4.2GiB")

    trainer.checkpointer._storage = _Storage()  # pylint: disable=protected-access
    trainer._compiled_train_step = failing_step  # pylint: disable=protected-access
    trainer._step = 5  # pylint: disable=protected-access
    trainer._checkpoints.last_saved_step = 4  # pylint: disable=protected-access
    with pytest.raises(SnapshotMemoryError, match="snapshot of step 4 held 3.00 GB per device"):
        trainer._dispatch_train_step({})  # pylint: disable=protected-access
    # Without a held snapshot the original error propagates unchanged.
    _Storage.device_snapshot_bytes = lambda self: 0
    with pytest.raises(RuntimeError, match="^RESOURCE_EXHAUSTED"):
        trainer._dispatch_train_step({})  # pylint: disable=protected-access


def test_model_mismatch_error_does_not_blame_the_input_iterator(tmp_path):
    """Issue 38: resuming a checkpoint (which holds `input_iter`) with a changed model names the
    model's parameters, not `input_iter` as missing or unexpected."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.checkpointer import StateMismatchError

    trainer_dir = str(tmp_path)
    cfg = bigram_trainer_config(trainer_dir, max_step=2, checkpoint_every=2)
    cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    cfg = bigram_trainer_config(trainer_dir, max_step=4, checkpoint_every=2)
    cfg.model.dim = 16
    with pytest.raises(StateMismatchError) as e:
        cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    message = str(e.value)
    assert "'model/emb/weight'" in message and "float32[64, 32]" in message, message
    assert "input_iter" not in message, message
    assert "input_iter" not in e.value.paths and "model/emb/weight" in e.value.paths


def _input_iter_file(trainer_dir, step):
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.checkpointer.layout import read_index_file

    step_dir = os.path.join(trainer_dir, "checkpoints", f"step_{step:08d}")
    (leaf,) = [x for x in read_index_file(step_dir)["leaves"] if x["path"] == "input_iter"]
    return step_dir, os.path.join(step_dir, leaf["per_process"]["0"]["file"])


# Four tiny trainers (about 20 s on 2 busy cores).
@pytest.mark.slow
def test_input_state_refusal_names_the_checkpoint(tmp_path, monkeypatch):
    """A refused input state names the step directory and leaf it was read from; a state file
    replaced by a FIFO or a link is one line, without blocking or reading the link's target."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.input_iterator import InputStateError

    trainer_dir = str(tmp_path / "run")
    bigram_trainer_config(trainer_dir, max_step=2, checkpoint_every=2).instantiate(parent=None).run(
        jax.random.PRNGKey(0)
    )
    step_dir, state_file = _input_iter_file(trainer_dir, 2)
    cfg = bigram_trainer_config(trainer_dir, max_step=4, checkpoint_every=2)
    trainer = cfg.instantiate(parent=None)

    def refuse(*_, **__):
        raise InputStateError("Input 'input': the saved state: field 'rows_per_batch' is null")

    monkeypatch.setattr(trainer.input, "restore_iterator", refuse)
    with pytest.raises(InputStateError) as e:
        trainer.run(jax.random.PRNGKey(0))
    assert str(e.value).startswith(f"{step_dir} (leaf 'input_iter', process 0): Input 'input'")
    secret = tmp_path / "secret"
    secret.write_bytes(b"SECRET-CONTENT")
    for kind in ("fifo", "link"):
        os.remove(state_file)
        if kind == "fifo":
            os.mkfifo(state_file)
        else:
            os.symlink(secret, state_file)
        with pytest.raises(Exception) as e:  # The checkpointer's corruption error.
            cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
        message = str(e.value)
        # The first line names the file and the rule (the checkpointer adds its fix below).
        assert state_file in message.splitlines()[0], message
        assert "SECRET" not in message
    assert secret.read_bytes() == b"SECRET-CONTENT"


@pytest.mark.slow  # Two trainer runs (~45 s on the shared machine).
def test_checkpoint_without_an_input_position_restores_with_an_info_line(tmp_path, caplog):
    """Issue 55 case 7: a checkpoint holding no input position (as `hf import` writes, or one
    saved with save_input_iterator=False) restores with one info line, no warning that reads
    like a failure (was: `Restoring with input iterator=True failed ... retrying with False`)."""
    trainer_dir = str(tmp_path)
    cfg = bigram_trainer_config(trainer_dir, max_step=2, checkpoint_every=2)
    cfg.evalers = {}
    cfg.save_input_iterator = False
    cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    cfg = bigram_trainer_config(trainer_dir, max_step=3, checkpoint_every=2)
    cfg.evalers = {}
    with caplog.at_level(logging.INFO):
        out = cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    assert out["step"] == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in warnings if "input" in m and "restor" in m.lower()], warnings
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(
        m.startswith("The checkpoint holds no input position (imported, or saved with ")
        and m.endswith("the input starts from its beginning.")
        for m in infos
    ), infos
