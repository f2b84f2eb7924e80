"""Tests of axlearn/experiments/vision/resnet/imagenet_trainer.py: the tutorial's trainer."""

import math
import os

import jax
import numpy as np
import pytest

from axlearn.common import utils
from axlearn.experiments.vision.resnet import imagenet_trainer
from axlearn.vision import input_image


def test_named_configs_follow_the_tutorial():
    configs = imagenet_trainer.named_trainer_configs()
    assert {"ResNet-Test", "ResNet-18", "ResNet-34", "ResNet-50", "ResNet-101"} <= set(configs)
    cfg = configs["ResNet-50"]()
    # 1,281,167 examples / 1024 per batch = 1251 steps per epoch.
    assert cfg.max_step == 1251 * 90 == 112_590
    assert cfg.checkpointer.save_policy.n == cfg.checkpointer.keep_every_n_steps == 12_510
    assert cfg.summary_writer.write_every_n_steps == 100
    assert cfg.input.klass is input_image.ImagenetInput and cfg.input.is_training
    assert cfg.input.source.split == "train" and cfg.input.batcher.global_batch_size == 1024
    lr = cfg.learner.optimizer.learning_rate
    assert (lr.peak_lr, lr.warmup_steps) == (0.4, 6_255)
    assert cfg.learner.optimizer.weight_decay_per_param_scale.scale_by_path == [(".*norm.*", 0)]
    for name, split in (("eval_train", "train[:50000]"), ("eval_validation", "validation")):
        evaler = cfg.evalers[name]
        assert evaler.input.source.split == split and not evaler.input.is_training
        assert evaler.input.source.train_shuffle_buffer_size == 0
        assert evaler.eval_policy.n == 12_510
    assert cfg.model.backbone.num_blocks_per_stage == [3, 4, 6, 3]


@pytest.mark.slow
def test_resnet50_config_trains_with_fake_images(tmp_path):
    """The tutorial's ResNet-50 trainer (shrunk) trains 3 steps on 8 CPU devices with FAKE data."""
    cfg = imagenet_trainer.named_trainer_configs()["ResNet-50"]()
    max_step = 3
    cfg.set(dir=str(tmp_path), max_step=max_step)
    cfg.model.backbone.set(hidden_dim=4, num_blocks_per_stage=[1, 1])
    inputs = [cfg.input] + [e.input for e in cfg.evalers.values()]
    for input_cfg in inputs:
        input_cfg.processor.image_size = (16, 16)
        input_cfg.batcher.global_batch_size = 8
    for evaler in cfg.evalers.values():
        evaler.eval_policy.n = max_step
    cfg.learner.optimizer.learning_rate.set(max_step=max_step, warmup_steps=1)
    cfg.checkpointer.save_policy.n = max_step
    assert jax.device_count() == 8
    with utils.set_data_dir("FAKE"):
        trainer = cfg.instantiate(parent=None)
        output = trainer.run(jax.random.PRNGKey(0))
    loss = float(output["loss"])
    # Near-uniform initial predictions over 1000 classes: cross entropy close to ln(1000).
    assert abs(loss - math.log(1000)) < 0.5, loss
    assert os.path.isdir(os.path.join(str(tmp_path), "checkpoints", "step_00000003"))
    for name in cfg.evalers:
        assert os.listdir(os.path.join(str(tmp_path), "summaries", name))
    assert np.isfinite(loss)
