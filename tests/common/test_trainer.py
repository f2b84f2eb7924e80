"""Tests for axlearn/common/trainer.py: the loop, its timing, non-finite handling, resume, outputs.

Uses a tiny bigram LM (tests/common/trainer_test_utils.py) so each run compiles in seconds; the
transformer config's sharding equivalence lives in test_trainer_sharding.py.
"""

from __future__ import annotations

import json
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.config import config_for_function
from axlearn.common.evaler import every_n_steps_policy
from axlearn.common.trainer import (
    NonFiniteLossError,
    SpmdTrainer,
    select_mesh_config,
)
from axlearn.common.trainer_config_modifier import (
    ChainConfigModifier,
    GradientAccumulationModifier,
    MeshShapeModifier,
)
from axlearn.common.utils_spmd import HybridMeshShape
from tests.common import trainer_test_utils as tu


def _run(cfg: SpmdTrainer.Config, seed: int = 0):
    trainer = cfg.instantiate(parent=None)
    return trainer, trainer.run(jax.random.PRNGKey(seed))


def _by_step(records: list[dict]) -> dict[int, dict]:
    # On resume a step can appear twice; the later record wins.
    return {r["step"]: r for r in records}


# ----------------------------------------------------------------------------------------------
# Mesh.
# ----------------------------------------------------------------------------------------------


def test_select_mesh_config():
    cfg = tu.bigram_trainer_config("/tmp/unused")
    chain = ChainConfigModifier.default_config().set(
        config_modifiers=[
            MeshShapeModifier.default_config().set(mesh_shape=(2, 1, 4, 1)),
            GradientAccumulationModifier.default_config().set(grad_acc_steps=2),
        ]
    )
    cfg.mesh_rules = [
        ("tpu-v5litepod-.*", (1, 1, -1, 1)),
        ("gpu-.*-(64|128)", chain),
        ("tpu-v5.*", (-1, 1, 1, 1)),
        ("cpu-hybrid", HybridMeshShape(ici_mesh_shape=(1, 1, 4, 1), dcn_mesh_shape=(2, 1, 1, 1))),
    ]
    # First full match wins.
    assert select_mesh_config(cfg.clone(), mesh_selector="tpu-v5litepod-256").mesh_shape == (
        1,
        1,
        -1,
        1,
    )
    assert select_mesh_config(cfg.clone(), mesh_selector="tpu-v5p-1024").mesh_shape == (-1, 1, 1, 1)
    # Full match only: a prefix or suffix match does not count.
    unchanged = select_mesh_config(cfg.clone(), mesh_selector="xtpu-v5litepod-256")
    assert unchanged.mesh_shape == (1, 1, -1, 1) and unchanged.learner == cfg.learner
    assert select_mesh_config(cfg.clone(), mesh_selector="gpu-p5.48xlarge-32") == cfg
    # A modifier rule edits the whole config.
    modified = select_mesh_config(cfg.clone(), mesh_selector="gpu-p5.48xlarge-64")
    assert modified.mesh_shape == (2, 1, 4, 1)
    assert modified.learner.forward_fn_transformation is not None
    assert "grad_acc_steps" not in str(cfg.learner)
    hybrid = select_mesh_config(cfg.clone(), mesh_selector="cpu-hybrid").mesh_shape
    assert isinstance(hybrid, HybridMeshShape)
    # The hybrid shape builds a mesh (one granule here: ICI x DCN multiplied out).
    trainer = select_mesh_config(
        tu.bigram_trainer_config("/tmp/unused").set(mesh_rules=cfg.mesh_rules),
        mesh_selector="cpu-hybrid",
    ).instantiate(parent=None)
    assert dict(trainer.mesh().shape) == dict(data=2, expert=1, fsdp=4, model=1)


def test_select_mesh_config_rejects_bad_rule_value():
    cfg = tu.bigram_trainer_config("/tmp/unused").set(mesh_rules=[("cpu", "not a shape")])
    with pytest.raises(TypeError, match="mesh shape or a ConfigModifier"):
        select_mesh_config(cfg, mesh_selector="cpu")


@pytest.mark.parametrize(
    "mesh_shape,match",
    [
        ((1, 1, 3, -1), "not a multiple of the product 3"),
        ((1, -1, 1), "has 3 axes but mesh_axis_names"),
        ((1, 1, 16, 1), "needs 16 devices but there are 8"),
    ],
)
def test_mesh_shape_errors(mesh_shape, match):
    with pytest.raises(ValueError, match=match):
        tu.bigram_trainer_config("/tmp/unused", mesh_shape=mesh_shape).instantiate(parent=None)


def test_unknown_mesh_axis_in_partition_spec_names_the_parameter():
    cfg = tu.bigram_trainer_config("/tmp/unused").set(
        mesh_axis_names=("data", "expert", "fsdp", "tensor")
    )
    with pytest.raises(ValueError, match=r"'emb/weight' names mesh axis 'model'"):
        cfg.instantiate(parent=None)


# ----------------------------------------------------------------------------------------------
# Timing truth.
# ----------------------------------------------------------------------------------------------

EVAL_SLEEP = 2.0
CKPT_SLEEP = 2.5


def test_timing_truth(tmp_path):
    """Known eval/checkpoint sleeps appear as exactly those steps' overheads, not neighbours'."""
    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=12)
    sleepy_eval = tu.SleepyEvaler.default_config().set(
        input=cfg.evalers["val"].input,
        sleep_seconds=EVAL_SLEEP,
        eval_policy=config_for_function(every_n_steps_policy).set(n=5),
    )
    cfg.evalers = {"val": sleepy_eval}
    cfg.checkpointer = tu.SleepyCheckpointer.default_config().set(sleep_seconds=CKPT_SLEEP)
    cfg.checkpointer.save_policy.n = 7
    _run(cfg)
    records = _by_step(tu.read_metrics(str(tmp_path)))
    assert sorted(records) == list(range(1, 13))
    wall = {s: r["perf/step_time_s"] for s, r in records.items()}

    def overhead(step, kind):
        return records[step].get(f"perf/overhead/{kind}", 0.0)

    # Step 1 carries the compile time and is labelled.
    assert overhead(1, "compile") > 0 and records[1]["excluded_reason"] == "compile"
    assert wall[1] >= overhead(1, "compile")
    # The sleeps land on their steps (within 10%), and those steps are labelled.
    for step in (5, 10):
        assert EVAL_SLEEP <= overhead(step, "eval") <= 1.1 * EVAL_SLEEP, records[step]
        assert records[step]["excluded_reason"] == "eval"
        assert wall[step] >= EVAL_SLEEP
    assert CKPT_SLEEP <= overhead(7, "checkpoint") <= 1.1 * CKPT_SLEEP, records[7]
    assert records[7]["excluded_reason"] == "checkpoint"
    assert wall[7] >= CKPT_SLEEP
    # No other step carries eval/checkpoint time.
    for step in set(records) - {5, 7, 10}:
        assert overhead(step, "eval") == 0 and overhead(step, "checkpoint") == 0, records[step]
    # Neighbours do not inherit the sleeps: they stay within the noise of the plain steps.
    plain = [wall[s] for s in (2, 3, 12)]
    noise = max(plain) + 0.5
    for step in (4, 6, 8, 9, 11):
        assert wall[step] < min(noise, EVAL_SLEEP / 2), (step, wall)
    # A slept step's wall time is the sleep plus an ordinary step (not two sleeps, not less).
    for step, sleep in ((5, EVAL_SLEEP), (7, CKPT_SLEEP), (10, EVAL_SLEEP)):
        assert wall[step] - sleep < noise, (step, wall)
    # The run summary averages only the plain steps and says which were excluded.
    summary = json.load(open(os.path.join(tmp_path, "run_summary.json")))
    excluded = summary["steps"]["excluded"]
    assert excluded == {"compile": [1], "eval": [5, 10], "checkpoint": [7]}
    avg = summary["metrics"]["avg_step_s"]["value"]
    expected = statistics.mean(wall[s] for s in records if s not in (1, 5, 7, 10))
    assert avg == pytest.approx(expected, rel=1e-6)


# ----------------------------------------------------------------------------------------------
# Non-finite values.
# ----------------------------------------------------------------------------------------------


def _poisoned(cfg, batches):
    cfg.input = tu.PoisonedFakeLmInput.default_config().set(
        **{k: v for k, v in cfg.input.items() if k not in ("klass",)}, poison_batches=batches
    )
    return cfg


def test_nonfinite_loss_stops_and_is_never_checkpointed(tmp_path):
    # Batch index 3 is step 4's batch.
    cfg = _poisoned(tu.bigram_trainer_config(str(tmp_path), max_step=8, checkpoint_every=1), [3])
    with pytest.raises(NonFiniteLossError, match=r"Step 4: the loss is nan"):
        _run(cfg)
    ckpt_dir = os.path.join(tmp_path, "checkpoints")
    saved = sorted(d for d in os.listdir(ckpt_dir) if d.startswith("step_"))
    assert saved == ["step_00000001", "step_00000002", "step_00000003"]


def test_nonfinite_steps_are_skipped_and_counted(tmp_path):
    cfg = _poisoned(
        tu.bigram_trainer_config(str(tmp_path), max_step=6, skip_nonfinite=True), [1, 3]
    )
    trainer, out = _run(cfg)
    assert out["step"] == 6
    records = _by_step(tu.read_metrics(str(tmp_path)))
    assert np.isnan(float(records[2]["loss"])) and np.isnan(float(records[4]["loss"]))
    counts = {k: v for k, v in records[6].items() if k.endswith("nonvalid_count")}
    assert list(counts.values()) == [2], records[6]
    assert records[6]["perf/nonfinite_steps"] == 2 and records[6]["perf/skipped_steps"] == 2
    leaves = jax.tree.leaves(trainer.trainer_state.model)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)


# ----------------------------------------------------------------------------------------------
# Resume, outputs.
# ----------------------------------------------------------------------------------------------


def test_resume_matches_uninterrupted_run(tmp_path):
    full_dir, resumed_dir = str(tmp_path / "full"), str(tmp_path / "resumed")
    _, full = _run(tu.bigram_trainer_config(full_dir, max_step=8))
    _run(tu.bigram_trainer_config(resumed_dir, max_step=5, checkpoint_every=5))
    _, resumed = _run(tu.bigram_trainer_config(resumed_dir, max_step=8, checkpoint_every=5))
    assert resumed["step"] == 8
    full_losses = {r["step"]: r["loss"] for r in tu.read_metrics(full_dir)}
    resumed_records = _by_step(tu.read_metrics(resumed_dir))
    for step in range(1, 9):
        np.testing.assert_allclose(resumed_records[step]["loss"], full_losses[step], rtol=1e-6)
    # A run whose latest checkpoint is at max_step does nothing.
    _, again = _run(tu.bigram_trainer_config(resumed_dir, max_step=5, checkpoint_every=5))
    assert again is None


def test_saves_on_cpu_reference_the_state_and_change_nothing(tmp_path):
    """On CPU a save references the state (no copy) and the next step does not donate it.

    A run saving every step must match a run without saves bit for bit, and each checkpoint must
    hold its step's state: the non-donating step after a save may not differ numerically, nor
    overwrite the arrays the background write is still reading.
    """
    plain_dir, saving_dir = str(tmp_path / "plain"), str(tmp_path / "saving")
    plain, _ = _run(tu.bigram_trainer_config(plain_dir, max_step=4))
    saving_cfg = tu.bigram_trainer_config(saving_dir, max_step=4, checkpoint_every=1)
    saving, _ = _run(saving_cfg)
    assert saving._checkpoints.saves_alias_state()  # pylint: disable=protected-access
    plain_losses = [r["loss"] for r in tu.read_metrics(plain_dir)]
    assert [r["loss"] for r in tu.read_metrics(saving_dir)] == plain_losses
    for a, b in zip(
        jax.tree.leaves(plain.trainer_state), jax.tree.leaves(saving.trainer_state), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Restoring step 2 and training 2 more steps reproduces the same final state.
    resumed_dir = str(tmp_path / "resumed")
    import shutil  # pylint: disable=import-outside-toplevel

    shutil.copytree(saving_dir, resumed_dir)
    for step in (3, 4):
        shutil.rmtree(os.path.join(resumed_dir, "checkpoints", f"step_{step:08d}"))
    os.remove(os.path.join(resumed_dir, "metrics.jsonl"))
    resumed, _ = _run(tu.bigram_trainer_config(resumed_dir, max_step=4))
    assert [r["loss"] for r in tu.read_metrics(resumed_dir)] == plain_losses[2:]
    for a, b in zip(
        jax.tree.leaves(plain.trainer_state), jax.tree.leaves(resumed.trainer_state), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_outputs_tensorboard_jsonl_and_summary(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=6, eval_every=3)
    cfg.summary_writer.write_every_n_steps = 2
    _, out = _run(cfg)
    records = tu.read_metrics(str(tmp_path))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for r in records:
        for key in ("loss", "perf/step_time_s", "perf/tokens_per_s_per_device", "perf/mfu"):
            assert key in r, (key, r)
    assert out["loss"] == pytest.approx(records[-1]["loss"])
    acc = event_accumulator.EventAccumulator(os.path.join(tmp_path, "summaries", "train_train"))
    acc.Reload()
    tags = acc.Tags()["scalars"] + acc.Tags()["tensors"]
    assert "loss" in tags and "perf/step_time_s" in tags
    key = "loss" if "loss" in acc.Tags()["scalars"] else None
    if key:
        steps = [e.step for e in acc.Scalars(key)]
    else:
        steps = [e.step for e in acc.Tensors("loss")]
    assert steps == [2, 4, 6]
    # Eval summaries under summaries/val.
    assert os.listdir(os.path.join(tmp_path, "summaries", "val"))
    summary = json.load(open(os.path.join(tmp_path, "run_summary.json")))
    assert summary["metrics"]["parameters"]["value"] == 64 * 32 + 32 * 32 + 32
    assert summary["metrics"]["final_loss"]["value"] == pytest.approx(records[-1]["loss"])
    assert summary["environment"]["jax_version"] == jax.__version__


@pytest.mark.parametrize(
    "mesh_shape,global_batch_size",
    [
        ((1, 1, 8, 1), 4),  # Per-device batch 1/2: replicated over fsdp.
        ((2, 1, 4, 1), 2),  # Per-device batch 1/4: sharded over data only.
    ],
)
def test_per_device_batch_below_one(tmp_path, mesh_shape, global_batch_size):
    """A global batch smaller than the device count trains exactly like on one device."""
    one = tu.bigram_trainer_config(
        str(tmp_path / "one"), max_step=3, global_batch_size=global_batch_size
    )
    one_trainer = one.instantiate(
        parent=None, devices=np.array(jax.devices()[:1]).reshape(1, 1, 1, 1)
    )
    one_out = one_trainer.run(jax.random.PRNGKey(1))
    cfg = tu.bigram_trainer_config(
        str(tmp_path / "many"),
        max_step=3,
        global_batch_size=global_batch_size,
        mesh_shape=mesh_shape,
    )
    _, out = _run(cfg, seed=1)
    expected = [r["loss"] for r in tu.read_metrics(str(tmp_path / "one"))]
    actual = [r["loss"] for r in tu.read_metrics(str(tmp_path / "many"))]
    np.testing.assert_allclose(actual, expected, rtol=1e-5)
    assert out["step"] == one_out["step"] == 3


# ----------------------------------------------------------------------------------------------
# The reference dump.
# ----------------------------------------------------------------------------------------------

REFERENCE = os.path.join(
    os.path.dirname(os.path.dirname(__file__)),
    "testdata",
    "trainer",
    "honeycrisp_trainer_config.txt",
)


def _select(lines: list[str]) -> list[str]:
    """Top-level, mesh_*, batch_axis_names, summary_writer. and evalers[...] (not .input.)."""
    keep = []
    for line in lines:
        key = line.split(": ", 1)[0]
        if key.startswith("evalers["):
            if ".input." not in key:
                keep.append(line)
        elif key.startswith(("mesh_", "batch_axis_names", "summary_writer.")) or (
            "." not in key and "[" not in key
        ):
            keep.append(line)
    return keep


def reference_trainer_config() -> SpmdTrainer.Config:
    """The reference trainer's own fields, built from the real classes (see the dump)."""
    from axlearn.common import evaler

    cfg = SpmdTrainer.default_config().set(
        name="gpt_trainer",
        max_step=750000,
        mesh_axis_names=("pipeline", "data", "expert", "fsdp", "seq", "model"),
        mesh_shape=(1, -1, 1, 8, 1, 1),
        batch_axis_names=("data", "expert", "fsdp", "seq"),
        mesh_rules=[
            ("tpu-v4-256", (1, 1, 1, -1, 1, 1)),
            ("tpu-v5litepod-256", (1, -1, 1, 256, 1, 1)),
            (
                "gpu-(p5.48xlarge|p4de.24xlarge|a3-highgpu-8g)-(64|128|256|512|1024)",
                (1, -1, 1, 8, 1, 1),
            ),
            ("gpu-p4d.24xlarge-256", (1, -1, 1, 8, 1, 1)),
            ("tpu-v5p-(1024|2048|4096)", (1, -1, 1, 1, 1, 1)),
        ],
        save_input_iterator=True,
        train_dtype=jnp.bfloat16,
    )
    cfg.summary_writer.set(max_queue=1000, write_every_n_steps=100)
    ev = evaler.SpmdEvaler.default_config().set(eval_dtype=jnp.bfloat16)
    ev.eval_policy.set(n=25000, max_step=750000)
    cfg.evalers["openwebtext_2"] = ev
    return cfg


def test_reference_trainer_lines():
    with open(REFERENCE, encoding="utf-8") as f:
        expected = _select(f.read().splitlines())
    actual = _select(reference_trainer_config().debug_string().splitlines())
    assert len(expected) == 71
    assert actual == expected


def test_profiler_trace_and_watchdog(tmp_path, caplog):
    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=7)
    cfg.set(start_trace_steps=[2], watchdog_timeout_seconds=1.0)
    cfg.checkpointer = tu.SleepyCheckpointer.default_config().set(sleep_seconds=3.0)
    cfg.checkpointer.save_policy.n = 6
    with caplog.at_level("WARNING"):
        _run(cfg)
    records = _by_step(tu.read_metrics(str(tmp_path)))
    # The trace covers steps 2-4: starting it is charged to step 1's interval (before step 2 is
    # dispatched), stopping it to step 4's.
    assert records[1].get("perf/overhead/profiler", 0) > 0
    assert records[4].get("perf/overhead/profiler", 0) > 0
    assert records[4]["excluded_reason"] == "profiler"
    profile_dir = os.path.join(tmp_path, "summaries", "train_train", "plugins", "profile")
    assert os.listdir(profile_dir)
    # The 3 s checkpoint stalls the step for longer than the watchdog's 1 s: it logs the stacks.
    messages = [r.getMessage() for r in caplog.records]
    assert any("Watchdog: step 6 has not advanced" in m and "Thread stacks" in m for m in messages)


def test_ignore_undefined_loss_learner_skips_nan_steps_and_the_run_goes_on(tmp_path):
    """A learner with `ignore_undefined_loss=True` (AXLearn's `handles_undefined_loss`): the
    trainer does not stop at a NaN loss; the skipped step leaves the parameters finite."""
    cfg = _poisoned(tu.bigram_trainer_config(str(tmp_path), max_step=5), [2])
    cfg.learner.ignore_undefined_loss = True
    trainer, out = _run(cfg)
    assert out["step"] == 5
    records = _by_step(tu.read_metrics(str(tmp_path)))
    assert np.isnan(float(records[3]["loss"])) and np.isfinite(float(records[5]["loss"]))
    assert records[5]["perf/nonfinite_steps"] == 1
    leaves = jax.tree.leaves(trainer.trainer_state.model)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)


# ----------------------------------------------------------------------------------------------
# AXLearn's fields, files and outputs.
# ----------------------------------------------------------------------------------------------


def test_context_manager_wraps_init_compile_and_every_step(tmp_path):
    events = []
    steps_seen = []

    class _Context:
        def __enter__(self):
            events.append("enter")

        def __exit__(self, *exc):
            events.append("exit")

    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=3)
    cfg.context_manager = _Context
    trainer = cfg.instantiate(parent=None)
    original = trainer._dispatch_train_step

    def dispatch(batch):
        steps_seen.append((trainer.step, events.count("enter") - events.count("exit")))
        return original(batch)

    trainer._dispatch_train_step = dispatch
    out = trainer.run(jax.random.PRNGKey(0))
    assert out["step"] == 3
    # Every step was dispatched inside the context (depth >= 1); it was left at the end.
    assert [s for s, _ in steps_seen] == [1, 2, 3] and all(d >= 1 for _, d in steps_seen)
    assert events[0] == "enter" and events[-1] == "exit"
    assert events.count("enter") == events.count("exit")


def test_run_output_loss_keeps_the_step_dtype_and_fresh_start_files(tmp_path):
    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=2)
    trainer, out = _run(cfg)
    assert out["loss"].dtype == np.float32 and float(out["loss"]) == out["record"]["loss"]
    # The final step's aux outputs (the model's), as AXLearn's run returns them.
    batch = tu.bigram_trainer_config(str(tmp_path)).input.global_batch_size
    assert (
        set(out["aux"]) == {"num_targets"} and 0 < int(out["aux"]["num_targets"]) <= batch * tu.SEQ
    )
    with open(os.path.join(tmp_path, "trainer_state_tree.txt"), encoding="utf-8") as f:
        tree = f.read()
    assert tree.startswith("PyTreeDef(CustomNode(namedtuple[TrainerState], [*, ")
    assert tree.strip() == str(jax.tree_util.tree_structure(trainer.trainer_state))
    with open(os.path.join(tmp_path, "model_analysis.txt"), encoding="utf-8") as f:
        assert f.read().startswith("Model parameters: ")


def test_save_checkpoint_follows_the_policy(tmp_path):
    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=2, checkpoint_every=1)
    trainer, _ = _run(cfg)
    ckpt_dir = os.path.join(tmp_path, "checkpoints")
    before = sorted(os.listdir(ckpt_dir))
    trainer.save_checkpoint(None)  # Step 2 is saved already: the policy does not save twice.
    trainer.checkpointer.wait_until_finished()
    assert sorted(os.listdir(ckpt_dir)) == before
    assert "step_00000002" in before


def test_xsc_check_policy_is_ignored_with_a_warning_off_tpu(tmp_path, caplog):
    calls = []
    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=3)
    cfg.xsc_check_policy = lambda step: calls.append(step) or True
    trainer, out = _run(cfg)
    assert out["step"] == 3 and calls == []  # Never asked: no checker on CPU.
    assert "xsc_check_policy is set, but XLA's silent-data-corruption checker runs only on TPU" in (
        caplog.text
    )
    assert trainer._xsc.checked_steps == []
