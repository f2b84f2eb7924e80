"""Converts Hugging Face BERT-family encoder weights to our `encoder.Encoder` parameter paths.

Shared by the HF parity tests of `bert`, `distilbert` and the text encoders built on them. HF's
BERT and DistilBERT lay out the same post-norm encoder under different names: `BERT_NAMES` and
`DISTILBERT_NAMES` give each model's names for the parts, `encoder_weights` maps a state dict to
{our path: array} and `state_from_flat` builds a model's state tree from that map.
"""

from typing import Optional

import jax
import numpy as np

from axlearn.common import utils

# HF names of each encoder part: embeddings (relative to the model prefix) and, per layer,
# relative to `layer` formatted with the layer index.
BERT_NAMES = dict(
    token_emb="embeddings.word_embeddings",
    pos_emb="embeddings.position_embeddings",
    type_emb="embeddings.token_type_embeddings",
    emb_norm="embeddings.LayerNorm",
    layer="encoder.layer.{i}.",
    q_proj="attention.self.query",
    k_proj="attention.self.key",
    v_proj="attention.self.value",
    o_proj="attention.output.dense",
    attention_norm="attention.output.LayerNorm",
    linear1="intermediate.dense",
    linear2="output.dense",
    feed_forward_norm="output.LayerNorm",
)
DISTILBERT_NAMES = dict(
    token_emb="embeddings.word_embeddings",
    pos_emb="embeddings.position_embeddings",
    type_emb=None,  # DistilBERT has no token types.
    emb_norm="embeddings.LayerNorm",
    layer="transformer.layer.{i}.",
    q_proj="attention.q_lin",
    k_proj="attention.k_lin",
    v_proj="attention.v_lin",
    o_proj="attention.out_lin",
    attention_norm="sa_layer_norm",
    linear1="ffn.lin1",
    linear2="ffn.lin2",
    feed_forward_norm="output_layer_norm",
)


def numpy_state_dict(model) -> dict:
    """{name: float32 array} of a torch module's state dict."""
    return {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}


def encoder_weights(
    sd: dict,
    prefix: str,
    *,
    dim: int,
    heads: int,
    layers: int,
    names: Optional[dict] = None,
    ours: str = "encoder/",
) -> dict:
    """{our path: array} of an HF encoder's weights.

    Args:
        sd: The HF state dict as arrays (`numpy_state_dict`).
        prefix: The encoder's prefix in `sd` (e.g. "bert." or "").
        dim: Hidden dim.
        heads: Attention heads.
        layers: Number of layers.
        names: The HF layout (`BERT_NAMES` by default, or `DISTILBERT_NAMES`).
        ours: Our encoder's path prefix.

    Returns:
        The converted weights.
    """
    names = names or BERT_NAMES
    head_dim = dim // heads
    out = {
        ours + "emb/token_emb/weight": sd[prefix + names["token_emb"] + ".weight"],
        ours + "emb/pos_emb/weight": sd[prefix + names["pos_emb"] + ".weight"][None],
        ours + "emb/norm/scale": sd[prefix + names["emb_norm"] + ".weight"],
        ours + "emb/norm/bias": sd[prefix + names["emb_norm"] + ".bias"],
    }
    if names["type_emb"]:
        out[ours + "emb/type_emb/weight"] = sd[prefix + names["type_emb"] + ".weight"]
    for i in range(layers):
        hf, layer = prefix + names["layer"].format(i=i), f"{ours}transformer/layer{i}/"
        att = layer + "self_attention/attention/"
        for proj in ("q_proj", "k_proj", "v_proj"):
            w = sd[hf + names[proj] + ".weight"].T.reshape(dim, heads, head_dim)
            out[att + f"i_proj/{proj}/weight"] = w
            out[att + f"i_proj/{proj}/bias"] = sd[hf + names[proj] + ".bias"].reshape(
                heads, head_dim
            )
        out[att + "o_proj/weight"] = sd[hf + names["o_proj"] + ".weight"].reshape(
            dim, heads, head_dim
        )
        out[att + "o_proj/bias"] = sd[hf + names["o_proj"] + ".bias"]
        for norm, path in (
            ("attention_norm", "self_attention/norm"),
            ("feed_forward_norm", "feed_forward/norm"),
        ):
            out[layer + path + "/scale"] = sd[hf + names[norm] + ".weight"]
            out[layer + path + "/bias"] = sd[hf + names[norm] + ".bias"]
        for lin in ("linear1", "linear2"):
            out[layer + f"feed_forward/{lin}/weight"] = sd[hf + names[lin] + ".weight"].T
            out[layer + f"feed_forward/{lin}/bias"] = sd[hf + names[lin] + ".bias"]
    return out


def state_from_flat(model, flat: dict) -> dict:
    """The model's state tree from {path: array}; every parameter is converted exactly once.

    Args:
        model: The instantiated layer.
        flat: {"/"-joined path: array}.

    Returns:
        The state tree (asserts that paths and shapes match the model's parameter specs).
    """
    specs = model.create_parameter_specs_recursively()
    flat_specs = dict(utils.flatten_items(specs))
    assert set(flat_specs) == set(flat), set(flat_specs) ^ set(flat)
    for path, spec in flat_specs.items():
        assert tuple(spec.shape) == flat[path].shape, path
    return jax.tree_util.tree_map_with_path(
        lambda kp, _: flat[jax.tree_util.keystr(kp, simple=True, separator="/")], specs
    )


UPDATE_ENV = "AXLEARN_UPDATE_GOLDENS"


def flat_case(case: dict, prefix: str = "") -> dict:
    """{"group/.../name": array} of a nested golden case ({"params": {...}, "inputs": ...})."""
    flat = {}
    for key, value in case.items():
        if isinstance(value, dict):
            flat.update(flat_case(value, f"{prefix}{key}/"))
        else:
            flat[prefix + key] = np.asarray(value)
    return flat


def check_golden(module_name: str, cases: dict, *, atol: float = 1e-6) -> None:
    """Checks that the shipped golden file of `module_name` holds `cases` (fresh HF data).

    With $AXLEARN_UPDATE_GOLDENS set, (re)writes the file from `cases` first (compressed).

    Args:
        module_name: The golden's module name (e.g. "axlearn.common.distilbert_test").
        cases: {test name: nested case}.
        atol: Tolerance of the comparison.
    """
    import os  # pylint: disable=import-outside-toplevel

    from axlearn.common.golden import golden_path, load_golden  # pylint: disable=import-outside-toplevel

    if os.environ.get(UPDATE_ENV):
        arrays = {}
        for name, case in cases.items():
            arrays.update({f"{name}/{k}": v for k, v in flat_case(case).items()})
        np.savez_compressed(golden_path(module_name), **arrays)
    for name, case in cases.items():
        stored = flat_case(load_golden(module_name, name))
        fresh = flat_case(case)
        assert set(stored) == set(fresh), set(stored) ^ set(fresh)
        for key, value in fresh.items():
            np.testing.assert_allclose(stored[key], value, atol=atol, err_msg=f"{name} {key}")
