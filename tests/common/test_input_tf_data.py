"""Tests axlearn/common/input_tf_data.py (with input_feed.py and input_iterator.py)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import input_iterator, input_tf_data
from axlearn.common.config import config_for_function
from axlearn.common.input_iterator import InputError, InputStateError
from axlearn.experiments.text.common import vocab
from axlearn.experiments.text.gpt.common import tfds_input
from tests.common import input_test_utils
from tests.common.input_test_utils import assert_batches_equal, lm_input_config, take

# The session fixture that builds the embedded data in a temporary cache dir.
embedded_cache = input_test_utils.embedded_cache
TESTDATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "testdata")


def _range_source(n: int = 100):
    """A source of {"x": i} for i in [0, n) that does not shard itself."""

    def fn():
        import tensorflow as tf

        return tf.data.Dataset.range(n).map(lambda x: {"x": tf.cast(x, tf.int32)})

    return fn


def _range_input(**kwargs) -> input_tf_data.Input.Config:
    batcher = config_for_function(input_tf_data.batch).set(
        global_batch_size=kwargs.pop("batch_size", 4),
        pad_example_fn=input_tf_data.default_pad_example_fn,
    )
    return input_tf_data.Input.default_config().set(
        name="input",
        is_training=kwargs.pop("is_training", True),
        source=config_for_function(_range_source).set(n=kwargs.pop("n", 100)),
        processor=kwargs.pop(
            "processor", config_for_function(input_tf_data.shuffle).set(shuffle_buffer_size=16)
        ),
        batcher=batcher,
        **kwargs,
    )


# ------------------------------------------------------------------------------------------------
# The reference dump.
# ------------------------------------------------------------------------------------------------


def _reference_configs(train_dataset, eval_dataset, eval_vocab):
    train = input_tf_data.Input.default_config().set(
        is_training=True,
        source=config_for_function(input_tf_data.tfds_dataset).set(
            dataset_name=train_dataset,
            split="train",
            is_training=True,
            train_shuffle_buffer_size=0,
            train_shuffle_files=False,
        ),
        processor=config_for_function(input_tf_data.identity),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=2048,
            prefetch_buffer_size=-1,  # tf.data.AUTOTUNE
            pad_example_fn=input_tf_data.default_pad_example_fn,
        ),
    )
    evaler = input_tf_data.Input.default_config().set(
        is_training=False,
        source=config_for_function(tfds_input).set(
            is_training=False,
            dataset_name=eval_dataset,
            split="test[:5000]",
            vocab_cfg=config_for_function(vocab).set(sentencepiece_model_name=eval_vocab),
            max_sequence_length=4096,
            replace_newlines_with="<n>",
        ),
        processor=config_for_function(input_tf_data.identity),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=2048,
            prefetch_buffer_size=-1,
            pad_example_fn=input_tf_data.default_pad_example_fn,
        ),
    )
    lines = [f"input.{line}" for line in train.debug_string().splitlines()]
    lines += [
        f"evalers['openwebtext_2'].input.{line}" for line in evaler.debug_string().splitlines()
    ]
    return sorted(lines)


def test_reference_dump_lines():
    """The dump's `input.` and `evalers['openwebtext_2'].input.` lines, byte for byte."""
    with open(os.path.join(TESTDATA, "input_reference_lines.txt"), encoding="utf-8") as f:
        expected = f.read().splitlines()
    got = _reference_configs(
        "pajama_honeycrisp_15t_202408072230", "pile/openwebtext_2:1.0.0", "bpe_48k_honeycrisp.model"
    )
    assert got == sorted(expected)
    # With the embedded data set and vocabulary swapped in, exactly these three lines differ.
    swapped = _reference_configs(
        "python_docs:1.0.0", "python_docs:1.0.0", "bpe_4k_python_docs.model"
    )
    assert sorted(set(swapped) - set(expected)) == [
        "evalers['openwebtext_2'].input.source.dataset_name: 'python_docs:1.0.0'",
        "evalers['openwebtext_2'].input.source.vocab_cfg.sentencepiece_model_name: "
        "'bpe_4k_python_docs.model'",
        "input.source.dataset_name: 'python_docs:1.0.0'",
    ]


def test_import_does_not_load_tensorflow():
    code = (
        "import sys; import axlearn.common.input_tf_data, axlearn.common.input_lm, "
        "axlearn.common.input_fake, axlearn.experiments.text.gpt.common; "
        "print(any(m in sys.modules for m in ('tensorflow', 'seqio', 'tensorflow_datasets')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------------
# Determinism and multi-process slices.
# ------------------------------------------------------------------------------------------------


def test_same_seed_same_batches(embedded_cache):
    a = take(iter(lm_input_config().instantiate(parent=None)), 4)
    b = take(iter(lm_input_config().instantiate(parent=None)), 4)
    assert_batches_equal(a, b)
    c = take(iter(lm_input_config(seed=7).instantiate(parent=None)), 4)
    assert not np.array_equal(a[0]["input_ids"], c[0]["input_ids"])
    assert a[0]["input_ids"].shape == (4, 16) and a[0]["input_ids"].dtype == np.int32


@pytest.mark.parametrize("packing", [False, True])
def test_two_process_slices_union_is_global_batch(embedded_cache, packing):
    cfg = lm_input_config(num_feeds=2, packing=packing)
    global_it = iter(cfg.instantiate(parent=None))
    p0 = iter(cfg.instantiate(parent=None, process_index=0, process_count=2))
    p1 = iter(cfg.instantiate(parent=None, process_index=1, process_count=2))
    for _ in range(3):
        g, a, b = next(global_it), next(p0), next(p1)
        assert a["input_ids"].shape == (2, 16)
        for k in g:
            np.testing.assert_array_equal(g[k], np.concatenate([a[k], b[k]]))


def test_feeds_read_disjoint_shards():
    cfg = _range_input(num_feeds=2, processor=config_for_function(input_tf_data.identity))
    cfg.batcher.repeat = 1
    p0 = cfg.instantiate(parent=None, process_index=0, process_count=2)
    p1 = cfg.instantiate(parent=None, process_index=1, process_count=2)
    x0 = np.concatenate([b["x"] for b in iter(p0)])
    x1 = np.concatenate([b["x"] for b in iter(p1)])
    assert set(x0).isdisjoint(x1) and sorted(np.concatenate([x0, x1])) == list(range(100))


def test_num_feeds_must_divide():
    with pytest.raises(ValueError, match="multiple of the process count"):
        _range_input(num_feeds=3).instantiate(parent=None, process_index=0, process_count=2)
    with pytest.raises(ValueError, match="divisible by the number of input feeds"):
        iter(_range_input(num_feeds=3, batch_size=4).instantiate(parent=None))


# ------------------------------------------------------------------------------------------------
# Exact resume.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("packing", [False, True])
def test_resume_batches_11_to_20(embedded_cache, packing):
    cfg = lm_input_config(packing=packing)
    reference = take(iter(cfg.instantiate(parent=None)), 20)
    it = iter(cfg.instantiate(parent=None))
    take(it, 10)
    state = it.get_state()
    # A new Input (as after a restart) restores the saved position.
    restored = cfg.instantiate(parent=None).restore_iterator(state)
    assert restored.num_batches == 10
    assert_batches_equal(take(restored, 10), reference[10:])


def test_resume_on_a_different_process_count(embedded_cache):
    cfg = lm_input_config(num_feeds=2)
    reference = take(iter(cfg.instantiate(parent=None)), 8)
    procs = [cfg.instantiate(parent=None, process_index=i, process_count=2) for i in range(2)]
    its = [iter(p) for p in procs]
    for it in its:
        take(it, 5)
    states = [it.get_state() for it in its]
    # One process restores both feeds from the two saved states.
    one = cfg.instantiate(parent=None).restore_iterator(states)
    assert_batches_equal(take(one, 3), reference[5:])
    # Only its own state is not enough: the error says what to pass.
    with pytest.raises(InputStateError, match="pass the saved states of all processes"):
        cfg.instantiate(parent=None).restore_iterator(states[0])
    # A different number of feeds cannot be restored exactly: the error says what to set.
    with pytest.raises(InputStateError, match="input.num_feeds=2"):
        lm_input_config().instantiate(parent=None).restore_iterator(states)


def test_resume_refuses_changed_config(embedded_cache):
    it = iter(lm_input_config().instantiate(parent=None))
    next(it)
    state = it.get_state()
    with pytest.raises(InputStateError, match="max_sequence_length"):
        lm_input_config(max_len=8).instantiate(parent=None).restore_iterator(state)
    with pytest.raises(InputStateError, match="saved by an unknown input"):
        lm_input_config().instantiate(parent=None).restore_iterator(b"garbage")
    with pytest.raises(InputStateError, match="Not an axlearn input iterator state"):
        lm_input_config().instantiate(parent=None).restore_iterator(b"AXINPUT1")


def test_resuming_a_fake_input_checkpoint_names_both_inputs_and_the_fix(embedded_cache):
    """Issue 55 case 1: a checkpoint saved with --data_dir=FAKE resumed with real data."""
    from axlearn.common.input_fake import FakeLmInput  # pylint: disable=import-outside-toplevel

    fake = FakeLmInput.default_config().set(
        name="fake", is_training=True, global_batch_size=2, source_length=4, max_token_id=10
    )
    it = iter(fake.instantiate(parent=None))
    next(it)
    with pytest.raises(InputStateError) as e:
        lm_input_config().instantiate(parent=None).restore_iterator(it.get_state())
    msg = str(e.value)
    assert "\n" not in msg
    assert (
        "the checkpoint's input position was saved by FakeLmInput (a run with --data_dir=FAKE), "
        "but this run reads with a tf.data input of real data; resume with --data_dir=FAKE "
        "again, or train in a fresh --trainer_dir." in msg
    ), msg


def test_resume_python_generator_source_by_replay():
    def gen_source():
        def fn():
            import tensorflow as tf

            def gen():
                yield from ({"x": np.int32(i)} for i in range(1000))

            return tf.data.Dataset.from_generator(
                gen, output_signature={"x": tf.TensorSpec([], tf.int32)}
            )

        return fn

    cfg = _range_input()
    cfg.source = config_for_function(gen_source)
    reference = take(iter(cfg.instantiate(parent=None)), 8)
    it = iter(cfg.instantiate(parent=None))
    take(it, 5)
    restored = cfg.instantiate(parent=None).restore_iterator(it.get_state())
    assert_batches_equal(take(restored, 3), reference[5:])


# ------------------------------------------------------------------------------------------------
# Evaluation inputs, sources, mixtures.
# ------------------------------------------------------------------------------------------------


def test_eval_input_reads_every_example_once_padded():
    cfg = _range_input(
        n=10, is_training=False, batch_size=4, processor=config_for_function(input_tf_data.identity)
    )
    batches = list(iter(cfg.instantiate(parent=None)))
    assert len(batches) == 3
    xs = np.concatenate([b["x"] for b in batches])
    np.testing.assert_array_equal(xs, list(range(10)) + [0, 0])
    # Two feeds pad to the same number of batches.
    cfg.num_feeds = 2
    batches = list(iter(cfg.instantiate(parent=None)))
    xs = np.concatenate([b["x"] for b in batches])
    assert len(batches) == 3 and sorted(xs[xs > 0].tolist()) == list(range(1, 10))


def test_tfds_split_slicing_and_shards(embedded_cache):
    src = config_for_function(input_tf_data.tfds_dataset).set(
        dataset_name="python_docs:1.0.0", split="validation[:10]", is_training=False
    )
    ids = [x["id"].numpy() for x in src.instantiate()()]
    assert len(ids) == 10
    from axlearn.common.input_feed import FeedContext, feed_scope

    shards = []
    for f in range(3):
        with feed_scope(FeedContext(num_feeds=3, feed_index=f)):
            shards.append([x["id"].numpy() for x in src.instantiate()()])
    assert sorted(sum(shards, [])) == sorted(ids)


def test_missing_dataset_names_the_path(tmp_path):
    src = config_for_function(input_tf_data.tfds_dataset).set(
        dataset_name="no_such_dataset_xyz", split="train", is_training=False, data_dir=str(tmp_path)
    )
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        src.instantiate()()


def test_training_requires_shuffle_buffer_size():
    with pytest.raises(ValueError, match="train_shuffle_buffer_size is required"):
        config_for_function(input_tf_data.tfds_dataset).set(
            dataset_name="x", split="train", is_training=True
        ).instantiate()


def test_sample_from_datasets_weights_and_determinism():
    def const_source(value: int):
        def fn():
            import tensorflow as tf

            return tf.data.Dataset.from_tensors({"x": tf.constant(value, tf.int32)}).repeat(10)

        return fn

    mixture = config_for_function(input_tf_data.sample_from_datasets).set(
        sources=[
            config_for_function(const_source).set(value=1),
            config_for_function(const_source).set(value=2),
        ],
        weights=[3.0, 1.0],
    )
    cfg = _range_input(batch_size=100, processor=config_for_function(input_tf_data.identity))
    cfg.source = mixture
    a = np.concatenate([b["x"] for b in take(iter(cfg.instantiate(parent=None)), 40)])
    b = np.concatenate([b["x"] for b in take(iter(cfg.instantiate(parent=None)), 40)])
    np.testing.assert_array_equal(a, b)
    frac = np.mean(a == 1)
    # 4000 draws with p=0.75: standard deviation ~0.007.
    assert abs(frac - 0.75) < 0.03, frac


def test_sample_from_datasets_rejects_empty_source():
    def texts(values):
        def fn():
            import tensorflow as tf

            return tf.data.Dataset.from_tensor_slices(tf.constant(values, tf.string))

        return fn

    mixture = config_for_function(input_tf_data.sample_from_datasets).set(
        is_training=False,
        sources=[config_for_function(texts).set(values=["a"]), config_for_function(texts)],
        weights=[1.0, 1.0],
    )
    mixture.sources[1].values = []
    with pytest.raises(ValueError, match=r"source 1 \(texts\(.*\)\) has no examples"):
        mixture.instantiate()()


# ------------------------------------------------------------------------------------------------
# Malformed records.
# ------------------------------------------------------------------------------------------------


def _text_source():
    def fn():
        import tensorflow as tf

        texts = [b"good one", b"bad \xff\xfe bytes", b"another good", b"fine"] * 5
        return tf.data.Dataset.from_tensor_slices({"text": texts})

    return fn


def _text_input(**kwargs):
    from axlearn.common import input_lm  # pylint: disable=import-outside-toplevel

    return input_tf_data.Input.default_config().set(
        name="input",
        is_training=False,
        source=config_for_function(_text_source),
        processor=config_for_function(input_lm.text_to_lm_eval_input).set(
            vocab_cfg=config_for_function(vocab).set(sentencepiece_model_name=None), max_len=8
        ),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=2, pad_example_fn=input_tf_data.default_pad_example_fn
        ),
        **kwargs,
    )


def test_malformed_record_fails_naming_the_source():
    with pytest.raises(Exception, match="not valid UTF-8") as e:
        list(iter(_text_input().instantiate(parent=None)))
    assert "_text_source" in str(e.value) and "malformed_records to skip" in str(e.value)


def test_malformed_records_counted_and_skipped():
    it = iter(_text_input(malformed_records="skip").instantiate(parent=None))
    batches = list(it)
    assert it.num_malformed_records == 5
    # ByteVocabulary: byte b has id b + 3; EOS is 1; pad (no target) is 0.
    targets = np.concatenate([b["target_labels"].reshape(-1) for b in batches])
    expected = []
    for text in [b"good one", b"another good", b"fine"] * 5:
        expected += [c + 3 for c in text] + [1]
    np.testing.assert_array_equal(targets[targets > 0], expected)


def test_input_error_wraps_tf_errors():
    def failing_source():
        def fn():
            import tensorflow as tf

            def check(x):
                with tf.control_dependencies(
                    [tf.debugging.assert_less(x, tf.constant(3, tf.int64))]
                ):
                    return {"x": tf.identity(x)}

            return tf.data.Dataset.range(10).map(check)

        return fn

    cfg = _range_input(processor=config_for_function(input_tf_data.identity))
    cfg.source = config_for_function(failing_source)
    with pytest.raises(InputError, match="failing_source"):
        take(iter(cfg.instantiate(parent=None)), 5)


# ------------------------------------------------------------------------------------------------
# Per-feed batching through an input dispatcher (AXLearn's `input_dispatcher` + `per_feed_batch`).
# ------------------------------------------------------------------------------------------------


def _dispatched_input(logical: int, **kwargs) -> input_tf_data.Input.Config:
    from axlearn.common.input_dispatch import InputDispatcher

    cfg = _range_input(processor=config_for_function(input_tf_data.identity), **kwargs)
    cfg.batcher = config_for_function(input_tf_data.per_feed_batch).set(
        pad_example_fn=input_tf_data.default_pad_example_fn
    )
    cfg.input_dispatcher = InputDispatcher.default_config().set(global_logical_batch_size=logical)
    return cfg


def test_per_feed_batch_equals_global_batch_split_over_feeds():
    # Reference: the global batcher with the same global batch (8) over 2 feeds.
    dispatched = _dispatched_input(8, num_feeds=2)
    dispatched.batcher.repeat = 1
    reference = _range_input(num_feeds=2, batch_size=8, processor=dispatched.processor)
    reference.batcher.repeat = 1
    got = [b["x"].tolist() for b in iter(dispatched.instantiate(parent=None))]
    expected = [b["x"].tolist() for b in iter(reference.instantiate(parent=None))]
    assert got == expected and len(got[0]) == 8  # This process runs both feeds: 2 x 4 rows.
    # Evaluation pads to whole per-feed batches, every example once.
    eval_cfg = _dispatched_input(4, n=10, is_training=False)
    xs = np.concatenate([b["x"] for b in iter(eval_cfg.instantiate(parent=None))])
    np.testing.assert_array_equal(xs, list(range(10)) + [0, 0])


def test_dispatcher_batch_must_divide_over_feeds():
    with pytest.raises(
        ValueError,
        match=r"input.input_dispatcher.global_logical_batch_size=6 is "
        r"not divisible by the 4 input feeds",
    ):
        _dispatched_input(6, num_feeds=4).instantiate(parent=None)
    cfg = _range_input(processor=config_for_function(input_tf_data.identity))
    cfg.input_dispatcher = _dispatched_input(8).input_dispatcher
    # A batcher with neither feed_batch_size (per_feed_batch) nor global_logical_batch_size.
    cfg.batcher = config_for_function(input_tf_data.identity)
    with pytest.raises(
        ValueError, match="has no feed_batch_size: use input_tf_data.per_feed_batch"
    ):
        cfg.instantiate(parent=None)


def test_global_batcher_under_input_dispatcher_pads_logical_to_physical():
    # AXLearn's way: the `batch` batcher under an InputDispatcher batches the dispatcher's
    # physical batch (here 8, the device count), holding the logical batch (2) first.
    from axlearn.common.input_dispatch import InputDispatcher

    cfg = _range_input(processor=config_for_function(input_tf_data.identity), batch_size=2)
    cfg.input_dispatcher = InputDispatcher.default_config().set(
        global_logical_batch_size=2, global_physical_batch_size=8
    )
    inp = cfg.instantiate(parent=None)
    batch = next(iter(inp))
    np.testing.assert_array_equal(batch["x"], [0, 1, 0, 0, 0, 0, 0, 0])
    logical = inp.input_dispatcher.physical_to_logical_batch(
        {k: jnp.asarray(v) for k, v in batch.items()}
    )
    np.testing.assert_array_equal(logical["x"], [0, 1])


def test_tfds_read_config_names_the_shard():
    from axlearn.common.input_feed import FeedContext, feed_scope

    rc = input_tf_data.tfds_read_config(is_training=True, num_shards=16, shard_index=4)
    assert (rc.input_context.num_input_pipelines, rc.input_context.input_pipeline_id) == (16, 4)
    assert rc.interleave_cycle_length == 1 and rc.num_parallel_calls_for_decode == 32
    with feed_scope(FeedContext(num_feeds=3, feed_index=2)):
        rc = input_tf_data.tfds_read_config(is_training=False)
    assert (rc.input_context.num_input_pipelines, rc.input_context.input_pipeline_id) == (3, 2)
    assert rc.num_parallel_calls_for_decode == 1


def test_rekey_paths_with_separator():
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensors({"a/b": "x", "n": {"m": "y"}, "k": "z"})
    fn = input_tf_data.rekey(
        {"p.q": "a/b", "flat": "n.m", "new.deep": "missing", "k": "k"},
        separator=".",
        default_value="d",
    )
    got = tf.nest.map_structure(lambda t: t.numpy(), next(iter(fn(ds))))
    assert got == {"p": {"q": b"x"}, "flat": b"y", "new": {"deep": b"d"}, "k": b"z"}
    # Without a separator the same keys are literal.
    literal = next(iter(input_tf_data.rekey({"n.m": "n.m"}, default_value="d")(ds)))
    assert literal["n.m"].numpy() == b"d"


def test_element_spec_is_shape_dtype_structs():
    import jax

    from axlearn.common.input_fake import fake_text_source

    cfg = _range_input(processor=config_for_function(input_tf_data.identity), batch_size=4)
    assert input_tf_data.Input.element_spec(cfg.instantiate(parent=None)) == {
        "x": jax.ShapeDtypeStruct((4,), np.int32)
    }
    cfg.source = config_for_function(fake_text_source)
    assert cfg.instantiate(parent=None).element_spec() == {
        "text": jax.ShapeDtypeStruct((4,), object)
    }


# ------------------------------------------------------------------------------------------------
# Resumes prove their position: the source files and every header field are checked.
# ------------------------------------------------------------------------------------------------


def _tfrecord_source(paths):
    def fn():
        import tensorflow as tf

        ds = tf.data.TFRecordDataset(paths)
        return ds.map(lambda r: {"x": tf.strings.length(r)})

    return fn


def _write_tfrecords(path, records):
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for r in records:
            writer.write(r)


def test_resume_refuses_replaced_source_file(tmp_path):
    """A TFRecord file replaced between save and resume (same size) is refused, naming it."""
    paths = [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]
    _write_tfrecords(paths[0], [b"x" * (i + 1) for i in range(8)])
    _write_tfrecords(paths[1], [b"y" * 3 for _ in range(8)])
    cfg = _range_input(processor=config_for_function(input_tf_data.identity), batch_size=2)
    cfg.source = config_for_function(_tfrecord_source).set(paths=paths)
    it = iter(cfg.instantiate(parent=None))
    assert [b["x"].tolist() for b in take(it, 2)] == [[1, 2], [3, 4]]
    state = it.get_state()
    header, _ = input_iterator.decode_state(state)
    (feed,) = header["feeds"]
    assert [s["path"] for s in feed["sources"]] == paths and feed["rows_per_batch"] == 2
    assert feed["sources"][0]["size"] == os.path.getsize(paths[0])
    assert take(cfg.instantiate(parent=None).restore_iterator(state), 1)[0]["x"].tolist() == [5, 6]
    _write_tfrecords(paths[0], [b"z" * (8 - i) for i in range(8)])  # Same size, other records.
    with pytest.raises(InputStateError, match="source file .*a.tfrecord changed") as e:
        cfg.instantiate(parent=None).restore_iterator(state)
    assert "\n" not in str(e.value) and "save_input_iterator=False" in str(e.value)
    # A state of the previous version (no sources) restores without the check.
    header["version"] = 1
    for f in header["feeds"]:
        del f["sources"], f["rows_per_batch"]
    old = input_iterator.encode_state(header, [input_iterator.decode_state(state)[1]])
    assert cfg.instantiate(parent=None).restore_iterator(old).num_batches == 2


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda h: h.update(num_batches="7b"), "'num_batches' must be an integer, got str"),
        (lambda h: h.update(num_feeds=0), "'num_feeds' is 0, outside"),
        (lambda h: h.update(feeds={"0": 1}), "'feeds' must be a list of objects"),
        (lambda h: h["feeds"][0].update(index=5), r"feeds\[0\].index is 5, not below"),
        (lambda h: h["feeds"][0].update(size=10**9), "payload runs past the state's end"),
        (lambda h: h["feeds"][0].update(mode=1), "mode must be 'tf' or 'skip'"),
        (lambda h: h.update(config=[1]), "'config' must be a string"),
        (lambda h: h.update(x="[" * 70), None),  # Brackets in a string are not nesting.
    ],
)
def test_bad_state_header_is_one_line(edit, match):
    cfg = _range_input()
    it = iter(cfg.instantiate(parent=None))
    take(it, 1)
    header, body = input_iterator.decode_state(it.get_state())
    edit(header)
    head = json.dumps(header).encode()
    state = input_iterator._MAGIC + struct.pack("<I", len(head)) + head + body
    if match is None:
        cfg.instantiate(parent=None).restore_iterator(state)
        return
    with pytest.raises(InputStateError, match=match) as e:
        cfg.instantiate(parent=None).restore_iterator(state)
    assert "\n" not in str(e.value) and "Input 'input'" in str(e.value)


@pytest.mark.parametrize(
    "head,match",
    [
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper than 64"),
        (b'{"format": "\xff"}', "is not UTF-8"),
        (b'{"format": ', "is not valid JSON"),
    ],
)
def test_undecodable_state_header_is_one_line(head, match):
    state = input_iterator._MAGIC + struct.pack("<I", len(head)) + head
    with pytest.raises(InputStateError, match=match) as e:
        _range_input().instantiate(parent=None).restore_iterator(state)
    assert "\n" not in str(e.value)
    truncated = input_iterator._MAGIC + struct.pack("<I", 10**6) + b"{}"
    with pytest.raises(InputStateError, match="truncated"):
        _range_input().instantiate(parent=None).restore_iterator(truncated)
