"""Model FLOPs per training step, by one documented formula.

Every throughput number axlearn prints (TFLOP/s/device, MFU) uses this convention:

    weight FLOPs    = 6 * N_matmul * B * T
    attention FLOPs = 12 * L * H * D_h * B * T * (T + 1) / 2
    model FLOPs     = weight FLOPs + attention FLOPs

where B is the global batch size (sequences per step), T the sequence length (padded: padding
positions are computed like any other), L the number of attention layers, H the number of query
heads and D_h the per-head dimension.

- N_matmul counts the parameters that take part in matrix multiplications: every projection
  weight (attention q/k/v/o, feed-forward) and the output (logits) projection. With a tied output
  head the token embedding is that projection and counts once; an untied token embedding is only
  looked up (no matmul) and does not count. Norm scales and biases do not count.
- 6 = 2 FLOPs per multiply-add x 3: the forward pass (1x) plus the backward pass (2x: gradients
  with respect to the layer inputs and with respect to the weights).
- Attention: per layer, sequence and head the forward pass computes Q K^T and P V. With causal
  masking only the T (T + 1) / 2 query-key pairs at or below the diagonal count (the
  "causal-masked count"), each pair costing 2 D_h FLOPs in each of the two matmuls; the backward
  pass costs twice the forward: 3 x 2 x 2 x D_h = 12 D_h per pair, per head and layer.
- Not counted: rematerialization (recomputed forward work), the optimizer update, softmax, norms
  and other elementwise work. These are *model* FLOPs, the work the model needs, so runs with
  different remat settings compare fairly and MFU never exceeds what the hardware did.

Example:

    flops = lm_training_flops(
        matmul_params=10_485_760, num_layers=2, num_heads=4, per_head_dim=64,
        seq_len=128, global_batch_size=4,
    )
    print(flops.describe())
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional

import numpy as np

# Leaves whose path fully matches this are matmul weights (layers name them "weight"; norms use
# "scale" and biases "bias").
DEFAULT_MATMUL_WEIGHT_REGEX = r"(.*/)?weight"
# Embedding tables that are only looked up (never multiplied) when the output head is untied.
DEFAULT_TOKEN_EMBEDDING_REGEX = r"(.*/)?emb/token_emb/weight"
# Embedding tables that are always lookups (learned positional embeddings).
DEFAULT_LOOKUP_ONLY_REGEXES = (r"(.*/)?emb/pos_emb/weight",)
# A separate output projection, whose presence means the token embedding is untied.
DEFAULT_LM_HEAD_REGEX = r"(.*/)?lm_head/weight"


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """Model FLOPs of one training step, split into weight and attention FLOPs.

    Attributes:
        weight_flops: 6 * matmul_params * tokens_per_step.
        attention_flops: The causal-masked attention count (see the module docstring).
        matmul_params: N_matmul, the parameters that take part in matmuls.
        tokens_per_step: B * T, padded tokens per step.
        num_layers: L.
        num_heads: H (query heads).
        per_head_dim: D_h.
        seq_len: T.
        global_batch_size: B.
    """

    weight_flops: float
    attention_flops: float
    matmul_params: int
    tokens_per_step: int
    num_layers: int
    num_heads: int
    per_head_dim: int
    seq_len: int
    global_batch_size: int

    @property
    def total_flops(self) -> float:
        """Model FLOPs per step: weight + attention."""
        return self.weight_flops + self.attention_flops

    def describe(self) -> str:
        """Returns the one-line description printed at the start of training."""
        total = self.total_flops
        w_pct = 100.0 * self.weight_flops / total if total else 0.0
        a_pct = 100.0 * self.attention_flops / total if total else 0.0
        return (
            f"Per train step: model TFLOPs {total / 1e12:.6g}, split as "
            f"{w_pct:.2f}% weight FLOPs (6 x {self.matmul_params:,} matmul params x "
            f"{self.tokens_per_step:,} tokens = {self.weight_flops / 1e12:.6g} TFLOPs) and "
            f"{a_pct:.2f}% attention FLOPs (causal, 12 x {self.num_layers} layers x "
            f"{self.num_heads} heads x {self.per_head_dim} dims x {self.global_batch_size} seqs x "
            f"{self.seq_len}*{self.seq_len + 1}/2 pairs = {self.attention_flops / 1e12:.6g} TFLOPs)"
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields and the total as a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["total_flops"] = self.total_flops
        d["formula"] = (
            "weight = 6 * matmul_params * global_batch_size * seq_len; attention = 12 * "
            "num_layers * num_heads * per_head_dim * global_batch_size * seq_len * (seq_len+1)/2"
        )
        return d


def weight_flops(*, matmul_params: int, tokens: int) -> float:
    """Returns the training weight FLOPs: 6 x params-in-matmuls x tokens.

    Args:
        matmul_params: Parameters that take part in matmuls.
        tokens: Tokens processed (padded).

    Returns:
        The FLOPs, as a float.
    """
    return 6.0 * matmul_params * tokens


def causal_attention_flops(
    *, num_layers: int, num_heads: int, per_head_dim: int, seq_len: int, batch_size: int
) -> float:
    """Returns the training FLOPs of causal self-attention scores and context (QK^T and PV).

    Counts only the seq_len * (seq_len + 1) / 2 unmasked query-key pairs, 12 * per_head_dim FLOPs
    per pair, head and layer (2 matmuls x 2 FLOPs per multiply-add x 3 for forward + backward).

    Args:
        num_layers: Attention layers.
        num_heads: Query heads per layer.
        per_head_dim: Dimension per head.
        seq_len: Sequence length.
        batch_size: Sequences per step.

    Returns:
        The FLOPs, as a float.
    """
    pairs = seq_len * (seq_len + 1) / 2
    return 12.0 * num_layers * num_heads * per_head_dim * batch_size * pairs


def lm_training_flops(
    *,
    matmul_params: int,
    num_layers: int,
    num_heads: int,
    per_head_dim: int,
    seq_len: int,
    global_batch_size: int,
) -> StepFlops:
    """Returns the model FLOPs of one training step of a causal decoder-only language model.

    Args:
        matmul_params: Parameters in matmuls (see `matmul_param_count`).
        num_layers: Transformer layers.
        num_heads: Query heads per layer.
        per_head_dim: Dimension per head.
        seq_len: Sequence length (padded).
        global_batch_size: Sequences per step, over all devices.

    Returns:
        The `StepFlops`.

    Raises:
        ValueError: If a count is negative or a size is not positive.
    """
    for name, value in dict(
        num_layers=num_layers,
        num_heads=num_heads,
        per_head_dim=per_head_dim,
        seq_len=seq_len,
        global_batch_size=global_batch_size,
    ).items():
        if int(value) != value or value < 0:
            raise ValueError(f"lm_training_flops: {name} must be a non-negative int, got {value!r}")
    if matmul_params < 0:
        raise ValueError(f"lm_training_flops: matmul_params must be >= 0, got {matmul_params}")
    tokens = global_batch_size * seq_len
    return StepFlops(
        weight_flops=weight_flops(matmul_params=matmul_params, tokens=tokens),
        attention_flops=causal_attention_flops(
            num_layers=num_layers,
            num_heads=num_heads,
            per_head_dim=per_head_dim,
            seq_len=seq_len,
            batch_size=global_batch_size,
        ),
        matmul_params=int(matmul_params),
        tokens_per_step=int(tokens),
        num_layers=int(num_layers),
        num_heads=int(num_heads),
        per_head_dim=int(per_head_dim),
        seq_len=int(seq_len),
        global_batch_size=int(global_batch_size),
    )


def _key_str(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _is_shaped_leaf(x: Any) -> bool:
    return hasattr(x, "shape") and not isinstance(x, dict)


def param_shapes_by_path(params: Any) -> dict[str, tuple[int, ...]]:
    """Returns {"a/b/c": shape} for every leaf of a nested parameter tree.

    Leaves may be arrays, `jax.ShapeDtypeStruct`s or parameter specs (anything with `.shape`).

    Args:
        params: The nested tree (dicts, lists, ...).

    Returns:
        The shapes keyed by '/'-joined path.
    """
    import jax  # pylint: disable=import-outside-toplevel

    flat, _ = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_shaped_leaf)
    result = {}
    for path, leaf in flat:
        if leaf is None or not hasattr(leaf, "shape"):
            continue
        result["/".join(_key_str(k) for k in path)] = tuple(int(d) for d in leaf.shape)
    return result


def matmul_param_count(
    params: Any,
    *,
    tied_embedding: Optional[bool] = None,
    matmul_weight_regex: str = DEFAULT_MATMUL_WEIGHT_REGEX,
    token_embedding_regex: str = DEFAULT_TOKEN_EMBEDDING_REGEX,
    lookup_only_regexes: tuple[str, ...] = DEFAULT_LOOKUP_ONLY_REGEXES,
    lm_head_regex: str = DEFAULT_LM_HEAD_REGEX,
) -> int:
    """Returns N_matmul: the number of parameters that take part in matmuls.

    Counts every leaf whose path fully matches `matmul_weight_regex` (layers name their matmul
    weights "weight"; repeated layers stack them, and the stacked size counts every layer), except
    lookup-only embeddings: positional tables always, and the token embedding unless the output
    head is tied to it.

    Args:
        params: Nested parameters, shapes or parameter specs (anything with `.shape`).
        tied_embedding: Whether the logits are computed with the token embedding. None: tied
            unless a leaf matches `lm_head_regex`.
        matmul_weight_regex: Paths of matmul weights.
        token_embedding_regex: Path of the token embedding table.
        lookup_only_regexes: Paths of tables that are only looked up.
        lm_head_regex: Path of a separate output projection.

    Returns:
        The count.
    """
    shapes = param_shapes_by_path(params)
    if tied_embedding is None:
        tied_embedding = not any(re.fullmatch(lm_head_regex, p) for p in shapes)
    total = 0
    for path, shape in shapes.items():
        if not re.fullmatch(matmul_weight_regex, path):
            continue
        if any(re.fullmatch(r, path) for r in lookup_only_regexes):
            continue
        if re.fullmatch(token_embedding_regex, path) and not tied_embedding:
            continue
        total += int(np.prod(shape, dtype=np.int64))
    return total


def total_param_count(params: Any) -> int:
    """Returns the number of parameters (elements of every leaf).

    Args:
        params: Nested parameters, shapes or parameter specs.

    Returns:
        The count.
    """
    return int(sum(int(np.prod(s, dtype=np.int64)) for s in param_shapes_by_path(params).values()))


def _unique_key(flat: dict[str, Any], regex: str, what: str) -> str:
    keys = [k for k in flat if re.fullmatch(regex, k) and ".input_linear." not in k]
    if len(keys) != 1:
        raise ValueError(
            f"lm_flops_from_model_config: expected one {what} field matching {regex!r} in the "
            f"model config, found {keys or 'none'}"
        )
    return keys[0]


def lm_flops_from_model_config(
    model_cfg: Any,
    param_specs: Any,
    *,
    global_batch_size: int,
    seq_len: int,
    tied_embedding: Optional[bool] = None,
) -> StepFlops:
    """Returns the step FLOPs of a decoder-only LM from its config and parameter specs.

    Reads (with the reference library's field names) the transformer's `num_layers`, the
    attention layer's `num_heads` and its `hidden_dim` (default: the decoder's `dim`), so
    per_head_dim = hidden_dim / num_heads; N_matmul comes from `matmul_param_count(param_specs)`.

    Args:
        model_cfg: The model config (e.g. `causal_lm.Model.Config`).
        param_specs: The model's parameter specs (or parameters, or shapes).
        global_batch_size: Sequences per step.
        seq_len: Tokens per sequence.
        tied_embedding: See `matmul_param_count`.

    Returns:
        The `StepFlops`.

    Raises:
        ValueError: Naming the missing or ambiguous config field.
    """
    flat = model_cfg.to_flat_dict()
    layers_key = _unique_key(flat, r"(.*\.)?transformer\.num_layers", "num_layers")
    heads_key = _unique_key(flat, r"(.*\.)?attention\.num_heads", "attention num_heads")
    prefix = heads_key[: -len("num_heads")]
    hidden_dim = flat.get(prefix + "hidden_dim")
    if hidden_dim is None:
        hidden_dim = flat.get(_unique_key(flat, r"(.*\.)?decoder\.dim", "decoder dim"))
    num_heads = int(flat[heads_key])
    if hidden_dim % num_heads:
        raise ValueError(
            f"lm_flops_from_model_config: attention hidden dim {hidden_dim} is not divisible by "
            f"{heads_key}={num_heads}"
        )
    return lm_training_flops(
        matmul_params=matmul_param_count(param_specs, tied_embedding=tied_embedding),
        num_layers=int(flat[layers_key]),
        num_heads=num_heads,
        per_head_dim=int(hidden_dim) // num_heads,
        seq_len=seq_len,
        global_batch_size=global_batch_size,
    )
