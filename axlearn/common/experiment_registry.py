"""Finding named experiments: `--module=... --config=...` -> a trainer config function.

An *experiment module* is any importable module with a function

    def named_trainer_configs() -> dict[str, Callable[[], SpmdTrainer.Config]]: ...

`--module` accepts the full module path (`axlearn.experiments.text.gpt.tiny`, or any importable
module such as `my_project.my_experiments`) and the short form relative to the installed
`axlearn.experiments` package (`text.gpt.tiny`), as AXLearn does.

Nothing in `axlearn.common` imports `axlearn.experiments` statically: modules are loaded here with
importlib, so that importing the library never pulls in every experiment (and their
TensorFlow/seqio imports).
"""

from __future__ import annotations

import difflib
import importlib
import types

from axlearn.common.config import TrainerConfigFn, similar_names

# The package that short module names (`text.gpt.tiny`) are relative to.
EXPERIMENTS_PACKAGE = "axlearn.experiments"


class ExperimentModuleNotFoundError(ImportError):
    """No module could be imported under any of the names tried for `--module`."""


class NotAnExperimentModuleError(TypeError):
    """The module imported, but it has no callable `named_trainer_configs()`."""


class UnknownTrainerConfigError(ValueError):
    """The experiment module has no trainer config of the requested name."""


def candidate_module_names(module: str) -> list[str]:
    """Returns the module paths tried, in order, for a `--module` value.

    A name that already starts with `axlearn.experiments.` is only tried as is. Any other name is
    tried first relative to the `axlearn.experiments` package (the short form), then as a full
    module path.

    Args:
        module: The `--module` value, e.g. `text.gpt.tiny` or `axlearn.experiments.text.gpt.tiny`.

    Returns:
        The module paths to try, most likely first.

    Raises:
        ValueError: If `module` is empty or not a dotted Python module path (a file path such
            as `text/gpt/tiny.py` or `text.gpt.tiny.py` is refused).
    """
    parts = module.split(".") if module else []
    if not parts or not all(p.isidentifier() for p in parts) or parts[-1] == "py":
        raise ValueError(
            f"--module must be a dotted Python module path such as 'text.gpt.tiny' or "
            f"'{EXPERIMENTS_PACKAGE}.text.gpt.tiny', got {module!r}"
        )
    if module == EXPERIMENTS_PACKAGE or module.startswith(EXPERIMENTS_PACKAGE + "."):
        return [module]
    return [f"{EXPERIMENTS_PACKAGE}.{module}", module]


def _is_missing(error: ModuleNotFoundError, name: str) -> bool:
    """Whether `error` says that `name` itself (or one of its parent packages) does not exist.

    A `ModuleNotFoundError` raised for some *other* module (a dependency the experiment imports)
    is a real error to surface, not a reason to try the next candidate name.
    """
    missing = error.name or ""
    return bool(missing) and (name == missing or name.startswith(missing + "."))


def load_experiment_module(module: str) -> types.ModuleType:
    """Imports the experiment module named by a `--module` value.

    Args:
        module: The full module path (`axlearn.experiments.text.gpt.tiny`) or the short form
            relative to the `axlearn.experiments` package (`text.gpt.tiny`).

    Returns:
        The imported module, which has a callable `named_trainer_configs`.

    Raises:
        ValueError: If `module` is not a dotted module path.
        ExperimentModuleNotFoundError: If no candidate name imports; the message lists every
            module path tried.
        NotAnExperimentModuleError: If the module has no callable `named_trainer_configs`.
        ImportError: Any other import error raised while importing the module itself (e.g. a
            missing dependency), unchanged.
    """
    tried = candidate_module_names(module)
    for name in tried:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if _is_missing(e, name):
                continue
            raise
        if not callable(getattr(mod, "named_trainer_configs", None)):
            raise NotAnExperimentModuleError(
                f"Module {name!r} (from --module={module!r}) is not an experiment module: it "
                f"defines no function named_trainer_configs() -> dict[str, config function]"
            )
        return mod
    similar = similar_names(module, _short_module_names())[:2]
    hint = f" Did you mean: {', '.join(similar)}?" if similar else ""
    raise ExperimentModuleNotFoundError(
        f"No experiment module found for --module={module!r}; tried: {', '.join(tried)}.{hint} "
        "`axlearn config list` lists the experiment modules."
    )


def _short_module_names(package: str = EXPERIMENTS_PACKAGE) -> list[str]:
    """The submodule names of `package` relative to it (`text.gpt.tiny`), found without importing
    the modules themselves (only their packages): the did-you-mean candidates of `--module`."""
    import pkgutil  # pylint: disable=import-outside-toplevel

    try:
        root = importlib.import_module(package)
    except ImportError:
        return []
    names = []
    for info in pkgutil.walk_packages(root.__path__, prefix=package + ".", onerror=lambda _: None):
        short = info.name[len(package) + 1 :]
        if not short.rsplit(".", 1)[-1].startswith("test_"):
            names.append(short)
    return sorted(names)


def named_trainer_configs(module: str) -> dict[str, TrainerConfigFn]:
    """Returns the named trainer config functions of an experiment module.

    Args:
        module: As for `load_experiment_module`.

    Returns:
        A dict from config name to a function that builds the trainer config.

    Raises:
        TypeError: If `named_trainer_configs()` does not return a dict of callables keyed by str.
        (and everything `load_experiment_module` raises)
    """
    mod = load_experiment_module(module)
    configs = mod.named_trainer_configs()
    if not isinstance(configs, dict):
        raise TypeError(
            f"{mod.__name__}.named_trainer_configs() must return a dict, "
            f"got {type(configs).__name__}"
        )
    for name, fn in configs.items():
        if not isinstance(name, str) or not callable(fn):
            raise TypeError(
                f"{mod.__name__}.named_trainer_configs() must map str names to callables, "
                f"got {name!r}: {type(fn).__name__}"
            )
    return configs


# An unknown config name gets at most this many close matches, and the module's configs are
# listed in the message only up to this many (else the command that lists them is named).
MAX_SUGGESTIONS = 5
MAX_LISTED_CONFIGS = 10


def get_named_trainer_config(config_name: str, *, config_module: str) -> TrainerConfigFn:
    """Returns the function that builds the trainer config `config_name` of `config_module`.

    Args:
        config_name: A key of the module's `named_trainer_configs()`, e.g. `gpt-tiny`.
        config_module: The `--module` value (full path or short form, see
            `load_experiment_module`).

    Returns:
        A function that takes no arguments and returns the trainer config.

    Raises:
        UnknownTrainerConfigError: If the module has no such config; the message suggests close
            matches and lists every available name.
        (and everything `named_trainer_configs` raises)
    """
    configs = named_trainer_configs(config_module)
    if config_name in configs:
        return configs[config_name]
    available = sorted(configs)
    # The closest first (by edit similarity), at most MAX_SUGGESTIONS of them.
    similar = sorted(
        similar_names(config_name, available),
        key=lambda c: (-difflib.SequenceMatcher(None, config_name, c).ratio(), c),
    )[:MAX_SUGGESTIONS]
    hint = f" Did you mean: {', '.join(similar)}?" if similar else ""
    if len(available) <= MAX_LISTED_CONFIGS:
        listing = f"Available configs ({len(available)}): {', '.join(available) or '(none)'}"
    else:
        listing = (
            f"`axlearn config list --module={config_module}` lists its {len(available)} configs."
        )
    raise UnknownTrainerConfigError(
        f"Unknown config {config_name!r} in experiment module {config_module!r}.{hint} {listing}"
    )


def list_experiment_modules(package: str = EXPERIMENTS_PACKAGE) -> dict[str, list[str]]:
    """Returns every experiment module under a package and its sorted config names.

    Walks the package's submodules (importing each); a module counts when it has a callable
    `named_trainer_configs()`. Test modules (`test_*`) are skipped.

    Args:
        package: The package to walk (default: the `axlearn.experiments` package).

    Returns:
        {module path: [config names]}, sorted by module path. Empty when the package cannot be
        imported.
    """
    import pkgutil  # pylint: disable=import-outside-toplevel

    try:
        root = importlib.import_module(package)
    except ModuleNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(root.__path__, prefix=package + "."):
        if info.name.rsplit(".", 1)[-1].startswith("test_"):
            continue
        mod = importlib.import_module(info.name)
        fn = getattr(mod, "named_trainer_configs", None)
        if callable(fn):
            out[info.name] = sorted(fn())
    return dict(sorted(out.items()))
