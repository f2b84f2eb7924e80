"""Tests axlearn/common/grpo/rollout.py: GRPO in SpmdTrainer (the `grpo-copy-digits` config).

Fast: PromptInput's position and bad configs. Slow: one module fixture trains a tiny run for 4
steps (checkpoints at 2 and 4, events recorded for goodput) and a second trainer resumes a copy
of its directory from step 2; the tests read both.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from axlearn.common import goodput, measurement, measurement_local, utils
from axlearn.common.grpo import RewardError, RewardFunction
from axlearn.common.grpo.copy_task import EOS_ID, PAD_ID, CopyDigitsPrompts
from axlearn.common.grpo.rollout import PromptInput
from axlearn.experiments.text.gpt.post_training import grpo_trainer_config

STEPS = 4


def raising_reward(*, prompt, completion, example):
    """Fails on every sample."""
    raise ZeroDivisionError("division by zero")


def nan_reward(*, prompt, completion, example):
    """Returns NaN for every sample."""
    return float("nan")


def _config(trainer_dir: str, **kwargs):
    cfg = grpo_trainer_config(
        max_step=STEPS,
        num_prompts=2,
        group_size=4,
        num_digits=2,
        model_dim=32,
        num_layers=1,
        checkpoint_every_n_steps=2,
        **kwargs,
    ).set(dir=trainer_dir)
    cfg.checkpointer.keep_last_n = 10
    return cfg


def _records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _leaves(tree):
    return dict(utils.flatten_items(jax.device_get(tree)))


def test_prompt_input_position_round_trips():
    source = CopyDigitsPrompts.default_config().set(num_prompts=2, num_digits=2)
    inp = PromptInput.default_config().set(name="input", source=source).instantiate(parent=None)
    it = iter(inp)
    first = [next(it) for _ in range(3)]
    np.testing.assert_array_equal(first[2]["prefix"], source.instantiate().batch(2)["prefix"])
    state = inp.iterator_state(it)
    want = next(it)
    resumed = inp.restore_iterator(state)
    np.testing.assert_array_equal(next(resumed)["target"], want["target"])
    spec = inp.element_spec()
    assert spec["prefix"].shape == (2, 4) and spec["target"].shape == (2, 2)


def test_prompt_input_without_batch_method():
    cfg = PromptInput.default_config().set(
        name="input", source=RewardFunction.default_config().set(fn=f"{__name__}:nan_reward")
    )
    with pytest.raises(ValueError, match=r"^input.source: RewardFunction has no batch\(index\)"):
        cfg.instantiate(parent=None)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("group_size", 1, r"^grpo_trainer.batch_processor.group_size=1: must be an integer >= 2"),
        ("max_new_tokens", 0, r"^grpo_trainer.batch_processor.max_new_tokens=0: must be"),
    ],
)
def test_bad_fields_name_the_config_path(tmp_path, field, value, message):
    cfg = _config(str(tmp_path))
    cfg.batch_processor.set(**{field: value})
    with pytest.raises(ValueError, match=message):
        cfg.instantiate(parent=None)


def test_a_model_without_rollout_methods_is_refused(tmp_path):
    cfg = _config(str(tmp_path))
    cfg.model = cfg.model.policy
    with pytest.raises(
        ValueError, match=r"^grpo_trainer.batch_processor: the trainer's model Model has no "
    ):
        cfg.instantiate(parent=None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_spmd")
    run_dir = str(root / "run")
    recorder = measurement_local.LocalRecorder.default_config().set(
        name="grpo", dir=os.path.join(run_dir, "events"), file_label="process_0"
    )
    measurement.global_recorder = recorder.instantiate()
    try:
        measurement.record_event(measurement.Event.START_JOB)
        trainer = _config(run_dir).instantiate(parent=None)
        trainer.run(jax.random.PRNGKey(0))
        measurement.record_event(measurement.Event.END_JOB)
    finally:
        measurement.global_recorder = None
    fresh = _config(str(root / "fresh")).instantiate(parent=None)
    fresh.init(jax.random.PRNGKey(0))
    initial = _leaves(fresh.trainer_state.model["policy"])
    # Resume a copy of the run from its step-2 checkpoint.
    resumed_dir = str(root / "resumed")
    shutil.copytree(run_dir, resumed_dir, ignore=shutil.ignore_patterns("events", "metrics.jsonl"))
    shutil.rmtree(os.path.join(resumed_dir, "checkpoints", "step_00000004"))
    resumed = _config(resumed_dir).instantiate(parent=None)
    resumed.run(jax.random.PRNGKey(0))
    return dict(
        trainer=trainer,
        initial=initial,
        records=_records(os.path.join(run_dir, "metrics.jsonl")),
        run_dir=run_dir,
        resumed=resumed,
        resumed_records=_records(os.path.join(resumed_dir, "metrics.jsonl")),
    )


@pytest.mark.slow
def test_rollouts_are_bit_identical_under_a_fixed_key(runs):
    trainer = runs["trainer"]
    processor = trainer.batch_processor
    params = trainer.trainer_state.model
    prefix = trainer.input.source.batch(0)["prefix"]
    sample = jax.jit(processor.sample)
    key = jax.random.PRNGKey(5)
    first = np.asarray(sample(params, key, prefix))
    np.testing.assert_array_equal(first, np.asarray(sample(params, key, prefix)))
    assert not np.array_equal(first, np.asarray(sample(params, jax.random.PRNGKey(6), prefix)))
    # [prompts * group, P + T]: each row starts with its prompt; after an EOS only padding.
    assert first.shape == (2 * 4, prefix.shape[1] + 3)
    np.testing.assert_array_equal(first[:, : prefix.shape[1]], np.repeat(prefix, 4, axis=0))
    for row in first[:, prefix.shape[1] :]:
        eos = np.nonzero(row == EOS_ID)[0]
        if eos.size:
            assert (row[eos[0] + 1 :] == PAD_ID).all()


@pytest.mark.slow
def test_the_frozen_reference_is_untouched_after_training(runs):
    model = runs["trainer"].trainer_state.model
    initial = runs["initial"]
    reference = _leaves(model["reference"])
    assert reference.keys() == initial.keys()
    for path, value in initial.items():
        assert value.tobytes() == reference[path].tobytes(), path
    policy = _leaves(model["policy"])
    assert any(not np.array_equal(policy[p], initial[p]) for p in initial)
    learner_paths = list(_leaves(runs["trainer"].trainer_state.learner))
    assert learner_paths and not any("reference" in p for p in learner_paths)


@pytest.mark.slow
def test_resumed_run_repeats_the_losses(runs):
    records, resumed = runs["records"], runs["resumed_records"]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["step"] for r in resumed] == [3, 4]
    for a, b in zip(records[2:], resumed):
        for key in ("loss", "model/kl", "model/reward_mean", "model/policy_loss"):
            assert a[key] == b[key], (key, a[key], b[key])
    final, resumed_final = runs["trainer"].trainer_state, runs["resumed"].trainer_state
    for path, value in _leaves(final.model).items():
        np.testing.assert_array_equal(value, _leaves(resumed_final.model)[path])


@pytest.mark.slow
def test_step_time_split_in_the_summaries(runs):
    for record in runs["records"]:
        phases = [record[f"grpo/{k}_seconds"] for k in ("rollout", "reference", "training")]
        assert all(p >= 0 for p in phases)
        assert sum(phases) <= record["perf/step_time_s"] + 1e-6, record
        assert record["grpo/sampling_seconds"] + record["grpo/reward_seconds"] == pytest.approx(
            record["grpo/rollout_seconds"]
        )
        assert record["grpo/rollout_tokens_per_s"] > 0
        assert 0 <= record["model/reward_mean"] <= 1 and 0 <= record["model/clip_fraction"] <= 1
        assert record["model/kl"] >= 0 and np.isfinite(record["loss"])
    # The policy starts at the reference.
    assert runs["records"][0]["model/kl"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow
def test_goodput_splits_productive_time_into_the_phases(runs):
    report = goodput.compute_goodput(runs["run_dir"])
    sub = report.productive_parts
    assert set(sub) == {"rollout", "reference", "training"}
    assert all(v >= 0 for v in sub.values()) and sub["training"] > 0
    assert sum(sub.values()) == pytest.approx(report.parts["productive"], abs=1e-6)
    assert sum(report.parts.values()) == pytest.approx(report.wall_s, abs=1e-6)
    records = runs["records"]
    # The spans time the same code as the summaries (to the event clock's rounding).
    assert sub["rollout"] == pytest.approx(
        sum(r["grpo/rollout_seconds"] for r in records), abs=0.05
    )
    assert sub["reference"] == pytest.approx(
        sum(r["grpo/reference_seconds"] for r in records), abs=0.05
    )
    assert "reference log-probs" in goodput.format_goodput(report)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fn,message",
    [
        ("raising_reward", "the reward raised ZeroDivisionError: division by zero on sample 0"),
        ("nan_reward", "the reward returned nan on sample 0"),
    ],
)
def test_a_bad_reward_stops_the_step_with_one_line(runs, fn, message):
    trainer = runs["trainer"]
    processor = trainer.batch_processor
    reward = RewardFunction.default_config().set(fn=f"{__name__}:{fn}").instantiate()
    processor._reward = reward  # pylint: disable=protected-access
    try:
        with pytest.raises(RewardError) as e:
            processor.process(trainer.input.source.batch(0), trainer_state=trainer.trainer_state)
    finally:
        processor._reward = trainer.config.batch_processor.reward.instantiate()
    msg = str(e.value)
    assert msg.startswith(f"grpo_trainer.batch_processor.reward: {message}"), msg
    assert "(prompt [1, " in msg and "\n" not in msg
