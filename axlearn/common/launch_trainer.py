"""Builds a named trainer config from flags and runs it.

`get_trainer_config()` looks the experiment up (`--module`, `--config`), applies the launch-time
settings (trainer dir, mesh rule selected by `--mesh_selector`, inferred mesh shape, profiler
steps, watchdog, `--data_dir=FAKE`), and `run_trainer()` instantiates and runs the trainer,
recording the config dump and the flags in the trainer dir once the run is known to start. It
turns on JAX's persistent compilation cache (`--compilation_cache_dir`, default
`<trainer_dir>/compilation_cache`). `--recorder_type` (default `local`) picks the recorder of
the run's events (`axlearn.common.measurement`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, Optional

import jax
from absl import flags, logging

from axlearn.common import compilation_cache, measurement, run_record
from axlearn.common.config.override import apply_overrides
from axlearn.common.config_diff import parse_config_dump
from axlearn.common.config_ranges import ConfigRangeError
from axlearn.common.experiment_registry import (
    EXPERIMENTS_PACKAGE,
    ExperimentModuleNotFoundError,
    get_named_trainer_config,
)
from axlearn.common.mesh_resolution import (
    MeshResolution,
    infer_mesh,
    overrides_set_mesh,
    resolve_mesh,
)
from axlearn.common.run_lock import hold_run_dirs
from axlearn.common.trainer import SpmdTrainer
from axlearn.common.trainer_metrics import PARAMETER_TABLE_FILE
from axlearn.common.utils_spmd import (  # noqa: F401 (infer_mesh_shape: a public name here too)
    HybridMeshShape,
    infer_mesh_shape,
)

flags.DEFINE_string(
    "module",
    None,
    "The experiment module: a full module path (axlearn.experiments.text.gpt.tiny) or the short "
    "form relative to the axlearn.experiments package (text.gpt.tiny).",
)
flags.DEFINE_alias("config_module", "module")
flags.DEFINE_string("config", None, "The name of the trainer config in the module.")
flags.DEFINE_string(
    "trainer_dir",
    None,
    "The trainer's root directory: checkpoints in <dir>/checkpoints, summaries in "
    "<dir>/summaries, metrics in <dir>/metrics.jsonl.",
)
flags.DEFINE_integer("trainer_prng_seed", 0, "The seed of the trainer's jax.random key.")
flags.DEFINE_list("trace_at_steps", [], "Steps at which to start a 3-step profiler trace.")
flags.DEFINE_integer(
    "trainer_watchdog_timeout_seconds",
    3600,
    "If the step does not advance for this long, the trainer logs every thread's stack.",
)
flags.DEFINE_integer(
    "trainer_crash_on_hang_timeout_seconds",
    None,
    "If the step does not advance for this long, the trainer kills its process (so that the "
    "launcher restarts it); used when the config does not set crash_on_hang_timeout_seconds. "
    "Default: never.",
)
flags.DEFINE_integer(
    "trainer_log_every_n_steps",
    None,
    "Log the per-step line every this many steps; used when the config does not set "
    "log_every_n_steps (default: every step).",
)
flags.DEFINE_list(
    "eval_trace_at_iters",
    [],
    "Eval batch indices to trace with the profiler each time an evaler runs (at most 3 "
    "traces); sets every evaler's trace_at_iters when given.",
)
flags.DEFINE_enum(
    "device_monitor",
    "none",
    ["none"],
    "AXLearn's device monitor (tpu/gpu system metrics); this package has none, so only 'none' "
    "is accepted (device memory is reported by the trainer's step summaries).",
)
flags.DEFINE_string(
    "mesh_selector",
    None,
    "Selects the first of the config's mesh_rules whose regex fully matches it "
    "(e.g. tpu-v5p-128, tpu-v5p-128-2 for 2 slices, gpu-a3-highgpu-8g-16 for 16 GPUs). A "
    "selector matching no rule is an error unless --config_override=mesh_shape=... is given.",
)

flags.DEFINE_integer(
    "restore_step",
    None,
    "Resume from this committed checkpoint step instead of the newest one; newer step "
    "directories are set aside as step_%08d.superseded-<time> (never deleted). Applied once: a "
    "restart with the same flag resumes from the run's newer checkpoints.",
)
flags.DEFINE_enum(
    "restore_fallback",
    None,
    ["none", "previous"],
    "When the newest checkpoint is corrupt: 'none' (default) refuses to start, naming the file; "
    "'previous' sets it aside as step_%08d.corrupt-<time> and restores the newest intact older "
    "step. Nothing is deleted either way.",
)
flags.DEFINE_multi_string(
    "config_override",
    [],
    "PATH=VALUE: sets a field of the trainer config before it runs (repeatable), e.g. "
    "max_step=20, learner.optimizer.inner.learning_rate.peak_lr=1e-3. VALUE is a Python "
    "literal (text that is not one is a string); the same checks as Config.set() apply.",
)
flags.DEFINE_bool(
    "verbose_start",
    False,
    "Log the config dump and the parameter table at start-up (by default they are written to "
    "files in the trainer dir and one line says where).",
)

flags.DEFINE_string(
    "compilation_cache_dir",
    None,
    "JAX's persistent compilation cache, shared by the run's processes, so that a restart "
    "loads its train step instead of compiling it again (default: <trainer_dir>/"
    "compilation_cache, except for multi-process CPU runs; 'none' turns it off).",
)
# --recorder_type, --recorder_spec: the run's events (axlearn.common.measurement). The local
# recorder appends them to <trainer_dir>/events/ for `axlearn goodput`.
measurement.define_flags()
flags.FLAGS.set_default("recorder_type", "local")

FLAGS = flags.FLAGS

# The config dump (`debug_string()`) and the flags of a run, in its trainer dir (run_record.py).
TRAINER_CONFIG_FILE = run_record.TRAINER_CONFIG_FILE
LAUNCH_FLAGS_FILE = run_record.LAUNCH_FLAGS_FILE

TrainerConfigFn = Callable[[], SpmdTrainer.Config]


def _named_trainer_config_fn(module: str, config: str) -> TrainerConfigFn:
    """Looks `config` up in `module`, then in `axlearn.experiments.<module>`.

    `get_named_trainer_config` is looked up through this module's global, so that tests can
    patch `launch_trainer.get_named_trainer_config` (as AXLearn's tests do). When the first
    lookup raises ImportError, AttributeError or KeyError, the name is retried under the
    experiments package (AXLearn's fallback); the registry's own ExperimentModuleNotFoundError
    (which already tried both names and lists them) is raised as it is.
    """
    try:
        return get_named_trainer_config(config, config_module=module)
    except ExperimentModuleNotFoundError:
        raise
    except (ImportError, AttributeError, KeyError) as first:
        if module.startswith(f"{EXPERIMENTS_PACKAGE}."):
            raise
        logging.info("Config %r not found in module %r (%s); trying %s.", config, module, first,
                     f"{EXPERIMENTS_PACKAGE}.{module}")  # fmt: skip
        try:
            return get_named_trainer_config(config, config_module=f"{EXPERIMENTS_PACKAGE}.{module}")
        except ExperimentModuleNotFoundError:
            raise first from None  # The first error says what went wrong in `module`.


def build_trainer_config(
    *,
    module: str,
    config: str,
    config_overrides: Sequence[str] = (),
    mesh_selector: Optional[str] = None,
) -> tuple[SpmdTrainer.Config, MeshResolution]:
    """Builds a named experiment's trainer config as `launch_trainer_main` does.

    The experiment is looked up, its `--config_override`s applied, then the mesh resolved
    (`mesh_resolution.resolve_mesh`), in the order of `get_trainer_config`. The launch's check
    and pre-flight (`axlearn.cloud.gcp.launch`) and `axlearn aot` use it, so the config they
    check is the pods' config. The trainer's launch settings (trainer dir, profiler, fake
    inputs) are not part of this; the mesh shape's -1 is inferred later for the devices.

    Args:
        module: `--module` (full path or relative to axlearn.experiments).
        config: `--config`.
        config_overrides: `--config_override` values, in order.
        mesh_selector: `--mesh_selector` (None: none).

    Returns:
        (the trainer config, the `MeshResolution`).

    Raises:
        ValueError: Unknown module or config (naming the close names), a bad override
            (ConfigOverrideError), or a selector matching no rule (MeshSelectorError).
    """
    cfg = _named_trainer_config_fn(module, config)()
    overrides = list(config_overrides)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    return resolve_mesh(
        cfg,
        mesh_selector=mesh_selector,
        explicit_mesh=overrides_set_mesh(overrides),
        config_name=f"{module}:{config}",
    )


def get_trainer_config(
    trainer_config_fn: TrainerConfigFn | None = None,
    *,
    flag_values: flags.FlagValues = FLAGS,
) -> SpmdTrainer.Config:
    """Returns the trainer config selected by the flags, with launch-time settings applied.

    Args:
        trainer_config_fn: Builds the config; by default looked up from --module and --config.
        flag_values: The parsed flags.

    Returns:
        The trainer config, ready to instantiate.

    Raises:
        ValueError: If a required flag is missing.
        ConfigOverrideError: If a --config_override names no field or has the wrong type.
    """
    if trainer_config_fn is None:
        # --config_module is an alias of --module (read first: a FlagValues copy whose alias
        # default was set keeps --module's old value).
        module = _flag(flag_values, "config_module") or flag_values.module
        if not module or not flag_values.config:
            raise ValueError("--module and --config are required to select a trainer config.")
        trainer_config_fn = _named_trainer_config_fn(module, flag_values.config)
    cfg: SpmdTrainer.Config = trainer_config_fn()
    if flag_values.config_override:
        old_max_step = cfg.max_step
        apply_overrides(cfg, flag_values.config_override)
        if cfg.max_step != old_max_step:
            warn_derived_max_step(cfg, old_max_step)
    return apply_launch_settings(cfg, flag_values=flag_values)


def max_step_overridden(overrides: Sequence[str]) -> bool:
    """Whether `--config_override`s set the trainer's `max_step`.

    Args:
        overrides: The `PATH=VALUE` overrides.

    Returns:
        True if one of them sets `max_step`.
    """
    return any(o.partition("=")[0].strip() == "max_step" for o in overrides)


def warn_derived_max_step(cfg: SpmdTrainer.Config, old_max_step: Any) -> list[str]:
    """Says at start which fields still hold the experiment's `max_step` after an override.

    Values the experiment derived from `max_step` (the learning-rate schedule's length, a save
    or eval policy's last step) keep the old number unless overridden too; the run then
    evaluates and saves its last step whatever the policies say (`run_trainer`).

    Args:
        cfg: The trainer config, `max_step` overridden.
        old_max_step: The experiment's `max_step`.

    Returns:
        The paths of the fields that still hold `old_max_step`.
    """
    found: list[str] = []

    def visit(path: str, value: Any) -> None:
        if (
            path != "max_step"
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value == old_max_step
        ):
            found.append(path)

    if isinstance(old_max_step, (int, float)) and old_max_step != float("inf"):
        cfg.visit(visit)
    logging.warning(
        "--config_override=max_step=%s (the experiment's max_step is %s): %s. The run evaluates "
        "and saves step %s whatever the save and eval policies say.",
        cfg.max_step,
        old_max_step,
        (
            f"these fields still hold {old_max_step}: {', '.join(found)} (override them too to "
            "change them, e.g. the learning-rate schedule)"
            if found
            else f"no other field holds {old_max_step}"
        ),
        cfg.max_step,
    )
    return found


def apply_launch_settings(
    cfg: SpmdTrainer.Config, *, flag_values: flags.FlagValues = FLAGS
) -> SpmdTrainer.Config:
    """Applies the flag-driven settings to a trainer config (modifies and returns `cfg`).

    Args:
        cfg: The trainer config.
        flag_values: The parsed flags.

    Returns:
        The modified config.

    Raises:
        ValueError: If the trainer dir is not set by the config or --trainer_dir, or is a file.
    """
    if not cfg.dir:
        if not flag_values.trainer_dir:
            raise ValueError("--trainer_dir is required (the config does not set `dir`).")
        cfg.dir = flag_values.trainer_dir
    if isinstance(cfg.dir, str) and os.path.exists(cfg.dir) and not os.path.isdir(cfg.dir):
        raise ValueError(
            f"--trainer_dir={cfg.dir} is a file, not a directory: pass a directory (a new one "
            "is created)."
        )
    if flag_values.mesh_selector is not None:
        # The same resolution as the launch's dry run and pre-flight (mesh_resolution).
        cfg, resolution = resolve_mesh(
            cfg,
            mesh_selector=flag_values.mesh_selector,
            explicit_mesh=overrides_set_mesh(getattr(flag_values, "config_override", None) or []),
            config_name=_experiment_name(flag_values),
        )
        logging.info("Mesh: %s", resolution.describe())
    if not cfg.mesh_axis_names:
        cfg.mesh_axis_names = ("data", "model")
    if not isinstance(cfg.mesh_shape, (list, tuple, HybridMeshShape)):
        cfg.mesh_shape = (-1,) + (1,) * (len(cfg.mesh_axis_names) - 1)
    cfg.mesh_shape = infer_mesh(cfg.mesh_shape)
    if flag_values.restore_step is not None:
        cfg.restore_step = flag_values.restore_step
    if flag_values.restore_fallback is not None:
        cfg.checkpointer.restore_fallback = flag_values.restore_fallback
    if flag_values.trace_at_steps:
        try:
            steps = [int(s) for s in flag_values.trace_at_steps]
        except ValueError as e:
            raise ValueError(
                f"--trace_at_steps={','.join(flag_values.trace_at_steps)}: expects a "
                "comma-separated list of step numbers, e.g. --trace_at_steps=10,100"
            ) from e
        if any(s < 1 for s in steps):
            raise ValueError(f"--trace_at_steps={steps}: steps must be >= 1")
        cfg.start_trace_steps = steps
    if cfg.watchdog_timeout_seconds is None:
        cfg.watchdog_timeout_seconds = flag_values.trainer_watchdog_timeout_seconds
    if cfg.crash_on_hang_timeout_seconds is None:
        cfg.crash_on_hang_timeout_seconds = _flag(
            flag_values, "trainer_crash_on_hang_timeout_seconds"
        )
    if cfg.log_every_n_steps is None:
        cfg.log_every_n_steps = _flag(flag_values, "trainer_log_every_n_steps")
    eval_iters = _flag(flag_values, "eval_trace_at_iters")
    if eval_iters:
        try:
            iters = [int(i) for i in eval_iters]
        except ValueError as e:
            raise ValueError(
                f"--eval_trace_at_iters={','.join(eval_iters)}: expects a comma-separated list "
                "of eval batch indices, e.g. --eval_trace_at_iters=0,5"
            ) from e
        for evaler_cfg in cfg.evalers.values():
            evaler_cfg.trace_at_iters = iters
    data_dir = _flag(flag_values, "data_dir") or os.environ.get("DATA_DIR")
    if data_dir == "FAKE":
        cfg = _use_fake_inputs(cfg)
    return cfg


def _flag(flag_values: Any, name: str) -> Any:
    """The flag's value, or None where `flag_values` lacks it (flags of another program)."""
    try:
        return getattr(flag_values, name)
    except AttributeError:
        return None


def _experiment_name(flag_values: Any) -> str:
    """ "module:config" of the flags, or "the experiment" (a config given as a function)."""
    module, config = getattr(flag_values, "module", None), getattr(flag_values, "config", None)
    return f"{module}:{config}" if module and config else "the experiment"


def _use_fake_inputs(cfg: SpmdTrainer.Config) -> SpmdTrainer.Config:
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common import input_fake

    return input_fake.replace_inputs_with_fake(cfg)


def _flag_values_json(flag_values: flags.FlagValues) -> dict[str, Any]:
    """The flags defined by axlearn modules (and the main program), as JSON-ready values."""
    result = {}
    for module, module_flags in flag_values.flags_by_module_dict().items():
        if not (module.startswith("axlearn") or module == "__main__"):
            continue
        for flag in module_flags:
            value = flag.value
            try:
                json.dumps(value)
            except TypeError:
                value = repr(value)
            result[flag.name] = value
    return result


def _checkpoint_dir_of(trainer_config: SpmdTrainer.Config) -> Optional[str]:
    """The checkpointer's dir of a trainer config (its default: `<dir>/checkpoints`)."""
    ckpt_dir = getattr(trainer_config.checkpointer, "dir", None)
    if isinstance(ckpt_dir, str) and ckpt_dir:
        return ckpt_dir
    if hasattr(trainer_config.checkpointer, "dir"):
        return os.path.join(trainer_config.dir, "checkpoints")
    return None


def run_trainer(
    trainer_config: SpmdTrainer.Config, *, flag_values: flags.FlagValues = FLAGS
) -> Any:
    """Trains; once the run is known to start, records its config and flags in the trainer dir.

    The record (`trainer_config`, `launch_trainer_flags`, numbered under `run_records/`; see
    run_record.py) is written after the trainer was instantiated (its config validated), the
    restore succeeded and a step is left to train: a rerun that fails or has nothing to do leaves
    the record of the steps that were trained as it was.

    Args:
        trainer_config: The trainer config (its `dir` set).
        flag_values: The parsed flags (written to `launch_trainer_flags` as JSON).

    Returns:
        The trainer's `run()` output.

    Raises:
        InvalidTrainerConfigError: If building the trainer fails with a ValueError, TypeError or
            ZeroDivisionError (a config value its module refuses), naming it.
    """
    dump = trainer_config.debug_string()
    verbose = flag_values.verbose_start if flag_values.is_parsed() else False
    dump_path = os.path.join(trainer_config.dir, TRAINER_CONFIG_FILE)
    if verbose:
        logging.info("Trainer config:\n%s", dump)
    flags_json = _flag_values_json(flag_values) if flag_values.is_parsed() else {}
    flags_json["data_dir"] = os.environ.get("DATA_DIR")
    if flags_json.get("module"):
        # Where the experiment module was imported from, for the one-line fix that `axlearn
        # generate`/`eval` print when it is not importable where they run (never imported).
        flags_json["module_file"] = _module_file(flags_json["module"])

    def on_run_start(restored_step: int) -> None:
        if jax.process_index() != 0:
            return
        record_dir = run_record.write_run_record(
            trainer_config.dir,
            trainer_config=dump,
            launch_flags=flags_json,
            start_step=restored_step,
        )
        if not verbose:
            logging.info(
                "Trainer config (%d fields) written to %s (record %s); the parameter table to "
                "%s (--verbose_start logs both).",
                dump.count("\n") + 1,
                dump_path,
                record_dir,
                os.path.join(trainer_config.dir, PARAMETER_TABLE_FILE),
            )

    overrides = flag_values.config_override if flag_values.is_parsed() else []
    # The launcher's fields (trainer.LAUNCH_FIELDS): on a copy, after the dump above.
    trainer_config = trainer_config.clone(
        on_run_start=on_run_start,
        verbose_start=verbose,
        save_and_eval_last_step=max_step_overridden(overrides),
    )
    lock = contextlib.ExitStack()
    if jax.process_index() == 0:
        # Before anything is written: a second run on this dir, or on its checkpoint dir
        # wherever that is, fails here, naming the owner.
        lock.enter_context(hold_run_dirs(trainer_config.dir, _checkpoint_dir_of(trainer_config)))
    try:
        if flag_values.is_parsed():
            # After the lock: a second run on a busy dir creates nothing (not even the cache).
            cache = compilation_cache.resolve_cache_dir(
                flag_values.compilation_cache_dir,
                trainer_dir=trainer_config.dir,
                platform=jax.default_backend(),
                process_count=jax.process_count(),
            )
            if cache is not None:
                compilation_cache.enable(
                    cache,
                    trainer_dir=trainer_config.dir,
                    key=compilation_cache.run_key(dump, platform=jax.default_backend()),
                )
        try:
            trainer: SpmdTrainer = trainer_config.instantiate(parent=None)
        except ConfigRangeError:
            raise  # Already names the fields and the fix.
        except (ValueError, TypeError, ZeroDivisionError) as e:
            # A value of the config that its module refuses (after the range checks): a user
            # error, reported in one line (the traceback is logged at --v=1).
            logging.debug("Instantiating the trainer failed", exc_info=True)
            raise InvalidTrainerConfigError(
                f"The trainer config does not build: {type(e).__name__}: {e}"
            ) from e
        # The lock is held and the config built: the run's events (START_JOB on) go to disk.
        measurement.flush_deferred_events()
        seed = flag_values.trainer_prng_seed if flag_values.is_parsed() else 0
        return trainer.run(jax.random.PRNGKey(seed))
    finally:
        lock.close()


def _module_file(module: str) -> Optional[str]:
    """The file of the imported experiment module a `--module` value names, if imported."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.experiment_registry import candidate_module_names

    try:
        names = candidate_module_names(module)
    except ValueError:
        return None
    for name in names:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            return os.path.abspath(file)
    return None


class InvalidTrainerConfigError(ValueError):
    """The trainer config is refused while the trainer is built (a value its module rejects)."""


class TrainerDirError(ValueError):
    """A trainer dir lacks what is needed to rebuild its run's config."""


def trainer_config_from_dir(
    trainer_dir: str,
    *,
    config_overrides: Sequence[str] = (),
    check_dump: bool = True,
    step: Optional[int] = None,
    module: Optional[str] = None,
) -> SpmdTrainer.Config:
    """Rebuilds the trainer config of the run in `trainer_dir` from its `launch_trainer_flags`.

    The record is read through the file layer (bounded, no link followed), and the experiment
    module it names is imported only when it is `module` (the user's `--module`) or one of
    axlearn's own experiments (`run_record.module_to_import`): nothing read from a run
    directory runs as code unless the user named it.

    The record used is the one the checkpoint of `step` was made with (run_record.py): a later
    start with another config does not change what an older step rebuilds into.

    The experiment is looked up again (`--module`, `--config`), the run's `--config_override`s
    and then `config_overrides` are applied, and the launch settings (mesh selector, fake inputs)
    are those of the run; the mesh shape is inferred for this process's devices. With
    `check_dump`, the config before `config_overrides` is compared with the run's
    `trainer_config` dump (ignoring `dir` and the mesh shape): a difference means that the
    experiment's or the library's code changed since the run; it is logged as a warning that
    names the fields, never their values in the file (a model that no longer matches the
    checkpoint fails at restore, naming the parameters).

    Args:
        trainer_dir: The run's trainer dir (holding `launch_trainer_flags` and `trainer_config`).
        config_overrides: Further `PATH=VALUE` overrides.
        check_dump: Whether to compare with the saved dump.
        step: The checkpoint step the config is for; None: the newest committed step under
            `trainer_dir/checkpoints` (or the newest record if there is none).
        module: The experiment module the user named (`--module`), if any: a record's module
            outside `axlearn.experiments` is imported only when it is this one.

    Returns:
        The trainer config, its `dir` set to `trainer_dir`.

    Raises:
        TrainerDirError: If `launch_trainer_flags` is missing, refused, or names no experiment
            or one the user did not name, or the experiment module cannot be imported
            here (one line naming the fix).
    """
    if step is None:
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.checkpointer import latest_checkpoint_step

        step = latest_checkpoint_step(os.path.join(trainer_dir, "checkpoints"))
    record_dir = run_record.record_dir_for_step(trainer_dir, step)
    flags_path = os.path.join(record_dir, LAUNCH_FLAGS_FILE)
    try:
        run_flags = run_record.read_launch_flags(trainer_dir, record_dir)
    except FileNotFoundError as e:
        raise TrainerDirError(
            f"{flags_path} does not exist: {trainer_dir} is not the trainer dir of a run of "
            "launch_trainer_main (which writes it at start)."
        ) from e
    except run_record.RunRecordError as e:
        raise TrainerDirError(str(e)) from e
    config_name = run_flags.get("config")
    overrides = run_flags.get("config_override") or []
    if not isinstance(config_name, str) or not config_name:
        raise TrainerDirError(f"{flags_path} names no --module/--config.")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise TrainerDirError(f"{flags_path}: field 'config_override' is not a list of strings.")
    try:
        module_name = run_record.module_to_import(
            run_flags.get("module"),
            module,
            source=flags_path,
            module_file=run_flags.get("module_file"),
        )
    except run_record.RunRecordError as e:
        raise TrainerDirError(str(e)) from e
    run_flags = {**run_flags, "module": module_name}
    cfg = _named_trainer_config_fn_for_run(run_flags, module=module, flags_path=flags_path)()
    apply_overrides(cfg, list(overrides))
    cfg.dir = trainer_dir
    settings = types.SimpleNamespace(
        trainer_dir=trainer_dir,
        mesh_selector=run_flags.get("mesh_selector"),
        trace_at_steps=run_flags.get("trace_at_steps") or [],
        trainer_watchdog_timeout_seconds=run_flags.get("trainer_watchdog_timeout_seconds"),
        data_dir=run_flags.get("data_dir"),
        restore_step=None,
        restore_fallback=None,
    )
    cfg = apply_launch_settings(cfg, flag_values=settings)
    dump_path = os.path.join(record_dir, TRAINER_CONFIG_FILE)
    if check_dump:
        try:
            saved = run_record.read_dump(trainer_dir, record_dir)
        except run_record.RunRecordError as e:
            logging.warning("Not compared with the run's config dump: %s", e)
            saved = None
        if saved is not None:
            _check_against_dump(cfg.debug_string(), saved, dump_path)
    return apply_overrides(cfg, list(config_overrides))


def _named_trainer_config_fn_for_run(
    run_flags: dict[str, Any], *, module: Optional[str], flags_path: str
) -> TrainerConfigFn:
    """The run's config function (`run_flags["module"]`, already allowed), or a one-line error."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.experiment_registry import (
        ExperimentModuleNotFoundError,
        NotAnExperimentModuleError,
        UnknownTrainerConfigError,
    )

    name = run_flags["module"]
    try:
        return _named_trainer_config_fn(name, run_flags["config"])
    except (NotAnExperimentModuleError, UnknownTrainerConfigError) as e:
        raise TrainerDirError(f"{e} (--module={name} for the run in {flags_path})") from e
    except ExperimentModuleNotFoundError as e:
        if module:
            raise TrainerDirError(f"--module={module}: {e}") from e
        raise TrainerDirError(
            f"The run's experiment module --module={name} cannot be imported here: pass "
            f"--module=MODULE naming it as it imports here ({flags_path} records the run's "
            "--module)."
        ) from e


def _check_against_dump(rebuilt: str, saved_text: str, dump_path: str) -> list[str]:
    """Warns about the fields in which the rebuilt config and the run's saved dump differ.

    The warning names the fields (from the rebuilt config) and counts those only in the dump;
    it never shows a value or a name read from the file (a dump may hold anything).

    Args:
        rebuilt: The rebuilt config's dump.
        saved_text: The run's saved dump.
        dump_path: Where it was read (named in the warning).

    Returns:
        The differing field paths of the rebuilt config, sorted; then one "<N> fields only in
        the run's dump" entry if any.
    """

    def fields(text: str, source: str) -> dict[str, str]:
        # The dir may have moved; the mesh shape is inferred for this process's devices.
        return {
            key: value
            for key, value in parse_config_dump(text, source=source, strict=False).items()
            if key != "dir" and not key.startswith("mesh_shape")
        }

    try:
        saved = fields(saved_text, dump_path)
    except ValueError:
        logging.warning("Not compared with the run's config dump %s: it does not parse.", dump_path)
        return []
    now = fields(rebuilt, "the rebuilt config")
    diffs = sorted(k for k in now if saved.get(k) != now[k])
    only_saved = sum(1 for k in saved if k not in now)
    if only_saved:
        diffs.append(f"{only_saved} fields only in the run's dump")
    if diffs:
        logging.warning(
            "The experiment's config differs from the run's dump %s in %d fields (the code "
            "changed since the run): %s",
            dump_path,
            len(diffs) - (1 if only_saved else 0) + only_saved,
            ", ".join(diffs[:20]) + (", ..." if len(diffs) > 20 else ""),
        )
    return diffs
