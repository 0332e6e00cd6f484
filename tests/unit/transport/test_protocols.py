"""The peers' wire protocols (:mod:`diffrl.transport.protocols`) without a network: what a client
encodes, the server reads back to the same pixels, prompts, metadata and source images; bodies are
bounded before they are parsed or decoded; answers are checked field by field."""

from __future__ import annotations

import base64
import io
import json
import math
import pickle

import numpy as np
import pytest
import torch
from fastapi import HTTPException
from PIL import Image

from diffrl.cli.commands import build_parser
from diffrl.serving.limits import ServerLimits
from diffrl.serving.server import decode_request
from diffrl.transport.protocols import (
    DIFFRL,
    MAX_JSON_ITEMS,
    PROTOCOLS,
    AnswerError,
    ProtocolError,
    checked_scores,
    decode_b64,
    protocol_problem,
    read_json,
)

VERL, FF = PROTOCOLS["verl_omni"], PROTOCOLS["flow_factory"]


def pixels(b: int = 3, h: int = 8, w: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, 3, h, w), generator=g, dtype=torch.uint8)


def png_b64(a: torch.Tensor) -> str:
    out = io.BytesIO()
    Image.fromarray(a.permute(1, 2, 0).numpy()).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def served(protocol, body: bytes | dict, **limits):
    """What ``serve-reward --protocol`` reads from ``body``: a ScoreRequest, or the HTTPException."""
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return decode_request(body, ServerLimits(**limits), protocol)


def refused(protocol, body: bytes | dict, **limits) -> HTTPException:
    with pytest.raises(HTTPException) as e:
        served(protocol, body, **limits)
    return e.value


# -- both ends agree -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["verl_omni", "flow_factory", "diffrl"])
def test_the_server_reads_back_what_the_client_sent(name):
    protocol, px = PROTOCOLS[name], pixels()
    source = pixels(1, 6, 10, seed=1)[0]
    metadata = [{"id": 0, "tags": ["a"]}, {"source_image": source}, {"id": np.int64(2)}]
    body = protocol.encode(px.float() / 255, ["a", "b", "c"], metadata, "png")
    req = decode_request(body, ServerLimits(), protocol)
    assert torch.equal(req.images, px) and req.prompts == ["a", "b", "c"]  # PNG: the exact uint8 pixels
    assert torch.equal(req.metadata[1]["source_image"], source)
    assert "source_image" not in req.metadata[0] and "source_image" not in req.metadata[2]
    if name != "flow_factory":  # Flow-Factory's contract carries no metadata
        assert req.metadata[0] == {"id": 0, "tags": ["a"]} and req.metadata[2] == {"id": 2}


def test_the_json_bodies_follow_the_peers_contracts():
    px = pixels(2)
    verl = json.loads(VERL.encode(px.float() / 255, ["a", "b"], [{}, {}], "png"))
    assert set(verl) == {"images", "prompts", "metadata"} and verl["prompts"] == ["a", "b"]
    ff = json.loads(FF.encode(px.float() / 255, ["a", "b"], [{}, {}], "png"))
    assert ff == {
        "prompt": ["a", "b"],
        "image": ff["image"],
        "video": None,
        "condition_images": None,
        "condition_videos": None,
    }
    for b64 in verl["images"] + ff["image"]:  # plain base64 PNGs, as Flow-Factory's _image_to_b64 makes
        assert base64.b64decode(b64, validate=True).startswith(b"\x89PNG")


def test_a_flow_factory_video_is_one_clip_of_its_frames():
    px = pixels(4)
    req = served(
        FF, {"prompt": ["a", "b"], "video": [[png_b64(f) for f in px[:2]], [png_b64(f) for f in px[2:]]]}
    )
    assert req.images.shape == (2, 3, 2, 8, 12)  # (B, 3, F, H, W)
    assert torch.equal(req.images[1, :, 0], px[2]) and torch.equal(req.images[1, :, 1], px[3])


def test_verl_omnis_empty_metadata_map_and_data_urls_are_read():
    px = pixels(2)
    url = "data:image/png;base64," + png_b64(px[0])
    req = served(VERL, {"images": [url, png_b64(px[1])], "prompts": ["a", "b"], "metadata": {}})
    assert torch.equal(req.images, px) and req.metadata == [{}, {}]


# -- bounded and checked before anything is decoded ----------------------------------------------

REFUSALS = [
    (
        VERL,
        {"images": ["x"], "prompts": ["a"], "metdata": []},
        400,
        "unknown field 'metdata'. Did you mean 'metadata'?",
    ),
    (VERL, {"images": "abc", "prompts": ["a"]}, 400, "images must be a non-empty array of base64 images"),
    (VERL, {"images": [3], "prompts": ["a"]}, 400, "images[0] must be a base64 string of an image, got int"),
    (VERL, {"images": ["@@@"], "prompts": ["a"]}, 400, "images[0] is not valid base64"),
    (
        VERL,
        {"images": ["data:text/html,hi"], "prompts": ["a"]},
        400,
        "images[0] is a data URL but not data:image/...;base64,",
    ),
    (
        VERL,
        {"images": [base64.b64encode(b"GIF89a").decode()], "prompts": ["a"]},
        400,
        "images[0] is not a PNG file",
    ),
    (
        VERL,
        {"images": ["QUFB"], "prompts": ["a"], "sources": []},
        400,
        "sources must be an array of 1 base64 images or nulls",
    ),
    (VERL, [1, 2], 400, "the body must be a JSON object, got list"),
    (FF, {"prompt": ["a"], "image": ["QUFB"], "video": [["QUFB"]]}, 400, "send image or video, not both"),
    (
        FF,
        {"prompt": ["a", "b"], "video": [["QUFB"], ["QUFB", "QUFB"]]},
        400,
        "videos differ in frame count: [1, 2]",
    ),
    (
        FF,
        {"prompt": ["a"], "image": ["QUFB"], "condition_images": [["QUFB", "QUFB"]]},
        400,
        "condition_images[0] must be an array of at most one",
    ),
    (
        FF,
        {"prompt": ["a"], "image": ["QUFB"], "condition_videos": [[["QUFB"]]]},
        400,
        "condition_videos are not supported",
    ),
    (FF, {"prompt": ["a"], "images": ["QUFB"]}, 400, "unknown field 'images'. Did you mean 'image'?"),
    (
        FF,
        {"prompt": ["a", "b"], "image": [png_b64(pixels(1)[0])]},
        400,
        "prompts must be an array of 1 strings",
    ),
]


@pytest.mark.parametrize("protocol, body, status, detail", REFUSALS, ids=[r[3][:40] for r in REFUSALS])
def test_a_bad_body_is_refused_naming_the_field(protocol, body, status, detail):
    e = refused(protocol, body)
    assert e.status_code == status and detail in e.detail, e.detail


def test_images_are_counted_before_any_is_decoded():
    e = refused(VERL, {"images": ["not base64 at all"] * 5, "prompts": ["a"] * 5}, max_images=4)
    assert e.status_code == 413 and "5 images, over this server's 4 per request" in e.detail


def test_pixels_are_read_from_the_png_header_before_decoding():
    big = pixels(1, 64, 64)[0]
    e = refused(FF, {"prompt": ["a"], "image": [png_b64(big)]}, max_image_pixels=1000)
    assert e.status_code == 413 and "images[0] is 64x64 pixels, over this server's 1000" in e.detail


@pytest.mark.parametrize("protocol", [VERL, FF, DIFFRL], ids=lambda p: p.name)
def test_a_pickle_body_is_refused_unread(protocol, tmp_path):
    e = refused(protocol, pickle.dumps({"images": [b"x"], "prompts": ["a"], "metadata": {}}))
    assert e.status_code == 415 and "Python pickle" in e.detail and "runs whatever code" in e.detail


def test_json_values_are_counted_before_parsing():
    assert read_json(b"[" + b"0," * (MAX_JSON_ITEMS - 2) + b"0]") is not None
    with pytest.raises(ProtocolError) as e:
        read_json(b"[" + b"0," * MAX_JSON_ITEMS + b"0]")
    assert e.value.status == 413 and f"over {MAX_JSON_ITEMS} JSON values" in e.value.detail
    with pytest.raises(ProtocolError) as e:
        read_json(b"[" * 100_000 + b"]" * 100_000)  # under the count (one value each), too deep to parse
    assert e.value.status == 400 and "nested too deep for JSON" in e.value.detail
    with pytest.raises(ProtocolError, match="is not JSON"):
        read_json(b"\xff\xfe garbage")


def test_a_data_url_prefix_is_stripped_and_checked():
    assert decode_b64("data:image/jpeg;base64,QUFB", "x") == b"AAA"
    with pytest.raises(ProtocolError, match="is not valid base64"):
        decode_b64("QUF", "x")


# -- answers --------------------------------------------------------------------------------------


def test_scores_are_numbers_and_null_or_nan_fails_a_sample():
    got = checked_scores({"scores": [1, 2.5, None, math.nan, 10**400]}, "scores", 5)
    assert got[:2] == [1.0, 2.5] and all(math.isnan(s) for s in got[2:])
    for answer, message in [
        ({"scores": [1, "2"]}, "answered scores[1] = '2', not a number"),
        ({"scores": [[1], 2]}, "answered scores[0] = [1], not a number"),
        ({"scores": [1]}, "answered 1 score(s) for 2 images"),
        ({"error": "x" * 1000}, "answered an error: 'xxx"),
        (
            {"error": "", "scores": [1, 2]},
            None,
        ),  # a falsy error is no error (as Flow-Factory's client reads it)
    ]:
        if message is None:
            assert checked_scores(answer, "scores", 2) == [1.0, 2.0]
            continue
        with pytest.raises(AnswerError) as e:
            checked_scores(answer, "scores", 2)
        assert message in str(e.value) and len(str(e.value)) < 500


def test_each_protocol_reads_its_own_answer_key():
    assert FF.scores(b'{"rewards": [0.5, 1]}', "application/json", 2) == [0.5, 1.0]
    assert VERL.scores(b'{"scores": [0.5, 1]}', "application/json", 2) == [0.5, 1.0]
    with pytest.raises(AnswerError, match="answered no 'rewards'"):
        FF.scores(b'{"scores": [0.5, 1]}', "application/json", 2)
    assert json.loads(FF.answer([0.5, math.nan]).replace(b"NaN", b"null")) == {"rewards": [0.5, None]}


# -- names and paths ------------------------------------------------------------------------------


def test_the_endpoints():
    assert DIFFRL.endpoint("/prefix/") == "/prefix/score"
    assert FF.endpoint("") == "/compute" and FF.endpoint("/api") == "/api/compute"
    assert (
        VERL.endpoint("") == "/" and VERL.endpoint("/score") == "/score"
    )  # verl-omni posts to the URL itself


def test_protocol_names_are_checked():
    assert all(protocol_problem(name) is None for name in PROTOCOLS)
    assert protocol_problem("flow-factory").endswith("Did you mean 'flow_factory'?")
    assert protocol_problem(3) == "protocol must be one of diffrl, verl_omni, flow_factory, got 3."
    assert "unpickling a body runs whatever code" in protocol_problem("flow_grpo")
    assert "protocol verl_omni" in protocol_problem("pickle")


def test_serve_reward_help_names_every_protocol():
    sub = next(a for a in build_parser()._subparsers._group_actions if a.choices)
    help_text = sub.choices["serve-reward"].format_help()
    assert all(name in help_text for name in PROTOCOLS)
