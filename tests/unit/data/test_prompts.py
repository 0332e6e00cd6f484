import json

import pytest

from diffrl.data.prompts import PromptFileError, load_prompts


def test_txt_and_jsonl(tmp_path):
    (tmp_path / "p.txt").write_text('the text "AB"\nthe number "12"\n')
    assert load_prompts(tmp_path / "p.txt").prompts == ['the text "AB"', 'the number "12"']
    rows = [{"prompt": "a", "metadata": {"k": 1}}, {"prompt": "b"}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    ps = load_prompts(tmp_path / "p.jsonl")
    assert ps.prompts == ["a", "b"] and ps.metadata == [{"k": 1}, {}]


def test_malformed_lines_are_all_reported(tmp_path):
    (tmp_path / "p.txt").write_text("a\n\nb\n   \nc\n")
    with pytest.raises(PromptFileError) as e:
        load_prompts(tmp_path / "p.txt")
    assert "line 2" in str(e.value) and "line 4" in str(e.value)
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{not json}\n{"text": "b"}\n')
    with pytest.raises(PromptFileError) as e:
        load_prompts(tmp_path / "p.jsonl")
    assert "line 2: not valid JSON" in str(e.value) and "line 3" in str(e.value)
    with pytest.raises(PromptFileError, match="does not exist"):
        load_prompts(tmp_path / "missing.txt")
