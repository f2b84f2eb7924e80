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

The cache holds compiled code that the run loads and executes, so it is used only in a
directory nobody else can write (`check_cache_dir`): the directory and every component from
the trainer dir down to it must be a real directory (not a symbolic link), owned by the user
running the trainer and not writable by the group or others. Otherwise the cache is off for the
run, with one line saying why and how to fix it. Inside that directory the entries are keyed to
the run (`run_key`: the config dump's hash, JAX's version and the platform, a subdirectory per
key), so an executable written by another config or another JAX is never looked up. What
remains trusted: the user's own account (and root), and, for a remote directory (`gs://...`),
the bucket's access control, which is not checked here.
"""

from __future__ import annotations

import hashlib
import os
import stat
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


class CacheDirRefused(ValueError):
    """The compilation cache's directory is not safe to load code from (the message says why)."""


def run_key(config_dump: str, *, platform: str) -> str:
    """The key of a run's cache entries: its subdirectory in the cache directory.

    Args:
        config_dump: The trainer config's dump (its own directory does not count: two runs of
            one config share their executables).
        platform: The JAX backend's platform.

    Returns:
        "run-" and 16 hex digits of the config hash, JAX's and jaxlib's versions and the
        platform.
    """
    import jaxlib  # pylint: disable=import-outside-toplevel

    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.run_summary import config_dump_hash

    text = "\n".join(
        [config_dump_hash(config_dump), jax.__version__, jaxlib.__version__, platform]
    )
    return "run-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _refusal(path: str, st: os.stat_result) -> Optional[str]:
    """Why a directory's stat makes it unsafe for the cache (None: it is safe)."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{path} is writable by its group or by others (mode "
            f"{stat.S_IMODE(st.st_mode):04o})"
        )
    return None


def check_cache_dir(cache_dir: str, *, trainer_dir: Optional[str] = None) -> str:
    """Creates (mode 0700) and checks the cache directory; refuses one others could write.

    When `cache_dir` is below `trainer_dir`, every component from the trainer dir down is
    checked (created without following a link: a planted link is refused, not followed);
    otherwise the directory itself is.

    Args:
        cache_dir: A local directory.
        trainer_dir: The run's trainer dir, if any.

    Returns:
        `cache_dir`.

    Raises:
        CacheDirRefused: If a component is a link, not a directory, owned by another user, or
            writable by its group or others (naming it and the rule).
    """
    below = None
    if trainer_dir:
        rel = os.path.relpath(os.path.abspath(cache_dir), os.path.abspath(trainer_dir))
        if rel != "." and not rel.startswith(".."):
            below = rel
    if below is None:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        paths = [cache_dir]
    else:
        from axlearn.common import file_access  # pylint: disable=import-outside-toplevel

        os.makedirs(trainer_dir, exist_ok=True)
        try:
            file_access.makedirs(trainer_dir, below, mode=0o700)
        except OSError as e:
            raise CacheDirRefused(str(e)) from e
        parts = below.split(os.sep)
        paths = [os.path.join(trainer_dir, *parts[: i + 1]) for i in range(len(parts))]
    for path in paths:
        reason = _refusal(path, os.lstat(path))
        if reason is not None:
            raise CacheDirRefused(reason)
    return cache_dir


def enable(
    cache_dir: str,
    *,
    trainer_dir: Optional[str] = None,
    key: Optional[str] = None,
) -> Optional[str]:
    """Turns JAX's persistent compilation cache on in `cache_dir` (before the first compile).

    A local directory is used only if `check_cache_dir` accepts it; otherwise the cache stays
    off and one warning says why and how to fix it.

    Args:
        cache_dir: The directory (local or a remote path JAX can write, e.g. gs://).
        trainer_dir: The run's trainer dir (a cache below it is checked from there down).
        key: The run's key (`run_key`): entries go to `<cache_dir>/<key>`; None: `cache_dir`.

    Returns:
        The directory JAX uses, or None when the cache was refused.
    """
    if "://" not in cache_dir:
        try:
            check_cache_dir(cache_dir, trainer_dir=trainer_dir)
            if key is not None:
                check_cache_dir(os.path.join(cache_dir, key), trainer_dir=cache_dir)
        except (CacheDirRefused, OSError) as e:
            logging.warning(
                "Persistent compilation cache: off: %s. The cache holds compiled code the run "
                "executes, so it is used only in a directory that is not a link, is owned by "
                "you and is not writable by others: fix it (chmod go-w, or remove it and let "
                "the run create it), or pass --compilation_cache_dir=PATH or =none.",
                e,
            )
            return None
    if key is not None:
        cache_dir = cache_dir.rstrip("/") + "/" + key
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
    return cache_dir


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
