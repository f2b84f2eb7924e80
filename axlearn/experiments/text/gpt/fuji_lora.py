"""LoRA fine-tuning of Fuji configs (our experiment module): only the adapters train.

Named configs:
- `fuji-tiny-v3-lora`: `fuji-tiny-v3` (2 layers, the embedded corpus; trains on CPU) with rank-8
  adapters on the attention q/k/v and output projections.
- `fuji-test-v3-lora`: `fuji-test-v3` (c4_trainer's test size) with rank-4 adapters on q/k/v,
  the output projection and the feed-forward linears.

Both freeze every non-adapter parameter through `learner.update_rules`
(`axlearn.common.lora_config_modifier.LoraConfigModifier`). A real fine-tune starts the frozen
weights from a pre-trained run's checkpoint; these start from the seed's init.

    python -m axlearn.common.launch_trainer_main --module=text.gpt.fuji_lora \\
        --config=fuji-tiny-v3-lora --trainer_dir=/tmp/lora --jax_backend=cpu
"""

from __future__ import annotations

from typing import Callable

from axlearn.common.config import ConfigBase
from axlearn.common.lora_config_modifier import LoraConfigModifier
from axlearn.experiments.trainer_config_utils import TrainerConfigFn


def lora_trainer_config_fn(
    base: TrainerConfigFn, modifier: LoraConfigModifier.Config
) -> TrainerConfigFn:
    """Returns a config fn that builds `base`'s trainer config and applies `modifier`.

    Args:
        base: The base experiment's config fn.
        modifier: The LoRA modifier's config.

    Returns:
        The LoRA experiment's config fn.
    """

    def config_fn() -> ConfigBase:
        return modifier.instantiate()(base())

    return config_fn


def _fuji_tiny() -> Callable[[], ConfigBase]:
    # pylint: disable-next=import-outside-toplevel
    from axlearn.experiments.text.gpt import fuji

    return fuji.named_trainer_configs()["fuji-tiny-v3"]


def _fuji_test() -> Callable[[], ConfigBase]:
    # pylint: disable-next=import-outside-toplevel
    from axlearn.experiments.text.gpt import c4_trainer

    return c4_trainer.named_trainer_configs()["fuji-test-v3"]


def named_trainer_configs() -> dict[str, TrainerConfigFn]:
    """{"fuji-tiny-v3-lora", "fuji-test-v3-lora"}: LoRA fine-tunes of Fuji v3 configs."""
    return {
        "fuji-tiny-v3-lora": lora_trainer_config_fn(
            _fuji_tiny(), LoraConfigModifier.default_config().set(rank=8, alpha=16.0)
        ),
        "fuji-test-v3-lora": lora_trainer_config_fn(
            _fuji_test(),
            LoraConfigModifier.default_config().set(rank=4, alpha=8.0, feed_forward=True),
        ),
    }
