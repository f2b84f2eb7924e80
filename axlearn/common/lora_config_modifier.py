"""`LoraConfigModifier`: puts LoRA adapters on a trainer config's model and trains only them.

Every attention layer under `model_path` gets its QKV projection wrapped in a
`lora.LoraFusedQKVLinear` (inside a `RoFormerQKVLinear`, the projection it rotates is wrapped,
so the adapter adds before RoPE), and optionally its output projection in a
`lora.LoraMultiheadOutputLinear` and every feed-forward `linear1*`/`linear2` in a
`lora.LoraLinear`. The wrapped projections keep their configs (and so their partition specs) as
the wrapper's `layer`; their parameters move from `<proj>/...` to `<proj>/layer/...`.

With `freeze_non_adapters`, the learner's `update_rules` become
`[<existing freezing rules>, (".*/adapter/.*", ALL_UPDATES), <other existing rules>,
(".*", NO_UPDATE)]` (`lora_update_rules`): only adapter parameters get gradients, optimizer
state and updates; every other parameter stays bit-identical through training
(`Learner.Config.update_rules`, as AXLearn freezes parameters). A subtree the learner already
froze stays frozen with its adapters: the frozen reference of `dpo.DpoModel` and
`grpo.model.GrpoModel` (a clone of the policy's config, so it gets adapters too) keeps
`("reference/.*", NO_UPDATE)` first and has no optimizer state.

    cfg = LoraConfigModifier.default_config().set(rank=8, alpha=16).instantiate()(trainer_cfg)
"""

from __future__ import annotations

from typing import Any, Sequence

from axlearn.common.attention import (
    MultiheadAttention,
    RoFormerQKVLinear,
    TransformerFeedForwardLayer,
)
from axlearn.common.config import ConfigBase, ConfigModifier, config_class
from axlearn.common.config.paths import lookup_path
from axlearn.common.learner import UpdateType
from axlearn.common.lora import (
    LoraFusedQKVLinear,
    LoraLinear,
    LoraMultiheadOutputLinear,
    LoraUpFusedGroupedLinear,
)

__all__ = ["ADAPTER_PARAM_REGEX", "LoraConfigModifier", "lora_update_rules"]

# Parameter paths of LoRA adapters (the `adapter` child of every LoRA layer).
ADAPTER_PARAM_REGEX = ".*/adapter/.*"
_LORA_CLASSES = (LoraFusedQKVLinear, LoraLinear, LoraMultiheadOutputLinear)


def _configs_of(node: Any, classes: tuple[type, ...], found: list) -> list:
    """Appends to `found` every config under `node` (fields, lists, dicts) of one of `classes`."""
    if isinstance(node, ConfigBase):
        klass = getattr(node, "klass", None)
        if isinstance(klass, type) and issubclass(klass, classes):
            found.append(node)
        for key in node.keys():
            _configs_of(getattr(node, key), classes, found)
    elif isinstance(node, dict):
        for value in node.values():
            _configs_of(value, classes, found)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _configs_of(value, classes, found)
    return found


def lora_update_rules(rules: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The learner's update rules that train only the adapters, given the existing `rules`.

    The existing rules that freeze (NO_UPDATE or None) come first: a frozen subtree stays
    frozen, adapters included (e.g. the reference `reference/.*` of `dpo.DpoModel` and
    `grpo.model.GrpoModel`, a clone of the policy, so it holds adapters too). Then the adapter
    rule, the other existing rules, and a final rule freezing everything else. (The learner
    applies the first rule whose regex matches a parameter's path.)

    Args:
        rules: The learner's existing `update_rules` ((regex, UpdateType or None) pairs).

    Returns:
        The new rules.
    """
    rules = list(rules)

    def freezes(rule):
        return rule[1] is None or UpdateType(rule[1]) == UpdateType.NO_UPDATE

    return [
        *(r for r in rules if freezes(r)),
        (ADAPTER_PARAM_REGEX, UpdateType.ALL_UPDATES),
        *(r for r in rules if not freezes(r)),
        (".*", UpdateType.NO_UPDATE),
    ]


class LoraConfigModifier(ConfigModifier):
    """Wraps a model's attention (and optionally feed-forward) projections in LoRA layers."""

    @config_class
    class Config(ConfigModifier.Config):
        """Configures LoraConfigModifier."""

        # The LoRA rank of every adapter (> 0, at most the projection's input/output dims).
        rank: int = 8
        # Adapter outputs are scaled by alpha / rank.
        alpha: float = 16.0
        # Dropout rate of every adapter's input.
        dropout_rate: float = 0.0
        # Which of the query/key/value projections get an adapter (keys query, key, value).
        enable_lora: dict[str, bool] = dict(query=True, key=True, value=True)
        # Whether the attention output projection (o_proj) gets an adapter.
        output_projection: bool = True
        # Whether every feed-forward linear (linear1*, linear2) gets an adapter.
        feed_forward: bool = False
        # Dotted path of the model config in the trainer config.
        model_path: str = "model"
        # Whether to freeze every non-adapter parameter (the learner's update_rules).
        freeze_non_adapters: bool = True

    def _adapter(self, adapter_cfg: ConfigBase) -> ConfigBase:
        cfg = self.config
        adapter_cfg.set(rank=cfg.rank, alpha=cfg.alpha)
        adapter_cfg.dropout.rate = cfg.dropout_rate
        return adapter_cfg

    def _wrap_qkv(self, layer: ConfigBase, where: str) -> ConfigBase:
        cfg = self.config
        if issubclass(layer.klass, _LORA_CLASSES):
            raise ValueError(
                f"LoraConfigModifier: {where} is already a {layer.klass.__name__}; apply the "
                "modifier once."
            )
        lora = LoraFusedQKVLinear.default_config().set(layer=layer)
        self._adapter(lora.adapter).set(enable_lora=dict(cfg.enable_lora))
        grouped = "num_kv_heads" in layer
        if grouped and (cfg.enable_lora.get("key") or cfg.enable_lora.get("value")):
            lora.adapter.lora_up = LoraUpFusedGroupedLinear.default_config()
        return lora

    def _wrap(self, lora_cls: type, layer: ConfigBase, where: str) -> ConfigBase:
        if issubclass(layer.klass, _LORA_CLASSES):
            raise ValueError(
                f"LoraConfigModifier: {where} is already a {layer.klass.__name__}; apply the "
                "modifier once."
            )
        lora = lora_cls.default_config().set(layer=layer)
        self._adapter(lora.adapter)
        return lora

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Wraps the projections and (optionally) freezes the non-adapter parameters.

        Args:
            cfg: The trainer config (modified in place).

        Returns:
            The modified config.

        Raises:
            ValueError: If `model_path` holds no attention layer, a projection is already a
                LoRA layer, `enable_lora` is malformed, or `freeze_non_adapters` is set and the
                learner has no `update_rules`.
        """
        mcfg = self.config
        if set(mcfg.enable_lora) != {"query", "key", "value"}:
            raise ValueError(
                f"LoraConfigModifier.enable_lora must have the keys query, key, value; got "
                f"{mcfg.enable_lora!r}."
            )
        model = lookup_path(cfg, mcfg.model_path)
        attentions = _configs_of(model, (MultiheadAttention,), [])
        if not attentions:
            raise ValueError(
                f"LoraConfigModifier: no attention layer (MultiheadAttention or a subclass) "
                f"under {mcfg.model_path!r}; fix model_path."
            )
        feed_forwards = _configs_of(model, (TransformerFeedForwardLayer,), [])
        where = f"{mcfg.model_path}...attention"
        for attention in attentions:
            if any(mcfg.enable_lora.values()):
                outer = attention.input_linear
                if issubclass(outer.klass, RoFormerQKVLinear):
                    outer.input_linear = self._wrap_qkv(outer.input_linear, where + ".input_linear")
                else:
                    attention.input_linear = self._wrap_qkv(outer, where + ".input_linear")
            if mcfg.output_projection:
                attention.output_linear = self._wrap(
                    LoraMultiheadOutputLinear, attention.output_linear, where + ".output_linear"
                )
        if mcfg.feed_forward:
            if not feed_forwards:
                raise ValueError(
                    f"LoraConfigModifier.feed_forward is True but {mcfg.model_path!r} has no "
                    "TransformerFeedForwardLayer; set feed_forward=False."
                )
            for ff in feed_forwards:
                ff.linear1 = self._wrap(LoraLinear, ff.linear1, "feed_forward.linear1")
                ff.linear2 = self._wrap(LoraLinear, ff.linear2, "feed_forward.linear2")
        if mcfg.freeze_non_adapters:
            learner = getattr(cfg, "learner", None)
            if not isinstance(learner, ConfigBase) or "update_rules" not in learner:
                raise ValueError(
                    "LoraConfigModifier.freeze_non_adapters needs a trainer config whose learner "
                    "has update_rules (learner.Learner); set freeze_non_adapters=False or use "
                    "a Learner."
                )
            learner.update_rules = lora_update_rules(learner.update_rules)
        return cfg
