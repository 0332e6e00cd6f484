"""What the driver keeps between iterations and in checkpoints, what a run returns, and the
error a stopped run ends with."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffrl.core.errors import Interrupted
from diffrl.evaluation.evaluate import EvalResult, eval_grid_path
from diffrl.logging import MetricsLogger
from diffrl.train.run_folder import write_atomic


@dataclass
class TrainResult:
    output_dir: Path
    checkpoint: Path
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)


@dataclass
class LoopState:
    """What a checkpoint keeps for the driver (``checkpoint.json``'s ``loop``, beside the run's
    trust, :meth:`diffrl.trust.trust.Trust.state`), so a resumed run goes on where it stopped: the
    eval history and the training time so far."""

    evals: list[dict[str, float]]
    train_time_s: float

    @classmethod
    def resumed(cls, info: dict[str, Any] | None) -> LoopState:
        loop = info["loop"] if info else {}
        return cls(list(loop.get("evals", [])), float(loop.get("train_time_s", 0.0)))

    def saved(self, final: bool) -> dict[str, Any]:
        return {"evals": self.evals, "train_time_s": self.train_time_s, "final": final}

    def evaluated(self, step: int) -> bool:
        """Whether the eval of ``step`` is done (e.g. a run resumed at its last step)."""
        return any(e["step"] == step for e in self.evals)

    def record_eval(
        self,
        step: int,
        result: EvalResult,
        out: Path,
        grid_images: int,
        logger: MetricsLogger,
        seconds: float | None = None,
    ) -> None:
        """Keep an eval point: its grid image (each sample captioned with its prompt and reward),
        its metrics (logged, the grid too) and ``eval_curve.json``; ``seconds``: how long the eval
        took (``perf/eval_time``)."""
        grid = result.save_grid(eval_grid_path(out, step), grid_images)
        logger.log_image(step, "eval/grid", grid)
        metrics = result.metrics()
        if seconds is not None:
            metrics["perf/eval_time"] = seconds
        logger.log(step, metrics)
        self.evals.append({"step": step, "train_time_s": round(self.train_time_s, 2), **metrics})
        write_atomic(out / "eval_curve.json", json.dumps(self.evals, indent=1))


def interrupted_error(signal_name: str, step: int, saved: Path | None) -> Interrupted:
    """The error a stopped run ends with: where it stopped and how to go on."""
    if saved is None:
        return Interrupted(f"{signal_name} received before the first iteration finished: nothing to save")
    return Interrupted(
        f"{signal_name} received: stopped after iteration {step}, checkpoint {saved}; continue with "
        "the same command and train.resume=latest",
        str(saved),
    )
