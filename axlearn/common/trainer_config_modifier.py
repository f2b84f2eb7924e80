"""Trainer config modifiers: small, named edits of an `SpmdTrainer.Config`, used by mesh rules.

A mesh rule maps a `--mesh_selector` regex to a mesh shape or to one of these (or a
`ChainConfigModifier` of several), e.g.

    mesh_rules = [
        ("tpu-v5litepod-256", ChainConfigModifier.default_config().set(config_modifiers=[
            MeshShapeModifier.default_config().set(mesh_shape=(1, -1, 1, 256, 1, 1)),
            RematSpecModifier.default_config().set(remat_policies={
                "model.decoder.transformer.layer": RematSpec(prevent_cse=False, policy=...)}),
            GradientAccumulationModifier.default_config().set(grad_acc_steps=4),
        ])),
    ]

Each modifier is called as `modifier(trainer_cfg) -> trainer_cfg` and edits the config in place.
Module paths are dotted paths of config fields from the trainer config's root (e.g.
`model.decoder.transformer.layer`); dict entries are addressed by their key
(`evalers.validation`). A path that does not exist, or a field the target lacks, is an error
naming the path and listing the keys that do exist (a `ModifierPathError`, both a ValueError and
an AttributeError): a modifier never silently does nothing.

Modifiers that edit the learner (`GradientAccumulationModifier`, `FP8ConfigModifier`) first set
an unset (REQUIRED) `learner` to `Learner.default_config()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from axlearn.common.config import (
    REQUIRED,
    ConfigBase,
    ConfigModifier,
    ConfigOr,
    Configurable,
    Required,
    config_class,
    config_for_function,
    maybe_instantiate,
)
from axlearn.common.config.errors import RequiredFieldValue, UnknownFieldError
from axlearn.common.config.paths import ConfigPathError, lookup_path, replace_path, split_path
from axlearn.common.metrics import MetricAccumulator
from axlearn.common.update_transformation import OverrideInplaceUpdateTransformation

__all__ = [
    "ChainConfigModifier",
    "FP8ConfigModifier",
    "GradientAccumulationModifier",
    "MeshShapeModifier",
    "ModifierPathError",
    "ModuleConfigModifier",
    "OverrideInplaceUpdateTransformation",
    "PartitionSpecModifier",
    "RematSpecModifier",
    "ReplaceLayerConfigModifier",
]


class ModifierPathError(ConfigPathError, UnknownFieldError):
    """A modifier's path or field does not exist (a ValueError and an AttributeError)."""


def _keys_hint(node: Any, key: str) -> str:
    """`"<key> (keys are [...])"` for a config or dict `node`, else `key`."""
    if isinstance(node, ConfigBase):
        return f"{key} (keys are {sorted(node.keys())})"
    if isinstance(node, dict):
        return f"{key} (keys are {sorted(node, key=str)})"
    return key


def _split(path: str) -> list[str]:
    return split_path(path)


def find_config(cfg: ConfigBase, path: str) -> Any:
    """Returns the value at dotted `path` in a config tree (`config.paths.lookup_path`).

    Args:
        cfg: The root config.
        path: E.g. "model.decoder.transformer.layer" (list items by index: "mesh_rules.0").

    Returns:
        The value (usually a config).

    Raises:
        ModifierPathError: Naming the path, and the keys that exist, if a part of it does not
            exist.
    """
    try:
        return lookup_path(cfg, path)
    except ConfigPathError as e:
        parts = split_path(e.prefix)
        parent = lookup_path(cfg, ".".join(parts[:-1])) if len(parts) > 1 else cfg
        raise ModifierPathError(f"{e}: {_keys_hint(parent, parts[-1])}", prefix=e.prefix) from e


def _learner_config(cfg: ConfigBase, modifier: str) -> ConfigBase:
    """Returns `cfg.learner`, first set to `Learner.default_config()` if it is REQUIRED."""
    if "learner" not in cfg:
        raise ValueError(f"{modifier}: {type(cfg).__name__} has no field 'learner'")
    if isinstance(cfg.learner, RequiredFieldValue):
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.learner import Learner  # learner imports optimizers and models.

        cfg.learner = Learner.default_config()
    return cfg.learner


def _has_field(node: Any, name: str) -> bool:
    """Whether `node` is a config with a field `name`."""
    return isinstance(node, ConfigBase) and name in node


def replace_config(cfg: ConfigBase, path: str, value: Any) -> None:
    """Sets the value at dotted `path` (which must exist) in a config tree
    (`config.paths.replace_path`).

    Args:
        cfg: The root config.
        path: E.g. "model.decoder.transformer.layer".
        value: The new value.

    Raises:
        ModifierPathError: Naming the path if it does not exist.
    """
    find_config(cfg, path)  # Must exist (raises a ModifierPathError naming the keys).
    replace_path(cfg, path, value)


class ChainConfigModifier(ConfigModifier):
    """Applies a sequence of config modifiers in order (e.g. one mesh rule's edits)."""

    @config_class
    class Config(ConfigModifier.Config):
        """Configures ChainConfigModifier."""

        # The modifiers to apply, in order.
        config_modifiers: Required[list[ConfigOr[ConfigModifier]]] = REQUIRED

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self._modifiers = [maybe_instantiate(m) for m in self.config.config_modifiers]

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Applies every modifier to `cfg`, in order.

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.
        """
        for modifier in self._modifiers:
            cfg = modifier(cfg)
        return cfg


class MeshShapeModifier(ConfigModifier):
    """Sets the trainer's `mesh_shape`."""

    @config_class
    class Config(ConfigModifier.Config):
        """Configures MeshShapeModifier."""

        # The new mesh shape (a tuple with at most one -1, or a HybridMeshShape).
        mesh_shape: Required[Any] = REQUIRED

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Sets `cfg.mesh_shape`.

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.
        """
        if "mesh_shape" not in cfg:
            raise ValueError(f"MeshShapeModifier: {type(cfg).__name__} has no field 'mesh_shape'")
        cfg.mesh_shape = self.config.mesh_shape
        return cfg


class RematSpecModifier(ConfigModifier):
    """Sets the `remat_spec` of the layers at the given paths.

    A value is a RematSpec, None (no remat), or the name of a remat choice for the layers of a
    transformer stack (`attention.REMAT_CHOICES`: "none", "save_matmuls", "save_context",
    "full"), e.g. `remat_policies={"model.decoder.transformer.layer": "save_context"}`.
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures RematSpecModifier."""

        # Module path (e.g. "model.decoder.transformer.layer") -> RematSpec, None (no remat) or
        # a remat choice name (attention.REMAT_CHOICES).
        remat_policies: Required[dict[str, Any]] = REQUIRED

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Sets each target's `remat_spec`.

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.

        Raises:
            ValueError: If a path does not exist, its config has no `remat_spec` field, or a
                remat name is unknown (the message lists the choices).
        """
        for path, remat_spec in self.config.remat_policies.items():
            target = find_config(cfg, path)
            if not _has_field(target, "remat_spec"):
                raise ModifierPathError(
                    f"RematSpecModifier: {path} has no remat_spec field: "
                    f"{_keys_hint(target, 'remat_spec')}",
                    prefix=f"{path}.remat_spec",
                )
            if isinstance(remat_spec, str):
                # pylint: disable-next=import-outside-toplevel
                from axlearn.common.attention import remat_spec_by_name

                parent_path = ".".join(_split(path)[:-1])
                stack = find_config(cfg, parent_path) if parent_path else None
                remat_spec = remat_spec_by_name(
                    remat_spec,
                    stack_cfg=stack if _has_field(stack, "klass") else None,
                    config_path=f"RematSpecModifier.remat_policies[{path!r}]",
                )
            target.remat_spec = remat_spec
        return cfg


class GradientAccumulationModifier(ConfigModifier):
    """Accumulates gradients over `grad_acc_steps` microbatches of each global batch.

    Sets `learner.forward_fn_transformation` to
    `axlearn.common.gradient_accumulation.with_minibatch_steps(steps=grad_acc_steps)`. The global
    batch size and the number of optimizer steps stay the same; each step's batch is split into
    `grad_acc_steps` microbatches (so peak activation memory drops by that factor).
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures GradientAccumulationModifier."""

        # The number of microbatches per step (divides the global batch size).
        grad_acc_steps: Required[int] = REQUIRED
        # How summaries are combined over microbatches (WeightedScalars by weight).
        metric_accumulator: Configurable.Config = MetricAccumulator.default_config()

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Sets the learner's forward_fn_transformation.

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.

        Raises:
            ValueError: If grad_acc_steps < 1 or the learner has no forward_fn_transformation.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.gradient_accumulation import with_minibatch_steps

        steps = self.config.grad_acc_steps
        if steps < 1:
            raise ValueError(f"GradientAccumulationModifier: grad_acc_steps must be >= 1: {steps}")
        learner = _learner_config(cfg, "GradientAccumulationModifier")
        if not _has_field(learner, "forward_fn_transformation"):
            raise ValueError(
                "GradientAccumulationModifier: learner has no forward_fn_transformation field"
            )
        learner.forward_fn_transformation = config_for_function(with_minibatch_steps).set(
            steps=steps, metric_accumulator=self.config.metric_accumulator
        )
        return cfg


class ModuleConfigModifier(ConfigModifier):
    """Replaces the config at `target_config` by `modification`, keeping shared field values.

    Merge rule: `modification`'s class is used; every field that both the old and the new config
    have takes the old config's value; fields only the new config has keep `modification`'s
    values. Use it to swap a layer's class while keeping its settings.
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures ModuleConfigModifier."""

        # Dotted path of the config to replace, e.g. "model.decoder.transformer.layer".
        target_config: Required[str] = REQUIRED
        # The new config.
        modification: Required[Configurable.Config] = REQUIRED

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Replaces the target config.

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.

        Raises:
            ValueError: If the target path does not exist or is not a config.
        """
        path = self.config.target_config
        found = find_config(cfg, path)
        if not isinstance(found, ConfigBase):
            raise ValueError(f"ModuleConfigModifier: {path} is not a config ({type(found)})")
        new = self.config.modification.clone()
        for key in new.keys():
            if key != "klass" and key in found:
                setattr(new, key, getattr(found, key))
        replace_config(cfg, path, new)
        return cfg


class PartitionSpecModifier(ConfigModifier):
    """Sets partition-spec fields of the modules at the given paths."""

    @config_class
    class Config(ConfigModifier.Config):
        """Configures PartitionSpecModifier."""

        # Module path -> {field name (e.g. "param_partition_spec"): partition spec}.
        partition_specs: Required[dict[str, dict[str, Any]]] = REQUIRED

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Sets each target field.

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.

        Raises:
            ValueError: If a path does not exist or its config lacks a named field.
        """
        for path, specs in self.config.partition_specs.items():
            target = find_config(cfg, path)
            for name, spec in specs.items():
                if not _has_field(target, name):
                    raise ModifierPathError(
                        f"PartitionSpecModifier: {path} has no field {name!r}: "
                        f"{_keys_hint(target, name)}",
                        prefix=f"{path}.{name}",
                    )
                setattr(target, name, spec)
        return cfg


class PipelineModifier(ConfigModifier):
    """Switches a transformer stack to a `PipelinedTransformerLayer` (pipeline parallelism).

    The stack at `target_config` (a RepeatedTransformerLayer or StackedTransformerLayer config)
    is replaced by `attention.pipelined_stack_config(...)`, which keeps its num_layers and layer.
    Pair it with a mesh whose `pipeline` axis has size `num_stages` (e.g. in a
    ChainConfigModifier with a MeshShapeModifier, as one mesh rule).
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures PipelineModifier."""

        # Dotted path of the stack config to pipeline.
        target_config: str = "model.decoder.transformer"
        # Number of pipeline stages (the size of the `pipeline` mesh axis).
        num_stages: Required[int] = REQUIRED
        # Number of microbatches each batch is split into.
        num_microbatches: Required[int] = REQUIRED
        # Chunks of layers per stage: 1 is GPipeSchedule, more is CircularSchedule.
        num_virtual_stages: int = 1
        # Schedule name ("gpipe", "circular", "1f1b", "interleaved_1f1b"); None: by
        # num_virtual_stages as above.
        schedule: Optional[str] = None

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Replaces the stack config.

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.

        Raises:
            ValueError: If the target does not exist or is not a stack with num_layers/layer.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.attention import pipelined_stack_config

        mcfg = self.config
        found = find_config(cfg, mcfg.target_config)
        if not (_has_field(found, "num_layers") and _has_field(found, "layer")):
            raise ValueError(
                f"PipelineModifier: {mcfg.target_config} is not a transformer stack config "
                f"({type(found).__name__})"
            )
        replace_config(
            cfg,
            mcfg.target_config,
            pipelined_stack_config(
                found,
                num_stages=mcfg.num_stages,
                num_microbatches=mcfg.num_microbatches,
                num_virtual_stages=mcfg.num_virtual_stages,
                schedule=mcfg.schedule,
            ),
        )
        return cfg


class FP8ConfigModifier(ConfigModifier):
    """Trains the model's dense matmuls in fp8 with delayed scaling.

    Sets `quantized_dot_general` (FP_8, `fp8_amax_history_length`) on every
    `DenseGeneralBaseLayer` config under `model` (e.g. `Linear`), and wraps
    `learner.optimizer` in an `OverrideInplaceUpdateTransformation` whose rules
    (`.*/<name>` for `get_all_fp8_param_names()`) make the fp8 scales and amax histories take
    their new values each step instead of being optimized.
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures FP8ConfigModifier."""

        # Length of the amax histories (delayed scaling); None: in-batch scaling.
        fp8_amax_history_length: Optional[int] = None

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Installs fp8 matmuls and the fp8 state update rule.

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.

        Raises:
            ValueError: If the model has no DenseGeneralBaseLayer or the learner has no
                `optimizer` field.
        """
        # pylint: disable=import-outside-toplevel
        from axlearn.common.quantized_dot_general.layers import (
            DotGeneralQuantizationType,
            QuantizedDotGeneral,
            get_all_fp8_param_names,
            set_quantized_dot_general_recursively,
        )

        # pylint: enable=import-outside-toplevel
        length = self.config.fp8_amax_history_length
        fp8_cfg = QuantizedDotGeneral.default_config().set(
            quantization_type=DotGeneralQuantizationType.FP_8, fp8_amax_history_length=length
        )
        model = find_config(cfg, "model")
        if set_quantized_dot_general_recursively(model, fp8_cfg) == 0:
            raise ValueError(
                f"FP8ConfigModifier: model ({getattr(model, 'klass', type(model)).__name__}) has "
                "no matmul layer to quantize (no DenseGeneralBaseLayer config such as Linear "
                "under `model`); remove FP8ConfigModifier from this config's mesh rules or build "
                "the model from Linear layers"
            )
        learner = _learner_config(cfg, "FP8ConfigModifier")
        if not _has_field(learner, "optimizer"):
            raise ValueError(
                f"FP8ConfigModifier: learner ({type(learner).__name__}) has no `optimizer` field "
                "to wrap; use a Learner (not a CompositeLearner) with fp8"
            )
        rules = [f".*/{name}" for name in get_all_fp8_param_names()]
        optimizer = learner.optimizer
        if isinstance(optimizer, OverrideInplaceUpdateTransformation.Config):
            optimizer.rules = list(optimizer.rules) + [r for r in rules if r not in optimizer.rules]
        else:
            learner.optimizer = OverrideInplaceUpdateTransformation.default_config().set(
                transformation=optimizer, rules=rules
            )
        return cfg


class ReplaceLayerConfigModifier(ConfigModifier):
    """Replaces every config of class `target_cls` by `source_config`, keeping its settings.

    Each matching config (anywhere under the trainer config, in fields, lists and dicts) becomes
    a clone of `source_config` whose fields, except `exclude_keys`, take the old config's values;
    the excluded fields keep `source_config`'s (e.g. swap only the kernel backend of every MoE
    layer: `exclude_keys=["gmm_backend"]`).
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures ReplaceLayerConfigModifier."""

        target_cls: Required[type] = REQUIRED  # The layer class whose configs are replaced.
        source_config: Required[Configurable.Config] = REQUIRED  # The replacement config.
        # Fields taken from `source_config` rather than from the replaced config.
        exclude_keys: Sequence[str] = ()

    def _replacement(self, found: ConfigBase) -> ConfigBase:
        cfg = self.config
        new = cfg.source_config.clone()
        for key in new.keys():
            if key != "klass" and key not in cfg.exclude_keys and key in found:
                setattr(new, key, getattr(found, key))
        return new

    def _visit(self, node: Any) -> tuple[Any, int]:
        """Returns (node with replacements, number replaced)."""
        if isinstance(node, ConfigBase):
            if getattr(node, "klass", None) is self.config.target_cls:
                return self._replacement(node), 1
            count = 0
            for key in node.keys():
                value, n = self._visit(getattr(node, key))
                if n:
                    setattr(node, key, value)
                    count += n
            return node, count
        if isinstance(node, dict):
            count = 0
            for key in list(node):
                value, n = self._visit(node[key])
                if n:
                    node[key] = value
                    count += n
            return node, count
        if isinstance(node, (list, tuple)):
            visited = [self._visit(v) for v in node]
            count = sum(n for _, n in visited)
            if count:
                return type(node)(v for v, _ in visited), count
            return node, 0
        return node, 0

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Replaces the matching configs.

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.

        Raises:
            ValueError: If no config of `target_cls` is found.
        """
        cfg, count = self._visit(cfg)
        if not count:
            raise ValueError(
                f"ReplaceLayerConfigModifier: no config of {self.config.target_cls.__name__} "
                "in the trainer config; fix target_cls or drop the modifier"
            )
        return cfg
