"""Hostile checkpoints and run folders (issue 36): class 6 (checkpoints edited or swapped, a resume
that would change what the run trained with), class 8 (a run's files damaged by a crash at its
end, resumed) and class 9 (corrupt inputs to read-only commands). Each row is refused with exit 2
and one ``error:`` line naming the file and the fix, or (read-only commands) goes on with a
warning; none crashes (exit 70) or waits.

Rows run in process through :func:`diffrl.cli.main`, as ``tests/integration/test_bad_inputs.py``'s
(``{ckpt}``: a private copy of the session's tiny checkpoint, damaged by ``prepare``;
``rehash_checkpoint``: damage by one who also recomputes every checksum diffrl keeps)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

from diffrl.train.manifest import CheckpointError, seal, verify_checkpoint
from diffrl.train.run_folder import row_kind
from tests.conftest import rehash_checkpoint
from tests.integration.test_bad_inputs import (
    BAD,
    CKPT_SETTINGS,
    GRPO,
    ROOT,
    SFT,
    Case,
    _check,
    _setup,
    run_row,
)

RESUME = [
    "train",
    SFT,
    "train.resume={ckpt}",
    "train.iterations=5",
    "run.output_dir={tmp}/run",
    *CKPT_SETTINGS,
]
"""A resume of the tiny checkpoint with the settings it was trained with (rows add one change)."""
CHANGED = "the settings above differ from those the run of"
UNFIT = "does not fit this run's model and optimizer"


# ---- what a row does to the checkpoint (or around it) first ---------------------------------------


def _info(tmp: Path) -> dict:
    return json.loads((tmp / "ckpt" / "checkpoint.json").read_text())


def _write_info(tmp: Path, info, reseal: bool = True) -> None:
    text = info if isinstance(info, str) else json.dumps(seal(info) if reseal else info)
    (tmp / "ckpt" / "checkpoint.json").write_text(text)


def resealed(change):
    """checkpoint.json changed by ``change(info)`` and sealed again (as an attacker would)."""

    def prepare(tmp: Path) -> None:
        info = _info(tmp)
        change(info)
        _write_info(tmp, info)

    return prepare


def info_text(text: str | bytes):
    def prepare(tmp: Path) -> None:
        f = tmp / "ckpt" / "checkpoint.json"
        f.write_bytes(text if isinstance(text, bytes) else text.encode())

    return prepare


def huge_info(tmp: Path) -> None:
    """A checkpoint.json of 65 MB (sparse: the size alone refuses it, nothing is read)."""
    with (tmp / "ckpt" / "checkpoint.json").open("r+b") as f:
        f.truncate(65 * 2**20)


def replaced(name: str, kind: str):
    """The checkpoint's file ``name`` replaced by a FIFO, a folder, a symlink loop or a dangling link."""

    def prepare(tmp: Path) -> None:
        f = tmp / "ckpt" / name
        f.unlink()
        if kind == "fifo":
            os.mkfifo(f)
        elif kind == "folder":
            f.mkdir()
        elif kind == "loop":
            f.symlink_to(f.name)
        else:
            f.symlink_to("missing.safetensors")

    return prepare


def weights_bytes(data: bytes, name: str = "trainable.safetensors"):
    """``name`` replaced by ``data``, its sha256 recorded again: it passes the checksum."""

    def prepare(tmp: Path) -> None:
        (tmp / "ckpt" / name).write_bytes(data)
        rehash_checkpoint(tmp / "ckpt")

    return prepare


def _header_claiming_huge_tensor() -> bytes:
    header = {"w": {"dtype": "F32", "shape": [2**20, 2**20, 2**20], "data_offsets": [0, 2**62]}}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 16


def optimizer_key_garbled(tmp: Path) -> None:
    f = tmp / "ckpt" / "optimizer.safetensors"
    state = load_file(str(f))
    state["bogus"] = state.pop(next(iter(state)))
    save_file(state, str(f))
    rehash_checkpoint(tmp / "ckpt")


def trained_with(section: str, value) -> Callable[[Path], None]:
    """The checkpoint's config.yaml says ``section`` was ``value`` (checksums recomputed)."""

    def prepare(tmp: Path) -> None:
        f = tmp / "ckpt" / "config.yaml"
        config = yaml.safe_load(f.read_text())
        config[section] = value
        f.write_text(yaml.safe_dump(config, sort_keys=False))
        rehash_checkpoint(tmp / "ckpt")

    return prepare


def as_run_folder(tmp: Path) -> None:
    """{tmp}/run: the checkpoint's run folder (run.json, metrics.jsonl, checkpoints/final)."""
    run = tmp / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp / "ckpt", run / "checkpoints" / "final")
    (run / "run.json").write_text(json.dumps({"run_id": _info(tmp)["run_id"]}))
    (run / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5}\n')


def run_json(kind: str):
    """{tmp}/run (:func:`as_run_folder`) whose run.json is a FIFO, or JSON nested 100,000 deep."""

    def prepare(tmp: Path) -> None:
        as_run_folder(tmp)
        f = tmp / "run" / "run.json"
        f.unlink()
        if kind == "fifo":
            os.mkfifo(f)
        else:
            f.write_text("[" * 100_000)

    return prepare


def run_folder_without_checkpoints(tmp: Path) -> None:
    (tmp / "run").mkdir()
    (tmp / "run" / "run.json").write_text('{"run_id": "r1"}')
    (tmp / "run" / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5}\n')


def model_file(rel: str, text: str):
    """{tmp}/model: a copy of the shipped tiny base whose file ``rel`` holds ``text``."""

    def prepare(tmp: Path) -> None:
        shutil.copytree(ROOT / "diffrl" / "models" / "assets" / "tiny_base", tmp / "model")
        (tmp / "model" / rel).write_text(text)

    return prepare


def _pop(*keys: str):
    def change(info: dict) -> None:
        d = info
        for k in keys[:-1]:
            d = d[k]
        d.pop(keys[-1])

    return change


def _put(*keys_value):
    *keys, value = keys_value

    def change(info: dict) -> None:
        d = info
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value

    return change


FIFO = "is a FIFO (named pipe), not a regular file"
CORRUPT = "checkpoint.json is corrupt"
GARBLED = "checkpoint.json lacks or garbles"
NFT = {"name": "diffusion_nft", "params": {}}

# fmt: off
CASES = [
    # ---- class 6: a resume that changes what the run trained with: refused, each change old -> new
    Case("c6-resume-other-lr", [*RESUME, "train.lr=0.5"], BAD, "train.lr: 0.001 in the checkpoint's run -> 0.5 here", absent="train.batch_size", trains=True),
    Case("c6-resume-other-seed", [*RESUME, "run.seed=7"], BAD, "run.seed: 0 in the checkpoint's run -> 7 here", trains=True),
    Case("c6-resume-other-batch", [*RESUME, "train.batch_size=4"], BAD, "train.batch_size: 2 in the checkpoint's run -> 4 here", trains=True),
    Case("c6-resume-other-schedule", [*RESUME, "train.lr_schedule=constant"], BAD, 'train.lr_schedule: "cosine" in the checkpoint\'s run -> "constant" here', trains=True),
    Case("c6-resume-other-model-option", [*RESUME, "model.options.train_text_encoder=false"], BAD, "model.options.train_text_encoder: true in the checkpoint's run -> false here", trains=True),
    Case("c6-resume-other-algorithm-params", [*RESUME, "algorithm.params.cond_dropout=0.5"], BAD, "algorithm.params: {", trains=True),
    Case("c6-resume-says-how", [*RESUME, "train.lr=0.5"], BAD, f"{CHANGED} '{{tmp}}/ckpt' was trained with", trains=True),
    Case("c6-resume-nft-under-grpo", ["train", GRPO, "train.resume={ckpt}", "run.output_dir={tmp}/run", "model.path=random"], BAD, 'algorithm.name: "diffusion_nft" in the checkpoint\'s run -> "flow_grpo" here', prepare=trained_with("algorithm", NFT), trains=True),
    # ---- class 6: checkpoint.json resealed with fields of the wrong type, missing, or unknown
    Case("c6-info-no-actor-step", ["eval", "{ckpt}"], BAD, f"{GARBLED} trainer.actor_step", prepare=resealed(_pop("trainer", "actor_step"))),
    Case("c6-info-no-scheduler", ["eval", "{ckpt}"], BAD, f"{GARBLED} trainer.scheduler", prepare=resealed(_pop("trainer", "scheduler"))),
    Case("c6-info-param-groups-text", ["eval", "{ckpt}"], BAD, f"{GARBLED} trainer.param_groups", prepare=resealed(_put("trainer", "param_groups", "x"))),
    Case("c6-info-iteration-negative", ["eval", "{ckpt}"], BAD, f"{GARBLED} iteration", prepare=resealed(_put("iteration", -5))),
    Case("c6-info-iteration-bool", ["eval", "{ckpt}"], BAD, f"{GARBLED} iteration", prepare=resealed(_put("iteration", True))),
    Case("c6-info-iteration-huge", ["eval", "{ckpt}"], BAD, f"{GARBLED} iteration", prepare=resealed(_put("iteration", 10**400))),
    Case("c6-info-lora-number", ["eval", "{ckpt}"], BAD, f"{GARBLED} lora", prepare=resealed(_put("lora", 5))),
    Case("c6-info-lora-unknown-setting", ["eval", "{ckpt}"], BAD, "the checkpoint's LoRA settings {'rank': 4, 'bogus': 1} are not this diffrl's", prepare=resealed(_put("lora", {"rank": 4, "bogus": 1}))),
    Case("c6-info-evals-text", ["eval", "{ckpt}"], BAD, f"{GARBLED} loop.evals", prepare=resealed(_put("loop", "evals", "x"))),
    Case("c6-info-evals-step-text", ["eval", "{ckpt}"], BAD, f"{GARBLED} loop.evals", prepare=resealed(_put("loop", "evals", [{"step": "x"}]))),
    Case("c6-info-train-time-text", RESUME, BAD, f"{GARBLED} loop.train_time_s", prepare=resealed(_put("loop", "train_time_s", "x")), trains=True),
    Case("c6-info-train-time-nan", RESUME, BAD, f"{GARBLED} loop.train_time_s", prepare=resealed(_put("loop", "train_time_s", float("nan"))), trains=True),
    Case("c6-info-final-text", RESUME, BAD, f"{GARBLED} loop.final", prepare=resealed(_put("loop", "final", "yes")), trains=True),
    Case("c6-info-guard-counts-text", RESUME, BAD, f"{GARBLED} loop.guard", prepare=resealed(_put("loop", "guard", {"failed": "x"})), trains=True),
    Case("c6-info-a-list", ["eval", "{ckpt}"], BAD, "has format 'none', this diffrl reads", prepare=info_text("[1, 2]")),
    Case("c6-newer-format", ["eval", "{ckpt}"], BAD, "has format 'diffrl-checkpoint-9', written by a newer diffrl; this one reads 'diffrl-checkpoint-3' and 'diffrl-checkpoint-2': upgrade diffrl", prepare=resealed(_put("format", "diffrl-checkpoint-9"))),
    Case("c6-format-missing", ["eval", "{ckpt}"], BAD, "has format 'none'", prepare=resealed(_pop("format"))),
    # ---- class 6: weight files that pass their checksum (recomputed) but are no safetensors
    Case("c6-weights-zero-bytes", ["eval", "{ckpt}"], BAD, "trainable.safetensors is not a readable safetensors file", prepare=weights_bytes(b"")),
    Case("c6-weights-header-claims-huge-tensor", ["eval", "{ckpt}"], BAD, "trainable.safetensors is not a readable safetensors file", prepare=weights_bytes(_header_claiming_huge_tensor())),
    Case("c6-ema-not-safetensors", ["export", "{ckpt}", "{tmp}/out"], BAD, "ema.safetensors is not a readable safetensors file", prepare=weights_bytes(b"{}", "ema.safetensors")),
    Case("c6-resume-optimizer-key-garbled", RESUME, BAD, f"optimizer.safetensors {UNFIT}", prepare=optimizer_key_garbled, trains=True),
    Case("c6-resume-weights-zero-bytes", RESUME, BAD, "trainable.safetensors is not a readable safetensors file", prepare=weights_bytes(b""), trains=True),
    # ---- class 9: checkpoint.json that is no JSON a checkpoint writes, or no file at all
    Case("c9-info-nested-100000-deep", ["eval", "{ckpt}"], BAD, f"{CORRUPT} (nested too deeply)", prepare=info_text("[" * 100_000 + "]" * 100_000)),
    Case("c9-info-number-5000-digits", ["eval", "{ckpt}"], BAD, CORRUPT, prepare=info_text('{"iteration": ' + "9" * 5000 + "}")),
    Case("c9-info-not-utf8", ["eval", "{ckpt}"], BAD, CORRUPT, prepare=info_text(b'{"a": "\xff"}')),
    Case("c9-info-65-mb", ["eval", "{ckpt}"], BAD, "checkpoint.json is 68,157,440 bytes, more than the 67,108,864 read at most", prepare=huge_info),
    Case("c9-info-fifo", ["eval", "{ckpt}"], BAD, f"checkpoint.json {FIFO}", prepare=replaced("checkpoint.json", "fifo")),
    Case("c9-info-folder", ["export", "{ckpt}", "{tmp}/out"], BAD, "checkpoint.json is a folder, not a file", prepare=replaced("checkpoint.json", "folder")),
    Case("c9-info-symlink-loop", ["sample", "{ckpt}", "--prompt", "a"], BAD, "checkpoint.json is a symlink loop", prepare=replaced("checkpoint.json", "loop")),
    Case("c9-resume-info-fifo", RESUME, BAD, f"checkpoint.json {FIFO}", prepare=replaced("checkpoint.json", "fifo"), trains=True),
    Case("c9-resume-info-nested-deep", RESUME, BAD, f"{CORRUPT} (nested too deeply)", prepare=info_text("{\"a\": " * 50_000 + "1" + "}" * 50_000), trains=True),
    # ---- class 9: a checkpoint's file replaced by something that is no file (never "missing", never waited on)
    Case("c9-weights-fifo", ["eval", "{ckpt}"], BAD, f"trainable.safetensors {FIFO}", prepare=replaced("trainable.safetensors", "fifo")),
    Case("c9-weights-folder", ["eval", "{ckpt}"], BAD, "trainable.safetensors is a folder, not a file", prepare=replaced("trainable.safetensors", "folder")),
    Case("c9-weights-symlink-loop", ["eval", "{ckpt}"], BAD, "trainable.safetensors is a symlink loop", prepare=replaced("trainable.safetensors", "loop")),
    Case("c9-weights-dangling-symlink", ["export", "{ckpt}", "{tmp}/out"], BAD, "trainable.safetensors is a symlink to a missing file", prepare=replaced("trainable.safetensors", "dangling")),
    Case("c9-config-fifo", ["eval", "{ckpt}"], BAD, f"config.yaml {FIFO}", prepare=replaced("config.yaml", "fifo")),
    Case("c9-resume-optimizer-fifo", RESUME, BAD, f"optimizer.safetensors {FIFO}", prepare=replaced("optimizer.safetensors", "fifo"), trains=True),
    # ---- class 9: a run folder whose run.json is no run id (was: a FIFO hung the resume; RecursionError)
    Case("c9-resume-latest-run-json-fifo", ["train", SFT, "train.resume=latest", "train.iterations=5", "run.output_dir={tmp}/run", *CKPT_SETTINGS], BAD, "output folder '{tmp}/run' holds run", prepare=run_json("fifo"), trains=True),
    Case("c9-resume-latest-run-json-nested-deep", ["train", SFT, "train.resume=latest", "train.iterations=5", "run.output_dir={tmp}/run", *CKPT_SETTINGS], BAD, "output folder '{tmp}/run' holds run", prepare=run_json("deep"), trains=True),
    # ---- class 9: a model folder (an export) whose JSON is nested 100,000 deep
    Case("c9-model-family-file-nested-deep", ["sample", "{tmp}/model", "--prompt", "a"], BAD, "diffrl_model.json is not the JSON diffrl writes (RecursionError)", prepare=model_file("diffrl_model.json", "[" * 100_000)),
    Case("c9-model-family-file-a-list", ["sample", "{tmp}/model", "--prompt", "a"], BAD, "diffrl_model.json names no model family (it holds [1])", prepare=model_file("diffrl_model.json", "[1]")),
    Case("c9-model-config-nested-deep", ["sample", "{tmp}/model", "--prompt", "a"], BAD, "transformer/config.json' is JSON nested too deeply to read", prepare=model_file("transformer/config.json", "[" * 100_000)),
    # ---- class 9: a run folder where a checkpoint is expected: name the checkpoint meant
    Case("c9-eval-a-run-folder", ["eval", "{tmp}/run"], BAD, "'{tmp}/run' is a run folder: did you mean '{tmp}/run/checkpoints/final'?", prepare=as_run_folder),
    Case("c9-eval-a-runs-checkpoints", ["eval", "{tmp}/run/checkpoints"], BAD, "did you mean '{tmp}/run/checkpoints/final'?", prepare=as_run_folder),
    Case("c9-export-a-run-folder", ["export", "{tmp}/run", "{tmp}/out"], BAD, "did you mean '{tmp}/run/checkpoints/final'?", prepare=as_run_folder),
    Case("c9-sample-a-run-folder-without-checkpoints", ["sample", "{tmp}/run", "--prompt", "a"], BAD, "'{tmp}/run' is a run folder with no checkpoint yet", prepare=run_folder_without_checkpoints),
    Case("c9-resume-a-run-folder", ["train", SFT, "train.resume={tmp}/run", "train.iterations=5", "run.output_dir={tmp}/other"], BAD, "is not a diffrl checkpoint (no checkpoint.json inside); '{tmp}/run' is a run folder: did you mean '{tmp}/run/checkpoints/final'?", prepare=as_run_folder, trains=True),
]
# fmt: on


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{ckpt}", str(tmp / "ckpt")).replace("{tmp}", str(tmp))


def test_the_table_is_well_formed():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and all(i[:3] in ("c6-", "c8-", "c9-") for i in ids)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_checkpoint(case: Case, tmp_path, request, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    if not any("{ckpt}" in a for a in case.argv):  # the run-folder rows build their run from it
        shutil.copytree(request.getfixturevalue("tiny_checkpoint"), tmp_path / "ckpt")
    argv = _setup(case, tmp_path, request)
    filled = Case(case.id, argv, case.code, _fill(case.message, tmp_path), absent=case.absent)
    _check(filled, *run_row(case, argv, monkeypatch, capsys))


def test_a_resume_may_change_where_and_how_often_and_says_so(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    """Settings of where and how often (iterations, save/eval cadence, micro-batches, device) may
    change on resume: they take effect, the run's config.yaml records them, and the start-up says
    which changed. (Trains one iteration of the tiny SFT.)"""
    from diffrl.cli import main

    monkeypatch.chdir(ROOT)
    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    argv = [_fill(a, tmp_path) for a in RESUME]
    argv = [a.replace("train.iterations=5", "train.iterations=2") for a in argv] + [
        "train.save_every=1",
        "model.options.gradient_checkpointing=true",  # a memory lever, the same numbers
    ]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "settings changed since the checkpoint" in out
    assert "train.iterations: 1 in the checkpoint's run -> 2 here" in out and "train.save_every: 250" in out
    assert "model.options.gradient_checkpointing: (none) in the checkpoint's run -> true here" in out
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert recorded["train"]["iterations"] == 2 and recorded["train"]["save_every"] == 1


def test_c8_a_resume_after_damaged_metric_lines_keeps_one_row_per_step(
    tmp_path, tiny_checkpoint, monkeypatch
):
    """class 8: metrics.jsonl left by a crash mid-write (a torn last line), and lines no run
    writes (nested 100,000 deep, a step of 1e400), resumed with train.resume=latest: the bad lines
    are dropped (was: exit 70 on RecursionError / OverflowError), every (kind, step) once."""
    from diffrl.cli import main

    monkeypatch.chdir(ROOT)
    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    as_run_folder(tmp_path)
    bad = ["[" * 100_000, '{"step": 1e400}', '{"step": 1, "train/loss": 0.5}', '{"step": 2, "train/lo']
    with (tmp_path / "run" / "metrics.jsonl").open("a") as f:
        f.write("\n".join(bad))
    argv = ["train", SFT, "train.resume=latest", "train.iterations=2", f"run.output_dir={tmp_path / 'run'}"]
    assert main([*argv, *CKPT_SETTINGS]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    keys = Counter((row_kind(r), r["step"]) for r in rows)
    assert keys == {("train", 1): 1, ("train", 2): 1}


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_put("comment", "made by hand"), id="c6-extra-key"),
        pytest.param(_put("loop", "future_field", [1, 2]), id="c6-extra-loop-key"),
    ],
)
def test_c6_an_unknown_key_of_a_sealed_checkpoint_json_is_ignored(change, tmp_path, tiny_checkpoint):
    """A key this diffrl does not read (a later version's addition), sealed with the rest: read."""
    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    resealed(change)(tmp_path)
    assert verify_checkpoint(tmp_path / "ckpt")["iteration"] == 1


def test_c6_a_hand_edit_is_still_caught_after_the_type_checks(tmp_path, tiny_checkpoint):
    """The digest is checked before the fields' types: an unsealed edit is named as one."""
    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    info = _info(tmp_path)
    info["iteration"] = -5
    _write_info(tmp_path, info, reseal=False)
    with pytest.raises(CheckpointError, match="was changed after the checkpoint was written"):
        verify_checkpoint(tmp_path / "ckpt")


def test_c9_resume_latest_skips_a_checkpoint_whose_json_is_a_fifo_and_says_why(tmp_path, tiny_checkpoint):
    """A newer checkpoint folder whose checkpoint.json is a FIFO: skipped with its reason (never
    opened, never passed over in silence), the good one before it resumed."""
    from diffrl.train.checkpoint import latest_checkpoint

    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    as_run_folder(tmp_path)
    newer = tmp_path / "run" / "checkpoints" / "step_00002"
    newer.mkdir()
    os.mkfifo(newer / "checkpoint.json")
    found, skipped = latest_checkpoint(tmp_path / "run")
    assert found == tmp_path / "run" / "checkpoints" / "final"
    assert len(skipped) == 1 and f"checkpoint.json {FIFO}" in skipped[0]


def test_c8_a_process_killed_while_pruning_leaves_no_half_checkpoint(tmp_path, tiny_checkpoint, monkeypatch):
    """class 8: train.keep_last deletes an old checkpoint; a process killed in the middle of that
    delete (here: the delete stops after one file) leaves no half checkpoint among the run's
    (was: a step folder missing files, skipped with a warning by every resume=latest, never
    pruned), and the next resume clears what is left."""
    from diffrl.train import checkpoint

    ckpts = tmp_path / "run" / "checkpoints"
    for step in (1, 2):
        shutil.copytree(tiny_checkpoint, ckpts / f"step_{step:05d}")
        info = json.loads((ckpts / f"step_{step:05d}" / "checkpoint.json").read_text())
        info["iteration"] = step
        (ckpts / f"step_{step:05d}" / "checkpoint.json").write_text(json.dumps(seal(info)))

    def killed(path, ignore_errors=False):
        next(Path(path).glob("*.safetensors")).unlink()
        raise KeyboardInterrupt  # as the process would stop there

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune_checkpoints(tmp_path / "run", keep_last=1, step=2)
    monkeypatch.undo()
    assert [p.name for p in checkpoint.checkpoints_of(tmp_path / "run")] == ["step_00002"]
    found, skipped = checkpoint.latest_checkpoint(tmp_path / "run")
    assert found == ckpts / "step_00002" and skipped == []
    checkpoint.remove_partial_writes(tmp_path / "run")
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00002"]


def test_c9_a_folder_named_like_a_builtin_model_is_that_folder(tmp_path, monkeypatch, capsys):
    """``sample ./base`` names the folder ./base, not the built-in model 'base' (was: str(Path)
    dropped the ./ and the built-in model was sampled in its place, silently)."""
    from diffrl.cli import main

    (tmp_path / "base").mkdir()  # no model inside: refused, naming it
    monkeypatch.chdir(tmp_path)
    assert main(["sample", "./base", "--prompt", "a", "--out", str(tmp_path / "out")]) == BAD
    assert "'./base' is not a tiny model folder (no transformer/ inside)" in capsys.readouterr().err
