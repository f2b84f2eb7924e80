"""Weight conversion between Hugging Face Llama checkpoints and `causal_lm.Model` parameters.

Hugging Face's `LlamaForCausalLM` state dict uses the keys

    model.embed_tokens.weight                          [vocab, dim]
    model.layers.{i}.input_layernorm.weight            [dim]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight   [out, in]  (torch Linear layout)
    model.layers.{i}.post_attention_layernorm.weight   [dim]
    model.layers.{i}.mlp.{gate,up,down}_proj.weight    [out, in]
    model.norm.weight                                  [dim]
    lm_head.weight                                     [vocab, dim]  (tied: same as embed_tokens)

and our model (see `axlearn.experiments.text.gpt.model_builders.transformer_lm_config`) uses

    decoder/emb/token_emb/weight                                   [vocab, dim]
    .../self_attention/norm/scale                                  [dim]
    .../self_attention/attention/i_proj/i_proj/qkv_proj/weight  [dim, heads + 2 kv_heads, head_dim]
        (or .../i_proj/i_proj/{q,k,v}_proj/weight [dim, heads, head_dim] without QKV fusion)
    .../self_attention/attention/o_proj/weight                     [dim, heads, head_dim]
    .../feed_forward/norm/scale                                    [dim]
    .../feed_forward/linear1_0/weight  (gate)                      [dim, hidden]
    .../feed_forward/linear1_1/weight  (up)                        [dim, hidden]
    .../feed_forward/linear2/weight    (down)                      [hidden, dim]
    decoder/output_norm/scale                                      [dim]
    decoder/lm_head/weight                                         [vocab, dim]  (untied only)

where `...` is `decoder/transformer/repeat/layer` (parameters stacked on a leading layer axis) for
a `RepeatedTransformerLayer` stack, or `decoder/transformer/layer{i}` for a
`StackedTransformerLayer`.

Rotary embeddings: our `RoFormerQKVLinear` rotates interleaved channel pairs (2j, 2j+1) while
Hugging Face rotates the halves (j, j + head_dim/2) with the same frequencies. The conversion
permutes the query and key output channels of each head accordingly (values are not rotated and
are not permuted), so both models compute identical attention logits.
"""

import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)")


def _to_numpy(value: Any) -> np.ndarray:
    """Converts a torch tensor or array-like to a NumPy array (bfloat16 tensors become float32)."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch.
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def _rope_permutation(head_dim: int) -> np.ndarray:
    """Index map: our channel k of a head holds Hugging Face's channel perm[k]."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    half = head_dim // 2
    k = np.arange(head_dim)
    return np.where(k % 2 == 0, k // 2, k // 2 + half)


def _path_str(path) -> str:
    parts = []
    for entry in path:
        if hasattr(entry, "key"):
            parts.append(str(entry.key))
        elif hasattr(entry, "idx"):
            parts.append(str(entry.idx))
        else:
            parts.append(str(entry))
    return "/".join(parts)


def _flat_paths(tree: Any) -> dict[str, Any]:
    """Flattens a nested dict to {'a/b/c': leaf}."""
    return {_path_str(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _layout(paths: list[str]) -> tuple[str, int]:
    """Returns ('repeat', -1) or ('stack', num_layers) from our parameter paths."""
    if any(p.startswith("decoder/transformer/repeat/layer/") for p in paths):
        return "repeat", -1
    layers = {
        int(m.group(1))
        for p in paths
        if (m := re.match(r"decoder/transformer/layer(\d+)/", p)) is not None
    }
    if not layers:
        raise ValueError(
            "Parameters have neither decoder/transformer/repeat/layer/... nor "
            "decoder/transformer/layer{i}/... paths; not a decoder-only LM."
        )
    return "stack", max(layers) + 1


def _attention_layout(layer_paths: list[str]) -> tuple[str, str]:
    """Returns (prefix, kind) of the QKV projection: kind is 'fused_grouped', 'fused' or 'split'."""
    for p in layer_paths:
        m = re.match(r"(self_attention/attention/i_proj/(?:i_proj/)?)(qkv_proj|q_proj)/weight$", p)
        if m:
            return m.group(1), ("fused" if m.group(2) == "qkv_proj" else "split")
    raise ValueError(f"No QKV projection weight among layer parameters: {sorted(layer_paths)}")


def _per_layer_params_from_hf(
    sd: Mapping[str, np.ndarray], index: int, *, qkv_prefix: str, qkv_kind: str, head_dim: int
) -> dict[str, np.ndarray]:
    """Our parameters of layer `index` (relative paths) from the Hugging Face state dict."""

    def get(name):
        key = f"model.layers.{index}.{name}"
        if key not in sd:
            raise KeyError(f"Missing Hugging Face key {key}")
        return sd[key]

    perm = _rope_permutation(head_dim)
    dim = get("self_attn.q_proj.weight").shape[1]

    def heads(weight, rotary: bool):
        # [n * head_dim, dim] -> [dim, n, head_dim], with RoPE channels permuted.
        n = weight.shape[0] // head_dim
        w = weight.reshape(n, head_dim, dim)
        if rotary:
            w = w[:, perm, :]
        return np.transpose(w, (2, 0, 1))

    q = heads(get("self_attn.q_proj.weight"), True)
    k = heads(get("self_attn.k_proj.weight"), True)
    v = heads(get("self_attn.v_proj.weight"), False)
    out = {}
    if qkv_kind == "split":
        out[qkv_prefix + "q_proj/weight"] = q
        out[qkv_prefix + "k_proj/weight"] = k
        out[qkv_prefix + "v_proj/weight"] = v
    else:
        out[qkv_prefix + "qkv_proj/weight"] = (q, k, v)  # Resolved against the target shape.
    o = get("self_attn.o_proj.weight")  # [dim, n * head_dim]
    out["self_attention/attention/o_proj/weight"] = o.reshape(dim, -1, head_dim)
    out["self_attention/norm/scale"] = get("input_layernorm.weight")
    out["feed_forward/norm/scale"] = get("post_attention_layernorm.weight")
    out["feed_forward/linear1_0/weight"] = get("mlp.gate_proj.weight").T
    out["feed_forward/linear1_1/weight"] = get("mlp.up_proj.weight").T
    out["feed_forward/linear2/weight"] = get("mlp.down_proj.weight").T
    return out


def _resolve_qkv(value, target_shape: tuple) -> np.ndarray:
    """Packs (q, k, v) head weights into a fused layout of `target_shape`."""
    q, k, v = value
    if len(target_shape) == 4:  # FusedQKVLinear: [3, dim, heads, head_dim].
        return np.stack([q, k, v], axis=0)
    return np.concatenate([q, k, v], axis=1)  # FusedGroupedQKVLinear: [dim, n + 2k, head_dim].


def _torch_layout(w: np.ndarray, *, rotary: bool) -> np.ndarray:
    """[dim, n, head_dim] -> [n * head_dim, dim], undoing the RoPE channel permutation."""
    dim, _, head_dim = w.shape
    w = np.transpose(w, (1, 2, 0))
    if rotary:
        w = w[:, np.argsort(_rope_permutation(head_dim)), :]
    return w.reshape(-1, dim)


def hf_llama_to_axlearn(state_dict: Mapping[str, Any], *, target: Any) -> Any:
    """Converts a Hugging Face Llama state dict to our parameter tree.

    Args:
        state_dict: `LlamaForCausalLM.state_dict()` (torch tensors or arrays), e.g. from
            `safetensors.numpy.load_file`. `lm_head.weight` is used only if `target` has
            `decoder/lm_head/weight` (an untied head).
        target: The parameter tree to fill, with arrays or `jax.ShapeDtypeStruct` leaves (e.g.
            `jax.eval_shape` of the model's `initialize_parameters_recursively`). It fixes the
            layout (repeated or stacked layers, fused or split QKV) and the dtypes.

    Returns:
        A tree with `target`'s structure of NumPy arrays in `target`'s dtypes.

    Raises:
        KeyError: If a key needed by `target` is missing from `state_dict`.
        ValueError: If `target` has parameters with no Hugging Face counterpart (e.g. QK-norm
            scales) or a converted shape differs from `target`'s.
    """
    sd = {k: _to_numpy(v) for k, v in state_dict.items()}
    flat_target = _flat_paths(target)
    paths = list(flat_target)
    layout, num_layers = _layout(paths)
    prefix = "decoder/transformer/repeat/layer/" if layout == "repeat" else None
    layer_paths = [
        re.sub(r"^decoder/transformer/(repeat/layer|layer\d+)/", "", p)
        for p in paths
        if p.startswith("decoder/transformer/")
    ]
    qkv_prefix, qkv_kind = _attention_layout(layer_paths)
    if layout == "repeat":
        hf_layers = {int(m.group(1)) for k in sd if (m := _LAYER_KEY.match(k))}
        num_layers = max(hf_layers) + 1 if hf_layers else 0
    o_target = next(p for p in paths if p.endswith("self_attention/attention/o_proj/weight"))
    head_dim = flat_target[o_target].shape[-1]

    per_layer = [
        _per_layer_params_from_hf(
            sd, i, qkv_prefix=qkv_prefix, qkv_kind=qkv_kind, head_dim=head_dim
        )
        for i in range(num_layers)
    ]
    values: dict[str, Any] = {
        "decoder/emb/token_emb/weight": sd["model.embed_tokens.weight"],
        "decoder/output_norm/scale": sd["model.norm.weight"],
    }
    if "lm_head.weight" in sd:
        values["decoder/lm_head/weight"] = sd["lm_head.weight"]
    if layout == "repeat":
        for name in per_layer[0]:
            items = [layer[name] for layer in per_layer]
            if isinstance(items[0], tuple):
                shape = flat_target[prefix + name].shape[1:]
                items = [_resolve_qkv(item, shape) for item in items]
            values[prefix + name] = np.stack(items, axis=0)
    else:
        for i, layer in enumerate(per_layer):
            for name, value in layer.items():
                path = f"decoder/transformer/layer{i}/{name}"
                if isinstance(value, tuple):
                    value = _resolve_qkv(value, flat_target[path].shape)
                values[path] = value

    def fill(path, leaf):
        key = _path_str(path)
        if key not in values:
            raise ValueError(f"Parameter {key} has no counterpart in a Hugging Face Llama model")
        value = values[key]
        if tuple(value.shape) != tuple(leaf.shape):
            raise ValueError(
                f"Shape mismatch for {key}: converted {value.shape}, target {leaf.shape}"
            )
        return np.asarray(value, dtype=leaf.dtype)

    return jax.tree_util.tree_map_with_path(fill, target)


def axlearn_to_hf_llama(
    params: Any, *, num_heads: int, num_kv_heads: int, include_tied_lm_head: bool = True
) -> dict[str, np.ndarray]:
    """Converts our parameter tree to a Hugging Face Llama state dict.

    Args:
        params: Our model's parameter tree (see the module docstring for the layout).
        num_heads: Number of query heads.
        num_kv_heads: Number of key/value heads.
        include_tied_lm_head: When the head is tied (no `decoder/lm_head/weight`), whether to
            emit `lm_head.weight` as a copy of the embedding (as `LlamaForCausalLM.state_dict()`
            does with `tie_word_embeddings=True`).

    Returns:
        {key: NumPy array} in Hugging Face's layout and our dtypes.

    Raises:
        ValueError: If `params` is not a decoder-only LM tree of the expected layout.
    """
    flat = {k: np.asarray(v) for k, v in _flat_paths(params).items()}
    paths = list(flat)
    layout, num_layers = _layout(paths)
    if layout == "repeat":
        prefix = "decoder/transformer/repeat/layer/"
        num_layers = next(v for k, v in flat.items() if k.startswith(prefix)).shape[0]

        def layer_value(i, name):
            return flat[prefix + name][i]

        layer_paths = [p[len(prefix) :] for p in paths if p.startswith(prefix)]
    else:

        def layer_value(i, name):
            return flat[f"decoder/transformer/layer{i}/{name}"]

        layer_paths = [
            p[len("decoder/transformer/layer0/") :]
            for p in paths
            if p.startswith("decoder/transformer/layer0/")
        ]
    qkv_prefix, qkv_kind = _attention_layout(layer_paths)
    unsupported = [
        p for p in layer_paths if re.search(r"scale_query|scale_key|bias$|lm_head/bias", p)
    ]
    if unsupported:
        raise ValueError(f"Parameters with no Hugging Face Llama counterpart: {unsupported}")

    sd = {"model.embed_tokens.weight": flat["decoder/emb/token_emb/weight"]}
    for i in range(num_layers):
        if qkv_kind == "split":
            q = layer_value(i, qkv_prefix + "q_proj/weight")
            k = layer_value(i, qkv_prefix + "k_proj/weight")
            v = layer_value(i, qkv_prefix + "v_proj/weight")
        else:
            w = layer_value(i, qkv_prefix + "qkv_proj/weight")
            if w.ndim == 4:
                q, k, v = w[0], w[1], w[2]
            else:
                q, k, v = np.split(w, [num_heads, num_heads + num_kv_heads], axis=1)
        dim = q.shape[0]
        key = f"model.layers.{i}."
        sd[key + "self_attn.q_proj.weight"] = _torch_layout(q, rotary=True)
        sd[key + "self_attn.k_proj.weight"] = _torch_layout(k, rotary=True)
        sd[key + "self_attn.v_proj.weight"] = _torch_layout(v, rotary=False)
        o = layer_value(i, "self_attention/attention/o_proj/weight")
        sd[key + "self_attn.o_proj.weight"] = o.reshape(dim, -1)
        sd[key + "mlp.gate_proj.weight"] = layer_value(i, "feed_forward/linear1_0/weight").T
        sd[key + "mlp.up_proj.weight"] = layer_value(i, "feed_forward/linear1_1/weight").T
        sd[key + "mlp.down_proj.weight"] = layer_value(i, "feed_forward/linear2/weight").T
        sd[key + "input_layernorm.weight"] = layer_value(i, "self_attention/norm/scale")
        sd[key + "post_attention_layernorm.weight"] = layer_value(i, "feed_forward/norm/scale")
    sd["model.norm.weight"] = flat["decoder/output_norm/scale"]
    if "decoder/lm_head/weight" in flat:
        sd["lm_head.weight"] = flat["decoder/lm_head/weight"]
    elif include_tied_lm_head:
        sd["lm_head.weight"] = flat["decoder/emb/token_emb/weight"]
    return {k: np.ascontiguousarray(v) for k, v in sd.items()}
