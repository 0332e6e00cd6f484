"""``diffrl`` command line: train, eval, sample, export, report, recipes, serve-reward."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from diffrl.config import ConfigError, recipes_dir
from diffrl.data.prompts import given_prompts, load_prompts
from diffrl.distributed.ray.cluster import import_ray, ray_address_problem
from diffrl.distributed.ray.reward_server import start_reward_server
from diffrl.errors import EXIT_BUG, EXIT_USER_ERROR, DiffrlError
from diffrl.models.registry import DTYPES, load_family
from diffrl.preflight import load_config, validate
from diffrl.rewards.base import RewardError, RewardSet
from diffrl.rewards.server import bind_problem, serve
from diffrl.train.actor import apply_lora
from diffrl.train.checkpoint import (
    check_checkpoint_family,
    is_checkpoint,
    load_weights_into,
    lora_config_of,
    read_checkpoint_info,
)
from diffrl.train.evaluate import eval_table, evaluate, generate, paired_difference, save_grid, to_pil
from diffrl.train.loop import train
from diffrl.train.media import write_video_sample
from diffrl.train.report import write_report

DESCRIPTION = """RL post-training for diffusion and flow-matching generators.

  diffrl train recipes/tiny_sft.yaml train.iterations=50     train from a recipe, with overrides
  diffrl eval base                                           mean OCR reward of the shipped tiny base
  diffrl eval runs/tiny_sft/checkpoints/final                ... of a checkpoint
  diffrl eval CHECKPOINT --baseline base                     ... and how much it beats the base (paired)
  diffrl sample base --prompt 'the number "42"'              prompts -> PNG files and a grid
  diffrl export runs/tiny_sft/checkpoints/final OUT_DIR      a checkpoint -> diffusers-layout model
  diffrl report runs/tiny_sft                                a run's curves, grids and config -> one HTML page
  diffrl recipes                                             list the shipped recipes
  diffrl serve-reward --reward ocr --port 8100               serve a reward over HTTP (the remote reward)
"""


# What each command checks of a config (``train`` checks every section, ``load_config``'s default).
EVAL_SECTIONS = ("run", "model", "sampling", "eval")
"""``eval`` samples with ``sampling``, scores with ``eval.rewards``; the training sections are not its
business (a checkpoint of a run whose training reward is not installed here still evaluates)."""
SAMPLE_SECTIONS = ("run", "model", "sampling")
EXPORT_SECTIONS = ("run", "model")


def _resolve_target(target: str, overrides: list[str], sections: Sequence[str] = SAMPLE_SECTIONS):
    """``base`` | a recipe YAML | a checkpoint dir | a model dir -> (config, checkpoint or None),
    the config checked for the ``sections`` the command uses."""
    path = Path(target).expanduser()
    if target == "base":
        return load_config({}, overrides, sections=sections), None
    if path.suffix in (".yaml", ".yml"):
        return load_config(path, overrides, sections=sections), None
    if is_checkpoint(path):
        if not (path / "config.yaml").is_file():
            raise DiffrlError(
                f"checkpoint {target!r} has no config.yaml (the run's config is saved beside its weights); "
                "the folder is incomplete: copy it again"
            )
        return load_config(path / "config.yaml", overrides, sections=sections), path
    if path.is_dir():
        return load_config({"model": {"path": str(path)}}, overrides, sections=sections), None
    what = "a file" if path.is_file() else "no such file or folder"
    raise DiffrlError(
        f"{target!r} ({what}) is not 'base', a recipe .yaml, a checkpoint (a folder with checkpoint.json, "
        "e.g. runs/NAME/checkpoints/final) or a model folder"
    )


def _check_out_dir(path: Path, flag: str, empty: bool = False) -> None:
    """Refuse an output folder that cannot be one (it, or a parent, is a file) before anything
    loads; with ``empty``, also one that already holds files."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "it" if p == path else f"its parent {str(p)!r}"
                raise DiffrlError(
                    f"{flag} {str(path)!r} cannot be a folder: {where} is a file; give a folder path"
                )
            break
    if empty and path.is_dir() and any(path.iterdir()):
        n = sum(1 for _ in path.iterdir())
        raise DiffrlError(
            f"{flag} {str(path)!r} is not empty ({n} {'entry' if n == 1 else 'entries'}); give a new or empty folder, or pass --force "
            "to write into it (files of the same name are replaced)"
        )


def _load_for_inference(config, checkpoint):
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
    config = load_config(args.recipe, args.overrides)
    result = train(config)
    print(f"\ncheckpoint: {result.checkpoint}")
    if result.evals:
        first, last = result.evals[0], result.evals[-1]
        key = next((k for k in last if k.endswith("reward_mean")), None)
        if key:
            print(eval_table(result.evals, key))
            print(f"{key}: {first[key]:.4f} (step {first['step']}) -> {last[key]:.4f} (step {last['step']})")
        print(f"eval grids (same prompts and seeds at every eval): {result.output_dir / 'eval'}")
        print(f"eval curve: {result.output_dir / 'eval_curve.png'}")
    for what, name in (
        ("first and last eval", "eval/compare.png"),
        ("curves", "metrics.png"),
        ("report", "report.html"),
    ):
        if (result.output_dir / name).is_file():
            print(f"{what}: {result.output_dir / name}")
    return 0


def cmd_eval(args) -> int:

    out = Path(args.out).expanduser()
    _check_out_dir(out, "--out")
    # the eval command evaluates whatever the run's eval.enabled said about evals during training
    overrides = [*args.overrides, "eval.enabled=true"]
    if args.num_prompts is not None:
        overrides.append(f"eval.num_prompts={args.num_prompts}")
    elif args.prompts:  # a prompt file named on the command line is scored whole
        overrides.append("eval.num_prompts=null")
    if args.samples_per_prompt is not None:
        overrides.append(f"eval.samples_per_prompt={args.samples_per_prompt}")
    if args.prompts:
        overrides.append(f"eval.prompts={json.dumps(args.prompts)}")  # quoted: any path is a string
    config, checkpoint = _resolve_target(args.target, overrides, EVAL_SECTIONS)
    baseline = None
    if args.baseline:
        # the baseline's model, sampled and scored exactly as the target: same config, prompts, seeds
        base_config, base_checkpoint = _resolve_target(args.baseline, [], ("model",))
        if base_config.model.family != config.model.family:
            raise DiffrlError(
                f"--baseline {args.baseline!r} is a {base_config.model.family!r} model, the target a "
                f"{config.model.family!r} one; a paired comparison needs the same family (same noise)"
            )
        paired = dataclasses.replace(config, model=base_config.model)
        problems = validate(paired, sections=EVAL_SECTIONS)
        if problems:
            raise ConfigError(problems, f"--baseline {args.baseline}")
        baseline = (paired, base_checkpoint)
    rewards = RewardSet(config.eval.rewards)
    try:
        result = evaluate(_load_for_inference(config, checkpoint), config, rewards)
        base = evaluate(_load_for_inference(*baseline), config, rewards) if baseline else None
    finally:
        rewards.close()
    failed = [*result.errors, *(base.errors if base is not None else [])]
    if failed:
        raise RewardError(f"eval: {len(failed)} reward call(s) failed: " + "; ".join(failed))
    grid = save_grid(
        result.images[: config.eval.grid_images],
        out / "grid.png",
        sources=result.sources,
        captions=result.captions(),
    )
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
    if args.prompt and args.prompts:
        raise DiffrlError("give either --prompt TEXT (repeatable) or --prompts FILE, not both")
    if not args.prompt and not args.prompts:
        raise DiffrlError("give --prompt TEXT (repeatable) or --prompts FILE")
    if args.num_prompts is not None and not args.prompts:
        raise DiffrlError(
            "--num-prompts takes the first N prompts of --prompts FILE; with --prompt, give just those"
        )
    if args.samples_per_prompt < 1:
        raise DiffrlError(f"--samples-per-prompt must be >= 1, got {args.samples_per_prompt}")
    out = Path(args.out).expanduser()
    _check_out_dir(out, "--out")
    config, checkpoint = _resolve_target(args.target, args.overrides, SAMPLE_SECTIONS)
    if config.eval.batch_size < 1:  # sample draws eval.batch_size images per forward
        raise DiffrlError(
            f"eval.batch_size (images per sampling forward) must be >= 1, got {config.eval.batch_size}"
        )
    if args.image and not args.prompt:
        raise DiffrlError("--image goes with --prompt (one each); a prompt file names its images itself")
    if args.prompt:
        prompts = given_prompts(list(args.prompt), args.image)
    else:
        prompts = load_prompts(args.prompts)
        n = args.num_prompts
        if n is not None and not 1 <= n <= len(prompts):
            raise DiffrlError(
                f"--num-prompts {n}: {args.prompts!r} holds {len(prompts)} prompts; ask for 1 to {len(prompts)} "
                "(or leave it out for all of them)"
            )
        prompts = prompts.head(n)
    family = _load_for_inference(config, checkpoint)
    index, media = generate(
        family, config, prompts, args.samples_per_prompt, args.seed, config.eval.batch_size
    )
    names = [prompts.prompts[i] for i in index]
    out.mkdir(parents=True, exist_ok=True)
    images = media.images
    for k, img in enumerate(images):
        if img.ndim == 4:  # a video (3, F, H, W): an .mp4 with its sound, and its frames
            sound = media.audio.select([k]) if media.audio is not None else None
            write_video_sample(out, f"{k:04d}", img, media.fps, sound)
        else:
            to_pil(img).save(out / f"{k:04d}.png")
    (out / "prompts.txt").write_text("\n".join(names) + "\n")
    n = len(images)
    what = f"image{'s' * (n != 1)}" if images.ndim == 4 else f"video{'s' * (n != 1)}"
    if images.ndim == 5:
        what += " (.mp4" + (" with sound" if media.audio else "") + ", frames in NNNN/)"
    sources = prompts.source_images(index, *images.shape[-2:])  # an editing set's grid: source | result
    grid = save_grid(images, out / "grid.png", sources=sources, captions=names)  # each with its prompt
    print(f"wrote {n} {what} and grid {grid}")
    return 0


def cmd_export(args) -> int:
    if not is_checkpoint(Path(args.checkpoint).expanduser()):
        what = (
            "no such folder"
            if not Path(args.checkpoint).expanduser().exists()
            else "no checkpoint.json inside"
        )
        raise DiffrlError(
            f"{args.checkpoint!r} is not a diffrl checkpoint ({what}); give a run's checkpoint folder, "
            "e.g. runs/NAME/checkpoints/final"
        )
    out = Path(args.out_dir).expanduser()
    _check_out_dir(out, "OUT_DIR", empty=not args.force)
    # export reads the model and its weights: the run's training settings (rewards, data) need not resolve
    config, checkpoint = _resolve_target(args.checkpoint, args.overrides, EXPORT_SECTIONS)
    family = _load_for_inference(config, checkpoint)
    if config.model.lora is not None and not args.merge:
        how = family.save_lora(out)
        if how is not None:
            print(f"wrote the LoRA adapter to {out}; in diffusers: {how}")
            return 0
    if config.model.lora is not None:  # merge the adapter into the base weights, then drop it
        family.transformer.fuse_lora()
        family.transformer.unload_lora()
    family.save_pretrained(out, dtype=DTYPES[args.dtype] if args.dtype else None)
    print(f"wrote {family.name} model to {out}")
    return 0


def cmd_report(args) -> int:
    run_dir = Path(args.run_dir).expanduser()
    out = Path(args.out).expanduser() if args.out else None
    if out is not None:
        if out.is_dir():
            raise DiffrlError(
                f"--out {str(out)!r} is a folder; give the HTML file to write, e.g. {out / 'report.html'}"
            )
        _check_out_dir(out.parent, "--out's folder")
    print(f"report: {write_report(run_dir, out)}")
    return 0


def cmd_recipes(args) -> int:
    for f in sorted(recipes_dir().glob("*.yaml")):
        lines = f.read_text().splitlines()
        summary = next(
            (ln.lstrip("# ").strip() for ln in lines[1:] if ln.startswith("#") and ln.strip("# ")), ""
        )
        print(f"{f.name:28s} {summary}")
    return 0


def _reward_params(items: list[str]) -> dict:
    """``--params``: one YAML/JSON mapping (``'{device: cuda, batch_size: 8}'``) or ``key=value``
    items, each value read as YAML (``8`` an int, ``true`` a bool), as config overrides are."""
    if len(items) == 1 and items[0].lstrip().startswith("{"):
        try:
            params = yaml.safe_load(items[0])
        except yaml.YAMLError as e:
            raise DiffrlError(f"--params {items[0]!r} is not a YAML/JSON mapping ({e})") from e
        if not isinstance(params, dict):
            raise DiffrlError(f"--params {items[0]!r} must be a mapping, e.g. '{{device: cuda}}'")
        return params
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DiffrlError(
                f"--params: {item!r} is not key=value; give key=value items or one mapping, e.g. '{{device: cuda}}'"
            )
        try:
            params[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise DiffrlError(f"--params {item!r}: the value is not YAML ({e})") from e
    return params


def _server_token(args) -> str | None:
    """The token from ``--token-file`` or ``--token-env`` (surrounding whitespace dropped)."""
    if args.token_file and args.token_env:
        raise DiffrlError("give either --token-file or --token-env, not both")
    if args.token_file:
        try:
            token = Path(args.token_file).expanduser().read_text().strip()
        except OSError as e:
            raise DiffrlError(f"--token-file {args.token_file!r}: cannot read it ({e.strerror or e})") from e
        if not token:
            raise DiffrlError(f"--token-file {args.token_file!r} is empty; write the token into it")
        return token
    if args.token_env:
        token = os.environ.get(args.token_env, "").strip()
        if not token:
            raise DiffrlError(
                f"--token-env {args.token_env}: that environment variable is not set (or empty)"
            )
        return token
    return None


def _print_serving(name: str, url: str, token: str | None) -> None:
    auth = "token required" if token else "no token: this machine only"
    print(f"serving reward {name!r} at {url} ({auth}); Ctrl-C stops it", flush=True)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def cmd_serve_reward(args) -> int:
    params, token = _reward_params(args.params), _server_token(args)
    if args.max_request_mb <= 0:
        raise DiffrlError(f"--max-request-mb must be > 0, got {args.max_request_mb}")
    if not args.ray:
        if args.ray_address or args.num_gpus or args.num_cpus != 1:
            raise DiffrlError("--ray-address, --num-gpus and --num-cpus place the server on Ray: add --ray")
        host = args.host or "127.0.0.1"
        port = 8000 if args.port is None else args.port
        serve(
            args.reward,
            params,
            host,
            port,
            token,
            args.max_request_mb,
            on_ready=lambda s: _print_serving(args.reward, s.url, token),
        )
        return 0
    problem = bind_problem(args.host, token)  # before Ray starts: that takes seconds
    if problem:
        raise DiffrlError(problem)
    ray = import_ray()
    if args.ray_address and (problem := ray_address_problem(args.ray_address)):
        raise DiffrlError(problem.replace("ray.address", "--ray-address"))
    ray.init(address=args.ray_address, include_dashboard=False)
    # after ray.init, which installs a SIGTERM handler that aborts: a service manager's stop must
    # end the actor and shut down the cluster this process started or joined
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server = start_reward_server(
            args.reward,
            params,
            token=token,
            host=args.host,
            port=args.port or 0,
            num_cpus=args.num_cpus,
            num_gpus=args.num_gpus,
            max_request_mb=args.max_request_mb,
        )
        _print_serving(args.reward, server.url, token)
        try:
            server.wait()
        finally:
            server.stop()
    finally:
        ray.shutdown()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="diffrl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    debug_help = "show the full traceback of an error (for bug reports)"
    p.add_argument("--debug", action="store_true", help=debug_help)
    # also accepted after the command (``diffrl train RECIPE --debug``); SUPPRESS keeps the global value
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", parents=[common], help="train from a recipe")
    t.add_argument("recipe")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-4")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser(
        "eval", parents=[common], help="score a model on a prompt set; print the mean reward; write a grid"
    )
    e.add_argument("target", help="'base', a recipe .yaml, a checkpoint folder or a model folder")
    e.add_argument("overrides", nargs="*")
    e.add_argument(
        "--prompts", help="prompt file, all of its prompts unless --num-prompts (default: eval.prompts)"
    )
    e.add_argument("--num-prompts", type=int, help="the first N prompts (sets eval.num_prompts)")
    e.add_argument("--samples-per-prompt", type=int, help="default: the config's eval.samples_per_prompt")
    e.add_argument(
        "--baseline",
        help="another target ('base', a checkpoint, ...) sampled with the same prompts and seeds; "
        "prints the paired difference of the mean reward and its standard error",
    )
    e.add_argument("--out", default="runs/eval")
    e.set_defaults(func=cmd_eval)

    s = sub.add_parser(
        "sample",
        parents=[common],
        help="prompts -> PNG files (videos: .mp4 with sound, and frames) and a grid",
    )
    s.add_argument("target")
    s.add_argument("overrides", nargs="*")
    s.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    s.add_argument(
        "--image", action="append", help="an editing family's source image for each --prompt (repeatable)"
    )
    s.add_argument("--prompts", help="prompt file")
    s.add_argument("--num-prompts", type=int, help="the first N prompts of --prompts (default: all)")
    s.add_argument("--samples-per-prompt", type=int, default=1)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default="runs/samples")
    s.set_defaults(func=cmd_sample)

    x = sub.add_parser(
        "export",
        parents=[common],
        help="a LoRA checkpoint -> the adapter as diffusers loads it (families with a diffusers "
        "pipeline), else a diffusers-layout model folder",
    )
    x.add_argument("--merge", action="store_true", help="merge a LoRA into a full model folder instead")
    x.add_argument("checkpoint")
    x.add_argument("out_dir", help="a new or empty folder (see --force)")
    x.add_argument("overrides", nargs="*", help="key=value overrides, e.g. run.device=cpu")
    x.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    x.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty OUT_DIR (files of the same name are replaced)",
    )
    x.set_defaults(func=cmd_export)

    v = sub.add_parser(
        "serve-reward",
        parents=[common],
        help="serve a reward over HTTP for the 'remote' reward (wire format: diffrl/rewards/server.py)",
    )
    v.add_argument("--reward", required=True, help="a reward name (e.g. ocr) or a dotted path module:obj")
    v.add_argument(
        "--params", nargs="*", default=[], help="the reward's params: key=value ... or one mapping '{k: v}'"
    )
    v.add_argument("--host", help="address to bind (default 127.0.0.1; with --ray, the node's address)")
    v.add_argument("--port", type=int, help="default 8000 (with --ray: a free port); 0: a free port")
    v.add_argument("--token-file", help="a file holding the token clients must send (Bearer)")
    v.add_argument("--token-env", help="an environment variable holding the token")
    v.add_argument("--max-request-mb", type=float, default=64.0, help="larger requests get HTTP 413")
    v.add_argument("--ray", action="store_true", help="serve from a Ray actor (its own CPUs/GPUs)")
    v.add_argument("--ray-address", help="with --ray: auto or HOST:PORT of a cluster (default: start one)")
    v.add_argument("--num-gpus", type=float, default=0, help="with --ray: GPUs for the server's actor")
    v.add_argument("--num-cpus", type=float, default=1, help="with --ray: CPUs for the server's actor")
    v.set_defaults(func=cmd_serve_reward)

    h = sub.add_parser(
        "report",
        parents=[common],
        help="a run folder -> one self-contained HTML page: curves, captioned eval grids, the first "
        "and last eval side by side, final numbers, config (a run writes RUN_DIR/report.html itself)",
    )
    h.add_argument("run_dir", help="a training run's output folder, e.g. runs/tiny_demo")
    h.add_argument("--out", help="the HTML file to write (default: RUN_DIR/report.html)")
    h.set_defaults(func=cmd_report)

    r = sub.add_parser("recipes", parents=[common], help="list the shipped recipes")
    r.set_defaults(func=cmd_recipes)
    return p


USER_OS_ERRORS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EROFS, errno.EDQUOT}
"""OS errors a user's environment causes (a missing or unwritable path, a full disk), not bugs."""


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code (see :mod:`diffrl.errors`). A user's error prints
    ``error: <what is wrong and what to do>``, never a traceback (``--debug`` shows it)."""
    parser = build_parser()
    try:
        # key=value overrides may also come after options (``eval base --num-prompts 8 sampling.num_steps=4``)
        args, extra = parser.parse_known_args(argv)
        stray = [a for a in extra if "=" not in a or a.startswith("-")]
        if stray or (extra and not hasattr(args, "overrides")):
            parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    except SystemExit as e:  # argparse printed its usage and message (or --help)
        return e.code if isinstance(e.code, int) else EXIT_USER_ERROR
    if extra:
        args.overrides = [*args.overrides, *extra]
    if args.debug:
        return args.func(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except DiffrlError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        if e.errno not in USER_OS_ERRORS and not isinstance(e, FileNotFoundError):
            return _bug(e)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("\ninterrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - anything else is a bug, reported in one line
        return _bug(e)


def _bug(e: BaseException) -> int:
    print(
        f"error: unexpected {type(e).__name__}: {_one_line(str(e))} — this is a bug in diffrl; "
        "rerun with --debug for the traceback",
        file=sys.stderr,
    )
    return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
