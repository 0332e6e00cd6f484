"""``diffrl plan`` of every shipped real-model recipe: the table of ``docs/scaling.md``.

    python benchmarks/plan_recipes.py [--recipes wan22_grpo,ltx2_grpo] [--out docs/results/plan_recipes.json]

Each recipe is planned in a fresh process, as ``diffrl plan recipes/NAME.yaml`` plans it (the
model's shipped ``config.json`` files, no weights; the layout its runner places; ``--gpu H100
--mfu 0.4``, the command's defaults), and the process's wall-clock from its start (imports included:
what a user waits for) and CPU seconds are recorded with the plan's figures and the text the command
prints. The plan itself is exact arithmetic on fake tensors: it does not depend on the machine; the
seconds do (the machine is named in the file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

STARTED = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]

RECIPES: dict[str, list[str]] = {
    "sd35_grpo_ocr": [],
    "sd35_nft_ocr": [],
    "flux_grpo_ocr": [],
    "flux2_grpo_ocr": [],
    "flux_kontext_grpo_ocr": [],
    "qwen_image_grpo_ocr": [],
    "qwen_image_edit_grpo_ocr": [],
    "z_image_nft_pickscore": [],
    "wan22_grpo": [],
    "wan22_grpo sp2": ["parallel.trainer_ranks=16", "parallel.sequence=2"],
    "ltx2_grpo": [],
}
GPU, MFU = "H100", 0.4


def child(name: str) -> None:
    """Plan ``name`` (a key of :data:`RECIPES`) and print one JSON line."""
    import dataclasses
    import resource

    from diffrl import launch
    from diffrl.algorithms.registry import build_algorithm
    from diffrl.cli.commands.train import SECTIONS
    from diffrl.models.numerics import GPU_MEMORY_GB, GPU_PEAK_TFLOPS
    from diffrl.plan.planner import plan, render
    from diffrl.preflight import check_plugins
    from diffrl.preflight.schema import read_config

    recipe = name.split()[0]
    config, source = read_config(str(ROOT / "recipes" / f"{recipe}.yaml"), RECIPES[name], SECTIONS)
    config = check_plugins(config, source, SECTIONS, check_files=False)
    result = plan(config, build_algorithm(config), launch.layout(config))
    text = render(result, config, GPU, MFU, GPU_MEMORY_GB[GPU])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak = GPU_PEAK_TFLOPS[GPU][0] * 1e12 * MFU
    out = dataclasses.asdict(result)
    out.update(
        name=name,
        overrides=RECIPES[name],
        lora_rank=config.model.lora.rank if config.model.lora else None,
        dtype=config.model.dtype,
        rollout_s=result.rollout_flops / (result.engines * peak),
        train_s=result.train_flops / (result.ranks * peak),
        wall_s=round(time.perf_counter() - STARTED, 2),
        cpu_s=round(usage.ru_utime + usage.ru_stime, 2),
        text=text,
    )
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of: {', '.join(RECIPES)}")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    names = [n.strip() for n in args.recipes.split(",") if n.strip()]
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise SystemExit(f"unknown recipes {unknown}; known: {', '.join(RECIPES)}")
    from diffrl.core.pins import cpu_model

    rows = []
    print(
        "| recipe | ranks | rows | shards | gathered | AdamW | activations | peak GiB | rollout | train | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
    for name in names:
        done = subprocess.run(
            [sys.executable, __file__, "--child", name],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=os.environ,
        )
        if done.returncode:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"{name}: the plan failed (exit code {done.returncode})")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        m, g = row["memory"], 2**30
        print(
            f"| {name} | {row['ranks']} | {row['rows']} | {m['parameters'] / g:.2f} | {m['gathered'] / g:.2f} | "
            f"{m['optimizer'] / g:.2f} | {m['activations'] / g:.2f} | {m['peak'] / g:.2f} | "
            f"{row['rollout_flops'] / 1e15:.1f} PFLOP, {row['rollout_s']:.3g} s | "
            f"{row['train_flops'] / 1e15:.1f} PFLOP, {row['train_s']:.3g} s | {row['wall_s']} |",
            flush=True,
        )
    if args.out:
        machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}
        Path(args.out).write_text(
            json.dumps({"gpu": GPU, "mfu": MFU, "machine": machine, "plans": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
