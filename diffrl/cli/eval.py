"""``diffrl eval TARGET``: score a model on a prompt set, print the mean reward (and the paired
difference to ``--baseline``), write a grid and the per-sample scores."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diffrl.cli.commands.eval import EvalInputs
from diffrl.cli.inference import checked, guarded, load_for_inference
from diffrl.cli.outputs import claim_out_folder
from diffrl.evaluation.evaluate import evaluate, paired_difference
from diffrl.rewards.base import RewardError, RewardSet
from diffrl.trust.alarms import paired, to_json


def run(args: argparse.Namespace, inputs: EvalInputs) -> int:
    return guarded(
        inputs.untrusted(),
        inputs.out,
        "the eval's outputs",
        "free space, then run it again",
        lambda out: _run(args, inputs, out),
    )


def _run(args: argparse.Namespace, inputs: EvalInputs, out: Path) -> int:
    config, checkpoint = checked(inputs.target).config, inputs.target.checkpoint
    baseline = None
    if inputs.baseline is not None and inputs.paired is not None:
        checked(inputs.baseline)
        baseline = checked(inputs.paired)
    rewards = RewardSet(config.eval.rewards)
    watch = RewardSet(config.eval.watch) if config.eval.watch else None  # held-out judges
    try:
        result = evaluate(load_for_inference(config, checkpoint), config, rewards, watch)
        base = (
            evaluate(load_for_inference(baseline.config, baseline.checkpoint), config, rewards, watch)
            if baseline
            else None
        )
    finally:
        rewards.close()
        if watch is not None:
            watch.close()
    failed = [*result.errors, *(base.errors if base is not None else [])]
    if failed:
        raise RewardError(f"eval: {len(failed)} reward call(s) failed: " + "; ".join(failed))
    claim_out_folder(out, "--out", "eval")  # checked again: files may have arrived meanwhile
    grid = result.save_grid(out / "grid.png", config.eval.grid_images)
    for name, scores in result.rewards.items():
        print(
            f"{name}: mean {scores.mean():.4f}  (n={len(scores)}, exact {(scores == 1).float().mean():.2%})"
        )
    print(f"mean reward: {result.total.mean():.4f} over {len(result.prompts)} samples")
    scores = {"prompts": result.prompts, "reward": result.total.tolist()}
    for name, watched in result.watch.items():  # eval.watch: judged, not in the mean reward
        line = f"watched {name}: mean {watched.nanmean():.4f}"
        if base is not None and name in base.watch:
            diff, se, _ = paired(watched, base.watch[name])
            line += f"; difference to the baseline {diff:+.4f} +- {se:.4f} (paired)"
        print(line)
    if result.watch:
        scores["watch"] = {name: to_json(watched) for name, watched in result.watch.items()}
    if base is not None:
        diff, se = paired_difference(result.total, base.total)
        print(
            f"baseline {args.baseline}: mean reward {base.total.mean():.4f}; difference {diff:+.4f} "
            f"+- {se:.4f} (standard error, paired over the same {len(base.prompts)} prompts and seeds)"
        )
        scores["baseline_reward"] = base.total.tolist()
    (out / "scores.json").write_text(json.dumps(scores))
    print(f"grid: {grid} ({result.shown(config.eval.grid_images)}); per-sample scores: {out / 'scores.json'}")
    return 0
