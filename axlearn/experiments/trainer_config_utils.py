"""Trainer config utilities (AXLearn's `axlearn.experiments.trainer_config_utils`).

- `TrainerConfigFn` (`axlearn.common.config.TrainerConfigFn`, re-exported): a function returning
  a trainer config (what `named_trainer_configs()` maps config names to).
- `V6eFlashConfigModifier`: sets the TPU block size of every FlashAttention layer to 1024 (the
  mesh rules of AXLearn's Fuji configs use it on TPU v6e).
- `V7xFlashConfigModifier`: the same for TPU 7x (block size 2048), and
  `SplashAttentionConfigModifier` (splash block sizes in FlashAttention `backend_overrides`),
  both in the `tpu-7x` mesh rules of Fuji 70B.
- `config_map_cache`: caches a `named_trainer_configs` function per data dir.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

from axlearn.common.config import ConfigBase, ConfigModifier, TrainerConfigFn, config_class
from axlearn.common.flash_attention.layer import FlashAttention, set_flash_block_sizes
from axlearn.common.utils import get_data_dir

__all__ = [
    "SplashAttentionConfigModifier",
    "TrainerConfigFn",
    "V6eFlashConfigModifier",
    "V7xFlashConfigModifier",
    "config_map_cache",
    "flash_attention_configs",
]


def flash_attention_configs(cfg: ConfigBase) -> list[ConfigBase]:
    """The FlashAttention layer configs in the tree `cfg` (outside its `mesh_rules`).

    Args:
        cfg: A config tree, e.g. a trainer config.

    Returns:
        The configs whose klass is FlashAttention or a subclass, in visiting order.
    """
    found = []

    def enter(key: str, value, children):
        if key == "mesh_rules":
            return None  # The rules' own configs are not layers of this model.
        klass = getattr(value, "klass", None) if isinstance(value, ConfigBase) else None
        if isinstance(klass, type) and issubclass(klass, FlashAttention):
            found.append(value)
        return children

    cfg.visit(visit_fn=lambda key, value: None, enter_fn=enter)
    return found


class V6eFlashConfigModifier(ConfigModifier):
    """Sets `tpu_block_size` of every FlashAttention layer (1024 suits TPU v6e).

    A config without FlashAttention layers is left unchanged.
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures V6eFlashConfigModifier."""

        # The TPU block size of the flash attention kernels.
        tpu_block_size: int = 1024

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Sets the block size (in place).

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.
        """
        set_flash_block_sizes(cfg, tpu_block_size=self.config.tpu_block_size, gpu_block_size=None)
        return cfg


class V7xFlashConfigModifier(V6eFlashConfigModifier):
    """Sets `tpu_block_size` of every FlashAttention layer for TPU 7x (AXLearn uses 2048).

    A config without FlashAttention layers is left unchanged.
    """

    @config_class
    class Config(V6eFlashConfigModifier.Config):
        """Configures V7xFlashConfigModifier."""

        # The TPU block size of the flash attention kernels.
        tpu_block_size: int = 2048


class SplashAttentionConfigModifier(ConfigModifier):
    """Sets the splash-attention (TPU) block sizes of every FlashAttention layer.

    The sizes that are set go into the layer's `backend_overrides` dict (under their field names,
    e.g. "splash_block_q"), merged with the keys already there; a config without FlashAttention
    layers (or whose layers lack the field) is left unchanged. Our backends check these keys but
    pick their own tiling (see `FlashAttention.Config.backend_overrides`).
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures SplashAttentionConfigModifier."""

        # The query block size of the splash kernels (forward).
        splash_block_q: Optional[int] = None
        # The key/value block size (forward).
        splash_block_kv: Optional[int] = None
        # The key/value compute block size (forward).
        splash_block_kv_compute: Optional[int] = None
        # The query block size of the dK/dV backward kernel.
        splash_block_q_dkv: Optional[int] = None
        # The key/value block size of the dK/dV backward kernel.
        splash_block_kv_dkv: Optional[int] = None
        # The key/value compute block size of the dK/dV backward kernel.
        splash_block_kv_dkv_compute: Optional[int] = None

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Sets the block sizes (in place).

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.
        """
        # The block-size fields are named as the backend_overrides keys they set.
        sizes = {
            name: value
            for name, value in self.config.items()
            if name.startswith("splash_block_") and value is not None
        }
        for layer_cfg in flash_attention_configs(cfg):
            if "backend_overrides" in layer_cfg:
                layer_cfg.backend_overrides = {**(layer_cfg.backend_overrides or {}), **sizes}
        return cfg


def config_map_cache(
    func: Callable[..., dict[str, TrainerConfigFn]],
) -> Callable[..., dict[str, TrainerConfigFn]]:
    """Caches a `named_trainer_configs`-like function per `--data_dir` (`get_data_dir()`).

    The cached functions return fresh configs on every call (each TrainerConfigFn builds a new
    config), so callers may modify what they get.

    Args:
        func: Returns {config name: TrainerConfigFn}.

    Returns:
        The cached function (same signature).
    """

    @functools.cache
    def cached(data_dir: Optional[str], *args, **kwargs) -> dict[str, TrainerConfigFn]:
        del data_dir  # Only a cache key: configs may depend on it (e.g. "FAKE").
        return func(*args, **kwargs)

    @functools.wraps(func)
    def wrapper(*args, **kwargs) -> dict[str, TrainerConfigFn]:
        return dict(cached(get_data_dir(), *args, **kwargs))

    return wrapper
