"""A JSONL line and a prompt are read strictly (issue 36, classes 4 and 5): what ``json.loads``
accepts silently or cannot bound, and what is no single prompt, are refused with the reason."""

from __future__ import annotations

import pytest

from diffrl.data.jsonl import MAX_DEPTH, JsonLineError, parse_json_line
from diffrl.data.lines import prompt_problem
from diffrl.data.prompts import PromptFileError, load_prompts


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"a": 1, "a": 2}', "key 'a' is given twice"),
        ('{"m": {"x": [{"y": 1, "y": 1}]}}', "key 'y' is given twice"),
        ('{"a": NaN}', "NaN is not JSON"),
        ('{"a": -Infinity}', "-Infinity is not JSON"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nested more than {MAX_DEPTH} levels deep"),
        ("[" * 200_000, f"nested more than {MAX_DEPTH} levels deep"),
        ("{oops}", "not valid JSON (Expecting property name"),
    ],
)
def test_a_line_json_loads_would_take_or_crash_on_is_refused(line, why):
    with pytest.raises(JsonLineError, match=why.replace("(", r"\(")):
        parse_json_line(line)


def test_a_strict_line_reads_as_json_does():
    line = '{"prompt": "a [{ b", "metadata": {"tag": "x", "n": [1, 2.5, null]}}'
    assert parse_json_line(line) == {"prompt": "a [{ b", "metadata": {"tag": "x", "n": [1, 2.5, None]}}
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH  # at the bound: read
    assert parse_json_line(deep) is not None


@pytest.mark.parametrize(
    ("prompt", "why"),
    [
        ("", "is empty"),
        ("\t ", "is empty"),
        ("a\nb", "holds a line break at character 2"),
        ("a\r\nb", "holds a line break at character 2"),
        ("a\u2028b", "U+2028 (LINE SEPARATOR)"),
        ("a\x0bb", "U+000B"),
        ("a\x00", "holds a NUL byte (character 2)"),
        ("w" * 100_001, "is 100,001 characters; a prompt is at most 100,000"),
    ],
)
def test_what_is_no_single_prompt(prompt, why):
    assert why in (prompt_problem(prompt) or "")


def test_a_prompt_passes():
    assert prompt_problem('the number "42" on a sign, in the rain') is None


def test_a_geneval_line_keeps_its_metadata_keys(tmp_path):
    """Keys far from the reserved ones stay reward metadata (GenEval's lines load as they ship)."""
    f = tmp_path / "p.jsonl"
    f.write_text(
        '{"tag": "single_object", "prompt_id": 3, "include": [{"class": "bench", "count": 1}], "prompt": "a"}\n'
    )
    assert load_prompts(f).metadata == [
        {"tag": "single_object", "prompt_id": 3, "include": [{"class": "bench", "count": 1}]}
    ]


def test_a_datasets_prompt_with_a_nul_is_refused(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"prompt": ["a", "b\x00c"]}).save_to_disk(tmp_path / "p")
    with pytest.raises(
        PromptFileError, match=r"1 prompt\(s\) holding a NUL byte or over 100,000 characters \(rows 1\)"
    ):
        load_prompts(tmp_path / "p")


def test_a_prompt_file_of_more_lines_than_a_set_holds_is_refused_before_it_is_split(tmp_path, monkeypatch):
    """At most MAX_PROMPTS (10^7) prompts: a 256 MB file of one-letter lines would be 10^8 prompts
    and ~15 GB of objects. The lines are counted before the file is split (here a bound of 3)."""
    import diffrl.data.prompts

    monkeypatch.setattr(diffrl.data.prompts, "MAX_PROMPTS", 3)
    f = tmp_path / "p.txt"
    f.write_text("a\r\nb\rc\n")  # three lines of three kinds: within the bound
    assert load_prompts(f).prompts == ["a", "b", "c"]
    f.write_text("a\nb\nc\nd\n")
    with pytest.raises(PromptFileError, match="has 4 lines; a prompt file holds at most 3 prompts"):
        load_prompts(f)
