"""Tests axlearn/common/sft.py: the response-only mask, packing, the input, bad input."""

import json

import jax
import numpy as np
import pytest

from axlearn.common import sft
from axlearn.common.module import functional
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config


def _vocab(alphabet="abc xyz:"):
    return sft.CharVocabulary.default_config().set(alphabet=alphabet).instantiate()


def test_char_vocabulary():
    vocab = _vocab()
    assert vocab.encode("ab z") == [2, 3, 5, 8]
    assert vocab.decode([1, 2, 3, 0, 5, 8]) == "ab z"
    assert vocab.vocab_size == 10 and vocab.pad_id == 0 and vocab.eos_id == 1
    with pytest.raises(ValueError, match="CharVocabulary.alphabet has no character 'q'"):
        vocab.encode("aq")
    with pytest.raises(ValueError, match="CharVocabulary.alphabet"):
        sft.CharVocabulary.default_config().set(alphabet="aa").instantiate()


def test_chat_template():
    template = sft.ChatTemplate.default_config().set(
        prompt_format="<u>{prompt}<a>", response_format="{response}!"
    )
    assert template.instantiate().render("hi", "yo") == ("<u>hi<a>", "yo!")
    with pytest.raises(ValueError, match=r"ChatTemplate.response_format='<a>' leaves no response"):
        template.set(response_format="<a>").instantiate()
    with pytest.raises(ValueError, match=r"ChatTemplate.prompt_format"):
        template.set(prompt_format="x", response_format="{response}").instantiate()


def test_sft_example_masks_prompt_tokens_exactly():
    ex = sft.sft_example([5, 6, 7], [8, 9], eos_id=1)
    # s = [1, 5, 6, 7, 8, 9, 1]; targets s[1:]; the 3 prompt targets are masked.
    np.testing.assert_array_equal(ex["input_ids"], [1, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(ex["target_labels"], [-1, -1, -1, 8, 9, 1])


def test_pack_examples():
    a = sft.sft_example([5], [6], eos_id=1)  # 3 tokens
    b = sft.sft_example([7, 7], [8], eos_id=1)  # 4 tokens
    c = sft.sft_example([9, 9, 9, 9], [4], eos_id=1)  # 6 tokens
    rows = sft.pack_examples([a, b, c], max_len=7, pad_id=0)
    np.testing.assert_array_equal(rows["input_ids"], [[1, 5, 6, 1, 7, 7, 8], [1, 9, 9, 9, 9, 4, 0]])
    np.testing.assert_array_equal(
        rows["target_labels"], [[-1, 6, 1, -1, -1, 8, 1], [-1, -1, -1, -1, 4, 1, -1]]
    )
    np.testing.assert_array_equal(
        rows["input_segment_ids"], [[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 0]]
    )
    np.testing.assert_array_equal(
        rows["input_positions"], [[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 0]]
    )
    with pytest.raises(ValueError, match="example 2 has 6 tokens > max_len=5"):
        sft.pack_examples([a, a, c], max_len=5, pad_id=0)


def _tiny_model():
    cfg = transformer_lm_config(
        num_layers=1, model_dim=16, num_heads=1, hidden_dim=32, vocab_size=16, stack="stack"
    )
    model = cfg.set(name="model").instantiate(parent=None)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(1))
    return model, params


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_covers_response_tokens_only_and_packing_isolates_examples():
    model, params = _tiny_model()
    a = sft.sft_example([5, 6, 7], [8, 9], eos_id=1)
    b = sft.sft_example([10, 11], [12, 13, 14], eos_id=1)
    packed = sft.pack_examples([a, b], max_len=16, pad_id=0)
    alone = sft.pad_rows([a, b], max_len=16, pad_id=0)

    @jax.jit
    def run_all(packed, alone):
        def run(batch, method):
            out, _ = functional(
                model,
                prng_key=None,
                state=params,
                inputs=dict(input_batch=batch),
                method=method,
                is_training=False,
            )
            return out

        return (
            run(packed, "forward")[0],
            run(packed, "predict")["logits"],
            run(packed, "score")["per_token_loss"],
            run(alone, "score")["per_token_loss"],
        )

    loss, logits, per_packed, per_alone = jax.device_get(run_all(packed, alone))
    # NumPy: the mean cross-entropy over the response targets (and EOS) only.
    labels = packed["target_labels"]
    live = labels >= 0
    assert live.sum() == 3 + 4  # 2 + 3 response tokens, 2 EOS.
    logp = np.take_along_axis(
        _log_softmax(np.asarray(logits, np.float64)), np.maximum(labels, 0)[..., None], -1
    )[..., 0]
    np.testing.assert_allclose(loss, -(logp * live).sum() / live.sum(), rtol=1e-5)
    # Each example's per-token losses are the same packed (segment ids, positions) as alone.
    n = len(a["input_ids"])
    np.testing.assert_allclose(per_packed[0, :n], per_alone[0, :n], atol=1e-5)
    np.testing.assert_allclose(
        per_packed[0, n : n + len(b["input_ids"])], per_alone[1, : len(b["input_ids"])], atol=1e-5
    )
    # Prompt positions carry no loss at all.
    assert (per_packed[~live] == 0).all()


def _write(tmp_path, records):
    path = tmp_path / "records.json"
    path.write_text(json.dumps(records))
    return str(path)


def _input_cfg(path, **kwargs):
    return sft.SftInput.default_config().set(
        name="input",
        path=path,
        global_batch_size=2,
        max_len=24,
        vocab=sft.CharVocabulary.default_config().set(alphabet="abcdefgh QA:\n"),
        template=sft.ChatTemplate.default_config().set(
            prompt_format="Q: {prompt}\nA: ", response_format="{response}"
        ),
        **kwargs,
    )


def test_sft_input(tmp_path):
    records = [dict(prompt="ab" * (i % 3 + 1), response="c" * (i % 2 + 1)) for i in range(10)]
    path = _write(tmp_path, records)
    train = _input_cfg(path, is_training=True).instantiate(parent=None)
    valid = _input_cfg(path, is_training=False, split="validation").instantiate(parent=None)
    assert len(train.examples) == 8 and len(valid.examples) == 2
    vocab = _vocab("abcdefgh QA:\n")
    expected = sft.sft_example(
        vocab.encode("Q: ab\nA: "), vocab.encode("c"), eos_id=1
    )  # Record 0 is held out.
    np.testing.assert_array_equal(valid.examples[0]["target_labels"], expected["target_labels"])
    batches = list(valid.dataset())
    assert len(batches) == 1 and batches[0]["input_ids"].shape == (2, 24)
    # Training repeats: every target of an epoch is a response token or EOS.
    it = iter(train)
    for _ in range(6):
        batch = next(it)
        labels = batch["target_labels"][batch["target_labels"] >= 0]
        assert set(labels.tolist()) <= {1, vocab.encode("c")[0]}
        assert set(batch) == set(train.element_spec())


def test_sft_input_bad_records(tmp_path):
    path = _write(tmp_path, [dict(prompt="ab", response="c"), dict(prompt="ab")])
    with pytest.raises(ValueError, match=r"input: record 1 of .* has no 'response'"):
        _input_cfg(path, is_training=True, split="all").instantiate(parent=None)
    path = _write(tmp_path, [dict(prompt="a" * 30, response="c")])
    with pytest.raises(ValueError, match=r"input: all record 0 has 39 tokens > max_len=24"):
        _input_cfg(path, is_training=True, split="all").instantiate(parent=None)
    cfg = _input_cfg(path, is_training=True, split="all")
    cfg.template.response_format = "A"
    with pytest.raises(
        ValueError, match=r"^input.template: ChatTemplate.response_format='A' leaves"
    ):
        cfg.instantiate(parent=None)


def test_load_records_file_cases(tmp_path, monkeypatch):
    """Every way the records file can be wrong is one ValueError naming the file; never a hang."""
    import os
    import threading

    fields = ("prompt", "response")

    def load(path):
        return sft.load_records(str(path), fields=fields, what="input")

    good = [dict(prompt="ab", response="c")] * 3
    path = tmp_path / "r.json"
    cases = {
        "missing": None,
        "truncated": json.dumps(good)[:-7],
        "wrong type": json.dumps({"prompt": "ab"}),
        "record not an object": json.dumps(["ab"]),
        "field not a string": json.dumps([dict(prompt=1, response="c")]),
        "deep": "[" * 100_000 + "]" * 100_000,
        "not utf-8": b"\xff\xfe[]",
    }
    for name, content in cases.items():
        if path.exists():
            path.unlink()
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
        with pytest.raises(ValueError, match=r"^input: .*r\.json") as e:
            load(path)
        assert len(str(e.value).splitlines()) == 1, (name, str(e.value))
        assert "Traceback" not in str(e.value)
    # Huge: refused by size, before reading it.
    monkeypatch.setattr(sft, "MAX_RECORDS_BYTES", 1000)
    path.write_text(json.dumps(good * 100))
    with pytest.raises(ValueError, match=r"r\.json"):
        load(path)
    monkeypatch.setattr(sft, "MAX_RECORDS_BYTES", 256 << 20)
    # A link (even to a good file) and a FIFO are refused without following or blocking.
    target = tmp_path / "target.json"
    target.write_text(json.dumps(good))
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(ValueError, match=r"link\.json"):
        load(link)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"fifo\.json"):
        load(fifo)
    # A concurrent writer replacing the file by rename: every read sees a whole version.
    path.write_text(json.dumps(good))
    stop = threading.Event()

    def writer():
        n = 0
        while not stop.is_set():
            n += 1
            tmp = tmp_path / "r.json.tmp"
            tmp.write_text(json.dumps([dict(prompt="ab", response="c")] * (n % 5 + 1)))
            os.replace(tmp, path)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(200):
            records = load(path)
            assert 1 <= len(records) <= 5 and all(r == good[0] for r in records)
    finally:
        stop.set()
        t.join()
    # The shipped sets resolve wherever the package is installed.
    assert (
        len(
            sft.load_records(
                "axlearn-data:post_training/instructions.json", fields=fields, what="x"
            )
        )
        == 400
    )


def test_sft_input_iterator_state_resumes_across_epochs(tmp_path):
    records = [dict(prompt="ab" * (i % 3 + 1), response="c" * (i % 2 + 1)) for i in range(10)]
    train = _input_cfg(_write(tmp_path, records), is_training=True).instantiate(parent=None)
    reference = iter(train)
    expected = [next(reference) for _ in range(12)]  # Several shuffled epochs.
    for cut in (0, 1, 5, 11):
        it = iter(train)
        for _ in range(cut):
            next(it)
        state = train.iterator_state(it)
        resumed = train.restore_iterator(state)
        for want in expected[cut:]:
            got = next(resumed)
            assert all(np.array_equal(got[k], want[k]) for k in want), cut
    assert train.restore_iterator([train.iterator_state(iter(train))]) is not None  # Per process.


@pytest.mark.parametrize(
    "state, message",
    [
        (b'{"num_batches": 1, "epoch": 0', "not JSON"),
        (b"[1, 2, 3]", "must be a dict"),
        (b'{"num_batches": 1, "epoch": 0}', "must be a dict"),
        (b'{"num_batches": "1", "epoch": 0, "offset": 0}', "must be integers"),
        (b'{"num_batches": true, "epoch": 0, "offset": 0}', "must be integers"),
        (b'{"num_batches": 1, "epoch": -2, "offset": 0}', "must be integers"),
        (b"[" * 100000 + b"]" * 100000, "not JSON"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_sft_input_iterator_bad_state(tmp_path, state, message):
    records = [dict(prompt="ab", response="c") for _ in range(10)]
    train = _input_cfg(_write(tmp_path, records), is_training=True).instantiate(parent=None)
    with pytest.raises(ValueError, match=message):
        train.restore_iterator(state)
