"""Config modifiers: configurables that take a config and return a modified one."""

from __future__ import annotations

from typing import TypeVar

from axlearn.common.config.base import ConfigBase, config_class
from axlearn.common.config.errors import REQUIRED, Required
from axlearn.common.config.instantiable import ConfigOr, Configurable, maybe_instantiate

T = TypeVar("T")

# --------------------------------------------------------------------------------------------
# Config modifiers.
# --------------------------------------------------------------------------------------------


class ConfigModifier(Configurable):
    """A configurable that takes a config and returns a modified one (e.g. for mesh rules)."""

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Returns the modified config (may modify `cfg` in place).

        Args:
            cfg: The config to modify.

        Returns:
            The modified config.
        """
        raise NotImplementedError(type(self))


class ChainConfigModifier(ConfigModifier):
    """Applies a sequence of config modifiers in order."""

    @config_class
    class Config(ConfigModifier.Config):
        """Configures ChainConfigModifier."""

        # The modifiers to apply, in order.
        config_modifiers: Required[list[ConfigOr[ConfigModifier]]] = REQUIRED

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self._modifiers = [maybe_instantiate(m) for m in self._config.config_modifiers]

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        for modifier in self._modifiers:
            cfg = modifier(cfg)
        return cfg
