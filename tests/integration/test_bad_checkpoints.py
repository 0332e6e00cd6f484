"""Checkpoints that were edited, swapped or point elsewhere, and outputs that would destroy inputs
(issue 36, classes 6 and 7): each is refused with a clear error (exit 2, no traceback) before any
model loads, no code a checkpoint names is imported, and the inputs are left as they were.

Rows run in-process through :func:`diffrl.cli.main` on a private copy of the session's tiny
checkpoint (``{ckpt}``); ``prepare`` damages or edits it first, as a user or an attacker would
(``rehash_checkpoint``: one who also recomputes every checksum diffrl keeps)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from diffrl.core.errors import EXIT_USER_ERROR
from diffrl.train.manifest import CheckpointError, base_problem, seal, verify_checkpoint
from tests.conftest import ROOT, rehash_checkpoint

SFT = "recipes/tiny_sft.yaml"
MARKER = "diffrl_test_evil_ran"
EVIL = f"""import pathlib, os
pathlib.Path(os.environ["{MARKER.upper()}"]).write_text("ran")
def score(images, prompts, metadata):
    return [0.0] * len(prompts)
class Family:
    pass
"""


def _edit_info(tmp: Path, change: Callable[[dict], None], reseal: bool = False) -> None:
    f = tmp / "ckpt" / "checkpoint.json"
    info = json.loads(f.read_text())
    change(info)
    f.write_text(json.dumps(seal(info) if reseal else info))


def edit(change: Callable[[dict], None], reseal: bool = False) -> Callable[[Path], None]:
    return lambda tmp: _edit_info(tmp, change, reseal)


def _set(*keys_value):
    *keys, value = keys_value

    def change(info):
        d = info
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value

    return change


def _list_file(name: str) -> Callable[[dict], None]:
    return lambda info: info["files"].__setitem__(name, "0" * 64)


def symlink_out(tmp: Path) -> None:
    """ema.safetensors moved out of the folder, a symlink left in its place (checksums still match)."""
    ema = tmp / "ckpt" / "ema.safetensors"
    ema.rename(tmp / "elsewhere.safetensors")
    ema.symlink_to(tmp / "elsewhere.safetensors")


def unknown_format(tmp: Path) -> None:
    _edit_info(tmp, lambda info: (info.pop("digest"), info.__setitem__("format", "diffrl-checkpoint-1")))


def swapped_config(tmp: Path) -> None:
    """config.yaml replaced after the checkpoint was written (checkpoint.json untouched)."""
    _config_names(tmp, "eval", "rewards", [{"name": "evilmod:score"}], rehash=False)


def _config_names(tmp: Path, section: str, key: str, value, rehash: bool = True) -> None:
    f = tmp / "ckpt" / "config.yaml"
    config = yaml.safe_load(f.read_text())
    config[section][key] = value
    f.write_text(yaml.safe_dump(config))
    if rehash:
        rehash_checkpoint(tmp / "ckpt")


def evil_reward(tmp: Path) -> None:
    _config_names(tmp, "eval", "rewards", [{"name": "evilmod:score"}])


def evil_family(tmp: Path) -> None:
    _config_names(tmp, "model", "family", "evilmod:Family")


def evil_logger(tmp: Path) -> None:
    _config_names(tmp, "run", "loggers", ["jsonl", "evilmod:Family"])


def model_folder(tmp: Path) -> None:
    """A model folder at {tmp}/model (a copy of the shipped tiny base)."""
    shutil.copytree(ROOT / "diffrl" / "models" / "assets" / "tiny_base", tmp / "model")


def user_folder(tmp: Path) -> None:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "config.yaml").write_text("mine: true\n")
    (tmp / "mine" / "report.html").write_text("<p>mine</p>\n")


def run_folder(tmp: Path) -> None:
    (tmp / "run" / "checkpoints").mkdir(parents=True)
    (tmp / "run" / "run.json").write_text('{"run_id": "r1"}')


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    message: str
    prepare: Callable[[Path], None] | None = None


EDITED = "checkpoint.json was changed after the checkpoint was written"
NOT_PLAIN = "which is not a plain file name inside the checkpoint folder"
INSIDE = "writing there would damage what this command reads"
CODE = "importing it would run code that came with the checkpoint"
RESUME = ["train", SFT, "train.resume={ckpt}", "train.iterations=5", "run.output_dir={tmp}/run"]

# fmt: off
CASES = [
    # ---- class 6: checkpoint.json edited by hand (no checksum recomputed): refused by every reader
    Case("edit-lr", ["eval", "{ckpt}"], EDITED, edit(lambda i: i["trainer"]["param_groups"][0].__setitem__("lr", 123.0))),
    Case("edit-family", ["export", "{ckpt}", "{tmp}/out"], EDITED, edit(_set("family", "tiny2"))),
    Case("edit-scheduler", RESUME, EDITED, edit(lambda i: i["trainer"]["scheduler"].__setitem__("last_epoch", 99))),
    Case("edit-iteration", ["sample", "{ckpt}", "--prompt", "a"], EDITED, edit(_set("iteration", 0))),
    Case("edit-lora", RESUME, EDITED, edit(_set("lora", {"rank": 64}))),
    Case("edit-files", ["eval", "{ckpt}"], EDITED, edit(lambda i: i["files"].pop("ema.safetensors"))),
    Case("digest-removed", ["eval", "{ckpt}"], EDITED, edit(lambda i: i.pop("digest"))),
    Case("unknown-format", ["eval", "{ckpt}"], "has format 'diffrl-checkpoint-1', this diffrl reads 'diffrl-checkpoint-3' and 'diffrl-checkpoint-2'", unknown_format),
    Case("config-yaml-swapped", ["eval", "{ckpt}"], "config.yaml does not match its sha256", swapped_config),
    # ---- class 6: files outside the folder (checkpoint.json resealed, as an attacker would)
    Case("files-parent", ["eval", "{ckpt}"], NOT_PLAIN, edit(_list_file("../x.safetensors"), reseal=True)),
    Case("files-absolute", ["export", "{ckpt}", "{tmp}/out"], NOT_PLAIN, edit(_list_file("/etc/passwd"), reseal=True)),
    Case("files-subfolder", RESUME, NOT_PLAIN, edit(_list_file("sub/x.safetensors"), reseal=True)),
    Case("files-dotdot", ["sample", "{ckpt}", "--prompt", "a"], NOT_PLAIN, edit(_list_file(".."), reseal=True)),
    Case("files-backslash", ["eval", "{ckpt}"], NOT_PLAIN, edit(_list_file("..\\x"), reseal=True)),
    Case("files-not-a-string-name", ["eval", "{ckpt}"], NOT_PLAIN, edit(_list_file("checkpoint.json"), reseal=True)),
    Case("symlink-escapes", ["eval", "{ckpt}"], "is a symlink to", symlink_out),
    # ---- class 6: code a checkpoint names is not imported unless the user names it too
    Case("eval-reward-from-checkpoint", ["eval", "{ckpt}"], CODE, evil_reward),
    Case("export-family-from-checkpoint", ["export", "{ckpt}", "{tmp}/out"], CODE, evil_family),
    Case("sample-family-from-checkpoint", ["sample", "{ckpt}", "--prompt", "a"], CODE, evil_family),
    Case("eval-family-from-checkpoint", ["eval", "{ckpt}"], CODE, evil_family),
    Case("eval-baseline-family-from-checkpoint", ["eval", "base", "--baseline", "{ckpt}"], "a paired comparison needs the same family", evil_family),
    Case("eval-logger-name-is-not-imported", ["eval", "{ckpt}", "--num-prompts", "0"], "--num-prompts", evil_logger),
    # ---- class 6: another base model
    Case("eval-on-another-base", ["eval", "{ckpt}", "model.path=base"], "was trained on the base model 'random' (tiny), and this config loads 'base'"),
    Case("sample-on-another-base", ["sample", "{ckpt}", "--prompt", "a", "model.path={tmp}/model"], "and this config loads '{tmp}/model' (tiny, content sha256", model_folder),
    Case("export-on-another-base", ["export", "{ckpt}", "{tmp}/out", "model.path=base"], "its weights fit only their own base"),
    Case("resume-on-another-base", [*RESUME, "model.path=base"], "train.resume: checkpoint"),
    # ---- class 7: outputs into an input
    Case("eval-out-is-the-checkpoint", ["eval", "{ckpt}", "--out", "{ckpt}"], INSIDE),
    Case("eval-out-inside-the-checkpoint", ["eval", "{ckpt}", "--out", "{ckpt}/grids"], INSIDE),
    Case("eval-out-is-the-baseline", ["eval", "base", "--baseline", "{ckpt}", "--out", "{ckpt}"], INSIDE),
    Case("eval-out-in-another-checkpoint", ["eval", "base", "--out", "{ckpt}"], "lies inside the checkpoint folder"),
    Case("eval-out-in-a-runs-checkpoints", ["eval", "base", "--out", "{tmp}/run/checkpoints"], "lies inside the checkpoint folder", run_folder),
    Case("sample-out-is-the-checkpoint", ["sample", "{ckpt}", "--prompt", "a", "--out", "{ckpt}"], INSIDE),
    Case("sample-out-is-the-model-folder", ["sample", "{tmp}/model", "--prompt", "a", "--out", "{tmp}/model"], "is the target's model folder (model.path)", model_folder),
    Case("sample-out-inside-the-model-folder", ["sample", "{tmp}/model", "--prompt", "a", "--out", "{tmp}/model/samples"], "lies inside the target's model folder", model_folder),
    Case("export-into-the-checkpoint", ["export", "{ckpt}", "{ckpt}", "--force"], INSIDE),
    Case("export-into-a-fresh-folder-in-the-checkpoint", ["export", "{ckpt}", "{ckpt}/export"], INSIDE),
    Case("report-out-in-the-checkpoint", ["report", "{tmp}/run", "--out", "{ckpt}/report.html"], "lies inside the checkpoint folder", run_folder),
    Case("report-of-a-checkpoint", ["report", "{ckpt}"], "is a checkpoint (or inside one"),
    Case("train-into-a-users-folder", ["train", SFT, "run.output_dir={tmp}/mine"], "holds files that are not a diffrl run's ('config.yaml', 'report.html')", user_folder),
    Case("train-into-the-model-folder", ["train", SFT, "model.path={tmp}/model", "run.output_dir={tmp}/model/run"], "lies inside the model folder (model.path)", model_folder),
    Case("train-into-the-checkpoint", ["train", SFT, "run.output_dir={ckpt}/run"], "lies inside the checkpoint folder"),
    Case("train-into-the-resumed-checkpoint", [*RESUME[:-1], "run.output_dir={ckpt}"], "is the checkpoint train.resume names"),
]
# fmt: on


def _fill(arg: str, tmp: Path) -> str:
    return arg.replace("{ckpt}", str(tmp / "ckpt")).replace("{tmp}", str(tmp))


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """An importable module ``evilmod`` whose import leaves a marker file: importing it ran it."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "evilmod.py").write_text(EVIL)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.setenv(MARKER.upper(), str(tmp_path / MARKER))
    monkeypatch.delitem(__import__("sys").modules, "evilmod", raising=False)
    return tmp_path / MARKER


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_and_nothing_lost(case, tmp_path, tiny_checkpoint, evil, capsys, monkeypatch):
    import diffrl.train.loop

    monkeypatch.chdir(ROOT)
    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    if case.prepare is not None:
        case.prepare(tmp_path)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and not p.is_symlink()}

    def refuse(config):  # every row is refused before training starts
        raise AssertionError("a row reached training")

    monkeypatch.setattr(diffrl.train.loop, "Driver", refuse)
    from diffrl.cli import main

    code = main([_fill(a, tmp_path) for a in case.argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code == EXIT_USER_ERROR, err
    assert _fill(case.message, tmp_path) in err and "error:" in err, err
    assert not evil.exists(), "a dotted path from the checkpoint was imported"
    after = {p: p.read_bytes() for p in before if p.exists()}
    assert after == before, "an input was changed"


def test_a_refused_dotted_path_names_its_setting_and_both_ways_to_allow_it(tmp_path, tiny_checkpoint, evil):
    from diffrl.cli.targets import EVAL_SECTIONS, resolve_target

    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    evil_reward(tmp_path)
    refused = resolve_target(str(tmp_path / "ckpt"), [], EVAL_SECTIONS).untrusted
    assert (
        "an override of eval.rewards naming evilmod:score" in refused["evilmod:score"]
        and "--trust-checkpoint-code" in refused["evilmod:score"]
    )
    # named again on the command line, or trusted: the user's own choice, imported as any plugin
    again = ["eval.rewards=[{name: evilmod:score}]"]
    assert "evilmod:score" not in resolve_target(str(tmp_path / "ckpt"), again, EVAL_SECTIONS).untrusted
    assert resolve_target(str(tmp_path / "ckpt"), [], EVAL_SECTIONS, trust=True).untrusted == {}


@pytest.mark.parametrize(
    "overrides, refused",
    [
        ([], True),
        (["run.name=evilmod:score2"], True),  # a longer name is not the same name
        (["run.name=x.evilmod:score"], True),
        (["run.name=evilmod:score"], False),  # named anywhere on the command line: the user's
        (["eval.rewards=[{name: 'evilmod:score', weight: 2}]"], False),
    ],
)
def test_a_dotted_path_counts_as_named_only_as_a_whole_word(overrides, refused):
    from diffrl.cli.targets import untrusted_paths
    from diffrl.preflight.schema import read_config

    config = read_config({"eval": {"rewards": [{"name": "evilmod:score"}]}}, [], ("eval",))[0]
    assert ("evilmod:score" in untrusted_paths(config, overrides, Path("ckpt"))) == refused
    assert "diffrl.models.tiny:TinyFamily" not in untrusted_paths(
        read_config({"model": {"family": "diffrl.models.tiny:TinyFamily"}}, [], ("model",))[0], [], Path("c")
    )  # diffrl's own modules run no code that came with a checkpoint


def test_a_trusted_dotted_path_is_imported(tmp_path, tiny_checkpoint, evil, capsys):
    """The gate refuses only what came with the checkpoint: named again, the plugin is imported
    (here as the family, which then fails as a class that is no family: the user's own error)."""
    from diffrl.cli import main

    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    evil_family(tmp_path)
    code = main(["export", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--trust-checkpoint-code"])
    assert code == EXIT_USER_ERROR and evil.exists()
    assert "is not a ModelFamily subclass" in capsys.readouterr().err


def test_the_checkpoint_verifies_after_every_refusal(tmp_path, tiny_checkpoint):
    """The copy the rows start from is a good checkpoint (a row's refusal is its damage's)."""
    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    info = verify_checkpoint(tmp_path / "ckpt")
    assert info["base"] == {"family": "tiny", "path": "random", "digest": None}


def test_a_checkpoint_of_the_previous_format_is_read_with_a_warning(tmp_path, tiny_checkpoint):
    """Format 2 (the previous release: no digest of checkpoint.json, no base recorded) still loads,
    its files checked against their sha256, with a warning of what cannot be checked; a damaged
    file of it is still refused."""
    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    _edit_info(
        tmp_path,
        lambda info: (
            info.pop("digest"),
            info.pop("base"),
            info.__setitem__("format", "diffrl-checkpoint-2"),
        ),
    )
    with pytest.warns(UserWarning, match="older diffrl .diffrl-checkpoint-2.*cannot be detected"):
        info = verify_checkpoint(tmp_path / "ckpt")
    assert base_problem(info, "tiny", "another/base", tmp_path / "ckpt") is None
    trainable = tmp_path / "ckpt" / "trainable.safetensors"
    trainable.write_bytes(trainable.read_bytes()[:64])
    with (
        pytest.warns(UserWarning),
        pytest.raises(CheckpointError, match="trainable.safetensors does not match"),
    ):
        verify_checkpoint(tmp_path / "ckpt")


def test_python_m_imports_nothing_from_the_working_directory(tmp_path):
    """``python -m diffrl.cli`` from a folder holding a ``torch.py``: diffrl's own imports are not
    shadowed by it (as with the ``diffrl`` command, whose sys.path has no working directory)."""
    import subprocess
    import sys

    (tmp_path / "torch.py").write_text("raise SystemExit('shadowed: torch.py of the working directory')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "diffrl.cli", "report", str(tmp_path / "missing")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert "shadowed" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_USER_ERROR and "no such folder" in proc.stderr, proc.stderr
