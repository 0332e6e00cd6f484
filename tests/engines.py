"""Rollout engines the tests name by dotted path (``rollout.engine: tests.engines:...``)."""

from __future__ import annotations

import torch

from diffrl.core.rollout import RolloutBatch
from diffrl.sampling.collector import OnlineCollector

SHIFT = (1.0, -0.25)
"""log π − log μ of :class:`MisalignedLogProbs`' even and odd samples."""


class MisalignedLogProbs(OnlineCollector):
    """The built-in engine, but the log-probs it records are those of another policy μ: lower by
    1.0 for even samples, higher by 0.25 for odd ones (as an engine with other kernels or precision
    would record), so that the trainer's replay π has log π − log μ = :data:`SHIFT`."""

    def _sample(self, chunk, micro_group, rollout_id, steps, module) -> RolloutBatch:
        part = super()._sample(chunk, micro_group, rollout_id, steps, module)
        shift = torch.tensor(SHIFT)[part.sample_index % 2].to(part.traj_log_prob.dtype)
        part.traj_log_prob = part.traj_log_prob - shift[:, None]
        return part
