"""Diffusion-DPO end to end on a random tiny model: one online iteration with LoRA (pairs from a
rollout; the reference is the model with its adapter disabled) and one offline full fine-tune
iteration (a pair folder of PNGs; the reference is a frozen copy)."""

import json

from PIL import Image

from diffrl.launch import train
from diffrl.preflight import load_config
from tests.conftest import SMALL_ROLLOUT, tiny_overrides

REWARD = "tests.rewards:brightness"
FAST = {
    "train.iterations": 1,
    "model.lora": "{rank: 4}",
    "eval.enabled": "false",
    "sampling.num_steps": 2,
}


def test_online_dpo_iteration(tmp_path):
    cfg = load_config(
        "recipes/tiny_dpo_ocr.yaml",
        tiny_overrides(tmp_path, **FAST, **SMALL_ROLLOUT, rewards=f"[{{name: {REWARD}}}]"),
    )
    (row,) = train(cfg).history
    # brightness differs between samples: every prompt group gives a pair
    assert row["train/dpo_pairs"] == 2 and row["train/dpo_skipped_groups"] == 0
    # the first update starts at the reference: z = 0, loss = log 2
    assert abs(row["train/dpo_loss"] - 0.6931) < 1e-3 and row["train/reward_margin"] == 0.0
    assert row["train/pair_reward_gap"] > 0
    assert row["train/grad_norm"] > 0 and row["train/skipped_nonfinite"] == 0


def test_offline_dpo_iteration(tmp_path):
    folder = tmp_path / "pairs"
    folder.mkdir()
    rows = []
    for i, prompt in enumerate(['the number "1"', 'the number "2"']):
        Image.new("RGB", (64, 32), (255, 255, 255)).save(folder / f"{i}_w.png")
        Image.new("RGB", (48, 24), (40 * i, 0, 0)).save(folder / f"{i}_l.png")  # resized on load
        rows.append(json.dumps({"prompt": prompt, "chosen": f"{i}_w.png", "rejected": f"{i}_l.png"}))
    (folder / "metadata.jsonl").write_text("\n".join(rows) + "\n")
    overrides = {
        **FAST,
        "model.lora": "null",
        "algorithm.params": "{pairs: offline, beta: 100.0}",
        "data.dataset": str(folder),
        "train.batch_size": 2,
        "rewards": "[]",  # offline pairs take no reward and draw no rollouts: the recipe's are refused
        "rollout": "{}",
    }
    cfg = load_config("recipes/tiny_dpo_ocr.yaml", tiny_overrides(tmp_path, **overrides))
    (row,) = train(cfg).history
    # no reward is loaded: offline pairs need none
    assert row["train/dpo_pairs"] == 2 and "train/pair_reward_gap" not in row
    assert abs(row["train/dpo_loss"] - 0.6931) < 1e-3
    assert row["train/grad_norm"] > 0 and row["train/skipped_nonfinite"] == 0
