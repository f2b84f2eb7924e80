"""The difference between two config trees, by config path: what `axlearn config diff` prints.

Works on config dumps (`ConfigBase.debug_string()`: one `path: value` line per leaf, keys sorted,
the format of the golden files in `experiments/testdata/`), so two live configs, two dump files, or
one of each compare the same way.

Example:

    diff = diff_config_dumps(cfg_a.debug_string(), cfg_b.debug_string())
    if diff:
        print(format_config_diff(diff, label_a="gpt-tiny", label_b="honeycrisp-3B"))
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict


class ConfigDumpFormatError(ValueError):
    """A line of a config dump is not `path: value`."""


@dataclasses.dataclass(frozen=True)
class ConfigDiff:
    """Paths that differ between config A and config B.

    Attributes:
        changed: (path, value in A, value in B) for paths in both with different values.
        added: (path, value in B) for paths only in B.
        removed: (path, value in A) for paths only in A.
    """

    changed: list[tuple[str, str, str]]
    added: list[tuple[str, str]]
    removed: list[tuple[str, str]]

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)

    def to_dict(self) -> dict:
        """Returns a JSON-ready dict."""
        return {
            "changed": [{"path": p, "a": a, "b": b} for p, a, b in self.changed],
            "added": [{"path": p, "b": b} for p, b in self.added],
            "removed": [{"path": p, "a": a} for p, a in self.removed],
        }


def parse_config_dump(text: str, *, source: str = "<dump>", strict: bool = True) -> dict[str, str]:
    """Parses a config dump into {path: value text}: the one parser of config dumps (config
    diffs, the launcher's check of a run's dump, the W&B config).

    Args:
        text: The dump, one `path: value` line per leaf (blank lines are ignored).
        source: Where the text came from, for error messages.
        strict: If False, lines that are not `path: value` (e.g. the continuation of a value
            whose repr spans lines) are skipped and a repeated path keeps its last value.

    Returns:
        The leaves, in file order.

    Raises:
        ConfigDumpFormatError: If `strict` and a line is not `path: value`, or a path repeats.
    """
    leaves: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        path, sep, value = line.partition(": ")
        if not strict:
            if sep:
                leaves[path] = value
            continue
        if not sep or not path or " " in path:
            raise ConfigDumpFormatError(
                f"{source}:{lineno}: not a config dump line (expected 'path: value'): {line!r}"
            )
        if path in leaves:
            raise ConfigDumpFormatError(f"{source}:{lineno}: path {path!r} appears twice")
        leaves[path] = value
    return leaves


def diff_config_dumps(
    dump_a: str, dump_b: str, *, source_a: str = "A", source_b: str = "B"
) -> ConfigDiff:
    """Returns the paths that differ between two config dumps.

    Args:
        dump_a: The first dump (the baseline).
        dump_b: The second dump.
        source_a: Name of the first dump, for parse errors.
        source_b: Name of the second dump, for parse errors.

    Returns:
        The `ConfigDiff`, each list sorted by path.
    """
    a = parse_config_dump(dump_a, source=source_a)
    b = parse_config_dump(dump_b, source=source_b)
    changed = [(p, a[p], b[p]) for p in sorted(a.keys() & b.keys()) if a[p] != b[p]]
    added = [(p, b[p]) for p in sorted(b.keys() - a.keys())]
    removed = [(p, a[p]) for p in sorted(a.keys() - b.keys())]
    return ConfigDiff(changed=changed, added=added, removed=removed)


def subtree_of(path: str, depth: int = 2) -> str:
    """Returns the first `depth` components of a config path (list indices stay attached).

    Args:
        path: E.g. "model.decoder.transformer.num_layers" or "mesh_rules[0][1]".
        depth: Number of dotted components to keep.

    Returns:
        E.g. "model.decoder"; a path with fewer components is its own subtree.
    """
    parts = re.split(r"\.(?![^\[]*\])", path)
    if len(parts) <= depth:
        if len(parts) == 1:
            base = parts[0].split("[", 1)[0]
            return base if base != parts[0] else "(top level)"
        return ".".join(parts[:-1])
    return ".".join(parts[:depth])


def format_config_diff(
    diff: ConfigDiff, *, label_a: str = "A", label_b: str = "B", depth: int = 2
) -> str:
    """Formats a diff for people: grouped by subtree, changed values as `a -> b`.

    Args:
        diff: The diff.
        label_a: Name of config A (e.g. its config name).
        label_b: Name of config B.
        depth: Path components that name a group.

    Returns:
        The text (empty when the configs are equal).
    """
    if not diff:
        return ""
    groups: dict[str, list[str]] = defaultdict(list)
    for path, va, vb in diff.changed:
        groups[subtree_of(path, depth)].append(f"  ~ {path}: {va} -> {vb}")
    for path, vb in diff.added:
        groups[subtree_of(path, depth)].append(f"  + {path}: {vb}")
    for path, va in diff.removed:
        groups[subtree_of(path, depth)].append(f"  - {path}: {va}")
    lines = [
        f"--- {label_a}",
        f"+++ {label_b}",
        f"{len(diff.changed)} changed (~), {len(diff.added)} only in {label_b} (+), "
        f"{len(diff.removed)} only in {label_a} (-)",
    ]
    for group in sorted(groups):
        lines.append("")
        lines.append(f"[{group}]")
        lines.extend(sorted(groups[group], key=lambda s: s[4:]))
    return "\n".join(lines)
