"""A tiny linear model and a trainer-style TensorStore checkpoint of it, for the inference tests.

The model's `predict` is `x @ weight + bias` (plus a summary and two module outputs), so the
tests check the runner's outputs against the same product computed with NumPy.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common import layers
from axlearn.common.base_model import BaseModel
from axlearn.common.checkpointer import TensorStoreStateStorage
from axlearn.common.module import Module, child_context
from axlearn.common.optimizers import ParamEmaState
from axlearn.common.trainer import TrainerState
from axlearn.common.utils import NestedTensor, Tensor

IN_DIM = 4
OUT_DIM = 8
STEP = 1000


class LinearModel(BaseModel):
    """y = x @ weight + bias, the weight split over "model"."""

    def __init__(self, cfg: BaseModel.Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._add_child(
            "linear",
            layers.Linear.default_config().set(
                input_dim=IN_DIM,
                output_dim=OUT_DIM,
                bias=True,
                param_partition_spec=(None, "model"),
            ),
        )
        # The dtypes of `x` each trace saw.
        self.traced_dtypes: list[Any] = []

    def forward(self, input_batch: NestedTensor) -> tuple[Tensor, NestedTensor]:
        """The mean of `predict` (unused by the runner)."""
        return self.predict(input_batch).mean(), {}

    def predict(self, input_batch: NestedTensor) -> Tensor:
        """x @ weight + bias; module outputs stats/x_sum and stats/x_min; summary y_max."""
        x = input_batch["x"]
        self.traced_dtypes.append(x.dtype)
        with child_context("stats", module=self):
            self.add_module_output("x_sum", x.sum())
            self.add_module_output("x_min", x.min())
        y = self.linear(x)
        self.add_summary("y_max", y.max())
        return y

    def predict_dict(self, input_batch: NestedTensor) -> NestedTensor:
        """{"x": x, "y": predict(x)}: the batch's rows with their outputs."""
        return {"x": input_batch["x"], "y": self.linear(input_batch["x"])}

    def noisy(self, input_batch: NestedTensor) -> Tensor:
        """x plus uniform noise from the invocation's PRNG key."""
        x = input_batch["x"]
        return x + jax.random.uniform(self.prng_key, x.shape)


def host_params(seed: int = 0) -> dict:
    """Parameters of LinearModel (float32 NumPy, not round numbers)."""
    rng = np.random.default_rng(seed)
    return {
        "linear": {
            "weight": rng.normal(size=(IN_DIM, OUT_DIM)).astype(np.float32),
            "bias": rng.normal(size=(OUT_DIM,)).astype(np.float32),
        }
    }


def numpy_forward(params: dict, x: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    """The model's predict by hand: x @ weight + bias (computed in float64, cast to `dtype`)."""
    w = np.asarray(params["linear"]["weight"], np.float64)
    b = np.asarray(params["linear"]["bias"], np.float64)
    return (np.asarray(x, np.float64) @ w + b).astype(dtype)


def save_trainer_checkpoint(
    root: str, *, params: dict, prng_key: Tensor, ema_params: Optional[dict] = None
) -> str:
    """Saves a TrainerState (key, model, learner) at STEP under `root`; returns the step dir.

    With `ema_params`, the learner holds `ema=ParamEmaState(count, ema_params)`; otherwise two
    unrelated optimizer-like leaves.
    """
    if ema_params is not None:
        learner = dict(ema=ParamEmaState(count=jnp.asarray(7, jnp.int32), ema=ema_params))
    else:
        learner = dict(mu=jnp.zeros([3], jnp.float32), count=jnp.asarray(2, jnp.int32))
    state = TrainerState(
        prng_key=prng_key, model=jax.tree.map(jnp.asarray, params), learner=learner
    )
    ckpt_dir = os.path.join(root, f"step_{STEP:08d}")
    storage = TensorStoreStateStorage.default_config().instantiate()
    storage.save_to_dir(step=STEP, state=state, ckpt_dir=ckpt_dir)
    storage.wait_until_finished()
    return ckpt_dir
