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


def _png(path, size=(40, 20), colour=(10, 200, 30)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def test_edit_lines_name_images_relative_to_the_file(tmp_path):
    _png(tmp_path / "signs" / "a.png")
    rows = [
        {"prompt": 'replace the number with "42"', "image": "signs/a.png", "metadata": {"k": 1}},
        {"prompt": "b", "image": str(tmp_path / "signs" / "a.png")},  # an absolute path
    ]
    (tmp_path / "sub").mkdir()
    file = tmp_path / "edits.jsonl"
    file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ps = load_prompts(file)
    assert ps.edits and ps.images == [tmp_path / "signs" / "a.png"] * 2
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"prompt": "a"}\n')
    assert not load_prompts(plain).edits and load_prompts(plain).sources([0], 8, 8) is None


def test_malformed_edit_lines_name_the_file_and_the_line(tmp_path):
    _png(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (tmp_path / "text.png").write_text("hello")
    rows = [
        {"prompt": "a", "image": "ok.png"},
        {"prompt": "b", "image": "missing.png"},
        {"prompt": "c", "image": "broken.png"},
        {"prompt": "d", "image": "text.png"},
        {"prompt": "e", "image": 7},
        {"prompt": "f", "image": ["ok.png"]},
        {"prompt": "g", "image": ""},
    ]
    file = tmp_path / "edits.jsonl"
    file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(PromptFileError) as e:
        load_prompts(file)
    msg = str(e.value)
    assert str(file) in msg and "6 malformed line(s)" in msg
    assert "line 2: \"image\" 'missing.png': no such file" in msg
    assert "line 3: \"image\" 'broken.png' is not a readable image" in msg
    assert "line 4: \"image\" 'text.png' is not a readable image" in msg
    assert 'line 5: "image" must be a path to an image file (a string), got 7' in msg
    assert 'line 6: "image" must be a path' in msg and 'line 7: "image" must be a path' in msg
    file.write_text(json.dumps(rows[0]) + '\n{"prompt": "no image"}\n')
    with pytest.raises(PromptFileError, match=r"line 2: no \"image\", while other lines have one"):
        load_prompts(file)


def test_sources_are_centre_cropped_to_the_output_aspect_and_resized_for_rewards(tmp_path):
    import torch
    from PIL import Image

    # a 40 x 20 image: left half red, right half blue; the square crop is its middle 20 x 20
    img = Image.new("RGB", (40, 20), (255, 0, 0))
    img.paste((0, 0, 255), (20, 0, 40, 20))
    img.save(tmp_path / "a.png")
    (tmp_path / "e.jsonl").write_text(json.dumps({"prompt": "p", "image": "a.png", "metadata": {"k": 1}}))
    ps = load_prompts(tmp_path / "e.jsonl")
    (square,) = ps.sources([0], 8, 8)
    assert square.pixels.shape == (3, 20, 20) and square.pixels.dtype == torch.uint8
    assert square.pixels[:, 0, 0].tolist() == [255, 0, 0] and square.pixels[:, 0, -1].tolist() == [0, 0, 255]
    (wide,) = ps.sources([0], 8, 16)  # the whole image has that aspect already
    assert wide.pixels.shape == (3, 20, 40) and wide.key != square.key
    (meta,) = ps.reward_metadata([0], 8, 8)
    assert meta["k"] == 1 and meta["source_file"] == str(tmp_path / "a.png")
    assert meta["source_image"].shape == (3, 8, 8) and meta["source_image"].dtype == torch.uint8
    assert ps.metadata == [{"k": 1}]  # the set's own metadata is not changed


def test_prompts_given_with_images(tmp_path, monkeypatch):
    from diffrl.data.prompts import given_prompts

    monkeypatch.chdir(tmp_path)
    _png(tmp_path / "a.png")
    assert given_prompts(["x"]).edits is False
    ps = given_prompts(["x"], ["a.png"])
    assert ps.images == [tmp_path / "a.png"]
    with pytest.raises(PromptFileError, match="one --image per --prompt"):
        given_prompts(["x", "y"], ["a.png"])
    with pytest.raises(PromptFileError, match="--image 1: \"image\" 'b.png': no such file"):
        given_prompts(["x"], ["b.png"])
