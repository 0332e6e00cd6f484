"""Hostile config, prompts and ``diffrl plan`` inputs (issue 36, classes 3 "numbers out of range",
4 "unbounded work" and 5 "silent acceptance"): each is refused with exit 2 and an ``error:`` line
naming the input, the rule and the fix, at validation, before any model loads.

Rows use :class:`tests.integration.test_bad_inputs.Case` (``{tmp}``: the row's ``tmp_path``) and
run in process through :func:`diffrl.cli.main`; a row that got past validation fails (training is
replaced by a refusal). ``{shipped}`` is the folder of real models' JSON files diffrl ships for
``diffrl plan`` (``diffrl/models/assets/configs``): a model folder whose weights are absent, which
is all the size rules read.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diffrl.models.base import SHIPPED_CONFIGS
from tests.integration.test_bad_inputs import BAD, ROOT, SFT, Case, _check, _setup, run_row

GRPO = "recipes/tiny_grpo_ocr_small.yaml"
DPO = "recipes/tiny_dpo_ocr.yaml"
SD3 = "recipes/sd35_grpo_ocr.yaml"
FLUX = "recipes/flux_grpo_ocr.yaml"
QWEN = "recipes/qwen_image_grpo_ocr.yaml"
WAN = "recipes/wan22_grpo.yaml"
Z_IMAGE = "recipes/z_image_nft_pickscore.yaml"
SD3_FOLDER = ["model.family=sd3", f"model.path={SHIPPED_CONFIGS / 'stable-diffusion-3.5-medium'}"]
"""A train or sample row on a local SD3.5 folder (its JSON files: no weights, no scheduler/)."""
PAIRS = {"pairs/a.png": b"", "pairs/b.png": b""}
DEEP = "[" * 40_000 + "]" * 40_000
"""A JSON value nested 40,000 deep in 80,000 characters (``json.loads`` raises RecursionError)."""


def fifo(name: str):
    """``prepare``: ``{tmp}/name`` a FIFO (opening it to read would wait for a writer forever)."""
    return lambda tmp: os.mkfifo(tmp / name)


NOT_FOR_SFT = "is not used by algorithm 'sft' (it trains on data.dataset"

# one row a line: the table reads down its columns
# fmt: off
CASES: list[Case] = [
    # ---- class 3: sizes a family cannot draw, refused by every command (plan reads the shipped JSON files)
    Case("c3-plan-sd3-beyond-its-position-embedding", ["plan", SD3, "sampling.height=16384", "sampling.width=16384"], BAD, "sampling.height=16384 is larger than the sd3 model takes: at most 6144 pixels (the position embedding spans 384 patches of 16 pixels); e.g. sampling.height=6144"),
    Case("c3-plan-flux-below-its-multiple", ["plan", FLUX, "sampling.height=8", "sampling.width=8"], BAD, "sampling.width=8 does not fit the flux model: height and width must be multiples of 16 (the VAE's 8x downsampling, then 2 x 2 packing); e.g. sampling.width=16"),
    Case("c3-plan-qwen-image-width-17", ["plan", QWEN, "sampling.width=17"], BAD, "sampling.width=17 does not fit the qwen_image model: height and width must be multiples of 16 (the VAE's 8x compression times the 2 x 2 packing); e.g. sampling.width=16 or 32"),
    Case("c3-plan-z-image-beyond-its-rope", ["plan", Z_IMAGE, "sampling.height=8208"], BAD, "at most 8192 pixels (the transformer's RoPE table has 512 patch positions a side); e.g. sampling.height=8192"),
    Case("c3-plan-wan-frames-beyond-its-rope", ["plan", WAN, "model.options.num_frames=10001"], BAD, "model.options.num_frames=10001 is more than the wan model takes: at most 4093 frames (its RoPE table has 1024 positions, each 4 frames after the VAE); e.g. model.options.num_frames=4093"),
    Case("c3-plan-wan-frames-100001", ["plan", WAN, "model.options.num_frames=100001"], BAD, "model.options.num_frames must be in [1, 10001] (frames per video; 1: stills), got 100001"),
    Case("c3-train-sd3-folder-beyond-its-position-embedding", ["train", GRPO, *SD3_FOLDER, "sampling.height=16384"], BAD, "sampling.height=16384 is larger than the sd3 model takes: at most 6144 pixels"),
    Case("c3-sample-sd3-folder-width-17", ["sample", "base", "--prompt", "a", *SD3_FOLDER, "sampling.width=17"], BAD, "sampling.width=17 does not fit the sd3 model"),
    Case("c3-eval-sd3-folder-width-17", ["eval", "base", *SD3_FOLDER, "sampling.width=17"], BAD, "sampling.width=17 does not fit the sd3 model"),
    # ---- class 3: a number of the wrong kind or beyond a float, at validation
    Case("c3-iterations-a-boolean", ["train", SFT, "train.iterations=true"], BAD, "train.iterations: expected an integer, got True"),
    Case("c3-iterations-a-quoted-string", ["train", SFT, "train.iterations='5'"], BAD, "train.iterations: expected an integer, got '5'"),
    Case("c3-iterations-a-list", ["train", SFT, "train.iterations=[5]"], BAD, "train.iterations: expected an integer, got [5]"),
    Case("c3-lr-1e999", ["train", SFT, "train.lr=1e999"], BAD, "train.lr must be in (0, 1] (e.g. 1e-4), got inf"),
    Case("c3-lr-negative-zero", ["train", SFT, "train.lr=-0.0"], BAD, "train.lr must be in (0, 1] (e.g. 1e-4), got -0.0"),
    Case("c3-iterations-401-digits", ["train", SFT, "train.iterations=" + "9" * 401], BAD, "train.iterations must be in [1, 1_000_000_000], got an integer of about"),
    # ---- class 4: a user's file cannot make diffrl recurse without bound or hold a megabyte prompt
    Case("c4-prompts-jsonl-nested-deep", ["train", GRPO, "data.prompts={tmp}/p.jsonl"], BAD, "line 1: nested more than 64 levels deep", files={"p.jsonl": '{"prompt": "a", "metadata": {"x": ' + DEEP + "}}\n"}),
    Case("c4-dataset-metadata-nested-deep", ["train", SFT, "data.dataset={tmp}/images"], BAD, "line 1: nested more than 64 levels deep", files={"images/a.png": b"", "images/metadata.jsonl": '{"file_name": "a.png", "text": ' + DEEP + "}\n"}),
    Case("c4-pairs-nested-deep", ["train", DPO, "algorithm.params={pairs: offline}", "data.dataset={tmp}/pairs", "rewards=[]"], BAD, "line 1: nested more than 64 levels deep", files={**PAIRS, "pairs/metadata.jsonl": '{"prompt": ' + DEEP + "}\n"}),
    Case("c4-prompts-line-of-900000-characters", ["train", GRPO, "data.prompts={tmp}/p.txt"], BAD, "line 1: 900,000 characters; a prompt line is at most 100,000", files={"p.txt": "w" * 900_000 + "\nb\n"}, absent="w" * 1000),
    Case("c4-recipe-a-fifo", ["train", "{tmp}/r.yaml"], BAD, "r.yaml' is a FIFO (named pipe), not a regular file; give a recipe .yaml file", prepare=fifo("r.yaml")),
    Case("c4-prompts-a-fifo", ["train", GRPO, "data.prompts={tmp}/p.txt"], BAD, "p.txt' is a FIFO (named pipe), not a regular file", prepare=fifo("p.txt")),
    Case("c4-eval-prompts-a-fifo", ["eval", "base", "--prompts", "{tmp}/p.txt"], BAD, "eval.prompts: prompt file", prepare=fifo("p.txt")),
    Case("c4-sample-prompt-too-long", ["sample", "base", "--prompt", "w" * 100_001], BAD, "--prompt 1 ('wwww", absent="w" * 1000),
    # ---- class 5: JSONL lines that lose data without a word
    Case("c5-prompts-jsonl-prompt-twice", ["train", GRPO, "data.prompts={tmp}/p.jsonl"], BAD, "line 2: key 'prompt' is given twice in one object (JSON readers keep only the last): keep one", files={"p.jsonl": '{"prompt": "a"}\n{"prompt": "b", "prompt": "c"}\n'}),
    Case("c5-prompts-jsonl-metadata-key-twice", ["train", GRPO, "data.prompts={tmp}/p.jsonl"], BAD, "line 1: key 'tag' is given twice", files={"p.jsonl": '{"prompt": "a", "metadata": {"tag": 1, "tag": 2}}\n'}),
    Case("c5-prompts-jsonl-metdata", ["train", GRPO, "data.prompts={tmp}/p.jsonl"], BAD, "line 1: key 'metdata' is not one of 'prompt', 'metadata', 'image'. Did you mean 'metadata'?", files={"p.jsonl": '{"prompt": "a", "metdata": {"tag": "x"}}\n'}),
    Case("c5-prompts-jsonl-capital-prompt", ["train", GRPO, "data.prompts={tmp}/p.jsonl"], BAD, "Did you mean 'prompt'?", files={"p.jsonl": '{"prompt": "a", "Prompt": "b"}\n'}),
    Case("c5-prompts-jsonl-nan", ["train", GRPO, "data.prompts={tmp}/p.jsonl"], BAD, "line 1: NaN is not JSON (a number must be finite)", files={"p.jsonl": '{"prompt": "a", "metadata": {"w": NaN}}\n'}),
    Case("c5-dataset-metadata-key-twice", ["train", SFT, "data.dataset={tmp}/images"], BAD, "line 1: key 'text' is given twice", files={"images/a.png": b"", "images/metadata.jsonl": '{"file_name": "a.png", "text": "x", "text": "y"}\n'}),
    Case("c5-dataset-metadata-image-twice", ["train", SFT, "data.dataset={tmp}/images"], BAD, "line 2: file_name 'a.png' has a caption already (one row per image)", files={"images/a.png": b"", "images/metadata.jsonl": '{"file_name": "a.png", "text": "x"}\n{"file_name": "a.png", "text": "y"}\n'}),
    Case("c5-dataset-csv-column-twice", ["train", SFT, "data.dataset={tmp}/images"], BAD, "the header row names column(s) 'text' twice; keep one", files={"images/a.png": b"", "images/metadata.csv": "file_name,text,text\na.png,x,y\n"}),
    Case("c5-dataset-csv-image-twice", ["train", SFT, "data.dataset={tmp}/images"], BAD, "line 3: file_name 'a.png' has a caption already", files={"images/a.png": b"", "images/metadata.csv": "file_name,text\na.png,x\na.png,y\n"}),
    Case("c5-pairs-key-twice", ["train", DPO, "algorithm.params={pairs: offline}", "data.dataset={tmp}/pairs", "rewards=[]"], BAD, "line 1: key 'chosen' is given twice", files={**PAIRS, "pairs/metadata.jsonl": '{"prompt": "a", "chosen": "a.png", "chosen": "b.png", "rejected": "b.png"}\n'}),
    Case("c5-prompts-a-csv-table", ["train", GRPO, "data.prompts={tmp}/p.csv"], BAD, "is a .csv table, which a prompt file is not (its header and cells would become prompts)", files={"p.csv": "prompt,tag\na cat,animal\n"}),
    # ---- class 5: a --prompt that is not one prompt
    Case("c5-sample-prompt-newline", ["sample", "base", "--prompt", "a", "--prompt", "a cat\non a mat"], BAD, "--prompt 2 ('a cat\\non a mat'): holds a line break at character 6; a prompt is one line"),
    Case("c5-sample-prompt-line-separator", ["sample", "base", "--prompt", "a\u2028b"], BAD, "--prompt 1 ('a\\u2028b'): at column 2: U+2028 (LINE SEPARATOR)"),
    Case("c5-sample-prompt-paragraph-separator", ["sample", "base", "--prompt", "a\u2029b"], BAD, "U+2029 (PARAGRAPH SEPARATOR)"),
    Case("c5-sample-prompt-empty", ["sample", "base", "--prompt", ""], BAD, "--prompt 1 (''): is empty; give the text to draw"),
    Case("c5-sample-prompt-blank", ["sample", "base", "--prompt", " \t "], BAD, "is empty; give the text to draw"),
    Case("c5-sample-prompt-nul", ["sample", "base", "--prompt", "a\x00b"], BAD, "--prompt 1 ('a\\x00b'): holds a NUL byte (character 2); remove it"),
    # ---- class 5: run.name is one folder name
    Case("c5-run-name-blank", ["train", SFT, "run.name= "], BAD, "run.name must not be empty or blank (it names a folder), got ' '; e.g. run.name=my_run"),
    Case("c5-run-name-empty", ["train", SFT, "run.name="], BAD, "run.name must not be empty or blank"),
    Case("c5-run-name-dotdot", ["train", SFT, "run.name=.."], BAD, "run.name must not be '..' (it names a folder of its own)"),
    Case("c5-run-name-slash", ["train", SFT, "run.name=a/b"], BAD, "run.name names one folder: it must not hold '/' (a path separator), got 'a/b'"),
    Case("c5-run-name-tab", ["train", SFT, "run.name='a\tb'"], BAD, "it must not hold '\\t' (a control character)"),
    Case("c5-run-name-trailing-space", ["train", SFT, "run.name='a '"], BAD, "run.name starts or ends with a space (invisible in a folder listing), got 'a '"),
    Case("c5-run-name-nul", ["train", SFT, "run.name=a\x00b"], BAD, "holds a NUL byte"),
    Case("c5-run-name-over-255-bytes", ["train", SFT, "run.name=" + "é" * 200], BAD, "run.name names the run's folder: at most 255 bytes, got 400"),
    # ---- class 5: settings the algorithm does not read
    Case("c5-sft-with-rewards", ["train", SFT, "rewards=[{name: ocr}]"], BAD, "rewards is not used by algorithm 'sft' (it trains on data.dataset, it scores nothing); remove it"),
    Case("c5-sft-with-rollout", ["train", SFT, "rollout.batch_size=3", "rollout.same_latent=true"], BAD, f"rollout.same_latent {NOT_FOR_SFT}"),
    Case("c5-offline-dpo-with-rewards", ["train", DPO, "algorithm.params={pairs: offline}", "data.dataset={tmp}/pairs"], BAD, "rewards is not used by algorithm 'dpo'", files={**PAIRS, "pairs/metadata.jsonl": '{"prompt": "a", "chosen": "a.png", "rejected": "b.png"}\n'}),
    Case("c5-grpo-with-a-dataset", ["train", GRPO, "data.dataset={tmp}/images", "data.dataset_size=4"], BAD, "data.dataset is not used by algorithm 'flow_grpo' (it samples data.prompts online); remove it", files={"images/a.png": b""}),
    Case("c5-grpo-with-a-dataset-size", ["train", GRPO, "data.dataset_size=4"], BAD, "data.dataset_size is not used by algorithm 'flow_grpo'"),
    Case("c5-sft-folder-with-prompts", ["train", SFT, "data.dataset={tmp}/images", "data.prompts={tmp}/p.txt"], BAD, "data.prompts is not used by algorithm 'sft' with a dataset folder (its captions are the prompts)", files={"images/a.png": b"", "images/a.txt": "a", "p.txt": "b\n"}),
    # ---- class 5: YAML 1.1 numbers that are not what their digits say
    Case("c5-override-octal", ["train", SFT, "train.iterations=010"], BAD, "'010' is an octal number to YAML 1.1 (010 reads as 8); write it without the leading 0, or quote it for text"),
    Case("c5-override-base-60", ["train", SFT, "train.iterations=1:30"], BAD, "'1:30' is a base-60 number to YAML 1.1 (1:30 is 90)"),
    Case("c5-recipe-octal-has-its-line", ["train", "{tmp}/r.yaml"], BAD, "line 3: '0755' is an octal number", files={"r.yaml": "algorithm:\n  name: sft\nrun: {seed: 0755}\n"}),
    # ---- class 5: a look-alike key is unknown, with the key it resembles
    Case("c5-key-with-cyrillic-a", ["train", SFT, "tr\u0430in.lr=1e-4"], BAD, "unknown key 'tr\u0430in'. Did you mean 'train'?"),
]
# fmt: on


def test_the_table_is_well_formed():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and all(i[:3] in ("c3-", "c4-", "c5-") for i in ids)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_refused_at_validation(case: Case, tmp_path: Path, request, capsys, monkeypatch):
    import diffrl.cli.plan

    monkeypatch.chdir(ROOT)  # rows name the shipped recipes by their relative path
    argv = _setup(case, tmp_path, request)

    def refuse(*args, **kwargs):  # a row that got past validation must not plan either
        raise AssertionError("a refused row got past validation")

    monkeypatch.setattr(diffrl.cli.plan, "plan", refuse)  # the name the plan command calls
    _check(case, *run_row(case, argv, monkeypatch, capsys))


def test_a_size_a_family_can_draw_passes_its_rules():
    """The rules that refuse the rows above let the sizes at their edges through (plan's sizes)."""
    from diffrl.models.registry import FAMILIES
    from diffrl.preflight.schema import read_config

    for recipe, overrides in [
        (SD3, ["sampling.height=6144", "sampling.width=16"]),
        (FLUX, ["sampling.height=16", "sampling.width=16"]),
        (WAN, ["model.options.num_frames=4093", "sampling.height=16384"]),
    ]:
        config = read_config(ROOT / recipe, overrides)[0]
        family = FAMILIES.resolve(config.model.family).description
        assert family.size_rule(config, check_files=False) is not None
        assert family.size_problems(config, check_files=False) == []
        assert family.validate_config(config, check_files=False) == []
