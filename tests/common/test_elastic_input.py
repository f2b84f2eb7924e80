"""Tests ElasticDatasetIterator."""

import pytest

from axlearn.common.elastic_input import ElasticDatasetIterator


def test_elastic_iterator():
    primary, elastic = iter(range(0, 10)), iter(range(30, 40))
    it = ElasticDatasetIterator(
        primary_iterator=primary,
        elastic_iterator=elastic,
        elastic_process_ids=[6, 7],
        is_primary_for_checkpoint=True,
    )
    assert [next(it) for _ in range(2)] == [(0, 30), (1, 31)]
    assert it.savables(0) == {0: primary, 6: elastic, 7: elastic}
    plain = ElasticDatasetIterator(
        primary_iterator=iter([5]),
        elastic_iterator=None,
        elastic_process_ids=[],
        is_primary_for_checkpoint=False,
    )
    assert next(plain) == 5 and list(plain.savables(3)) == [3]
    with pytest.raises(ValueError, match="needs an elastic_iterator"):
        ElasticDatasetIterator(
            primary_iterator=iter([]),
            elastic_iterator=None,
            elastic_process_ids=[1],
            is_primary_for_checkpoint=True,
        )
