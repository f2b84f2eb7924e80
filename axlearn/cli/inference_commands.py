"""`axlearn eval` and `axlearn generate`: use a trained run's checkpoint without training.

- `axlearn eval --trainer_dir=DIR [--step N] [--evaler NAME ...]` runs the experiment's evalers on
  the parameters of a checkpoint (the latest committed one, or step N), writes their summaries
  under `DIR/summaries/eval_only/<evaler>` and prints them, one `name/metric value` line each.
- `axlearn generate --trainer_dir=DIR --prompt="..." [--prompt_file F] [--step N]
  [--max_new_tokens 64] [--temperature 0.8] [--top_k K] [--top_p P] [--num_beams B]
  [--length_penalty A] [--seed 0]` tokenizes the prompts with the experiment's vocabulary and
  prints each continuation; with one prompt and sampling on a terminal, tokens are printed as
  they are generated. The same seed gives the same text.

The run's config is rebuilt from `DIR/launch_trainer_flags` and checked against its
`trainer_config` dump; see `axlearn.common.inference.InferenceRunner`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from axlearn.cli.config_commands import CommandError
from axlearn.common.accelerator_probe import quiet_accelerator_probes

# TensorFlow (imported by the input pipelines) logs at start-up unless told not to.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `eval` and `generate` commands.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    evaluate = groups.add_parser(
        "eval", help="Run a trained run's evalers on a checkpoint (trains nothing)."
    )
    _add_common_flags(evaluate)
    evaluate.add_argument(
        "--evaler",
        action="append",
        default=None,
        help="Run only this evaler (repeatable); default: all of the experiment's.",
    )
    evaluate.set_defaults(func=eval_command)

    generate = groups.add_parser("generate", help="Generate text from a trained run's checkpoint.")
    _add_common_flags(generate)
    generate.add_argument("--prompt", action="append", default=None, help="A prompt (repeatable).")
    generate.add_argument(
        "--prompt_file", default=None, help="A file of prompts, one per line (blank lines skipped)."
    )
    generate.add_argument("--max_new_tokens", type=int, default=64, help="Tokens to generate.")
    generate.add_argument(
        "--temperature", type=float, default=0.8, help="Sampling temperature; 0 is greedy."
    )
    generate.add_argument("--top_k", type=int, default=None, help="Sample among the top k tokens.")
    generate.add_argument(
        "--top_p", type=float, default=None, help="Sample from the nucleus of probability p."
    )
    generate.add_argument(
        "--num_beams", type=int, default=None, help="Beam search with this many beams."
    )
    generate.add_argument(
        "--length_penalty",
        type=float,
        default=0.0,
        help="Beam search: scores are divided by ((5 + length) / 6) ** this.",
    )
    generate.add_argument("--seed", type=int, default=0, help="The sampling seed.")
    generate.add_argument(
        "--no_stream", action="store_true", help="Print each continuation only when complete."
    )
    generate.set_defaults(func=generate_command)


def _add_common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trainer_dir", required=True, help="The trained run's trainer dir.")
    parser.add_argument(
        "--step", type=int, default=None, help="The checkpoint step; default: the latest."
    )
    parser.add_argument(
        "--config_override",
        action="append",
        default=[],
        help="PATH=VALUE override of the run's trainer config (repeatable).",
    )
    parser.add_argument(
        "--module",
        default=None,
        help="The run's experiment module as it imports here, needed when it is not one of "
        "axlearn's (a module named only by the run's record is never imported).",
    )


def _runner(args: argparse.Namespace, *, evalers=None):
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.checkpointer import CheckpointCorruptionError  # pylint: disable=C0415
    from axlearn.common.config.override import ConfigOverrideError
    from axlearn.common.inference import InferenceRunner  # pylint: disable=import-outside-toplevel
    from axlearn.common.launch_trainer import TrainerDirError  # pylint: disable=C0415

    if not os.path.isdir(args.trainer_dir):
        raise CommandError(f"--trainer_dir {args.trainer_dir} is not a directory")
    try:
        runner = InferenceRunner.from_trainer_dir(
            args.trainer_dir,
            config_overrides=args.config_override,
            evalers=evalers,
            step=args.step,
            module=args.module,
        )
        runner.restore(args.step)
    except (TrainerDirError, ConfigOverrideError, ValueError, CheckpointCorruptionError) as e:
        raise CommandError(str(e)) from e
    return runner


def _scalar(value: Any) -> Any:
    mean = getattr(value, "mean", value)
    try:
        return float(mean)
    except (TypeError, ValueError):
        return None


def eval_command(args: argparse.Namespace) -> int:
    """Runs the evalers of the run in `--trainer_dir` on a checkpoint and prints the metrics.

    Args:
        args: Parsed arguments (see `add_parser`).

    Returns:
        0 on success.

    Raises:
        CommandError: If the run, the checkpoint or an evaler cannot be found.
    """
    quiet_accelerator_probes()  # Before JAX or TensorFlow start (no E-lines on CPU).
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.utils import flatten_items

    runner = _runner(args, evalers=args.evaler)
    if not runner.evaler_names:
        raise CommandError(f"The experiment of {args.trainer_dir} has no evalers.")
    print(f"Evaluating step {runner.step} of {args.trainer_dir}", flush=True)

    def report(name: str, summaries: dict[str, Any]) -> None:
        is_leaf = lambda x: hasattr(x, "mean") and hasattr(x, "weight")  # noqa: E731
        for path, value in flatten_items(summaries, is_leaf=is_leaf):
            number = _scalar(value)
            if number is not None:
                print(f"{name}/{path} {number:.9g}", flush=True)

    runner.run_evalers(on_result=report)
    out_dir = os.path.join(args.trainer_dir, "summaries", "eval_only")
    print(f"Summaries written under {out_dir}", flush=True)
    return 0


def generate_command(args: argparse.Namespace) -> int:
    """Generates continuations of the prompts with the run's model; see the module docstring.

    Args:
        args: Parsed arguments (see `add_parser`).

    Returns:
        0 on success.

    Raises:
        CommandError: On a bad flag value, a missing run or checkpoint, or no prompt.
    """
    quiet_accelerator_probes()  # Before JAX or TensorFlow start (no E-lines on CPU).
    prompts = list(args.prompt or [])
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise CommandError("Give at least one --prompt or a --prompt_file.")
    if args.max_new_tokens < 1:
        raise CommandError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise CommandError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise CommandError(f"--top_k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise CommandError(f"--top_p must be in (0, 1], got {args.top_p}")
    if args.num_beams is not None and args.num_beams < 1:
        raise CommandError(f"--num_beams must be >= 1, got {args.num_beams}")
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.inference import TextGenerator

    runner = _runner(args, evalers=[])
    try:
        generator = TextGenerator.from_runner(runner)
    except ValueError as e:
        raise CommandError(str(e)) from e
    stream = (
        not args.no_stream and args.num_beams is None and len(prompts) == 1 and sys.stdout.isatty()
    )
    try:
        _generate_all(args, generator, prompts, stream=stream)
    except ValueError as e:  # A request the model cannot serve (e.g. beyond its context).
        raise CommandError(f"--{e}" if str(e).startswith("max_new_tokens=") else str(e)) from e
    return 0


def _generate_all(args: argparse.Namespace, generator: Any, prompts: list, *, stream: bool):
    """Generates and prints the continuation of each prompt (see `generate_command`)."""
    for i, prompt in enumerate(prompts):
        if len(prompts) > 1:
            print(f"--- prompt {i + 1}: {prompt!r}")
        if stream:
            sys.stdout.write(prompt)
            sys.stdout.flush()
            for piece in generator.stream(
                prompt,
                max_new_tokens=args.max_new_tokens,
                temperature=args.temperature,
                top_k=args.top_k,
                top_p=args.top_p,
                seed=args.seed,
            ):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            continue
        if args.num_beams is not None:
            text = generator.beam_search(
                [prompt],
                max_new_tokens=args.max_new_tokens,
                num_beams=args.num_beams,
                length_penalty=args.length_penalty,
            )[0]
        else:
            text = generator.sample(
                [prompt],
                max_new_tokens=args.max_new_tokens,
                temperature=args.temperature,
                top_k=args.top_k,
                top_p=args.top_p,
                seed=args.seed,
            )[0]
        print(prompt + text, flush=True)
