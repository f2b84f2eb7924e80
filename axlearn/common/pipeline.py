"""Pipeline parallelism in SPMD JAX: a layer run as `num_stages` stages over microbatches.

`Pipeline` holds one child `layer` (a *stage*) whose parameters are stacked on a leading axis of
size `num_stages * num_virtual_stages` and sharded over the `pipeline` mesh axis, so each device
of that axis holds only its own stages' parameters. A batch is split into `num_microbatches`
microbatches; a `jax.lax.scan` over time steps runs every stage once per step, in parallel (a
`jax.vmap` over the stage axis whose lanes live on different devices), and shifts each stage's
output to the next stage. XLA lowers that shift along the sharded stage axis to a
collective-permute, so there is one program (SPMD), not one per stage.

Layout of the stacked parameters: row `r = s * V + v` holds *chunk* `c = v * S + s`, where S is
`num_stages`, V is the schedule's `num_virtual_stages`, `s` the stage (device along the pipeline
axis) and `v` the virtual stage (round). A microbatch runs through chunks 0, 1, ..., S*V - 1 in
order, i.e. S stages V times (the interleaved/circular schedule); with V = 1 (GPipe) row s is
chunk s. Sharding the rows over the pipeline axis puts rows `s*V ... s*V + V - 1` (chunks s,
s + S, s + 2S, ...) on device s.

Schedules (see `docs/pipeline.md`): at time step t, stage s works on item j = t - s, i.e.
microbatch `j % M` in round `j // M`; the item is real when 0 <= j < V*M (otherwise the stage
idles: the "bubble"). Stage 0 takes microbatch `t % M`, from the input in round 0 and from the
previous round's last-stage output afterwards (which needs M >= S when V > 1). There are
`V*M + S - 1` steps, so the bubble fraction is (S - 1) / (V*M + S - 1). Backward passes come
from autodiff of the forward scan (all forwards, then all backwards, as GPipe).

Every (chunk, microbatch) pair gets its own PRNG key, so dropout differs per microbatch.
Outputs that the stage's layers add to the output collection (summaries, module outputs) are
dropped: they would be stacked over time steps that include bubble steps.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np
from jax import numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common import pipeline_1f1b
from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import (
    REQUIRED,
    Configurable,
    InstantiableConfig,
    Required,
    config_class,
)
from axlearn.common.module import (
    InvocationContext,
    Module,
    child_context,
    new_output_collection,
    set_current_context,
)
from axlearn.common.pipeline_layout import (
    _from_microbatches,
    _to_microbatches,
    chunk_order_to_rows,
    rows_to_chunk_order,
    transpose_from_pipeline_stage_outputs,
    transpose_to_pipeline_stage_inputs,
)
from axlearn.common.repeat import init_stacked_layer, prepend_axis_to_specs
from axlearn.common.utils import NestedTensor, Tensor, with_sharding_constraint
from axlearn.common.utils import _current_abstract_mesh as current_abstract_mesh


class BaseSchedule(Configurable):
    """Which (microbatch, virtual stage) each stage works on at each time step.

    A schedule with S stages, V virtual stages and M microbatches runs `num_steps()` time steps;
    at step t, stage s works on item j = t - s (microbatch j % M, round j // M) when
    0 <= j < V * M.
    """

    @config_class
    class Config(Configurable.Config):
        """Configures BaseSchedule."""

        # Number of pipeline stages S (set by the Pipeline).
        num_stages: Required[int] = REQUIRED
        # Number of microbatches M (set by the Pipeline).
        num_microbatches: Required[int] = REQUIRED

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self._validate()

    @property
    def num_stages(self) -> int:
        """S."""
        return self.config.num_stages

    @property
    def num_microbatches(self) -> int:
        """M."""
        return self.config.num_microbatches

    @property
    def num_virtual_stages(self) -> int:
        """V: how many non-adjacent chunks of layers each stage holds."""
        return 1

    def _validate(self):
        cfg = self.config
        for name in ("num_stages", "num_microbatches"):
            value = getattr(cfg, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{type(self).__name__}: {name} must be a positive int, got {value!r}; set "
                    f"{type(self).__name__}.{name} to 1 or more."
                )

    # True for schedules whose backward pass is not autodiff of the forward scan (1F1B).
    explicit_backward = False

    def num_steps(self) -> int:
        """The number of time steps: V * M + S - 1."""
        return self.num_virtual_stages * self.num_microbatches + self.num_stages - 1

    def bubble_fraction(self) -> float:
        """The fraction of stage-steps that idle: (S - 1) / (V * M + S - 1)."""
        return (self.num_stages - 1) / self.num_steps()

    def stage_items(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """What each stage works on at time step `t` (a scalar, possibly traced).

        Args:
            t: The time step.

        Returns:
            (microbatch, virtual_stage, valid), each int/bool [S]: stage s processes microbatch
            `microbatch[s]` with its chunk of virtual stage `virtual_stage[s]`; `valid[s]` is
            False in bubble steps (the stage's result is then discarded).
        """
        s = jnp.arange(self.num_stages)
        j = t - s
        m = self.num_microbatches
        valid = (j >= 0) & (j < self.num_virtual_stages * m)
        microbatch = jnp.mod(j, m)
        virtual_stage = jnp.clip(jnp.floor_divide(j, m), 0, self.num_virtual_stages - 1)
        return microbatch, virtual_stage, valid


class GPipeSchedule(BaseSchedule):
    """GPipe (https://arxiv.org/abs/1811.06965): each stage holds one chunk of layers.

    All microbatches run forward through the S stages, then backward (by autodiff). Bubble:
    (S - 1) / (M + S - 1).
    """


class StreamSchedule(BaseSchedule):
    """A GPipe-ordered schedule for num_microbatches divisible by num_stages.

    Each stage holds one chunk of layers and works on the same (microbatch, step) items as
    `GPipeSchedule`, so the pipeline computes the same function with the same bubble
    (S - 1) / (M + S - 1). AXLearn's stream schedule streams microbatches through a buffer of
    S slots, which needs M % S == 0; ours keeps GPipe's data layout and only enforces that
    constraint, so configs written for it run unchanged.
    """

    def _validate(self):
        super()._validate()
        cfg = self.config
        if cfg.num_microbatches % cfg.num_stages:
            raise ValueError(
                f"StreamSchedule: num_microbatches={cfg.num_microbatches} must be a multiple of "
                f"num_stages={cfg.num_stages}; change num_microbatches or use GPipeSchedule."
            )


def _validate_num_virtual_stages(schedule: BaseSchedule) -> int:
    """Checks a schedule's `num_virtual_stages` config field (shared by the V-chunk schedules).

    Args:
        schedule: A schedule whose config has `num_virtual_stages`.

    Returns:
        V.

    Raises:
        ValueError: If V is not an int >= 1.
    """
    v = schedule.config.num_virtual_stages
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        name = type(schedule).__name__
        raise ValueError(
            f"{name}: num_virtual_stages must be >= 1, got {v!r}; set {name}.num_virtual_stages "
            "to the number of chunks of layers per stage (2 or more; 1 holds one chunk)."
        )
    return v


class _VirtualStagesSchedule(BaseSchedule):
    """A schedule whose stages hold `num_virtual_stages` chunks of layers each (a base class).

    Shares the config field, its property and its validation between `CircularSchedule` and
    `InterleavedOneFOneBSchedule`.
    """

    @config_class
    class Config(BaseSchedule.Config):
        """Configures _VirtualStagesSchedule."""

        # V: the number of chunks of layers (virtual stages) per stage.
        num_virtual_stages: Required[int] = REQUIRED

    @property
    def num_virtual_stages(self) -> int:
        """V: how many non-adjacent chunks of layers each stage holds."""
        return self.config.num_virtual_stages

    def _validate(self):
        super()._validate()
        _validate_num_virtual_stages(self)


class CircularSchedule(_VirtualStagesSchedule):
    """The circular (interleaved) schedule: each stage holds V non-adjacent chunks of layers.

    Microbatches run through the S stages V times; stage s holds chunks s, s + S, ...,
    s + (V-1) S. Each step does 1/V of a GPipe stage's work, so the bubble
    (S - 1) / (V * M + S - 1) is about V times smaller. Needs M >= S (a microbatch leaving the
    last stage re-enters the first one M steps after it first entered it).
    """

    def _validate(self):
        super()._validate()
        cfg = self.config
        v = cfg.num_virtual_stages
        if v > 1 and cfg.num_microbatches < cfg.num_stages:
            raise ValueError(
                f"CircularSchedule with num_virtual_stages={v} needs num_microbatches >= "
                f"num_stages, got num_microbatches={cfg.num_microbatches} < "
                f"num_stages={cfg.num_stages}; set num_microbatches to {cfg.num_stages} or more, "
                "or num_virtual_stages to 1."
            )


class OneFOneBSchedule(BaseSchedule):
    """1F1B (PipeDream-flush, https://arxiv.org/abs/2104.04473): bounded activation memory.

    Each stage holds one chunk of layers. The backward pass is not autodiff of the forward
    scan: a `jax.custom_vjp` around the pipelined layer runs, per tick, one forward (under
    `jax.vjp`) and one backward on every stage, keeping residuals in a ring buffer of
    min(M, 2 S - 1) slots per stage, so activation memory does not grow with M (see
    `axlearn.common.pipeline_1f1b`). The forward runs twice (forward pass, then again inside
    the backward pass). Bubble: (S - 1) / (M + S - 1), as GPipe. Any M >= 1.
    """

    explicit_backward = True

    def num_steps(self) -> int:
        """The ticks of the 1F1B scan (forward and backward): V M + V S + S - 2."""
        return pipeline_1f1b.num_ticks(
            self.num_stages, self.num_virtual_stages, self.num_microbatches
        )

    def bubble_fraction(self) -> float:
        """Idle forward and backward slots: (S - 1) / (V * M + S - 1)."""
        s, v, m = self.num_stages, self.num_virtual_stages, self.num_microbatches
        return (s - 1) / (v * m + s - 1)

    def tick_table(self) -> dict[str, Any]:
        """What every stage runs at every tick (see `pipeline_1f1b.tick_table`).

        Returns:
            The tick table dict.
        """
        return pipeline_1f1b.tick_table(
            self.num_stages, self.num_virtual_stages, self.num_microbatches
        )


class InterleavedOneFOneBSchedule(OneFOneBSchedule, _VirtualStagesSchedule):
    """Interleaved 1F1B (Megatron's virtual pipeline stages): V chunks of layers per stage.

    Stage s holds chunks s, s + S, ..., s + (V - 1) S (the circular layout); microbatches go
    through the stages in groups of S, round by round, so it needs num_microbatches to be a
    multiple of num_stages. Bubble (S - 1) / (V * M + S - 1), about V times smaller than
    1F1B's; a ring of (V + 1) S - 1 chunk residuals ((1 + 1/V) S - 1/V microbatches of a
    stage) per stage.
    """

    @config_class
    class Config(_VirtualStagesSchedule.Config):
        """Configures InterleavedOneFOneBSchedule."""

    def _validate(self):
        super()._validate()
        cfg = self.config
        if cfg.num_microbatches % cfg.num_stages:
            s = cfg.num_stages
            below, above = cfg.num_microbatches // s * s, (cfg.num_microbatches // s + 1) * s
            choices = f"{below} or {above}" if below else f"{above}"
            raise ValueError(
                f"InterleavedOneFOneBSchedule: num_microbatches={cfg.num_microbatches} is not a "
                f"multiple of num_stages={s} (microbatches go round in groups of {s}); set "
                f"num_microbatches to {choices}, or use CircularSchedule."
            )


class Pipeline(BaseLayer):
    """Runs `num_layers` pipeline stages of `layer` over `num_microbatches` microbatches.

    See the module docstring. Parameter paths: `<pipeline>/layer/...` with a leading stacked axis
    of size num_layers * num_virtual_stages (sharded over `mesh_axis`).
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures Pipeline."""

        # The stage layer config (one chunk of layers).
        layer: Required[InstantiableConfig] = REQUIRED
        # Number of pipeline stages S (must equal the size of the mesh's `mesh_axis`).
        num_layers: Required[int] = REQUIRED
        # Number of microbatches M the batch is split into.
        num_microbatches: Required[int] = REQUIRED
        # The schedule (num_stages and num_microbatches are set from this config).
        schedule: InstantiableConfig = GPipeSchedule.default_config()
        # The mesh axis the stages are sharded over.
        mesh_axis: str = "pipeline"

    class Output(NamedTuple):
        """carry: the last chunk's carry, [B, ...]; ys: per-chunk outputs [S * V, B, ...]."""

        carry: NestedTensor
        ys: NestedTensor

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("layer", cfg.layer)
        try:
            self._schedule: BaseSchedule = cfg.schedule.set(
                num_stages=cfg.num_layers, num_microbatches=cfg.num_microbatches
            ).instantiate()
        except ValueError as e:
            # One line naming this config's path (num_microbatches and num_layers are set here).
            raise ValueError(f"{self.path()}.schedule: {e}") from None

    @property
    def schedule(self) -> BaseSchedule:
        """The instantiated schedule."""
        return self._schedule

    def num_stacked(self) -> int:
        """S * V: the size of the stacked parameter axis."""
        return self.config.num_layers * self._schedule.num_virtual_stages

    def create_parameter_specs_recursively(self):
        return prepend_axis_to_specs(
            super().create_parameter_specs_recursively(),
            self.num_stacked(),
            mesh_axis=self.config.mesh_axis,
        )

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[NestedTensor] = None
    ) -> NestedTensor:
        return init_stacked_layer(self, prng_key, prebuilt=prebuilt, count=self.num_stacked())

    def _check_mesh(self):
        cfg = self.config
        mesh = current_abstract_mesh()
        if mesh is None:
            return  # Unsharded (e.g. a unit test without a mesh): the same math on one device.
        shape = dict(mesh.shape)
        if cfg.mesh_axis not in shape:
            raise ValueError(
                f"{self.path()}: the mesh has no '{cfg.mesh_axis}' axis (axes "
                f"{tuple(mesh.axis_names)}, shape {tuple(shape.values())}); a Pipeline with "
                f"num_stages={cfg.num_layers} needs one of size {cfg.num_layers}"
            )
        if shape[cfg.mesh_axis] != cfg.num_layers:
            raise ValueError(
                f"{self.path()}: mesh axis '{cfg.mesh_axis}' has size {shape[cfg.mesh_axis]} but "
                f"num_stages={cfg.num_layers}; they must be equal"
            )

    def _constrain(self, x: Tensor) -> Tensor:
        """Shards the leading (stage) axis of `x` over the pipeline axis."""
        if current_abstract_mesh() is None:
            return x
        spec = PartitionSpec(self.config.mesh_axis, *([PartitionSpec.UNCONSTRAINED] * (x.ndim - 1)))
        return with_sharding_constraint(x, spec)

    def _run(
        self,
        fn: Callable[[NestedTensor, NestedTensor], tuple[NestedTensor, NestedTensor]],
        carry: NestedTensor,
        *,
        side_inputs: Optional[NestedTensor] = None,
    ) -> Output:
        """Pipelines `fn(carry, side_inputs) -> (carry, y)` over the stages and microbatches.

        Equivalent to running, for each chunk c = 0 .. S*V - 1 in order,
        `carry, ys[c] = fn(carry, side_inputs)` with the chunk's parameters, separately for each
        microbatch. Call `self.layer` inside `fn`.

        Args:
            fn: The per-chunk function.
            carry: Tensors with a leading batch axis B (divisible by num_microbatches).
            side_inputs: Optional tensors with leading batch axis B, given to every chunk (each
                chunk sees its microbatch's rows).

        Returns:
            An Output.

        Raises:
            ValueError: On a batch not divisible by num_microbatches, or a bad mesh.
        """
        cfg = self.config
        self._check_mesh()
        schedule = self._schedule
        num_stages, m = cfg.num_layers, cfg.num_microbatches
        v_stages = schedule.num_virtual_stages
        side_inputs = {} if side_inputs is None else side_inputs
        leaves = jax.tree.leaves((carry, side_inputs))
        batch = leaves[0].shape[0]
        for leaf in leaves:
            if leaf.shape[0] != batch:
                raise ValueError(
                    f"{self.path()}: inputs have different leading batch sizes "
                    f"{sorted({x.shape[0] for x in leaves})}"
                )
        if batch % m != 0:
            raise ValueError(
                f"{self.path()}: batch size {batch} is not divisible by num_microbatches={m}; "
                f"set {self.path()}.num_microbatches to a divisor of {batch} or change the batch "
                "size."
            )
        # [M, mb, ...].
        buffer = jax.tree.map(lambda x: _to_microbatches(x, m), carry)
        side_mb = jax.tree.map(lambda x: _to_microbatches(x, m), side_inputs)

        prng_key = self.prng_key
        if schedule.explicit_backward:
            return self._run_explicit_backward(fn, buffer, side_mb, prng_key)
        with child_context(
            "layer", module=self.layer, output_collection=new_output_collection()
        ) as layer_context:
            # [S, V, ...]: row s * V + v.
            params = jax.tree.map(
                lambda p: p.reshape(num_stages, v_stages, *p.shape[1:]), layer_context.state
            )

            def stage_fn(params_s, chunk, microbatch, x_s, side_s):
                key = None
                if prng_key is not None:
                    key = jax.random.fold_in(prng_key, chunk * m + microbatch)
                with child_context(
                    "iter",
                    module=self.layer,
                    state=params_s,
                    prng_key=key,
                    output_collection=new_output_collection(),
                ):
                    return fn(x_s, side_s)

            def step(loop_carry, t):
                state, buffer = loop_carry
                microbatch, virtual_stage, valid = schedule.stage_items(t)
                stage0_in = jax.tree.map(lambda b: b[jnp.mod(t, m)], buffer)
                # Shift: stage s takes stage s-1's output of the previous step
                # (a collective-permute along the pipeline axis); stage 0 takes a microbatch.
                inputs = jax.tree.map(
                    lambda x0, st: self._constrain(jnp.concatenate([x0[None], st[:-1]], axis=0)),
                    stage0_in,
                    state,
                )
                # Bubble slots (not `valid`) compute on stale but finite activations; their
                # outputs are never used. (Zeros would be worse: e.g. the backward pass of an
                # RMSNorm of zeros overflows in float16, and inf * 0 = NaN.)
                del valid
                side_t = jax.tree.map(lambda x: self._constrain(x[microbatch]), side_mb)
                params_t = jax.tree.map(
                    lambda p: jax.vmap(
                        lambda ps, vs: jax.lax.dynamic_index_in_dim(ps, vs, 0, keepdims=False),
                        spmd_axis_name=cfg.mesh_axis,
                    )(p, virtual_stage),
                    params,
                )
                chunk = virtual_stage * num_stages + jnp.arange(num_stages)
                out, ys = jax.vmap(stage_fn, spmd_axis_name=cfg.mesh_axis)(
                    params_t, chunk, microbatch, inputs, side_t
                )
                out = jax.tree.map(self._constrain, out)
                # The last stage's output of item j = t - S + 1 goes back to the buffer: the
                # next round's input for that microbatch, or the final output.
                j_last = t - (num_stages - 1)
                write = j_last >= 0
                idx = jnp.mod(j_last, m)
                buffer = jax.tree.map(
                    lambda b, o: jax.lax.dynamic_update_index_in_dim(
                        b, jnp.where(write, o[-1], b[idx]), idx, 0
                    ),
                    buffer,
                    out,
                )
                return (out, buffer), ys

            # Stages > 0 start on a copy of microbatch 0 (finite, input-like values).
            state0 = jax.tree.map(
                lambda b: self._constrain(jnp.broadcast_to(b[0], (num_stages, *b.shape[1:]))),
                buffer,
            )
            (_, buffer), ys = jax.lax.scan(step, (state0, buffer), jnp.arange(schedule.num_steps()))
        # ys: [T, S, mb, ...] -> [S * V (chunk order), M, mb, ...] -> [S * V, B, ...].
        chunks = np.arange(num_stages * v_stages)
        stage_of = chunks % num_stages
        t_idx = (chunks // num_stages)[:, None] * m + np.arange(m)[None, :] + stage_of[:, None]
        ys = jax.tree.map(lambda y: jax.vmap(_from_microbatches)(y[t_idx, stage_of[:, None]]), ys)
        return self.Output(carry=jax.tree.map(_from_microbatches, buffer), ys=ys)

    def _run_explicit_backward(
        self,
        fn: Callable[[NestedTensor, NestedTensor], tuple[NestedTensor, NestedTensor]],
        buffer: NestedTensor,
        side_mb: NestedTensor,
        prng_key: Optional[Tensor],
    ) -> Output:
        """`_run` for 1F1B schedules: `pipeline_1f1b.run_pipeline_1f1b` with a custom VJP.

        Each chunk call runs in a root context of `self.layer` (the backward pass is traced
        after this module's context has closed), with the same PRNG key per (chunk,
        microbatch) as the other schedules. Tensors `fn` closes over are hoisted with
        `jax.closure_convert` so that they are differentiated too.
        """
        cfg = self.config
        num_stages, m = cfg.num_layers, cfg.num_microbatches
        v_stages = self._schedule.num_virtual_stages
        is_training = self.is_training
        with child_context(
            "layer", module=self.layer, output_collection=new_output_collection()
        ) as layer_context:
            stacked = layer_context.state
        # [S, V, ...]: row s * V + v.
        params = jax.tree.map(lambda p: p.reshape(num_stages, v_stages, *p.shape[1:]), stacked)

        def raw_stage(params_c, key, chunk, microbatch, x, side):
            if key is not None:
                key = jax.random.fold_in(key, chunk * m + microbatch)
            context = InvocationContext(
                name="layer",
                parent=None,
                module=self.layer,
                state=params_c,
                is_training=is_training,
                prng_key=key,
                output_collection=new_output_collection(),
            )
            with set_current_context(context, require_parent=False):
                return fn(x, side)

        row = jax.tree.map(lambda p: p[0, 0], params)
        one = lambda t: jax.tree.map(lambda a: a[0], t)  # noqa: E731
        converted, consts = jax.closure_convert(
            raw_stage, row, prng_key, jnp.int32(0), jnp.int32(0), one(buffer), one(side_mb)
        )

        def stage_fn(params_c, key, consts_, chunk, microbatch, x, side):
            return converted(params_c, key, chunk, microbatch, x, side, *consts_)

        out, ys = pipeline_1f1b.run_pipeline_1f1b(
            stage_fn,
            params=params,
            consts=list(consts),
            key=prng_key,
            inputs=buffer,
            side_inputs=side_mb,
            num_stages=num_stages,
            num_virtual_stages=v_stages,
            num_microbatches=m,
            constrain=self._constrain,
            axis_name=cfg.mesh_axis,
        )
        # ys: [S, V, M, mb, ...] (rows) -> [S * V (chunk order), B, ...].
        ys = jax.tree.map(
            lambda y: jax.vmap(_from_microbatches)(
                rows_to_chunk_order(
                    y.reshape(num_stages * v_stages, *y.shape[2:]),
                    num_stages=num_stages,
                    num_virtual_stages=v_stages,
                )
            ),
            ys,
        )
        return self.Output(carry=jax.tree.map(_from_microbatches, out), ys=ys)


def pipeline_summary(cfg: Pipeline.Config) -> dict[str, Any]:
    """Describes a pipeline config: stages, virtual stages, microbatches, steps and bubble.

    Args:
        cfg: A Pipeline config.

    Returns:
        A dict with num_stages, num_virtual_stages, num_microbatches, num_steps, schedule (class
        name) and bubble_fraction.
    """
    schedule = cfg.schedule.clone(
        num_stages=cfg.num_layers, num_microbatches=cfg.num_microbatches
    ).instantiate()
    return dict(
        schedule=type(schedule).__name__,
        num_stages=schedule.num_stages,
        num_virtual_stages=schedule.num_virtual_stages,
        num_microbatches=schedule.num_microbatches,
        num_steps=schedule.num_steps(),
        bubble_fraction=schedule.bubble_fraction(),
    )


def find_pipelines(root: Module) -> list[Pipeline]:
    """All Pipeline modules in the module tree rooted at `root`, in depth-first order.

    Args:
        root: The root module (e.g. the trainer's model).

    Returns:
        The Pipeline modules.
    """
    found, stack = [], [root]
    while stack:
        module = stack.pop()
        if isinstance(module, Pipeline):
            found.append(module)
        stack.extend(reversed(list(module.children.values())))
    return found


def pipeline_report(
    root: Module, param_specs: NestedTensor, mesh_shape: dict[str, int]
) -> Optional[dict[str, Any]]:
    """Per-stage parameters and parameter memory of a model with Pipeline layers.

    Args:
        root: The model module.
        param_specs: Its parameter specs (ParameterSpec leaves with shape, dtype, mesh_axes).
        mesh_shape: {axis name: size} of the trainer's mesh.

    Returns:
        None if the model has no Pipeline; else a dict with "pipelines" (one
        `pipeline_summary` per Pipeline, with its path), "stacked_params_per_stage" (parameters
        of the pipelined layers each stage holds), "shared_params_per_stage" (parameters outside
        them, which every stage holds), "params_per_stage" (their sum) and
        "param_bytes_per_device" (the bytes of one device's parameter shards).
    """
    pipelines = find_pipelines(root)
    if not pipelines:
        return None
    axes = {p.config.mesh_axis for p in pipelines}
    stacked = shared = 0
    per_device_bytes = 0
    for spec in jax.tree.leaves(param_specs, is_leaf=lambda x: hasattr(x, "mesh_axes")):
        size = int(np.prod(spec.shape))
        mesh_axes = tuple(spec.mesh_axes or ())
        first = mesh_axes[0] if mesh_axes else None
        if first in axes:
            stacked += size // mesh_shape.get(first, 1)
        else:
            shared += size
        divisor = 1
        for entry in mesh_axes:
            for name in entry if isinstance(entry, tuple) else (entry,):
                if name is not None:
                    divisor *= mesh_shape.get(name, 1)
        per_device_bytes += size * np.dtype(spec.dtype or np.float32).itemsize // divisor
    return dict(
        pipelines=[dict(path=p.path(), **pipeline_summary(p.config)) for p in pipelines],
        stacked_params_per_stage=stacked,
        shared_params_per_stage=shared,
        params_per_stage=stacked + shared,
        param_bytes_per_device=int(per_device_bytes),
    )


def format_pipeline_report(report: dict[str, Any]) -> list[str]:
    """Log lines for `pipeline_report`'s dict.

    Args:
        report: The report.

    Returns:
        One line per pipeline, then the per-stage parameter line.
    """
    lines = []
    for p in report["pipelines"]:
        lines.append(
            f"Pipeline {p['path']}: {p['schedule']}, {p['num_stages']} stages x "
            f"{p['num_virtual_stages']} virtual, {p['num_microbatches']} microbatches, "
            f"{p['num_steps']} steps, bubble fraction {p['bubble_fraction']:.4f} "
            "(= (S-1)/(V*M+S-1))"
        )
    lines.append(
        f"Parameters per pipeline stage: {report['params_per_stage']:,} "
        f"(pipelined layers {report['stacked_params_per_stage']:,} + shared "
        f"{report['shared_params_per_stage']:,}); parameter memory per device "
        f"{report['param_bytes_per_device'] / 2**20:.2f} MiB"
    )
    return lines


def gpipe_bubble_fraction(num_stages: int, num_microbatches: int, num_virtual_stages: int = 1):
    """(S - 1) / (V * M + S - 1).

    Args:
        num_stages: S.
        num_microbatches: M.
        num_virtual_stages: V.

    Returns:
        The fraction of idle stage-steps.
    """
    return (num_stages - 1) / (num_virtual_stages * num_microbatches + num_stages - 1)


__all__ = [
    "BaseSchedule",
    "CircularSchedule",
    "GPipeSchedule",
    "InterleavedOneFOneBSchedule",
    "OneFOneBSchedule",
    "StreamSchedule",
    "Pipeline",
    "chunk_order_to_rows",
    "find_pipelines",
    "format_pipeline_report",
    "pipeline_report",
    "gpipe_bubble_fraction",
    "pipeline_summary",
    "rows_to_chunk_order",
    "transpose_from_pipeline_stage_outputs",
    "transpose_to_pipeline_stage_inputs",
]
