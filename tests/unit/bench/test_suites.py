"""The benchmarks' prompt files in their own formats: the shipped test prompts, lines as the
benchmarks write them, and a clear error for each malformed line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diffrl.bench.scorers import SCORERS
from diffrl.bench.suites import SUITES, SuiteError, load_suite, ocr_target, suite_name
from diffrl.core.user_files import UserFileError

ROOT = Path(__file__).resolve().parents[3]

# lines as the benchmarks ship them (flow_grpo dataset/ocr/test.txt, GenEval's
# evaluation_metadata.jsonl, DrawBench's csv with a quoted prompt holding a comma)
OCR_LINE = (
    'A close-up photograph of an engraved silver ring with the inscription "Forever Yours" delicately '
    "etched into its surface, set against a soft, blurred background of romantic, warm tones."
)
GENEVAL_LINES = [
    {"tag": "counting", "include": [{"class": "wine glass", "count": 2}], "exclude": [{"class": "wine glass", "count": 3}], "prompt": "a photo of two wine glasses"},
    {"tag": "position", "include": [{"class": "sink", "count": 1}, {"class": "bowl", "count": 1, "position": ["right of", 0]}], "prompt": "a photo of a bowl right of a sink"},
    {"tag": "color_attr", "include": [{"class": "handbag", "count": 1, "color": "pink"}, {"class": "scissors", "count": 1, "color": "black"}], "prompt": "a photo of a pink handbag and a black scissors"},
]  # fmt: skip


def test_the_shipped_prompts_load_and_cover_each_suite():
    ocr, geneval, drawbench = (load_suite(s) for s in SUITES)
    assert all(ocr_target(p) for p in ocr.prompts) and set(ocr.categories) == {"ocr"}
    # every GenEval tag is there, with its line as metadata
    assert set(geneval.categories) == {
        "single_object",
        "two_object",
        "counting",
        "colors",
        "position",
        "color_attr",
    }
    assert geneval.metadata[0]["include"] == [{"class": "bench", "count": 1}]
    assert len(set(drawbench.categories)) >= 3 and drawbench.source == str(SUITES["drawbench"].shipped)


def test_every_suite_has_its_scorer_and_its_own_name():
    assert list(SCORERS) == list(SUITES) and all(name == s.name for name, s in SUITES.items())
    # GenEval draws 4 images a prompt (generation/diffusers_generate.py --n_samples 4); the others 1
    assert {n: s.samples_per_prompt for n, s in SUITES.items()} == {"ocr": 1, "geneval": 4, "drawbench": 1}


def test_flow_grpos_ocr_format(tmp_path):
    f = tmp_path / "test.txt"
    f.write_text(f'{OCR_LINE}\n\nthe number "42"\n')
    prompts = load_suite("ocr", f)
    assert prompts.prompts == [OCR_LINE, 'the number "42"']  # blank lines skipped
    assert ocr_target(OCR_LINE) == "Forever Yours"
    f.write_text('the number "42"\na sign with no quoted text\nempty quotes ""\n')
    with pytest.raises(SuiteError, match=r"line 2 .* quotes no text to render.*line 3"):
        load_suite("ocr", f)


def test_genevals_format(tmp_path):
    f = tmp_path / "evaluation_metadata.jsonl"
    f.write_text("\n".join(json.dumps(line) for line in GENEVAL_LINES) + "\n")
    prompts = load_suite("geneval", f)
    assert prompts.categories == ["counting", "position", "color_attr"]
    assert prompts.metadata == GENEVAL_LINES and prompts.prompts[1] == "a photo of a bowl right of a sink"


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"tag": "counting", "include": [', "line 2: not valid JSON"),
        ('["a list"]', "line 2: a JSON list, not an object"),
        ('{"tag": "x", "prompt": "p"}', 'line 2: no "include"'),
        (
            '{"tag": "x", "prompt": "p", "include": [{"class": "dog", "count": 0}]}',
            '"count" must be an integer in [1, 1000]',
        ),
        (
            '{"tag": "x", "prompt": "p", "include": [{"class": "dog", "count": true}]}',
            '"count" must be an integer',
        ),
        (
            '{"tag": "x", "prompt": "p", "include": [{"class": "", "count": 1}]}',
            '"class" must be an object name',
        ),
        (
            '{"tag": "x", "prompt": "p", "include": [{"class": "car", "count": 1, "color": "gren"}]}',
            "did you mean 'green'",
        ),
        (
            '{"tag": "x", "prompt": "p", "include": [{"class": "a", "count": 1, "position": ["left of", 0]}]}',
            "index that of an earlier include entry",
        ),
        (
            '{"tag": "x", "prompt": "p", "include": [{"class": "a", "count": 1}, {"class": "b", "count": 1, "position": ["beside", 0]}]}',
            '"position" must be [relation, index]',
        ),
        ('{"tag": 3, "prompt": "p", "include": []}', '"tag" must be a short text'),
        ('{"tag": "x", "include": []}', 'line 2: no "prompt"'),
        ('{"tag": "x", "prompt": "a\\nb", "include": []}', "holds a line break"),
        ('{"tag": "x", "prompt": "p", "prompt": "q", "include": []}', "given twice"),
    ],
)
def test_a_malformed_geneval_line_is_named(tmp_path, line, message):
    f = tmp_path / "metadata.jsonl"
    f.write_text(json.dumps(GENEVAL_LINES[0]) + "\n" + line + "\n")
    with pytest.raises(SuiteError) as e:
        load_suite("geneval", f)
    assert message in str(e.value) and str(f) in str(e.value)


def test_drawbenchs_csv(tmp_path):
    f = tmp_path / "drawbench.csv"
    f.write_text(
        "Prompts,Category,Source\n\"A storefront with 'Hello, World' on it.\",Text,Imagen\nA red car.,Colors,x\n"
    )
    prompts = load_suite("drawbench", f)
    assert prompts.prompts == ["A storefront with 'Hello, World' on it.", "A red car."]
    assert prompts.categories == ["Text", "Colors"]
    f.write_text("Prompt,Kind\nA red car.,Colors\n")
    with pytest.raises(SuiteError, match="lacks the column.*Prompts, Category"):
        load_suite("drawbench", f)
    f.write_text("Prompts,Category\nA red car.\n")
    with pytest.raises(SuiteError, match="line 2: 1 column"):
        load_suite("drawbench", f)


def test_files_and_names_that_are_not_a_suite(tmp_path):
    with pytest.raises(SuiteError, match="Did you mean 'geneval'"):
        suite_name("genevl")
    with pytest.raises(SuiteError, match="one of ocr, geneval, drawbench"):
        suite_name("parti")
    with pytest.raises(UserFileError, match="does not exist"):
        load_suite("ocr", tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(SuiteError, match="holds no prompt"):
        load_suite("ocr", tmp_path / "empty.txt")
    with pytest.raises(UserFileError, match="is a folder"):
        load_suite("geneval", tmp_path)


def test_head():
    prompts = load_suite("geneval")
    assert load_suite("geneval").head(2).prompts == prompts.prompts[:2]
    with pytest.raises(SuiteError, match="ask for 1 to"):
        prompts.head(len(prompts.prompts) + 1)


def test_a_bad_suite_or_file_answers_before_torch_loads():
    probe = (
        "import sys\nfrom diffrl.cli import main\n"
        "codes = [main(['bench', 'base', '--suite', 'genevl']), main(['bench', 'base', '--suite', 'ocr', '--prompts', '/nope'])]\n"
        "print(codes, [m for m in ('torch', 'transformers', 'diffusers', 'diffrl.models') if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip() == "[2, 2] []", proc.stdout + proc.stderr
    assert "Did you mean 'geneval'?" in proc.stderr and "'/nope' does not exist" in proc.stderr


def test_a_file_of_bad_lines_is_read_only_so_far(tmp_path):
    f = tmp_path / "many.txt"
    f.write_text("no quotes here\n" * 100_000)
    with pytest.raises(SuiteError) as e:
        load_suite("ocr", f)
    assert "line 1 " in str(e.value) and "; and at least 90 more" in str(e.value) and len(str(e.value)) < 2000
