"""PipelinedTransformerLayer: a transformer stack run as pipeline stages.

Public names are re-exported by `axlearn.common.attention`.

A drop-in for `RepeatedTransformerLayer` / `StackedTransformerLayer`: the same function of the
same weights, with the `num_layers` layers split into `num_stages * V` chunks of
K = num_layers / (num_stages * V) consecutive layers (V: the schedule's `num_virtual_stages`,
1 for GPipe). Each chunk is a `stage` (a `StackedTransformerLayer` of K layers by default); the
chunks' parameters are stacked on a leading axis sharded over the `pipeline` mesh axis.

Parameter paths: `transformer/pipeline/layer/layer{k}/...` (k < K) with leading axis S * V; row
`s * V + v` holds chunk `c = v * S + s`, i.e. layers `c * K ... c * K + K - 1` of the unpipelined
stack. `axlearn.common.pipeline_checkpoint` converts trees (parameters, optimizer state) between
this layout and `transformer/repeat/layer/...` ([num_layers, ...]).
"""

from typing import Optional

from axlearn.common.attention.stack import BaseStackedTransformerLayer, StackedTransformerLayer
from axlearn.common.attention.transformer import BaseTransformerLayer
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.module import Module
from axlearn.common.pipeline import (
    CircularSchedule,
    GPipeSchedule,
    InterleavedOneFOneBSchedule,
    OneFOneBSchedule,
    Pipeline,
)
from axlearn.common.utils import NestedTensor, Tensor, get_or_none, split_prng_key


class _TransformerPipeline(Pipeline):
    """A Pipeline of transformer stages: carries `data`, feeds per-example kwargs to each stage."""

    def forward(self, data: Tensor, **layer_kwargs) -> BaseTransformerLayer.Output:
        """Runs the stages over `data` [batch, length, dim].

        Args:
            data: The input of the first layer.
            **layer_kwargs: Keyword arguments of `TransformerLayer.forward`; tensors with a
                leading batch axis are split into microbatches, those with leading axis 1 are
                broadcast, None values are dropped.

        Returns:
            BaseTransformerLayer.Output with the last layer's data (no auxiliary outputs).

        Raises:
            ValueError: If `return_aux` is requested or a kwarg has another leading size.
        """
        if layer_kwargs.get("return_aux"):
            raise ValueError(
                f"{self.path()}: return_aux={layer_kwargs['return_aux']} is not supported by a "
                "pipelined stack"
            )
        batch = data.shape[0]
        side, static = {}, {}
        for name, value in layer_kwargs.items():
            if value is None or name == "return_aux":
                continue
            shape = getattr(value, "shape", None)
            if shape is None or len(shape) == 0:
                static[name] = value
            elif shape[0] == batch:
                side[name] = value
            elif shape[0] == 1:
                static[name] = value
            else:
                raise ValueError(
                    f"{self.path()}: {name} has leading size {shape[0]}; expected the batch size "
                    f"{batch} or 1"
                )

        def stage_fn(x, side_inputs):
            out = self.layer(x, **side_inputs, **static)
            return out.data, {}

        result = self._run(stage_fn, data, side_inputs=side)
        return BaseTransformerLayer.Output(data=result.carry)


class PipelinedTransformerLayer(BaseStackedTransformerLayer):
    """A transformer stack whose layers run as pipeline stages over microbatches.

    See the module docstring for the layout and `axlearn.common.pipeline` for the schedules.
    """

    @config_class
    class Config(BaseStackedTransformerLayer.Config):
        """Configures PipelinedTransformerLayer."""

        # Number of pipeline stages S (the size of the `pipeline` mesh axis).
        num_stages: Required[int] = REQUIRED
        # Number of microbatches M each batch is split into.
        num_microbatches: Required[int] = REQUIRED
        # The config of one chunk of layers (num_layers and layer are set by this layer).
        stage: InstantiableConfig = StackedTransformerLayer.default_config()
        # The pipeline config (layer, num_layers and num_microbatches are set by this layer;
        # set `pipeline.schedule` to pick GPipeSchedule, CircularSchedule, OneFOneBSchedule or
        # InterleavedOneFOneBSchedule).
        pipeline: InstantiableConfig = _TransformerPipeline.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if self._extra_carry() or cfg.scan_kwargs:
            raise NotImplementedError(
                f"{self.path()}: carry={cfg.carry!r} / scan_kwargs={cfg.scan_kwargs!r} are not "
                "supported by a pipelined stack (it carries only 'data'); unset them."
            )
        if cfg.peak_stochastic_depth_rate:
            raise NotImplementedError(
                f"{self.path()}.peak_stochastic_depth_rate={cfg.peak_stochastic_depth_rate} is "
                "not supported by a pipelined stack; set the layers' stochastic_depth.rate or "
                "use StackedTransformerLayer/RepeatedTransformerLayer."
            )
        num_virtual = self.num_virtual_stages(cfg)
        chunks = cfg.num_stages * num_virtual
        if cfg.num_layers % chunks != 0:
            raise ValueError(
                f"{self.path()}: num_layers={cfg.num_layers} is not divisible by num_stages="
                f"{cfg.num_stages} x num_virtual_stages={num_virtual} (= {chunks}); set "
                f"{self.path()}.num_layers to a multiple of {chunks} or change num_stages / "
                "num_virtual_stages."
            )
        stage = cfg.stage.clone(
            input_dim=cfg.input_dim,
            num_layers=cfg.num_layers // chunks,
            layer=cfg.layer.clone(input_dim=cfg.input_dim),
        )
        self._add_child(
            "pipeline",
            cfg.pipeline.clone(
                layer=stage, num_layers=cfg.num_stages, num_microbatches=cfg.num_microbatches
            ),
        )

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[NestedTensor] = None
    ) -> NestedTensor:
        """Pre-splits `num_layers` keys as [chunks, layers per chunk] (as AXLearn).

        Layer j of chunk c gets the (c * layers_per_chunk + j)-th successive split, the key a
        StackedTransformerLayer or RepeatedTransformerLayer of the same layers gives it.

        Args:
            prng_key: The key.
            prebuilt: See `BaseLayer.initialize_parameters_recursively`.

        Returns:
            {"pipeline": {"layer": params stacked on [chunks]}}.
        """
        cfg = self.config
        chunks = cfg.num_stages * self.num_virtual_stages(cfg)
        keys = split_prng_key(prng_key, (chunks, cfg.num_layers // chunks))
        return dict(
            pipeline=self.pipeline.initialize_parameters_recursively(
                keys, prebuilt=get_or_none(prebuilt, "pipeline")
            )
        )

    @staticmethod
    def num_virtual_stages(cfg: Config) -> int:
        """V of `cfg.pipeline.schedule` (1 unless it has num_virtual_stages)."""
        return getattr(cfg.pipeline.schedule, "num_virtual_stages", 1)

    def forward(self, data: Tensor, **layer_kwargs) -> BaseTransformerLayer.Output:
        """See `_TransformerPipeline.forward`."""
        return self.pipeline(data, **layer_kwargs)

    def init_states(self, *, time_step: Optional[Tensor], data, **layer_kwargs):
        """Not supported: decode with the unpipelined layout (see pipeline_checkpoint)."""
        raise NotImplementedError(
            f"{self.path()}: decoding a PipelinedTransformerLayer is not supported; convert the "
            "checkpoint to the RepeatedTransformerLayer layout with "
            "axlearn.common.pipeline_checkpoint"
        )

    def extend_step(self, cached_states: NestedTensor, data: Tensor, **layer_kwargs):
        """Not supported (see `init_states`)."""
        return self.init_states(time_step=None, data=data)


def pipelined_stack_config(
    stack_cfg: BaseStackedTransformerLayer.Config,
    *,
    num_stages: int,
    num_microbatches: int,
    num_virtual_stages: int = 1,
    schedule: Optional[str] = None,
) -> PipelinedTransformerLayer.Config:
    """A PipelinedTransformerLayer config computing the same function as `stack_cfg`.

    Args:
        stack_cfg: A RepeatedTransformerLayer/StackedTransformerLayer config (its num_layers,
            layer and input_dim are kept).
        num_stages: S, the size of the `pipeline` mesh axis.
        num_microbatches: M.
        num_virtual_stages: V; 1 gives GPipeSchedule, more a CircularSchedule (by default).
        schedule: One of SCHEDULES ("gpipe", "circular", "1f1b", "interleaved_1f1b"); None
            picks "gpipe" for V = 1 and "circular" otherwise.

    Returns:
        The pipelined config.

    Raises:
        ValueError: On an unknown schedule name, or V > 1 with "gpipe"/"1f1b".
    """
    cfg = PipelinedTransformerLayer.default_config().set(
        num_layers=stack_cfg.num_layers,
        layer=stack_cfg.layer,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
    )
    if stack_cfg.input_dim is not REQUIRED:
        cfg.set(input_dim=stack_cfg.input_dim)
    cfg.pipeline.schedule = schedule_config(schedule, num_virtual_stages=num_virtual_stages)
    return cfg


# Schedule names accepted by `schedule_config` (and PipelineModifier.schedule).
SCHEDULES = ("gpipe", "circular", "1f1b", "interleaved_1f1b")


def schedule_config(name: Optional[str], *, num_virtual_stages: int = 1):
    """The pipeline schedule config for a schedule name.

    Args:
        name: One of SCHEDULES, or None ("gpipe" if num_virtual_stages == 1, else "circular").
        num_virtual_stages: V (for "circular" and "interleaved_1f1b").

    Returns:
        The schedule config.

    Raises:
        ValueError: On an unknown name, or V > 1 for a schedule with one chunk per stage.
    """
    if name is None:
        name = "gpipe" if num_virtual_stages == 1 else "circular"
    if name not in SCHEDULES:
        raise ValueError(f"schedule={name!r} is not one of {SCHEDULES}; pick one of them.")
    if name in ("gpipe", "1f1b"):
        if num_virtual_stages != 1:
            raise ValueError(
                f"schedule={name!r} has one chunk per stage but num_virtual_stages="
                f"{num_virtual_stages}; set num_virtual_stages=1 or use "
                f"{'circular' if name == 'gpipe' else 'interleaved_1f1b'}."
            )
        return (GPipeSchedule if name == "gpipe" else OneFOneBSchedule).default_config()
    klass = CircularSchedule if name == "circular" else InterleavedOneFOneBSchedule
    return klass.default_config().set(num_virtual_stages=num_virtual_stages)


__all__ = [
    "PipelinedTransformerLayer",
    "SCHEDULES",
    "_TransformerPipeline",
    "pipelined_stack_config",
    "schedule_config",
]
