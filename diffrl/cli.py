"""``diffrl`` command line: train, eval, sample, export, recipes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """RL post-training for diffusion and flow-matching generators.

  diffrl train recipes/tiny_sft.yaml train.iterations=50     train from a recipe, with overrides
  diffrl eval base                                           mean OCR reward of the shipped tiny base
  diffrl eval runs/tiny_sft/checkpoints/final                ... of a checkpoint
  diffrl eval CHECKPOINT --baseline base                     ... and how much it beats the base (paired)
  diffrl sample base --prompt 'the number "42"'              prompts -> PNG files and a grid
  diffrl export runs/tiny_sft/checkpoints/final OUT_DIR      a checkpoint -> diffusers-layout model
  diffrl recipes                                             list the shipped recipes
"""


def _resolve_target(target: str, overrides: list[str]):
    """``base`` | a recipe YAML | a checkpoint dir | a model dir -> (config, checkpoint or None)."""
    from diffrl.config import load_config
    from diffrl.train.checkpoint import is_checkpoint

    path = Path(target)
    if target == "base":
        return load_config({}, overrides), None
    if path.suffix in (".yaml", ".yml"):
        return load_config(path, overrides), None
    if is_checkpoint(path):
        return load_config(path / "config.yaml", overrides), path
    if path.is_dir():
        return load_config({"model": {"path": str(path)}}, overrides), None
    raise SystemExit(f"error: {target!r} is not 'base', a recipe .yaml, a checkpoint or a model folder")


def _load_for_inference(config, checkpoint):
    from diffrl.models.registry import load_family
    from diffrl.train.actor import apply_lora
    from diffrl.train.checkpoint import (
        check_checkpoint_family,
        load_weights_into,
        lora_config_of,
        read_checkpoint_info,
    )

    if checkpoint is not None:
        info = read_checkpoint_info(checkpoint)
        check_checkpoint_family(info, config.model.family, checkpoint)
    family = load_family(config)
    if checkpoint is not None:
        lora = lora_config_of(info)
        if lora is not None:
            apply_lora(family, lora)
        load_weights_into(family, checkpoint)
    family.transformer.requires_grad_(False)
    return family


def cmd_train(args) -> int:
    from diffrl.config import load_config
    from diffrl.train.loop import train

    config = load_config(args.recipe, args.overrides)
    result = train(config)
    print(f"\ncheckpoint: {result.checkpoint}")
    if result.evals:
        from diffrl.train.evaluate import eval_table

        first, last = result.evals[0], result.evals[-1]
        key = next((k for k in last if k.endswith("reward_mean")), None)
        if key:
            print(eval_table(result.evals, key))
            print(f"{key}: {first[key]:.4f} (step {first['step']}) -> {last[key]:.4f} (step {last['step']})")
        print(f"eval grids (same prompts and seeds at every eval): {result.output_dir / 'eval'}")
        print(f"eval curve: {result.output_dir / 'eval_curve.png'}")
    return 0


def cmd_eval(args) -> int:
    import dataclasses
    import json

    from diffrl.rewards.base import RewardSet
    from diffrl.train.evaluate import evaluate, paired_difference, save_grid

    overrides = list(args.overrides)
    if args.num_prompts is not None:
        overrides.append(f"eval.num_prompts={args.num_prompts}")
    if args.samples_per_prompt is not None:
        overrides.append(f"eval.samples_per_prompt={args.samples_per_prompt}")
    if args.prompts:
        overrides.append(f"eval.prompts={args.prompts}")
    config, checkpoint = _resolve_target(args.target, overrides)
    baseline = None
    if args.baseline:
        # the baseline's model, sampled and scored exactly as the target: same config, prompts, seeds
        base_config, base_checkpoint = _resolve_target(args.baseline, [])
        if base_config.model.family != config.model.family:
            raise SystemExit(
                f"error: --baseline {args.baseline!r} is a {base_config.model.family!r} model, the target a "
                f"{config.model.family!r} one; a paired comparison needs the same family (same noise)"
            )
        baseline = (dataclasses.replace(config, model=base_config.model), base_checkpoint)
    rewards = RewardSet(config.eval.rewards)
    try:
        result = evaluate(_load_for_inference(config, checkpoint), config, rewards)
        base = evaluate(_load_for_inference(*baseline), config, rewards) if baseline else None
    finally:
        rewards.close()
    out = Path(args.out)
    grid = save_grid(result.images[: config.eval.grid_images], out / "grid.png")
    for name, scores in result.rewards.items():
        print(
            f"{name}: mean {scores.mean():.4f}  (n={len(scores)}, exact {(scores == 1).float().mean():.2%})"
        )
    print(f"mean reward: {result.total.mean():.4f} over {len(result.prompts)} samples")
    scores = {"prompts": result.prompts, "reward": result.total.tolist()}
    if base is not None:
        diff, se = paired_difference(result.total, base.total)
        print(
            f"baseline {args.baseline}: mean reward {base.total.mean():.4f}; difference {diff:+.4f} "
            f"+- {se:.4f} (standard error, paired over the same {len(base.prompts)} prompts and seeds)"
        )
        scores["baseline_reward"] = base.total.tolist()
    (out / "scores.json").write_text(json.dumps(scores))
    print(f"grid: {grid}; per-sample scores: {out / 'scores.json'}")
    return 0


def cmd_sample(args) -> int:
    from diffrl.data.prompts import PromptSet, load_prompts
    from diffrl.train.evaluate import generate, save_grid, to_pil

    config, checkpoint = _resolve_target(args.target, args.overrides)
    if args.prompt:
        prompts = PromptSet(list(args.prompt))
    elif args.prompts:
        prompts = load_prompts(args.prompts).head(args.num_prompts)
    else:
        raise SystemExit("error: give --prompt TEXT (repeatable) or --prompts FILE")
    family = _load_for_inference(config, checkpoint)
    index, images = generate(
        family, config, prompts, args.samples_per_prompt, args.seed, config.eval.batch_size
    )
    names = [prompts.prompts[i] for i in index]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for k, img in enumerate(images):
        to_pil(img).save(out / f"{k:04d}.png")
    (out / "prompts.txt").write_text("\n".join(names) + "\n")
    print(f"wrote {len(images)} images and grid {save_grid(images, out / 'grid.png')}")
    return 0


def cmd_export(args) -> int:
    from diffrl.models.registry import DTYPES

    config, checkpoint = _resolve_target(args.checkpoint, [])
    if checkpoint is None:
        raise SystemExit(f"error: {args.checkpoint!r} is not a diffrl checkpoint")
    family = _load_for_inference(config, checkpoint)
    if config.model.lora is not None and not args.merge:
        how = family.save_lora(args.out_dir)
        if how is not None:
            print(f"wrote the LoRA adapter to {args.out_dir}; in diffusers: {how}")
            return 0
    if config.model.lora is not None:  # merge the adapter into the base weights, then drop it
        family.transformer.fuse_lora()
        family.transformer.unload_lora()
    family.save_pretrained(args.out_dir, dtype=DTYPES[args.dtype] if args.dtype else None)
    print(f"wrote {family.name} model to {args.out_dir}")
    return 0


def cmd_recipes(args) -> int:
    from diffrl.config import recipes_dir

    for f in sorted(recipes_dir().glob("*.yaml")):
        lines = f.read_text().splitlines()
        summary = next(
            (ln.lstrip("# ").strip() for ln in lines[1:] if ln.startswith("#") and ln.strip("# ")), ""
        )
        print(f"{f.name:28s} {summary}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="diffrl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train from a recipe")
    t.add_argument("recipe")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-4")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="score a model on a prompt set; print the mean reward; write a grid")
    e.add_argument("target", help="'base', a recipe .yaml, a checkpoint folder or a model folder")
    e.add_argument("overrides", nargs="*")
    e.add_argument("--prompts", help="prompt file (default: the config's eval.prompts)")
    e.add_argument("--num-prompts", type=int)
    e.add_argument("--samples-per-prompt", type=int, help="default: the config's eval.samples_per_prompt")
    e.add_argument(
        "--baseline",
        help="another target ('base', a checkpoint, ...) sampled with the same prompts and seeds; "
        "prints the paired difference of the mean reward and its standard error",
    )
    e.add_argument("--out", default="runs/eval")
    e.set_defaults(func=cmd_eval)

    s = sub.add_parser("sample", help="prompts -> PNG files and a grid")
    s.add_argument("target")
    s.add_argument("overrides", nargs="*")
    s.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    s.add_argument("--prompts", help="prompt file")
    s.add_argument("--num-prompts", type=int)
    s.add_argument("--samples-per-prompt", type=int, default=1)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default="runs/samples")
    s.set_defaults(func=cmd_sample)

    x = sub.add_parser(
        "export",
        help="a LoRA checkpoint -> the adapter as diffusers loads it (families with a diffusers "
        "pipeline), else a diffusers-layout model folder",
    )
    x.add_argument("--merge", action="store_true", help="merge a LoRA into a full model folder instead")
    x.add_argument("checkpoint")
    x.add_argument("out_dir")
    x.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    x.set_defaults(func=cmd_export)

    r = sub.add_parser("recipes", help="list the shipped recipes")
    r.set_defaults(func=cmd_recipes)
    return p


def main(argv: list[str] | None = None) -> int:
    from diffrl.config import ConfigError
    from diffrl.data.offline import DatasetError
    from diffrl.data.prompts import PromptFileError
    from diffrl.models.base import FamilyMismatchError
    from diffrl.registry import RegistryError
    from diffrl.rewards.base import RewardError

    parser = build_parser()
    # key=value overrides may also come after options (``eval base --num-prompts 8 sampling.num_steps=4``)
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if "=" not in a or a.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return args.func(args)
    except (
        ConfigError,
        PromptFileError,
        DatasetError,
        FamilyMismatchError,
        RegistryError,
        RewardError,
        FileNotFoundError,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
