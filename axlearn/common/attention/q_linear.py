"""`QLinear`: projects only the query; keys/values come from an external `KVState`.

Used when several attention layers share one key/value projection (e.g. a layer that reuses the
KV of an earlier layer) and for multi-query decoding. Public names are re-exported by
`axlearn.common.attention`.
"""

from typing import Optional

from axlearn.common.attention.qkv import BaseQKVLinear, MultiheadInputLinear
from axlearn.common.config import InstantiableConfig, config_class
from axlearn.common.kv_cache.base_kv_cache import KVState
from axlearn.common.module import Module
from axlearn.common.utils import Tensor

__all__ = ["KVState", "QLinear"]


class QLinear(BaseQKVLinear):
    """Maps the input query to per-head queries; keys and values are taken from `kv_state`."""

    @config_class
    class Config(BaseQKVLinear.Config):
        """Configures QLinear."""

        # The query projection config (model_dim, num_heads, per_head_dim are set from this one).
        layer: InstantiableConfig = MultiheadInputLinear.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "q_proj",
            cfg.layer.clone(
                model_dim=cfg.query_dim, num_heads=cfg.num_heads, per_head_dim=cfg.per_head_dim
            ),
        )

    @classmethod
    def is_kv_sharing(cls, cfg: Config) -> bool:
        """True: keys/values always come from an external `kv_state`."""
        del cfg
        return True

    @property
    def num_kv_heads(self) -> int:
        """Unknown: the number of KV heads is that of the external `kv_state`."""
        raise NotImplementedError(f"{type(self).__name__} takes its key/value heads from kv_state")

    def forward(
        self,
        query: Tensor,
        *,
        kv_state: Optional[KVState] = None,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        query_positions: Optional[Tensor] = None,
    ) -> BaseQKVLinear.Output:
        """Projects `query`; returns `kv_state`'s projections as key and value.

        Args:
            query: [batch, target_length, query_dim].
            kv_state: The external key/value projections (required).
            key: Must be None (keys come from `kv_state`).
            value: Must be None.
            query_positions: Unused (accepted for interface compatibility).

        Returns:
            Output(query=[batch, target_length, num_heads, per_head_dim], key=kv_state.k_proj,
            value=kv_state.v_proj).

        Raises:
            ValueError: If `kv_state` is None or `key`/`value` is given.
        """
        del query_positions
        if kv_state is None:
            raise ValueError(f"{self.path()}: QLinear requires kv_state")
        if key is not None or value is not None:
            raise ValueError(
                f"{self.path()}: QLinear takes keys/values only from kv_state; got key/value inputs"
            )
        return self.Output(query=self.q_proj(query), key=kv_state.k_proj, value=kv_state.v_proj)
