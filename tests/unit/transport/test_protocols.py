"""The peers' wire protocols (:mod:`diffrl.transport.protocols`) without a network: what a client
encodes, the server reads back to the same pixels, prompts, metadata and source images; the pickled
bodies are the peers' own (read here with plain ``pickle.loads``, as their side does: the test
wrote them) and what each peer's client sends is read; bodies are bounded before they are parsed
or decoded; answers are checked field by field; a pickle that would run code is refused."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import pickle
import pickletools
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi import HTTPException
from PIL import Image

from diffrl.cli.commands import build_parser
from diffrl.serving.limits import ServerLimits
from diffrl.serving.server import MAX_JPEG_SCANS, decode_request
from diffrl.transport.protocols import (
    DIFFRL,
    MAX_JSON_ITEMS,
    PROTOCOLS,
    AnswerError,
    ProtocolError,
    checked_scores,
    decode_b64,
    encode_jpeg,
    protocol_problem,
    read_json,
)
from tests.unit.transport.test_pickled import Reduces

VERL, GRPO, FF = PROTOCOLS["verl_omni"], PROTOCOLS["flow_grpo"], PROTOCOLS["flow_factory"]
VJSON = PROTOCOLS["verl_omni_json"]


def pixels(b: int = 3, h: int = 8, w: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, 3, h, w), generator=g, dtype=torch.uint8)


def png_b64(a: torch.Tensor) -> str:
    out = io.BytesIO()
    Image.fromarray(a.permute(1, 2, 0).numpy()).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def jpeg(a: torch.Tensor) -> bytes:
    """uint8 ``(3, H, W)`` -> JPEG bytes, as verl-omni's ``_serialize_image`` and flow_grpo's clients make them."""
    out = io.BytesIO()
    Image.fromarray(a.permute(1, 2, 0).numpy()).save(out, format="JPEG")
    return out.getvalue()


def decoded(data: bytes) -> torch.Tensor:
    """What PIL decodes from an image file: uint8 ``(3, H, W)``."""
    with Image.open(io.BytesIO(data)) as img:
        return torch.from_numpy(np.asarray(img.convert("RGB")).copy()).permute(2, 0, 1)


def served(protocol, body: bytes | dict, **limits):
    """What ``serve-reward --protocol`` reads from ``body``: a ScoreRequest, or the HTTPException.
    A dict is sent as its protocol sends one: pickled, or JSON."""
    if not isinstance(body, bytes):
        body = pickle.dumps(body) if protocol.pickled else json.dumps(body).encode()
    return decode_request(body, ServerLimits(**limits), protocol)


def refused(protocol, body: bytes | dict, **limits) -> HTTPException:
    with pytest.raises(HTTPException) as e:
        served(protocol, body, **limits)
    return e.value


# -- both ends agree -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["verl_omni_json", "flow_factory", "diffrl"])
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


@pytest.mark.parametrize("name, fmt", [("verl_omni", "jpeg"), ("flow_grpo", "jpeg"), ("verl_omni", "png")])
def test_a_pickle_protocol_reads_back_what_its_client_sent(name, fmt):
    protocol, px = PROTOCOLS[name], pixels()
    metadata = [
        {"id": 0, "tags": ("a",)},
        {"source_image": px[0]},
        {"n": np.int64(2), "x": torch.tensor([0.5])},
    ]
    body = protocol.encode(px.float() / 255, ["a", "b", "c"], metadata, fmt)
    req = decode_request(body, ServerLimits(), protocol)
    sent = [decoded(f) for f in pickle.loads(body)["images"]]
    assert torch.equal(req.images, torch.stack(sent)) and req.prompts == ["a", "b", "c"]
    if fmt == "png":  # lossless: the rollout's exact pixels
        assert torch.equal(req.images, px)
    else:  # JPEG: what PIL decodes from the JPEG the peers' clients would send
        assert torch.equal(
            torch.stack(sent), torch.stack([decoded(encode_jpeg(a.permute(1, 2, 0).numpy())) for a in px])
        )
    # metadata as plain values; the source image is not sent (no field of theirs carries one)
    assert req.metadata == [{"id": 0, "tags": ["a"]}, {}, {"n": 2, "x": [0.5]}]


def test_the_pickled_bodies_are_the_peers_own():
    px = pixels(2)
    verl = pickle.loads(VERL.encode(px.float() / 255, ["a", "b"], [{"tag": "counting"}, {}], "jpeg"))
    # verl-omni's compute_score: {"images": [JPEG bytes], "prompts": [str], "metadata": {}}; deepgen_rl's
    # GenEval service reads metadata["meta_datas"]; each map with its prompt, as GenEval reads it
    assert set(verl) == {"images", "prompts", "metadata"} and verl["prompts"] == ["a", "b"]
    assert verl["metadata"] == {"meta_datas": [{"prompt": "a", "tag": "counting"}, {"prompt": "b"}]}
    grpo = pickle.loads(GRPO.encode(px.float() / 255, ["a", "b"], [{"tag": "counting"}, {}], "jpeg"))
    # flow_grpo's clients: images (all), prompts (UnifiedReward), meta_datas and only_strict (GenEval)
    assert grpo == {
        **grpo,
        "prompts": ["a", "b"],
        "meta_datas": verl["metadata"]["meta_datas"],
        "only_strict": True,
    }
    assert set(grpo) == {"images", "prompts", "meta_datas", "only_strict"}
    for data in verl["images"] + grpo["images"]:  # what reward-server's apps open: formats=["jpeg"]
        with Image.open(io.BytesIO(data), formats=["jpeg"]) as img:
            assert img.format == "JPEG" and img.mode == "RGB" and img.size == (12, 8)
    body = VERL.encode(px.float() / 255, ["a", "b"], [{}, {}], "jpeg")
    assert not [op for op, _, _ in pickletools.genops(body) if "GLOBAL" in op.name]  # names no global


def test_what_each_peer_client_sends_is_read():
    px = pixels(3)
    files = [jpeg(a) for a in px]
    want = torch.stack([decoded(f) for f in files])
    bodies = {
        # verl-omni's compute_score: one image a request, metadata {} (reserved)
        "verl-omni": (VERL, {"images": files[:1], "prompts": ["a"], "metadata": {}}),
        # deepgen_rl's GenEval service's client: meta_datas inside metadata
        "deepgen-geneval": (
            VERL,
            {"images": files, "prompts": list("abc"), "metadata": {"meta_datas": [{"tag": "t"}] * 3}},
        ),
        # flow_grpo's deqa_score_remote: images alone
        "deqa": (GRPO, {"images": files}),
        # unifiedreward_score_remote: prompts as np.array_split gives them (a NumPy array of str)
        "unifiedreward": (GRPO, {"images": files, "prompts": np.array_split(np.array(list("abc")), 1)[0]}),
        # geneval_score: meta_datas (a list of an object array's maps) and only_strict
        "geneval": (
            GRPO,
            {
                "images": files,
                "meta_datas": list(
                    np.array_split(np.array([{"tag": "counting", "prompt": "a"}] * 3, dtype=object), 1)[0]
                ),
                "only_strict": True,
            },
        ),
    }
    for name, (protocol, body) in bodies.items():
        for proto in (2, 4, 5):  # Python's default is 4 (5 from 3.14); protocol 2 still reads
            req = decode_request(pickle.dumps(body, protocol=proto), ServerLimits(), protocol)
            b = len(body["images"])
            assert torch.equal(req.images, want[:b]), name
            assert len(req.prompts) == b and all(isinstance(p, str) for p in req.prompts), name
    req = served(GRPO, bodies["geneval"][1])
    assert req.prompts == ["", "", ""] and req.metadata == [{"tag": "counting", "prompt": "a"}] * 3
    assert served(VERL, bodies["deepgen-geneval"][1]).metadata == [{"tag": "t"}] * 3


def test_the_json_bodies_follow_the_peers_contracts():
    px = pixels(2)
    verl = json.loads(VJSON.encode(px.float() / 255, ["a", "b"], [{}, {}], "png"))
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


def test_verl_omni_jsons_empty_metadata_map_and_data_urls_are_read():
    px = pixels(2)
    url = "data:image/png;base64," + png_b64(px[0])
    req = served(VJSON, {"images": [url, png_b64(px[1])], "prompts": ["a", "b"], "metadata": {}})
    assert torch.equal(req.images, px) and req.metadata == [{}, {}]


# -- bounded and checked before anything is decoded ----------------------------------------------

JPEG_A = jpeg(pixels(1)[0])
GRAY = (lambda out: (Image.new("L", (4, 4)).save(out, format="JPEG"), out.getvalue())[1])(io.BytesIO())

REFUSALS = [
    (
        VJSON,
        {"images": ["x"], "prompts": ["a"], "metdata": []},
        400,
        "unknown field 'metdata'. Did you mean 'metadata'?",
    ),
    (VJSON, {"images": "abc", "prompts": ["a"]}, 400, "images must be a non-empty array of base64 images"),
    (VJSON, {"images": [3], "prompts": ["a"]}, 400, "images[0] must be a base64 string of an image, got int"),
    (VJSON, {"images": ["@@@"], "prompts": ["a"]}, 400, "images[0] is not valid base64"),
    (
        VJSON,
        {"images": ["data:text/html,hi"], "prompts": ["a"]},
        400,
        "images[0] is a data URL but not data:image/...;base64,",
    ),
    (
        VJSON,
        {"images": [base64.b64encode(b"GIF89a").decode()], "prompts": ["a"]},
        400,
        "images[0] is not a PNG file",
    ),
    (
        VJSON,
        {"images": ["QUFB"], "prompts": ["a"], "sources": []},
        400,
        "sources must be an array of 1 base64 images or nulls",
    ),
    (VJSON, [1, 2], 400, "the body must be a JSON object, got list"),
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
    (
        VERL,
        {"images": "abc", "prompts": ["a"]},
        400,
        "images must be a non-empty list of JPEG (or PNG) files' bytes",
    ),
    (
        VERL,
        {"images": ["QUFB"], "prompts": ["a"]},
        400,
        "images[0] must be the bytes of a JPEG or PNG file, got str",
    ),
    (VERL, {"images": [b"GIF89a"], "prompts": ["a"]}, 400, "images[0] is neither a JPEG nor a PNG file"),
    (
        VERL,
        {"images": [GRAY], "prompts": ["a"]},
        400,
        "images[0] is a JPEG of 1 8-bit components; send 8-bit RGB JPEGs",
    ),
    (VERL, {"images": [JPEG_A[:200]], "prompts": ["a"]}, 400, "images[0] is not a readable JPEG"),
    (VERL, {"images": [JPEG_A], "prompt": ["a"]}, 400, "unknown field 'prompt'. Did you mean 'prompts'?"),
    (VERL, {"images": [JPEG_A]}, 400, "prompts must be an array of 1 strings"),
    (
        VERL,
        {"images": [JPEG_A], "prompts": ["a"], "metadata": [{}]},
        400,
        "metadata must be a map (verl-omni sends {}",
    ),
    (
        VERL,
        {"images": [JPEG_A], "prompts": ["a"], "metadata": {"meta_datas": [{}, {}]}},
        400,
        "metadata['meta_datas'] must be a list of 1 maps",
    ),
    (VERL, [JPEG_A], 400, "the body must be a pickled dict, got list"),
    (
        VERL,
        json.dumps({"images": [], "prompts": []}).encode(),
        400,
        "the body is JSON, not a pickle; verl-omni's client pickles its body; for a client changed to send diffrl's former JSON rendering of verl-omni's fields, serve --protocol verl_omni_json",
    ),
    (
        VERL,
        pickle.dumps({"images": [JPEG_A]}, protocol=1),
        400,
        "the body is not a pickle of protocol 2 or later",
    ),
    (GRPO, {"images": [JPEG_A], "only_strict": "yes"}, 400, "only_strict must be a bool"),
    (
        GRPO,
        {"images": [JPEG_A], "meta_data": []},
        400,
        "unknown field 'meta_data'. Did you mean 'meta_datas'?",
    ),
    (
        GRPO,
        {"images": [JPEG_A], "meta_datas": [[]]},
        400,
        "meta_datas must be a list of 1 maps (one per image)",
    ),
    (GRPO, {"images": [JPEG_A], "meta_datas": [{"a": {1, 2}}]}, 400, "the body holds a set"),
    (
        GRPO,
        {"images": [JPEG_A], "meta_datas": [{"a": __import__("collections").OrderedDict()}]},
        400,
        "it names collections.OrderedDict, which diffrl does not unpickle",
    ),
    (
        GRPO,
        {"images": [JPEG_A + b"\xff\xda" * MAX_JPEG_SCANS]},
        400,
        f"images[0] holds over {MAX_JPEG_SCANS} JPEG scans",
    ),
]


@pytest.mark.parametrize("protocol, body, status, detail", REFUSALS, ids=[r[3][:40] for r in REFUSALS])
def test_a_bad_body_is_refused_naming_the_field(protocol, body, status, detail):
    e = refused(protocol, body)
    assert e.status_code == status and detail in e.detail, e.detail


@pytest.mark.parametrize("protocol", [VJSON, VERL], ids=lambda p: p.name)
def test_images_are_counted_before_any_is_decoded(protocol):
    e = refused(protocol, {"images": ["not an image at all"] * 5, "prompts": ["a"] * 5}, max_images=4)
    assert e.status_code == 413 and "5 images, over this server's 4 per request" in e.detail


def test_pixels_are_read_from_the_png_header_before_decoding():
    big = pixels(1, 64, 64)[0]
    e = refused(FF, {"prompt": ["a"], "image": [png_b64(big)]}, max_image_pixels=1000)
    assert e.status_code == 413 and "images[0] is 64x64 pixels, over this server's 1000" in e.detail


def test_pixels_are_read_from_the_jpeg_frame_header_before_decoding(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(Image, "open", never)
    big = jpeg(pixels(1, 64, 64)[0])
    e = refused(GRPO, {"images": [big]}, max_image_pixels=1000)
    assert e.status_code == 413 and "images[0] is 64x64 pixels, over this server's 1000" in e.detail
    # a 40000x40000 frame header on a few hundred bytes: refused from the header alone
    bomb = big.replace(b"\x00\x40\x00\x40", (40000).to_bytes(2, "big") * 2, 1)
    e = refused(GRPO, {"images": [bomb]})
    assert e.status_code == 413 and "images[0] is 40000x40000 pixels" in e.detail


@pytest.mark.parametrize("protocol", [VJSON, FF, DIFFRL], ids=lambda p: p.name)
def test_a_pickle_body_to_a_json_or_msgpack_protocol_is_refused_unread(protocol, tmp_path):
    marker = tmp_path / "ran"
    e = refused(
        protocol, pickle.dumps({"images": [b"x"], "prompts": ["a"], "metadata": Reduces(Path.touch, marker)})
    )
    assert (
        e.status_code == 415
        and "Python pickle" in e.detail
        and "protocols verl_omni and flow_grpo" in e.detail
    )
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [VERL, GRPO], ids=lambda p: p.name)
def test_a_pickle_that_would_run_code_is_refused_by_the_pickle_protocols(protocol, tmp_path):
    marker = tmp_path / "ran"
    for attack, name in [
        (Reduces(os.system, f"touch {marker}"), f"{os.system.__module__}.system"),
        (Reduces(Path.touch, marker), "pathlib.Path.touch"),
    ]:
        e = refused(protocol, pickle.dumps({"images": [JPEG_A], "prompts": ["a"], "metadata": attack}))
        assert (
            e.status_code == 400
            and f"the body is refused: it names {name}, which diffrl does not unpickle" in e.detail
        )
    assert not marker.exists()


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
    assert VJSON.scores(b'{"scores": [0.5, 1]}', "application/json", 2) == [0.5, 1.0]
    with pytest.raises(AnswerError, match="answered no 'rewards'"):
        FF.scores(b'{"scores": [0.5, 1]}', "application/json", 2)
    assert json.loads(FF.answer([0.5, math.nan]).replace(b"NaN", b"null")) == {"rewards": [0.5, None]}


def test_the_pickle_protocols_read_their_peers_answers():
    # deepgen_rl's services answer lists (tensor.tolist()); NumPy scalars and arrays read too
    assert VERL.scores(pickle.dumps({"scores": [np.float32(0.5), 1]}), "text/html", 2) == [0.5, 1.0]
    assert VERL.scores(pickle.dumps({"scores": np.array([0.5, 1.0])}, protocol=5), "", 2) == [0.5, 1.0]
    # reward-server's DeQA (and UnifiedReward) answer outputs; GenEval scores and its accuracies
    assert GRPO.scores(pickle.dumps({"outputs": [0.25, None]}), "", 2)[0] == 0.25
    geneval = {"scores": [0.5, 1.0], "rewards": [0.0, 1.0], "strict_rewards": [0.0, 1.0], "group_rewards": {}}
    assert GRPO.scores(pickle.dumps(geneval), "", 2) == [0.5, 1.0]
    for protocol, answer, message in [
        (GRPO, {"output": [1, 2]}, "answered no 'scores' or 'outputs' (its fields: ['output'])"),
        (VERL, {"error": "CUDA out of memory"}, "answered an error: 'CUDA out of memory'"),
        (VERL, {"scores": [1]}, "answered 1 score(s) for 2 images"),
        (
            VERL,
            b'{"scores": [1, 2]}',
            "answered something diffrl does not read: its answer is JSON, not a pickle; this protocol reads pickled answers, as its peers' clients do; for a scorer changed to answer diffrl's former JSON rendering of verl-omni's fields, set protocol: verl_omni_json",
        ),
        (VERL, b"<html>oops</html>", "its answer is not a pickle of protocol 2 or later"),
    ]:
        with pytest.raises(AnswerError) as e:
            protocol.scores(answer if isinstance(answer, bytes) else pickle.dumps(answer), "", 2)
        assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("protocol", [VERL, GRPO], ids=lambda p: p.name)
def test_a_hostile_answer_is_refused_unread(protocol, tmp_path):
    marker = tmp_path / "ran"
    answer = pickle.dumps({"scores": [Reduces(Path.touch, marker), 1.0], "outputs": [1.0, 1.0]})
    with pytest.raises(AnswerError) as e:
        protocol.scores(answer, "", 2)
    assert (
        "answered something diffrl does not read: its answer is refused: it names pathlib.Path.touch"
        in str(e.value)
    )
    assert protocol.error_detail(answer) is None and not marker.exists()
    assert protocol.error_detail(pickle.dumps({"error": "Traceback: boom"})) == "Traceback: boom"


def test_a_served_answer_is_what_the_peers_clients_read():
    # verl-omni's client reads "scores"; flow_grpo's DeQA/UnifiedReward clients "outputs", GenEval's "scores"
    assert pickle.loads(VERL.answer([0.5, math.nan]))["scores"][0] == 0.5
    assert {k: v[:1] for k, v in pickle.loads(GRPO.answer([0.5, 1.0])).items()} == {
        "scores": [0.5],
        "outputs": [0.5],
    }


# -- names and paths ------------------------------------------------------------------------------


def test_the_endpoints():
    assert DIFFRL.endpoint("/prefix/") == "/prefix/score"
    assert FF.endpoint("") == "/compute" and FF.endpoint("/api") == "/api/compute"
    for protocol in (VERL, GRPO, VJSON):  # verl-omni and flow_grpo post to the URL itself
        assert protocol.endpoint("") == "/" and protocol.endpoint("/score") == "/score"


def test_protocol_names_are_checked():
    assert all(protocol_problem(name) is None for name in PROTOCOLS)
    assert protocol_problem("flow-factory").endswith("Did you mean 'flow_factory'?")
    names = "diffrl, flow_factory, verl_omni, flow_grpo, verl_omni_json"
    assert protocol_problem(3) == f"protocol must be one of {names}, got 3."
    assert protocol_problem("pickle").endswith(
        "got 'pickle'. Pickled bodies are protocols verl_omni (verl-omni's HTTP scorer) and flow_grpo "
        "(flow_grpo's reward servers)."
    )
    assert protocol_problem("verl-omni").endswith("Did you mean 'verl_omni'?")


def test_serve_reward_help_names_every_protocol():
    sub = next(a for a in build_parser()._subparsers._group_actions if a.choices)
    help_text = sub.choices["serve-reward"].format_help()
    assert all(name in help_text for name in PROTOCOLS)
