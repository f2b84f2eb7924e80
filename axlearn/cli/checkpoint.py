"""`axlearn checkpoint ...`: inspect checkpoint directories without a model.

- `axlearn checkpoint list DIR` prints one line per step directory: step, committed or not,
  its size on disk (every file: chunks with their padding, `.zarray`s, the index), number of
  leaves, and (in a trainer dir's `checkpoints/`) the run record the step was
  made with (`run_records/<n>`).
- `axlearn checkpoint verify DIR [--step N]` reads every array chunk and bytes file and checks it
  against the checksums in the index; DIR is a checkpointer directory (every step is checked) or
  one `step_%08d` directory. It checks the metadata too: the index against the files it
  describes, every `.zarray` against the index. Exits 1 if a committed checkpoint (one whose
  `index` exists, readable or not) fails verification, or if a directory has lost its index
  while every chunk is present (restore sets such a directory aside). Its size is the bytes of
  array data checked (without padding or metadata files, so less than `list`'s size on disk).
  While a live run holds the trainer dir's `run.lock`, its newest uncommitted step is reported
  as a save in progress, not a failure.
- `axlearn checkpoint select DIR --step N` verifies step N and sets every newer step directory
  aside (renamed `step_%08d.superseded-<time>`, nothing deleted), so that the next run resumes
  from step N; the same as the trainer's `--restore_step=N`.
- `axlearn checkpoint convert SRC DST` rewrites one step directory SRC in the other layout, as
  the same step under the checkpointer directory DST (never over an existing step), then reads
  it back and checks that every value equals the source's. The direction follows SRC's layout
  (`--to` states it): a step of AXLearn's layout becomes one of this checkpointer's (with
  CRC-32s, verified); a committed step of ours becomes one of AXLearn's (zstd zarr v2 arrays,
  its list `index` written last), which AXLearn's own `Checkpointer` restores. A threefry
  `prng_key` is written as the rbg key AXLearn's launcher runs with (`--prng_key=as_saved`
  keeps it).
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Optional

from axlearn.cli.config_commands import CommandError


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `checkpoint` command group and its subcommands.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    group = groups.add_parser("checkpoint", help="List and verify checkpoints.")
    commands = group.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    listing = commands.add_parser("list", help="List the step directories of a checkpoint dir.")
    listing.add_argument("dir", help="The checkpointer directory (holding step_%%08d dirs).")
    listing.set_defaults(func=list_command)
    verify = commands.add_parser(
        "verify", help="Check every array of every (or one) step against the index checksums."
    )
    verify.add_argument("dir", help="A checkpointer directory or one step_%%08d directory.")
    verify.add_argument("--step", type=int, default=None, help="Verify only this step.")
    verify.set_defaults(func=verify_command)
    select = commands.add_parser(
        "select", help="Make the next run resume from --step (newer steps are set aside)."
    )
    select.add_argument("dir", help="The checkpointer directory.")
    select.add_argument("--step", type=int, required=True, help="The step to resume from.")
    select.set_defaults(func=select_command)
    convert = commands.add_parser(
        "convert", help="Rewrite one step in the other layout (AXLearn's <-> ours), verified."
    )
    convert.add_argument("src", help="One step_%%08d directory (AXLearn's layout or ours).")
    convert.add_argument("dst", help="The checkpointer directory to write the step into.")
    convert.add_argument(
        "--to",
        choices=("ours", "axlearn"),
        default=None,
        help="The layout to write (default: the one SRC is not in).",
    )
    convert.add_argument(
        "--prng_key",
        choices=("rbg", "as_saved"),
        default="rbg",
        help="Writing AXLearn's layout: a threefry prng_key [a, b] as rbg [a, b, a, b], or as is.",
    )
    convert.set_defaults(func=convert_command)


def _format_size(num_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes} B"


def _no_steps(path: str) -> int:
    """Says that `path` holds no step directory, pointing to `checkpoints/` in a trainer dir.

    Returns:
        0 for an empty checkpoint dir; raises for a trainer dir (the user meant its checkpoints).

    Raises:
        CommandError: If `path` is a trainer dir (it has a `checkpoints/` subdirectory).
    """
    inner = os.path.join(path, "checkpoints")
    if os.path.isdir(inner):
        raise CommandError(
            f"{path} holds no step directories; it looks like a trainer dir: its checkpoints are "
            f"in {inner} (pass that directory)."
        )
    print(f"No step directories under {path}")
    return 0


def list_command(args: argparse.Namespace) -> int:
    """Prints one line per step directory of `args.dir`.

    Args:
        args: Parsed arguments with `dir`.

    Returns:
        0.

    Raises:
        CommandError: If `args.dir` is not a directory.
    """
    from axlearn.common import checkpointer  # pylint: disable=import-outside-toplevel

    if not os.path.isdir(args.dir):
        raise CommandError(f"{args.dir} is not a directory")
    infos = checkpointer.list_checkpoints(args.dir)
    aside = checkpointer.set_aside_dirs(args.dir)
    if not infos and not aside:
        return _no_steps(args.dir)
    from axlearn.common import run_record  # pylint: disable=import-outside-toplevel

    # In a trainer dir's checkpoints/: the run record each step was made with.
    trainer_dir = os.path.dirname(os.path.abspath(args.dir))
    has_records = bool(run_record.records(trainer_dir))
    for info in infos:
        status = "committed" if info.committed else "uncommitted"
        if info.error:
            status = f"corrupt index: {info.error}"
        leaves = "" if info.num_leaves is None else f"  {info.num_leaves} leaves"
        record = ""
        if has_records:
            record_dir = run_record.record_dir_for_step(trainer_dir, info.step)
            record = f"  record {os.path.relpath(record_dir, trainer_dir)}"
        print(
            f"step {info.step:>8}  {status:<11}  {_format_size(info.size_bytes):>10} on disk"
            f"{leaves}"
            f"{record}"
            f"{_layout_note(info.layout)}"
        )
    for path in aside:
        print(f"set aside (never restored or removed): {path}")
    return 0


def _layout_note(layout_name: Optional[str], *, verified: bool = False) -> str:
    """What `list`/`verify` print after a step of AXLearn's layout ('' for ours)."""
    if layout_name != "axlearn":
        return ""
    if verified:
        return (
            "  (AXLearn layout: no checksums; index checked against every .zarray, every chunk "
            "present and decodable)"
        )
    return "  (AXLearn layout, no checksums)"


def verify_command(args: argparse.Namespace) -> int:
    """Verifies the step directories of `args.dir` (or `args.dir` itself if it is one).

    Args:
        args: Parsed arguments with `dir` and `step`.

    Returns:
        0 if every committed checkpoint checked is intact, 1 otherwise.

    Raises:
        CommandError: If `args.dir` is not a directory or `--step` does not exist.
    """
    from axlearn.common import checkpointer  # pylint: disable=import-outside-toplevel

    if not os.path.isdir(args.dir):
        raise CommandError(f"{args.dir} is not a directory")
    try:
        dirs = [(checkpointer.parse_step_from_dir(args.dir), args.dir)]
    except ValueError:
        dirs = checkpointer.step_dirs(args.dir)
    if args.step is not None:
        dirs = [(s, d) for s, d in dirs if s == args.step]
        if not dirs:
            raise CommandError(f"No directory for step {args.step} under {args.dir}")
    if not dirs:
        return _no_steps(args.dir)
    failed = 0
    live = _live_run(args.dir)
    newest_committed = max(
        (
            s
            for s, d in checkpointer.step_dirs(_ckpt_root(args.dir))
            if checkpointer.is_committed(d)
        ),
        default=-1,
    )
    for step, path in dirs:
        result = checkpointer.verify_checkpoint(path)
        size = _format_size(result.num_bytes)
        if live and not os.path.isdir(path):
            print(f"step {step:>8}  removed while verifying (garbage collection of the live run)")
            continue
        if not result.committed and live and step > newest_committed:
            print(
                f"step {step:>8}  uncommitted  save in progress: a live run holds {live} (not a "
                "failure; verify it once its index is written)"
            )
            continue
        if not result.committed:
            if checkpointer.chunks_complete(path):
                failed += 1
                print(
                    f"step {step:>8}  uncommitted  FAILED  its index is missing but every chunk "
                    "of its arrays is present (the index was lost after the save): "
                    + _unindexed_advice(path, step)
                    + f"; the next run sets it aside as step_{step:08d}.unindexed-<time>, never "
                    "deleting it while keep_last_n would keep its step"
                )
                continue
            print(f"step {step:>8}  uncommitted  {result.errors[0] if result.errors else ''}")
            continue
        if result.ok:
            print(
                f"step {step:>8}  committed  OK  {result.num_leaves} leaves, "
                f"{result.num_chunks} chunks, {size} of array data"
                f"{_layout_note(result.layout, verified=True)}"
            )
            continue
        failed += 1
        print(f"step {step:>8}  committed  FAILED  {len(result.errors)} problem(s):")
        for error in result.errors:
            print(f"    {error}")
    if args.step is None and dirs and os.path.abspath(dirs[0][1]) != os.path.abspath(args.dir):
        for path in checkpointer.set_aside_dirs(args.dir):
            match = _UNINDEXED_RE.match(os.path.basename(path))
            if match:
                step = int(match.group(1))
                print(
                    f"set aside {os.path.basename(path)}: a save of step {step} whose index was "
                    "lost (it is kept while keep_last_n would keep its step, never restored "
                    "as is): " + _unindexed_advice(path, step)
                )
    return 1 if failed else 0


_UNINDEXED_RE = re.compile(r"^step_(\d{8})\.unindexed-")


def _unindexed_advice(path: str, step: int) -> str:
    """What an unindexed step directory is good for and how to restore it."""
    name = f"step_{step:08d}"
    return (
        "it cannot be restored without its index (the index holds the checksums and the "
        f"non-array leaves). To restore it, copy its index back (e.g. from a backup of {name}) as "
        f"{os.path.join(path, 'index')}, move the directory back to {name} if it was set aside, "
        f"check it with `axlearn checkpoint verify` and resume with --restore_step={step}; "
        "otherwise the run resumes from the newest committed step"
    )


def _ckpt_root(path: str) -> str:
    """The checkpointer directory of `path` (itself, or its parent for a step directory)."""
    from axlearn.common import checkpointer  # pylint: disable=import-outside-toplevel

    try:
        checkpointer.parse_step_from_dir(path)
    except ValueError:
        return path
    return os.path.dirname(os.path.abspath(path))


def _live_run(path: str) -> str:
    """The run lock of a live run training into `path`'s checkpoints, or "" if none.

    A trainer's checkpoints are `<trainer dir>/checkpoints`; its process 0 holds
    `<trainer dir>/run.lock` while it runs.
    """
    from axlearn.common import run_lock  # pylint: disable=import-outside-toplevel

    root = os.path.abspath(_ckpt_root(path))
    for directory in (os.path.dirname(root), root):
        if run_lock.held_by_a_live_run(directory):
            return os.path.join(directory, run_lock.LOCK_FILE)
    return ""


def select_command(args: argparse.Namespace) -> int:
    """Verifies step `args.step` and sets every newer step directory of `args.dir` aside.

    Args:
        args: Parsed arguments with `dir` and `step`.

    Returns:
        0 if the step is intact and newer steps were set aside, 1 if the step fails verification
        (then nothing is changed).

    Raises:
        CommandError: If `args.dir` is not a directory or has no directory for `--step`.
    """
    from axlearn.common import checkpointer  # pylint: disable=import-outside-toplevel

    if not os.path.isdir(args.dir):
        raise CommandError(f"{args.dir} is not a directory")
    dirs = dict(checkpointer.step_dirs(args.dir))
    if args.step not in dirs:
        raise CommandError(f"No directory for step {args.step} under {args.dir}")
    result = checkpointer.verify_checkpoint(dirs[args.step])
    if not result.ok:
        print(f"step {args.step} cannot be selected: it fails verification:")
        for error in result.errors or ["uncommitted"]:
            print(f"    {error}")
        return 1
    for path in checkpointer.supersede_newer(args.dir, args.step):
        print(f"set aside: {path}")
    print(f"The next run under {args.dir} resumes from step {args.step}.")
    return 0


def convert_command(args: argparse.Namespace) -> int:
    """Rewrites the step `args.src` into `args.dst` in the other layout, verified.

    Args:
        args: Parsed arguments with `src` (a step directory), `dst` (a checkpointer dir), `to`
            ("ours", "axlearn" or None: the layout SRC is not in) and `prng_key`.

    Returns:
        0 if the written step verifies and every value equals the source's, 1 otherwise.

    Raises:
        CommandError: If SRC is not a readable committed step, is already in the `--to` layout,
            or DST already holds that step.
    """
    # pylint: disable=import-outside-toplevel
    from axlearn.common.checkpointer import layout

    src = os.path.normpath(args.src)
    try:
        step = layout.parse_step_from_dir(src)
    except ValueError as e:
        raise CommandError(f"{e}; pass one step directory") from e
    try:
        index = layout.read_index_file(src)
    except layout.CheckpointIndexError as e:
        raise CommandError(str(e)) from e
    source = "axlearn" if index.get("layout") == "axlearn" else "ours"
    to = getattr(args, "to", None) or ("ours" if source == "axlearn" else "axlearn")
    if to == source:
        names = {"ours": "this checkpointer's", "axlearn": "AXLearn's"}
        raise CommandError(
            f"{src} is already in {names[source]} layout (--to {to}); nothing to convert"
        )
    dst_step = os.path.join(args.dst, layout.step_dir_name(step))
    if os.path.lexists(dst_step):
        raise CommandError(f"{dst_step} already exists; pass another DST or remove it")
    if to == "axlearn":
        return _convert_to_axlearn(src, args.dst, rbg=getattr(args, "prng_key", "rbg") == "rbg")
    return _convert_to_ours(src, args.dst, step=step, index=index, dst_step=dst_step)


def _convert_to_axlearn(src: str, dst: str, *, rbg: bool) -> int:
    """Writes our committed step `src` in AXLearn's layout under `dst` (read back, compared)."""
    from axlearn.common.checkpointer import (  # pylint: disable=import-outside-toplevel
        axlearn_layout_write,
    )

    try:
        result = axlearn_layout_write.convert_step_dir(src, dst, rbg_prng_key=rbg)
    except axlearn_layout_write.AXLearnWriteError as e:
        raise CommandError(str(e)) from e
    print(
        f"Converted {src} to {result.step_dir} (AXLearn layout): {result.num_arrays} arrays in "
        f"{result.num_chunks} zstd chunks ({_format_size(result.raw_bytes)} of array data in "
        f"{_format_size(result.chunk_file_bytes)} of chunk files), index written last; read back, "
        "every value equal to the source's."
    )
    return 0


def _convert_to_ours(src: str, dst: str, *, step: int, index: dict, dst_step: str) -> int:
    """Writes the AXLearn-layout step `src` in our layout under `dst` (verified, compared)."""
    # pylint: disable=import-outside-toplevel
    import numpy as np

    from axlearn.common import checkpointer
    from axlearn.common.checkpointer import layout, tensorstore_restore, verify

    def restore(step_dir: str, step_index: dict):
        restored, _ = tensorstore_restore.restore_state(
            ckpt_dir=step_dir,
            index=step_index,
            state=verify.read_state_spec(step_dir),
            budget_bytes=1 << 30,
            timeout_s=600.0,
        )
        return restored

    state = restore(src, index)
    ckptr = (
        checkpointer.Checkpointer.default_config()
        .set(name="convert", dir=dst, keep_last_n=10**6)
        .instantiate(parent=None)
    )
    try:
        ckptr.save(step=step, state=state)
        ckptr.wait_until_finished()
    finally:
        ckptr.stop()
    result = checkpointer.verify_checkpoint(dst_step)
    if not result.ok:
        print(f"{dst_step} was written but fails verification:")
        for error in result.errors:
            print(f"    {error}")
        return 1
    again = restore(dst_step, layout.read_index_file(dst_step))
    import jax

    differing = [
        "/".join(str(getattr(k, "key", k)) for k in path)
        for (path, a), b in zip(
            jax.tree_util.tree_flatten_with_path(state)[0], jax.tree_util.tree_leaves(again)
        )
        if not np.array_equal(np.asarray(a), np.asarray(b))
    ]
    if differing:
        print(f"{dst_step}: values differ from {src} at {differing}")
        return 1
    print(
        f"Converted {src} (AXLearn layout) to {dst_step}: verified, {result.num_leaves} leaves, "
        f"{result.num_chunks} chunks with CRC-32s, every value equal to the source's."
    )
    return 0
