"""Tests for axlearn/common/inference.py: InferenceRunner on a trained run.

The run is the session fixture `trained_dir` (tests/trained_run.py): a 1-layer GPT trained for
6 steps on one device. Here it is restored on the test process's 8-device mesh.
"""

from __future__ import annotations

import numpy as np
import pytest

from axlearn.common.inference import InferenceRunner, logits_modifier
from tests.trained_run import MODULE

# Each test decodes with the trained run's model (a compilation or two each, plus the training
# run of the session fixture): seconds alone, tens of seconds on a loaded 2-core machine.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runner(trained_dir) -> InferenceRunner:
    runner = InferenceRunner.from_trainer_dir(trained_dir, evalers=[], module=MODULE)
    assert runner.restore() == 6
    return runner


def _greedy_by_full_forwards(runner: InferenceRunner, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding without a cache: a full forward per token, argmax of the last logits."""
    ids = list(prompt)
    width = 16  # One shape (one compilation); causal attention ignores the padding after.
    for _ in range(n):
        padded = np.asarray([ids + [runner.pad_token_id] * (width - len(ids))])
        logits = runner.predict(padded)
        ids.append(int(np.argmax(logits[0, len(ids) - 1])))
    return ids[len(prompt) :]


def test_restore_reads_only_model_parameters(runner, trained_dir):
    import jax

    from axlearn.common.checkpointer import read_state_spec

    saved = read_state_spec(f"{trained_dir}/checkpoints/step_00000006")
    assert "learner" in saved and "model" in saved  # A full trainer checkpoint...

    def leaves(tree):
        return {
            jax.tree_util.keystr(path): (leaf.shape, leaf.dtype)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        }

    assert leaves(runner.params) == leaves(saved["model"])  # ...of which only model/...
    assert runner.step == 6


def test_greedy_sample_decode_equals_repeated_full_forwards(runner):
    eos = runner.eos_token_id
    prompts = [[eos, 17, 256, 1000], [eos, 45]]  # Different lengths in one batch.
    outputs = runner.sample_decode(prompts, max_new_tokens=8, temperature=0, stop_tokens=[])
    for prompt, out in zip(prompts, outputs):
        assert out == _greedy_by_full_forwards(runner, prompt, 8)


def test_beam_search_with_one_beam_is_greedy(runner):
    prompt = [runner.eos_token_id, 17, 256, 1000]
    (result,) = runner.beam_search_decode([prompt], max_new_tokens=6, num_beams=1)
    greedy = _greedy_by_full_forwards(runner, prompt, 6)
    assert runner.eos_token_id not in greedy
    # The search stops once no live beam can beat the best finished one (AXLearn's rule), so
    # the live beam is greedy decoding up to that point.
    live = result.live_tokens
    assert 1 <= len(live) and live == greedy[: len(live)]
    # Its score is the sum of those tokens' log-probabilities under full forwards.
    ids = prompt + live
    logits = runner.predict(np.asarray([ids]))[0].astype(np.float64)
    log_probs = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))[:, None]
        - logits.max(-1, keepdims=True)
    )
    expected = sum(log_probs[len(prompt) - 1 + i, t] for i, t in enumerate(live))
    assert result.live_score == pytest.approx(expected, abs=1e-3)


def test_sampling_is_deterministic_per_seed_and_streams_the_same_tokens(runner):
    prompt = [runner.eos_token_id, 17, 256]
    # A hot temperature: the 6-step model is nearly deterministic at 1.
    kwargs = dict(max_new_tokens=12, temperature=3.0, top_k=500, top_p=0.99, stop_tokens=[])
    a = runner.sample_decode([prompt], seed=3, **kwargs)[0]
    assert a == runner.sample_decode([prompt], seed=3, **kwargs)[0]
    assert a != runner.sample_decode([prompt], seed=4, **kwargs)[0]
    assert list(runner.stream_sample(prompt, seed=3, **kwargs)) == a
    assert len(a) == 12


def test_stop_tokens_end_generation(runner):
    prompt = [runner.eos_token_id, 17, 256]
    free = runner.sample_decode([prompt], max_new_tokens=10, temperature=0, stop_tokens=[])[0]
    stop = free[3]
    cut = runner.sample_decode([prompt], max_new_tokens=10, temperature=0, stop_tokens=[stop])[0]
    assert cut == free[: free.index(stop)]
    streamed = list(
        runner.stream_sample(prompt, max_new_tokens=10, temperature=0, stop_tokens=[stop])
    )
    assert streamed == cut


def test_bad_arguments_are_clear_errors(runner):
    with pytest.raises(ValueError, match="Prompt 0 is empty"):
        runner.sample_decode([[]], max_new_tokens=3)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        runner.sample_decode([[1, 5]], max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        logits_modifier(temperature=-1)
    with pytest.raises(ValueError, match="num_beams must be >= 1"):
        runner.beam_search_decode([[1, 5]], max_new_tokens=3, num_beams=0)


def test_generation_is_bounded_by_the_context(runner):
    """Issue 38: `--max_new_tokens=1000000000` is an error naming the context (the run's
    training sequence length), not a native abort allocating the KV cache."""
    context = runner.trainer_config.input.source.max_sequence_length
    assert runner.context_length == context
    prompt = [runner.eos_token_id, 17, 256]
    for call in (
        lambda n: runner.sample_decode([prompt], max_new_tokens=n),
        lambda n: runner.beam_search_decode([prompt], max_new_tokens=n, num_beams=2),
        lambda n: list(runner.stream_sample(prompt, max_new_tokens=n)),
    ):
        with pytest.raises(ValueError) as e:
            call(10**9)
        assert f"exceed the model's context of {context} tokens" in str(e.value)
        assert f"ask for at most {context - len(prompt)} new tokens" in str(e.value)
    # The longest allowed request works (greedy, no stop: exactly that many tokens).
    out = runner.sample_decode(
        [prompt], max_new_tokens=context - len(prompt), temperature=0, stop_tokens=[]
    )[0]
    assert len(out) == context - len(prompt)


def test_restore_refuses_an_index_leaf_outside_the_checkpoint(trained_dir, tmp_path):
    """Issue 38: `generate`/`eval` restore (as the trainer does) refuses an index whose leaf
    `file` is absolute, naming the rule; the outside copy it points at is not read."""
    # pylint: disable-next=import-outside-toplevel
    import json
    import shutil

    from tests.common.checkpointer_test_utils import edit_our_index
    from tests.common.test_path_containment import Sentinel

    run = tmp_path / "run"
    shutil.copytree(trained_dir, run)
    step_dir = run / "checkpoints" / "step_00000006"
    index = json.loads((step_dir / "manifest.json").read_text())  # Our index (format 2).
    leaf = next(x for x in index["leaves"] if x["path"].startswith("model/"))
    outside = tmp_path / "outside"
    shutil.copytree(step_dir / leaf["file"], outside)
    chunk = next(p for p in outside.iterdir() if not p.name.startswith("."))
    sentinel = Sentinel(str(chunk), chunk.read_bytes())

    def point_outside(index):
        for entry in index["leaves"]:
            if entry["path"] == leaf["path"]:
                entry["file"] = str(outside)

    edit_our_index(str(step_dir), point_outside)
    runner = InferenceRunner.from_trainer_dir(str(run), evalers=[], module=MODULE)
    with pytest.raises(ValueError) as e:
        runner.restore(6)
    assert "is absolute" in str(e.value) and "stay inside it" in str(e.value)
    assert repr(leaf["path"])[:20] in str(e.value)
    sentinel.assert_untouched()
