"""Tests axlearn/common/flash_attention/remat.py."""

import jax
import jax.numpy as jnp
import pytest
from jax._src.ad_checkpoint import saved_residuals
from jax.ad_checkpoint import checkpoint_name

from axlearn.common.flash_attention.remat import save_or_offload_flash_attention_policy


def _f(x):
    q = checkpoint_name(jnp.sin(x), "attention.q_proj")
    context = checkpoint_name(jnp.sin(q), "attention.context")
    return jnp.sum(jnp.sin(context))


def test_saves_only_the_attention_context():
    policy = save_or_offload_flash_attention_policy()
    residuals = [d for _, d in saved_residuals(jax.checkpoint(_f, policy=policy), jnp.ones(3))]
    named = [d.split("'")[1] for d in residuals if d.startswith("named")]
    assert named == ["attention.context"]
    assert policy.__name__ == "policy"  # Dumps as 'axlearn.common.flash_attention.remat.policy'.


def test_offload_decision_and_bad_type():
    from jax._src.ad_checkpoint import name_p
    from jax._src.interpreters import partial_eval as pe

    policy = save_or_offload_flash_attention_policy("offload")
    assert policy(name_p, name="x.context") == pe.Offloadable(src="device", dst="pinned_host")
    assert policy(name_p, name="x.q_proj") == pe.Recompute
    with pytest.raises(ValueError, match="remat_type must be None, 'save' or 'offload'"):
        save_or_offload_flash_attention_policy("keep")
