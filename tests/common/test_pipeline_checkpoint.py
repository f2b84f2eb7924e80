"""Tests of axlearn.common.pipeline_checkpoint: layout conversion of parameter/state trees.

The trainer-level conversion (`convert_trainer_checkpoint`, resume in the other layout) is tested
in tests/common/test_pipeline.py with the pipelined trainer runs.
"""

import numpy as np
import optax
import pytest

from axlearn.common.pipeline_checkpoint import (
    convert_tree,
    pipelined_to_repeated,
    repeated_to_pipelined,
)


def _repeated(num_layers=8):
    w = np.arange(num_layers * 3 * 2, dtype=np.float32).reshape(num_layers, 3, 2)
    b = np.arange(num_layers, dtype=np.float32) * 10
    return dict(decoder=dict(transformer=dict(repeat=dict(layer=dict(w=w, b=b))), emb=np.ones(4)))


@pytest.mark.parametrize("s,v", [(4, 1), (2, 2), (4, 2), (2, 1)])
def test_repeated_to_pipelined_places_layers_by_chunk(s, v):
    tree = _repeated()
    piped = repeated_to_pipelined(tree, num_stages=s, num_virtual_stages=v)
    k_per_chunk = 8 // (s * v)
    stage = piped["decoder"]["transformer"]["pipeline"]["layer"]
    assert sorted(stage) == [f"layer{k}" for k in range(k_per_chunk)]
    np.testing.assert_array_equal(piped["decoder"]["emb"], tree["decoder"]["emb"])
    # Row s*V + v of layer{k} is layer (v*S + s) * K + k of the repeated stack (by hand).
    for stage_idx in range(s):
        for virtual in range(v):
            for k in range(k_per_chunk):
                layer = (virtual * s + stage_idx) * k_per_chunk + k
                row = stage_idx * v + virtual
                np.testing.assert_array_equal(
                    stage[f"layer{k}"]["b"][row],
                    tree["decoder"]["transformer"]["repeat"]["layer"]["b"][layer],
                )
                np.testing.assert_array_equal(
                    stage[f"layer{k}"]["w"][row],
                    tree["decoder"]["transformer"]["repeat"]["layer"]["w"][layer],
                )
    back = pipelined_to_repeated(piped, num_stages=s, num_virtual_stages=v)
    np.testing.assert_array_equal(
        back["decoder"]["transformer"]["repeat"]["layer"]["w"],
        tree["decoder"]["transformer"]["repeat"]["layer"]["w"],
    )


def test_converts_inside_optimizer_states_and_between_pipelined_layouts():
    tree = _repeated()
    state = (optax.ScaleByAdamState(count=np.int32(3), mu=tree, nu=tree), optax.EmptyState())
    piped = convert_tree(state, src=None, dst=(4, 2))
    assert "pipeline" in piped[0].mu["decoder"]["transformer"]
    assert isinstance(piped[0], optax.ScaleByAdamState) and int(piped[0].count) == 3
    other = convert_tree(piped, src=(4, 2), dst=(2, 2))
    back = convert_tree(other, src=(2, 2), dst=None)
    np.testing.assert_array_equal(
        back[0].nu["decoder"]["transformer"]["repeat"]["layer"]["w"],
        tree["decoder"]["transformer"]["repeat"]["layer"]["w"],
    )


def test_bad_layouts_name_values():
    with pytest.raises(ValueError, match=r"num_layers=8 is not divisible by num_stages=3"):
        repeated_to_pipelined(_repeated(), num_stages=3)
    piped = repeated_to_pipelined(_repeated(), num_stages=4)
    with pytest.raises(ValueError, match=r"leading size 4, expected num_stages=4 x "):
        pipelined_to_repeated(piped, num_stages=4, num_virtual_stages=2)
