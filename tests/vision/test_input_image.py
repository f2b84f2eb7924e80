"""Tests of axlearn/vision/input_image.py: processing against NumPy, fake images, padding."""

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common import utils
from axlearn.common.input_feed import FeedContext, feed_scope
from axlearn.vision import input_image


def test_whiten_and_de_whiten():
    image = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3) * 10
    white = input_image.whiten(image).numpy()
    expected = (image - np.array(input_image.MEAN_RGB)) / np.array(input_image.STDDEV_RGB)
    np.testing.assert_allclose(white, expected, rtol=1e-5)
    np.testing.assert_allclose(input_image.de_whiten(white).numpy(), image, atol=1e-3)


def test_central_crops():
    image = tf.reshape(tf.range(8 * 10 * 1), [8, 10, 1])
    # The central 87.5% square of the shorter side (8 -> 7), centered: offsets (0, 1).
    crop = input_image.central_crop_v2(image).numpy()
    np.testing.assert_array_equal(crop, image.numpy()[0:7, 1:8])
    np.testing.assert_array_equal(
        input_image.central_crop(image, (4, 4)).numpy(), image.numpy()[2:6, 3:7]
    )


def test_eval_processing_is_center_crop_resize_whiten():
    image = np.full((8, 8, 3), 100.0, np.float32)
    out = input_image.crop_augment_whiten(image, is_training=False, image_size=(4, 4)).numpy()
    expected = (100.0 - np.array(input_image.MEAN_RGB)) / np.array(input_image.STDDEV_RGB)
    np.testing.assert_allclose(out, np.broadcast_to(expected, (4, 4, 3)), rtol=1e-5)
    with pytest.raises(ValueError, match="augment_name='randaugment' is not supported"):
        input_image.crop_augment_whiten(
            image, is_training=True, image_size=(4, 4), augment_name="randaugment"
        )


def test_fake_images_are_deterministic_and_in_range():
    fn = input_image.fake_image_dataset(
        is_training=True, total_num_examples=5, image_size=(6, 4), num_classes=7
    )
    first, second = list(fn().as_numpy_iterator()), list(fn().as_numpy_iterator())
    assert len(first) == 5
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a["image"], b["image"])
        assert a["image"].shape == (6, 4, 3) and 0 <= a["image"].min() <= a["image"].max() < 256
        assert 0 <= a["label"] < 7
    assert not np.array_equal(first[0]["image"], first[1]["image"])


def _input(is_training: bool, batch_size: int = 4):
    cfg = input_image.ImagenetInput.default_config().set(name="in", is_training=is_training)
    cfg.source.split = "train" if is_training else "validation"
    cfg.processor.image_size = (8, 8)
    cfg.batcher.global_batch_size = batch_size
    return cfg


def test_fake_data_dir_reads_fake_images():
    with utils.set_data_dir("FAKE"):
        train = _input(True).instantiate(parent=None)
        batch = next(iter(train))
        evaluation = list(iter(_input(False).instantiate(parent=None)))
    assert batch["image"].shape == (4, 8, 8, 3) and batch["image"].dtype == np.float32
    assert batch["label"].shape == (4,) and np.all((batch["label"] >= 0) & (batch["label"] < 1000))
    # Fake evaluation inputs hold 2 batches.
    assert len(evaluation) == input_image.FAKE_EVAL_NUM_BATCHES


def test_padding_examples_have_negative_labels():
    spec = {"image": tf.TensorSpec([2, 2, 3], tf.float32), "label": tf.TensorSpec([], tf.int32)}
    pad = input_image.pad_with_negative_labels(spec)
    assert int(pad["label"]) == -1 and float(tf.reduce_sum(pad["image"])) == 0.0


def test_training_crops_are_seeded_per_feed():
    def first_image():
        ds = tf.data.Dataset.from_tensors(
            {"image": tf.reshape(tf.range(32 * 32 * 3) % 256, [32, 32, 3]), "label": 1}
        )
        with feed_scope(FeedContext(num_feeds=1, feed_index=0, seed=3)):
            fn = input_image._process_example(is_training=True, image_size=(8, 8))
            return next(iter(fn(ds)))["image"].numpy()

    np.testing.assert_array_equal(first_image(), first_image())


def test_replace_inputs_with_fake_keeps_imagenet_inputs():
    """--data_dir=FAKE on a trainer-like tree: ImagenetInputs keep their class, get fake images."""
    from axlearn.common.config import config_for_function
    from axlearn.common.input_fake import FakeLmInput, replace_inputs_with_fake
    from axlearn.common.input_tf_data import Input, tfds_dataset

    lm = Input.default_config().set(
        is_training=True,
        source=config_for_function(tfds_dataset).set(dataset_name="x", split="train"),
        processor=config_for_function(input_image._process_example).set(image_size=(8, 8)),
    )
    lm.batcher.global_batch_size = 4
    tree = {"train": _input(True), "eval": _input(False, batch_size=2)}
    tree = replace_inputs_with_fake(tree)
    for name, batch in (("train", 4), ("eval", 2)):
        cfg = tree[name]
        assert cfg.klass is input_image.ImagenetInput
        assert cfg.source.fn is input_image.fake_image_dataset
        assert tuple(cfg.source.image_size) == (8, 8)
        assert cfg.source.eval_num_examples == 2 * batch
    evaluation = list(iter(tree["eval"].instantiate(parent=None)))
    assert len(evaluation) == 2 and evaluation[0]["image"].shape == (2, 8, 8, 3)
    # Other inputs still become fake LM inputs.
    assert replace_inputs_with_fake(lm, source_length=16).klass is FakeLmInput


def test_fake_source_needs_a_batch_size():
    cfg = _input(False)
    cfg.batcher.global_batch_size = None
    with pytest.raises(ValueError, match=r"ImagenetInput.batcher.global_batch_size=None must be"):
        input_image.ImagenetInput.with_fake_source(cfg)
