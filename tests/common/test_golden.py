"""Tests of axlearn.common.golden.load_golden on a hand-written .npz file."""

import numpy as np
import pytest

from axlearn.common.golden import golden_path, load_golden


def test_load_golden(tmp_path):
    weight = np.arange(6.0).reshape(2, 3)
    np.savez(
        golden_path("pkg.mod_test", testdata_dir=str(tmp_path)),
        **{
            "test_a/params/weight": weight,
            "test_a/inputs/x": np.ones(3),
            "test_ab/outputs/ref": np.zeros(1),
        },
    )
    tree = load_golden("pkg.mod_test", "test_a", testdata_dir=str(tmp_path))
    assert sorted(tree) == ["inputs", "params"]
    np.testing.assert_array_equal(tree["params"]["weight"], weight)
    with pytest.raises(KeyError, match="no golden entries for test 'test_b'"):
        load_golden("pkg.mod_test", "test_b", testdata_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="No golden data for other_test"):
        load_golden("other_test", "test_a", testdata_dir=str(tmp_path))
