"""Tests axlearn/common/device_memory.py."""

import jax
import jax.numpy as jnp

from axlearn.common import device_memory


def test_compiled_memory_stats_of_known_program():
    x = jnp.ones((64, 128), jnp.float32)
    compiled = jax.jit(lambda x: x * 2.0).lower(x).compile()
    stats = device_memory.compiled_memory_stats(compiled)
    assert stats.argument_bytes == 64 * 128 * 4
    assert stats.output_bytes == 64 * 128 * 4
    assert stats.total_bytes == (
        stats.argument_bytes
        + stats.output_bytes
        + stats.temp_bytes
        + stats.generated_code_bytes
        - stats.alias_bytes
    )
    # A donated argument is aliased with the output and counted once.
    donated = jax.jit(lambda x: x * 2.0, donate_argnums=0).lower(x).compile()
    dstats = device_memory.compiled_memory_stats(donated)
    assert dstats.alias_bytes == 64 * 128 * 4
    assert dstats.total_bytes == stats.total_bytes - 64 * 128 * 4
    assert "argument 32.8 KB" in stats.describe()
    assert stats.to_dict()["total_bytes"] == stats.total_bytes


def test_live_memory_on_cpu_is_host_rss():
    devices = jax.local_devices()
    live = device_memory.live_memory_per_device(devices)
    assert len(live) == len(devices)
    current, peak = device_memory.host_rss_bytes()
    for m in live:
        assert m.source == "host RSS"
        assert m.bytes_limit == device_memory.host_memory_bytes()
        assert 0 < m.bytes_in_use <= m.peak_bytes_in_use
        assert m.peak_bytes_in_use >= 0.9 * peak
        assert 0 < m.peak_fraction < 1
    assert "host RSS" in live[0].describe()


def test_format_bytes():
    assert device_memory.format_bytes(1.5e9) == "1.50 GB"
    assert device_memory.format_bytes(2.5e6) == "2.5 MB"
    assert device_memory.format_bytes(None) == "n/a"
