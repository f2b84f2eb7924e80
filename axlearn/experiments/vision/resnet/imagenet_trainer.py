"""ResNet on ImageNet trainer configs (the getting-started tutorial's experiment).

Train the tiny test config locally on CPU with fake images:

    python3 -m axlearn.common.launch_trainer_main \
        --module=vision.resnet.imagenet_trainer --config=ResNet-Test \
        --trainer_dir=/tmp/resnet_test --data_dir=FAKE --jax_backend=cpu

Launch ResNet-50 on a TPU, reading TFDS ImageNet from --data_dir (see docs/vision.md):

    axlearn gcp launch --instance_type=tpu-v4-8 --output_dir=$OUTPUT_DIR -- \
        python3 -m axlearn.common.launch_trainer_main \
        --module=vision.resnet.imagenet_trainer --config=ResNet-50 \
        --trainer_dir=$OUTPUT_DIR --data_dir=$DATA_DIR --jax_backend=tpu
"""

from typing import Optional

import jax.numpy as jnp

from axlearn.common import checkpointer, config, evaler, schedule
from axlearn.common.config import TrainerConfigFn
from axlearn.common.evaler import SpmdEvaler
from axlearn.common.trainer import SpmdTrainer
from axlearn.experiments.vision import imagenet
from axlearn.experiments.vision.resnet.common import learner_config, model_config
from axlearn.vision import resnet

# Training epochs, and epochs between evaluations and between checkpoints.
_EPOCHS = 90
_WARMUP_EPOCHS = 5
_EVAL_AND_CHECKPOINT_EVERY_EPOCHS = 10


def _get_config_fn(
    backbone: resnet.ResNet.Config,
    *,
    train_batch_size: int,
    ema_decay: Optional[float] = None,
    compute_dtype: jnp.dtype = jnp.bfloat16,
) -> TrainerConfigFn:
    """Returns a function building the trainer config of `backbone` on ImageNet.

    The trainer trains 90 epochs (SGD, peak learning rate 0.1 per 256 examples, 5 epochs of
    linear warmup then cosine decay), evaluates "eval_train" (the first 50k training examples)
    and "eval_validation" every 10 epochs, checkpoints every 10 epochs (keeping those) and
    writes summaries every 100 steps.

    Args:
        backbone: The ResNet backbone config.
        train_batch_size: Global training batch size.
        ema_decay: If set, the learner keeps an EMA of the parameters.
        compute_dtype: Training and evaluation compute dtype.

    Returns:
        A TrainerConfigFn.
    """

    def config_fn() -> SpmdTrainer.Config:
        steps_per_epoch = imagenet.NUM_TRAIN_EXAMPLES // train_batch_size
        max_step = steps_per_epoch * _EPOCHS
        every_n = steps_per_epoch * _EVAL_AND_CHECKPOINT_EVERY_EPOCHS
        cfg = SpmdTrainer.default_config().set(
            name="resnet_imagenet",
            train_dtype=compute_dtype,
            max_step=max_step,
            # Data parallel over every device; convolution output channels may use "model".
            mesh_axis_names=("data", "model"),
            mesh_shape=(-1, 1),
        )
        cfg.model = model_config().set(backbone=backbone, num_classes=imagenet.NUM_CLASSES)
        cfg.input = imagenet.input_config(split="train", global_batch_size=train_batch_size)
        cfg.evalers = {}
        for name, split in (("eval_train", "train[:50000]"), ("eval_validation", "validation")):
            cfg.evalers[name] = SpmdEvaler.default_config().set(
                input=imagenet.input_config(split=split, global_batch_size=80),
                eval_policy=config.config_for_function(evaler.every_n_steps_policy).set(n=every_n),
                eval_dtype=compute_dtype,
            )
        cfg.learner = learner_config(
            learning_rate=config.config_for_function(schedule.cosine_with_linear_warmup).set(
                peak_lr=0.1 * train_batch_size / 256,
                max_step=max_step,
                warmup_steps=steps_per_epoch * _WARMUP_EPOCHS,
            ),
            ema_decay=ema_decay,
        )
        cfg.checkpointer.save_policy = config.config_for_function(
            checkpointer.every_n_steps_policy
        ).set(n=every_n)
        cfg.checkpointer.keep_every_n_steps = every_n
        cfg.summary_writer.write_every_n_steps = 100
        return cfg

    return config_fn


def named_trainer_configs() -> dict[str, TrainerConfigFn]:
    """The ResNet trainer configs by name ("ResNet-Test" is a tiny one for CPU tests)."""
    return {
        "ResNet-Test": _get_config_fn(
            resnet.ResNet.resnet18_config().set(hidden_dim=4, num_blocks_per_stage=[]),
            train_batch_size=8,
        ),
        "ResNet-18": _get_config_fn(resnet.ResNet.resnet18_config(), train_batch_size=1024),
        "ResNet-34": _get_config_fn(resnet.ResNet.resnet34_config(), train_batch_size=1024),
        "ResNet-50": _get_config_fn(resnet.ResNet.resnet50_config(), train_batch_size=1024),
        "ResNet-50-ema": _get_config_fn(
            resnet.ResNet.resnet50_config(), train_batch_size=1024, ema_decay=0.9999
        ),
        "ResNet-101": _get_config_fn(resnet.ResNet.resnet101_config(), train_batch_size=1024),
        "ResNet-152": _get_config_fn(resnet.ResNet.resnet152_config(), train_batch_size=1024),
    }
