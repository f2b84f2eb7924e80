"""1F1B and interleaved 1F1B pipeline schedules in SPMD JAX: tick tables and the runner.

Used by `axlearn.common.pipeline.Pipeline` when its schedule is `OneFOneBSchedule` or
`InterleavedOneFOneBSchedule`; see `docs/pipeline.md`.

Notation: S stages (devices along the `pipeline` mesh axis), V virtual stages (chunks of layers
per stage; V = 1 is plain 1F1B), M microbatches. An *item* is one (microbatch, round) pair;
round r of a microbatch runs chunk c = r * S + s on stage s. Items are ordered in groups of S
microbatches (Megatron's interleaved order): forward item j is microbatch
`(j // (S V)) * S + j % S` in round `(j // S) % V`; backward item k is the same microbatch in
round `V - 1 - (k // S) % V` (rounds reversed). With V = 1 item j is microbatch j.

Tick table: at tick t, stage s runs the forward of item `t - s` and the backward of item
`t - D - (S - 1 - s)`, where D = V S - 1 is the warm-up (when the last stage gets the first
item's last round); an index outside [0, V M) is an idle slot (the bubble). Each stage thus
runs one forward and one backward per tick in the steady state. Ticks [0, D) only run
forwards (warm-up), the last D ticks only backwards (cool-down): three scans, so an idle half
costs nothing. Per stage that is V M + S - 1 forward slots and as many backward slots, so the
bubble fraction is (S - 1) / (V M + S - 1).

The runner is a `jax.custom_vjp` around the whole pipelined function. Its forward rule runs the
forward ticks only and keeps no activations (only its inputs). Its backward rule runs the 1F1B
ticks in one `jax.lax.scan` per phase: the forward of an item under `jax.vjp`, whose residuals
go to a ring buffer of R slots per stage, and the backward of an older item from its slot (the
slots are allocated statically from the tick table, so R is the most items alive at once). In
lock-step SPMD both the forward and the backward hop between neighbouring stages take a tick,
so an item's residuals live up to 2 (S - 1 - s) + 1 ticks on stage s. That gives
R = min(M, 2 S - 1) microbatches for 1F1B (PipeDream's staggered stages reach S, which needs
per-device control flow) and R = (V + 1) S - 1 chunks of 1/V of a stage for the interleaved
schedule, i.e. (1 + 1/V) S - 1/V stage-microbatches: bounds independent of M, where GPipe keeps
all V M + S - 1 steps'. Residuals that are the stage's parameters are not copied into the ring:
the backward substitutes the chunk's parameters. The forward is computed twice (in the forward
rule and again in the backward), as with full rematerialization of every stage.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax import numpy as jnp

from axlearn.common.utils import NestedTensor, Tensor


def forward_item(j: Any, *, num_stages: int, num_virtual_stages: int) -> tuple[Any, Any]:
    """(microbatch, round) of forward item `j` (NumPy or JAX ints, any shape).

    Args:
        j: Item indices in [0, V * M).
        num_stages: S.
        num_virtual_stages: V.

    Returns:
        (microbatch, round), each shaped like `j`.
    """
    s, v = num_stages, num_virtual_stages
    if v == 1:
        return j, j * 0
    rem = j % (s * v)
    return (j // (s * v)) * s + rem % s, rem // s


def backward_item(k: Any, *, num_stages: int, num_virtual_stages: int) -> tuple[Any, Any]:
    """(microbatch, round) of backward item `k`: the forward order with rounds reversed.

    Args:
        k: Item indices in [0, V * M).
        num_stages: S.
        num_virtual_stages: V.

    Returns:
        (microbatch, round), each shaped like `k`.
    """
    mb, r = forward_item(k, num_stages=num_stages, num_virtual_stages=num_virtual_stages)
    return mb, num_virtual_stages - 1 - r


def forward_index(microbatch: Any, rnd: Any, *, num_stages: int, num_virtual_stages: int) -> Any:
    """The inverse of `forward_item`: the forward item index of (microbatch, round).

    Args:
        microbatch: Microbatch indices.
        rnd: Round (virtual stage) indices.
        num_stages: S.
        num_virtual_stages: V.

    Returns:
        The forward item indices.
    """
    s, v = num_stages, num_virtual_stages
    if v == 1:
        return microbatch
    return (microbatch // s) * s * v + rnd * s + microbatch % s


def warmup_ticks(num_stages: int, num_virtual_stages: int) -> int:
    """D = V * S - 1: the tick at which the last stage runs the first backward.

    Args:
        num_stages: S.
        num_virtual_stages: V.

    Returns:
        D.
    """
    return num_virtual_stages * num_stages - 1


def num_ticks(num_stages: int, num_virtual_stages: int, num_microbatches: int) -> int:
    """Ticks of the 1F1B scan: V M + V S + S - 2.

    Args:
        num_stages: S.
        num_virtual_stages: V.
        num_microbatches: M.

    Returns:
        The number of ticks.
    """
    return (
        num_virtual_stages * num_microbatches
        + warmup_ticks(num_stages, num_virtual_stages)
        + num_stages
        - 1
    )


def ring_slots(num_stages: int, num_virtual_stages: int, num_microbatches: int) -> int:
    """R: the residual slots per stage (each one chunk's residuals), the most alive at once.

    min(M, 2 S - 1) for V = 1 and (V + 1) S - 1 for V > 1 (M a multiple of S).

    Args:
        num_stages: S.
        num_virtual_stages: V.
        num_microbatches: M.

    Returns:
        R.
    """
    return tick_table(num_stages, num_virtual_stages, num_microbatches)["ring_slots"]


def tick_table(num_stages: int, num_virtual_stages: int, num_microbatches: int) -> dict[str, Any]:
    """The 1F1B tick table: what every stage runs at every tick.

    Args:
        num_stages: S.
        num_virtual_stages: V.
        num_microbatches: M.

    Returns:
        A dict with "forward" and "backward", int arrays [T, S, 2] of (microbatch, round) with
        (-1, -1) in idle slots; "num_ticks" T; "warmup_ticks" D; "ring_slots" R (the most
        items whose residuals a stage holds at once); "forward_slot" / "backward_slot", int32
        [T, S]: the ring slot each stage writes / reads at each tick; "forward_slots" and
        "backward_slots" (ticks that run a forward / backward phase, per stage) and
        "bubble_fraction" (the idle fraction of those slots).
    """
    s, v, m = num_stages, num_virtual_stages, num_microbatches
    t_total = num_ticks(s, v, m)
    d = warmup_ticks(s, v)
    fwd = -np.ones((t_total, s, 2), np.int64)
    bwd = -np.ones((t_total, s, 2), np.int64)
    kw = dict(num_stages=s, num_virtual_stages=v)
    for t in range(t_total):
        for stage in range(s):
            j = t - stage
            if 0 <= j < v * m:
                fwd[t, stage] = forward_item(j, **kw)
            k = t - d - (s - 1 - stage)
            if 0 <= k < v * m:
                bwd[t, stage] = backward_item(k, **kw)
    # Residual slots: a greedy allocation per stage in tick order (the forward half takes a free
    # slot, the backward half frees its item's slot after reading it), which uses exactly the
    # largest number of items alive at once. Idle halves use slot 0 (written before any read).
    fwd_slot = np.zeros((t_total, s), np.int32)
    bwd_slot = np.zeros((t_total, s), np.int32)
    live = 0
    for stage in range(s):
        free, used, slot_of = [], 0, {}
        for t in range(t_total):
            item = tuple(fwd[t, stage])
            if item[0] >= 0:
                if free:
                    slot = free.pop(min(range(len(free)), key=free.__getitem__))
                else:
                    slot, used = used, used + 1
                slot_of[item] = fwd_slot[t, stage] = slot
            item = tuple(bwd[t, stage])
            if item[0] >= 0:
                bwd_slot[t, stage] = slot_of.pop(item)
                free.append(int(bwd_slot[t, stage]))
        live = max(live, used)
    forward_slots = v * m + s - 1  # Ticks [0, V M + S - 1) run forwards.
    backward_slots = t_total - d  # Ticks [D, T) run backwards.
    busy = 2 * v * m * s
    return dict(
        forward=fwd,
        backward=bwd,
        num_ticks=t_total,
        warmup_ticks=d,
        ring_slots=live,
        forward_slot=fwd_slot,
        backward_slot=bwd_slot,
        forward_slots=forward_slots,
        backward_slots=backward_slots,
        bubble_fraction=1 - busy / (s * (forward_slots + backward_slots)),
    )


def format_tick_table(num_stages: int, num_virtual_stages: int, num_microbatches: int) -> str:
    """The tick table as text: one row per tick, `F<mb>.<round>` / `B<mb>.<round>` per stage.

    Args:
        num_stages: S.
        num_virtual_stages: V.
        num_microbatches: M.

    Returns:
        The table, with a header and a summary line (ticks, ring slots, bubble fraction).
    """
    table = tick_table(num_stages, num_virtual_stages, num_microbatches)

    def cell(kind, item):
        if item[0] < 0:
            return "."
        return f"{kind}{item[0]}" + (f".{item[1]}" if num_virtual_stages > 1 else "")

    rows = [["tick"] + [f"stage{s}" for s in range(num_stages)]]
    for t in range(table["num_ticks"]):
        rows.append(
            [str(t)]
            + [
                f"{cell('F', table['forward'][t, s])} {cell('B', table['backward'][t, s])}"
                for s in range(num_stages)
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append(
        f"S={num_stages} V={num_virtual_stages} M={num_microbatches}: {table['num_ticks']} ticks "
        f"(warm-up {table['warmup_ticks']}), ring of {table['ring_slots']} residual slots per "
        f"stage, bubble fraction "
        f"{table['bubble_fraction']:.4f} (= (S-1)/(V*M+S-1))"
    )
    return "\n".join(lines)


def format_schedule_table(schedule: Any) -> str:
    """The tick table of any pipeline schedule (a `pipeline.BaseSchedule`) as text.

    1F1B schedules (`explicit_backward`) print `format_tick_table`; GPipe-ordered schedules
    (GPipe, circular, stream) print their forward time steps (`F<mb>[.<round>]` per stage);
    their backward pass is autodiff of that scan, the same steps in reverse.

    Args:
        schedule: An instantiated schedule.

    Returns:
        The table text.
    """
    s, v, m = schedule.num_stages, schedule.num_virtual_stages, schedule.num_microbatches
    name = type(schedule).__name__
    if getattr(schedule, "explicit_backward", False):
        return f"{name}\n" + format_tick_table(s, v, m)
    rows = [["step"] + [f"stage{i}" for i in range(s)]]
    for t in range(schedule.num_steps()):
        mb, rnd, valid = (np.asarray(x) for x in schedule.stage_items(jnp.asarray(t)))
        rows.append(
            [str(t)]
            + [
                (f"F{mb[i]}" + (f".{rnd[i]}" if v > 1 else "")) if valid[i] else "."
                for i in range(s)
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [name] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append(
        f"S={s} V={v} M={m}: {schedule.num_steps()} forward steps, then the same steps in "
        f"reverse (autodiff); activations of all steps kept; bubble fraction "
        f"{schedule.bubble_fraction():.4f} (= (S-1)/(V*M+S-1))"
    )
    return "\n".join(lines)


def _tree_where(pred: Tensor, new: NestedTensor, old: NestedTensor) -> NestedTensor:
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def _lane_where(valid: Tensor, new: NestedTensor, old: NestedTensor) -> NestedTensor:
    """Per stage lane: new where valid[s] else old ([S, ...] leaves)."""
    return jax.tree.map(
        lambda a, b: jnp.where(valid.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old
    )


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def run_pipeline_1f1b(
    stage_fn: Callable[..., tuple[NestedTensor, NestedTensor]],
    *,
    params: NestedTensor,
    consts: NestedTensor,
    key: Any,
    inputs: NestedTensor,
    side_inputs: NestedTensor,
    num_stages: int,
    num_virtual_stages: int,
    num_microbatches: int,
    constrain: Callable[[Tensor], Tensor],
    axis_name: str,
) -> tuple[NestedTensor, NestedTensor]:
    """Runs `stage_fn` as a (interleaved) 1F1B pipeline with a custom VJP (module docstring).

    Args:
        stage_fn: `stage_fn(params_chunk, key, consts, chunk, microbatch, x, side) -> (x, y)`:
            one chunk on one microbatch, a pure function.
        params: Stacked chunk parameters, leaves [S, V, ...] (row s, v holds chunk v * S + s).
        consts: Tensors given unchanged to every chunk (differentiated).
        key: A PRNG key (not differentiated) or None.
        inputs: The first chunk's input per microbatch, leaves [M, mb, ...].
        side_inputs: Per-microbatch inputs of every chunk, leaves [M, mb, ...].
        num_stages: S.
        num_virtual_stages: V.
        num_microbatches: M.
        constrain: Shards a leading stage axis [S, ...] over the pipeline mesh axis.
        axis_name: The pipeline mesh axis (the stage vmaps' spmd_axis_name).

    Returns:
        (outputs, ys): the last chunk's output per microbatch (leaves [M, mb, ...]) and every
        chunk's `y` (leaves [S, V, M, mb, ...], row layout as `params`).
    """
    s_, v_, m_ = num_stages, num_virtual_stages, num_microbatches
    lanes = jnp.arange(s_)
    kw = dict(num_stages=s_, num_virtual_stages=v_)
    n_items = v_ * m_

    def select_params(prm, rnd):
        return jax.tree.map(
            lambda p: jax.vmap(
                lambda ps, vs: jax.lax.dynamic_index_in_dim(ps, vs, 0, keepdims=False),
                spmd_axis_name=axis_name,
            )(p, rnd),
            prm,
        )

    def first_stage_input(x_mb, state, mb0, r0):
        first = jax.tree.map(lambda b: b[mb0], x_mb)
        if v_ > 1:  # Later rounds re-enter stage 0 from the last stage's previous output.
            first = jax.tree.map(lambda f, st: jnp.where(r0 == 0, f, st[-1]), first, state)
        return jax.tree.map(
            lambda f, st: constrain(jnp.concatenate([f[None], st[:-1]], axis=0)), first, state
        )

    def forward_slots(t):
        j = t - lanes
        valid = (j >= 0) & (j < n_items)
        jc = jnp.clip(j, 0, n_items - 1)
        mb, rnd = forward_item(jc, **kw)
        return jc, mb, rnd, valid

    def initial_state(x_mb):
        return jax.tree.map(lambda b: constrain(jnp.broadcast_to(b[0], (s_, *b.shape[1:]))), x_mb)

    def vmapped(fn, in_axes):
        return jax.vmap(fn, in_axes=in_axes, spmd_axis_name=axis_name)

    def y_shapes(prm, cst, x_mb, side_mb):
        one = lambda t: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), t)  # noqa: E731
        row = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[2:], a.dtype), prm)
        _, y = jax.eval_shape(
            lambda p, c, x, sd: stage_fn(p, key, c, 0, 0, x, sd), row, cst, one(x_mb), one(side_mb)
        )
        return y

    def forward(prm, cst, x_mb, side_mb):
        y_struct = y_shapes(prm, cst, x_mb, side_mb)
        ys0 = jax.tree.map(
            lambda a: constrain(jnp.zeros((s_, v_, m_, *a.shape), a.dtype)), y_struct
        )
        out0 = jax.tree.map(jnp.zeros_like, x_mb)

        def body(carry, t):
            state, out_buf, ys_buf = carry
            _, mb, rnd, valid = forward_slots(t)
            x_in = first_stage_input(x_mb, state, mb[0], rnd[0])
            side_t = jax.tree.map(lambda a: constrain(a[mb]), side_mb)
            out, y = vmapped(stage_fn, (0, None, None, 0, 0, 0, 0))(
                select_params(prm, rnd), key, cst, rnd * s_ + lanes, mb, x_in, side_t
            )
            out = jax.tree.map(constrain, out)
            write = valid[-1] & (rnd[-1] == v_ - 1)
            out_buf = jax.tree.map(
                lambda b, o: b.at[mb[-1]].set(jnp.where(write, o[-1], b[mb[-1]])), out_buf, out
            )
            ys_buf = jax.tree.map(
                lambda b, a: vmapped(
                    lambda bs, as_, r, mi, ok: bs.at[r, mi].set(jnp.where(ok, as_, bs[r, mi])),
                    (0, 0, 0, 0, 0),
                )(b, a, rnd, mb, valid),
                ys_buf,
                y,
            )
            return (out, out_buf, ys_buf), None

        (_, out_buf, ys_buf), _ = jax.lax.scan(
            body, (initial_state(x_mb), out0, ys0), jnp.arange(n_items + s_ - 1)
        )
        return out_buf, ys_buf

    def backward(prm, cst, x_mb, side_mb, d_out, d_ys):
        table = tick_table(s_, v_, m_)
        r_slots = table["ring_slots"]
        fwd_slots, bwd_slots = (jnp.asarray(table[k]) for k in ("forward_slot", "backward_slot"))
        d_ticks = warmup_ticks(s_, v_)
        stash = {}
        known_of = lambda p, c: jax.tree.leaves((p, c))  # noqa: E731

        def lane_forward(p, c, chunk, mb, x, sd):
            def f(p, c, x, sd):
                return stage_fn(p, key, c, chunk, mb, x, sd)

            (out, _), vjp_fn = jax.vjp(f, p, c, x, sd)
            leaves, treedef = jax.tree.flatten(vjp_fn)
            known = {id(a): i for i, a in enumerate(known_of(p, c))}
            kinds = tuple(known.get(id(a), -1) for a in leaves)
            stash["treedef"], stash["kinds"] = treedef, kinds
            return out, [a for a, kind in zip(leaves, kinds) if kind < 0]

        def lane_backward(p, c, stored, ct_out, ct_y):
            known = known_of(p, c)
            it = iter(stored)
            leaves = [known[kind] if kind >= 0 else next(it) for kind in stash["kinds"]]
            vjp_fn = jax.tree.unflatten(stash["treedef"], leaves)
            return vjp_fn((ct_out, ct_y))

        def run_forward_half(state, ring, t):
            jc, mb, rnd, valid = forward_slots(t)
            x_in = first_stage_input(x_mb, state, mb[0], rnd[0])
            side_t = jax.tree.map(lambda a: constrain(a[mb]), side_mb)
            out, stored = vmapped(lane_forward, (0, None, 0, 0, 0, 0))(
                select_params(prm, rnd), cst, rnd * s_ + lanes, mb, x_in, side_t
            )
            del jc
            slot = fwd_slots[t]
            if ring is None:
                return out, stored
            ring = [
                vmapped(lambda rs, a, i, ok: rs.at[i].set(jnp.where(ok, a, rs[i])), (0, 0, 0, 0))(
                    rg, a, slot, valid
                )
                for rg, a in zip(ring, stored)
            ]
            return jax.tree.map(constrain, out), ring

        def run_backward_half(bstate, ring, acc, t):
            acc_p, acc_c, dx_buf, dside_buf = acc
            k = t - d_ticks - (s_ - 1 - lanes)
            valid = (k >= 0) & (k < n_items)
            mb, rnd = backward_item(jnp.clip(k, 0, n_items - 1), **kw)
            slot = bwd_slots[t]
            stored = [vmapped(lambda rs, i: rs[i], (0, 0))(rg, slot) for rg in ring]
            last = jax.tree.map(lambda b: b[mb[-1]], d_out)
            if v_ > 1:  # Earlier rounds get stage 0's input cotangent of the previous tick.
                last = jax.tree.map(
                    lambda f, st: jnp.where(rnd[-1] == v_ - 1, f, st[0]), last, bstate
                )
            ct_in = jax.tree.map(
                lambda f, st: constrain(jnp.concatenate([st[1:], f[None]], axis=0)), last, bstate
            )
            ct_y = jax.tree.map(
                lambda a: vmapped(lambda a_s, r, mi: a_s[r, mi], (0, 0, 0))(a, rnd, mb), d_ys
            )
            d_p, d_c, d_x, d_side = vmapped(lane_backward, (0, None, 0, 0, 0))(
                select_params(prm, rnd), cst, stored, ct_in, ct_y
            )
            zeros = lambda t_: jax.tree.map(jnp.zeros_like, t_)  # noqa: E731
            d_p, d_c, d_x = (_lane_where(valid, t_, zeros(t_)) for t_ in (d_p, d_c, d_x))
            acc_p = jax.tree.map(
                lambda a, g: vmapped(
                    lambda a_s, g_s, r: a_s.at[r].add(g_s.astype(a_s.dtype)), (0, 0, 0)
                )(a, g, rnd),
                acc_p,
                d_p,
            )
            acc_c = jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc_c, d_c)
            write = valid[0] & (rnd[0] == 0)
            dx_buf = jax.tree.map(
                lambda b, g: b.at[mb[0]].set(jnp.where(write, g[0].astype(b.dtype), b[mb[0]])),
                dx_buf,
                d_x,
            )
            dside_buf = jax.tree.map(
                lambda b, g: (
                    b
                    if b is None
                    else b.at[mb].add(
                        jnp.where(valid.reshape((-1,) + (1,) * (g.ndim - 1)), g, 0).astype(b.dtype)
                    )
                ),
                dside_buf,
                d_side,
                is_leaf=lambda a: a is None,
            )
            return jax.tree.map(constrain, d_x), (acc_p, acc_c, dx_buf, dside_buf)

        # Shapes of the stored residuals (and the stash's tree structure), traced once.
        state0 = initial_state(x_mb)
        stored_struct = jax.eval_shape(
            lambda st: run_forward_half(st, None, jnp.int32(0))[1], state0
        )
        ring0 = [constrain(jnp.zeros((s_, r_slots, *a.shape[1:]), a.dtype)) for a in stored_struct]
        acc_dtype = lambda a: jnp.promote_types(a.dtype, jnp.float32)  # noqa: E731
        acc0 = (
            jax.tree.map(lambda p: constrain(jnp.zeros(p.shape, acc_dtype(p))), prm),
            jax.tree.map(lambda c: jnp.zeros((s_, *c.shape), acc_dtype(c)), cst),
            jax.tree.map(lambda x: jnp.zeros(x.shape, acc_dtype(x)), x_mb),
            jax.tree.map(
                lambda x: jnp.zeros(x.shape, acc_dtype(x)) if _is_float(x) else None, side_mb
            ),
        )
        bstate0 = jax.tree.map(lambda x: constrain(jnp.zeros((s_, *x.shape[1:]), x.dtype)), x_mb)

        def warm(carry, t):
            state, ring = carry
            return run_forward_half(state, ring, t), None

        def steady(carry, t):
            state, bstate, ring, acc = carry
            state, ring = run_forward_half(state, ring, t)
            bstate, acc = run_backward_half(bstate, ring, acc, t)
            return (state, bstate, ring, acc), None

        def cool(carry, t):
            bstate, ring, acc = carry
            bstate, acc = run_backward_half(bstate, ring, acc, t)
            return (bstate, ring, acc), None

        end_f = n_items + s_ - 1
        (state, ring), _ = jax.lax.scan(warm, (state0, ring0), jnp.arange(0, d_ticks))
        (_, bstate, ring, acc), _ = jax.lax.scan(
            steady, (state, bstate0, ring, acc0), jnp.arange(d_ticks, end_f)
        )
        (_, _, acc), _ = jax.lax.scan(
            cool, (bstate, ring, acc), jnp.arange(end_f, num_ticks(s_, v_, m_))
        )
        acc_p, acc_c, dx_buf, dside_buf = acc
        d_prm = jax.tree.map(lambda a, p: a.astype(p.dtype), acc_p, prm)
        d_cst = jax.tree.map(lambda a, c: jnp.sum(a, axis=0).astype(c.dtype), acc_c, cst)
        d_x = jax.tree.map(lambda a, x: a.astype(x.dtype), dx_buf, x_mb)
        d_side = jax.tree.map(
            lambda a, x: None if a is None else a.astype(x.dtype),
            dside_buf,
            side_mb,
            is_leaf=lambda a: a is None,
        )
        return d_prm, d_cst, d_x, d_side

    @jax.custom_vjp
    def pipelined(prm, cst, x_mb, side_mb):
        return forward(prm, cst, x_mb, side_mb)

    def pipelined_fwd(prm, cst, x_mb, side_mb):
        return forward(prm, cst, x_mb, side_mb), (prm, cst, x_mb, side_mb)

    def pipelined_bwd(res, cts):
        return backward(*res, *cts)

    pipelined.defvjp(pipelined_fwd, pipelined_bwd)
    return pipelined(params, consts, inputs, side_inputs)


__all__ = [
    "backward_item",
    "format_schedule_table",
    "format_tick_table",
    "forward_index",
    "forward_item",
    "num_ticks",
    "ring_slots",
    "run_pipeline_1f1b",
    "tick_table",
    "warmup_ticks",
]
