"""Context parallelism: one sequence's self-attention split over a mesh axis.

Each device of the mesh axis (`ContextParallelConfig.mesh_axis`, default "seq", its size the
context-parallel degree d) holds T/d of the queries, keys and values of every sequence. Two forms:

- "all_gather" (AXLearn's `backend_overrides={"all_gather_attention": True}`): the keys, values
  and key segment ids are all-gathered along the sequence; each device attends its queries to
  the whole sequence. The backward pass reduce-scatters their gradients.
- "ring": the key/value blocks travel around the ring of d devices (`jax.lax.ppermute`, device
  i sends to i + 1); each device folds one block per step into an online softmax (running max
  and sum, a log-sum-exp carry), so no device ever holds more than two key/value blocks. The
  transfer of the next block is issued before the current block is computed on; XLA's
  scheduler overlaps the two (the collective-permute is asynchronous in the compiled HLO).

Load balancing (`load_balance=True`, causal-like masks only): the sequence is cut into 2d
chunks and device i holds chunks i and 2d-1-i, so every device has the same number of visible
query-key pairs. In the ring, a block pair below the diagonal attends fully and one above it not
at all: each off-diagonal step computes the half of the block the causal mask keeps for
either case and selects (a conditional would put the backward pass's collectives in branches).
The layout change happens inside the attention (after RoPE was applied at the natural
positions), so positions, masks and segment ids are those of the unsharded sequence.

Entry point: `context_parallel_attention(q, k, v, ...)` on global arrays of a jitted function
running under a mesh (`jax.set_mesh`); `axlearn.common.flash_attention.layer.FlashAttention`
calls it when its `context_parallel` field is set.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.attention_bias import MaskFn, causal_mask
from axlearn.common.config import ConfigBase, config_class
from axlearn.common.utils import Tensor

# The forms of `ContextParallelConfig.form`.
FORMS = ("ring", "all_gather")
# A finite "minus infinity" for masked logits and the initial running max (float32).
_NEG = -1e30


@config_class
class ContextParallelConfig(ConfigBase):
    """Configures context parallelism of an attention layer (see the module docstring)."""

    # The mesh axis the sequence is split over; its size is the degree.
    mesh_axis: str = "seq"
    # "ring" (blocks passed around with an online softmax) or "all_gather".
    form: str = "ring"
    # The expected degree, checked against the mesh axis size; None: whatever the mesh has.
    degree: Optional[int] = None
    # Whether causal(-like) masks use the 2*degree-chunk load-balanced layout.
    load_balance: bool = True


def is_causal_like(mask_fn: Optional[MaskFn]) -> bool:
    """Whether `mask_fn` never lets a query see a later key (causal or sliding-window causal).

    Args:
        mask_fn: A mask function or None.

    Returns:
        True for `causal_mask` and sliding-window causal masks.
    """
    if mask_fn is None:
        return False
    return mask_fn is causal_mask or getattr(mask_fn, "sliding_window_size", None) is not None


def check_context_parallel_config(cfg: ContextParallelConfig, *, path: str) -> None:
    """Raises a one-line ValueError for a bad `form`, `degree` or `mesh_axis`.

    Args:
        cfg: The config to check.
        path: Its config path, for the message.

    Raises:
        ValueError: On a bad value.
    """
    if cfg.form not in FORMS:
        raise ValueError(f"{path}.form={cfg.form!r} is not one of {FORMS}; pick one of them.")
    if cfg.degree is not None and (isinstance(cfg.degree, bool) or cfg.degree < 1):
        raise ValueError(f"{path}.degree={cfg.degree!r} must be a positive int or None.")
    if not isinstance(cfg.mesh_axis, str) or not cfg.mesh_axis:
        raise ValueError(f"{path}.mesh_axis={cfg.mesh_axis!r} must name a mesh axis.")


def to_load_balanced(x: Tensor, degree: int) -> Tensor:
    """Reorders axis 1 of x [batch, T, ...] to the load-balanced layout.

    The result is chunks [0, 2d-1, 1, 2d-2, ..., d-1, d] of T/(2d) tokens each: its i-th
    1/d part (device i's shard) holds chunks i and 2d-1-i.

    Args:
        x: [batch, T, ...] with T divisible by 2 * degree.
        degree: The context-parallel degree d.

    Returns:
        x reordered, same shape.
    """
    batch, length, rest = x.shape[0], x.shape[1], x.shape[2:]
    chunk = length // (2 * degree)
    x = x.reshape(batch, 2, degree, chunk, *rest)
    x = jnp.stack([x[:, 0], jnp.flip(x[:, 1], axis=1)], axis=2)
    return x.reshape(batch, length, *rest)


def from_load_balanced(x: Tensor, degree: int) -> Tensor:
    """The inverse of `to_load_balanced`.

    Args:
        x: [batch, T, ...] in the load-balanced layout.
        degree: The context-parallel degree d.

    Returns:
        x in natural order, same shape.
    """
    batch, length, rest = x.shape[0], x.shape[1], x.shape[2:]
    chunk = length // (2 * degree)
    x = x.reshape(batch, degree, 2, chunk, *rest)
    x = jnp.stack([x[:, :, 0], jnp.flip(x[:, :, 1], axis=1)], axis=1)
    return x.reshape(batch, length, *rest)


def shard_positions(index: Tensor, *, length: int, degree: int, load_balance: bool) -> Tensor:
    """The sequence positions [T/d] held by shard `index` of the layout.

    Args:
        index: The shard index (an int or a scalar tensor, e.g. `lax.axis_index`).
        length: The global sequence length T.
        degree: The degree d.
        load_balance: Whether the layout is the load-balanced one.

    Returns:
        int32 [T/d] positions.
    """
    local = length // degree
    if not load_balance:
        return index * local + jnp.arange(local, dtype=jnp.int32)
    chunk = length // (2 * degree)
    first = index * chunk + jnp.arange(chunk, dtype=jnp.int32)
    second = (2 * degree - 1 - index) * chunk + jnp.arange(chunk, dtype=jnp.int32)
    return jnp.concatenate([first, second])


def _block_mask(
    mask_fn: Optional[MaskFn],
    q_pos: Tensor,
    k_pos: Tensor,
    q_seg: Optional[Tensor],
    k_seg: Optional[Tensor],
) -> Tensor:
    """Boolean [batch or 1, Tq, Sk]: which query-key pairs of a block attend."""
    if mask_fn is None:
        mask = jnp.ones((q_pos.shape[0], k_pos.shape[0]), dtype=bool)
    else:
        mask = mask_fn(q_pos[:, None], k_pos[None, :])
    mask = mask[None]
    if q_seg is not None:
        mask = mask & (q_seg[:, :, None] == k_seg[:, None, :])
    return mask


def _fold_block(carry, q, k, v, mask, logit_cap: Optional[float]):
    """Folds one key/value block into the online-softmax carry (o, m, total).

    q: [B, Tq, K, G, H] f32; k, v: [B, S, K, H]; mask: [B or 1, Tq, S] bool;
    o: [B, Tq, K, G, H]; m, l: [B, K, G, Tq].
    """
    o, m, total = carry
    s = jnp.einsum("btkgh,bskh->bkgts", q, k.astype(jnp.float32))
    if logit_cap:
        s = logit_cap * jnp.tanh(s / logit_cap)
    mask = mask[:, None, None]
    s = jnp.where(mask, s, _NEG)
    # The output does not depend on the running max; no gradient flows through it.
    m_new = jax.lax.stop_gradient(jnp.maximum(m, s.max(axis=-1)))
    p = jnp.exp(s - m_new[..., None]) * mask
    correction = jnp.exp(m - m_new)
    total = total * correction + p.sum(axis=-1)
    pv = jnp.einsum("bkgts,bskh->btkgh", p, v.astype(jnp.float32))
    o = o * jnp.moveaxis(correction, -1, 1)[..., None] + pv
    return o, m_new, total


def _fold(carry, q, k, v, q_pos, k_pos, q_seg, k_seg, *, mask_fn, logit_cap, remat: bool):
    """`_fold_block` of the block's mask; with `remat`, rematerialized in the backward pass.

    Rematerialized, a step keeps only its inputs (the carry and the block) for the backward
    pass and recomputes the block's mask and probabilities from them, as flash attention's
    backward does, instead of keeping a [Tq, S] block of probabilities per step.
    """

    def fn(carry, q, k, v, q_pos, k_pos, q_seg, k_seg):
        mask = _block_mask(mask_fn, q_pos, k_pos, q_seg, k_seg)
        return _fold_block(carry, q, k, v, mask, logit_cap)

    if remat:
        fn = jax.checkpoint(fn)
    return fn(carry, q, k, v, q_pos, k_pos, q_seg, k_seg)


def _init_carry(q):
    batch, length, kv_heads, groups, _ = q.shape
    o = jnp.zeros(q.shape, jnp.float32)
    m = jnp.full((batch, kv_heads, groups, length), _NEG, jnp.float32)
    total = jnp.zeros((batch, kv_heads, groups, length), jnp.float32)
    return o, m, total


def _finish(carry):
    o, _, total = carry
    total = jnp.moveaxis(total, -1, 1)[..., None]
    return jnp.where(total > 0, o / jnp.where(total > 0, total, 1.0), 0.0)


def _update_rows(carry, rows: slice, fn):
    """Applies fn to the carry restricted to query rows `rows`, writing the result back."""
    o, m, total = carry
    sub = (o[:, rows], m[..., rows], total[..., rows])
    o_s, m_s, total_s = fn(sub)
    start = rows.start or 0
    o = jax.lax.dynamic_update_slice_in_dim(o, o_s, start, axis=1)
    m = jax.lax.dynamic_update_slice_in_dim(m, m_s, start, axis=3)
    total = jax.lax.dynamic_update_slice_in_dim(total, total_s, start, axis=3)
    return o, m, total


def _local_attention(
    q,
    k,
    v,
    q_seg,
    k_seg,
    *,
    axis: str,
    degree: int,
    length: int,
    form: str,
    load_balance: bool,
    mask_fn: Optional[MaskFn],
    logit_cap: Optional[float],
):
    """The per-device attention of q [B, T/d, N, H] over the sequence (inside shard_map)."""
    batch, local, num_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    q5 = q.astype(jnp.float32).reshape(batch, local, kv_heads, num_heads // kv_heads, head_dim)
    index = jax.lax.axis_index(axis)
    positions = lambda i: shard_positions(
        i, length=length, degree=degree, load_balance=load_balance
    )
    q_pos = positions(index)
    carry = _init_carry(q5)
    if form == "all_gather":
        gather = lambda x: jax.lax.all_gather(x, axis, axis=1, tiled=True)
        k_all, v_all = gather(k), gather(v)
        k_seg_all = None if k_seg is None else gather(k_seg)
        k_pos = jnp.concatenate([positions(i) for i in range(degree)])
        mask = _block_mask(mask_fn, q_pos, k_pos, q_seg, k_seg_all)
        carry = _fold_block(carry, q5, k_all, v_all, mask, logit_cap)
        return _finish(carry).reshape(q.shape).astype(q.dtype)

    # Ring: device i sends its current block to i + 1; at step s it holds block (i - s) mod d.
    perm = [(i, (i + 1) % degree) for i in range(degree)]
    skip = load_balance and is_causal_like(mask_fn)
    fold = functools.partial(_fold, mask_fn=mask_fn, logit_cap=logit_cap, remat=True)
    half = local // 2
    block = (k, v, k_seg)
    for step in range(degree):
        # Issue the transfer of the next block before computing on this one.
        if step + 1 < degree:
            next_block = jax.tree.map(lambda x: jax.lax.ppermute(x, axis, perm), block)
        kb, vb, kb_seg = block
        src = (index - step) % degree
        k_pos = positions(src)
        if step == 0 or not skip:
            carry = fold(carry, q5, kb, vb, q_pos, k_pos, q_seg, kb_seg)
        else:
            # src < i: every query sees only the block's first chunk (chunk src);
            # src > i: only the queries' second chunk (2d-1-i) sees the block, all of it.
            def early(c, kb=kb, vb=vb, kb_seg=kb_seg, k_pos=k_pos):
                seg = None if kb_seg is None else kb_seg[:, :half]
                return fold(c, q5, kb[:, :half], vb[:, :half], q_pos, k_pos[:half], q_seg, seg)

            def late(c, kb=kb, vb=vb, kb_seg=kb_seg, k_pos=k_pos):
                seg = None if q_seg is None else q_seg[:, half:]
                rows = slice(half, local)

                def fn(sub):
                    return fold(sub, q5[:, half:], kb, vb, q_pos[half:], k_pos, seg, kb_seg)

                return _update_rows(c, rows, fn)

            # Both halves, then a select: a `lax.cond` here let XLA move the ring's collective
            # permutes of the backward pass into the branches, which devices take differently
            # (a deadlock: seen on 8 CPU devices at degree 2). Same FLOPs as one full block.
            early_carry, late_carry = early(carry), late(carry)
            is_early = src < index
            carry = jax.tree.map(
                lambda a, b, e=is_early: jnp.where(e, a, b), early_carry, late_carry
            )
        if step + 1 < degree:
            block = next_block
    return _finish(carry).reshape(q.shape).astype(q.dtype)


def context_parallel_degree(mesh_axis: str, *, path: str) -> int:
    """The size of `mesh_axis` in the current mesh (1 outside a mesh or on one device).

    Args:
        mesh_axis: The axis name.
        path: The config path, for messages.

    Returns:
        The degree.

    Raises:
        ValueError: If a mesh of several devices lacks the axis.
    """
    mesh = _mesh()
    if mesh is None or (mesh.size == 1 and mesh_axis not in mesh.axis_names):
        return 1
    if mesh_axis not in mesh.axis_names:
        raise ValueError(
            f"{path}.mesh_axis={mesh_axis!r} is not an axis of the mesh "
            f"{tuple(mesh.axis_names)}; name one of its axes or add it to mesh_axis_names."
        )
    return int(mesh.shape[mesh_axis])


def _mesh():
    from axlearn.common.utils import _current_abstract_mesh  # pylint: disable=protected-access

    return _current_abstract_mesh()


def context_parallel_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    segment_ids: Optional[Tensor] = None,
    mask_fn: Optional[MaskFn] = None,
    cfg: ContextParallelConfig,
    path: str = "context_parallel",
    logit_cap: Optional[float] = None,
) -> Tensor:
    """Self-attention of (already scaled) q over k/v with the sequence split over a mesh axis.

    Args:
        q: [batch, T, num_heads, head_dim] queries (scaled; no further 1/sqrt(d) is applied).
        k: [batch, T, num_kv_heads, head_dim], num_kv_heads dividing num_heads (GQA).
        v: [batch, T, num_kv_heads, head_dim].
        segment_ids: Optional [batch, T] segment ids (tokens attend within their segment).
        mask_fn: Optional mask function of (query position, key position), e.g. `causal_mask`
            or `sliding_window_causal_mask(w)`; None: every pair attends.
        cfg: The context-parallel config.
        path: The config path of `cfg`, for error messages.
        logit_cap: Optional soft cap of the logits (cap * tanh(logits / cap)).

    Returns:
        The context [batch, T, num_heads, head_dim], in q's dtype.

    Raises:
        ValueError: One line naming `path`, when the mesh axis is missing, its size differs
            from `cfg.degree`, or T is not divisible by the degree (2 * degree when balanced).
    """
    check_context_parallel_config(cfg, path=path)
    mesh = _mesh()
    if mesh is None or cfg.mesh_axis not in mesh.axis_names:
        axes = None if mesh is None else tuple(mesh.axis_names)
        raise ValueError(
            f"{path}.mesh_axis={cfg.mesh_axis!r} is not an axis of the current mesh {axes}; "
            "run under a mesh that has it (mesh rules / mesh_axis_names) or unset the field."
        )
    degree = int(mesh.shape[cfg.mesh_axis])
    if cfg.degree is not None and cfg.degree != degree:
        raise ValueError(
            f"{path}.degree={cfg.degree} does not match mesh axis {cfg.mesh_axis!r} of size "
            f"{degree}; set degree=None or a mesh_shape whose {cfg.mesh_axis!r} is {cfg.degree}."
        )
    length = q.shape[1]
    if k.shape[1] != length:
        raise ValueError(
            f"{path}: context parallelism is for self-attention; got {length} queries and "
            f"{k.shape[1]} keys. Unset it for cross-attention layers."
        )
    if degree == 1:
        load_balance = False
    else:
        load_balance = bool(cfg.load_balance) and is_causal_like(mask_fn)
    divisor = 2 * degree if load_balance else degree
    if length % divisor:
        what = "2 * degree" if load_balance else "degree"
        raise ValueError(
            f"{path}: sequence length {length} is not divisible by {what} = {divisor} "
            f"(mesh axis {cfg.mesh_axis!r} of size {degree}); pad the sequence to a multiple "
            f"of {divisor} or change the mesh."
        )
    if load_balance:
        q, k, v = (to_load_balanced(x, degree) for x in (q, k, v))
        if segment_ids is not None:
            segment_ids = to_load_balanced(segment_ids, degree)
    local = functools.partial(
        _local_attention,
        axis=cfg.mesh_axis,
        degree=degree,
        length=length,
        form=cfg.form,
        load_balance=load_balance,
        mask_fn=mask_fn,
        logit_cap=logit_cap,
    )
    spec = PartitionSpec(None, cfg.mesh_axis)
    seg_spec = None if segment_ids is None else spec
    out = jax.shard_map(
        lambda q, k, v, s: local(q, k, v, s, s),
        mesh=mesh,
        in_specs=(spec, spec, spec, seg_spec),
        out_specs=spec,
        axis_names={cfg.mesh_axis},
        check_vma=False,
    )(q, k, v, segment_ids)
    if load_balance:
        out = from_load_balanced(out, degree)
    return out
