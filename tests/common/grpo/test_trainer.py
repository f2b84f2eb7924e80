"""Tests axlearn/common/grpo/trainer.py on a tiny copy-task run (2 prompts x 4 samples).

One module fixture trains 4 steps (checkpoints at 2 and 4, events recorded for goodput) and a
second trainer resumes a copy of its directory from step 2; the tests read both. Each trainer
compiles its rollout, reference and training programs: seconds alone, more on a loaded machine.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from axlearn.common import goodput, measurement, measurement_local, utils
from axlearn.common.grpo import GrpoTrainer, RewardError, RewardFunction
from axlearn.common.grpo.copy_task import EOS_ID, PAD_ID
from axlearn.common.lora_config_modifier import LoraConfigModifier
from axlearn.common.module import functional
from axlearn.experiments.text.gpt.grpo_copy import grpo_copy_trainer_config

pytestmark = pytest.mark.slow

STEPS = 4


def raising_reward(*, prompt, completion, example):
    """Fails on every sample."""
    raise ZeroDivisionError("division by zero")


def _config(trainer_dir: str, **kwargs) -> GrpoTrainer.Config:
    cfg = grpo_copy_trainer_config(
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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    run_dir = str(root / "run")
    recorder = measurement_local.LocalRecorder.default_config().set(
        name="grpo", dir=os.path.join(run_dir, "events"), file_label="process_0"
    )
    measurement.global_recorder = recorder.instantiate()
    try:
        measurement.record_event(measurement.Event.START_JOB)
        trainer = _config(run_dir).instantiate(parent=None)
        trainer.restore_or_init(jax.random.PRNGKey(0))
        initial = _leaves(trainer.trainer_state["model"])  # Host copies (the state is donated).
        records = trainer.run()
        measurement.record_event(measurement.Event.END_JOB)
    finally:
        measurement.global_recorder = None
    # Resume a copy of the run from its step-2 checkpoint.
    resumed_dir = str(root / "resumed")
    shutil.copytree(run_dir, resumed_dir, ignore=shutil.ignore_patterns("events", "metrics.jsonl"))
    shutil.rmtree(os.path.join(resumed_dir, "checkpoints", "step_00000004"))
    resumed = _config(resumed_dir).instantiate(parent=None)
    resumed_records = resumed.run()
    return dict(
        trainer=trainer,
        initial=initial,
        records=records,
        run_dir=run_dir,
        resumed=resumed,
        resumed_records=resumed_records,
    )


def _leaves(tree):
    return dict(utils.flatten_items(jax.device_get(tree)))


def test_rollouts_are_bit_identical_under_a_fixed_key(runs):
    trainer = runs["trainer"]
    state = trainer.trainer_state
    prefix = trainer.prompts.batch(0)["prefix"]
    rollout = jax.jit(trainer.rollout)
    key = jax.random.PRNGKey(5)
    first = np.asarray(rollout(state["model"], key, prefix))
    np.testing.assert_array_equal(first, np.asarray(rollout(state["model"], key, prefix)))
    other = np.asarray(rollout(state["model"], jax.random.PRNGKey(6), prefix))
    assert not np.array_equal(first, other)
    # [prompts * group, P + T]: each row starts with its prompt; after an EOS only padding.
    assert first.shape == (2 * 4, prefix.shape[1] + 3)
    np.testing.assert_array_equal(first[:, : prefix.shape[1]], np.repeat(prefix, 4, axis=0))
    for row in first[:, prefix.shape[1] :]:
        eos = np.nonzero(row == EOS_ID)[0]
        if eos.size:
            assert (row[eos[0] + 1 :] == PAD_ID).all()
    mask = np.asarray(trainer.completion_mask(prefix, first))
    want = (np.arange(1, first.shape[1]) >= prefix.shape[1])[None] & (first[:, 1:] != PAD_ID)
    np.testing.assert_array_equal(mask, want.astype(np.float32))


def test_reference_log_probs_are_the_sampled_tokens_under_the_model(runs):
    """log_probs vs a NumPy log-softmax of the model's logits at temperature 1."""
    trainer = runs["trainer"]
    params = trainer.trainer_state["reference"]
    prefix = trainer.prompts.batch(0)["prefix"]
    ids = np.asarray(jax.jit(trainer.rollout)(params, jax.random.PRNGKey(1), prefix))
    got = np.asarray(jax.jit(trainer.log_probs)(params, ids))

    def predict(p, x):
        return functional(
            trainer.model,
            None,
            p,
            dict(input_batch=dict(input_ids=x)),
            method="predict",
            is_training=False,
        )

    outputs, _ = jax.jit(predict)(params, ids[:, :-1])
    logits = np.asarray(outputs["logits"], np.float64)
    logits -= logits.max(-1, keepdims=True)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = np.take_along_axis(log_softmax, ids[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_frozen_reference_is_untouched_after_training(runs):
    state = runs["trainer"].trainer_state
    initial = runs["initial"]
    reference = _leaves(state["reference"])
    assert reference.keys() == initial.keys()
    for path, value in initial.items():
        assert value.tobytes() == reference[path].tobytes(), path
    policy = _leaves(state["model"])
    assert any(not np.array_equal(policy[p], initial[p]) for p in initial)
    # The reference has no optimizer state: the learner's state mirrors only the policy.
    learner_paths = list(_leaves(state["learner"]))
    assert not any("reference" in p for p in learner_paths)


def test_resumed_run_repeats_the_losses(runs):
    records, resumed = runs["records"], runs["resumed_records"]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["step"] for r in resumed] == [3, 4]
    for a, b in zip(records[2:], resumed):
        for key in ("loss", "kl", "reward_mean", "policy_loss", "clip_fraction"):
            assert a[key] == b[key], (key, a[key], b[key])
    final, resumed_final = runs["trainer"].trainer_state, runs["resumed"].trainer_state
    for path, value in _leaves(final["model"]).items():
        np.testing.assert_array_equal(value, _leaves(resumed_final["model"])[path])


def test_metrics_invariants_and_jsonl(runs):
    records = runs["records"]
    with open(os.path.join(runs["run_dir"], "metrics.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    for record in records:
        phases = [record[k] for k in ("rollout_s", "reference_s", "train_s")]
        assert all(p >= 0 for p in phases)
        assert sum(phases) <= record["step_s"] + 1e-6
        assert record["other_s"] == pytest.approx(record["step_s"] - sum(phases), abs=1e-6)
        assert record["sampling_s"] + record["reward_s"] == pytest.approx(record["rollout_s"])
        assert 0 <= record["reward_mean"] <= 1 and 0 <= record["clip_fraction"] <= 1
        assert record["kl"] >= 0 and 0 <= record["completion_length"] <= 3
        assert np.isfinite(record["loss"])
    assert records[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # The policy starts at the reference.


def test_goodput_splits_productive_time_into_the_phases(runs):
    report = goodput.compute_goodput(runs["run_dir"])
    sub = report.productive_parts
    assert set(sub) == {"rollout", "reference", "training"}
    assert all(v >= 0 for v in sub.values())
    assert sum(sub.values()) == pytest.approx(report.parts["productive"], abs=1e-6)
    assert sum(report.parts.values()) == pytest.approx(report.wall_s, abs=1e-6)
    records = runs["records"]
    # The spans time the same code as the metrics (to the event clock's rounding).
    assert sub["rollout"] == pytest.approx(sum(r["rollout_s"] for r in records), abs=0.05)
    assert sub["reference"] == pytest.approx(sum(r["reference_s"] for r in records), abs=0.05)
    assert "reference log-probs" in goodput.format_goodput(report)


def test_a_raising_reward_stops_the_step_with_one_line(runs, monkeypatch):
    trainer = runs["trainer"]
    reward = RewardFunction.default_config().set(fn=f"{__name__}:raising_reward").instantiate()
    monkeypatch.setattr(trainer, "_reward", reward)
    with pytest.raises(RewardError) as e:
        trainer.train_step(trainer.prompts.batch(0))
    msg = str(e.value)
    assert msg.startswith("grpo_trainer.reward: the reward raised ZeroDivisionError")
    assert "sample 0 (prompt [1, " in msg and "\n" not in msg


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("group_size", 1, "grpo_trainer.group_size=1: must be an integer >= 2"),
        ("temperature", 0.0, "grpo_trainer.temperature=0.0: must be > 0"),
        ("kl_coef", -1.0, "grpo_trainer.kl_coef=-1.0: must be >= 0"),
    ],
)
def test_bad_fields_name_the_config_path(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        _config(str(tmp_path)).set(**{field: value}).instantiate(parent=None)


def test_lora_trains_only_adapters_and_keeps_the_reference(tmp_path):
    cfg = _config(str(tmp_path)).set(max_step=2)
    cfg = LoraConfigModifier.default_config().set(rank=2, alpha=4.0).instantiate()(cfg)
    trainer = cfg.instantiate(parent=None)
    trainer.restore_or_init(jax.random.PRNGKey(0))
    initial = _leaves(trainer.trainer_state["model"])
    records = trainer.run()
    assert len(records) == 2 and all(np.isfinite(r["loss"]) for r in records)
    state = trainer.trainer_state
    policy, reference = _leaves(state["model"]), _leaves(state["reference"])
    changed = {p for p in initial if not np.array_equal(policy[p], initial[p])}
    assert changed and all("/adapter/" in p for p in changed)
    assert all(initial[p].tobytes() == reference[p].tobytes() for p in initial)
