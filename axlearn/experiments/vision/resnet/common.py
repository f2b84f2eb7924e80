"""Model and learner builders shared by the ResNet experiments."""

import math
from typing import Optional

from axlearn.common import config, learner, optimizers, param_init, schedule
from axlearn.vision import image_classification


def learner_config(
    *, learning_rate: schedule.Schedule, ema_decay: Optional[float] = None
) -> learner.Learner.Config:
    """SGD (momentum 0.9, coupled weight decay 1e-4 except on norm parameters), as for ResNet.

    Args:
        learning_rate: The learning-rate schedule (config).
        ema_decay: If set, the learner also keeps an exponential moving average of the
            parameters with this decay.

    Returns:
        The learner config.
    """
    per_param_decay = config.config_for_function(optimizers.per_param_scale_by_path).set(
        description="weight_decay_scale",
        # Norm parameters are not regularized.
        scale_by_path=[(".*norm.*", 0)],
    )
    optimizer = config.config_for_function(optimizers.sgd_optimizer).set(
        learning_rate=learning_rate,
        # Weight decay enters the gradient before momentum, as in PyTorch's SGD.
        decouple_weight_decay=False,
        momentum=0.9,
        weight_decay=1e-4,
        weight_decay_per_param_scale=per_param_decay,
    )
    cfg = learner.Learner.default_config().set(optimizer=optimizer)
    if ema_decay:
        cfg.ema.decay = ema_decay
    return cfg


def model_config() -> image_classification.ImageClassificationModel.Config:
    """An ImageClassificationModel config with He-initialized weights; set backbone/num_classes.

    Returns:
        The model config, e.g. `model_config().set(backbone=ResNet.resnet50_config(),
        num_classes=1000)`.
    """
    cfg = image_classification.ImageClassificationModel.default_config()
    cfg.param_init = param_init.DefaultInitializer.default_config().set(
        init_by_param_name={
            # He (Kaiming) normal initialization for ReLU networks, fan_out mode.
            param_init.PARAM_REGEXP_WEIGHT: param_init.WeightInitializer.default_config().set(
                fan="fan_out", distribution="normal", scale=math.sqrt(2)
            )
        }
    )
    return cfg
