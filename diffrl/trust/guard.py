"""Stopping a run that wastes its compute, with an error that says why and what to do."""

from __future__ import annotations

from pathlib import Path

from diffrl.core.errors import RunStopped


class Guard:
    """Stops a run that is wasting its compute: every sample's reward failing for
    ``max_failed`` iterations in a row, or ``max_nonfinite`` optimizer steps in a row skipped for
    a non-finite loss or gradient; and a run that ends without a single optimizer step."""

    def __init__(self, max_failed: int, max_nonfinite: int, state: dict[str, int] | None = None):
        self.max_failed, self.max_nonfinite = max_failed, max_nonfinite
        self.failed_in_a_row = self.nonfinite_in_a_row = self.steps_taken = 0
        for key, value in (state or {}).items():  # a resumed run counts on where it stopped
            setattr(self, key, int(value))

    def state(self) -> dict[str, int]:
        """The counters, saved with checkpoints."""
        return {
            "failed_in_a_row": self.failed_in_a_row,
            "nonfinite_in_a_row": self.nonfinite_in_a_row,
            "steps_taken": self.steps_taken,
        }

    def rollout(self, usable: int, errors: list[str]) -> None:
        self.failed_in_a_row = 0 if usable else self.failed_in_a_row + 1
        if self.failed_in_a_row >= self.max_failed:
            why = errors[0] if errors else "no usable sample"
            raise RunStopped(
                f"every sample's reward failed in {self.failed_in_a_row} consecutive iterations "
                f"(train.max_failed_iterations={self.max_failed}); last error: {why}. Fix the reward "
                "(or raise its timeout_s if it timed out); no checkpoint was written for these iterations"
            )

    def optimized(self, steps: list[dict[str, float]], last_saved: Path | None) -> None:
        for m in steps:
            if m.get("train/skipped_nonfinite", 0.0):
                self.nonfinite_in_a_row += 1
            else:
                self.nonfinite_in_a_row = 0
                self.steps_taken += 1
            if self.nonfinite_in_a_row >= self.max_nonfinite:
                raise RunStopped(
                    f"{self.nonfinite_in_a_row} consecutive optimizer steps had a non-finite loss or "
                    f"gradient (train.max_nonfinite_steps={self.max_nonfinite}); skipped steps leave the "
                    f"weights unchanged. Last good checkpoint: {last_saved or 'none (none was written)'}. "
                    "Lower train.lr, set train.grad_clip, or check the reward's scale"
                )

    def finished(self, iterations: int) -> None:
        """``iterations``: how many this process ran (a run resumed at its end ran none)."""
        if iterations and not self.steps_taken:
            raise RunStopped(
                f"no optimizer step was taken in {iterations} iteration(s) (every step was skipped or "
                "had no usable sample): no 'final' checkpoint is written for an untrained model"
            )
