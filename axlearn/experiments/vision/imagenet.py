"""ImageNet input configs shared by the vision experiments."""

from axlearn.common import input_tf_data
from axlearn.common.config import config_for_function
from axlearn.vision import input_image

# ImageNet-1k's number of classes and training examples.
NUM_CLASSES = input_image.NUM_CLASSES
NUM_TRAIN_EXAMPLES = input_image.NUM_TRAIN_EXAMPLES


def input_config(*, split: str, global_batch_size: int) -> input_tf_data.Input.Config:
    """An ImagenetInput config reading `split` ("train", "validation", "train[:50000]", ...).

    Training inputs ("train" exactly) shuffle; every other split is read in order. With the data
    dir "FAKE" the input reads fake images instead (see `axlearn.vision.input_image`).

    Args:
        split: The TFDS split of imagenet2012.
        global_batch_size: Examples per global batch.

    Returns:
        The input config (is_training is set from the split).
    """
    cfg = input_image.ImagenetInput.default_config().set(is_training=split == "train")
    cfg.source.set(
        split=split,
        read_config=config_for_function(input_tf_data.tfds_read_config).set(decode_parallelism=128),
    )
    cfg.batcher.global_batch_size = global_batch_size
    if split != "train":
        input_tf_data.disable_shuffle_recursively(cfg)
    return cfg
