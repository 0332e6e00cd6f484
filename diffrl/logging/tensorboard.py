"""``run.loggers: [tensorboard]``: event files in ``RUN_DIR/tensorboard`` (``tensorboard --logdir
RUN_DIR/tensorboard``). Needs the ``tensorboard`` package (``pip install 'diffrl[tensorboard]'``).

Every metric a step logs is a scalar under its own name (``train/loss``, ``eval/reward_mean``),
each eval grid an image (``eval/grid``), the config and the batch arithmetic text (tab "Text").
A resumed run's writer purges the events an earlier process wrote after the checkpoint
(``purge_step``), so no step shows twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image
from torch.utils.tensorboard import SummaryWriter

from diffrl.logging.trackers import TrackerRun


class TensorBoardTracker:
    def __init__(self, run: TrackerRun):
        self.log_dir = run.run_dir / "tensorboard"
        self.first_step = run.first_step
        # purge_step writes a restart marker: TensorBoard hides what older files hold from that
        # step on (a new run in a folder an earlier attempt left: from step 0)
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=run.first_step)

    def log_scalars(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def log_image(self, step: int, name: str, image_path: Path) -> None:
        with Image.open(image_path) as image:
            pixels = np.asarray(image.convert("RGB"))  # (H, W, 3) uint8
        self.writer.add_image(name, pixels, global_step=step, dataformats="HWC")

    def log_metadata(self, config: dict[str, Any], text: str) -> None:
        # TensorBoard renders text as Markdown: indented four spaces, it shows as code
        self.writer.add_text("config", _code(yaml.safe_dump(config, sort_keys=False)), self.first_step)
        self.writer.add_text("batch_arithmetic", _code(text), self.first_step)

    def close(self, ok: bool) -> None:
        self.writer.close()


def _code(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
