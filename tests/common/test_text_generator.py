"""Tests for axlearn/common/text_generator.py: TextGenerator on a trained run."""

from __future__ import annotations

import pytest

from axlearn.common import inference
from axlearn.common.inference import InferenceRunner
from axlearn.common.text_generator import TextGenerator
from tests.trained_run import MODULE

# Decodes with the trained run's model (the session fixture's training run, one compilation).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runner(trained_dir) -> InferenceRunner:
    runner = InferenceRunner.from_trainer_dir(trained_dir, evalers=[], module=MODULE)
    assert runner.restore() == 6
    return runner


def test_public_path_of_inference_module():
    assert inference.TextGenerator is TextGenerator


def test_text_generator_round_trip_and_stream(runner):
    generator = TextGenerator.from_runner(runner)
    ids = generator.encode("def f():\n    return 1")
    assert ids[0] == runner.eos_token_id
    text = generator.sample(["The Python"], max_new_tokens=10, temperature=0.8, seed=0)[0]
    streamed = "".join(generator.stream("The Python", max_new_tokens=10, temperature=0.8, seed=0))
    assert streamed == text and text
