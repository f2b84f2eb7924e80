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
from axlearn.common.pipeline import CircularSchedule, GPipeSchedule, Pipeline
from axlearn.common.utils import NestedTensor, Tensor


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
        # set `pipeline.schedule` to pick GPipeSchedule or CircularSchedule).
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
                f"{cfg.num_stages} x num_virtual_stages={num_virtual} (= {chunks})"
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

    @staticmethod
    def num_virtual_stages(cfg: Config) -> int:
        """V of `cfg.pipeline.schedule` (1 unless it is a CircularSchedule)."""
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
) -> PipelinedTransformerLayer.Config:
    """A PipelinedTransformerLayer config computing the same function as `stack_cfg`.

    Args:
        stack_cfg: A RepeatedTransformerLayer/StackedTransformerLayer config (its num_layers,
            layer and input_dim are kept).
        num_stages: S, the size of the `pipeline` mesh axis.
        num_microbatches: M.
        num_virtual_stages: V; 1 gives GPipeSchedule, more a CircularSchedule.

    Returns:
        The pipelined config.
    """
    cfg = PipelinedTransformerLayer.default_config().set(
        num_layers=stack_cfg.num_layers,
        layer=stack_cfg.layer,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
    )
    if stack_cfg.input_dim is not REQUIRED:
        cfg.set(input_dim=stack_cfg.input_dim)
    if num_virtual_stages == 1:
        cfg.pipeline.schedule = GPipeSchedule.default_config()
    else:
        cfg.pipeline.schedule = CircularSchedule.default_config().set(
            num_virtual_stages=num_virtual_stages
        )
    return cfg


__all__ = ["PipelinedTransformerLayer", "_TransformerPipeline", "pipelined_stack_config"]
