"""Every bad input gets a clear error: the bad value and the fix, an exit code, no traceback.

One table, :data:`CASES`: each row is the argv of ``diffrl`` (after any files it needs are made in
``tmp_path``), the exit code and a piece of the message. Append rows for new failure modes
(checkpoint corruption, resume, reward failures): ``{tmp}`` in an argument is the row's
``tmp_path``; ``{ckpt}`` is a private copy of a tiny trained checkpoint at ``{tmp}/ckpt``, which
``prepare`` may damage or edit first. Rows run in-process through :func:`diffrl.cli.main` (fast);
those marked ``in_subprocess`` run ``python -m diffrl.cli`` to show no traceback reaches a terminal.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from diffrl.core.errors import EXIT_BUG, EXIT_RUN_STOPPED, EXIT_USER_ERROR
from diffrl.train.run_folder import RunFolder
from tests.conftest import TINY_RUN, overrides, rehash_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SFT = "recipes/tiny_sft.yaml"
GRPO = "recipes/tiny_grpo_ocr_small.yaml"
DPO = "recipes/tiny_dpo_ocr.yaml"
OFFLINE_DPO = [
    "algorithm.params={pairs: offline}",
    "data.dataset={tmp}/pairs",
    "rewards=[]",
]
BAD = EXIT_USER_ERROR
PNG = bytes.fromhex(  # a 1 x 1 PNG: an image the dataset scan finds (it decodes nothing)
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082"
)


def training_reward_not_installed(tmp: Path) -> None:
    """The checkpoint's run trained with a reward from the user's own package, absent here."""
    config_file = tmp / "ckpt" / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["rewards"] = [{"name": "brightrew:score"}]
    config_file.write_text(yaml.safe_dump(config))
    rehash_checkpoint(tmp / "ckpt")


def no_config_yaml(tmp: Path) -> None:
    (tmp / "ckpt" / "config.yaml").unlink()
    info = json.loads((tmp / "ckpt" / "checkpoint.json").read_text())
    del info["files"]["config.yaml"]
    (tmp / "ckpt" / "checkpoint.json").write_text(json.dumps(info))


def truncate_trainable(tmp: Path) -> None:
    f = tmp / "ckpt" / "trainable.safetensors"
    f.write_bytes(f.read_bytes()[:64])


def corrupt_checkpoint_json(tmp: Path) -> None:
    f = tmp / "ckpt" / "checkpoint.json"
    f.write_text(f.read_text()[:40])


def foreign_file(tmp: Path) -> None:  # a file of another checkpoint dropped into this one
    (tmp / "ckpt" / "old_policy.safetensors").write_bytes(b"{}")


def remove_optimizer(tmp: Path) -> None:
    (tmp / "ckpt" / "optimizer.safetensors").unlink()


_HELD: list[RunFolder] = []


def hold_lock(tmp: Path) -> None:
    """Another process trains into {tmp}/run (a second open of the lock file conflicts as one would)."""
    folder = RunFolder(tmp / "run")
    folder.acquire()
    _HELD.append(folder)


def always_fails(images, prompts, metadata):
    raise RuntimeError("scorer unavailable")


def nan_scores(images, prompts, metadata):
    return [float("nan")] * len(prompts)


def hangs(images, prompts, metadata):
    threading.Event().wait()  # never returns


# a tiny random-model NFT run of 4 iterations (a few seconds), for the rows that must really train
NFT = "recipes/tiny_nft_ocr.yaml"
SHORT = ["run.output_dir={tmp}/run", *overrides(TINY_RUN), "train.iterations=4", "eval.enabled=false"]
HERE = "tests.integration.test_bad_inputs"
BOMB = "train:\n  a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  {b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefg", "bcdefgh")
)
"""A YAML alias bomb: 400 bytes that stand for 9^8 values (what ``yaml.safe_load`` builds as
shared lists in no time, and any walk or repr of it expands)."""
DEEP = "train: " + "[" * 5000 + "]" * 5000 + "\n"


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    code: int
    message: str
    """A substring of stderr (of stdout when ``code`` is 0)."""
    files: dict[str, str | bytes] = field(default_factory=dict)
    """Made in ``tmp_path`` first: relative path -> text or bytes; a path ending in ``/`` is a folder."""
    prepare: Callable[[Path], None] | None = None
    """Called with ``tmp_path`` after the files (and the ``{ckpt}`` copy) are made."""
    absent: str | None = None
    """A substring the output must not contain (e.g. a check this command must not make)."""
    in_subprocess: bool = False
    needs_no_gpu: bool = False
    """The row expects no CUDA GPU on this machine (skipped where there is one)."""
    trains: bool = False
    """The row reaches the training driver (resume and run-folder checks, runs that stop
    themselves); other in-process rows are refused if they get that far."""
    warns: str | None = None
    """A warning the row provokes on purpose (a regex of its message), asserted in process."""


CKPT_SETTINGS = [
    "model.path=random",
    "train.batch_size=2",
    "train.micro_batch_size=2",
    "eval.enabled=false",
    "data.dataset_size=4",
]
"""The settings ``tiny_checkpoint`` was trained with (on tiny_sft.yaml): a resume that changes none of them."""

DROPPED = r"sample\(s\) dropped: reward 'tests.integration.test_bad_inputs:"
"""The warning of an iteration whose reward failed on purpose (the run goes on until it stops itself)."""

# one row a line: the table reads down its columns
# fmt: off
CASES: list[Case] = [
    # ---- optimizer and schedule numbers: NaN, inf and out-of-range values, all before anything loads
    Case("lr-nan", ["train", SFT, "train.lr=nan"], BAD, "train.lr must be in (0, 1] (e.g. 1e-4), got nan", in_subprocess=True),
    Case("lr-inf", ["train", SFT, "train.lr=.inf"], BAD, "train.lr must be in (0, 1]"),
    Case("lr-huge", ["train", SFT, "train.lr=1e30"], BAD, "train.lr must be in (0, 1] (e.g. 1e-4), got 1e+30"),
    Case("lr-zero", ["train", SFT, "train.lr=0"], BAD, "train.lr must be in (0, 1]"),
    Case("lr-not-a-number", ["train", SFT, "train.lr=fast"], BAD, "train.lr: expected a number, got 'fast'"),
    Case("weight-decay-negative", ["train", SFT, "train.weight_decay=-0.1"], BAD, "train.weight_decay must be in [0, 1]"),
    Case("adam-beta-one", ["train", SFT, "train.adam_betas=[0.9, 1.0]"], BAD, "train.adam_betas[1] must be in [0, 1)"),
    Case("adam-betas-scalar", ["train", SFT, "train.adam_betas=0.9"], BAD, "train.adam_betas: expected a list"),
    Case("adam-eps-zero", ["train", SFT, "train.adam_eps=0"], BAD, "train.adam_eps must be in (0, 1)"),
    Case("ema-decay-one", ["train", SFT, "train.ema_decay=1.0"], BAD, "train.ema_decay must be in (0, 1) (e.g. 0.99, or null for no EMA), got 1.0"),
    Case("grad-clip-inf", ["train", SFT, "train.grad_clip=.inf"], BAD, "train.grad_clip must be in (0, 1e6] (a max gradient norm, or null for none), got inf"),
    Case("time-budget-negative", ["train", SFT, "train.time_budget_minutes=-5"], BAD, "train.time_budget_minutes must be in (0, 1e7] (or null for none), got -5.0"),
    Case("save-every-negative", ["train", SFT, "train.save_every=-1"], BAD, "train.save_every must be in [0, 1_000_000_000] (0: none), got -1"),
    Case("log-every-zero", ["train", SFT, "run.log_every=0"], BAD, "run.log_every must be in [1, 1_000_000_000] (print every N iterations), got 0"),
    Case("seed-beyond-torch", ["train", SFT, f"run.seed={2**70}"], BAD, "run.seed must be in [-2**63, 2**64 - 1]"),
    Case("micro-batch-not-a-divisor", ["train", SFT, "train.batch_size=10", "train.micro_batch_size=4"], BAD, "e.g. set train.micro_batch_size=2"),
    Case("iterations-zero", ["train", SFT, "train.iterations=0"], BAD, "train.iterations must be in [1, 1_000_000_000], got 0"),
    # ---- sampling
    Case("guidance-nan", ["train", SFT, "sampling.guidance_scale=.nan"], BAD, "sampling.guidance_scale must be in [0, 100] (or null for the family's), got nan"),
    Case("guidance-below-one", ["train", SFT, "sampling.guidance_scale=0.5"], BAD, "(1 disables the family's CFG; e.g. 4.5)"),
    Case("shift-zero", ["train", SFT, "sampling.shift=0"], BAD, "sampling.shift must be in (0, 100]"),
    Case("num-steps-zero", ["train", SFT, "sampling.num_steps=0"], BAD, "sampling.num_steps must be in [1, 1000], got 0"),
    Case("height-not-a-multiple", ["train", SFT, "sampling.height=30"], BAD, "multiples of 4 (its patch size 4); e.g. sampling.height=28 or 32"),
    Case("width-too-large", ["train", SFT, "sampling.width=128"], BAD, "at most 64 pixels (its position embedding spans 16 patches"),
    Case("height-zero", ["train", SFT, "sampling.height=0"], BAD, "sampling.height must be in [1, 16384] (pixels, or null for the family's default), got 0"),
    # ---- model
    Case("family-unknown", ["train", SFT, "model.family=tinyy"], BAD, "unknown model family 'tinyy'. Did you mean 'tiny'?"),
    Case("family-not-a-family", ["train", SFT, "model.family=os:getcwd"], BAD, "'os:getcwd' is not a ModelFamily subclass"),
    Case("dtype-unknown", ["train", SFT, "model.dtype=fp8"], BAD, "model.dtype: 'fp8' is not one of"),
    Case("model-path-missing", ["train", SFT, "model.path={tmp}/nowhere"], BAD, "is not a directory (use 'base', 'random' or a local diffusers folder)"),
    Case("model-path-not-a-model", ["train", SFT, "model.path={tmp}/folder"], BAD, "is not a tiny model folder (no transformer/ inside)", files={"folder/": ""}),
    Case("model-option-unknown", ["train", SFT, "model.options={gradient_checkpoint: true}"], BAD, "Did you mean 'gradient_checkpointing'?"),
    Case("lora-rank-zero", ["train", SFT, "model.lora={rank: 0}", "model.options={}"], BAD, "model.lora.rank must be in [1, 4096], got 0"),
    Case("lora-alpha-negative", ["train", SFT, "model.lora={rank: 4, alpha: -1}", "model.options={}"], BAD, "model.lora.alpha must be in (0, 1e6] (e.g. twice the rank), got -1.0"),
    Case("lora-dropout-one", ["train", SFT, "model.lora={rank: 4, dropout: 1.0}", "model.options={}"], BAD, "model.lora.dropout must be in [0, 1)"),
    Case("lora-target-typo", ["train", GRPO, "model.lora.target_modules=[attn.to_qq]"], BAD, "'attn.to_qq' matches no module of the tiny transformer"),
    Case("lora-yaml-without-space", ["train", GRPO, "model.lora={rank:4}"], BAD, "YAML needs a space after the colon: write {rank: ...}"),
    Case("device-unknown", ["train", SFT, "run.device=gpu"], BAD, "run.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    Case("device-cuda-without-gpu", ["train", SFT, "run.device=cuda"], BAD, "run.device=cuda, but torch sees no CUDA GPU", needs_no_gpu=True),
    Case("ray-cuda-without-gpu", ["train", GRPO, "runner=ray", "run.device=cuda"], BAD, "run.device=cuda, but torch sees no CUDA GPU", needs_no_gpu=True),
    # ---- algorithm, rollout, rewards
    Case("algorithm-unknown", ["train", SFT, "algorithm.name=flow_grp"], BAD, "unknown algorithm 'flow_grp'. Did you mean 'flow_grpo'?"),
    Case("algorithm-params-not-a-mapping", ["train", SFT, "algorithm.params=[1, 2]"], BAD, "algorithm.params: expected a mapping, got [1, 2]"),
    Case("algorithm-param-unknown", ["train", SFT, "algorithm.params.cond_drop=0.1"], BAD, "Did you mean 'cond_dropout'?"),
    Case("rollout-batch-zero", ["train", GRPO, "rollout.batch_size=0"], BAD, "rollout.batch_size must be in [1, 65536], got 0"),
    Case("batch-arithmetic", ["train", GRPO, "rollout.n_samples_per_prompt=6"], BAD, "they must be equal; e.g. set train.batch_size=48"),
    Case("step-window-beyond-schedule", ["train", GRPO, "sampling.num_steps=4"], BAD, "does not fit a schedule of 4 steps"),
    Case("reward-missing", ["train", GRPO, "rewards=[]"], BAD, "algorithm 'flow_grpo' needs a reward; add a 'rewards:' list"),
    Case("reward-unknown", ["train", GRPO, "rewards=[{name: ocrr}]"], BAD, "unknown reward 'ocrr'. Did you mean 'ocr'?"),
    Case("reward-as-string", ["train", GRPO, "rewards=[ocr]"], BAD, "rewards[0]: expected a mapping, got 'ocr'; e.g. {name: ocr}"),
    Case("reward-module-not-installed", ["train", GRPO, "rewards=[{name: 'brightrew:score'}]"], BAD, "cannot import module 'brightrew'"),
    Case("reward-weight-nan", ["train", GRPO, "rewards=[{name: ocr, weight: .nan}]"], BAD, "rewards[0].weight must be in [-1e6, 1e6] (e.g. 1.0), got nan"),
    Case("reward-timeout-zero", ["train", GRPO, "rewards=[{name: ocr, timeout_s: 0}]"], BAD, "rewards[0].timeout_s must be in (0, 604800] (seconds, at most a week), got 0"),
    Case("reward-param-misspelt", ["train", GRPO, "rewards=[{name: ocr, params: {num_worker: 2}}]"], BAD, "rewards[0] (ocr).params: unknown param 'num_worker'. Did you mean 'num_workers'?"),
    Case("reward-weights-missing", ["train", GRPO, "rewards=[{name: pickscore, params: {model: '{tmp}/nowhere'}}]"], BAD, "rewards[0] (pickscore).params: model: reward 'pickscore' needs PickScore_v1 (a CLIPModel) in a local folder; "),
    Case("reward-weights-of-another-model", ["train", GRPO, "rewards=[{name: clip_score, params: {model: '{tmp}/t5'}}]"], BAD, "holds a 't5' model; reward 'clip_score' expects", files={"t5/config.json": '{"model_type": "t5"}'}),
    Case("reward-server-down", ["train", GRPO, "rewards=[{name: remote, params: {url: 'http://127.0.0.1:9'}}]"], BAD, "rewards[0] (remote).params: url: no reward server answers at http://127.0.0.1:9"),
    # ---- run folder and cluster
    Case("output-dir-is-a-file", ["train", SFT, "run.output_dir={tmp}/out"], BAD, "run.output_dir is a file; set run.output_dir", files={"out": "x"}),
    Case("output-dir-under-a-file", ["train", SFT, "run.output_dir={tmp}/out/run"], BAD, "run.output_dir's parent", files={"out": "x"}),
    Case("ray-address-unreachable", ["train", GRPO, "runner=ray", "ray.address=127.0.0.1:1"], BAD, "nothing accepts connections at 127.0.0.1:1"),
    Case("ray-address-malformed", ["train", GRPO, "runner=ray", "ray.address=headnode"], BAD, "or HOST:PORT of a cluster's head (e.g. 10.0.0.5:6379), got 'headnode'"),
    Case("ray-engines-zero", ["train", GRPO, "runner=ray", "parallel.engines=0"], BAD, "parallel.engines must be in [1, 4096], got 0"),
    # ---- prompt files
    Case("prompts-binary", ["train", GRPO, "data.prompts={tmp}/p.txt"], BAD, "is not UTF-8 text (line 1, column 1: byte 0xff)", files={"p.txt": b"\xff\xfe\x00\x01binary"}),
    Case("prompts-nul-bytes", ["train", GRPO, "data.prompts={tmp}/p.txt"], BAD, "holds NUL bytes: not a text file", files={"p.txt": b"a\x00b\n"}),
    Case("prompts-folder", ["train", GRPO, "data.prompts={tmp}/prompts"], BAD, "is a folder; give a .txt file (one prompt a line)", files={"prompts/": ""}),
    Case("prompts-missing", ["train", GRPO, "data.prompts={tmp}/none.txt"], BAD, "none.txt' does not exist"),
    Case("prompts-empty", ["train", GRPO, "data.prompts={tmp}/p.txt"], BAD, "holds no prompts", files={"p.txt": ""}),
    Case("prompts-blank-line", ["train", GRPO, "data.prompts={tmp}/p.txt"], BAD, "line 2: empty prompt line (remove it)", files={"p.txt": "a\n\nb\n"}),
    Case("prompts-bad-jsonl", ["train", GRPO, "data.prompts={tmp}/p.jsonl"], BAD, "line 2: not valid JSON", files={"p.jsonl": '{"prompt": "a"}\n{oops}\n'}),
    Case("prompts-jsonl-no-prompt", ["train", GRPO, "data.prompts={tmp}/p.jsonl"], BAD, 'line 1: expected {"prompt"', files={"p.jsonl": '{"text": "a"}\n'}),
    Case("prompts-json-not-jsonl", ["train", GRPO, "data.prompts={tmp}/p.json"], BAD, "name the file .jsonl", files={"p.json": '["a", "b"]'}),
    Case("sft-prompts-checked-too", ["train", SFT, "data.prompts={tmp}/none.txt"], BAD, "data.prompts: prompt file"),
    # ---- offline datasets
    Case("dataset-without-captions", ["train", SFT, "data.dataset={tmp}/images"], BAD, "have no caption (e.g. a.png); add NAME.txt", files={"images/a.png": PNG}),
    Case("dataset-no-images", ["train", SFT, "data.dataset={tmp}/images"], BAD, "holds no images", files={"images/": ""}),
    Case("dataset-is-a-file", ["train", SFT, "data.dataset={tmp}/a.png"], BAD, "is a file; give a folder of images", files={"a.png": PNG}),
    Case("dataset-missing", ["train", SFT, "data.dataset={tmp}/nowhere"], BAD, "nowhere' does not exist; give a folder of images with captions", absent="neither"),
    Case("dataset-bad-metadata", ["train", SFT, "data.dataset={tmp}/images"], BAD, 'are not {"file_name": ..., "text": ...} objects', files={"images/a.png": PNG, "images/metadata.jsonl": "[1]\n"}),
    Case("dataset-caption-not-text", ["train", SFT, "data.dataset={tmp}/images"], BAD, "are not text (e.g. a.png (caption 5)); a caption is a UTF-8 string", files={"images/a.png": PNG, "images/metadata.jsonl": '{"file_name": "a.png", "text": 5}\n'}),
    Case("dataset-size-zero", ["train", SFT, "data.dataset_size=0"], BAD, "data.dataset_size must be in [1, 10_000_000] (or null for one example per prompt), got 0"),
    Case("sft-without-dataset", ["train", SFT, "data.dataset=null"], BAD, "set data.dataset (synthetic_text or a folder"),
    Case("dpo-one-sample-per-prompt", ["train", DPO, "rollout.n_samples_per_prompt=1", "rollout.batch_size=64"], BAD, "online DPO pairs each prompt's best and worst sample: rollout.n_samples_per_prompt must be >= 2, got 1"),
    Case("dpo-offline-image-folder", ["train", DPO, "algorithm.params={pairs: offline}"], BAD, "set data.dataset to the folder"),
    Case("dpo-pairs-row-lacks-a-field", ["train", DPO, *OFFLINE_DPO], BAD, "line 2: no 'rejected' field", files={"pairs/a.png": PNG, "pairs/b.png": PNG, "pairs/metadata.jsonl": '{"prompt": "a", "chosen": "a.png", "rejected": "b.png"}\n{"prompt": "a", "chosen": "a.png"}\n'}),
    Case("dpo-pairs-image-missing", ["train", DPO, *OFFLINE_DPO], BAD, "line 1: field 'chosen': image 'gone.png' not found", files={"pairs/b.png": PNG, "pairs/metadata.jsonl": '{"prompt": "a", "chosen": "gone.png", "rejected": "b.png"}\n'}),
    Case("dpo-pairs-bad-json", ["train", DPO, *OFFLINE_DPO], BAD, "line 1: not valid JSON", files={"pairs/metadata.jsonl": '{"prompt": "a",\n'}),
    # ---- recipes and overrides
    Case("recipe-missing", ["train", "{tmp}/missing.yaml"], BAD, "missing.yaml' does not exist", in_subprocess=True),
    Case("recipe-folder", ["train", "{tmp}"], BAD, "is a folder; give a recipe .yaml file"),
    Case("recipe-binary", ["train", "{tmp}/r.yaml"], BAD, "not a text file (byte 0 is not UTF-8)", files={"r.yaml": b"\x89PNG\r\n\x1a\n\x00"}, in_subprocess=True),
    Case("recipe-a-list", ["train", "{tmp}/r.yaml"], BAD, "the top level must be a mapping of sections, got list", files={"r.yaml": "- train\n- eval\n"}),
    Case("recipe-bad-yaml", ["train", "{tmp}/r.yaml"], BAD, "not valid YAML", files={"r.yaml": "train: [1, 2\n"}),
    Case("unknown-key", ["train", SFT, "train.itterations=3"], BAD, "unknown key 'train.itterations'. Did you mean 'iterations'?"),
    Case("section-not-a-mapping", ["train", SFT, "train=5"], BAD, "train: expected a mapping, got 5"),
    Case("override-without-key", ["train", SFT, "=5"], BAD, "override '=5' is not of the form key=value"),
    Case("overrides-conflict", ["train", SFT, "model.lora=null", "model.lora.rank=4"], BAD, "conflicts with another override"),
    # ---- eval
    Case("eval-num-prompts-zero", ["eval", "base", "--num-prompts", "0"], BAD, "argument --num-prompts: must be in [1, 10_000_000], got '0'"),
    Case("eval-num-prompts-negative", ["eval", "base", "--num-prompts", "-5"], BAD, "argument --num-prompts: must be in [1, 10_000_000], got '-5'"),
    Case("eval-num-prompts-override-negative", ["eval", "base", "eval.num_prompts=-5"], BAD, "eval.num_prompts must be in [1, 10_000_000] (or null for every prompt of the file), got -5"),
    Case("eval-num-prompts-beyond-file", ["eval", "base", "--num-prompts", "1000000"], BAD, "holds 100 prompts; ask for at most 100"),
    Case("eval-samples-zero", ["eval", "base", "--samples-per-prompt", "0"], BAD, "argument --samples-per-prompt: must be in [1, 4096], got '0'"),
    Case("eval-prompts-binary", ["eval", "base", "--prompts", "{tmp}/p.txt"], BAD, "eval.prompts: prompt file", files={"p.txt": b"\xff\xd8\xff"}),
    Case("eval-unknown-target", ["eval", "{tmp}/nowhere"], BAD, "(no such file or folder) is not 'base', a recipe .yaml, a checkpoint"),
    Case("eval-out-is-a-file", ["eval", "base", "--out", "{tmp}/out"], BAD, "cannot be a folder: it is a file; give a folder path", files={"out": "x"}),
    Case("eval-reward-not-installed", ["eval", "base", "eval.rewards=[{name: 'brightrew:score'}]"], BAD, "eval.rewards[0].name: cannot import module 'brightrew'"),
    Case("eval-baseline-missing", ["eval", "base", "--baseline", "{tmp}/nowhere"], BAD, "is not 'base', a recipe .yaml"),
    Case("eval-bad-height", ["eval", "base", "sampling.height=30"], BAD, "sampling.height=30 does not fit the tiny model"),
    Case("eval-not-an-int", ["eval", "base", "--num-prompts", "ten"], BAD, "argument --num-prompts: expected an integer in [1, 10_000_000], got 'ten'"),
    Case("eval-ignores-the-training-reward", ["eval", "{ckpt}", "eval.num_prompts=0"], BAD, "eval.num_prompts must be in [1, 10_000_000]", prepare=training_reward_not_installed, absent="brightrew"),
    Case("checkpoint-without-config", ["eval", "{ckpt}"], BAD, "has no config.yaml", prepare=no_config_yaml),
    # ---- sample
    Case("sample-without-prompts", ["sample", "base"], BAD, "give --prompt TEXT (repeatable) or --prompts FILE"),
    Case("sample-both-prompt-kinds", ["sample", "base", "--prompt", "a", "--prompts", "{tmp}/p.txt"], BAD, "not both", files={"p.txt": "a\n"}),
    Case("sample-samples-zero", ["sample", "base", "--prompt", "a", "--samples-per-prompt", "0"], BAD, "argument --samples-per-prompt: must be in [1, 4096], got '0'"),
    Case("sample-num-prompts-beyond-file", ["sample", "base", "--prompts", "{tmp}/p.txt", "--num-prompts", "5"], BAD, "holds 2 prompts; ask for 1 to 2", files={"p.txt": "a\nb\n"}),
    Case("sample-num-prompts-negative", ["sample", "base", "--prompts", "{tmp}/p.txt", "--num-prompts", "-1"], BAD, "argument --num-prompts: must be in [1, 10_000_000], got '-1'", files={"p.txt": "a\nb\n"}),
    Case("sample-num-prompts-without-file", ["sample", "base", "--prompt", "a", "--num-prompts", "1"], BAD, "--num-prompts takes the first N prompts of --prompts FILE"),
    Case("sample-out-is-a-file", ["sample", "base", "--prompt", "a", "--out", "{tmp}/out"], BAD, "cannot be a folder: it is a file", files={"out": "x"}),
    Case("sample-bad-size", ["sample", "base", "--prompt", "a", "sampling.width=66"], BAD, "e.g. sampling.width=64 or 68"),
    Case("sample-ignores-the-training-reward", ["sample", "{ckpt}", "--prompt", "a", "sampling.height=30"], BAD, "sampling.height=30", prepare=training_reward_not_installed, absent="brightrew"),
    # ---- export
    Case("export-not-a-checkpoint", ["export", "base", "{tmp}/out"], BAD, "'base' is not a diffrl checkpoint (no such folder)"),
    Case("export-into-a-file", ["export", "{ckpt}", "{tmp}/out"], BAD, "/out' cannot be a folder: it is a file", files={"out": "x"}),
    Case("export-into-a-full-folder", ["export", "{ckpt}", "{tmp}/out"], BAD, "is not empty (1 entry); give a new or empty folder, or pass --force", files={"out/keep.txt": "mine"}),
    Case("export-needs-no-training-reward", ["export", "{ckpt}", "{tmp}/out"], 0, "wrote tiny model to", prepare=training_reward_not_installed),
    # ---- checkpoints: every reader verifies every file against its sha256
    Case("eval-truncated-checkpoint", ["eval", "{ckpt}"], BAD, "trainable.safetensors does not match its sha256", prepare=truncate_trainable),
    Case("eval-corrupt-checkpoint-json", ["eval", "{ckpt}"], BAD, "checkpoint.json is corrupt", prepare=corrupt_checkpoint_json),
    Case("export-mixed-checkpoint", ["export", "{ckpt}", "{tmp}/out"], BAD, "old_policy.safetensors is not one of its files", prepare=foreign_file),
    Case("sample-checkpoint-missing-file", ["sample", "{ckpt}", "--prompt", "a"], BAD, "optimizer.safetensors is missing", prepare=remove_optimizer),
    # ---- resuming, and one run per output folder: refused by the driver before any model loads
    Case("resume-truncated", ["train", SFT, "train.resume={ckpt}", "train.iterations=5", "run.output_dir={tmp}/run"], BAD, "trainable.safetensors does not match its sha256", prepare=truncate_trainable, trains=True),
    Case("resume-corrupt-checkpoint-json", ["train", SFT, "train.resume={ckpt}", "train.iterations=5", "run.output_dir={tmp}/run"], BAD, "checkpoint.json is corrupt", prepare=corrupt_checkpoint_json, trains=True),
    Case("resume-not-a-checkpoint", ["train", SFT, "train.resume={tmp}", "run.output_dir={tmp}/run"], BAD, "is not a diffrl checkpoint (no checkpoint.json inside)", trains=True),
    Case("resume-nothing-left", ["train", SFT, "train.resume={ckpt}", "train.iterations=1", "run.output_dir={tmp}/run"], BAD, "nothing left to run (raise train.iterations)", trains=True),
    Case("resume-other-lora", ["train", SFT, "train.resume={ckpt}", "train.iterations=5", "model.lora={rank: 4}", "model.options={}", "run.output_dir={tmp}/run"], BAD, "differs from model.lora", trains=True),
    Case("resume-into-another-run", ["train", SFT, "train.resume={ckpt}", "train.iterations=5", "run.output_dir={tmp}/run", *CKPT_SETTINGS], BAD, "holds run someone-else", files={"run/run.json": '{"run_id": "someone-else"}', "run/metrics.jsonl": '{"step": 1}\n'}, trains=True),
    Case("folder-holds-a-run", ["train", SFT, "run.output_dir={tmp}/run"], BAD, "already holds a run; continue it with train.resume=latest, or start a new one elsewhere with run.name=OTHER", files={"run/metrics.jsonl": '{"step": 1}\n'}, trains=True),
    Case("folder-in-use", ["train", SFT, "run.output_dir={tmp}/run"], BAD, "is in use by another diffrl process (PID", prepare=hold_lock, trains=True),
    Case("keep-last-zero", ["train", SFT, "train.keep_last=0"], BAD, "train.keep_last must be in [1, 1_000_000] (or null to keep all), got 0"),
    Case("max-failed-iterations-zero", ["train", SFT, "train.max_failed_iterations=0"], BAD, "train.max_failed_iterations must be in [1, 1_000_000], got 0"),
    Case("max-nonfinite-steps-zero", ["train", SFT, "train.max_nonfinite_steps=0"], BAD, "train.max_nonfinite_steps must be in [1, 1_000_000], got 0"),
    # ---- runs that stop themselves (exit 3): a real 4-iteration run of a tiny random model
    Case("reward-always-raises", ["train", NFT, *SHORT, f"rewards=[{{name: {HERE}:always_fails}}]"], EXIT_RUN_STOPPED, "reward failed in 3 consecutive iterations (train.max_failed_iterations=3); last error: reward 'tests.integration.test_bad_inputs:always_fails' raised RuntimeError: scorer unavailable", trains=True, warns=DROPPED + r".*raised RuntimeError"),
    Case("reward-always-nan", ["train", NFT, *SHORT, f"rewards=[{{name: {HERE}:nan_scores}}]"], EXIT_RUN_STOPPED, "returned 2 non-finite score(s)", trains=True, warns=DROPPED + r".*non-finite score"),
    Case("reward-hangs", ["train", NFT, *SHORT, f"rewards=[{{name: {HERE}:hangs, timeout_s: 0.3}}]"], EXIT_RUN_STOPPED, "timed out after 0.3 s", trains=True, warns=DROPPED + r".*timed out after 0.3 s"),
    Case("reward-fails-in-a-short-run", ["train", NFT, *SHORT, "train.iterations=2", f"rewards=[{{name: {HERE}:always_fails}}]"], EXIT_RUN_STOPPED, "no optimizer step was taken in 2 iteration(s)", trains=True, warns=DROPPED + r".*raised RuntimeError"),
    # ---- report
    Case("report-missing-folder", ["report", "{tmp}/nope"], BAD, "no such folder; give the output folder of a training run"),
    Case("report-not-a-run", ["report", "{tmp}/stuff"], BAD, "is not a diffrl run folder (no metrics.jsonl or config.yaml inside)", files={"stuff/x.txt": "x"}, in_subprocess=True),
    Case("report-out-is-a-folder", ["report", "{tmp}/run", "--out", "{tmp}"], BAD, "is a folder; give the HTML file to write", files={"run/metrics.jsonl": '{"step": 1}\n'}),
    # ---- issue 36, class 3: every number has a range and a type, checked before anything loads
    Case("lr-401-digits", ["train", SFT, "train.lr=" + "9" * 401], BAD, "train.lr must be in (0, 1] (e.g. 1e-4), got an integer of about"),
    Case("lr-beyond-float", ["train", SFT, "train.lr=1e999"], BAD, "train.lr must be in (0, 1] (e.g. 1e-4), got inf"),
    Case("lr-5000-digits", ["train", SFT, "train.lr=" + "9" * 5000], BAD, "a number of more than 4,300 digits", absent="9" * 300),
    Case("num-steps-1e20", ["train", SFT, "sampling.num_steps=1e20"], BAD, "sampling.num_steps must be in [1, 1000], got 100000000000000000000"),
    Case("num-steps-huge-int", ["train", SFT, f"sampling.num_steps={10**20}"], BAD, "sampling.num_steps must be in [1, 1000]"),
    Case("num-steps-not-integral", ["train", SFT, "sampling.num_steps=2.5"], BAD, "sampling.num_steps: expected an integer, got 2.5"),
    Case("lora-rank-1e9", ["train", SFT, "model.lora={rank: 1000000000}", "model.options={}"], BAD, "model.lora.rank must be in [1, 4096], got 1000000000"),
    Case("lora-alpha-inf", ["train", SFT, "model.lora={rank: 4, alpha: .inf}", "model.options={}"], BAD, "model.lora.alpha must be in (0, 1e6] (e.g. twice the rank), got inf"),
    Case("iterations-huge", ["train", SFT, f"train.iterations={10**12}"], BAD, "train.iterations must be in [1, 1_000_000_000]"),
    Case("warmup-not-integral", ["train", SFT, "train.warmup_steps=2.5"], BAD, "train.warmup_steps: expected an integer, got 2.5"),
    Case("image-side-1e9", ["train", SFT, "sampling.height=1000000000", "sampling.width=1e9"], BAD, "sampling.width must be in [1, 16384]"),
    Case("eval-batch-huge", ["eval", "base", f"eval.batch_size={10**12}"], BAD, "eval.batch_size must be in [1, 65536]"),
    Case("grid-images-huge", ["eval", "base", "eval.grid_images=1000000000"], BAD, "eval.grid_images must be in [1, 1024]"),
    Case("eval-seed-huge", ["eval", "base", f"eval.seed={10**30}"], BAD, "eval.seed must be in [-2**63, 2**64 - 1] (torch's seed range)"),
    Case("peak-tflops-nan", ["train", SFT, "run.peak_tflops=.nan"], BAD, "run.peak_tflops must be in (0, 100000] (or null), got nan"),
    Case("cpus-per-actor-nan", ["train", GRPO, "runner=ray", "ray.cpus_per_actor=.nan"], BAD, "ray.cpus_per_actor must be in [0, 1024], got nan"),
    Case("ray-engines-1e9", ["train", GRPO, "runner=ray", "parallel.engines=1000000000"], BAD, "parallel.engines must be in [1, 4096]"),
    Case("dataset-size-huge", ["train", SFT, f"data.dataset_size={10**15}"], BAD, "data.dataset_size must be in [1, 10_000_000]"),
    Case("rollout-batch-huge", ["train", GRPO, f"rollout.batch_size={10**9}"], BAD, "rollout.batch_size must be in [1, 65536]"),
    Case("reward-weight-400-digits", ["train", GRPO, "rewards=[{name: ocr, weight: " + "9" * 400 + "}]"], BAD, "rewards[0].weight must be in [-1e6, 1e6] (e.g. 1.0), got an integer of about"),
    Case("reward-timeout-inf", ["train", GRPO, "rewards=[{name: ocr, timeout_s: .inf}]"], BAD, "rewards[0].timeout_s must be in (0, 604800]"),
    Case("ocr-workers-a-word", ["train", GRPO, "rewards=[{name: ocr, params: {num_workers: two}}]"], BAD, "rewards[0] (ocr).params.num_workers: expected an integer, got 'two'"),
    Case("ocr-workers-not-integral", ["train", GRPO, "rewards=[{name: ocr, params: {num_workers: 2.5}}]"], BAD, "rewards[0] (ocr).params.num_workers: expected an integer, got 2.5"),
    Case("ocr-workers-negative", ["train", GRPO, "rewards=[{name: ocr, params: {num_workers: -4}}]"], BAD, "rewards[0] (ocr).params.num_workers must be in [0, 256] (0 or 1: none, OCR runs in this process), got -4"),
    Case("eval-reward-param-range", ["eval", "base", "eval.rewards=[{name: ocr, params: {num_workers: 100000}}]"], BAD, "eval.rewards[0] (ocr).params.num_workers must be in [0, 256]"),
    Case("sample-seed-1e23", ["sample", "base", "--prompt", "a", "--seed", "1e23"], BAD, "argument --seed: must be in [-2**63, 2**64 - 1] (torch's seed range), got '1e23'"),
    Case("sample-seed-not-integral", ["sample", "base", "--prompt", "a", "--seed", "1.5"], BAD, "argument --seed: expected an integer in [-2**63, 2**64 - 1]"),
    Case("eval-num-prompts-1e26", ["eval", "base", "--num-prompts", "1e26"], BAD, "argument --num-prompts: must be in [1, 10_000_000], got '1e26'"),
    Case("eval-samples-1e20", ["eval", "base", "--samples-per-prompt", "1e20"], BAD, "argument --samples-per-prompt: must be in [1, 4096], got '1e20'"),
    Case("sample-samples-huge", ["sample", "base", "--prompt", "a", "--samples-per-prompt", str(10**20)], BAD, "argument --samples-per-prompt: must be in [1, 4096]"),
    Case("serve-port-70000", ["serve-reward", "--reward", "ocr", "--port", "70000"], BAD, "argument --port: must be in [0, 65535], got '70000'"),
    Case("serve-max-request-inf", ["serve-reward", "--reward", "ocr", "--max-request-mb", "inf"], BAD, "argument --max-request-mb: must be a number in (0, 65536], got 'inf'"),
    Case("serve-max-request-nan", ["serve-reward", "--reward", "ocr", "--max-request-mb", "nan"], BAD, "argument --max-request-mb: must be a number in (0, 65536], got 'nan'"),
    Case("serve-max-request-zero", ["serve-reward", "--reward", "ocr", "--max-request-mb", "0"], BAD, "argument --max-request-mb: must be a number in (0, 65536], got '0'"),
    Case("serve-max-active-zero", ["serve-reward", "--reward", "ocr", "--max-active", "0"], BAD, "argument --max-active: must be in [1, 1024], got '0'"),
    Case("serve-body-timeout-nan", ["serve-reward", "--reward", "ocr", "--body-timeout-s", "nan"], BAD, "argument --body-timeout-s: must be a number in (0, 86400], got 'nan'"),
    Case("serve-max-image-pixels-huge", ["serve-reward", "--reward", "ocr", "--max-image-pixels", "1e12"], BAD, "argument --max-image-pixels: must be in [1, 89_478_485], got '1e12'"),
    Case("serve-num-gpus-nan", ["serve-reward", "--reward", "ocr", "--ray", "--num-gpus", "nan"], BAD, "argument --num-gpus: must be a number in [0, 1024], got 'nan'"),
    Case("plan-mfu-nan", ["plan", SFT, "--mfu", "nan"], BAD, "argument --mfu: must be a number in (0, 1], got 'nan'"),
    # ---- class 4: nothing a user gives makes diffrl loop without bound or quote megabytes
    Case("recipe-alias-bomb", ["train", "{tmp}/r.yaml"], BAD, "this value expands to more than 100,000 values", files={"r.yaml": BOMB}),
    Case("override-alias-bomb", ["train", SFT, "train.x=" + BOMB.split("\n", 1)[1].replace("\n  ", ", ").replace("  a:", "{a:").rstrip() + "}"], BAD, "expands to more than 100,000 values"),
    Case("recipe-nested-deep", ["train", "{tmp}/r.yaml"], BAD, "line 1: nested more than 40 levels deep", files={"r.yaml": DEEP}),
    Case("recipe-huge", ["train", "{tmp}/r.yaml"], BAD, "the recipe is 1,100,009 bytes; a recipe is at most 1,048,576", files={"r.yaml": "run: {}\n" + "#" * 1_100_000 + "\n"}),
    Case("batch-size-huge-divisor-hint", ["train", SFT, f"train.batch_size={2**20 - 1}", f"train.micro_batch_size={2**16 - 1}"], BAD, "e.g. set train.micro_batch_size=41943"),
    Case("long-value-quoted-short", ["train", SFT, "model.dtype=" + "x" * 50_000], BAD, "(+49,800 characters) is not one of", absent="x" * 1000),
    Case("long-override", ["train", SFT, "run.name=" + "n" * 200_000], BAD, "is 200,009 characters long; an override is at most 100,000", absent="n" * 1000),
    Case("long-run-name", ["train", SFT, "run.name=" + "n" * 300], BAD, "run.name names the run's folder: at most 255 bytes, got 300"),
    # ---- class 5: nothing is accepted silently (the last duplicate, an empty file, a split line)
    Case("recipe-duplicate-key", ["train", "{tmp}/r.yaml"], BAD, "line 3: duplicate key 'lr' (first at line 2)", files={"r.yaml": "train:\n  lr: 1.0e-4\n  lr: 1.0e-3\n"}),
    Case("recipe-duplicate-section", ["train", "{tmp}/r.yaml"], BAD, "line 5: duplicate key 'train' (first at line 1)", files={"r.yaml": "train:\n  lr: 1.0e-4\nrun:\n  name: a\ntrain:\n  iterations: 3\n"}),
    Case("override-duplicate-key", ["train", SFT, "model.lora={rank: 4, rank: 8}"], BAD, "duplicate key 'rank'"),
    Case("recipe-empty", ["train", "{tmp}/r.yaml"], BAD, "the recipe is empty (no sections; comments only, or nothing)", files={"r.yaml": ""}),
    Case("recipe-comments-only", ["train", "{tmp}/r.yaml"], BAD, "the recipe is empty", files={"r.yaml": "# a recipe to come\n\n"}),
    Case("recipe-problem-has-its-line", ["train", "{tmp}/r.yaml"], BAD, "line 4: train.lr must be in (0, 1]", files={"r.yaml": "run:\n  name: a\ntrain:\n  lr: 5\n"}),
    Case("recipe-name-yaml-boolean", ["train", "{tmp}/r.yaml"], BAD, "line 2: run.name: expected a string, got True (YAML reads the unquoted word as a boolean", files={"r.yaml": "run:\n  name: on\n"}),
    Case("run-name-no", ["train", SFT, "run.name=no"], BAD, "run.name: expected a string, got False"),
    Case("run-name-a-number", ["train", SFT, "run.name=1.5"], BAD, "run.name: expected a string, got 1.5"),
    Case("run-name-null", ["train", SFT, "run.name=null"], BAD, "run.name: null is not allowed here"),
    Case("recipe-string-with-nul", ["train", "{tmp}/r.yaml"], BAD, "line 2: run.output_dir: holds a NUL byte", files={"r.yaml": 'run:\n  output_dir: "a\\0b"\n'}),
    Case("override-with-nul", ["train", SFT, "run.name=a\x00b"], BAD, "holds a NUL byte; remove it"),
    Case("override-list-index", ["train", GRPO, "rewards[0].weight=2"], BAD, "is not a dotted key"),
    Case("section-a-list", ["train", SFT, "train=[1, 2]"], BAD, "train: expected a mapping, got [1, 2]"),
    Case("lora-a-list", ["train", SFT, "model.lora=[4]"], BAD, "model.lora: expected a mapping, got [4]"),
    Case("prompts-line-separator", ["train", GRPO, "data.prompts={tmp}/p.txt"], BAD, "line 1, column 6: U+2028 (LINE SEPARATOR)", files={"p.txt": "a cat\u2028on a mat\nb\n"}),
    Case("prompts-next-line", ["train", GRPO, "data.prompts={tmp}/p.txt"], BAD, "line 2, column 2: U+0085", files={"p.txt": "a\nb\x85c\n"}),
    Case("prompts-vertical-tab", ["train", GRPO, "data.prompts={tmp}/p.jsonl"], BAD, "line 1, column 14: U+000B", files={"p.jsonl": '{"prompt": "a\x0bb"}\n'}),
    # ---- the command line itself
    Case("command-unknown", ["frobnicate"], BAD, "invalid choice: 'frobnicate'", in_subprocess=True),
    Case("command-missing", [], BAD, "the following arguments are required"),
    Case("option-unknown", ["train", SFT, "--itterations", "3"], BAD, "unrecognized arguments: --itterations 3"),
    Case("override-on-recipes", ["recipes", "train.lr=1"], BAD, "unrecognized arguments: train.lr=1"),
]
# fmt: on


def _fill(arg: str, tmp: Path) -> str:
    return arg.replace("{ckpt}", str(tmp / "ckpt")).replace("{tmp}", str(tmp))


def _setup(case: Case, tmp: Path, request: pytest.FixtureRequest) -> list[str]:
    for rel, content in case.files.items():
        path = tmp / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    if any("{ckpt}" in a for a in case.argv):
        shutil.copytree(request.getfixturevalue("tiny_checkpoint"), tmp / "ckpt")
    if case.prepare is not None:
        case.prepare(tmp)
    return [_fill(a, tmp) for a in case.argv]


def _check(case: Case, code: int, out: str, err: str) -> None:
    assert "Traceback" not in out + err, err
    assert code == case.code, f"exit {code}, expected {case.code}; stderr:\n{err}"
    assert case.message in (out if case.code == 0 else err), f"{case.message!r} not in:\n{err or out}"
    if case.code != 0:
        assert "error:" in err
    if case.absent is not None:
        assert case.absent not in out + err


def _params(subprocess_rows: bool) -> list:
    return [
        pytest.param(
            case,
            id=case.id,
            marks=[pytest.mark.skipif(_has_gpu(), reason="expects no GPU")] if case.needs_no_gpu else [],
        )
        for case in CASES
        if case.in_subprocess == subprocess_rows
    ]


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def test_the_table_is_well_formed():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    assert len(CASES) >= 40 and sum(c.in_subprocess for c in CASES) >= 3


def run_row(case: Case, argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """``diffrl.cli.main(argv)`` in this process as ``case`` runs: training refused unless the row
    ``trains`` (a row that got past validation must not start a 1,500-iteration recipe), the row's
    warning expected; (exit code, stdout, stderr). The hostile-input tables run their rows by it."""
    import diffrl.launch
    from diffrl.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError(f"row {case.id!r} reached training")

    if not case.trains:
        monkeypatch.setattr(diffrl.launch, "train", refuse)
    capsys.readouterr()
    with pytest.warns(UserWarning, match=case.warns) if case.warns else contextlib.nullcontext():
        code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_and_check(case: Case, tmp_path: Path, request, capsys, monkeypatch) -> None:
    """The row ``case`` of a hostile-input table run in process from the repository root (rows name
    the shipped recipes by their relative path) on its files under ``tmp_path``, and checked as
    :func:`_check` does, ``tmp_path`` in its stderr read as ``{tmp}`` (as the rows write it)."""
    monkeypatch.chdir(ROOT)
    argv = _setup(case, tmp_path, request)
    code, out, err = run_row(case, argv, monkeypatch, capsys)
    _check(case, code, out, err.replace(str(tmp_path), "{tmp}"))


@pytest.mark.parametrize("case", _params(subprocess_rows=False))
def test_bad_input_in_process(case: Case, tmp_path, request, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # rows name the shipped recipes by their relative path
    argv = _setup(case, tmp_path, request)
    _check(case, *run_row(case, argv, monkeypatch, capsys))


@pytest.mark.parametrize("case", _params(subprocess_rows=True))
def test_bad_input_in_a_real_process(case: Case, tmp_path, request):
    argv = _setup(case, tmp_path, request)
    proc = subprocess.run(
        [sys.executable, "-m", "diffrl.cli", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    _check(case, proc.returncode, proc.stdout, proc.stderr)


# ---- how main() reports what is not a user's error ----------------------------------------------


def test_debug_shows_the_traceback(tmp_path):
    argv = [sys.executable, "-m", "diffrl.cli", "--debug", "train", str(tmp_path / "missing.yaml")]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ConfigError" in proc.stderr
    after = [sys.executable, "-m", "diffrl.cli", "train", str(tmp_path / "missing.yaml"), "--debug"]
    proc = subprocess.run(after, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "Traceback" in proc.stderr  # also accepted after the command


def test_a_bug_is_one_line_naming_itself(monkeypatch, capsys):
    from diffrl import cli
    from diffrl.cli.commands import recipes
    from diffrl.core import user_code

    # this module's functions serve as reward plugins in other rows: here it is diffrl's own code
    monkeypatch.setattr(user_code, "_MODULES", {})

    def broken(args, inputs):
        raise KeyError("oops")

    monkeypatch.setattr(recipes, "run", broken)
    assert cli.main(["recipes"]) == EXIT_BUG
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert "error: unexpected KeyError: 'oops' — this is a bug in diffrl; rerun with --debug" in err
    with pytest.raises(KeyError):
        cli.main(["--debug", "recipes"])


@pytest.mark.parametrize("code", ["EFBIG", "EIO", "ENAMETOOLONG", "ELOOP", "ENOTDIR", "EISDIR"])
def test_an_os_error_of_the_users_environment_is_no_bug(code, monkeypatch, capsys):
    """A file over the file system's limit, a failing disk, a too long path, a symlink loop reached
    in any command: the OS's message, exit 2, not "a bug in diffrl"."""
    import errno
    import os

    from diffrl import cli
    from diffrl.cli.commands import recipes
    from diffrl.core import user_code

    monkeypatch.setattr(user_code, "_MODULES", {})  # this module's rewards in other rows: not here
    number = getattr(errno, code)

    def failing(args, inputs):
        raise OSError(number, os.strerror(number), "/data/x")

    monkeypatch.setattr(recipes, "run", failing)
    assert cli.main(["recipes"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert f"error: [Errno {number}] {os.strerror(number)}: '/data/x'" in err and "bug" not in err


@pytest.mark.usefixtures("terminal_sigint")
def test_ctrl_c_outside_training_is_one_line(monkeypatch, capsys):
    from diffrl import cli
    from diffrl.cli.commands import recipes

    def interrupted(args, inputs):
        signal.raise_signal(signal.SIGINT)  # a real Ctrl-C (a KeyboardInterrupt raised by code is no Ctrl-C)

    monkeypatch.setattr(recipes, "run", interrupted)
    assert cli.main(["recipes"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted (Ctrl-C)"


def test_ray_auto_without_a_cluster(monkeypatch):
    pytest.importorskip("ray")
    import ray._private.services

    from diffrl.distributed.ray.cluster import ray_address_problem

    def none_running(address):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray._private.services, "canonicalize_bootstrap_address", none_running)
    problem = ray_address_problem("auto")
    assert problem is not None and "no Ray cluster runs on this node" in problem
    assert "ray.address=null" in problem
