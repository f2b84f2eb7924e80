"""Rollout speed of the GRPO loop vs `axlearn generate`'s decoding, same model and batch.

Both decode with the same KV-cache sampler (`Decoder.sample_decode`) on the GRPO toy model
(the `grpo-copy-digits` SpmdTrainer config of `axlearn.experiments.text.gpt.post_training`,
random weights): the rollout of its batch processor (`grpo.rollout.GrpoRollout.sample`, compiled
as in each training step: `num_prompts` prompts x `group_size` samples, ids fetched to the
host) and `InferenceRunner.sample_decode` (what `axlearn generate` runs) on the same
num_prompts * group_size prompts with the same parameters, temperature and stop token. Both
are compiled before timing. Rounds are interleaved (GRPO, generate, GRPO, ...); each side's
tokens/s counts num_prompts * group_size * max_new_tokens slots per call. It prints JSON: the
rounds and the medians, and ratio = median GRPO tokens/s / median generate tokens/s.

    python benchmarks/grpo_rollout.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from axlearn.common.checkpointer import Checkpointer  # noqa: E402
from axlearn.common.inference import InferenceRunner  # noqa: E402
from axlearn.experiments.text.gpt.common import MESH_AXIS_NAMES  # noqa: E402
from axlearn.experiments.text.gpt.post_training import grpo_trainer_config  # noqa: E402


def main() -> None:
    """Parses flags, runs the interleaved rounds, prints JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved rounds (>= 1).")
    parser.add_argument("--calls", type=int, default=5, help="Decoding calls timed per round.")
    parser.add_argument("--num_prompts", type=int, default=8)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=16)
    parser.add_argument("--model_dim", type=int, default=64)
    parser.add_argument("--num_layers", type=int, default=2)
    args = parser.parse_args()
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be >= 1")

    with tempfile.TemporaryDirectory() as tmp:
        cfg = grpo_trainer_config(
            num_prompts=args.num_prompts,
            group_size=args.group_size,
            model_dim=args.model_dim,
            num_layers=args.num_layers,
        ).set(dir=tmp)
        cfg.batch_processor.max_new_tokens = args.max_new_tokens
        trainer = cfg.instantiate(parent=None)
        trainer.init(jax.random.PRNGKey(0))
        processor = trainer.batch_processor
        prefix = np.asarray(trainer.input.source.batch(0)["prefix"], np.int32)
        state = trainer.trainer_state
        rollout = jax.jit(processor.sample).lower(state.model, state.prng_key, prefix).compile()
        params, key = state.model, state.prng_key
        temperature = cfg.model.temperature

        runner_cfg = InferenceRunner.default_config().set(
            name="runner",
            mesh_shape=(1,) * len(MESH_AXIS_NAMES),
            mesh_axis_names=MESH_AXIS_NAMES,
            batch_axis_names=("data", "fsdp"),
            model=cfg.model.policy.clone(),
            checkpointer=Checkpointer.default_config().set(dir=os.path.join(tmp, "none")),
        )
        runner = runner_cfg.instantiate(parent=None)
        runner.set_params(params["policy"])
        prompts = [list(row) for row in np.repeat(prefix, args.group_size, axis=0)]
        eos = runner.eos_token_id

        def grpo_call() -> int:
            ids = np.asarray(jax.device_get(rollout(params, key, prefix)))
            return ids.shape[0]

        def generate_call() -> int:
            out = runner.sample_decode(
                prompts,
                max_new_tokens=args.max_new_tokens,
                temperature=temperature,
                stop_tokens=[eos],
                seed=0,
            )
            return len(out)

        rows = prefix.shape[0] * args.group_size
        assert grpo_call() == rows and generate_call() == rows  # Compiles both.
        tokens = rows * args.max_new_tokens

        def timed(fn) -> float:
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            return tokens * args.calls / (time.perf_counter() - start)

        rounds = []
        for _ in range(args.rounds):
            rounds.append(
                dict(grpo_tokens_per_s=timed(grpo_call), generate_tokens_per_s=timed(generate_call))
            )
        for r in rounds:
            r["ratio"] = r["grpo_tokens_per_s"] / r["generate_tokens_per_s"]
        grpo = statistics.median(r["grpo_tokens_per_s"] for r in rounds)
        generate = statistics.median(r["generate_tokens_per_s"] for r in rounds)
        print(
            json.dumps(
                dict(
                    benchmark="grpo_rollout",
                    model=dict(model_dim=args.model_dim, num_layers=args.num_layers),
                    batch=dict(
                        num_prompts=args.num_prompts,
                        group_size=args.group_size,
                        prompt_length=int(prefix.shape[1]),
                        max_new_tokens=args.max_new_tokens,
                        sequences=rows,
                    ),
                    calls_per_round=args.calls,
                    rounds=rounds,
                    grpo_tokens_per_s_median=grpo,
                    generate_tokens_per_s_median=generate,
                    ratio=grpo / generate,
                    ratio_per_round_median=statistics.median(r["ratio"] for r in rounds),
                    devices=[str(d) for d in jax.devices()[:1]],
                ),
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
