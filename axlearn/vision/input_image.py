"""Image inputs: ImageNet from TFDS with standard crops, and fake images for `--data_dir=FAKE`.

`ImagenetInput.default_config()` reads `imagenet2012` with `input_tf_data.tfds_dataset` and
processes each example into {"image": float32 [H, W, 3] whitened, "label": int32}: training takes
a random crop (8%-100% of the area, aspect ratio 3/4-4/3), a random horizontal flip and a
bilinear resize to `image_size`; evaluation takes the central 87.5% square and resizes it.
Evaluation batches are padded with label -1 examples, which the classification metric leaves out.

With the data dir "FAKE" (`--data_dir=FAKE`, or `utils.set_data_dir("FAKE")`), an ImagenetInput
reads `fake_image_dataset` images of the processor's `image_size` instead of TFDS (two batches
for evaluation), so a trainer runs without the data set.
"""

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from axlearn.common import input_tf_data
from axlearn.common.config import ConfigBase, config_for_function
from axlearn.common.input_batching import default_pad_example_fn
from axlearn.common.input_feed import derive_seed
from axlearn.common.utils import get_data_dir

# ImageNet's per-channel RGB mean and standard deviation, in [0, 255] pixel units.
MEAN_RGB = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STDDEV_RGB = [0.229 * 255, 0.224 * 255, 0.225 * 255]
# The same in [0, 1] units.
MEAN_RGB_NORMED = [v / 255.0 for v in MEAN_RGB]
STDDEV_RGB_NORMED = [v / 255.0 for v in STDDEV_RGB]

# ImageNet-1k's number of classes and training examples.
NUM_CLASSES = 1000
NUM_TRAIN_EXAMPLES = 1_281_167

# Fake evaluation inputs hold this many batches.
FAKE_EVAL_NUM_BATCHES = 2


def _rgb_constant(values: Optional[list[float]], default: list[float]) -> tf.Tensor:
    return tf.reshape(tf.constant(values or default, dtype=tf.float32), [1, 1, 3])


def whiten(
    image: Any, *, mean_rgb: Optional[list[float]] = None, stddev_rgb: Optional[list[float]] = None
) -> tf.Tensor:
    """Returns (image - mean) / stddev per RGB channel, as float32.

    Args:
        image: [H, W, 3] pixels in [0, 255].
        mean_rgb: Per-channel means (default MEAN_RGB).
        stddev_rgb: Per-channel standard deviations (default STDDEV_RGB).

    Returns:
        The whitened float32 image.
    """
    image = tf.cast(tf.convert_to_tensor(image), tf.float32)
    return (image - _rgb_constant(mean_rgb, MEAN_RGB)) / _rgb_constant(stddev_rgb, STDDEV_RGB)


def de_whiten(
    image: Any, *, mean_rgb: Optional[list[float]] = None, stddev_rgb: Optional[list[float]] = None
) -> tf.Tensor:
    """Inverts `whiten`: image * stddev + mean per RGB channel.

    Args:
        image: [H, W, 3] whitened image.
        mean_rgb: Per-channel means (default MEAN_RGB).
        stddev_rgb: Per-channel standard deviations (default STDDEV_RGB).

    Returns:
        The float32 image in pixel units.
    """
    image = tf.cast(tf.convert_to_tensor(image), tf.float32)
    return image * _rgb_constant(stddev_rgb, STDDEV_RGB) + _rgb_constant(mean_rgb, MEAN_RGB)


def random_crop(
    image: tf.Tensor,
    aspect_ratio_range: tuple[float, float] = (0.75, 1.33),
    area_range: tuple[float, float] = (0.08, 1.0),
    max_attempts: int = 100,
    *,
    seed: Optional[tf.Tensor] = None,
) -> tf.Tensor:
    """Crops a random box of the given area fraction and aspect ratio (the whole image on failure).

    Args:
        image: [H, W, C].
        aspect_ratio_range: (min, max) width / height of the crop.
        area_range: (min, max) fraction of the image area the crop covers.
        max_attempts: Attempts to find such a box.
        seed: Optional stateless seed (int32 [2]); None: a stateful random op.

    Returns:
        The crop [H', W', C].
    """
    kwargs = dict(
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]], tf.float32),
        min_object_covered=0.0,
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=max_attempts,
        use_image_if_no_bounding_boxes=True,
    )
    if seed is None:
        begin, size, _ = tf.image.sample_distorted_bounding_box(tf.shape(image), **kwargs)
    else:
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.shape(image), seed=seed, **kwargs
        )
    return tf.slice(image, begin, size)


def central_crop(image: tf.Tensor, image_size: tuple[int, int]) -> tf.Tensor:
    """Crops the central `image_size` (height, width) window of a statically shaped [H, W, C]."""
    height, width, channels = image.shape
    top = (height - image_size[0] + 1) // 2
    left = (width - image_size[1] + 1) // 2
    return tf.slice(image, [top, left, 0], [image_size[0], image_size[1], channels])


def central_crop_v2(image: tf.Tensor, center_crop_fraction: float = 0.875) -> tf.Tensor:
    """Crops the central square whose side is `center_crop_fraction` of the shorter side.

    Args:
        image: [H, W, C].
        center_crop_fraction: The crop side over the shorter image side (224/256 by default).

    Returns:
        The square crop.
    """
    hw = tf.cast(tf.shape(image)[:2], tf.float32)
    side = center_crop_fraction * tf.reduce_min(hw)
    offset = tf.cast((hw - side) / 2.0, tf.int32)
    side = tf.cast(side, tf.int32)
    return image[offset[0] : offset[0] + side, offset[1] : offset[1] + side, :]


def _resize(image: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
    return tf.image.resize(image, size, method=tf.image.ResizeMethod.BILINEAR)


def crop_augment_whiten(
    image: tf.Tensor,
    *,
    is_training: bool,
    image_size: tuple[int, int],
    eval_resize: Optional[tuple[int, int]] = None,
    augment_name: Optional[str] = None,
    use_whitening: bool = True,
    seed: Optional[tf.Tensor] = None,
) -> tf.Tensor:
    """Crops, flips (training), resizes to `image_size` and whitens one image.

    Args:
        image: [H, W, 3] pixels in [0, 255].
        is_training: Random crop and flip (training) or central crop (evaluation).
        image_size: Output (height, width).
        eval_resize: If set, evaluation resizes to this first, then takes the central
            image_size window; otherwise it takes the central 87.5% square and resizes it.
        augment_name: Extra training augmentation; only None is supported.
        use_whitening: Whether to whiten (otherwise cast to float32).
        seed: Optional stateless seed (int32 [2]) of the training crop and flip.

    Returns:
        Float32 [image_size[0], image_size[1], 3].

    Raises:
        ValueError: For an unsupported augment_name.
    """
    if augment_name is not None:
        raise ValueError(
            f"augment_name={augment_name!r} is not supported by axlearn.vision.input_image; "
            "set augment_name=None"
        )
    if is_training:
        crop_seed = flip_seed = None
        if seed is not None:
            crop_seed, flip_seed = seed, seed + tf.constant([0, 1], seed.dtype)
        cropped = random_crop(image, seed=crop_seed)
        # A failed crop returns the whole image: fall back to the central crop then.
        image = tf.cond(
            tf.reduce_all(tf.equal(tf.shape(cropped), tf.shape(image))),
            lambda: central_crop_v2(image),
            lambda: cropped,
        )
        if flip_seed is None:
            image = tf.image.random_flip_left_right(image)
        else:
            image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
        image = _resize(image, image_size)
    elif eval_resize is None:
        image = _resize(central_crop_v2(image), image_size)
    else:
        image = central_crop(_resize(image, eval_resize), image_size)
    return whiten(image) if use_whitening else tf.cast(image, tf.float32)


def _process_example(
    is_training: bool,
    image_size: tuple[int, int],
    eval_resize: Optional[tuple[int, int]] = None,
    num_parallel_calls: Optional[int] = None,
    augment_name: Optional[str] = None,
    use_whitening: bool = True,
    input_key: str = "image",
) -> input_tf_data.DatasetToDatasetFn:
    """Returns a processor mapping {input_key: image, "label": ...} to {"image", "label"}.

    Training crops are seeded per feed (`input_feed.derive_seed`) and per example, so a feed's
    examples are processed the same way on every run.

    Args:
        is_training: Whether processing for training (set by Input).
        image_size: Output (height, width).
        eval_resize: See `crop_augment_whiten`.
        num_parallel_calls: Parallel map calls; None: autotune.
        augment_name: See `crop_augment_whiten` (only None).
        use_whitening: See `crop_augment_whiten`.
        input_key: The image's key in the examples.

    Returns:
        A DatasetToDatasetFn.
    """

    def dataset_fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        base_seed = derive_seed("input_image/crop_augment") if is_training else 0

        def example_fn(index, example):
            seed = tf.stack([tf.constant(base_seed, tf.int64), tf.cast(index, tf.int64)])
            image = crop_augment_whiten(
                example[input_key],
                is_training=is_training,
                image_size=tuple(image_size),
                eval_resize=eval_resize,
                augment_name=augment_name,
                use_whitening=use_whitening,
                seed=tf.cast(seed, tf.int32) if is_training else None,
            )
            return {"image": image, "label": tf.cast(example["label"], tf.int32)}

        return ds.enumerate().map(
            example_fn, num_parallel_calls=num_parallel_calls or tf.data.AUTOTUNE
        )

    return dataset_fn


def pad_with_negative_labels(element_spec: Any) -> Any:
    """Padding examples with label(s) -1, so that metrics leave them out.

    Args:
        element_spec: The (nested) tf.TensorSpec of an example.

    Returns:
        The padding example.
    """
    example = default_pad_example_fn(element_spec)
    for key in ("label", "labels"):
        if key in example:
            example[key] = -tf.ones_like(example[key])
    return example


def fake_image_dataset(
    is_training: bool,
    total_num_examples: Optional[int] = None,
    input_key: str = "image",
    image_size: tuple[int, int] = (224, 224),
    num_classes: int = NUM_CLASSES,
    eval_num_examples: Optional[int] = None,
) -> input_tf_data.BuildDatasetFn:
    """Returns a source of fake examples {input_key: int32 [H, W, 3] in [0, 256), "label"}.

    Example i is a deterministic function of i (a stateless random image and label), so every
    run and every feed layout sees the same examples.

    Args:
        is_training: Whether the source is for training (set by Input).
        total_num_examples: Number of examples; None: infinitely many (see eval_num_examples).
        input_key: The image's key.
        image_size: (height, width) of the images.
        num_classes: Labels are in [0, num_classes).
        eval_num_examples: If set, the number of examples of an evaluation source whose
            total_num_examples is None (`ImagenetInput.with_fake_source` sets it).

    Returns:
        A BuildDatasetFn.
    """
    if total_num_examples is None and not is_training:
        total_num_examples = eval_num_examples
    height, width = image_size

    def example_fn(index):
        seed = tf.stack([tf.cast(index, tf.int32), tf.constant(17, tf.int32)])
        image = tf.random.stateless_uniform(
            [height, width, 3], seed=seed, minval=0, maxval=256, dtype=tf.int32
        )
        label = tf.random.stateless_uniform(
            [], seed=seed + 1, minval=0, maxval=num_classes, dtype=tf.int32
        )
        return {input_key: image, "label": label}

    def fn() -> tf.data.Dataset:
        counter = tf.data.Dataset.range(total_num_examples or np.iinfo(np.int64).max)
        return counter.map(example_fn)

    return fn


class ImagenetInput(input_tf_data.Input):
    """ImageNet (TFDS `imagenet2012`) classification input; fake images with data dir "FAKE"."""

    @classmethod
    def default_config(cls) -> input_tf_data.Input.Config:
        """TFDS imagenet2012 source, 224x224 crops, batches padded with label -1 examples."""
        cfg = super().default_config()
        cfg.source = config_for_function(input_tf_data.tfds_dataset).set(
            dataset_name="imagenet2012", train_shuffle_buffer_size=1024
        )
        cfg.processor = config_for_function(_process_example).set(
            image_size=(224, 224), eval_resize=None, augment_name=None
        )
        cfg.batcher.set(pad_example_fn=pad_with_negative_labels)
        return cfg

    @classmethod
    def with_fake_source(
        cls, cfg: input_tf_data.Input.Config, *, eval_num_batches: int = FAKE_EVAL_NUM_BATCHES
    ) -> input_tf_data.Input.Config:
        """Returns `cfg` reading `fake_image_dataset` images instead of its source.

        The images have the processor's `image_size`; labels are in [0, 1000). Evaluation
        inputs hold `eval_num_batches` batches.

        Raises:
            ValueError: If the batcher has no int global_batch_size.
        `input_fake.replace_inputs_with_fake` (`--data_dir=FAKE`) calls this.

        Args:
            cfg: An ImagenetInput config (modified in place).
            eval_num_batches: Batches of an evaluation input.

        Returns:
            `cfg`.
        """
        image_size = tuple(getattr(cfg.processor, "image_size", (224, 224)))
        batch_size = getattr(cfg.batcher, "global_batch_size", None)
        if not isinstance(batch_size, int):
            raise ValueError(
                f"--data_dir=FAKE: {cfg.klass.__name__}.batcher.global_batch_size={batch_size!r} "
                "must be an int to size the fake evaluation input; set it"
            )
        # `is_training` may be set later (by the trainer or evaler): the source decides.
        cfg.source = config_for_function(fake_image_dataset).set(
            image_size=image_size, eval_num_examples=eval_num_batches * batch_size
        )
        return cfg

    def __init__(self, cfg: input_tf_data.Input.Config, *, parent, **kwargs):
        if get_data_dir() == "FAKE" and _is_tfds_source(cfg.source):
            cfg = self.with_fake_source(cfg.clone())
        super().__init__(cfg, parent=parent, **kwargs)


def _is_tfds_source(source: Any) -> bool:
    return isinstance(source, ConfigBase) and getattr(source, "fn", None) is (
        input_tf_data.tfds_dataset
    )


class Imagenetv2Input(ImagenetInput):
    """ImageNetV2 (https://github.com/modestyachts/ImageNetV2), a newer ImageNet test set."""

    @classmethod
    def default_config(cls) -> input_tf_data.Input.Config:
        """ImagenetInput reading `imagenet_v2/matched-frequency`."""
        cfg = super().default_config()
        cfg.source.set(dataset_name="imagenet_v2/matched-frequency")
        return cfg
