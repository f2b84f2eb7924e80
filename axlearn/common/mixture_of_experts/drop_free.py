"""Token-drop-free mixture of experts on grouped matmuls.

`TransformerFeedForwardDropFreeMoE` routes each of the T tokens to its k experts
(`TopKDropFreeGating`), sorts the T * k (token, expert) pairs by expert, runs the experts as grouped
matmuls (`megablock.ops.gmm`; `gmm_backend` PALLAS, RAGGED_DOT or TOKAMAX all run on
`jax.lax.ragged_dot` here) and sums each token's k outputs weighted by its gates. No capacity, so
no token is dropped. `ApproximateTokenDropFreeMoE` adds expert parallelism: pairs are exchanged
between the ranks of the "expert" mesh axis, each rank receiving at most
`expert_parallel_capacity` x its own pair count (`_all_to_all_dispatch` / `_all_to_all_combine`).
"""

import enum
import functools
from collections.abc import Sequence
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.config import config_class
from axlearn.common.layers import get_activation_fn
from axlearn.common.megablock import ops as megablock_ops
from axlearn.common.mixture_of_experts.gating import TopKDropFreeGating
from axlearn.common.mixture_of_experts.layer import TransformerFeedForwardMoE
from axlearn.common.utils import Tensor, current_mesh


class GMMBackend(enum.Enum):
    """Grouped-matmul implementations (`TransformerFeedForwardDropFreeMoE.gmm_backend`)."""

    PALLAS = "PALLAS"
    RAGGED_DOT = "RAGGED_DOT"
    TOKAMAX = "TOKAMAX"


@functools.partial(jax.custom_vjp, nondiff_argnums=())
def _custom_gather(x: Tensor, idx: Tensor, inverse_idx: Tensor) -> Tensor:
    """x[idx] whose gradient is a gather (by `inverse_idx` = argsort(idx)) instead of a scatter.

    `idx` must list every row of x the same number r of times (as MoE dispatch does: r = k);
    the gradient of row i sums its r copies.

    Args:
        x: [n, ...].
        idx: Int [n * r], values in [0, n), each value r times.
        inverse_idx: argsort(idx).

    Returns:
        x[idx].
    """
    del inverse_idx
    return x[idx]


def _custom_gather_fwd(x, idx, inverse_idx):
    return x[idx], (inverse_idx, x.shape[0])


def _custom_gather_bwd(residuals, grad):
    inverse_idx, n = residuals
    grad = grad[inverse_idx]
    grad = grad.reshape((n, -1) + grad.shape[1:]).sum(axis=1)
    return grad, None, None


_custom_gather.defvjp(_custom_gather_fwd, _custom_gather_bwd)


class TransformerFeedForwardDropFreeMoE(TransformerFeedForwardMoE):
    """Drop-free MoE on grouped matmuls (see the module docstring)."""

    @config_class
    class Config(TransformerFeedForwardMoE.Config):
        """Configures TransformerFeedForwardDropFreeMoE."""

        # The router (inherited default Top2Gating, as AXLearn's; set a TopKDropFreeGating).
        # Partition specs by dims of the expert weights ("me", "emh", "ehm").
        dim_to_mesh_axis_map: dict[str, Optional[PartitionSpec]] = {
            "me": PartitionSpec(None, None),
            "emh": PartitionSpec(None, ("fsdp", "seq"), "model"),
            "ehm": PartitionSpec(None, "model", ("fsdp", "seq")),
        }
        # Partition specs of the layer's input ("bsm": [batch, seq, model]).
        input_dim_to_partition_spec: dict[str, Optional[PartitionSpec]] = {
            "bsm": PartitionSpec(("data", "fsdp"), "seq", None),
        }
        # Partition specs of the output ("bsm") and of the expert weights inside the matmuls.
        output_dim_to_partition_spec: dict[str, Optional[PartitionSpec]] = {
            "bsm": PartitionSpec(("data", "fsdp"), "seq", "model"),
            "emh": PartitionSpec(None, None, "model"),
            "ehm": PartitionSpec(None, "model", None),
        }
        # GMM tiling (tm, tk, tn), a config of a selector (see megablock.ops.select_tiling_fn),
        # or None: (128, 128, 128).
        tiling: Optional[Union[tuple[int, int, int], Any]] = None
        interpret: bool = False  # Interpret the GMM kernel (CPU testing of Pallas kernels).
        # Accumulation/output dtype of the grouped matmuls; None: the input dtype.
        preferred_element_type: Optional[Any] = None
        gmm_backend: Optional[GMMBackend] = None  # GMM implementation; None: PALLAS.
        # Kernel choice(s) of the TOKAMAX backend, e.g. ["triton", "xla"].
        tokamax_implementation: Optional[Union[str, Sequence[str]]] = None
        # Weight of the sequence-wise load balance loss in "aux_loss"; None/0 disables it.
        seq_load_balance_loss_weight: Optional[float] = None

    def __init__(self, cfg: Config, *, parent):
        super().__init__(cfg, parent=parent)
        if not isinstance(self.gating, TopKDropFreeGating):
            raise ValueError(
                f"{self.path()}.gating is a {type(self.gating).__name__}: set a "
                "TopKDropFreeGating (or TopKBiasGating) config"
            )

    def _tiling(self):
        tiling = self.config.tiling
        if tiling is None:
            return (128, 128, 128)
        if hasattr(tiling, "instantiate"):
            return tiling.instantiate()
        return tiling

    def _padded_gmm(self, lhs: Tensor, rhs: Tensor, tokens_per_expert: Tensor) -> Tensor:
        """Grouped matmul of expert-sorted rows lhs [T, K] with rhs [E, K, N] -> [T, N]."""
        cfg = self.config
        backend = cfg.gmm_backend or GMMBackend.PALLAS
        if not isinstance(backend, GMMBackend):
            raise ValueError(f"{self.path()}.gmm_backend={backend!r} is not a GMMBackend")
        return megablock_ops.gmm(
            lhs,
            rhs,
            tokens_per_expert,
            tiling=self._tiling(),
            preferred_element_type=cfg.preferred_element_type or lhs.dtype,
            interpret=cfg.interpret,
        ).astype(lhs.dtype)

    def _experts(
        self, sorted_inputs: Tensor, tokens_per_expert: Tensor, weights: Optional[dict] = None
    ) -> Tensor:
        """Runs the experts on expert-sorted rows [N, M] -> [N, M] (`weights`: default params)."""
        cfg = self.config
        weights = self.parameters if weights is None else weights
        activations = cfg.activation
        if not isinstance(activations, (tuple, list)):
            activations = (activations,)
        hidden = None
        for name, act in zip(self._wi_names(), activations):
            h = self._padded_gmm(sorted_inputs, weights[name], tokens_per_expert)
            h = self._remat_name(h, name.replace("_weight", "").replace("wi", "linear1"))
            h = get_activation_fn(act)(h)
            hidden = h if hidden is None else hidden * h
        return self._padded_gmm(hidden, weights["wo_weight"], tokens_per_expert)

    def _dispatch_hook(self, *, sorted_inputs: Tensor, tokens_per_expert: Tensor):
        """Subclass hook before the experts: returns (inputs, tokens_per_expert, residuals)."""
        return sorted_inputs, tokens_per_expert, None

    def _combine_hook(self, *, sorted_output: Tensor, residuals: Any) -> Tensor:
        """Subclass hook after the experts."""
        del residuals
        return sorted_output

    def _dispatch_and_combine(self, x: Tensor) -> Tensor:
        """Routes x [..., M] (drop-free), runs the experts and combines their outputs."""
        cfg = self.config
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits = jnp.einsum("tm,me->te", tokens, self.parameters["gate_weight"])
        logits = logits.reshape(shape[:-1] + (cfg.num_experts,))
        if logits.ndim == 2:
            logits = logits[None]
        gating = self.gating(logits, seq_load_balance_loss_weight=cfg.seq_load_balance_loss_weight)
        aux_loss = self._aux_loss(gating.load_balance_loss, gating.router_z_loss)
        if cfg.seq_load_balance_loss_weight and gating.seq_load_balance_loss is not None:
            aux_loss = aux_loss + cfg.seq_load_balance_loss_weight * gating.seq_load_balance_loss
        self.add_module_output("aux_loss", aux_loss)
        k = gating.gate_assignment.shape[-1]
        experts = gating.gate_assignment.reshape(-1)  # [T * k].
        weights = gating.expert_weights.reshape(-1, k)  # [T, k].
        order = jnp.argsort(experts, stable=True)
        inverse = jnp.argsort(order)
        sorted_inputs = _custom_gather(tokens, order // k, inverse)
        tokens_per_expert = jnp.bincount(experts, length=cfg.num_experts).astype(jnp.int32)
        sorted_inputs, local_tokens_per_expert, residuals = self._dispatch_hook(
            sorted_inputs=sorted_inputs, tokens_per_expert=tokens_per_expert
        )
        sorted_output = self._experts(sorted_inputs, local_tokens_per_expert)
        sorted_output = self._combine_hook(sorted_output=sorted_output, residuals=residuals)
        outputs = sorted_output[inverse].reshape(tokens.shape[0], k, shape[-1])
        combined = jnp.einsum("tkm,tk->tm", outputs, weights.astype(outputs.dtype))
        return combined.reshape(shape)


def _all_to_all_dispatch(
    sorted_inputs: Tensor,
    tokens_per_expert: Tensor,
    expert_parallel_capacity: float,
    has_track_axis: bool = False,
):
    """Sends each rank's expert-sorted rows to the ranks owning their experts (in shard_map).

    Runs inside `shard_map` over the "expert" axis (P ranks, E experts, E / P local ones per
    rank, consecutive). A rank receives the rows of its experts from ranks 0..P-1 in that order,
    keeps the first int(T * expert_parallel_capacity) of them (T its own row count) and drops the
    rest, then sorts the kept rows by local expert (stable). Dense implementation (all-gathers,
    which XLA:CPU supports; AXLearn uses ragged all-to-all).

    Args:
        sorted_inputs: [T, ...] this rank's rows, sorted by expert.
        tokens_per_expert: Int [E] this rank's rows per expert.
        expert_parallel_capacity: Receive buffer size relative to T.
        has_track_axis: Unsupported (AXLearn's multi-track layout).

    Returns:
        (local rows [cap, ...] sorted by local expert, zero-padded; local rows per expert
        [E / P]; (number of dropped rows,); residuals for `_all_to_all_combine`).
    """
    if has_track_axis:
        raise NotImplementedError("_all_to_all_dispatch: has_track_axis=True is not supported")
    num_ranks = jax.lax.psum(1, "expert")
    rank = jax.lax.axis_index("expert")
    num_rows = sorted_inputs.shape[0]
    num_experts = tokens_per_expert.shape[0]
    local = num_experts // num_ranks
    capacity = int(num_rows * expert_parallel_capacity)
    all_counts = jax.lax.all_gather(tokens_per_expert, "expert")  # [P, E].
    all_inputs = jax.lax.all_gather(sorted_inputs, "expert")  # [P, T, ...].
    ends = jnp.cumsum(all_counts, axis=1)  # [P, E].
    starts = ends - all_counts
    first = rank * local
    src_offset = jax.lax.dynamic_index_in_dim(starts, first, axis=1, keepdims=False)  # [P].
    src_length = jnp.sum(
        jax.lax.dynamic_slice_in_dim(all_counts, first, local, axis=1), axis=1
    )  # [P].
    buf_start = jnp.cumsum(src_length) - src_length  # [P].
    total = jnp.sum(src_length)
    slot = jnp.arange(capacity)
    source = jnp.clip(jnp.searchsorted(buf_start, slot, side="right") - 1, 0, num_ranks - 1)
    row = src_offset[source] + slot - buf_start[source]
    valid = slot < jnp.minimum(total, capacity)
    row = jnp.where(valid, row, 0)
    expert = jnp.sum(row[:, None] >= ends[source], axis=1)  # Global expert of each slot.
    local_expert = jnp.where(valid, expert - first, local)
    order = jnp.argsort(local_expert, stable=True)
    values = all_inputs[source, row]
    values = jnp.where(valid.reshape((-1,) + (1,) * (values.ndim - 1)), values, 0)
    local_inputs = values[order]
    local_counts = jnp.bincount(local_expert, length=local + 1)[:local].astype(jnp.int32)
    dropped = jnp.maximum(total - capacity, 0)
    residuals = (source[order], row[order], valid[order], num_rows)
    return local_inputs, local_counts, (dropped,), residuals


def _all_to_all_combine(sorted_output: Tensor, residuals: Any, has_track_axis: bool = False):
    """Returns the rows processed by `_all_to_all_dispatch`'s receivers to their senders.

    Args:
        sorted_output: [cap, ...] this rank's processed rows (in dispatch's local order).
        residuals: From `_all_to_all_dispatch`.
        has_track_axis: Unsupported.

    Returns:
        [T, ...] this rank's rows in their original (expert-sorted) order; dropped rows are 0.
    """
    if has_track_axis:
        raise NotImplementedError("_all_to_all_combine: has_track_axis=True is not supported")
    source, row, valid, num_rows = residuals
    rank = jax.lax.axis_index("expert")
    all_out = jax.lax.all_gather(sorted_output, "expert")  # [P, cap, ...].
    all_source = jax.lax.all_gather(source, "expert")
    all_row = jax.lax.all_gather(row, "expert")
    all_valid = jax.lax.all_gather(valid, "expert")
    mine = all_valid & (all_source == rank)
    target = jnp.where(mine, all_row, num_rows).reshape(-1)
    flat = all_out.reshape((-1,) + all_out.shape[2:])
    result = jnp.zeros((num_rows,) + flat.shape[1:], flat.dtype)
    return result.at[target].add(flat, mode="drop")


class ApproximateTokenDropFreeMoE(TransformerFeedForwardDropFreeMoE):
    """Drop-free MoE with expert parallelism over the "expert" mesh axis (see module doc).

    Routing runs under GSPMD; then, in `shard_map` over the mesh, each rank of the "expert" axis
    takes 1/P of the tokens (replicated over the other axes), sorts its (token, expert) pairs,
    sends them to the ranks owning the experts (`_all_to_all_dispatch`; a receiver keeps at most
    `expert_parallel_capacity` x its own pair count, dropping the rest: "approximately" drop
    free), runs its E / P local experts and sends the outputs back (`_all_to_all_combine`).
    Summary "dropped_tokens": pairs dropped over all ranks. Without a mesh, or with a 1-way
    expert axis, it equals `TransformerFeedForwardDropFreeMoE`.
    """

    @config_class
    class Config(TransformerFeedForwardDropFreeMoE.Config):
        """Configures ApproximateTokenDropFreeMoE."""

        # Receive buffer per rank relative to its own (token, expert) pair count.
        expert_parallel_capacity: float = 1.25

    def _dispatch_and_combine(self, x: Tensor) -> Tensor:
        mesh = current_mesh()
        if mesh is None or mesh.shape.get("expert", 1) == 1:
            return super()._dispatch_and_combine(x)
        cfg = self.config
        ranks = mesh.shape["expert"]
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        if cfg.num_experts % ranks or tokens.shape[0] % ranks:
            raise ValueError(
                f"{self.path()}: num_experts={cfg.num_experts} and the {tokens.shape[0]} tokens "
                f"must be multiples of the {ranks}-way expert axis"
            )
        logits = jnp.einsum("tm,me->te", tokens, self.parameters["gate_weight"])
        logits = logits.reshape(shape[:-1] + (cfg.num_experts,))
        if logits.ndim == 2:
            logits = logits[None]
        gating = self.gating(logits, seq_load_balance_loss_weight=cfg.seq_load_balance_loss_weight)
        aux_loss = self._aux_loss(gating.load_balance_loss, gating.router_z_loss)
        if cfg.seq_load_balance_loss_weight and gating.seq_load_balance_loss is not None:
            aux_loss = aux_loss + cfg.seq_load_balance_loss_weight * gating.seq_load_balance_loss
        self.add_module_output("aux_loss", aux_loss)
        k = gating.gate_assignment.shape[-1]
        assignment = gating.gate_assignment.reshape(-1, k)
        gates = gating.expert_weights.reshape(-1, k)
        names = self._wi_names() + ["wo_weight"]
        weights = {name: self.parameters[name] for name in names}

        def local(tokens, assignment, gates, weights):
            experts = assignment.reshape(-1)
            order = jnp.argsort(experts, stable=True)
            inverse = jnp.argsort(order)
            sorted_inputs = _custom_gather(tokens, order // k, inverse)
            counts = jnp.bincount(experts, length=cfg.num_experts).astype(jnp.int32)
            received, local_counts, (dropped,), residuals = _all_to_all_dispatch(
                sorted_inputs, counts, cfg.expert_parallel_capacity
            )
            out = self._experts(received, local_counts, weights)
            out = _all_to_all_combine(out, residuals)[inverse].reshape(tokens.shape[0], k, -1)
            combined = jnp.einsum("tkm,tk->tm", out, gates.astype(out.dtype))
            return combined, dropped[None]

        spec = PartitionSpec("expert")
        combined, dropped = jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(spec, spec, spec, {name: spec for name in names}),
            out_specs=(spec, spec),
            check_vma=False,
        )(tokens, assignment, gates, weights)
        self.add_summary("dropped_tokens", jnp.sum(dropped))
        return combined.reshape(shape)


__all__ = [
    "ApproximateTokenDropFreeMoE",
    "GMMBackend",
    "TransformerFeedForwardDropFreeMoE",
    "_all_to_all_combine",
    "_all_to_all_dispatch",
    "_custom_gather",
]
