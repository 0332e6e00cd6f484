"""The training driver: collect -> score -> signals -> examples -> optimise -> sync -> eval/save.

:meth:`Driver.iteration` is the loop diagram (``docs/ARCHITECTURE.md``); the one schedule of evals
and checkpoints is :func:`~diffrl.train.stages.due_after`; SIGTERM/SIGINT: :mod:`diffrl.train.stop`.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.config import Config, dump_config
from diffrl.errors import Abandoned, Interrupted
from diffrl.logging import MetricsLogger, Progress, TrackerRun, console, start_trackers
from diffrl.train import report, stages
from diffrl.train.checkpoint import iteration_of, prune_checkpoints
from diffrl.train.run_folder import RunFolder
from diffrl.train.runner import build_runner
from diffrl.train.stages import LoopState, TrainResult
from diffrl.train.stop import StopSignals


def train(config: Config) -> TrainResult:
    """Run the loop of ``config`` in its output folder (locked while it runs)."""
    torch.manual_seed(config.run.seed)
    folder = RunFolder(config.run.resolved_output_dir())
    folder.acquire()
    try:
        with StopSignals() as stop:
            return Driver(config, folder, stop).run()
    finally:
        folder.release()


class Driver:
    def __init__(self, config: Config, folder: RunFolder, stop: StopSignals):
        self.config, self.stop, self.out = config, stop, folder.path
        self.resume_from, info, self.run_id = folder.begin(config)  # before any model loads
        self.start = int(info["iteration"]) if info else 0
        self.state = LoopState.resumed(info, config.train)
        self.result = TrainResult(self.out, self.out / "checkpoints" / "final", evals=self.state.evals)
        self.last_saved: Path | None = self.resume_from
        dump_config(config, self.out / "config.yaml")
        run = TrackerRun(
            self.out, self.run_id, config.run.name, config.run.wandb_project, self.start + 1 if info else 0
        )
        self.logger = MetricsLogger(folder.metrics_file)
        fresh = info is None
        try:
            # the trackers start before any model loads: one that cannot start fails the run at once
            self.logger.trackers = start_trackers(config.run.loggers, run)
            self.algorithm = build_algorithm(config)
            self.spec = self.algorithm.collection_spec()
            self.runner = build_runner(config, self.algorithm, self.spec)  # one failing to start cleans up
        except BaseException:
            self.logger.close(ok=False)
            if fresh:  # nothing ran: a rerun once the problem is fixed starts in the same folder
                folder.forget_fresh_start()
            raise
        try:
            head = (
                f"diffrl: {self.algorithm.name} on {config.model.family} ({config.model.path}) -> {self.out}"
            )
            arithmetic = stages.describe_batches(config, self.spec, self.runner)
            print(f"{head}\n{arithmetic}", flush=True)
            self.logger.log_metadata(config.to_dict(), f"{head}\n{arithmetic}")
        except BaseException:
            self.close(ok=False)
            if fresh:
                folder.forget_fresh_start()
            raise

    def close(self, ok: bool) -> None:
        """Stop the runner's parts and close the loggers, the loggers even when the runner fails
        to stop (``ok``: whether the run ended well)."""
        try:
            self.runner.close()
        finally:
            self.logger.close(ok)

    def run(self) -> TrainResult:
        t, step = self.config.train, self.start
        progress: Progress | None = None
        ok = False
        try:
            if self.resume_from is not None:
                self.runner.resume(self.resume_from)
                print(f"resumed from {self.resume_from} at iteration {self.start}", flush=True)
            if self.stop.requested():  # it came while the model loaded
                raise Abandoned
            progress = Progress("train", t.iterations, "iter", initial=self.start)  # inner bars nest under it
            if self.start == 0 or stages.due_after(t, self.start, 0.0).eval:  # unless it was done already
                self.eval_point(self.start)
            offset = self.state.train_time_s
            for it in range(self.start, t.iterations):
                if self.stop.requested():  # before the rollout: nothing of this iteration ran yet
                    raise Abandoned
                metrics, steps = self.iteration(it)
                step = it + 1
                self.result.history.append({"step": step, **metrics})
                echo = step % self.config.run.log_every == 0 or step == t.iterations
                self.logger.log(step, metrics, keys=stages.SHOWN, echo=echo)
                progress.update(step, postfix=stages.progress_postfix(metrics))
                self.state.guard.optimized(steps, self.last_saved)
                if self.stop.received:
                    raise Abandoned
                due = stages.due_after(t, step, self.state.train_time_s - offset)  # this process's time
                if due.last:
                    if step < t.iterations:
                        console(f"time budget of {t.time_budget_minutes} min reached after {step} iterations")
                    break
                if due.eval:
                    self.eval_point(step)
                if due.save:
                    self.save(step)
            self.state.guard.finished(step - self.start)
            self.eval_point(step)
            self.save(step, final=True)
            print(stages.stage_summary(self.result.history, self.state.evals), flush=True)
            ok = True
        except Abandoned:
            raise self.interrupted(step) from None
        finally:
            if progress is not None:
                progress.close()
            self.close(ok)
        # the run in pictures: eval curve, first-vs-last grids, training curves, one HTML page
        try:
            print(f"report: {report.finish_run(self.out, self.result.evals)}", flush=True)
        except Exception as e:  # the run is saved: a picture that fails costs only itself
            # (a full disk, an image too large for Pillow, a plotting error)
            warnings.warn(
                f"could not write the run's pictures and report ({e}); the checkpoint and metrics are "
                f"saved: write them again with `diffrl report {self.out}`",
                stacklevel=2,
            )
        return self.result

    def iteration(self, it: int) -> tuple[dict[str, float], list[dict[str, float]]]:
        """One iteration: its metrics, and those of each optimizer step."""
        t0, algorithm = time.time(), self.algorithm
        rollout = stages.Rollout()
        with Progress("rollout", stages.micro_group_count(self.config, self.spec), "group") as bar:
            for part in self.runner.sample(it, self.stop.requested):  # collect,
                rollout.add(part, self.runner.score(part))  # and score each micro-group as it arrives
                bar.update(len(rollout.parts))
        batch, stats = rollout.finish()
        metrics = stages.rollout_metrics(batch, stats, it)
        batch = stages.scored_samples(batch)
        self.state.guard.rollout(len(batch), stats.errors)
        steps: list[dict[str, float]] = []
        if len(batch):
            signals = algorithm.postprocess_rewards(batch, batch.rewards)
            examples = algorithm.build_train_data(batch, signals, it)
            n_steps = self.config.rollout.num_steps_per_rollout if self.spec.online else 1
            steps = self.runner.optimize(
                stages.optimizer_steps(batch, examples, n_steps, self.config.run.seed, it)
            )
            metrics.update(stages.mean_metrics(steps))
        metrics.update(self.runner.end_iteration())  # old policy update, weight sync
        metrics.update(
            {"perf/rollout_time": stats.sampling_time, "perf/reward_wait_time": stats.reward_wait_time}
        )
        peak = getattr(self.runner, "peak_flops", None)  # optional for a user's runner
        metrics.update(stages.mfu_metrics(metrics, peak() if peak else None))
        metrics["perf/iteration_time"] = time.time() - t0
        self.state.train_time_s += metrics["perf/iteration_time"]
        return metrics, steps

    def eval_point(self, step: int) -> None:
        if any(e["step"] == step for e in self.state.evals):  # e.g. a run resumed at its last step
            return
        t0 = time.time()
        result = self.runner.evaluate()
        if result is not None:
            seconds = time.time() - t0
            self.state.record_eval(step, result, self.out, self.config.eval.grid_images, self.logger, seconds)

    def save(self, step: int, final: bool = False) -> Path:
        path = self.result.checkpoint if final else self.out / "checkpoints" / f"step_{step:05d}"
        self.last_saved = self.runner.save(path, step, self.run_id, self.state.saved(final))
        prune_checkpoints(self.out, self.config.train.keep_last, step)
        return self.last_saved

    def interrupted(self, step: int) -> Interrupted:
        """Save the last completed iteration (unless it is saved already) and say how to go on."""
        saved = self.last_saved
        if step > self.start and (saved is None or iteration_of(saved) != step):
            saved = self.save(step)
        return stages.interrupted_error(self.stop.name, step, saved)
