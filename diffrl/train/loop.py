"""The training driver: collect -> score -> signals -> examples -> optimise -> sync -> eval/save.

:meth:`Driver.iteration` is the loop diagram (``docs/ARCHITECTURE.md``). The session
(:mod:`diffrl.train.session`) owns the run folder's life, the checked algorithm and the run's trust
(:class:`~diffrl.trust.trust.Trust`); the driver calls them at its stages.
"""

from __future__ import annotations

import time

import torch

from diffrl.config import Config
from diffrl.core.errors import Abandoned, Interrupted
from diffrl.core.rollout import RolloutBatch, RolloutStats
from diffrl.logging import Progress, console
from diffrl.train import batches, gather, perf
from diffrl.train.hygiene import settings_kept
from diffrl.train.pipeline import RolloutAhead
from diffrl.train.runner import Runner
from diffrl.train.schedule import due_after
from diffrl.train.session import TrainSession, storage_errors
from diffrl.train.state import TrainResult
from diffrl.train.stop import StopSignals


def train(config: Config, runner_class: type[Runner]) -> TrainResult:
    """Run the loop of ``config`` in its output folder (locked while it runs), its parts placed
    by ``runner_class`` (chosen by the caller: :mod:`diffrl.launch`)."""
    torch.manual_seed(config.run.seed)
    # the signals first: one that comes while the model loads stops the run once it has loaded
    with storage_errors(config), StopSignals() as stop, TrainSession(config, runner_class) as session:
        if session.finished:  # a rerun of a run that ended before its report: the session writes it
            return session.result
        return Driver(session, stop).run()


class Driver:
    def __init__(self, session: TrainSession, stop: StopSignals):
        self.session, self.stop, self.config, self.logger = session, stop, session.config, session.logger
        self.algorithm, self.spec, self.runner = session.checked, session.spec, session.runner
        self.state, self.result, self.trust = session.state, session.result, session.trust
        self.start = self.step = session.start
        ahead = self.config.train.off_policy_steps > 0
        self.ahead = RolloutAhead(self.runner, self.stop.requested) if ahead else None
        self.peak = perf.MfuPeak(self.runner)  # the MFU yardstick, raised by a stage that beats it

    def run(self) -> TrainResult:
        try:
            if self.stop.requested():  # it came while the model loaded
                raise Abandoned
            # the rollout, scoring and eval bars nest under this one
            with Progress("train", self.config.train.iterations, "iter", initial=self.start) as progress:
                self.iterate(progress)
                print(perf.stage_summary(self.result.history, self.state.evals, self.peak), flush=True)
        except Abandoned:
            raise self.interrupted() from None
        finally:
            if self.ahead is not None:  # a rollout still in flight (an error, a stop, the time budget)
                self.ahead.close()
        return self.result

    def iterate(self, progress: Progress) -> None:
        """From ``start`` to the last iteration (or the time budget), with the evals and checkpoints due."""
        t, start = self.config.train, self.start
        if start == 0 or due_after(t, start, 0.0).eval:  # unless it was done already
            self.eval_point(start)
        offset = self.state.train_time_s
        for it in range(start, t.iterations):
            if self.stop.requested():  # before the rollout: nothing of this iteration ran yet
                raise Abandoned
            with settings_kept(it):
                metrics, steps = self.iteration(it)
            self.step = step = it + 1
            self.result.history.append({"step": step, **metrics})
            echo = step % self.config.run.log_every == 0 or step == t.iterations
            self.logger.log(step, metrics, keys=perf.SHOWN, echo=echo)
            progress.update(step, postfix=perf.progress_postfix(metrics))
            self.trust.optimized(steps, self.session.last_saved)
            if self.stop.received:
                raise Abandoned
            due = due_after(t, step, self.state.train_time_s - offset)  # this process's time
            if due.last:
                if step < t.iterations:
                    console(f"time budget of {t.time_budget_minutes} min reached after {step} iterations")
                break
            if due.eval or self.trust.eval_due(step):
                self.eval_point(step)
                if self.trust.stop:  # eval.watch_alarm.stop: ends as at the time budget
                    console(
                        f"stopping after iteration {step}: the reward-hacking alarm fired (eval.watch_alarm.stop)"
                    )
                    break
            if due.save:
                self.session.save(step)
        self.trust.finished(self.step - start)
        self.eval_point(self.step)
        self.session.save(self.step, final=True)

    def collect(self, it: int) -> tuple[RolloutBatch, RolloutStats, dict[str, float]]:
        """Rollout ``it``, scored, and the rollout side's metrics (:mod:`diffrl.train.pipeline`
        when pipelined: then the next rollout is on its way when this returns)."""
        if self.ahead is not None:
            return self.ahead.next(it, self.config.train.iterations)
        rollout = gather.Rollout()
        with Progress("rollout", batches.micro_group_count(self.config, self.spec), "group") as bar:
            for part in self.runner.sample(it, self.stop.requested):  # collect,
                rollout.add(part, self.runner.score(part))  # and score each micro-group as it arrives
                bar.update(len(rollout.parts))
        return *rollout.finish(), {}

    def iteration(self, it: int) -> tuple[dict[str, float], list[dict[str, float]]]:
        """One iteration: its metrics, and those of each optimizer step."""
        t0, algorithm = time.time(), self.algorithm
        batch, stats, side = self.collect(it)
        metrics = {
            **gather.rollout_metrics(batch, stats, it),
            **self.trust.rollout_monitors(batch, it),
            **side,
        }
        batch = gather.scored_samples(batch)
        self.trust.rollout(len(batch), stats.errors)
        steps: list[dict[str, float]] = []
        if len(batch):
            signals = algorithm.postprocess_rewards(batch, batch.rewards)
            examples = algorithm.build_train_data(batch, signals, it)
            n_steps = self.config.rollout.num_steps_per_rollout if self.spec.online else 1
            chunks = batches.optimizer_steps(batch, examples, n_steps, self.config.run.seed, it)
            steps = self.runner.optimize(chunks)
            metrics.update(perf.mean_metrics(steps))
        metrics.update(self.runner.end_iteration())  # old policy update, weight sync
        metrics.update(perf.iteration_perf(metrics, stats, self.peak.update(metrics), t0))
        self.state.train_time_s += metrics["perf/iteration_time"]
        return metrics, steps

    def eval_point(self, step: int) -> None:
        if self.state.evaluated(step):  # e.g. a run resumed at its last step
            return
        t0 = time.time()
        result = self.runner.evaluate()
        if result is not None:
            seconds = time.time() - t0
            verdict = self.trust.after_eval(step, result)  # the watch gains, alarms, keep-best
            self.session.record_eval(step, result, seconds, verdict)

    def interrupted(self) -> Interrupted:
        """Save the last completed iteration (unless it is saved already) and say how to go on."""
        return self.session.interrupted(self.stop.name, self.step, self.start)
