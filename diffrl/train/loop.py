"""The training driver: collect -> score -> signals -> examples -> optimise -> sync -> eval -> save."""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from diffrl.algorithms.base import CollectionSpec, RolloutBatch, TrainExamples
from diffrl.algorithms.registry import build_algorithm
from diffrl.config import Config, dump_config
from diffrl.errors import Abandoned, Interrupted
from diffrl.logging import MetricsLogger, Progress
from diffrl.seeding import generator
from diffrl.train.checkpoint import prune_checkpoints
from diffrl.train.evaluate import plot_eval_curve, save_grid
from diffrl.train.guard import Guard
from diffrl.train.run_folder import RunFolder, write_atomic
from diffrl.train.runner import Runner, build_runner
from diffrl.train.stop import StopSignals

SHOWN = [
    "rollout/reward/raw_mean",
    "train/loss",
    "train/grad_norm",
    "train/log_prob_mean_abs_diff",
    "perf/iteration_time",
]


@dataclass
class TrainResult:
    output_dir: Path
    checkpoint: Path
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)


def describe_batches(config: Config, spec: CollectionSpec, runner: Runner) -> str:
    t, r = config.train, config.rollout
    lines = [
        f"{runner.describe()} ({'LoRA r=' + str(config.model.lora.rank) if config.model.lora else 'full transformer'}); {t.iterations} iterations"
    ]
    if spec.online:
        k = (
            len(spec.step_strategy(config.sampling.num_steps, 0, config.run.seed))
            if spec.step_strategy and spec.keep_trajectory
            else 0
        )
        mg = r.micro_group_size or t.micro_batch_size
        lines.append(
            f"rollout: {r.batch_size} prompts x {r.n_samples_per_prompt} samples = {r.batch_size * r.n_samples_per_prompt} "
            f"trajectories of {config.sampling.num_steps} steps, in micro-groups of {mg}"
        )
        per_step = f"{t.batch_size} samples" + (
            f" x {k} trained steps = {t.batch_size * k} pairs" if k else ""
        )
        lines.append(
            f"optimizer: {r.num_steps_per_rollout} step(s) per rollout, each {per_step}, in micro-batches of {t.micro_batch_size}"
        )
    else:
        lines.append(
            f"optimizer: 1 step per iteration of {t.batch_size} examples, in micro-batches of {t.micro_batch_size}"
        )
    return "batch arithmetic:\n  " + "\n  ".join(lines)


def rollout_metrics(batch: RolloutBatch, failed: int) -> dict[str, float]:
    if batch.rewards is None:
        return {}
    ok = torch.isfinite(batch.rewards)  # failed samples are counted, not averaged
    if not ok.any():
        return {"rollout/reward_failed": float(failed)}
    r, group_id = batch.rewards[ok], batch.group_id[ok]
    groups = group_id.unique()
    zero = sum(bool((r[group_id == g] == r[group_id == g][0]).all()) for g in groups)
    return {
        "rollout/reward/raw_mean": r.mean().item(),
        "rollout/reward/raw_std": r.std(unbiased=False).item(),
        "rollout/reward/raw_min": r.min().item(),
        "rollout/reward/raw_max": r.max().item(),
        "rollout/zero_std_ratio": zero / len(groups),
        "rollout/reward_failed": float(failed),
    }


def optimizer_steps(batch: RolloutBatch, examples: TrainExamples, n_steps: int, seed: int, iteration: int):
    """Split a rollout's examples into ``n_steps`` optimizer steps by whole micro-groups, in an
    order shuffled by (seed, iteration)."""
    if n_steps == 1:
        return [examples]
    groups = batch.micro_group.unique()
    order = groups[torch.randperm(len(groups), generator=generator(seed, "shuffle", iteration))]
    rank = torch.empty(int(groups.max()) + 1, dtype=torch.long)
    rank[order] = torch.arange(len(order))
    samples = sorted(range(len(batch)), key=lambda i: (rank[batch.micro_group[i]].item(), i))
    per_step = -(-len(samples) // n_steps)
    chunks = [
        torch.tensor(samples[k * per_step : (k + 1) * per_step], dtype=torch.long) for k in range(n_steps)
    ]
    return [
        examples.select(torch.nonzero(torch.isin(examples.sample_id, c)).flatten()) for c in chunks if len(c)
    ]


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Average each metric over the optimizer steps of one iteration."""
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]} if rows else {}


def run_eval(step: int, runner: Runner, config: Config, out: Path, logger: MetricsLogger, train_time: float):
    result = runner.evaluate()
    if result is None:
        return None
    save_grid(result.images[: config.eval.grid_images], out / "eval" / f"step_{step:05d}.png")
    metrics = result.metrics()
    logger.log(step, metrics)
    return {"step": step, "train_time_s": round(train_time, 2), **metrics}


def train(config: Config) -> TrainResult:
    """Run the loop of ``config``; see :mod:`diffrl.train.stop` for SIGTERM/SIGINT."""
    torch.manual_seed(config.run.seed)
    folder = RunFolder(config.run.resolved_output_dir())
    folder.acquire()
    try:
        with StopSignals() as stop:
            return _train(config, folder, stop)
    finally:
        folder.release()


def _train(config: Config, folder: RunFolder, stop: StopSignals) -> TrainResult:
    out, t = folder.path, config.train
    resume_from, info = folder.resume_point(config)
    run_id = folder.claim(config, info)
    start = int(info["iteration"]) if info else 0
    folder.keep_metrics_up_to(start if info else -1)
    if not folder.holds_run() or info is None:
        folder.set_run_id(run_id)
    dump_config(config, out / "config.yaml")
    logger = MetricsLogger(folder.metrics_file)

    algorithm = build_algorithm(config)
    spec = algorithm.collection_spec()
    try:
        runner = build_runner(config, algorithm, spec)  # a runner that fails to start cleans up itself
    except BaseException:
        logger.close()
        raise
    n_steps = config.rollout.num_steps_per_rollout if spec.online else 1
    print(f"diffrl: {algorithm.name} on {config.model.family} ({config.model.path}) -> {out}", flush=True)
    print(describe_batches(config, spec, runner), flush=True)

    result = TrainResult(out, out / "checkpoints" / "final")
    loop = info["loop"] if info else {}
    result.evals = list(loop.get("evals", []))
    train_time = float(loop.get("train_time_s", 0.0))
    guard = Guard(t.max_failed_iterations, t.max_nonfinite_steps, loop.get("guard"))
    last_saved: Path | None = resume_from

    def evaluate(step: int) -> None:
        if any(e["step"] == step for e in result.evals):  # e.g. a run resumed at its last step
            return
        point = run_eval(step, runner, config, out, logger, train_time)
        if point is not None:
            result.evals.append(point)
            write_atomic(out / "eval_curve.json", json.dumps(result.evals, indent=1))

    def save(path: Path, step: int, final: bool = False) -> Path:
        nonlocal last_saved
        state = {"evals": result.evals, "train_time_s": train_time, "final": final, "guard": guard.state()}
        last_saved = runner.save(path, step, run_id, state)
        prune_checkpoints(out, t.keep_last, step)
        return last_saved

    step = start
    try:
        if resume_from is not None:
            runner.resume(resume_from)
            print(f"resumed from {resume_from} at iteration {start}", flush=True)
        if stop.requested():  # it came while the model loaded
            raise Abandoned
        if start == 0 or (t.eval_every and start % t.eval_every == 0):  # unless it was done already
            evaluate(start)
        progress = Progress("train", t.iterations, "iter")
        budget = t.time_budget_minutes * 60 if t.time_budget_minutes else float("inf")
        offset = train_time  # the budget counts this process's training time only
        for it in range(start, t.iterations):
            t0 = time.time()
            if stop.requested():  # before the rollout: nothing of this iteration ran yet
                raise Abandoned
            batch, stats = runner.collect(it, stop.requested)
            metrics = rollout_metrics(batch, stats.reward_failed)
            metrics.update(stats.metrics)
            if stats.errors:
                warnings.warn(
                    f"iteration {it}: {stats.reward_failed} sample(s) dropped: {stats.errors[0]}",
                    stacklevel=1,
                )
            if batch.rewards is not None:
                batch = batch.select(torch.nonzero(torch.isfinite(batch.rewards)).flatten())
            guard.rollout(len(batch), stats.errors)
            steps: list[dict[str, float]] = []
            if len(batch):
                signals = algorithm.postprocess_rewards(batch, batch.rewards)
                examples = algorithm.build_train_data(batch, signals, it)
                steps = runner.optimize(optimizer_steps(batch, examples, n_steps, config.run.seed, it))
                metrics.update(mean_metrics(steps))
            metrics.update(runner.end_iteration())  # old policy update, weight sync
            metrics["perf/rollout_time"] = stats.sampling_time
            metrics["perf/reward_wait_time"] = stats.reward_wait_time
            metrics["perf/iteration_time"] = time.time() - t0
            train_time += metrics["perf/iteration_time"]
            step = it + 1
            result.history.append({"step": step, **metrics})
            logger.log(
                step, metrics, keys=SHOWN, echo=step % config.run.log_every == 0 or step == t.iterations
            )
            progress.update(step)
            guard.optimized(steps, last_saved)
            if stop.received:
                raise Abandoned
            last = step == t.iterations or train_time - offset >= budget
            if t.eval_every and step % t.eval_every == 0 and not last:
                evaluate(step)
            if t.save_every and step % t.save_every == 0 and not last:
                save(out / "checkpoints" / f"step_{step:05d}", step)
            if last:
                if step < t.iterations:
                    print(
                        f"time budget of {t.time_budget_minutes} min reached after {step} iterations",
                        flush=True,
                    )
                break
        guard.finished(step - start)
        evaluate(step)
        save(result.checkpoint, step, final=True)
    except Abandoned:
        raise _interrupted(stop, step, start, last_saved, save, out) from None
    finally:
        runner.close()
        logger.close()
    if result.evals:
        plot_eval_curve(result.evals, out / "eval_curve.png")
    return result


def _interrupted(stop: StopSignals, step: int, start: int, last_saved, save, out: Path) -> Interrupted:
    """Save the last completed iteration (unless it is saved already) and say how to go on."""
    if step > start and (last_saved is None or _iteration(last_saved) != step):
        last_saved = save(out / "checkpoints" / f"step_{step:05d}", step)
    if last_saved is None:
        return Interrupted(f"{stop.name} received before the first iteration finished: nothing to save")
    return Interrupted(
        f"{stop.name} received: stopped after iteration {step}, checkpoint {last_saved}; continue with "
        "the same command and train.resume=latest",
        str(last_saved),
    )


def _iteration(checkpoint: Path) -> int:
    return int(json.loads((Path(checkpoint) / "checkpoint.json").read_text())["iteration"])
