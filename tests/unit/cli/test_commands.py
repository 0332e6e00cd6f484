"""What the commands print: ``recipes`` each recipe's whole description, ``export`` what it wrote
and the diffusers lines that load it, ``train`` no line its driver already printed."""

from __future__ import annotations

import re

import pytest
import torch

from diffrl.cli import main
from diffrl.cli.export import snippet
from diffrl.cli.inference import load_for_inference, load_target
from diffrl.config import recipes_dir

SIZING = ("# Memory per GPU", "# Host memory")


def _blocks(text: str) -> dict[str, str]:
    """``diffrl recipes``'s output -> recipe file name -> its printed description."""
    blocks, name = {}, None
    for line in text.splitlines():
        if line.endswith(".yaml") and not line.startswith(" "):
            name, blocks[line] = line, ""
        elif name is not None:
            blocks[name] += line + "\n"
    return blocks


def test_recipes_prints_each_description_whole(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["recipes"]) == 0
    blocks = _blocks(capsys.readouterr().out)
    shipped = sorted(recipes_dir().glob("*.yaml"))
    assert sorted(blocks) == [f.name for f in shipped]
    for f in shipped:
        header = []
        for line in f.read_text().splitlines()[1:]:  # the first line is the command that runs it
            if not line.startswith("#") or line.startswith(SIZING):
                break
            header.append(line.lstrip("#"))
        printed = blocks[f.name]
        assert " ".join(" ".join(header).split()) in " ".join(printed.split()), f.name
        assert all(len(line) <= 100 for line in printed.splitlines() if not line.startswith(" " * 8)), f.name
    # the second line of the main job's description: cut by the one-line listing of old
    assert "Prints the eval table at the end" in blocks["tiny_demo.yaml"]


def test_snippet_of_a_lora_is_three_lines_of_python():
    how = "pipe = FluxPipeline.from_pretrained(BASE); pipe.load_lora_weights('/out/lora')"
    assert snippet(how).splitlines()[1:] == [
        "  from diffusers import FluxPipeline",
        "  pipe = FluxPipeline.from_pretrained(BASE)",
        "  pipe.load_lora_weights('/out/lora')",
    ]


def test_export_lists_its_files_and_the_lines_that_load_them(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", str(tiny_checkpoint), str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote tiny model to {out}:" in printed
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert files and f"{len(files)} files" in printed
    for p in files:
        assert re.search(rf"{re.escape(str(p.relative_to(out)))}\s+[\d.]+ [KMG]?B", printed), p
    code = printed.split("load it with diffusers:\n", 1)[1].splitlines()
    namespace: dict = {}
    exec(
        "\n".join(line.strip() for line in code if line.startswith("  ")), namespace
    )  # the printed lines run
    loaded = namespace["transformer"].state_dict()
    config, checkpoint = load_target(str(tiny_checkpoint), [])
    trained = load_for_inference(config, checkpoint).transformer.state_dict()
    assert loaded.keys() == trained.keys()
    for name, value in trained.items():
        assert torch.equal(loaded[name], value), name


def test_train_prints_no_line_of_the_driver_again(tmp_path, capsys, monkeypatch):
    """The driver prints its stage summary and ``report: ...``; the command's closing lines add
    the checkpoint and the pictures, never a line it already printed (here a driver that prints
    as the real one does, so the test does not train)."""
    import diffrl.launch
    from diffrl.train.state import TrainResult

    said = ["seconds per iteration (mean of 1): rollout 1.00 s", f"report: {tmp_path / 'report.html'}"]

    def driver(config):
        for line in said:
            print(line)
        for name in ("report.html", "metrics.png"):
            (tmp_path / name).write_text("x")
        return TrainResult(output_dir=tmp_path, checkpoint=tmp_path / "checkpoints" / "final")

    monkeypatch.setattr(diffrl.launch, "train", driver)
    assert main(["train", str(recipes_dir() / "tiny_sft.yaml"), f"run.output_dir={tmp_path}"]) == 0
    printed = capsys.readouterr().out.splitlines()
    for line in said:
        assert printed.count(line) == 1, printed
    assert sum(line.startswith("report:") for line in printed) == 1
    assert f"checkpoint: {tmp_path / 'checkpoints' / 'final'}" in printed
    assert f"curves: {tmp_path / 'metrics.png'}" in printed


@pytest.mark.parametrize("name", ["load_config", "validate", "check_plugins"])
def test_the_plugin_stage_is_reachable_from_the_package(name):
    import diffrl.preflight
    import diffrl.preflight.plugins

    assert getattr(diffrl.preflight, name) is getattr(diffrl.preflight.plugins, name)
