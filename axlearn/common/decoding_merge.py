"""Prefix merging for beam search (AXLearn's `decoding.PrefixMerger`; re-exported there).

Beam search may keep several live beams that are "the same" hypothesis under some equivalence
(e.g. different tokenizations of one string). A `PrefixMerger` tracks a state per beam, updated
with every token fed to the model, and computes a *merge matrix* M of shape
[batch, num_decodes, num_decodes] with M[b, to, from] = 1 iff beam `from` is merged into beam
`to`. A valid matrix merges every beam into exactly one beam (each column sums to 1), merges only
into a beam that stays itself (M[b, to, from] = 1 implies M[b, to, to] = 1) and only into a
beam ranked no lower (to <= from). Merging adds the probabilities: the receiving beam's
log-probability becomes the logsumexp of the merged beams', the others' become "-inf".
"""

import jax
import jax.numpy as jnp

from axlearn.common.utils import NestedTensor, Tensor

# "Effectively -inf" (as decoding.NEG_INF).
_NEG_INF = -1.0e7


class PrefixMerger:
    """Computes the merge matrix of the live beams (see the module docstring).

    Subclasses implement `init_state`, `update` and `compute`. State leaves are scalars or have
    leading dims [batch_size, num_decodes] (beam search reorders them with the beams).
    """

    def init_state(self, *, tokens: Tensor) -> NestedTensor:
        """The initial state.

        Args:
            tokens: Int [batch_size, num_decodes, max_decode_len]: the initial live sequences
                (the prompts padded to max_decode_len).

        Returns:
            The state.
        """
        raise NotImplementedError(type(self))

    def compute(self, state: NestedTensor) -> Tensor:
        """The merge matrix of `state`.

        Args:
            state: As returned by `init_state` or `update`.

        Returns:
            A 0/1 tensor [batch_size, num_decodes, num_decodes] (see the module docstring).
        """
        raise NotImplementedError(type(self))

    def update(self, *, tokens: Tensor, state: NestedTensor) -> NestedTensor:
        """The state after appending `tokens` to the beams.

        Args:
            tokens: Int [batch_size, num_decodes]: the token fed to the model for each beam.
            state: As returned by `init_state` or `update`.

        Returns:
            The new state, of the same structure and shapes as `state`.
        """
        raise NotImplementedError(type(self))


def compute_merge_matrix_by_prefix_ids(prefix_ids: Tensor) -> Tensor:
    """The merge matrix that merges every beam into the first beam with equal prefix ids.

    Args:
        prefix_ids: Int [batch_size, num_decodes, ...]: beams i and j are equivalent iff
            prefix_ids[b, i] == prefix_ids[b, j] (all trailing entries).

    Returns:
        Int32 [batch_size, num_decodes, num_decodes]: M[b, to, from] = 1 iff `to` is the
        lowest index whose prefix ids equal those of `from`.
    """
    same = prefix_ids[:, :, None] == prefix_ids[:, None, :]
    if same.ndim > 3:
        same = same.reshape(same.shape[:3] + (-1,)).all(axis=-1)
    # The first "to" (along axis 1) equivalent to each "from"; same[b, j, j] always holds.
    first = jnp.argmax(same, axis=1)  # [batch, from].
    num_decodes = prefix_ids.shape[1]
    return (jnp.arange(num_decodes)[None, :, None] == first[:, None, :]).astype(jnp.int32)


def _merge_prefixes(merge_matrix: Tensor, *, log_probs: Tensor) -> Tensor:
    """Merges beam log-probabilities by `merge_matrix`.

    Args:
        merge_matrix: 0/1 [batch_size, num_decodes, num_decodes] (see the module docstring).
        log_probs: Float [batch_size, num_decodes].

    Returns:
        out[b, to] = logsumexp(log_probs[b, from] for all `from` with merge_matrix[b, to, from]);
        about NEG_INF for a beam merged into another.
    """
    selected = jnp.where(merge_matrix.astype(bool), log_probs[:, None, :], _NEG_INF)
    return jax.nn.logsumexp(selected, axis=-1).astype(log_probs.dtype)
