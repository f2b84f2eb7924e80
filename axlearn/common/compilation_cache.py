"""JAX's persistent compilation cache for training: a restart does not recompile its step.

`launch_trainer_main` turns the cache on by default in `<trainer_dir>/compilation_cache`
(`--compilation_cache_dir=PATH` picks another directory, e.g. one shared by several runs;
`--compilation_cache_dir=none` turns it off; multi-process CPU runs leave it off unless a
directory is given, see `resolve_cache_dir`). Every process of a run uses the same directory. An
attempt after a failure, with the same code, config and devices, then loads the compiled train
step from it instead of compiling it again, and the trainer's start log says so:

    Compiled the train step in 0.41 s (loaded from the persistent compilation cache: 1 of 1
    executables).

`CacheLookups` counts JAX's cache hits and lookups while it is open (through
`jax.monitoring` events), which is how the trainer knows.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

import jax
from absl import logging

# The default cache directory under a trainer dir.
CACHE_DIR = "compilation_cache"
# The values of --compilation_cache_dir that turn the cache off.
OFF_VALUES = ("none", "off")

_HIT = "/jax/compilation_cache/cache_hits"
_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
_lock = threading.Lock()
_counts = {_HIT: 0, _REQUEST: 0}
_listening = False


def _listener(event: str, **kwargs) -> None:
    del kwargs
    if event in _counts:
        with _lock:
            _counts[event] += 1


def _listen() -> None:
    global _listening
    with _lock:
        if _listening:
            return
        _listening = True
    jax.monitoring.register_event_listener(_listener)


def resolve_cache_dir(
    flag_value: Optional[str],
    *,
    trainer_dir: str,
    platform: str = "cpu",
    process_count: int = 1,
) -> Optional[str]:
    """Returns the cache directory for `--compilation_cache_dir`.

    By default the cache is on, except on CPU with several processes: there JAX writes only
    process 0's executables (its CPU cache key differs per process), so after a restart process
    0 loads its step at once while the others compile it, and process 0 waits for them past the
    CPU collectives' (Gloo's) 30 s set-up timeout, failing the attempt. An explicit directory
    turns it on anyway.

    Args:
        flag_value: The flag (None or "": the default; "none"/"off": no cache; else a directory).
        trainer_dir: The run's trainer dir (the default is `<trainer_dir>/compilation_cache`).
        platform: The JAX backend's platform (`jax.default_backend()`).
        process_count: `jax.process_count()`.

    Returns:
        The directory, or None when the cache is off.
    """
    if flag_value is not None and flag_value.strip().lower() in OFF_VALUES:
        return None
    if flag_value:
        return flag_value
    if platform == "cpu" and process_count > 1:
        logging.info(
            "Persistent compilation cache: off by default for a %d-process CPU run (JAX caches "
            "only process 0's CPU executables; --compilation_cache_dir=PATH turns it on).",
            process_count,
        )
        return None
    return os.path.join(trainer_dir, CACHE_DIR)


def enable(cache_dir: str) -> None:
    """Turns JAX's persistent compilation cache on in `cache_dir` (before the first compile).

    Args:
        cache_dir: The directory (local or a remote path JAX can write, e.g. gs://).
    """
    if "://" not in cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
    if jax.config.jax_compilation_cache_dir not in (None, "", cache_dir):
        # Another run of this process used another directory: JAX keeps its first cache
        # object until reset.
        from jax._src import compilation_cache as jax_cache  # pylint: disable=C0415

        jax_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    _listen()
    logging.info(
        "Persistent compilation cache: %s (executables that took >= %.1f s to compile are "
        "stored; --compilation_cache_dir=none turns it off).",
        cache_dir,
        jax.config.jax_persistent_cache_min_compile_time_secs,
    )


def cache_dir() -> Optional[str]:
    """Returns the persistent compilation cache's directory, or None if it is off."""
    return jax.config.jax_compilation_cache_dir or None


class CacheLookups:
    """Counts the persistent cache's lookups and hits inside a `with` block.

    Attributes:
        hits: Executables loaded from the cache.
        lookups: Compilations that looked in the cache.
    """

    def __init__(self):
        self.hits = 0
        self.lookups = 0
        self._start: dict[str, int] = {}

    def __enter__(self) -> CacheLookups:
        _listen()
        with _lock:
            self._start = dict(_counts)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            self.hits = _counts[_HIT] - self._start[_HIT]
            self.lookups = _counts[_REQUEST] - self._start[_REQUEST]

    def describe(self) -> str:
        """Says where the executables came from, for the start log.

        Returns:
            E.g. "loaded from the persistent compilation cache: 1 of 1 executables",
            "compiled; not in the persistent compilation cache" or "no persistent compilation
            cache".
        """
        if cache_dir() is None:
            return "no persistent compilation cache"
        if self.hits:
            return (
                f"loaded from the persistent compilation cache: {self.hits} of "
                f"{self.lookups} executables"
            )
        return "compiled; not in the persistent compilation cache"
