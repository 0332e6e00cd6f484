"""``benchmarks/gpu_check.py``'s CPU dry run (``--device cpu --tiny``): every section runs its real
code on the tests' tiny SD3, or records why it cannot here, and the JSON holds the device, the
commit, the command and, in each section that ran, numbers. The numbers are not judged (tests never
time things); the GPU run itself is the script's job (docs/speed.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

SECTIONS = ["setup", "rollout", "determinism", "plan", "fsdp", "sglang"]


def dry_run(tmp_path, *extra: str) -> dict:
    out = tmp_path / "gpu_check.json"
    # no sglang server here: the section's skip is what this checks (its run is the slow tier's)
    env = {k: v for k, v in os.environ.items() if k != "DIFFRL_SGLANG"}
    command = [
        sys.executable,
        "benchmarks/gpu_check.py",
        "--device",
        "cpu",
        "--tiny",
        "--out",
        str(out),
        *extra,
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(out.read_text())


def number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def spread_of(x: dict, rounds: int) -> bool:
    return (
        len(x["values"]) == rounds and all(map(number, x["values"])) and x["min"] <= x["median"] <= x["max"]
    )


def test_the_cpu_dry_run_fills_every_section(tmp_path):
    result = dry_run(tmp_path)
    assert result["command"][1:] == [
        "benchmarks/gpu_check.py",
        "--device",
        "cpu",
        "--tiny",
        "--out",
        str(tmp_path / "gpu_check.json"),
    ]
    assert result["device"]["kind"] == "cpu" and result["device"]["torch"] == torch.__version__
    assert "sha" in result["commit"] and number(result["budget_s"]) and number(result["seconds"])
    sections = result["sections"]
    assert list(sections) == SECTIONS
    for name, section in sections.items():
        assert "error" not in section, (name, section)
        assert isinstance(section["seconds"], float) and section["seconds"] >= 0, name
    rounds = result["settings"]["rounds"]

    rollout = sections["rollout"]
    for key in ("collector_s", "diffusers_s", "ratio_diffusers_over_collector"):
        assert spread_of(rollout[key], rounds), key
    assert number(rollout["collector_images_per_s"]) and number(rollout["diffusers_images_per_s"])
    # prompt encoding stays outside the timed rounds (the claim the shrunk text encoders rest on)
    assert rollout["text_encoder_calls_in_timed_rounds"] == 0 and rollout["same_sigmas"]

    det = sections["determinism"]
    assert det["off"]["determinism"]["deterministic"] is False
    assert det["on"]["determinism"]["deterministic"] is True
    assert "CUBLAS_WORKSPACE_CONFIG" in det["on"]["determinism"]["environment"]
    assert "CUBLAS_WORKSPACE_CONFIG" not in det["off"]["determinism"]["environment"]
    for key in ("rollout_s", "train_step_s"):
        for side in ("off", "on", "ratio_on_over_off"):
            assert spread_of(det[key][side], rounds), (key, side)

    recipes = sections["plan"]["recipes"]
    assert set(recipes) == {"sd35_grpo_ocr", "sd35_nft_ocr"}
    for name, row in recipes.items():
        assert number(row["planned_peak_bytes"]) and number(row["measured_peak_bytes"]), name
        assert number(row["ratio_planned_over_measured"]) and number(row["plan_s"]), name
        assert "skipped" in row["iteration"]  # no allocator peak on the CPU: it says so
    # the rows the step ran are the plan's: with CFG for Flow-GRPO, without for DiffusionNFT
    assert recipes["sd35_grpo_ocr"]["rows"] == 2 * recipes["sd35_grpo_ocr"]["micro_batch"]
    assert recipes["sd35_nft_ocr"]["rows"] == recipes["sd35_nft_ocr"]["micro_batch"]

    assert "2 GPUs" in sections["fsdp"]["skipped"]
    sglang = sections["sglang"]
    assert "skipped" in sglang or number(sglang["sglang_images_per_s"])


@pytest.mark.slow
def test_the_fsdp_step_runs_on_two_cpu_processes(tmp_path):
    """The FSDP section's next-best check without 2 GPUs: the same step over gloo."""
    fsdp = dry_run(tmp_path, "--sections", "fsdp", "--fsdp-gloo")["sections"]["fsdp"]
    assert fsdp["backend"] == "gloo" and [r["rank"] for r in fsdp["ranks"]] == [0, 1]
    assert fsdp["ranks_agree"] and number(fsdp["planned_peak_bytes_per_rank"])
    assert all(number(r["step_s"]["median"]) for r in fsdp["ranks"])
