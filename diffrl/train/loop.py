"""The training driver: collect -> score -> signals -> examples -> optimise -> sync -> eval/save.

:meth:`Driver.iteration` is the loop diagram (``docs/ARCHITECTURE.md``); the one schedule of evals
and checkpoints is :func:`~diffrl.train.stages.due_after`; SIGTERM/SIGINT: :mod:`diffrl.train.stop`;
the run folder's life around the loop (lock, resume, loggers, runner, report):
:class:`~diffrl.train.session.TrainSession`.
"""

from __future__ import annotations

import time
import warnings

import torch

from diffrl.algorithms.returns import checked_examples, checked_signals
from diffrl.config import Config
from diffrl.core import torch_state
from diffrl.core.errors import Abandoned, Interrupted, quoted
from diffrl.core.rollout import RolloutBatch, RolloutStats
from diffrl.core.user_code import plugin_named, plugin_paths
from diffrl.logging import Progress, console
from diffrl.train import stages
from diffrl.train.checkpoint import iteration_of, storage_failure
from diffrl.train.evaluate import EvalResult
from diffrl.train.pipeline import RolloutAhead
from diffrl.train.session import TrainSession
from diffrl.train.stages import TrainResult
from diffrl.train.stop import StopSignals


def train(config: Config) -> TrainResult:
    """Run the loop of ``config`` in its output folder (locked while it runs). A full disk (or
    another storage failure) anywhere in it is a :class:`~diffrl.train.checkpoint.StorageError`
    that says the last checkpoint is intact and how to resume."""
    torch.manual_seed(config.run.seed)
    try:
        # the signals first: one that comes while the model loads stops the run once it has loaded
        with StopSignals() as stop, TrainSession(config) as session:
            if session.finished:  # a rerun of a run that ended before its report: the session writes it
                return session.result
            return Driver(session, stop).run()
    except Exception as e:  # safetensors reports a full disk as its own error, not an OSError
        fix = (
            "the checkpoints already written are intact, so resuming is safe: free space (or fix the "
            "device), then rerun the same command with train.resume=latest"
        )
        failure = storage_failure(e, f"into the run folder {str(config.run.resolved_output_dir())!r}", fix)
        if failure is None:
            raise
        raise failure from e


class Driver:
    def __init__(self, session: TrainSession, stop: StopSignals):
        self.session, self.stop, self.config = session, stop, session.config
        self.algorithm, self.spec, self.runner = session.algorithm, session.spec, session.runner
        self.state, self.result, self.logger = session.state, session.result, session.logger
        self.start = self.step = session.start
        self.ahead = (
            RolloutAhead(self.runner, self.stop.requested) if self.config.train.off_policy_steps > 0 else None
        )

    def run(self) -> TrainResult:
        try:
            if self.stop.requested():  # it came while the model loaded
                raise Abandoned
            # the rollout, scoring and eval bars nest under this one
            with Progress("train", self.config.train.iterations, "iter", initial=self.start) as progress:
                self.iterate(progress)
                print(stages.stage_summary(self.result.history, self.state.evals), flush=True)
        except Abandoned:
            raise self.interrupted() from None
        finally:
            if self.ahead is not None:  # a rollout still in flight (an error, a stop, the time budget)
                self.ahead.close()
        return self.result

    def iterate(self, progress: Progress) -> None:
        """From ``start`` to the last iteration (or the time budget), with the evals and checkpoints due."""
        t, start = self.config.train, self.start
        if start == 0 or stages.due_after(t, start, 0.0).eval:  # unless it was done already
            self.eval_point(start)
        offset = self.state.train_time_s
        for it in range(start, t.iterations):
            if self.stop.requested():  # before the rollout: nothing of this iteration ran yet
                raise Abandoned
            before = torch_state.current()
            metrics, steps = self.iteration(it)
            self.check_torch_settings(before, it)
            self.step = step = it + 1
            self.result.history.append({"step": step, **metrics})
            echo = step % self.config.run.log_every == 0 or step == t.iterations
            self.logger.log(step, metrics, keys=stages.SHOWN, echo=echo)
            progress.update(step, postfix=stages.progress_postfix(metrics))
            self.state.guard.optimized(steps, self.session.last_saved)
            if self.stop.received:
                raise Abandoned
            due = stages.due_after(t, step, self.state.train_time_s - offset)  # this process's time
            if due.last:
                if step < t.iterations:
                    console(f"time budget of {t.time_budget_minutes} min reached after {step} iterations")
                break
            if due.eval or (self.session.best is not None and self.session.best.due(step)):
                self.eval_point(step)
                if self.session.watch.stop:  # eval.watch_alarm.stop: ends as at the time budget
                    console(
                        f"stopping after iteration {step}: the reward-hacking alarm fired (eval.watch_alarm.stop)"
                    )
                    break
            if due.save:
                self.session.save(step)
        self.state.guard.finished(self.step - start)
        self.eval_point(self.step)
        self.session.save(self.step, final=True)

    def collect(self, it: int) -> tuple[RolloutBatch, RolloutStats, dict[str, float]]:
        """Rollout ``it``, scored, and the rollout side's metrics (:mod:`diffrl.train.pipeline`
        when pipelined: then the next rollout is on its way when this returns)."""
        if self.ahead is not None:
            batch, stats, waited = self.ahead.take(it)
            side = self.runner.end_rollout()  # nothing in flight: the engines take the weights of `it`
            if it + 1 < self.config.train.iterations:
                self.ahead.launch(it + 1)
            return batch, stats, {**side, "perf/rollout_wait_time": waited}
        rollout = stages.Rollout()
        with Progress("rollout", stages.micro_group_count(self.config, self.spec), "group") as bar:
            for part in self.runner.sample(it, self.stop.requested):  # collect,
                rollout.add(part, self.runner.score(part))  # and score each micro-group as it arrives
                bar.update(len(rollout.parts))
        return *rollout.finish(), {}

    def iteration(self, it: int) -> tuple[dict[str, float], list[dict[str, float]]]:
        """One iteration: its metrics, and those of each optimizer step."""
        t0, algorithm = time.time(), self.algorithm
        batch, stats, side = self.collect(it)
        metrics = {
            **stages.rollout_metrics(batch, stats, it, self.config.monitor, self.state.base_spread),
            **side,
        }
        if self.state.base_spread is None and "monitor/within_group_std" in metrics:
            self.state.base_spread = metrics["monitor/within_group_std"]  # the collapse alarm's reference
        batch = stages.scored_samples(batch)
        self.state.guard.rollout(len(batch), stats.errors)
        steps: list[dict[str, float]] = []
        if len(batch):
            with torch_state.guarding(lambda: plugin_named(algorithm)):
                signals = algorithm.postprocess_rewards(batch, batch.rewards)
            signals = checked_signals(algorithm, signals, len(batch))
            with torch_state.guarding(lambda: plugin_named(algorithm)):
                examples = algorithm.build_train_data(batch, signals, it)
            examples = checked_examples(algorithm, "build_train_data()", examples)
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

    def check_torch_settings(self, before: torch_state.TorchSettings, it: int) -> None:
        """The catch-all for code that runs in no guarded call (a model family's forward, a
        callback of a plugin's own): torch's process-wide settings are what they were before
        iteration ``it``, or the run stops naming the plugins it imported."""
        what = torch_state.changes(before, torch_state.current())
        if what:
            torch_state.restore(before)
            plugins = ", ".join(repr(p) for p in plugin_paths()) or "none: a bug in diffrl"
            raise torch_state.changed_error(
                f"code run in iteration {it} (the run's plugins: {plugins})", what
            )

    def eval_point(self, step: int) -> None:
        if any(e["step"] == step for e in self.state.evals):  # e.g. a run resumed at its last step
            return
        t0 = time.time()
        result = self.runner.evaluate()
        if result is not None:
            seconds = time.time() - t0
            moved = self.judge(step, result)
            self.state.record_eval(
                step, result, self.session.out, self.config.eval.grid_images, self.logger, seconds
            )
            if moved:
                console(f"best checkpoint: {self.session.save_best(step)}")

    def judge(self, step: int, result: EvalResult) -> bool:
        """The eval at ``step`` against the run's others: the watch curves' paired gains and the
        alarm (into ``result.extra``), and whether it is the new best (``train.keep_best``)."""
        scores = result.per_sample()
        metrics, alarms = self.session.watch.observe(step, scores)
        e = self.config.eval
        for alarm in alarms:  # alarms exist only with eval.watch_alarm set
            trained = ", ".join(quoted(r.name, 60) for r in e.rewards)
            warnings.warn(alarm.message(e.watch_alarm.k_se, trained), stacklevel=2)
        moved, best = False, self.session.best
        if best is not None and (best.due(step) or best.iteration < 0):
            moved, kept = best.consider(step, scores)
            metrics.update(kept)
        result.extra.update(metrics)
        return moved

    def interrupted(self) -> Interrupted:
        """Save the last completed iteration (unless it is saved already) and say how to go on."""
        saved = self.session.last_saved
        if self.step > self.start and (saved is None or iteration_of(saved) != self.step):
            saved = self.session.save(self.step)
        return stages.interrupted_error(self.stop.name, self.step, saved)
