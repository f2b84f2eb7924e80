"""Tests for axlearn/common/state_builder.py and SpmdTrainer.Config.init_state_builder.

The source run is the tiny bigram LM of trainer_test_utils (a few steps, one checkpoint); the
target runs wrap it under another scope name, so the values it starts from are checked against
the source checkpoint exactly.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.base_layer import BaseLayer
from axlearn.common.checkpointer import (
    CheckpointIndexError,
    CheckpointValidationType,
    TensorStoreStateStorage,
    build_step_dir,
    checkpoint_paths,
)
from axlearn.common.config import config_class, config_for_function
from axlearn.common.module import Module
from axlearn.common.state_builder import (
    Builder,
    ChainBuilder,
    ChainConverter,
    Converter,
    MergeStateConverter,
    ModelStateScopeConverter,
    PosEmbeddingConverter,
    RestoreAndConvertBuilder,
    SimpleWeightModifierBuilder,
    TensorStoreStateStorageBuilder,
    UnknownBuilderError,
    clone_tree,
    get_builder,
)
from axlearn.common.trainer import SpmdTrainer, TrainerState
from axlearn.common.utils import flatten_items
from tests.common import trainer_test_utils as tu

SOURCE_STEP = 3


class Wrapped(BaseLayer):
    """The bigram LM under the child name `student` (a renamed scope)."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures Wrapped."""

        # The hidden dim of the wrapped LM.
        dim: int = 32

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._add_child("student", tu.BigramLm.default_config().set(dim=self.config.dim))

    def forward(self, input_batch):
        return self.student(input_batch)


def _source_fn(trainer_dir: str):
    """A TrainerConfigFn factory (what `source_trainer_config` instantiates to)."""

    def fn() -> SpmdTrainer.Config:
        return tu.bigram_trainer_config(trainer_dir, max_step=SOURCE_STEP)

    return fn


@pytest.fixture(scope="module")
def source_run(tmp_path_factory) -> dict[str, Any]:
    """Trains the source run for SOURCE_STEP steps; returns its dir and checkpointed arrays."""
    trainer_dir = str(tmp_path_factory.mktemp("source"))
    cfg = tu.bigram_trainer_config(trainer_dir, max_step=SOURCE_STEP, checkpoint_every=SOURCE_STEP)
    trainer = cfg.instantiate(parent=None)
    trainer.run(jax.random.PRNGKey(0))
    state = jax.tree.map(np.asarray, trainer.trainer_state)
    ckpt_dir = os.path.join(trainer_dir, "checkpoints")
    assert os.path.isdir(build_step_dir(ckpt_dir, step=SOURCE_STEP))
    return dict(dir=trainer_dir, ckpt_dir=ckpt_dir, state=state)


def _target_cfg(trainer_dir: str, builder: Optional[Builder.Config], dim: int = 32, **kw):
    cfg = tu.bigram_trainer_config(trainer_dir, **kw)
    cfg.model = Wrapped.default_config().set(dim=dim, dtype=jnp.float32)
    cfg.init_state_builder = builder
    return cfg


def _scope_builder(source_run, scope, *, base_dir: Optional[str] = None) -> Builder.Config:
    return RestoreAndConvertBuilder.default_config().set(
        builder=TensorStoreStateStorageBuilder.default_config().set(
            base_dir=base_dir or source_run["ckpt_dir"],
            step=SOURCE_STEP,
            validation=CheckpointValidationType.CONTAINS_STATE,
        ),
        converter=ModelStateScopeConverter.default_config().set(
            source_trainer_config=config_for_function(_source_fn).set(
                trainer_dir=source_run["dir"]
            ),
            scope=scope,
        ),
    )


def _init(cfg: SpmdTrainer.Config, seed: int = 1) -> SpmdTrainer:
    trainer = cfg.instantiate(parent=None)
    trainer.init(jax.random.PRNGKey(seed))
    return trainer


def _assert_tree_equal(actual, expected):
    actual_items, expected_items = flatten_items(actual), flatten_items(expected)
    assert [k for k, _ in actual_items] == [k for k, _ in expected_items]
    for (path, a), (_, e) in zip(actual_items, expected_items):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e), err_msg=path)


def test_finetune_from_a_renamed_scope_of_another_runs_checkpoint(source_run, tmp_path):
    cfg = _target_cfg(str(tmp_path / "target"), _scope_builder(source_run, {"student": ""}))
    trainer = _init(cfg)
    # The model equals the source checkpoint's model exactly, under the new scope.
    _assert_tree_equal(trainer.trainer_state.model["student"], source_run["state"].model)
    # The learner state is the target's own fresh state (Adam moments start at zero).
    assert trainer.step == 0
    mu = trainer.trainer_state.learner["optimizer"][0].mu["student"]["proj"]["weight"]
    np.testing.assert_array_equal(np.asarray(mu), 0)
    # Every array is on the trainer's shardings.
    shardings = trainer.trainer_stateshardings_of_specs
    for arr, sharding in zip(
        jax.tree.leaves(trainer.trainer_state), jax.tree.leaves(shardings), strict=True
    ):
        assert arr.sharding.is_equivalent_to(sharding, arr.ndim)


def test_partial_scope_keeps_the_random_init_of_the_rest(source_run, tmp_path):
    builder = _scope_builder(source_run, {"student/proj": "proj"})
    trainer = _init(_target_cfg(str(tmp_path / "a"), builder))
    plain = _init(_target_cfg(str(tmp_path / "b"), None))
    student = trainer.trainer_state.model["student"]
    _assert_tree_equal(student["proj"], source_run["state"].model["proj"])
    # The parameters not built get the same values as without a builder.
    _assert_tree_equal(student["emb"], plain.trainer_state.model["student"]["emb"])


def test_the_run_trains_from_the_built_state_and_a_resume_does_not_rebuild(source_run, tmp_path):
    target_dir = str(tmp_path / "target")
    cfg = _target_cfg(
        target_dir, _scope_builder(source_run, {"student": ""}), max_step=2, checkpoint_every=2
    )
    trainer = cfg.instantiate(parent=None)
    trainer.run(jax.random.PRNGKey(1))
    # The run counts its own steps from 0 (the source was at step SOURCE_STEP).
    assert trainer.step == 2
    saved = [os.path.basename(p) for p in checkpoint_paths(os.path.join(target_dir, "checkpoints"))]
    assert saved[-1] == "step_00000002" and "step_00000003" not in saved
    # Training moved the parameters away from the source's.
    proj = np.asarray(trainer.trainer_state.model["student"]["proj"]["weight"])
    assert not np.array_equal(proj, source_run["state"].model["proj"]["weight"])
    # A resumed run restores its own checkpoint: the builder (here pointing at nothing) is not
    # run, so it does not fail.
    resumed_cfg = _target_cfg(
        target_dir,
        _scope_builder(source_run, {"student": ""}, base_dir=str(tmp_path / "missing")),
        max_step=2,
        checkpoint_every=2,
    )
    resumed = resumed_cfg.instantiate(parent=None)
    resumed.run(jax.random.PRNGKey(1))
    np.testing.assert_array_equal(
        np.asarray(resumed.trainer_state.model["student"]["proj"]["weight"]), proj
    )


def test_complete_restore_of_another_run(source_run, tmp_path):
    cfg = tu.bigram_trainer_config(str(tmp_path / "target"))
    cfg.init_state_builder = TensorStoreStateStorageBuilder.default_config().set(
        base_dir=source_run["ckpt_dir"], step=SOURCE_STEP
    )
    trainer = _init(cfg)
    # Model, learner and PRNG key are the source's; `init` takes the builder's step (AXLearn).
    _assert_tree_equal(trainer.trainer_state, source_run["state"])
    assert trainer.step == SOURCE_STEP


class _DoubleProj(SimpleWeightModifierBuilder):
    """Doubles the weight of every `proj` layer."""

    def _modify_weight(self, weight):
        return weight * 2


def test_tensors_builder_runs_after_random_init(tmp_path):
    builder = _DoubleProj.default_config().set(layer_name="proj")
    trainer = _init(_target_cfg(str(tmp_path / "a"), builder))
    plain = _init(_target_cfg(str(tmp_path / "b"), None))
    got = trainer.trainer_state.model["student"]["proj"]["weight"]
    want = plain.trainer_state.model["student"]["proj"]["weight"]
    np.testing.assert_array_equal(np.asarray(got), 2 * np.asarray(want))
    _assert_tree_equal(
        trainer.trainer_state.model["student"]["emb"], plain.trainer_state.model["student"]["emb"]
    )


class _AddToSource(Converter):
    """Adds `amount` to every restored array (target unchanged); records the call order."""

    @config_class
    class Config(Converter.Config):
        """Configures _AddToSource."""

        # Added to the restored arrays.
        amount: float = 1.0

    calls: list = []

    def target_state_type(self) -> Builder.StateType:
        return Builder.StateType.TENSORS

    def target_to_source(self, target):
        _AddToSource.calls.append(("t2s", self.config.amount))
        return target, None

    def source_to_target(self, source, aux):
        _AddToSource.calls.append(("s2t", self.config.amount))
        state = jax.tree.map(lambda x: x + self.config.amount, source.trainer_state)
        return Builder.State(step=source.step, trainer_state=state, built_keys=source.built_keys)


def test_converter_chain_restore_merge_and_order(tmp_path):
    saved = {"a": jnp.arange(4.0), "b": jnp.full([2], 7.0)}
    ckpt_dir = build_step_dir(str(tmp_path), step=5)
    storage = TensorStoreStateStorage.default_config().instantiate()
    storage.save_to_dir(step=5, state=saved, ckpt_dir=ckpt_dir)
    storage.wait_until_finished()

    _AddToSource.calls = []
    cfg = RestoreAndConvertBuilder.default_config().set(
        name="builder",
        builder=TensorStoreStateStorageBuilder.default_config().set(dir=ckpt_dir),
        converter=ChainConverter.default_config().set(
            converters=[
                _AddToSource.default_config().set(amount=10.0),
                _AddToSource.default_config().set(amount=100.0),
                # Its source_to_target runs last: the target's "b" is kept as it was.
                MergeStateConverter.default_config().set(selection_regexes=[("b", "TARGET")]),
            ]
        ),
    )
    target = {"a": jnp.zeros([4]), "b": jnp.ones([2])}
    built = cfg.instantiate(parent=None)(
        Builder.State(step=0, trainer_state=target, built_keys=set())
    )
    np.testing.assert_array_equal(np.asarray(built.trainer_state["a"]), np.arange(4.0) + 110.0)
    np.testing.assert_array_equal(np.asarray(built.trainer_state["b"]), np.ones([2]))
    assert built.step == 5 and built.built_keys == {"a", "b"}
    # target_to_source runs last converter first; source_to_target first converter first.
    assert _AddToSource.calls == [("t2s", 100.0), ("t2s", 10.0), ("s2t", 10.0), ("s2t", 100.0)]


def test_missing_checkpoint_names_the_directory(tmp_path):
    builder = (
        TensorStoreStateStorageBuilder.default_config()
        .set(name="b", base_dir=str(tmp_path / "nope"), step=7)
        .instantiate(parent=None)
    )
    state = Builder.State(step=None, trainer_state={"x": jnp.zeros([2])}, built_keys=set())
    with pytest.raises(CheckpointIndexError, match="nope/step_00000007"):
        builder(state)


def test_storage_builder_needs_dir_or_base_dir_and_step():
    for kw in (dict(), dict(base_dir="/x"), dict(dir="/x/step_00000001", step=1)):
        with pytest.raises(ValueError, match="set either dir, or base_dir and step"):
            TensorStoreStateStorageBuilder.default_config().set(name="b", **kw).instantiate(
                parent=None
            )


def _scope_converter(scope) -> ModelStateScopeConverter:
    return (
        ModelStateScopeConverter.default_config()
        .set(name="conv", source_trainer_config=config_for_function(_source_fn), scope=scope)
        .instantiate(parent=None)
    )


def _model_state(model: dict) -> Builder.State:
    return Builder.State(
        step=0, trainer_state=TrainerState(prng_key={}, model=model, learner={}), built_keys=set()
    )


def test_scope_converter_shape_mismatch_names_the_parameter():
    source = _model_state({"proj": {"weight": jnp.zeros([4, 4])}})
    target = _model_state({"student": {"proj": {"weight": jnp.zeros([4, 8])}}})
    with pytest.raises(ValueError, match=r"shape mismatch for model/student/proj/weight"):
        _scope_converter({"student": ""}).source_to_target(source, target)


def test_scope_converter_missing_scopes_are_named():
    source = _model_state({"proj": {"weight": jnp.zeros([4])}})
    target = _model_state({"student": {"proj": {"weight": jnp.zeros([4])}}})
    with pytest.raises(ValueError, match="source scope 'encoder'"):
        _scope_converter({"student": "encoder"}).source_to_target(source, target)
    with pytest.raises(ValueError, match="target scope 'teacher'"):
        _scope_converter({"teacher": "proj"}).source_to_target(source, target)


def test_trainer_refuses_a_built_parameter_of_the_wrong_shape(source_run, tmp_path):
    # The source's proj is 32x32; a dim-16 target cannot take it (the restore names the leaf).
    cfg = _target_cfg(str(tmp_path / "t"), _scope_builder(source_run, {"student": ""}), dim=16)
    with pytest.raises(ValueError, match="shape mismatch for model/student/emb/weight"):
        _init(cfg)


def test_chain_builder_checks_structure_and_state_is_a_pytree():
    class Drop(Builder):
        def input_state_type(self):
            return Builder.StateType.TENSORS

        def __call__(self, state):
            tree = dict(state.trainer_state)
            del tree["b"]
            return Builder.State(step=state.step, trainer_state=tree, built_keys=set())

    state = Builder.State(
        step=1, trainer_state={"a": jnp.ones([1]), "b": jnp.ones([1])}, built_keys={"a"}
    )
    copy = clone_tree(state)
    assert isinstance(copy, Builder.State) and copy.built_keys == {"a"}
    assert copy.trainer_state["a"] is state.trainer_state["a"]
    copy.built_keys.add("b")
    assert state.built_keys == {"a"}
    chain = ChainBuilder.default_config().set(name="c", builders=[Drop.default_config()])
    with pytest.raises(ValueError, match="b"):
        chain.instantiate(parent=None)(state)


def test_get_builder_spec():
    builder = get_builder("tensor_store_state_storage:/runs/a/checkpoints/step_00000010")
    assert isinstance(builder, TensorStoreStateStorageBuilder)
    assert builder.config.dir == "/runs/a/checkpoints/step_00000010"
    assert get_builder(builder) is builder
    with pytest.raises(UnknownBuilderError, match="tensor_store_state_storage:"):
        get_builder("nope:/x")


def _pos_emb_state(weight: np.ndarray, other: float) -> Builder.State:
    model = {"emb": {"pos_emb": {"weight": jnp.asarray(weight)}}, "w": jnp.full((2,), other)}
    state = TrainerState(prng_key=jnp.zeros((2,), jnp.uint32), model=model, learner={"mu": other})
    return Builder.State(step=3, trainer_state=state, built_keys=set())


def _pos_emb_converter(strategy: str):
    return (
        PosEmbeddingConverter.default_config()
        .set(
            name="pos_emb",
            strategy=strategy,
            source_trainer_config=config_for_function(lambda: None),
        )
        .instantiate(parent=None)
    )


@pytest.mark.parametrize(
    "strategy,src_len,tgt_len",
    [
        ("truncate", 6, 4),
        ("truncate_left", 6, 4),
        ("replace_target_prefix_with_source", 3, 5),
        ("keep_target", 6, 4),
    ],
)
def test_pos_embedding_converter_strategies_vs_numpy(strategy, src_len, tgt_len):
    rng = np.random.default_rng(0)
    src = rng.normal(size=(1, src_len, 3)).astype(np.float32)
    tgt = rng.normal(size=(1, tgt_len, 3)).astype(np.float32)
    out = _pos_emb_converter(strategy).source_to_target(
        _pos_emb_state(src, 1.0), _pos_emb_state(tgt, 2.0)
    )
    expected = {
        "truncate": src[:, :tgt_len],
        "truncate_left": src[:, src_len - tgt_len :],
        "replace_target_prefix_with_source": np.concatenate([src, tgt[:, src_len:]], axis=1),
        "keep_target": tgt,
    }[strategy]
    model = out.trainer_state.model
    np.testing.assert_array_equal(np.asarray(model["emb"]["pos_emb"]["weight"]), expected)
    np.testing.assert_array_equal(np.asarray(model["w"]), [1.0, 1.0])  # The source's model.
    assert out.trainer_state.learner == {"mu": 2.0}  # The target's learner state.


@pytest.mark.parametrize(
    "strategy,src_shape,tgt_shape,message",
    [
        ("truncate", (1, 3, 2), (1, 5, 2), "Target length 5 must be <= source len 3."),
        (
            "replace_target_prefix_with_source",
            (1, 5, 2),
            (1, 3, 2),
            "Target length 3 must be >= source len 5.",
        ),
        (
            "truncate",
            (1, 5, 2),
            (1, 3, 4),
            "Incompatible shapes: source (1, 5, 2) vs. target (1, 3, 4).",
        ),
    ],
)
def test_pos_embedding_converter_errors_keep_axlearns_text_and_name_the_path(
    strategy, src_shape, tgt_shape, message
):
    with pytest.raises(ValueError) as info:
        _pos_emb_converter(strategy).source_to_target(
            _pos_emb_state(np.zeros(src_shape, np.float32), 1.0),
            _pos_emb_state(np.zeros(tgt_shape, np.float32), 2.0),
        )
    assert str(info.value) == message  # AXLearn's tests match the text literally.
    assert info.value.__notes__ == ["at pos_emb"]
