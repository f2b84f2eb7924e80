"""A decoder-only LM written directly in JAX (no framework), as a speed and numerics baseline.

The math equals `axlearn.experiments.text.gpt.model_builders.transformer_lm_config(...,
stack="stack")` with RoPE (interleaved pairs), optional QK-norm, GQA, SwiGLU, pre-norm RMSNorm
(no biases) and a tied output head. Parameters use the same nested-dict layout as that model
(`decoder/emb/token_emb/weight`, `decoder/transformer/layer{i}/...` or the repeated
`decoder/transformer/repeat/layer/...`, `decoder/output_norm/scale`), so the same parameter values
can be fed to both.

Usage (see benchmarks/lm_step_vs_plain_jax.py):

    cfg = LmConfig(vocab_size=32768, dim=256, num_layers=2, num_heads=4, num_kv_heads=4,
                   hidden_dim=1024, rope_theta=5e5, qk_norm=True)
    params = init_params(jax.random.PRNGKey(0), cfg)
    step = make_train_step(cfg, optax.adamw(1e-3))
    params, opt_state, loss, metrics = step(params, opt_state, batch)
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

NEG_INF = -1e15


@dataclasses.dataclass(frozen=True)
class LmConfig:
    """Hyper-parameters of the plain-JAX LM."""

    vocab_size: int
    dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_dim: int
    rope_theta: float = 10000.0
    qk_norm: bool = False
    eps: float = 1e-5
    z_loss_scale: float = 0.0
    pad_token_id: int = 0
    # One [dim, heads + 2 * kv_heads, head_dim] projection (FusedGroupedQKVLinear) or three
    # (GroupedQKVLinear: q_proj, k_proj, v_proj).
    fused_qkv: bool = True
    # Whether the output head reuses the token embedding (else `decoder/lm_head/weight`).
    tied_embedding: bool = True

    @property
    def head_dim(self) -> int:
        """Per-head dim."""
        return self.dim // self.num_heads


def init_params(key: jax.Array, cfg: LmConfig) -> dict:
    """Random parameters (normal, fan-in scaled; norm scales 1) in the library's layout.

    Args:
        key: PRNG key.
        cfg: The config.

    Returns:
        The nested parameter dict.
    """
    h, n, k = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    per_layer = 5 if cfg.fused_qkv else 7
    keys = iter(jax.random.split(key, 1 + per_layer * cfg.num_layers + (not cfg.tied_embedding)))

    def normal(shape, fan_in):
        return jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(fan_in)

    layers = {}
    for i in range(cfg.num_layers):
        if cfg.fused_qkv:
            projections = dict(qkv_proj=dict(weight=normal((cfg.dim, n + 2 * k, h), cfg.dim)))
        else:
            projections = {
                name: dict(weight=normal((cfg.dim, heads, h), cfg.dim))
                for name, heads in (("q_proj", n), ("k_proj", k), ("v_proj", k))
            }
        attention = dict(
            i_proj=dict(i_proj=projections),
            o_proj=dict(weight=normal((cfg.dim, n, h), n * h)),
        )
        if cfg.qk_norm:
            attention["scale_query"] = dict(norm=dict(scale=jnp.ones([h])))
            attention["scale_key"] = dict(norm=dict(scale=jnp.ones([h])))
        layers[f"layer{i}"] = dict(
            self_attention=dict(norm=dict(scale=jnp.ones([cfg.dim])), attention=attention),
            feed_forward=dict(
                norm=dict(scale=jnp.ones([cfg.dim])),
                linear1_0=dict(weight=normal((cfg.dim, cfg.hidden_dim), cfg.dim)),
                linear1_1=dict(weight=normal((cfg.dim, cfg.hidden_dim), cfg.dim)),
                linear2=dict(weight=normal((cfg.hidden_dim, cfg.dim), cfg.hidden_dim)),
            ),
        )
    decoder = dict(
        emb=dict(token_emb=dict(weight=normal((cfg.vocab_size, cfg.dim), cfg.dim))),
        transformer=layers,
        output_norm=dict(scale=jnp.ones([cfg.dim])),
    )
    if not cfg.tied_embedding:
        decoder["lm_head"] = dict(weight=normal((cfg.vocab_size, cfg.dim), cfg.dim))
    return dict(decoder=decoder)


def repeat_layers(params: dict) -> dict:
    """The same parameters in the repeated layout (`transformer/repeat/layer`, leading layer axis).

    Args:
        params: Parameters from `init_params` (stacked layout `transformer/layer{i}`).

    Returns:
        A new parameter dict that `forward` runs with `jax.lax.scan`.
    """
    layers = params["decoder"]["transformer"]
    stacked = jax.tree.map(
        lambda *xs: jnp.stack(xs), *(layers[f"layer{i}"] for i in range(len(layers)))
    )
    return dict(decoder=dict(params["decoder"], transformer=dict(repeat=dict(layer=stacked))))


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) * scale over the last axis."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotates interleaved channel pairs of x [B, T, N, H] by position * theta^(-2j/H)."""
    h = x.shape[-1]
    inv_freq = 1.0 / theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h)
    angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * inv_freq
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return jnp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1).reshape(x.shape)


def attention(x: jax.Array, p: dict, cfg: LmConfig) -> jax.Array:
    """Causal GQA self-attention of x [B, T, D]."""
    b, t, _ = x.shape
    n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    projections = p["i_proj"]["i_proj"]
    if "qkv_proj" in projections:
        proj = jnp.einsum("btd,dnh->btnh", x, projections["qkv_proj"]["weight"])
        q, key, value = jnp.split(proj, [n, n + k], axis=2)
    else:
        q, key, value = (
            jnp.einsum("btd,dnh->btnh", x, projections[name]["weight"])
            for name in ("q_proj", "k_proj", "v_proj")
        )
    q, key = rope(q, cfg.rope_theta), rope(key, cfg.rope_theta)
    if cfg.qk_norm:
        q = rms_norm(q, p["scale_query"]["norm"]["scale"], cfg.eps)
        key = rms_norm(key, p["scale_key"]["norm"]["scale"], cfg.eps)
    q = q * h**-0.5
    g = n // k
    logits = jnp.einsum("btkgh,bskh->bkgts", q.reshape(b, t, k, g, h), key).reshape(b, n, t, t)
    causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
    logits = logits + jnp.where(causal, 0.0, NEG_INF)
    probs = jax.nn.softmax(logits, axis=-1).reshape(b, k, g, t, t)
    context = jnp.einsum("bkgts,bskh->btkgh", probs, value).reshape(b, t, n, h)
    return jnp.einsum("btnh,dnh->btd", context, p["o_proj"]["weight"])


def _layer(x: jax.Array, layer: dict, cfg: LmConfig) -> jax.Array:
    """One pre-norm transformer layer: attention then SwiGLU feed-forward, both residual."""
    sa, ff = layer["self_attention"], layer["feed_forward"]
    x = x + attention(rms_norm(x, sa["norm"]["scale"], cfg.eps), sa["attention"], cfg)
    hdn = rms_norm(x, ff["norm"]["scale"], cfg.eps)
    gate = jax.nn.silu(hdn @ ff["linear1_0"]["weight"])
    return x + (gate * (hdn @ ff["linear1_1"]["weight"])) @ ff["linear2"]["weight"]


def forward(params: dict, input_ids: jax.Array, cfg: LmConfig) -> jax.Array:
    """Logits [B, T, vocab] of input_ids [B, T].

    Layers are unrolled for the stacked layout (`transformer/layer{i}`) and run with
    `jax.lax.scan` for the repeated layout (`transformer/repeat/layer`, leading layer axis).
    """
    dec = params["decoder"]
    table = dec["emb"]["token_emb"]["weight"]
    x = jnp.take(table, input_ids, axis=0)
    if "repeat" in dec["transformer"]:
        x, _ = jax.lax.scan(
            lambda x, layer: (_layer(x, layer, cfg), None), x, dec["transformer"]["repeat"]["layer"]
        )
    else:
        for i in range(cfg.num_layers):
            x = _layer(x, dec["transformer"][f"layer{i}"], cfg)
    x = rms_norm(x, dec["output_norm"]["scale"], cfg.eps)
    head = dec["lm_head"]["weight"] if "lm_head" in dec else table
    return jnp.einsum("btd,vd->btv", x, head)


def loss_fn(params: dict, batch: dict, cfg: LmConfig) -> tuple[jax.Array, dict]:
    """Mean next-token cross-entropy (+ z-loss) over live targets, with the library's metrics.

    Args:
        params: Parameters.
        batch: {"input_ids", "target_labels"} [B, T] int32 (negative or pad label: no target).
        cfg: The config.

    Returns:
        (loss, metrics) with cross_entropy, z_loss, perplexity, accuracy and num_targets.
    """
    logits = forward(params, batch["input_ids"], cfg)
    labels = batch["target_labels"]
    live = ((labels >= 0) & (labels != cfg.pad_token_id)).astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
    num = live.sum()
    denom = jnp.maximum(1.0, num)
    ce = ((log_z - target) * live).sum() / denom
    z_loss = (cfg.z_loss_scale * log_z**2 * live).sum() / denom
    # Accuracy's prediction is the first index of the maximum, as jnp.argmax gives it, computed as
    # a max-reduce and a float min-reduce over the indices reaching it: XLA CPU's variadic argmax
    # reduction costs about twice as much on [B, T, 32768] logits, and the library does the same.
    top = jnp.max(logits, axis=-1, keepdims=True)
    index = jnp.arange(logits.shape[-1], dtype=jnp.float32)
    predicted = jnp.min(jnp.where(logits == top, index, float(logits.shape[-1])), axis=-1)
    accuracy = ((predicted.astype(jnp.int32) == labels) * live).sum() / denom
    loss = ce + z_loss
    return loss, dict(
        cross_entropy=ce, z_loss=z_loss, perplexity=jnp.exp(ce), accuracy=accuracy, num_targets=num
    )


def make_train_step(cfg: LmConfig, optimizer: Any) -> Callable:
    """A jitted (params, opt_state, batch) -> (params, opt_state, loss, metrics) AdamW step.

    Args:
        cfg: The config.
        optimizer: An optax GradientTransformation.

    Returns:
        The step function (params and opt_state are donated).
    """

    def step(params, opt_state, batch):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, cfg)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        return params, opt_state, loss, metrics

    return jax.jit(step, donate_argnums=(0, 1))
