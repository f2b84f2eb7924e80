"""Tests axlearn/common/compilation_cache.py: a second compile loads from the cache."""

import os

import jax
import jax.numpy as jnp
import pytest

from axlearn.common import compilation_cache


@pytest.fixture
def cache(tmp_path):
    old_dir = jax.config.jax_compilation_cache_dir
    old_min = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.enable(str(tmp_path / "cache"))
    yield str(tmp_path / "cache")
    jax.config.update("jax_compilation_cache_dir", old_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", old_min)
    # The cache object keeps its first directory until reset.
    from jax._src import compilation_cache as jax_cc  # pylint: disable=import-outside-toplevel

    jax_cc.reset_cache()


def _compile():
    def f(x):
        return jnp.tanh(x @ x.T).sum() * 3.0 + 1.25

    return jax.jit(f).lower(jax.ShapeDtypeStruct((16, 16), jnp.float32)).compile()


def test_second_compile_is_a_hit(cache):
    from jax._src import compilation_cache as jax_cc  # pylint: disable=import-outside-toplevel

    jax_cc.reset_cache()
    with compilation_cache.CacheLookups() as cold:
        _compile()
    assert cold.hits == 0 and cold.lookups == 1
    assert cold.describe() == "compiled; not in the persistent compilation cache"
    assert os.listdir(cache)  # The executable was written.
    jax.clear_caches()  # As a new process: only the persistent cache is left.
    with compilation_cache.CacheLookups() as warm:
        _compile()
    assert warm.hits == 1 and warm.lookups == 1
    assert warm.describe() == "loaded from the persistent compilation cache: 1 of 1 executables"


def test_resolve_cache_dir():
    assert compilation_cache.resolve_cache_dir(None, trainer_dir="/t") == "/t/compilation_cache"
    assert compilation_cache.resolve_cache_dir("", trainer_dir="/t") == "/t/compilation_cache"
    assert compilation_cache.resolve_cache_dir("/c", trainer_dir="/t") == "/c"
    assert compilation_cache.resolve_cache_dir("none", trainer_dir="/t") is None
    # Multi-process CPU: off by default, on when a directory is given.
    assert compilation_cache.resolve_cache_dir(None, trainer_dir="/t", process_count=2) is None
    assert compilation_cache.resolve_cache_dir("/c", trainer_dir="/t", process_count=2) == "/c"
    assert (
        compilation_cache.resolve_cache_dir(None, trainer_dir="/t", platform="gpu", process_count=2)
        == "/t/compilation_cache"
    )
