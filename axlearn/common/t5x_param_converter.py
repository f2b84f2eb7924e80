"""Converts T5X (`t5x.examples.t5.network.Transformer`) parameters into our T5 models' state.

T5X's tree (kernels are stored flattened to 2-D, [in, out]):

    token_embedder/embedding                              [vocab, dim]
    encoder/relpos_bias/rel_embedding                     [heads, buckets]
    encoder/layers_{i}/pre_attention_layer_norm/scale     [dim]
    encoder/layers_{i}/attention/{query,key,value}/kernel [dim, heads * head_dim]
    encoder/layers_{i}/attention/out/kernel               [heads * head_dim, dim]
    encoder/layers_{i}/pre_mlp_layer_norm/scale
    encoder/layers_{i}/mlp/{wi_0,wi_1 | wi,wo}/kernel
    encoder/encoder_norm/scale
    decoder/layers_{i}/{pre_self_attention_layer_norm, self_attention,
                        pre_cross_attention_layer_norm, encoder_decoder_attention,
                        pre_mlp_layer_norm, mlp}
    decoder/relpos_bias/rel_embedding, decoder/decoder_norm/scale
    decoder/logits_dense/kernel                           [dim, vocab]

T5X folds the 1/sqrt(head_dim) attention scale into its query kernels; our attention applies
it, so query kernels are multiplied by sqrt(head_dim).

    state = parameters_from_t5x_encoder_decoder(t5x_params, model)   # model: T5EncoderDecoderModel
"""

import math
from typing import Any

import numpy as np

from axlearn.common.attention import RepeatedTransformerLayer, StackedTransformerLayer
from axlearn.common.module import Module
from axlearn.common.utils import NestedTensor, as_tensor

__all__ = ["parameters_from_t5x_encoder_decoder"]

# Our feed-forward linear names by T5X's.
_MLP_NAMES = {"wi": "linear1", "wi_0": "linear1_0", "wi_1": "linear1_1", "wo": "linear2"}


def _only(src: dict, keys: set, where: str) -> None:
    unknown = sorted(set(src) - keys)
    if unknown:
        raise ValueError(f"Unsupported T5X parameters under {where}: {unknown}.")


def _norm(src: dict, where: str) -> dict:
    _only(src, {"scale"}, where)
    return dict(scale=np.asarray(src["scale"]))


def _attention(src: dict, *, src_norm: dict, layer: Module, where: str) -> dict:
    """T5X MultiHeadDotProductAttention (and its pre-norm) -> TransformerAttentionLayer."""
    _only(src, {"query", "key", "value", "out"}, where)
    cfg = layer.attention.config
    num_heads = cfg.num_heads
    i_proj = layer.attention.i_proj
    if type(i_proj).__name__ != "QKVLinear":
        raise NotImplementedError(
            f"{layer.path()}: only QKVLinear input projections are supported, got "
            f"{type(i_proj).__name__}."
        )
    projections = {}
    for t5x_name, ours in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        kernel = np.asarray(src[t5x_name]["kernel"])
        head_dim = kernel.shape[1] // num_heads
        if t5x_name == "query":
            kernel = kernel * math.sqrt(head_dim)
        projections[ours] = dict(weight=kernel.reshape(kernel.shape[0], num_heads, head_dim))
    out = np.asarray(src["out"]["kernel"]).T  # [dim, heads * head_dim].
    o_proj = dict(weight=out.reshape(out.shape[0], num_heads, -1))
    return dict(
        norm=_norm(src_norm, f"{where} norm"),
        attention=dict(i_proj=projections, o_proj=o_proj),
    )


def _mlp(src: dict, *, src_norm: dict, where: str) -> dict:
    _only(src, set(_MLP_NAMES), where)
    dst = {_MLP_NAMES[k]: dict(weight=np.asarray(v["kernel"])) for k, v in src.items()}
    dst["norm"] = _norm(src_norm, f"{where} norm")
    return dst


def _transformer_layer(src: dict, layer: Module, where: str) -> dict:
    """T5X EncoderLayer / DecoderLayer -> TransformerLayer."""
    dst = {}
    if "self_attention" in src:  # Decoder layers.
        self_attention, self_norm = src["self_attention"], src["pre_self_attention_layer_norm"]
    else:
        self_attention, self_norm = src["attention"], src["pre_attention_layer_norm"]
    dst["self_attention"] = _attention(
        self_attention, src_norm=self_norm, layer=layer.self_attention, where=f"{where}/attention"
    )
    if "encoder_decoder_attention" in src:
        if "cross_attention" not in layer.children:
            raise ValueError(f"{layer.path()}: T5X has cross-attention, the layer has none.")
        dst["cross_attention"] = _attention(
            src["encoder_decoder_attention"],
            src_norm=src["pre_cross_attention_layer_norm"],
            layer=layer.cross_attention,
            where=f"{where}/encoder_decoder_attention",
        )
    dst["feed_forward"] = _mlp(src["mlp"], src_norm=src["pre_mlp_layer_norm"], where=f"{where}/mlp")
    return dst


def _stack(src: dict, stack: Module, where: str) -> dict:
    """T5X layers_{i} -> a StackedTransformerLayer's layer{i} or a Repeated layer's stack."""
    indices = sorted(int(k[len("layers_") :]) for k in src if k.startswith("layers_"))
    num_layers = stack.config.num_layers
    if indices != list(range(num_layers)):
        raise ValueError(
            f"{stack.path()}: T5X {where} has layers {indices}, expected 0..{num_layers - 1}."
        )
    if isinstance(stack, StackedTransformerLayer):
        return {
            f"layer{i}": _transformer_layer(
                src[f"layers_{i}"], getattr(stack, f"layer{i}"), f"{where}/layers_{i}"
            )
            for i in indices
        }
    if isinstance(stack, RepeatedTransformerLayer):
        layers = [
            _transformer_layer(src[f"layers_{i}"], stack.repeat.layer, f"{where}/layers_{i}")
            for i in indices
        ]
        return dict(repeat=dict(layer=_stack_trees(layers)))
    raise NotImplementedError(
        f"{stack.path()}: unsupported transformer stack {type(stack).__name__}."
    )


def _stack_trees(trees: list) -> Any:
    if isinstance(trees[0], dict):
        return {k: _stack_trees([t[k] for t in trees]) for k in trees[0]}
    return np.stack(trees)


def _rel_pos(src: dict, where: str) -> dict:
    _only(src, {"rel_embedding"}, where)
    return dict(emb=dict(weight=np.asarray(src["rel_embedding"]).T))


def parameters_from_t5x_encoder_decoder(src: NestedTensor, dst_layer: Module) -> NestedTensor:
    """Our T5EncoderDecoderModel state from T5X `network.Transformer` parameters.

    Args:
        src: The T5X parameter tree (see the module docstring), e.g. a checkpoint's "target".
        dst_layer: The T5EncoderDecoderModel (its children decide the layout, e.g. stacked or
            repeated layers).

    Returns:
        The model's parameters (only parameterized children appear).

    Raises:
        ValueError: On T5X parameters that have no counterpart, or a layer count mismatch.
        NotImplementedError: For unsupported attention projections or stacks.
    """
    _only(src, {"token_embedder", "encoder", "decoder"}, "the root")
    encoder, decoder = src["encoder"], src["decoder"]
    _only(
        encoder,
        {"relpos_bias", "encoder_norm"} | {k for k in encoder if k.startswith("layers_")},
        "encoder",
    )
    _only(
        decoder,
        {"relpos_bias", "decoder_norm", "logits_dense"}
        | {k for k in decoder if k.startswith("layers_")},
        "decoder",
    )
    enc = dict(
        transformer=_stack(encoder, dst_layer.encoder.transformer, "encoder"),
        relative_pos_emb=_rel_pos(encoder["relpos_bias"], "encoder/relpos_bias"),
        output=dict(norm=_norm(encoder["encoder_norm"], "encoder/encoder_norm")),
    )
    dec = dict(
        transformer=_stack(decoder, dst_layer.decoder.transformer, "decoder"),
        relative_pos_emb=_rel_pos(decoder["relpos_bias"], "decoder/relpos_bias"),
        output_norm=_norm(decoder["decoder_norm"], "decoder/decoder_norm"),
    )
    if "logits_dense" in decoder:
        dec["lm_head"] = dict(weight=np.asarray(decoder["logits_dense"]["kernel"]).T)
    embedding = np.asarray(src["token_embedder"]["embedding"])
    return as_tensor(dict(encoder=enc, decoder=dec, shared_token_emb=dict(weight=embedding)))
