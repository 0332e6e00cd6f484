"""How much of one rollout's gradient is signal: Flow-GRPO, DiffusionNFT and AWM on the tiny OCR task.

    python benchmarks/gradient_signal.py [--rollouts 10] [--recipes tiny_grpo_ocr_small tiny_nft_ocr tiny_awm_ocr]
                                         [--set KEY=VALUE ...]

For each recipe, from the shipped base (LoRA freshly initialised, no optimizer step taken), draws
``--rollouts`` independent rollouts (ids 0..K-1, as a run's first iterations) and computes each
one's gradient of the algorithm's loss over all its examples, exactly as one training step would
accumulate it (``before_update``, then every micro-batch weighted by its share). Writing each
gradient as ``g + n_k`` (the expected gradient plus this rollout's noise), the mean cosine between
two independent ones estimates ``c = |g|^2 / (|g|^2 + E|n|^2)``: the signal fraction of one
rollout's gradient. Summing ``T`` rollouts' gradients gives a signal-to-noise (power) ratio of about
``T c / (1 - c)``, so ``(1 - c) / c`` is the number of rollouts one needs before the update direction
is more signal than noise. Prints, per recipe: c with its jackknife standard error, that number
of rollouts, and the seconds per rollout + gradient (measured here, side by side in one run).

This is the measurement behind docs/results/flow_grpo_tiny.md: it tells an estimator's variance apart
from a wrong sign or a slow machine.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.preflight import load_config
from diffrl.train.gather import collect_rollout
from diffrl.train.runner import LocalRunner


def rollout_gradients(recipe: str, rollouts: int, overrides: list[str]) -> tuple[list[torch.Tensor], float]:
    """One flattened gradient ``(P,)`` per rollout, and the mean seconds per rollout + gradient."""
    config = load_config(f"recipes/{recipe}.yaml", ["eval.enabled=false", *overrides])
    algorithm = build_algorithm(config)
    runner = LocalRunner(config, algorithm, algorithm.collection_spec())
    actor = runner.actor
    grads, start = [], time.time()
    try:
        for k in range(rollouts):
            batch, _ = collect_rollout(runner, k)
            batch = batch.select(torch.nonzero(torch.isfinite(batch.rewards)).flatten())
            signals = algorithm.postprocess_rewards(batch, batch.rewards)
            examples = actor.before_update(algorithm.build_train_data(batch, signals, k), algorithm)
            actor.optimizer.zero_grad(set_to_none=True)
            for mb in actor.policy.micro_batches(examples):
                loss, _ = algorithm.compute_loss(actor.policy, mb.to(actor.family.device))
                (loss * len(mb) / len(examples)).backward()
            grads.append(torch.cat([p.grad.flatten() for p in actor.params if p.grad is not None]).double())
    finally:
        runner.close()
    return grads, (time.time() - start) / rollouts


def signal_fraction(grads: list[torch.Tensor]) -> tuple[float, float]:
    """Mean pairwise cosine of independent gradients, and its jackknife standard error (the pairs
    share gradients, so their own spread would understate it)."""
    k = len(grads)
    cos = torch.zeros(k, k, dtype=torch.float64)
    for i, j in itertools.combinations(range(k), 2):
        cos[i, j] = cos[j, i] = torch.nn.functional.cosine_similarity(grads[i], grads[j], dim=0)
    pairs = k * (k - 1) / 2
    total = cos.sum() / 2
    mean = total / pairs
    # leave gradient i out: drop its k-1 pairs
    loo = (total - cos.sum(1)) / (pairs - (k - 1))
    se = ((k - 1) / k * ((loo - loo.mean()) ** 2).sum()).sqrt()
    return mean.item(), se.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=10)
    parser.add_argument(
        "--recipes", nargs="+", default=["tiny_grpo_ocr_small", "tiny_nft_ocr", "tiny_awm_ocr"]
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every recipe"
    )
    args = parser.parse_args()
    if args.rollouts < 3:
        raise SystemExit("error: --rollouts must be >= 3 to estimate the cosine and its error")
    rows = []
    for recipe in args.recipes:
        grads, seconds = rollout_gradients(recipe, args.rollouts, args.set)
        c, se = signal_fraction(grads)
        rows.append((recipe, c, se, seconds))
        print(f"{recipe}: c = {c:.4f} +- {se:.4f}", flush=True)
    print(f"\nsignal fraction of one rollout's gradient ({args.rollouts} rollouts each, from the base):")
    print(f"{'recipe':<20} {'c':>8} {'+-':>7} {'rollouts to SNR 1':>18} {'s / rollout':>12}")
    for recipe, c, se, seconds in rows:
        high = c + 2 * se  # the largest c the pairs allow (2 standard errors)
        if c - 2 * se > 0:
            needed = f"{(1 - c) / c:.0f}"
        elif high > 0:
            needed = f"> {(1 - high) / high:.0f}"
        else:
            needed = "no signal seen"
        print(f"{recipe:<20} {c:8.4f} {se:7.4f} {needed:>18} {seconds:12.1f}")


if __name__ == "__main__":
    main()
