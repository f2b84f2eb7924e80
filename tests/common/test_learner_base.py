"""Tests axlearn/common/learner_base.py: the LearnerModule interface and who implements it."""

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import learner, learner_base, update_transformation
from axlearn.common.config import config_class
from axlearn.common.optimizer_base import OptParam
from axlearn.common.utils import TensorSpec

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_learners_and_update_transformations_are_learner_modules():
    assert issubclass(learner.BaseLearner, learner_base.LearnerModule)
    assert issubclass(learner.Learner, learner_base.LearnerModule)
    assert issubclass(learner.CompositeLearner, learner_base.LearnerModule)
    assert issubclass(update_transformation.UpdateTransformation, learner_base.LearnerModule)
    assert learner.LearnerModule is learner_base.LearnerModule  # The old import path.


def test_the_interface_raises_until_implemented():
    module = learner_base.LearnerModule.default_config().set(name="m").instantiate(parent=None)
    with pytest.raises(NotImplementedError):
        module.init({})
    with pytest.raises(NotImplementedError):
        module.create_state_partition_specs({})


class _Counter(learner_base.LearnerModule):
    """A learner module whose state counts, per parameter, with a configurable start."""

    @config_class
    class Config(learner_base.LearnerModule.Config):
        """Configures _Counter."""

        # The initial count.
        start: int = 0

    def create_state_partition_specs(self, model_param_specs):
        return {k: TensorSpec(shape=[], dtype=jnp.int32) for k in model_param_specs}

    def init(self, model_params):
        return {k: jnp.int32(self.config.start) for k in model_params}


def test_a_subclass_gives_matching_state_and_specs():
    counter = _Counter.default_config().set(name="c", start=3).instantiate(parent=None)
    params = dict(w=OptParam(jnp.ones((2, 2)), None, None), b=OptParam(jnp.ones(2), None, None))
    state = counter.init(params)
    specs = counter.create_state_partition_specs(
        {k: TensorSpec(shape=list(p.shape), dtype=p.dtype) for k, p in params.items()}
    )
    assert set(state) == set(specs) == {"w", "b"}
    for k in state:
        np.testing.assert_array_equal(state[k], 3)
        assert state[k].dtype == specs[k].dtype and list(state[k].shape) == specs[k].shape


def test_learner_base_imports_without_the_learner():
    code = (
        "import sys; import axlearn.common.learner_base; "
        "bad = [m for m in ('axlearn.common.learner', 'axlearn.common.update_transformation') "
        "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
