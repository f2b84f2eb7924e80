"""Tests that parameter initialization draws as AXLearn's does (axlearn/common/base_layer.py).

The fixtures in tests/testdata/axlearn_parity/ were written by AXLearn HEAD 34aed43c itself
(jax 0.8.3, CPU): `fuji_init_*` and `fuji_step.npz` for the model of `fuji-test-v3` (float32,
matmul precision "highest"), `families_init.npz` by `make_families_init.py` in that folder for
small layers of every family. Each is compared bit for bit (init) or within 1e-6 (gradients,
learner steps).
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import learner as learner_lib
from axlearn.common import optimizers
from axlearn.common.config import config_for_function
from axlearn.common.learner import ForwardOutputs
from axlearn.common.module import functional as F
from axlearn.common.optimizer_base import OptParam
from axlearn.common.utils import flatten_items

DATA = pathlib.Path(__file__).parent.parent / "testdata" / "axlearn_parity"


def _load(name: str) -> dict:
    with np.load(DATA / name, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _unflatten(flat: dict, prefix: str = "") -> dict:
    out: dict = {}
    for path, value in flat.items():
        if not path.startswith(prefix):
            continue
        *parents, leaf = path[len(prefix) :].split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = jnp.asarray(value)
    return out


@functools.cache
def _fuji():
    from axlearn.experiments.text.gpt import c4_trainer  # pylint: disable=import-outside-toplevel

    cfg = c4_trainer.named_trainer_configs()["fuji-test-v3"]()
    return cfg, cfg.model.clone(name="model").instantiate(parent=None)


def _assert_bit_identical(ours: dict, theirs: dict):
    assert sorted(ours) == sorted(theirs)
    for path, ref in theirs.items():
        value = np.asarray(ours[path])
        assert value.dtype == ref.dtype, path
        np.testing.assert_array_equal(value, ref, err_msg=path)


def test_fuji_model_init_equals_axlearn():
    _, model = _fuji()
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    with jax.set_mesh(mesh):
        params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    ours = dict(flatten_items(params))
    theirs = _load("fuji_init_model.npz")
    _assert_bit_identical(ours, theirs)
    # Not only constants: the random leaves are draws (non-constant) and equal too.
    assert np.std(theirs["decoder/emb/token_emb/weight"]) > 0


def _families_module():
    spec = importlib.util.spec_from_file_location(
        "make_families_init", DATA / "make_families_init.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_FAMILIES = _families_module()
_FAMILY_REF = _load("families_init.npz")


# Families whose eager init takes more than a few seconds on a loaded 2-core CPU run as slow.
_QUICK = {"gqa", "conv2d_depthwise", "linear_normal_fan_avg", "linear_truncated_normal_fan_in"}


@pytest.mark.parametrize(
    "family",
    [
        f if f in _QUICK else pytest.param(f, marks=pytest.mark.slow)
        for f in sorted(_FAMILIES.families())
    ],
)
def test_family_init_equals_axlearn(family):
    ours = _FAMILIES.init_family(family, _FAMILIES.families()[family])
    theirs = {k: v for k, v in _FAMILY_REF.items() if k.startswith(family + "/")}
    assert theirs, family
    _assert_bit_identical(ours, theirs)


def test_family_fixture_covers_every_family():
    assert {k.split("/")[0] for k in _FAMILY_REF} == set(_FAMILIES.families())
    for family in ("mha", "gqa", "mha_fused", "moe", "stacked", "repeated", "pipelined"):
        assert family in _FAMILIES.families()
    # Stacked, repeated and pipelined stacks of the same layers draw the same weights (AXLearn's
    # own invariant): layer i of the stack is slice i of the repeated/pipelined stack.
    for i in range(4):
        stage, j = divmod(i, 2)
        for name in ("feed_forward/linear1/weight", "self_attention/attention/o_proj/weight"):
            stacked = _FAMILY_REF[f"stacked/layer{i}/{name}"]
            np.testing.assert_array_equal(_FAMILY_REF[f"repeated/repeat/layer/{name}"][i], stacked)
            np.testing.assert_array_equal(
                _FAMILY_REF[f"pipelined/pipeline/layer/layer{j}/{name}"][stage], stacked
            )


def _batch():
    ids = np.random.default_rng(0).integers(1, 32, size=(4, 33), dtype=np.int32)
    return dict(input_ids=ids[:, :32], target_labels=ids[:, 1:])


def _rel(ours, ref) -> float:
    return float(np.linalg.norm(np.asarray(ours) - ref) / max(np.linalg.norm(ref), 1e-30))


def test_fuji_loss_and_gradients_match_axlearn():
    _, model = _fuji()
    params, step, batch = _unflatten(_load("fuji_init_model.npz")), _load("fuji_step.npz"), _batch()

    def loss_fn(p):
        (loss, _), _ = F(
            model,
            prng_key=jax.random.PRNGKey(1),
            state=p,
            inputs=dict(input_batch=batch),
            is_training=True,
        )
        return loss

    with jax.default_matmul_precision("highest"):
        loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    assert abs(float(loss) - float(step["loss"])) <= 1e-6 * abs(float(step["loss"]))
    grads = dict(flatten_items(grads))
    assert sorted(grads) == sorted(k[len("grad/") :] for k in step if k.startswith("grad/"))
    # Measured: 2.1e-6 at worst (decoder/emb/token_emb/weight), from the forward's float32
    # reductions (the init is bit-identical); the loss itself agrees to 6e-8.
    for path, g in grads.items():
        assert _rel(g, step["grad/" + path]) <= 3e-6, path


@pytest.mark.parametrize("variant", ["cfg", "adamw"])
def test_fuji_learner_steps_match_axlearn(variant):
    cfg, model = _fuji()
    params, step, batch = _unflatten(_load("fuji_init_model.npz")), _load("fuji_step.npz"), _batch()
    if variant == "cfg":
        learner_cfg = cfg.learner
    else:
        adamw = config_for_function(optimizers.adamw_optimizer).set(
            learning_rate=1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01
        )
        learner_cfg = learner_lib.Learner.default_config().set(optimizer=adamw)
    learner = learner_cfg.clone(name="learner").instantiate(parent=None)

    def fn(*, model_params, inputs):
        (loss, aux), collection = F(
            model, prng_key=jax.random.PRNGKey(1), state=model_params, inputs=inputs,
            is_training=True,
        )  # fmt: skip
        return ForwardOutputs(loss=loss, aux=aux, output_collection=collection)

    def wrap(p):
        return jax.tree.map(lambda v: OptParam(v, None, 1.0), p)

    @jax.jit
    def train_step(p, state):
        return F(
            learner,
            method="forward_and_backward",
            prng_key=jax.random.PRNGKey(2),
            state=state,
            inputs=dict(fn=fn, opt_params=wrap(p), inputs=dict(input_batch=batch)),
            is_training=True,
        )

    state = learner.init(wrap(params))
    with jax.default_matmul_precision("highest"):
        for i in range(3):
            out, collection = train_step(params, state)
            ref_loss = float(step[f"{variant}/loss{i}"])
            assert abs(float(out.forward_outputs.loss) - ref_loss) <= 1e-6 * ref_loss
            params, state = out.backward_outputs.updated_params, collection.state_updates
            if i in (0, 2):
                tag = "after1" if i == 0 else "after3"
                for path, value in flatten_items(params):
                    assert _rel(value, step[f"{variant}/{tag}/{path}"]) <= 1e-6, (tag, path)
