"""Which mesh a job uses: one resolution shared by the launcher, the pre-flight and the trainer.

This module is also the one home of mesh inference (`infer_mesh`: a -1 axis resolved over the
devices) and of building the device mesh from a config (`build_mesh`), which the trainer (and
through it AOT compilation) and inference call.

    instance type (+ replicas) -> mesh selector -> the experiment's mesh rule
        -> mesh shape and config modifiers

- The mesh selector of a launch follows AXLearn's convention
  (`axlearn.common.system_characteristics.mesh_selector_for`): the TPU instance type for one
  slice (`tpu-v5p-128`), with the slice count appended for several (`tpu-v5p-128-2`); for GPUs the
  instance type with the total GPU count appended (`gpu-a3-highgpu-8g-16` for two nodes of 8).
  AXLearn's rules (`"tpu-v5p-.*"`, `"tpu-v5litepod-256-4"`,
  `"gpu-(p5.48xlarge|p4de.24xlarge|a3-highgpu-8g)-(256|512|1024)"`) are regexes over it.
- `resolve_mesh(cfg, mesh_selector=...)` applies the first of the config's `mesh_rules` whose
  regex fully matches (as `select_mesh_config` does) and returns what it did (`MeshResolution`).
  A selector that matches no rule is an error (`MeshSelectorError`, listing the rules and the
  closest names), unless the mesh is explicit (a `mesh_shape=` config override) or the
  experiment declares a default: a catch-all last rule such as `(".*", mesh_shape)`, or no
  `mesh_rules` at all (its `mesh_shape` is then the mesh of every target).
- `launch_trainer.build_trainer_config(...)` is the whole path from `--module`/`--config`/
  `--config_override`/`--mesh_selector` to the config, with this resolution: the launch's check
  and pre-flight and `axlearn aot` call it, and `launch_trainer_main` takes the same steps.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from typing import Any, Optional

from absl import logging

# Config override paths that set the mesh explicitly (the rule is then not applied).
EXPLICIT_MESH_PATHS = ("mesh_shape",)


class MeshSelectorError(ValueError):
    """A mesh selector matches none of the experiment's mesh rules."""


@dataclasses.dataclass
class MeshResolution:
    """How a job's mesh was chosen.

    Attributes:
        mesh_selector: The selector (None: no --mesh_selector; the config's mesh as is).
        rule: The regex of the rule applied (None: none applied).
        rule_index: Its index in `mesh_rules`.
        source: "rule" (a rule matched), "explicit" (a mesh_shape override; no rule applied),
            "no_rules" (the experiment has no mesh_rules) or "no_selector".
        mesh_shape: The config's mesh shape after resolution (-1 not yet inferred).
        modifier: The rule's config modifier class name, when the rule is a modifier.
    """

    mesh_selector: Optional[str]
    rule: Optional[str]
    rule_index: Optional[int]
    source: str
    mesh_shape: Any
    modifier: Optional[str] = None

    def describe(self) -> str:
        """Returns one line: the selector, the rule that matched and the mesh it gives."""
        shape = _shape_text(self.mesh_shape)
        if self.source == "rule":
            what = f"modifier {self.modifier}, " if self.modifier else ""
            return (
                f"--mesh_selector={self.mesh_selector} matched mesh rule {self.rule!r} "
                f"(mesh_rules[{self.rule_index}]): {what}mesh_shape {shape}"
            )
        if self.source == "explicit":
            return (
                f"--mesh_selector={self.mesh_selector}: explicit mesh_shape {shape} from "
                "--config_override (no mesh rule applied)"
            )
        if self.source == "no_rules":
            return (
                f"--mesh_selector={self.mesh_selector}: the experiment has no mesh_rules; its "
                f"mesh_shape {shape}"
            )
        return f"no --mesh_selector: the config's mesh_shape {shape}"


def _shape_text(shape: Any) -> str:
    if isinstance(shape, (list, tuple)):
        return "(" + ", ".join(str(d) for d in shape) + ")"
    return repr(shape)


def match_mesh_rule(trainer_config: Any, mesh_selector: str) -> Optional[tuple[int, str, Any]]:
    """Returns (index, regex, value) of the first `mesh_rules` entry fully matching, or None.

    Args:
        trainer_config: An `SpmdTrainer.Config`.
        mesh_selector: E.g. "tpu-v5p-128-2".

    Returns:
        The matching rule, or None.
    """
    for i, (regex, value) in enumerate(trainer_config.mesh_rules or ()):
        if re.fullmatch(regex, mesh_selector):
            return i, regex, value
    return None


def apply_mesh_rule(trainer_config: Any, value: Any, *, mesh_selector: str) -> Any:
    """Applies one mesh rule's value to a trainer config (in place).

    Args:
        trainer_config: The trainer config.
        value: A mesh shape (tuple/list/HybridMeshShape/None), which replaces `mesh_shape`, or a
            ConfigModifier config (or instance), which is applied to the whole config.
        mesh_selector: The selector that chose the rule (for the error message).

    Returns:
        The modified config (a modifier may return a new one).

    Raises:
        TypeError: The value is neither a mesh shape nor a ConfigModifier.
    """
    # pylint: disable=import-outside-toplevel
    from axlearn.common.config import ConfigModifier, maybe_instantiate
    from axlearn.common.utils_spmd import HybridMeshShape

    if value is None or isinstance(value, (tuple, list, HybridMeshShape)):
        trainer_config.mesh_shape = value
        return trainer_config
    modifier = maybe_instantiate(value)
    if not isinstance(modifier, ConfigModifier):
        raise TypeError(
            f"Mesh rule for {mesh_selector!r} must be a mesh shape or a ConfigModifier config; "
            f"got {type(modifier).__name__}."
        )
    result = modifier(trainer_config)
    return trainer_config if result is None else result


def known_selectors(replicas: Sequence[int] = (1, 2, 4)) -> list[str]:
    """Returns the selectors launches of the instance-type table pass, for some replica counts.

    Args:
        replicas: The replica (TPU slice / GPU node) counts to list.

    Returns:
        Selectors such as "tpu-v5p-128", "tpu-v5p-128-2", "gpu-a3-highgpu-8g-16".
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.system_characteristics import instance_types, mesh_selector_for

    return [mesh_selector_for(t, n) for t in instance_types() for n in replicas]


def unmatched_selector_message(
    trainer_config: Any, mesh_selector: str, *, config_name: str = "the experiment"
) -> str:
    """Returns the one-line refusal of a selector matching no rule: the rules, the closest names.

    Args:
        trainer_config: The trainer config.
        mesh_selector: The selector.
        config_name: How to name the experiment ("text.gpt.tiny:gpt-tiny").

    Returns:
        The message.
    """
    regexes = [regex for regex, _ in trainer_config.mesh_rules or ()]
    matchable = [s for s in known_selectors() if any(re.fullmatch(r, s) for r in regexes)]
    close = difflib.get_close_matches(mesh_selector, matchable, n=4, cutoff=0.5)
    close_rules = difflib.get_close_matches(mesh_selector, regexes, n=2, cutoff=0.3)
    hints = []
    if close:
        hints.append(f"closest selectors its rules match: {', '.join(close)}")
    if close_rules:
        hints.append(f"closest rules: {', '.join(repr(r) for r in close_rules)}")
    hint = ("; " + "; ".join(hints)) if hints else ""
    return (
        f"--mesh_selector={mesh_selector} matches none of {config_name}'s mesh_rules "
        f"{regexes}{hint}. Fix: launch on an instance type a rule matches, add a rule for "
        f"{mesh_selector!r} (or a catch-all '.*' default) to the experiment, or set the mesh "
        "explicitly with --config_override=mesh_shape=(...)."
    )


def resolve_mesh(
    trainer_config: Any,
    *,
    mesh_selector: Optional[str],
    explicit_mesh: bool = False,
    config_name: str = "the experiment",
) -> tuple[Any, MeshResolution]:
    """Applies the mesh rule `mesh_selector` selects (in place) and says what was done.

    Args:
        trainer_config: The `SpmdTrainer.Config`, with any config overrides applied.
        mesh_selector: The selector (None: keep the config's mesh).
        explicit_mesh: Whether the user set `mesh_shape` explicitly (a config override): it is
            kept and no rule is applied.
        config_name: How errors name the experiment.

    Returns:
        (the config, possibly replaced by a rule's modifier; the `MeshResolution`).

    Raises:
        MeshSelectorError: The selector matches no rule, the experiment has rules, no catch-all
            and the mesh is not explicit.
    """
    if mesh_selector is None:
        return trainer_config, MeshResolution(
            None, None, None, "no_selector", trainer_config.mesh_shape
        )
    if explicit_mesh:
        return trainer_config, MeshResolution(
            mesh_selector, None, None, "explicit", trainer_config.mesh_shape
        )
    if not trainer_config.mesh_rules:
        return trainer_config, MeshResolution(
            mesh_selector, None, None, "no_rules", trainer_config.mesh_shape
        )
    match = match_mesh_rule(trainer_config, mesh_selector)
    if match is None:
        raise MeshSelectorError(
            unmatched_selector_message(trainer_config, mesh_selector, config_name=config_name)
        )
    index, regex, value = match
    modifier = None
    if not (value is None or isinstance(value, (tuple, list))):
        modifier = getattr(getattr(value, "klass", None), "__name__", None) or type(value).__name__
    trainer_config = apply_mesh_rule(trainer_config, value, mesh_selector=mesh_selector)
    return trainer_config, MeshResolution(
        mesh_selector, regex, index, "rule", trainer_config.mesh_shape, modifier
    )


def overrides_set_mesh(overrides: Sequence[str]) -> bool:
    """Returns whether `PATH=VALUE` overrides set the mesh explicitly (`mesh_shape=...`)."""
    return any(o.split("=", 1)[0].strip() in EXPLICIT_MESH_PATHS for o in overrides)


def select_mesh_config(trainer_config: Any, *, mesh_selector: str) -> Any:
    """Applies the first of `trainer_config.mesh_rules` whose regex fully matches `mesh_selector`.

    A rule's value is either a mesh shape (or HybridMeshShape), which replaces `mesh_shape`, or a
    ConfigModifier config (or instance), which is applied to the whole trainer config. If no rule
    matches, the config is unchanged (launches go through `resolve_mesh`, which refuses an
    unmatched selector). Also importable as `axlearn.common.trainer.select_mesh_config`.

    Args:
        trainer_config: The trainer config (modified in place).
        mesh_selector: E.g. "tpu-v5litepod-256" or "gpu-p5.48xlarge-64".

    Returns:
        The (possibly modified) trainer config.
    """
    match = match_mesh_rule(trainer_config, mesh_selector)
    if match is None:
        if trainer_config.mesh_rules:
            logging.info(
                "Mesh selector %r matches no mesh rule; keeping the default mesh.", mesh_selector
            )
        return trainer_config
    logging.info("Mesh selector %r matches mesh rule %s.", mesh_selector, match[2])
    return apply_mesh_rule(trainer_config, match[2], mesh_selector=mesh_selector)


def infer_mesh(mesh_shape: Any, *, num_devices: Optional[int] = None) -> Any:
    """The mesh shape with its -1 (if any) resolved over `num_devices` (default: all devices);
    a HybridMeshShape is returned unchanged (its -1s are resolved per slice when the device
    mesh is built). The one home of mesh inference: the launcher, the trainer, AOT compilation
    and inference call it.

    Args:
        mesh_shape: Sizes per mesh axis (at most one -1), or a `utils_spmd.HybridMeshShape`.
        num_devices: The number of devices; None: `jax.device_count()`.

    Returns:
        The resolved shape (a tuple), or the HybridMeshShape.

    Raises:
        ValueError: If more than one axis is -1 or the sizes do not divide the devices.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.utils_spmd import HybridMeshShape, infer_mesh_shape

    if isinstance(mesh_shape, HybridMeshShape):
        return mesh_shape
    return infer_mesh_shape(mesh_shape, num_devices=num_devices)


def build_mesh(
    mesh_shape: Any,
    mesh_axis_names: Sequence[str],
    *,
    devices: Any = None,
    config_path: str = "mesh_shape",
) -> tuple[Any, Any]:
    """Builds the device mesh of a config's `mesh_shape` and `mesh_axis_names`.

    Args:
        mesh_shape: Sizes per mesh axis (one -1 is inferred), or a HybridMeshShape.
        mesh_axis_names: One name per axis.
        devices: The devices, already arranged in the mesh's shape; None: all devices, arranged
            by `utils_spmd.create_device_mesh`.
        config_path: The config named in errors.

    Returns:
        (the `jax.sharding.Mesh`, the resolved mesh shape to store back in the config).

    Raises:
        ValueError: If the shape and the axis names have different lengths.
    """
    # pylint: disable-next=import-outside-toplevel
    import jax

    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.utils_spmd import HybridMeshShape, create_device_mesh

    mesh_devices = devices if devices is not None else create_device_mesh(mesh_shape)
    if isinstance(mesh_shape, HybridMeshShape):
        num_axes = len(mesh_shape.ici_mesh_shape)
    else:
        num_axes = len(mesh_shape)
        mesh_shape = infer_mesh(mesh_shape, num_devices=mesh_devices.size)
    if num_axes != len(mesh_axis_names):
        raise ValueError(
            f"{config_path}: mesh_shape {mesh_shape} has {num_axes} axes but "
            f"mesh_axis_names {tuple(mesh_axis_names)} has {len(mesh_axis_names)}. Fix: give "
            "one axis name per mesh_shape entry."
        )
    return jax.sharding.Mesh(mesh_devices, tuple(mesh_axis_names)), mesh_shape
