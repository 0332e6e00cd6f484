"""``run.loggers: [wandb]``: a Weights & Biases run, its local files in ``RUN_DIR/wandb``. Needs the
``wandb`` package (``pip install 'diffrl[wandb]'``) and ``wandb login``, or ``WANDB_MODE=offline``
(no network: ``RUN_DIR/wandb/offline-run-*``, uploaded later with ``wandb sync``).

The W&B run's id is diffrl's run id (``run.json``) and it starts with ``resume="allow"``, so every
process of a resumed run logs into the same W&B run; ``run.wandb_project`` is its project, and
``run.name`` its name. Every metric of a step is logged at that step, each eval grid an image
(``eval/grid``); the resolved config is the W&B run's config, the batch arithmetic its notes.
W&B keeps a run's steps increasing: a run resumed from an earlier checkpoint than its last step
logs again only past the last step W&B has (an online run's W&B says so in a warning).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import wandb

from diffrl.logging.trackers import TrackerRun


def wandb_id(run_id: str) -> str:
    """diffrl's run id as a W&B run id (W&B refuses ``/ \\ # ? % :`` and ids over 64 characters)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:64] or "diffrl"


class WandbTracker:
    def __init__(self, run: TrackerRun):
        run.run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=run.project,
            name=run.name,
            id=wandb_id(run.run_id),
            resume="allow",
            dir=str(run.run_dir),  # W&B writes into DIR/wandb
        )

    def log_scalars(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_image(self, step: int, name: str, image_path: Path) -> None:
        self.run.log({name: wandb.Image(str(image_path))}, step=step)

    def log_metadata(self, config: dict[str, Any], text: str) -> None:
        self.run.config.update(config, allow_val_change=True)  # a resumed run may change some keys
        self.run.notes = text

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)  # a failed or stopped run shows as failed
