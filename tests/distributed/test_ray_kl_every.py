"""``monitor.kl_every`` under runner=ray: the drift hook sits in the trainer ranks' shared
:meth:`~diffrl.train.actor.Actor.optimize`; each FSDP2 rank measures its own first micro-batch and
the run logs their mean weighted by rows. With one micro-batch per step, the ranks' shares together
are the rows the single process measures: the same number, to the tolerance of ``test_ray_runner``
(after an update the weights differ in the last float32 bits). (With several micro-batches per
step each rank's first is other rows than the single process's first: a mean over more rows.)"""

from __future__ import annotations

import pytest

from diffrl.launch import train
from tests.distributed.test_ray_runner import config, train_local

pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")


@pytest.mark.slow
def test_ray_ranks_measure_the_drift_as_one_process_does(tmp_path, ray_cluster):
    extra = {
        "monitor.kl_every": 1,
        "parallel.engines": 1,
        # one trained step per sample, 8 samples in one micro-batch: the ranks' 4 + 4 rows are the 8
        "algorithm.params": "{step_strategy: {name: sde_window, size: 1, range: [0, 6]}}",
        "train.micro_batch_size": 8,
    }
    local = train_local(config(tmp_path, "flow_grpo", "local", **extra)).history
    distributed = train(config(tmp_path, "flow_grpo", "ray", **extra)).history
    assert [m["monitor/kl_to_base"] for m in local][0] == 0.0  # before any update: the base itself
    for a, b in zip(local, distributed, strict=True):
        assert b["monitor/kl_to_base"] == pytest.approx(a["monitor/kl_to_base"], rel=1e-4, abs=1e-12)
    assert distributed[1]["monitor/kl_to_base"] > 0
