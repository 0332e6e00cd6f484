"""The one schedule of evals and checkpoints."""

from __future__ import annotations

from dataclasses import dataclass

from diffrl.config import TrainConfig


@dataclass(frozen=True)
class Due:
    """What follows the iteration just finished."""

    last: bool
    """The run ends here (``train.iterations`` reached or the time budget spent): eval and save
    ``final``."""
    eval: bool
    save: bool


def due_after(t: TrainConfig, step: int, train_time_s: float) -> Due:
    """The one schedule of evals and checkpoints: every ``eval_every`` / ``save_every`` iterations,
    and both at the end (``train_time_s``: this process's training time, for the budget)."""
    budget = t.time_budget_minutes * 60 if t.time_budget_minutes else float("inf")
    last = step >= t.iterations or train_time_s >= budget
    return Due(
        last=last,
        eval=last or bool(t.eval_every and step % t.eval_every == 0),
        save=last or bool(t.save_every and step % t.save_every == 0),
    )
