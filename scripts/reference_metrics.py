"""The reproducibility gate's references: 2-3 shrunk iterations of each shipped tiny recipe.

Regenerate them (every tiny recipe, or the ones named) with one command::

    python scripts/reference_metrics.py
    python scripts/reference_metrics.py tiny_demo tiny_sft

Each recipe ``diffrl/recipes/<name>.yaml`` runs with :func:`overrides` (:data:`COMMON` and its
:data:`SHRINK` row: 2 prompts x 4 samples with the recipe's batch arithmetic kept whole, 3-5
sampling steps, a 2-prompt eval at the start and the end, one thread on the CPU in the portable
deterministic mode, the OCR reward in the process), through the ``diffrl train`` command line in a subprocess that starts as the
``diffrl`` command does (deterministic mode's environment pinned before torch loads). The gate's
test (``tests/integration/test_reproducibility_gate*.py``) runs the same :func:`run_recipes`, so
the reference and the test compute the same way. Each recipe writes
``tests/data/reproducibility/<name>.json``: the recipe, the overrides, the machine kind
(``diffrl.core.determinism.Determinism.kind``: what two machines must share to give the same bits; the
CPU and torch version for information), the commit (``+dirty`` when tracked files had edits), the
command that regenerates it, every metric of every step but the wall-clock ones
(:func:`is_wall_clock`), and the sha256 of every tensor of the final checkpoint's safetensors
files (:func:`tensor_digests`).

Commit policy: a commit that changes these references says in its message why the numbers moved
(e.g. "NFT averages its loss over timesteps first: every NFT reference moves"). The gate exists so
that nothing moves a run's bits unnoticed; regenerating to make it pass is a claim that the move
is intended. A new tiny recipe needs a :data:`SHRINK` row and a reference (a test checks both).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "diffrl" / "recipes"
REFERENCES = ROOT / "tests" / "data" / "reproducibility"
sys.path.insert(0, str(ROOT))
from diffrl.core.pins import PINNED_KEYS  # noqa: E402 - torch-free; ROOT first, as a checkout's script

COMMAND = "python scripts/reference_metrics.py"
"""What regenerates the references (followed by recipe names: only those)."""

OCR_IN_PROCESS = "[{name: ocr, params: {num_workers: 0}}]"
"""The OCR reward without its worker pool (the pool only spreads the same single-threaded
recognition over processes; starting it would cost more than these runs' scoring)."""

_SMALL_RL = {
    # 2 prompts x 4 samples in micro-groups of 4; one optimizer step of the 8 in micro-batches of 4
    "rollout.batch_size": "2",
    "rollout.n_samples_per_prompt": "4",
    "rollout.micro_group_size": "4",
    "rollout.num_steps_per_rollout": "1",
    "train.batch_size": "8",
    "train.micro_batch_size": "4",
    "rewards": OCR_IN_PROCESS,
}

COMMON = {
    "train.iterations": "2",
    "train.eval_every": "2",  # evals at step 0 and at the end
    "train.save_every": "0",  # the final checkpoint only
    "train.time_budget_minutes": "null",
    "sampling.num_steps": "3",
    "eval.num_prompts": "2",
    "eval.batch_size": "2",
    "eval.rewards": OCR_IN_PROCESS,
    "run.device": "cpu",  # the machine kind names no GPU: a GPU machine must not pick one
    "run.deterministic": "portable",  # one set of bits on every x86-64 CPU with AVX2 and FMA
    "run.threads": "1",
    "run.peak_tflops": "1",  # no peak-FLOP/s measurement at start (perf/* is not compared)
    "run.log_every": "1",
}
"""The overrides of every recipe."""

SHRINK: dict[str, dict[str, str]] = {
    "tiny_demo": dict(_SMALL_RL),
    "tiny_nft_ocr": dict(_SMALL_RL),
    "tiny_awm_ocr": dict(_SMALL_RL),
    "tiny_dpo_ocr": dict(_SMALL_RL),  # 2 groups: 2 best-vs-worst pairs x 4 timesteps = 8 a step
    "tiny_grpo_ocr_small": {
        **_SMALL_RL,
        "algorithm.params.step_strategy": "{name: sde_window, size: 1, range: [0, 2]}",
        "sampling.num_steps": "4",  # at 3 steps every SDE rollout scored 0: no advantage, no gradient
    },
    "tiny_grpo_ocr": {
        **_SMALL_RL,
        "algorithm.params.step_strategy": "{name: sde_window, size: 2, range: [0, 2]}",
        "rollout.num_steps_per_rollout": "2",  # the recipe's two optimizer steps a rollout
        "train.batch_size": "4",
        "train.micro_batch_size": "2",
        "sampling.num_steps": "4",
    },
    "tiny_grpo_ocr_reference": {
        **_SMALL_RL,
        "algorithm.params.step_strategy": "{name: epoch_global_random_choice, k: 2, candidates: [0, 1, 2, 3]}",
        "rollout.num_steps_per_rollout": "2",
        "train.batch_size": "4",
        "train.micro_batch_size": "2",
        "sampling.num_steps": "5",  # at 4 steps every rollout scored 0
    },
    "tiny_sft": {
        "train.iterations": "3",  # an SFT iteration is one optimizer step of 8 images
        "train.batch_size": "8",
        "train.micro_batch_size": "4",
        "train.warmup_steps": "1",
        "data.dataset_size": "64",
    },
}
"""Each recipe's own overrides, after :data:`COMMON` (a key here wins)."""


def overrides(recipe: str) -> dict[str, str]:
    """The ``key=value`` overrides ``recipe`` runs with."""
    return {**COMMON, **SHRINK[recipe]}


def is_wall_clock(key: str) -> bool:
    """Whether a metric measures the machine's time rather than the computation, and so is not
    compared: the log's ``time`` stamp, everything under ``perf/`` (durations, and the FLOP counts
    and MFU derived for them) and any other duration (``..._time``, ``..._seconds``)."""
    return key == "time" or key.startswith("perf/") or key.endswith(("_time", "_seconds"))


def tiny_recipes() -> list[str]:
    """The shipped tiny recipes (``diffrl/recipes/tiny_*.yaml``), sorted."""
    return sorted(p.stem for p in RECIPES.glob("tiny_*.yaml"))


def tensor_digests(folder: Path) -> dict[str, str]:
    """``<file>:<tensor>`` -> sha256 of the tensor's dtype, shape and bytes as stored, for each
    tensor of each ``*.safetensors`` file in ``folder``. Read from the format itself (an 8-byte
    little-endian header size, a JSON header of name -> dtype, shape and data offsets, the data),
    so comparing needs no torch."""
    digests = {}
    for path in sorted(folder.glob("*.safetensors")):
        data = path.read_bytes()
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        body = memoryview(data)[8 + size :]
        for name, info in sorted(header.items()):
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            digest = hashlib.sha256(f"{info['dtype']} {info['shape']}\n".encode())
            digest.update(body[start:end])
            digests[f"{path.name}:{name}"] = digest.hexdigest()
    return digests


def read_metrics(run: Path) -> list[dict]:
    """Each line of ``run/metrics.jsonl``, in order, less its wall-clock metrics (:func:`is_wall_clock`)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not is_wall_clock(k)} for row in rows]


def run_recipes(
    recipes: list[str], workdir: Path, timeout: float = 900, extra: list[str] | None = None
) -> dict[str, dict]:
    """Train each of ``recipes`` with its :func:`overrides` (and ``extra`` ``key=value`` overrides
    after them: the gate's perturbed runs) into ``workdir/<recipe>``, one after another in one
    subprocess (its start, about 5 s of CPU for torch and the models' libraries, is paid once;
    separate ``diffrl train`` processes gave the same bits). Returns recipe -> {"kind", "cpu",
    "torch", "metrics", "tensors"}."""
    more = [a for e in extra or [] for a in ("--extra", e)]
    # as from a fresh shell: none of deterministic mode's variables inherited (a test process pins
    # its own mode's; here the runs' run.deterministic decides)
    env = {k: v for k, v in os.environ.items() if k not in PINNED_KEYS}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--train-into", str(workdir), *more, *recipes],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"training {', '.join(recipes)} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    machine = json.loads((workdir / "machine.json").read_text())
    return {
        r: {
            **machine,
            "metrics": read_metrics(workdir / r),
            "tensors": tensor_digests(workdir / r / "checkpoints" / "final"),
        }
        for r in recipes
    }


def _train_here(workdir: Path, recipes: list[str]) -> int:
    """:func:`run_recipes`'s subprocess: the ``diffrl`` command's start (its module pins
    deterministic mode's environment before torch loads), then ``diffrl train`` for each recipe
    (``--extra key=value`` before them: more overrides), then the machine's kind (``machine.json``:
    in the mode the runs ran in, :data:`COMMON`'s or the extras' ``run.deterministic``)."""
    extra = []
    while recipes[:1] == ["--extra"]:
        extra.append(recipes[1])
        recipes = recipes[2:]
    from diffrl import command  # noqa: F401, I001 - first: it pins the environment before torch loads
    from diffrl.core import determinism
    from diffrl.cli import main

    for recipe in recipes:
        args = [*(f"{k}={v}" for k, v in overrides(recipe).items()), *extra]
        code = main(["train", str(RECIPES / f"{recipe}.yaml"), f"run.output_dir={workdir / recipe}", *args])
        if code != 0:
            return code
    asked = [e.split("=", 1)[1] for e in extra if e.startswith("run.deterministic=")]
    ran = asked[-1] if asked else COMMON["run.deterministic"]
    mode = determinism.apply({"true": True, "false": False}.get(ran, ran), int(COMMON["run.threads"]))
    (workdir / "machine.json").write_text(
        json.dumps({"kind": mode.kind, "cpu": mode.cpu, "torch": mode.torch})
    )
    return 0


def commit() -> str:
    """``git rev-parse HEAD``, with ``+dirty`` when a tracked file has uncommitted edits."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    edits = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=True
    ).stdout
    return head.strip() + ("+dirty" if edits.strip() else "")


def reference(recipe: str, result: dict, at: str) -> dict:
    """The reference file of ``recipe``'s run ``result`` at commit ``at``."""
    return {
        "recipe": f"diffrl/recipes/{recipe}.yaml",
        "overrides": overrides(recipe),
        "kind": result["kind"],
        "cpu": result["cpu"],
        "torch": result["torch"],
        "commit": at,
        "command": f"{COMMAND} {recipe}",
        "not_compared": "wall-clock metrics: time, perf/*, *_time, *_seconds (is_wall_clock)",
        "metrics": result["metrics"],
        "tensors": result["tensors"],
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["--train-into"]:
        return _train_here(Path(argv[1]), argv[2:])
    known = tiny_recipes()
    recipes = argv or known
    unknown = [r for r in recipes if r not in known]
    if unknown:
        print(f"error: no tiny recipe {unknown}: the shipped ones are {', '.join(known)}", file=sys.stderr)
        return 2
    unshrunk = [r for r in recipes if r not in SHRINK]
    if unshrunk:
        print(
            f"error: {unshrunk} have no SHRINK row: add one in scripts/reference_metrics.py", file=sys.stderr
        )
        return 2
    at = commit()
    REFERENCES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = run_recipes(recipes, Path(tmp))
    for recipe, result in results.items():
        path = REFERENCES / f"{recipe}.json"
        path.write_text(json.dumps(reference(recipe, result, at), indent=1) + "\n")
        print(
            f"{path.relative_to(ROOT)}: {len(result['metrics'])} metric rows, {len(result['tensors'])} tensors"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
