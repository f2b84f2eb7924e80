"""Config modifiers: configurables that take a config and return a modified one.

The trainer-config modifiers (including `ChainConfigModifier`) live in
`axlearn.common.trainer_config_modifier`.
"""

from __future__ import annotations

from typing import TypeVar

from axlearn.common.config.base import ConfigBase
from axlearn.common.config.instantiable import Configurable

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
