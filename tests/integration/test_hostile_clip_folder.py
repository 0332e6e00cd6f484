"""A CLIP reward folder whose image processor settings no loader can read is refused at validation
(exit 2, one ``error:`` line naming the param and the file), while a folder transformers 5 saved
(``processor_config.json`` with an ``image_processor`` section, no ``preprocessor_config.json``) is
accepted: tests/unit/rewards/test_clip_processor_folder.py. Rows use
:class:`tests.integration.test_bad_inputs.Case` and run in process through :func:`diffrl.cli.main`."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save

from tests.integration.test_bad_inputs import BAD, GRPO, Case, run_and_check

CLIP_REWARD = "rewards=[{name: clip_score, params: {model: '{tmp}/clip'}}]"
CLIP = {
    "clip/config.json": '{"model_type": "clip"}',
    "clip/model.safetensors": save({"w": torch.zeros(1)}),
    "clip/tokenizer.json": "{}",
}
"""What preflight checks of a CLIP folder besides its image processor settings."""

# fmt: off
CASES: list[Case] = [
    Case("clip-processor-config-without-image-section", ["train", GRPO, CLIP_REWARD], BAD, "rewards[0] (clip_score).params: model: '{tmp}/clip' has no preprocessor_config.json (nor a processor_config.json with an image_processor section", files={**CLIP, "clip/processor_config.json": '{"processor_class": "CLIPProcessor"}'}),
    Case("clip-processor-config-image-section-a-string", ["train", GRPO, CLIP_REWARD], BAD, "model: the image_processor section of '{tmp}/clip/processor_config.json' is not a JSON object", files={**CLIP, "clip/processor_config.json": '{"image_processor": "CLIPImageProcessor"}'}),
    Case("clip-processor-config-not-json", ["train", GRPO, CLIP_REWARD], BAD, "model: the processor config '{tmp}/clip/processor_config.json' is not valid JSON", files={**CLIP, "clip/processor_config.json": "{image_processor"}),
]
# fmt: on


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_clip_folder_row(case: Case, tmp_path, request, capsys, monkeypatch):
    run_and_check(case, tmp_path, request, capsys, monkeypatch)
