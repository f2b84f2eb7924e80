"""Loss metrics: layers computing a model's loss and summaries from its predictions.

`BaseLossMetrics` is the interface (AXLearn's `loss_metrics.BaseLossMetrics`). A model with a
`metrics` child (e.g. `causal_lm.Model`) calls it as

    loss, outputs = self.metrics(input_batch, predict_outputs=..., module_outputs=...)

and adds `outputs["summaries"]` ({name: WeightedScalar}) as its own summaries. The language-model
implementations are in `axlearn.common.causal_lm`: `CrossEntropyLossMetrics` (next-token
cross-entropy plus z-loss), `AuxLossMetrics` (auxiliary losses from module outputs, e.g. MoE
load balancing) and `CompositeLossMetrics` (a weighted sum of child metrics).

`filter_module_outputs` picks the module outputs a metrics layer needs by a path regex.
`ModalityLossMetrics` wraps another metrics layer and restricts its loss to the tokens of one
modality (and to non-padding targets).
"""

import re
from typing import Any, Optional

import jax
import jax.numpy as jnp

from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.embedding import ModalityVocabInfo
from axlearn.common.module import Module
from axlearn.common.utils import Nested, Tensor, flatten_items


class BaseLossMetrics(Module):
    """Computes a loss and its summaries from an input batch and the model's outputs."""

    def forward(
        self,
        input_batch: Nested[Tensor],
        *,
        predict_outputs: Nested[Tensor],
        module_outputs: Nested[Tensor],
    ) -> tuple[Tensor, dict[str, Any]]:
        """Computes the loss.

        Args:
            input_batch: The model's input batch.
            predict_outputs: The model's predictions (e.g. {"logits": ..., "hidden_states": ...}).
            module_outputs: The module outputs of the model's invocation, flattened to
                {"decoder/transformer/.../aux_loss": tensor}.

        Returns:
            (loss, outputs): a scalar loss and {"summaries": {name: WeightedScalar}} plus
            optional extra outputs (e.g. "per_token_loss").
        """
        raise NotImplementedError(type(self))


def filter_module_outputs(
    module_outputs: Nested[Tensor], *, path_regex: str, default: Any = REQUIRED
) -> Nested[Tensor]:
    """Returns the leaves of `module_outputs` whose "/"-joined path fully matches `path_regex`.

    `path_regex` has exactly one capturing group; each match is placed in the result at the
    path that group captured (so a group ending in a leaf name gives {leaf: value}, and one
    capturing a subtree's relative paths gives that subtree).

    Args:
        module_outputs: The nested module outputs.
        path_regex: A regex with exactly one capturing group, matched against whole paths.
        default: What to return when nothing matches; REQUIRED (the default) raises instead.

    Returns:
        The nested matches, or `default`.

    Raises:
        ValueError: If the regex has not exactly one group, two matches capture the same path,
            or nothing matches and there is no default.
    """
    pattern = re.compile(path_regex)
    if pattern.groups != 1:
        raise ValueError(
            f"filter_module_outputs: path_regex={path_regex!r} should define exactly one "
            f"matching group; it has {pattern.groups}."
        )
    matched: dict[str, Any] = {}
    for path, value in flatten_items(module_outputs):
        m = pattern.fullmatch(path)
        if m is None:
            continue
        keys = m.group(1).split("/")
        node = matched
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ValueError(f"filter_module_outputs: Multiple paths matched {m.group(1)!r}.")
        if keys[-1] in node:
            raise ValueError(f"filter_module_outputs: Multiple paths matched {m.group(1)!r}.")
        node[keys[-1]] = value
    if not matched:
        if default is REQUIRED:
            raise ValueError(
                f"filter_module_outputs: No paths matched {path_regex!r} in "
                f"{jax.tree_util.tree_structure(module_outputs)}; pass default= or fix the regex."
            )
        return default
    return matched


class ModalityLossMetrics(BaseLossMetrics):
    """Runs `inner` on the targets of one modality only.

    The input batch's `target_labels` (with -1 at padding and placeholder ids where the
    modality's tokens go) decide which targets are live: those >= 0 and, if
    `modality_vocab_info` is set, in its placeholder range [placeholder_start, placeholder_end).
    The inner layer gets the batch with `live_targets` set to that mask (times the batch's own
    `live_targets`, as float32, if there are any) and `target_labels` replaced by the labels the
    embedding layer wrote to the module outputs (placeholders replaced by real ids). The inner
    layer's outputs are returned as they are.
    """

    @config_class
    class Config(BaseLossMetrics.Config):
        """Configures ModalityLossMetrics."""

        # The metrics layer computing the loss on the selected targets.
        inner: Required[BaseLossMetrics.Config] = REQUIRED
        # The modality whose placeholder ids select the targets; None: all non-padding targets.
        modality_vocab_info: Optional[ModalityVocabInfo] = None
        # Regex (one group) locating the embedding layer's target labels in the module outputs.
        target_labels_pattern: str = "(?:.*/?)(target_labels)"

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._add_child("inner", cfg.inner)

    def forward(
        self,
        input_batch: Nested[Tensor],
        *,
        predict_outputs: Nested[Tensor],
        module_outputs: Nested[Tensor],
    ) -> tuple[Tensor, dict[str, Any]]:
        """Computes the inner loss on the modality's live targets.

        Args:
            input_batch: The model's input batch, with "target_labels" [batch, seq_len] (-1 at
                padding) and optionally "live_targets" [batch, seq_len] (bool or float weights).
            predict_outputs: The model's predictions, passed to `inner`.
            module_outputs: The module outputs, holding the embedding layer's target labels at
                a path matching `target_labels_pattern`; passed to `inner`.

        Returns:
            The inner layer's (loss, outputs).

        Raises:
            ValueError: If the input batch has no "target_labels" or the module outputs have no
                match for `target_labels_pattern`.
        """
        cfg: ModalityLossMetrics.Config = self.config
        if not isinstance(input_batch, dict) or input_batch.get("target_labels") is None:
            raise ValueError(
                f"{self.path()}: input_batch must contain 'target_labels', got keys "
                f"{sorted(input_batch) if isinstance(input_batch, dict) else type(input_batch)}."
            )
        labels = input_batch["target_labels"]
        selected = labels >= 0
        info = cfg.modality_vocab_info
        if info is not None:
            selected &= (labels >= info.placeholder_start) & (labels < info.placeholder_end)
        live_targets = input_batch.get("live_targets")
        if live_targets is None:
            live_targets = selected
        else:
            live_targets = live_targets.astype(jnp.float32) * selected.astype(jnp.float32)
        try:
            found = filter_module_outputs(module_outputs, path_regex=cfg.target_labels_pattern)
        except ValueError as e:
            raise ValueError(
                f"{self.path()}: no target_labels in module_outputs matching "
                f"target_labels_pattern={cfg.target_labels_pattern!r}: {e}"
            ) from e
        if "target_labels" not in found:
            raise ValueError(
                f"{self.path()}: target_labels_pattern={cfg.target_labels_pattern!r} must "
                f"capture 'target_labels', captured {sorted(found)}."
            )
        inner_batch = {
            **input_batch,
            "target_labels": found["target_labels"],
            "live_targets": live_targets,
        }
        return self.inner(
            input_batch=inner_batch, predict_outputs=predict_outputs, module_outputs=module_outputs
        )
