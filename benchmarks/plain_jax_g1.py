"""G1 (the 1B yardstick) written directly in JAX, with the sweep's options, as a speed baseline.

The math of `g1_config.g1_trainer_config`'s model (`plain_jax_lm`'s layer math: RoPE, QK-norm,
GQA, SwiGLU, pre-norm RMSNorm, tied head, z-loss) with: bf16 compute from fp32 parameters and
AdamW state (as `train_dtype=bfloat16`); attention by `jax.nn.dot_product_attention` (cuDNN's
fused kernel on GPU for bf16, XLA elsewhere, as the library's FlashAttention); layers in a
`jax.lax.scan`, each under `jax.checkpoint` with the policy of the remat choice (activations
tagged with the library's remat names); and, with a chunk size, a loss scanned over chunks of
positions whose logits are recomputed in the backward pass (`jax.checkpoint` per chunk).

Usage (benchmarks/gpu_sweep.py runs it):
    step, state, batches = make_plain_g1(dims, batch=8, seq=2048, remat="none", chunk=None)
    state, loss = step(state, next(batches))
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plain_jax_lm  # noqa: E402  pylint: disable=wrong-import-position

from axlearn.common.input_fake import FakeLmInput  # noqa: E402

_MATMUL_NAMES = ("qkv_proj", "context", "o_proj", "linear1_0", "linear1_1", "linear2")
# Remat choice -> jax.checkpoint policy (None: no checkpoint), as attention.REMAT_CHOICES.
_POLICIES: dict[str, Any] = {
    "none": None,
    "save_matmuls": jax.checkpoint_policies.save_only_these_names(*_MATMUL_NAMES),
    "save_context": jax.checkpoint_policies.save_only_these_names("context"),
    "full": jax.checkpoint_policies.nothing_saveable,
}


def _attention(x: jax.Array, p: dict, cfg: plain_jax_lm.LmConfig) -> jax.Array:
    n, k = cfg.num_heads, cfg.num_kv_heads
    proj = jnp.einsum("btd,dnh->btnh", x, p["i_proj"]["i_proj"]["qkv_proj"]["weight"])
    proj = checkpoint_name(proj, "qkv_proj")
    q, key, value = jnp.split(proj, [n, n + k], axis=2)
    q = plain_jax_lm.rope(q, cfg.rope_theta).astype(x.dtype)
    key = plain_jax_lm.rope(key, cfg.rope_theta).astype(x.dtype)
    if cfg.qk_norm:
        q = plain_jax_lm.rms_norm(q, p["scale_query"]["norm"]["scale"], cfg.eps)
        key = plain_jax_lm.rms_norm(key, p["scale_key"]["norm"]["scale"], cfg.eps)
    context = jax.nn.dot_product_attention(q, key, value, is_causal=True)
    context = checkpoint_name(context, "context")
    out = jnp.einsum("btnh,dnh->btd", context, p["o_proj"]["weight"])
    return checkpoint_name(out, "o_proj")


def _layer(x: jax.Array, layer: dict, cfg: plain_jax_lm.LmConfig) -> jax.Array:
    sa, ff = layer["self_attention"], layer["feed_forward"]
    x = x + _attention(plain_jax_lm.rms_norm(x, sa["norm"]["scale"], cfg.eps), sa["attention"], cfg)
    hdn = plain_jax_lm.rms_norm(x, ff["norm"]["scale"], cfg.eps)
    gate = jax.nn.silu(checkpoint_name(hdn @ ff["linear1_0"]["weight"], "linear1_0"))
    up = checkpoint_name(hdn @ ff["linear1_1"]["weight"], "linear1_1")
    return x + checkpoint_name((gate * up) @ ff["linear2"]["weight"], "linear2")


def _chunk_loss(h, table, labels, live, z_loss_scale):
    """Sum over one chunk of live * (ce + z), and the number of correct first-argmaxes."""
    logits = jnp.einsum("btd,vd->btv", h, table)
    correct = (jnp.argmax(logits, -1) == labels) * live
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
    loss = ((log_z - target + z_loss_scale * log_z**2) * live).sum()
    return loss, jax.lax.stop_gradient(correct.sum())


def loss_fn(
    params: dict, batch: dict, cfg: plain_jax_lm.LmConfig, remat: str, chunk: Optional[int]
) -> tuple[jax.Array, jax.Array]:
    """(mean loss over live targets, accuracy) with bf16 compute.

    Args:
        params: fp32 parameters in the repeated layout (`plain_jax_lm.repeat_layers`).
        batch: {"input_ids", "target_labels"} [B, T].
        cfg: The model config.
        remat: A remat choice name ("none", "save_matmuls", "save_context", "full").
        chunk: Positions per loss chunk (dividing T), or None for full logits.

    Returns:
        (loss, accuracy).
    """
    p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    dec = p16["decoder"]
    table = dec["emb"]["token_emb"]["weight"]
    x = jnp.take(table, batch["input_ids"], axis=0)
    layer_fn = lambda x, layer: (_layer(x, layer, cfg), None)  # noqa: E731
    if _POLICIES[remat] is not None:
        layer_fn = jax.checkpoint(layer_fn, policy=_POLICIES[remat], prevent_cse=False)
    x, _ = jax.lax.scan(layer_fn, x, dec["transformer"]["repeat"]["layer"])
    x = plain_jax_lm.rms_norm(x, dec["output_norm"]["scale"], cfg.eps)
    labels = batch["target_labels"]
    live = ((labels >= 0) & (labels != cfg.pad_token_id)).astype(jnp.float32)
    if chunk is None:
        total, correct = _chunk_loss(x, table, labels, live, cfg.z_loss_scale)
    else:
        b, t = labels.shape

        def chunks(a):
            return jnp.moveaxis(a.reshape(b, t // chunk, chunk, *a.shape[2:]), 1, 0)

        body = jax.checkpoint(
            lambda h, lab, w: _chunk_loss(h, table, lab, w, cfg.z_loss_scale), prevent_cse=False
        )
        (total, correct), _ = jax.lax.scan(
            lambda acc, xs: (jax.tree.map(jnp.add, acc, body(*xs)), None),
            (jnp.zeros([], jnp.float32), jnp.zeros([], jnp.float32)),
            (chunks(x), chunks(labels), chunks(live)),
        )
    denom = jnp.maximum(1.0, live.sum())
    return total / denom, correct / denom


def make_plain_g1(
    dims: dict, *, batch: int, seq: int, remat: str, chunk: Optional[int], z_loss_scale=1e-6
) -> tuple[Callable, Any, Iterator]:
    """A jitted AdamW train step, its initial state, and FakeLmInput batches.

    Args:
        dims: Model sizes (`plain_jax_lm.LmConfig` fields).
        batch: Global batch size.
        seq: Sequence length.
        remat: Remat choice name.
        chunk: Loss chunk size or None.
        z_loss_scale: z-loss scale (the model's 1e-6).

    Returns:
        (step(state, batch) -> (state, loss), state, batch iterator).
    """
    cfg = plain_jax_lm.LmConfig(**dims, z_loss_scale=z_loss_scale)
    optimizer = optax.adamw(3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01)

    # One compiled program builds the whole state, as the trainer's initialization does. Built op
    # by op, the parameters and their temporaries interleave in device memory: on an H100 the
    # chunked-loss step then failed to allocate its 40 GiB of temporaries although they and the
    # 12.5 GB state fit in the pool (fragmentation is the likely cause; not yet rechecked).
    @jax.jit
    def init_state():
        params = plain_jax_lm.repeat_layers(plain_jax_lm.init_params(jax.random.PRNGKey(0), cfg))
        return params, optimizer.init(params)

    def step(state, batch):
        params, opt_state = state
        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, batch, cfg, remat, chunk
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    batches = iter(
        FakeLmInput.default_config()
        .set(
            name="input",
            is_training=True,
            global_batch_size=batch,
            source_length=seq,
            max_token_id=dims["vocab_size"],
        )
        .instantiate(parent=None)
    )
    return jax.jit(step, donate_argnums=(0,)), init_state(), batches
