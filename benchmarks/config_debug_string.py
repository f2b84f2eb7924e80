"""Benchmark: `debug_string()` of a config tree with 5,000 leaves (target: under 0.2 s).

Prints JSON: the leaf count, each run's seconds, the median, and the median's ratio to the target.

Usage: python benchmarks/config_debug_string.py [--leaves 5000] [--repeats 5]
"""

import argparse
import json
import statistics
import time

from axlearn.common.config import Configurable, config_class, config_for_function


class Leaf(Configurable):
    """A component with ten scalar fields (its klass makes eleven leaves)."""

    @config_class
    class Config(Configurable.Config):
        a: int = 1  # An int.
        b: float = 0.5  # A float.
        c: str = "x"  # A string.
        d: tuple = (1, 2)  # A tuple (two leaves).
        e: bool = True  # A bool.
        f: list = ["p", "q"]  # A list (two leaves).
        g: dict = {"k": 3}  # A dict (one leaf).


class Node(Configurable):
    """A component holding a list of children."""

    @config_class
    class Config(Configurable.Config):
        children: list = []  # Child configs.
        schedule: object = None  # A function config.


def _schedule(peak: float, steps: int):
    return peak, steps


def build_tree(num_leaves: int) -> Node.Config:
    """Returns a two-level tree with at least `num_leaves` leaves."""
    per_leaf = len(Leaf.default_config().to_flat_dict())
    groups = []
    count = 0
    while count < num_leaves:
        children = [Leaf.default_config().set(a=i) for i in range(10)]
        group = Node.default_config().set(
            children=children,
            schedule=config_for_function(_schedule).set(peak=0.1, steps=len(groups)),
        )
        groups.append(group)
        count += 10 * per_leaf + 4
    return Node.default_config().set(children=groups)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--leaves", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tree = build_tree(args.leaves)
    leaves = len(tree.debug_string().splitlines())
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        tree.debug_string()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(
        json.dumps(
            {
                "benchmark": "config_debug_string",
                "leaves": leaves,
                "seconds": [round(t, 4) for t in times],
                "median_s": round(median, 4),
                "target_s": 0.2,
                "median_over_target": round(median / 0.2, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
