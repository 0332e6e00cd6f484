"""Reward benchmark, measured side by side in one run.

    python benchmarks/rewards.py [--repeats 5] [--skip-overlap]

Prints
 (a) images/s of each built-in reward at 1, 16 and 64 images per call, on tiny random copies of
     its model (the classes of the real ones, built as the tests build them: the preprocessing,
     tokenising and batching are the real code; the model is tiny, so this is the reward's overhead,
     not a real model's cost) and, for OCR, the real PP-OCR models that ship in rapidocr's wheel;
     the contenders interleave round by round, each figure is the median of the rounds with the
     spread (min-max) beside it;
 (b) the share of reward time hidden behind sampling in a tiny Flow-GRPO rollout, for the OCR
     reward scored by the local worker pool and by a `diffrl serve-reward` server on loopback:
     hidden = 1 - (wait for scores after the last micro-group) / (time to score the same
     micro-groups one after another, nothing else running);
 (c) with --real-size BATCH: seconds per image of the real architectures of PickScore / HPSv2.1
     (CLIP ViT-H-14) and CLIPScore / the aesthetic predictor (CLIP ViT-L/14), randomly initialised
     (the cost does not depend on the weights' values), float32 and bfloat16, on this CPU.
Images are 32 x 64: the tiny world's digits, rendered as its training data is.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' tiny builders

SIZES = (1, 16, 64)
HEIGHT, WIDTH = 32, 64


def tiny_rewards(root: Path) -> dict[str, Callable[[], object]]:
    """Reward name -> a builder of the reward on its tiny copy (files written under ``root``)."""
    from diffrl.rewards.aesthetic import Aesthetic
    from diffrl.rewards.clip_score import ClipScore
    from diffrl.rewards.hpsv2 import HPSv2
    from diffrl.rewards.jpeg import JpegCompressibility, JpegIncompressibility
    from diffrl.rewards.judge import JudgeReward
    from diffrl.rewards.ocr import OCRReward
    from diffrl.rewards.pickscore import PickScore
    from tests.unit.rewards import test_aesthetic, test_hpsv2, test_judge
    from tests.unit.rewards.tiny_clip import write_clip, write_tokenizer

    write_clip(root / "pickscore")
    write_clip(root / "clip", seed=7)
    torch.save(test_aesthetic.predictor_state(), root / "aesthetic.pth")
    tokenizer = write_tokenizer(root / "laion")
    torch.save({"state_dict": test_hpsv2.open_clip_state(len(tokenizer))}, root / "hps.pt")
    test_judge.build("qwen2_5_vl", root / "judge")
    return {
        "pickscore": lambda: PickScore(str(root / "pickscore")),
        "clip_score": lambda: ClipScore(str(root / "clip")),
        "aesthetic": lambda: Aesthetic(str(root / "clip"), str(root / "aesthetic.pth")),
        "hpsv2": lambda: HPSv2(str(root / "hps.pt"), tokenizer=str(root / "laion")),
        "judge": lambda: JudgeReward(str(root / "judge")),
        "jpeg_compressibility": JpegCompressibility,
        "jpeg_incompressibility": JpegIncompressibility,
        "ocr (real PP-OCR, 1 process)": lambda: OCRReward(num_workers=0),
    }


def throughput(repeats: int) -> None:
    import random

    from diffrl.core.rollout import quantize
    from diffrl.data.synthetic_text import draw_style, prompt_for, render, to_tensor

    # the tiny world's pictures (digits rendered on a plain ground), so OCR finds text to read
    rng = random.Random(0)
    texts = [f"{rng.randrange(10**4):04d}" for _ in range(max(SIZES))]
    prompts = [prompt_for(t) for t in texts]
    images = quantize(
        torch.stack([to_tensor(render(t, draw_style(t, rng, HEIGHT, WIDTH), HEIGHT, WIDTH)) for t in texts])
    )
    with tempfile.TemporaryDirectory() as tmp:
        rewards = {name: build() for name, build in tiny_rewards(Path(tmp)).items()}
        times: dict[tuple[str, int], list[float]] = {(r, n): [] for r in rewards for n in SIZES}
        for reward in rewards.values():  # warm-up: first-call costs (allocations, lazy init)
            reward(images[:2].float() / 255, prompts[:2], [{}] * 2)
        for _ in range(repeats):
            for n in SIZES:
                x = images[:n].float() / 255  # what RewardSet hands a reward (uint8 / 255)
                for name, reward in rewards.items():
                    t0 = time.perf_counter()
                    reward(x, prompts[:n], [{}] * n)
                    times[(name, n)].append(time.perf_counter() - t0)
        for reward in rewards.values():
            reward.close()
    print(
        f"(a) images/s per reward on its tiny copy ({HEIGHT}x{WIDTH} images; median of {repeats} rounds, min-max)"
    )
    print(f"{'reward':34s}" + "".join(f"{f'{n} per call':>26s}" for n in SIZES))
    for name in rewards:
        cells = []
        for n in SIZES:
            rates = sorted(n / t for t in times[(name, n)])
            cells.append(f"{statistics.median(rates):9.1f} ({rates[0]:.1f}-{rates[-1]:.1f})")
        print(f"{name:34s}" + "".join(f"{c:>26s}" for c in cells))


# The real models' architectures (their config.json), with random weights: the real compute cost.
VIT_H_14 = {  # laion/CLIP-ViT-H-14-laion2B-s32B-b79K, PickScore_v1 (and HPSv2.1's backbone)
    "projection_dim": 1024,
    "text_config": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "hidden_act": "gelu",
    },
    "vision_config": {
        "hidden_size": 1280,
        "intermediate_size": 5120,
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "image_size": 224,
        "patch_size": 14,
        "hidden_act": "gelu",
    },
}
VIT_L_14 = {  # openai/clip-vit-large-patch14 (clip_score, aesthetic)
    "projection_dim": 768,
    "text_config": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
    },
    "vision_config": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "image_size": 224,
        "patch_size": 14,
    },
}


def write_real_size(folder: Path, arch: dict) -> None:
    """A randomly initialised CLIPModel of ``arch``'s sizes, with the tiny tokenizer (the vocabulary
    size does not change the cost) and a 224-pixel processor config."""
    from transformers import CLIPConfig, CLIPModel

    from tests.unit.rewards.tiny_clip import vocabulary, write_processor, write_tokenizer

    n = len(vocabulary())
    text = {
        **arch["text_config"],
        "vocab_size": n,
        "max_position_embeddings": 77,
        "bos_token_id": n - 2,
        "eos_token_id": n - 1,
    }
    CLIPModel(
        CLIPConfig(
            projection_dim=arch["projection_dim"], text_config=text, vision_config=arch["vision_config"]
        )
    ).save_pretrained(folder)
    write_tokenizer(folder)
    write_processor(folder, 224)


def real_size(repeats: int, batch: int) -> None:
    from diffrl.rewards.aesthetic import LINEAR_LAYERS, Aesthetic
    from diffrl.rewards.clip_score import ClipScore
    from diffrl.rewards.pickscore import PickScore

    prompts = [f"a photo of object {i} on a wooden table, studio light" for i in range(batch)]
    images = torch.rand(batch, 3, 512, 512)  # a real run's 512 px images, resized by the processors
    widths = [768, 1024, 128, 64, 16, 1]  # the LAION predictor v2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_real_size(root / "vit_h_14", VIT_H_14)
        write_real_size(root / "vit_l_14", VIT_L_14)
        predictor = {}
        for i, (d_in, d_out) in zip(LINEAR_LAYERS, zip(widths, widths[1:])):
            predictor[f"layers.{i}.weight"] = torch.randn(d_out, d_in) / d_in**0.5
            predictor[f"layers.{i}.bias"] = torch.zeros(d_out)
        torch.save(predictor, root / "predictor.pth")
        print(
            f"\n(c) seconds per image of the real-size models on this machine's CPU ({torch.get_num_threads()} "
            f"threads), {batch} images of 512 px per call (median of {repeats} calls, min-max)"
        )
        for dtype in ("float32", "bfloat16"):
            builds = {
                "pickscore / hpsv2 (ViT-H-14)": lambda dtype=dtype: PickScore(
                    str(root / "vit_h_14"), dtype=dtype
                ),
                "clip_score (ViT-L/14)": lambda dtype=dtype: ClipScore(str(root / "vit_l_14"), dtype=dtype),
                "aesthetic (ViT-L/14 image + MLP)": lambda dtype=dtype: Aesthetic(
                    str(root / "vit_l_14"), str(root / "predictor.pth"), dtype=dtype
                ),
            }
            for name, build in builds.items():
                reward = build()
                reward(images[:1], prompts[:1], [{}])  # warm-up
                times = sorted(
                    _timed(lambda r=reward: r(images, prompts, [{}] * batch)) / batch for _ in range(repeats)
                )
                print(
                    f"{name:34s} {dtype:9s} {statistics.median(times):7.3f} s ({times[0]:.3f}-{times[-1]:.3f})"
                )
                del reward


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, token_file: Path) -> subprocess.Popen:
    """``diffrl serve-reward --reward ocr`` on loopback; returns once /health answers."""
    import urllib.request

    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diffrl.cli",
            "serve-reward",
            "--reward",
            "ocr",
            "--port",
            str(port),
            "--token-file",
            str(token_file),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return server
        except OSError:
            if server.poll() is not None:
                raise SystemExit(f"diffrl serve-reward exited with code {server.returncode}") from None
            time.sleep(0.2)
    server.kill()
    raise SystemExit("diffrl serve-reward did not answer /health within 120 s")


def overlap(repeats: int) -> None:
    from diffrl.algorithms.registry import build_algorithm
    from diffrl.preflight import load_config
    from diffrl.train.gather import collect_rollout
    from diffrl.train.runner import LocalRunner

    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "token"
        token.write_text("benchmark-token\n")
        os.environ["DIFFRL_BENCH_TOKEN"] = "benchmark-token"
        port = free_port()
        server = start_server(port, token)
        contenders = {
            "local OCR pool (2 workers)": "[{name: ocr, params: {num_workers: 2}}]",
            "remote server (OCR)": f"[{{name: remote, params: {{url: 'http://127.0.0.1:{port}', "
            "token_env: DIFFRL_BENCH_TOKEN}}]",
        }
        runners = {}
        try:
            for name, rewards in contenders.items():
                config = load_config(
                    "recipes/tiny_grpo_ocr_small.yaml",
                    [
                        f"rewards={rewards}",
                        "eval.enabled=false",
                        "model.lora=null",
                        f"run.output_dir={tmp}/{len(runners)}",
                    ],
                )
                algorithm = build_algorithm(config)
                runners[name] = LocalRunner(config, algorithm, algorithm.collection_spec())
            hidden = {name: [] for name in runners}
            waits = {name: [] for name in runners}
            for it in range(repeats + 1):  # rollout 0 warms the workers and the server up
                for name, runner in runners.items():
                    batch, stats = collect_rollout(runner, it)
                    parts = [
                        batch.select(torch.nonzero(batch.micro_group == g).flatten())
                        for g in batch.micro_group.unique()
                    ]
                    t0 = time.perf_counter()
                    for part in parts:  # the same scoring, one micro-group after another
                        runner.score(part).result()
                    serial = time.perf_counter() - t0
                    if it:
                        hidden[name].append(max(0.0, 1 - stats.reward_wait_time / serial))
                        waits[name].append((stats.sampling_time, stats.reward_wait_time, serial))
        finally:
            for runner in runners.values():
                runner.close()
            server.kill()
    n = len(batch)
    print(
        f"\n(b) reward time hidden behind sampling, tiny Flow-GRPO rollout of {n} samples "
        f"(median of {repeats} rollouts, min-max)"
    )
    for name in runners:
        h = sorted(hidden[name])
        sampling, wait, serial = (statistics.median(x) for x in zip(*waits[name]))
        print(
            f"{name:28s} hidden {statistics.median(h):6.1%} ({h[0]:.1%}-{h[-1]:.1%});  sampling "
            f"{sampling:.2f} s, wait after it {wait:.2f} s, scoring alone {serial:.2f} s"
        )


def main() -> None:
    import transformers

    transformers.logging.set_verbosity_error()  # the tiny copies' config notes
    transformers.logging.disable_progress_bar()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-overlap", action="store_true", help="leave out (b)")
    parser.add_argument(
        "--real-size",
        type=int,
        default=0,
        metavar="BATCH",
        help="also (c): the real-size CLIP models (random weights) on BATCH images per call; needs ~10 GB",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    throughput(args.repeats)
    if not args.skip_overlap:
        overlap(args.repeats)
    if args.real_size:
        real_size(max(1, args.repeats // 2), args.real_size)


if __name__ == "__main__":
    main()
