"""The CLIP diversity monitor end to end on the tiny world: a run with a CLIP-family reward logs
``monitor/clip_*`` (its CLIP by default) and ends with the same weights as the run without the
monitor; a bad ``monitor.clip`` folder is refused before anything loads (exit 2, one ``error:``
line), a folder whose weights cannot load at the first rollout likewise. Rows use
:class:`tests.integration.test_bad_inputs.Case` and run in process through :func:`diffrl.cli.main`."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save

from diffrl.launch import train
from diffrl.preflight import load_config
from diffrl.trust.monitors import clip_embedder
from tests.conftest import tiny_overrides
from tests.integration.test_bad_inputs import BAD, GRPO, Case, run_and_check
from tests.integration.test_hacking import HACKING
from tests.unit.rewards.tiny_clip import write_clip

CLIP_METRICS = {"monitor/clip_within_group_dist", "monitor/clip_across_prompt_dist"}
TINY = {
    **HACKING,
    "rollout.n_samples_per_prompt": 2,
    "rollout.micro_group_size": 4,
    "train.batch_size": 4,
    "train.micro_batch_size": 4,
    "sampling.num_steps": 2,
    "train.iterations": 2,
    "train.save_every": 0,
    "eval.enabled": "false",
}
"""The tiny world's GRPO run of test_hacking, smaller (2 prompts x 2 samples, 2 steps, 8 px), 2 iterations."""


def test_a_clip_reward_run_logs_the_clip_monitors_and_trains_the_same_weights(tmp_path):
    write_clip(tmp_path / "clip")
    reward = f"[{{name: clip_score, params: {{model: '{tmp_path}/clip'}}}}]"
    runs = {}
    for name, extra in (("on", {"monitor.clip_every": 1}), ("off", {})):  # opt-in: off by default
        overrides = tiny_overrides(tmp_path / name, **{**TINY, "rewards": reward, **extra})
        config = load_config("recipes/tiny_grpo_ocr_small.yaml", overrides)
        runs[name] = (config, train(config))
    clip_embedder.cache_clear()
    on_config, on = runs["on"]
    assert on_config.monitor.clip == f"{tmp_path}/clip"  # clip_every alone: the reward's CLIP
    for row in on.history:
        assert CLIP_METRICS <= row.keys()
        assert (
            0 <= row["monitor/clip_within_group_dist"] <= 2
            and 0 <= row["monitor/clip_across_prompt_dist"] <= 2
        )
    off_config, off = runs["off"]
    assert off_config.monitor.clip is None and not any(CLIP_METRICS & row.keys() for row in off.history)
    for a, b in zip(on.history, off.history, strict=True):  # every other metric as it was
        assert {k: v for k, v in a.items() if k not in CLIP_METRICS and not k.startswith("perf/")} == {
            k: v for k, v in b.items() if not k.startswith("perf/")
        }
    weights_on, weights_off = (load_file(str(r.checkpoint / "trainable.safetensors")) for r in (on, off))
    assert weights_on.keys() == weights_off.keys()
    assert all(torch.equal(weights_on[k], weights_off[k]) for k in weights_on)


CLIP = {
    "clip/config.json": '{"model_type": "clip"}',
    "clip/model.safetensors": save({"w": torch.zeros(1)}),
    "clip/preprocessor_config.json": "{}",
}
"""What preflight checks of a CLIP folder (the weights only load later)."""
MONITOR = "monitor.clip={tmp}/clip"
TRAINS = [f"{k}={v}" for k, v in TINY.items()] + ["train.iterations=1", "run.output_dir={tmp}/run"]

# fmt: off
CASES: list[Case] = [
    Case("monitor-clip-missing", ["train", GRPO, "monitor.clip={tmp}/nowhere"], BAD, "monitor.clip: '{tmp}/nowhere' is not a folder; give the path of a local CLIPModel folder"),
    Case("monitor-clip-config-not-json", ["train", GRPO, MONITOR], BAD, "monitor.clip: the model's config '{tmp}/clip/config.json' is not valid JSON", files={**CLIP, "clip/config.json": '{"model_type": '}),
    Case("monitor-clip-not-a-clip", ["train", GRPO, MONITOR], BAD, "monitor.clip: '{tmp}/clip' holds a 'bert' model, not a CLIPModel", files={**CLIP, "clip/config.json": '{"model_type": "bert"}'}),
    Case("monitor-clip-no-weights", ["train", GRPO, MONITOR], BAD, "monitor.clip: '{tmp}/clip' has a config.json but no weights", files={k: v for k, v in CLIP.items() if "safetensors" not in k}),
    Case("monitor-clip-no-processor", ["train", GRPO, MONITOR], BAD, "monitor.clip: '{tmp}/clip' has no preprocessor_config.json", files={k: v for k, v in CLIP.items() if "preprocessor" not in k}),
    Case("monitor-clip-processor-missing", ["train", GRPO, MONITOR, "monitor.clip_processor={tmp}/nowhere"], BAD, "monitor.clip_processor: '{tmp}/nowhere' is not a folder", files=CLIP),
    Case("monitor-clip-device", ["train", GRPO, "monitor.clip_device=tpu"], BAD, "monitor.clip_device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    Case("monitor-clip-every-negative", ["train", GRPO, "monitor.clip_every=-1"], BAD, "monitor.clip_every"),
    Case("monitor-clip-weights-corrupt", ["train", GRPO, MONITOR, *TRAINS], BAD, "reward 'monitor.clip': could not load a CLIPModel from '{tmp}/clip'", files={**CLIP, "clip/model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{broken"}, trains=True),
]
# fmt: on


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_monitor_clip_row(case: Case, tmp_path, request, capsys, monkeypatch):
    run_and_check(case, tmp_path, request, capsys, monkeypatch)
