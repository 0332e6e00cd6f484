"""``diffrl sample TARGET --prompt TEXT | --prompts FILE``: prompts -> PNG files (videos: .mp4
with their sound, and frames) and a captioned grid."""

from __future__ import annotations

import argparse
from pathlib import Path

from diffrl.cli.commands.sample import SampleInputs
from diffrl.cli.inference import checked, guarded, load_for_inference
from diffrl.cli.outputs import claim_out_folder
from diffrl.cli.targets import Target
from diffrl.core.errors import DiffrlError
from diffrl.data.prompts import given_prompts, load_prompts
from diffrl.evaluation.evaluate import generate, save_grid, to_pil
from diffrl.evaluation.media import write_video_sample


def run(args: argparse.Namespace, inputs: SampleInputs) -> int:
    return guarded(
        inputs.target.untrusted,
        inputs.out,
        "the samples",
        "free space, then run it again",
        lambda out: _run(args, checked(inputs.target), out),
    )


def _run(args: argparse.Namespace, target: Target, out: Path) -> int:
    config = target.config
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
    family = load_for_inference(config, target.checkpoint)
    index, media = generate(
        family, config, prompts, args.samples_per_prompt, args.seed, config.eval.batch_size
    )
    names = [prompts.prompts[i] for i in index]
    claim_out_folder(out, "--out", "sample")  # checked again: files may have arrived meanwhile
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
