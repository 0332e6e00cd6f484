"""The ``openai_judge`` reward: a vision-language judge behind any OpenAI-compatible server (vLLM,
sglang, ``transformers serve``, llama.cpp's server, a hosted API) scores each image.

::

    rewards:
      - name: openai_judge
        timeout_s: 300               # the call's deadline (RewardConfig), counted from submit
        params: {base_url: "http://10.0.0.7:8000", model: UnifiedReward-qwen-7b, score: text}

Each image is one ``POST {base_url}/v1/chat/completions`` (``base_url`` with or without its
``/v1``): a user turn holding the image as a base64 PNG data URL (``image_url`` part, the exact
uint8 pixels the rollout keeps; ``resize: N`` sends it as ``N x N``, as flow_grpo does with 512)
and the text ``template.format(prompt=...)``. Two ways to read a score:

``score: text`` (the judge writes its score), as flow_grpo's ``unifiedreward_score_sglang``
(yifan123/flow_grpo, ``flow_grpo/rewards.py``) reads UnifiedReward: ``temperature: 0``, the
answer searched with ``pattern`` (default ``Final Score:\\s*([1-5](?:\\.\\d+)?)``; its first group is
the number), and ``score = (value - score_min) / (score_max - score_min)``; the defaults ``0``
and ``5`` give flow_grpo's ``value / 5``. Unlike flow_grpo (which scores 0.0), an answer the
pattern does not match (a refusal, a cut answer), or a value outside ``[score_min, score_max]``,
fails its sample (NaN, counted in ``rollout/reward_failed``).

``score: yes_logprob`` (the judge answers Yes or No), as VQAScore-style judges are read
(Flow-Factory's API judge; :mod:`diffrl.rewards.judge` in process): ``max_tokens: 1, logprobs:
true, top_logprobs: K``, and from the first answer token's ``top_logprobs``::

    P(w) = sum of exp(logprob) over the entries whose token, stripped of spaces and lowercased,
           is w lowercased (" Yes", "yes" and "YES" are one answer: servers key entries by text)
    score = P(yes) / (P(yes) + P(no))

A word absent from the top K counts as 0; neither there fails the sample. A server that answers
without ``logprobs`` (``transformers serve`` 5.24 ignores the field) is an error that says so,
never a silent 0.5.

Judging a prompt's images together (Pref-GRPO / UnifiedReward-Think style): a call's samples are
grouped by the ``groups=`` its caller gives (one int per sample, equal for one prompt's samples:
the collector's ``group_id``, eval's prompt index; never by prompt text, so two prompts of the same
text are two groups; a call without ``groups`` is refused), and a group of K >= 2 images is shown
as a text part ``Image i:`` before each image, then a question.

- ``judging: pairwise``, as Pref-GRPO (CodeGoat24/Pref-GRPO,
  ``fastvideo/rewards/unifiedreward_think.py``, ``cal_win_rate_images``): every pair of the group
  is one request (Image 1 and Image 2, ``pair_template.format(prompt=...)``), the verdict is read
  with ``pair_pattern`` (default: "Image 1 is better" or "Image 2 is better" inside the answer's
  first ``<answer>`` block), and each image scores its win rate, wins / (K - 1). Pref-GRPO scores an
  unreadable verdict as a tie (half a win each); here it fails the group.
- ``judging: group``: the whole group is one request (``group_template.format(prompt=..., n=K)``);
  the answer must hold ``rank_pattern`` (default ``Ranking: 2 > 1 > 3``, best first) naming each of
  1..K exactly once, and the image at position p (1-based) scores ``(K - p) / (K - 1)`` (best 1,
  worst 0). Anything else fails the group. One request instead of K(K-1)/2.

A group is what one call holds: ``rollout.micro_group_size`` must be a multiple of
``rollout.n_samples_per_prompt`` so micro-groups hold whole prompts, and preflight refuses a config
where it is not (:meth:`judges_groups`; a prompt alone in a call would fail: there is nothing to
compare it with). Videos are refused (their frames would pool into one
group); ``judging: single`` scores each frame.

Calls: ``concurrency`` requests at a time (a thread pool), each attempt at most ``min(timeout_s,
what is left of the call's deadline)`` in all; connection errors, timeouts, HTTP 429 and 5xx are
retried ``retries`` times ``backoff_s * 2**k`` apart, within the deadline; 401 / 403 and other 4xx
are not. ``api_key_env`` names the environment variable holding the bearer token (stripped of
surrounding whitespace; a key with other control or non-ASCII characters is refused, unquoted).

A param the chosen mode does not use (``pattern`` with ``judging: group``, ``rank_pattern`` with
``judging: single``, ``score_min`` with ``score: yes_logprob``, ...) is refused, naming the ones it
uses. An answer over
``max_answer_bytes`` is refused. Scores are cached in memory (at most ``cache_size`` entries, the
oldest dropped) by (sha256 of the PNG, prompt, model, template, score mode): a judge at
temperature 0 gives an image the same score again.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import functools
import hashlib
import http.client
import inspect
import itertools
import json
import logging
import math
import os
import re
import string
import threading
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import torch
from PIL import Image

from diffrl.config import Range
from diffrl.config.schema import MAX_SIDE
from diffrl.core.rollout import quantize
from diffrl.rewards.base import Reward, RewardError
from diffrl.transport.client import (
    ENV_NAME,
    AnswerTooLarge,
    GaveUp,
    Retry,
    exchange,
    host_problem,
    http_url,
    probe,
    with_retries,
)
from diffrl.transport.protocols import encode_png

LOG = logging.getLogger(__name__)

UNIFIEDREWARD_QUESTION = (
    "<image>\nYou are given a text caption and a generated image based on that caption. Your task is to "
    "evaluate this image based on two key criteria:\n1. Alignment with the Caption: Assess how well this "
    "image aligns with the provided caption. Consider the accuracy of depicted objects, their "
    "relationships, and attributes as described in the caption.\n2. Overall Image Quality: Examine the "
    "visual quality of this image, including clarity, detail preservation, color accuracy, and overall "
    "aesthetic appeal.\nBased on the above criteria, assign a score from 1 to 5 after 'Final Score:'.\n"
    "Your task is provided as follows:\nText Caption: [{prompt}]"
)
"""The question flow_grpo's ``unifiedreward_score_sglang`` asks UnifiedReward (``score: text``)."""
FINAL_SCORE = r"Final Score:\s*([1-5](?:\.\d+)?)"
"""flow_grpo's pattern for UnifiedReward's answer; group 1 is the score."""
YES_NO_QUESTION = 'Does this figure show "{prompt}"? Please answer yes or no.'
"""VQAScore's question (``score: yes_logprob``; see :mod:`diffrl.rewards.judge`)."""
GROUP_QUESTION = (
    "You are given {n} images generated from the caption below, labelled Image 1 to Image {n}. Rank "
    "them from best to worst by how well they match the caption and by their visual quality. End your "
    "answer with one line 'Ranking: i > j > ...' that lists every image number once, best first.\n"
    "Caption: {prompt}"
)
RANKING = r"Ranking:\s*(\d+(?:\s*>\s*\d+)*)"
"""The group answer's pattern: group 1 holds the image numbers, best first, joined by ``>``."""
PAIR_QUESTION = (
    "You are given two images generated from the caption below, Image 1 and Image 2. Compare them by how "
    "well they match the caption, their aesthetics and their authenticity, reasoning inside <think> and "
    "</think>. Then give your judgment inside <answer> and </answer>: exactly 'Image 1 is better' or "
    "'Image 2 is better'.\nCaption: {prompt}"
)
PAIR_ANSWER = r"(?s)\A(?:(?!<answer>).)*<answer>(?:(?!</answer>).)*?Image ([12]) is better"
"""Pref-GRPO's reading of UnifiedReward-Think: group 1 is the better image of the two (1 or 2), said
inside the first ``<answer>`` block."""

MAX_CACHE = 1_000_000
MAX_QUOTE = 200
"""The most characters of a judge's answer quoted in a message."""


def quote(text: str, most: int = MAX_QUOTE) -> str:
    return repr(text if len(text) <= most else text[:most] + "...")


def template_problem(name: str, template: Any, **fields: Any) -> str | None:
    """Why ``template`` is no ``str.format`` template of ``fields`` that uses ``{prompt}``: each
    field must be a plain ``{name}`` of them (no attribute, index, conversion or format spec,
    which could fail or make a huge text at every call)."""
    if not isinstance(template, str) or "{prompt}" not in template:
        return f"{name} must be text holding {{prompt}} (other braces doubled: {{{{ }}}}), got {quote(str(template))}"
    known = ["prompt", *fields]
    names = ", ".join("{" + f + "}" for f in known)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        return f"{name} {quote(template)} is no template of {names} ({e}); double other braces"
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if field not in known or spec or conversion:
            whole = (
                "{" + field + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
            )
            return (
                f"{name} {quote(template)} is no template of {names}: {quote(whole, 60)} is none of them "
                "(plain, without attributes, indices or formats); double other braces"
            )
    return None


def pattern_problem(name: str, pattern: Any) -> str | None:
    """Why ``pattern`` is no regular expression with exactly one group."""
    if not isinstance(pattern, str):
        return f"{name} must be a regular expression (text), got {pattern!r}"
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        return f"{name} {quote(pattern)} is no regular expression ({e})"
    if compiled.groups != 1:
        return (
            f"{name} {quote(pattern)} has {compiled.groups} groups; it needs exactly one, around what "
            "is read (e.g. 'Final Score:\\s*([0-9.]+)')"
        )
    return None


def base_url_problem(url: Any) -> str | None:
    if not isinstance(url, str):
        return f"base_url must be the server's address, e.g. 'http://10.0.0.7:8000', got {url!r}"
    parts = http_url(url)
    if parts is None:
        return f"base_url must be http(s)://HOST[:PORT][/v1] of an OpenAI-compatible server, got {quote(url)}"
    if (p := host_problem(parts.hostname)) is not None:
        return f"base_url {quote(url)}: {p}"
    if parts.query or parts.fragment:
        return f"base_url {quote(url)}: give the server's address without a query or fragment"
    if parts.path.rstrip("/").endswith(("/chat/completions", "/completions")):
        return f"base_url {quote(url)}: give the server's base address (the reward adds /v1/chat/completions)"
    return None


def completions_path(url: str) -> str:
    """``/v1/chat/completions`` under ``url``'s path (which may end in ``/v1`` already)."""
    path = urllib.parse.urlsplit(url).path.rstrip("/")
    return (path if path.endswith("/v1") else path + "/v1") + "/chat/completions"


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def read_score(answer: str, pattern: re.Pattern, low: float, high: float) -> tuple[float | None, str]:
    """``score: text``: ``(score in [0, 1], "")`` from the first match of ``pattern`` in ``answer``,
    or ``(None, why)``."""
    match = pattern.search(answer)
    if match is None:
        return None, f"no match of {quote(pattern.pattern)} in the answer {quote(answer)}"
    try:
        value = float(match.group(1))
    except (TypeError, ValueError):
        return None, f"{quote(str(match.group(1)))} in the answer is no number"
    if not low <= value <= high:
        return None, f"the answer's score {value:g} is outside [{low:g}, {high:g}] (score_min, score_max)"
    return (value - low) / (high - low), ""


def yes_probability(top: Any, yes: str, no: str) -> tuple[float | None, str]:
    """``score: yes_logprob``: ``P(yes) / (P(yes) + P(no))`` from one token's ``top_logprobs`` (a
    list of ``{"token", "logprob"}``), or ``(None, why)``."""
    yes, no = yes.strip(), no.strip()  # tokens are compared stripped: " Yes" is "Yes"
    p = {yes.lower(): 0.0, no.lower(): 0.0}
    for entry in top:
        if not isinstance(entry, dict):
            continue
        token, logprob = entry.get("token"), entry.get("logprob")
        if not isinstance(token, str) or not isinstance(logprob, int | float) or isinstance(logprob, bool):
            continue
        word = token.strip().lower()
        if word in p and not math.isnan(logprob):
            p[word] += math.exp(min(float(logprob), 0.0))
    total = p[yes.lower()] + p[no.lower()]
    if total <= 0.0:
        shown = [e.get("token") for e in top[:20] if isinstance(e, dict)]
        return None, f"neither {yes!r} nor {no!r} among the first answer token's top_logprobs {shown}"
    return p[yes.lower()] / total, ""


def read_ranking(answer: str, pattern: re.Pattern, n: int) -> tuple[list[float] | None, str]:
    """``judging: group``: the ``n`` images' scores ``(n - position) / (n - 1)`` from the ranking
    that ``pattern`` finds (image numbers 1..n, best first, each once), or ``(None, why)``."""
    match = pattern.search(answer)
    if match is None:
        return None, f"no match of {quote(pattern.pattern)} in the answer {quote(answer)}"
    # a number of more digits than n's names no image (and int() refuses over 4,300 digits)
    order = [int(d) if len(d) <= len(str(n)) else 0 for d in re.findall(r"\d+", match.group(1) or "")]
    if sorted(order) != list(range(1, n + 1)):
        return None, (
            f"the ranking {quote(match.group(1) or '', 80)} is not the numbers 1 to {n} each once "
            f"(answer {quote(answer)})"
        )
    scores = [0.0] * n
    for position, image in enumerate(order):
        scores[image - 1] = (n - 1 - position) / (n - 1)
    return scores, ""


def read_pair(answer: str, pattern: re.Pattern) -> tuple[list[float] | None, str]:
    """``judging: pairwise``: ``[1, 0]`` when the answer says image 1 is better, ``[0, 1]`` for
    image 2, or ``(None, why)`` (Pref-GRPO scores such an answer a tie)."""
    match = pattern.search(answer)
    winner = match.group(1) if match is not None else None
    if winner not in ("1", "2"):
        found = "no match" if match is None else f"the match {quote(str(winner))} (not 1 or 2)"
        return None, f"{found} of {quote(pattern.pattern)} in the answer {quote(answer)}"
    return ([1.0, 0.0] if winner == "1" else [0.0, 1.0]), ""


@dataclass
class _Job:
    """One request: the samples it judges (``rows``), what makes its JSON body (or why there is
    none; made on the pool's thread, so a call holds ``concurrency`` bodies, not one per request),
    its cache key, and the samples that fail with it (``fails``: its group, for group and pairwise
    judging)."""

    rows: list[int]
    body: Callable[[], bytes] | str
    key: tuple
    fails: list[int]


@dataclass
class _Outcome:
    """One request's result: ``scores`` (one per image it judged), or None and ``why``."""

    scores: list[float] | None
    why: str = ""


QUESTIONS = ("template", "group_template", "pair_template")
READINGS = ("pattern", "score_min", "score_max", "yes", "no", "top_logprobs", "rank_pattern", "pair_pattern")
USES = {
    ("text", "single"): ("template", "pattern", "score_min", "score_max", "max_tokens"),
    ("yes_logprob", "single"): ("template", "yes", "no", "top_logprobs"),
    ("text", "group"): ("group_template", "rank_pattern", "max_tokens"),
    ("text", "pairwise"): ("pair_template", "pair_pattern", "max_tokens"),
}
"""The params each (score, judging) mode uses, of those that belong to one mode or another."""
MODE_PARAMS = frozenset(p for used in USES.values() for p in used)


def unused_problems(params: dict[str, Any]) -> list[str]:
    """Each param given that the (``score``, ``judging``) mode never reads, naming what it reads."""
    mode = (params.get("score", "text"), params.get("judging", "single"))
    used = USES.get(mode)
    if used is None:  # a mode of another's refusal (judging: group with yes_logprob, a bad name)
        return []
    question = next(p for p in used if p in QUESTIONS)
    reading = ", ".join(p for p in used if p in READINGS) + (", max_tokens" if "max_tokens" in used else "")
    return [
        f"{name}: score: {mode[0]} with judging: {mode[1]} does not use it (it asks {question} and "
        f"reads with {reading}); drop {name}"
        for name in params
        if name in MODE_PARAMS and name not in used
    ]


def api_key(env: str) -> str:
    """The key in the environment variable ``env``, without surrounding whitespace (a key file
    read with its newline)."""
    return os.environ.get(env, "").strip()


class _Fatal(Exception):
    """An attempt that failed in a way the same request would fail again (401, 4xx, no logprobs)."""


class OpenAIJudge(Reward):
    """``images (B, 3, H, W)`` in [0, 1] + prompts -> ``(B,)`` scores from a VLM judge behind an
    OpenAI-compatible chat-completions endpoint (module docstring)."""

    name = "openai_judge"

    def __init__(
        self,
        base_url: str,
        model: str,
        score: Literal["text", "yes_logprob"] = "text",
        template: str | None = None,
        pattern: str = FINAL_SCORE,
        score_min: Annotated[float, Range(-1e6, 1e6, hint="the judge's lowest score")] = 0.0,
        score_max: Annotated[float, Range(-1e6, 1e6, hint="the judge's highest score")] = 5.0,
        yes: str = "Yes",
        no: str = "No",
        top_logprobs: Annotated[int, Range(1, 100, hint="entries of the first token's top_logprobs")] = 20,
        judging: Literal["single", "group", "pairwise"] = "single",
        group_template: str = GROUP_QUESTION,
        rank_pattern: str = RANKING,
        pair_template: str = PAIR_QUESTION,
        pair_pattern: str = PAIR_ANSWER,
        max_tokens: Annotated[int, Range(1, 1_000_000, hint="tokens of the judge's answer")] = 1024,
        temperature: Annotated[float, Range(0, 10)] = 0.0,
        resize: Annotated[int, Range(1, MAX_SIDE, hint="pixels a side, or null: as sampled")] | None = None,
        api_key_env: str | None = None,
        concurrency: Annotated[int, Range(1, 1024, hint="requests at a time")] = 8,
        timeout_s: Annotated[
            float, Range(0, 604_800, lo_open=True, hint="seconds per attempt, at most a week")
        ] = 120.0,
        retries: Annotated[int, Range(0, 1000, hint="attempts after the first, within the deadline")] = 3,
        backoff_s: Annotated[float, Range(0, 3600, hint="seconds, doubled after each retry")] = 0.5,
        max_answer_bytes: Annotated[int, Range(1024, 64 * 2**20, hint="bytes")] = 2**20,
        cache_size: Annotated[int, Range(0, MAX_CACHE, hint="scores kept, 0: no cache")] = 4096,
    ):
        params = dict(locals())
        params.pop("self")
        defaults = inspect.signature(type(self).__init__).parameters
        given = {k: v for k, v in params.items() if v is not defaults[k].default and v != defaults[k].default}
        given.update(base_url=base_url, model=model)
        problems = self.param_problems(given, check_files=False) or api_key_problems(api_key_env, True)
        if problems:
            raise RewardError(f"reward {self.name!r}: " + "; ".join(problems))
        self.base_url, self.model, self.mode, self.judging = base_url.rstrip("/"), model, score, judging
        if template is None:
            template = YES_NO_QUESTION if score == "yes_logprob" else UNIFIEDREWARD_QUESTION
        self.template = {"group": group_template, "pairwise": pair_template}.get(judging, template)
        self.pattern = re.compile({"group": rank_pattern, "pairwise": pair_pattern}.get(judging, pattern))
        self.low, self.high, self.yes, self.no = float(score_min), float(score_max), yes, no
        self.top_logprobs, self.max_tokens, self.temperature = top_logprobs, max_tokens, float(temperature)
        self.resize, self.concurrency = resize, concurrency
        self.timeout_s, self.retries, self.backoff_s = float(timeout_s), retries, float(backoff_s)
        self.max_answer_bytes, self.cache_size = max_answer_bytes, cache_size
        self._path = completions_path(base_url)
        self._token = api_key(api_key_env) if api_key_env else None
        self._cache: OrderedDict[tuple, list[float]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: cf.ThreadPoolExecutor | None = None
        # a group is a prompt's samples: videos come whole (and are refused) rather than as frames,
        # which would pool every frame of a prompt's clips into one ranking
        self.video = judging != "single"
        self.by_group = judging != "single"  # given groups= (Reward.by_group)

    @classmethod
    def judges_groups(cls, params: dict[str, Any]) -> bool:
        return params.get("judging", "single") != "single"

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        """The params' values; with ``check_files`` also that ``api_key_env`` is set here and that
        an OpenAI-compatible server answers ``GET {base_url}/v1/models`` (within seconds; the model
        name is not checked against its list: llama.cpp's and ``transformers serve``'s lists name
        other things)."""
        problems = []
        if "base_url" not in params:
            problems.append("base_url is required: the judge server's address, e.g. 'http://10.0.0.7:8000'")
        elif (p := base_url_problem(params["base_url"])) is not None:
            problems.append(p)
        model = params.get("model")
        if not isinstance(model, str) or not model:
            problems.append(
                f"model is required: the model name the server serves (its /v1/models), got {model!r}"
            )
        mode, judging = params.get("score", "text"), params.get("judging", "single")
        if judging in ("group", "pairwise") and mode != "text":
            problems.append(
                f"judging: {judging} reads its verdict from the answer's text; it needs score: text (a "
                "yes/no log-prob scores one image)"
            )
        problems += unused_problems(params)
        template = params.get("template")
        if template is not None and (p := template_problem("template", template)) is not None:
            problems.append(p)
        if judging == "group":
            group = params.get("group_template", GROUP_QUESTION)
            if (p := template_problem("group_template", group, n=2)) is not None:
                problems.append(p)
            if (p := pattern_problem("rank_pattern", params.get("rank_pattern", RANKING))) is not None:
                problems.append(p)
        elif judging == "pairwise":
            pair = params.get("pair_template", PAIR_QUESTION)
            if (p := template_problem("pair_template", pair)) is not None:
                problems.append(p)
            if (p := pattern_problem("pair_pattern", params.get("pair_pattern", PAIR_ANSWER))) is not None:
                problems.append(p)
        elif (
            mode == "text"
            and (p := pattern_problem("pattern", params.get("pattern", FINAL_SCORE))) is not None
        ):
            problems.append(p)
        low, high = params.get("score_min", 0.0), params.get("score_max", 5.0)
        numbers = all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)
        )
        if not numbers:
            problems.append(f"score_min and score_max must be finite numbers, got {low!r} and {high!r}")
        elif low >= high:
            problems.append(
                f"score_min ({low:g}) must be below score_max ({high:g}): the judge's score range"
            )
        yes, no = params.get("yes", "Yes"), params.get("no", "No")
        for name, word in (("yes", yes), ("no", no)):
            if not isinstance(word, str) or not word.strip():
                problems.append(
                    f"{name} must be a word (the answer token, compared case-insensitively), got {word!r}"
                )
        if isinstance(yes, str) and isinstance(no, str) and yes.strip().lower() == no.strip().lower():
            problems.append(f"yes and no are the same word ({yes!r}); the score would always be 0.5")
        problems += api_key_problems(params.get("api_key_env"), check_env=check_files)
        if check_files and not problems:
            problems += server_problems(params["base_url"], params.get("api_key_env"))
        return problems

    # -- calls ------------------------------------------------------------------------------------

    def __call__(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata,
        groups: Sequence[int] | None = None,
    ) -> torch.Tensor:
        return self.call_by(images, prompts, metadata, None, groups=groups)

    def call_by(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[dict],
        deadline: float | None,
        groups: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """``(B,)`` scores, NaN where a sample failed; every request ends by ``deadline``
        (``time.monotonic()``; None: ``retries`` and ``timeout_s`` alone bound it). A
        :class:`RewardError` saying why when every sample failed. ``groups`` (group and pairwise
        judging; one int per sample, equal for one prompt's samples) says which samples are
        judged together."""
        if images.ndim == 5:
            raise RewardError(
                f"reward {self.name!r}: judging: {self.judging} compares still images, and this run makes "
                "videos; use judging: single (each frame is judged and a video scores their mean)"
            )
        if self.judging != "single" and (groups is None or len(groups) != len(prompts)):
            given = "none" if groups is None else f"{len(groups)} for {len(prompts)} samples"
            raise RewardError(
                f"reward {self.name!r}: judging: {self.judging} needs each sample's prompt group (groups=, "
                f"one per sample), and this caller gave {given}; samples are never grouped by prompt "
                "text. Use judging: single here, or call it through RewardSet.submit(..., groups=...)"
            )
        pngs = [encode_png(self._sized(a)) for a in quantize(images).permute(0, 2, 3, 1).numpy()]
        prompts = list(prompts)
        # a sample's score: the mean of what its requests gave it (one request each, except in
        # pairwise judging: its K - 1 comparisons, whose mean is its win rate)
        sums, counts = torch.zeros(len(prompts), dtype=torch.float64), torch.zeros(len(prompts))
        failures: list[tuple[list[int], str]] = []
        pending: dict[cf.Future, _Job] = {}
        for job in self._jobs(pngs, prompts, groups):
            cached = self._cached(job.key)
            if cached is not None:
                sums[job.rows] += torch.tensor(cached, dtype=torch.float64)
                counts[job.rows] += 1
            elif isinstance(job.body, str):
                failures.append((job.fails, job.body))
            else:
                pending[self._executor().submit(self._run, job.body, len(job.rows), deadline)] = job
        for future, job in pending.items():
            outcome = future.result()  # _run returns by the deadline (each attempt is bounded)
            if outcome.scores is None:
                failures.append((job.fails, outcome.why))
            else:
                sums[job.rows] += torch.tensor(outcome.scores, dtype=torch.float64)
                counts[job.rows] += 1
                self._store(job.key, outcome.scores)
        scores = (sums / counts.clamp(min=1)).float()
        for rows, _ in failures:
            scores[rows] = float("nan")
        if failures:
            failed = int(scores.isnan().sum())
            rows, why = failures[0]
            note = (
                f"{self.name} at {self.base_url}: {failed} of {len(prompts)} sample(s) failed; sample "
                f"{rows[0]} (prompt {quote(prompts[rows[0]], 80)}): {why}"
            )
            if failed == len(prompts):
                raise RewardError(note)
            LOG.warning(note)
        return scores

    def _jobs(self, pngs: list[bytes], prompts: list[str], groups: Sequence[int] | None) -> list[_Job]:
        """The call's requests: one per image, one per group of samples (``group``: the samples of
        equal ``groups``), or one per pair of a group's images (``pairwise``)."""
        mode = (self.mode, self.judging)
        digests = [hashlib.sha256(png).hexdigest() for png in pngs]
        if self.judging == "single":
            return [
                _Job(
                    [i],
                    functools.partial(self._single_request, png, prompt),
                    (digests[i], prompt, self.model, self.template, mode),
                    [i],
                )
                for i, (png, prompt) in enumerate(zip(pngs, prompts))
            ]
        members: dict[int, list[int]] = {}
        for i, group in enumerate(groups or []):
            members.setdefault(int(group), []).append(i)
        jobs = []
        for rows in members.values():
            prompt = prompts[rows[0]]  # a group is one prompt's samples
            if len(rows) < 2:
                why = (
                    f"judging: {self.judging} needs at least 2 samples of a prompt in one call, and this one "
                    "holds 1; set rollout.micro_group_size to a multiple of rollout.n_samples_per_prompt"
                )
                jobs.append(_Job(rows, why, (), rows))
            elif self.judging == "group":
                key = (tuple(digests[i] for i in rows), prompt, self.model, self.template, mode)
                text = self.template.format(prompt=prompt, n=len(rows))
                jobs.append(
                    _Job(
                        rows, functools.partial(self._many_request, [pngs[i] for i in rows], text), key, rows
                    )
                )
            else:
                for a, b in itertools.combinations(rows, 2):
                    key = ((digests[a], digests[b]), prompt, self.model, self.template, mode)
                    text = self.template.format(prompt=prompt)
                    jobs.append(
                        _Job(
                            [a, b], functools.partial(self._many_request, [pngs[a], pngs[b]], text), key, rows
                        )
                    )
        return jobs

    def _single_request(self, png: bytes, prompt: str) -> bytes:
        content = [
            {"type": "image_url", "image_url": {"url": data_url(png)}},
            {"type": "text", "text": self.template.format(prompt=prompt)},
        ]
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "temperature": self.temperature,
        }
        if self.mode == "yes_logprob":
            body.update(max_tokens=1, logprobs=True, top_logprobs=self.top_logprobs)
        else:
            body["max_tokens"] = self.max_tokens
        return json.dumps(body).encode()

    def _many_request(self, pngs: list[bytes], text: str) -> bytes:
        """A request showing ``pngs`` as Image 1, Image 2, ..., then asking ``text``."""
        content: list[dict] = []
        for i, png in enumerate(pngs, 1):
            content += [
                {"type": "text", "text": f"Image {i}:"},
                {"type": "image_url", "image_url": {"url": data_url(png)}},
            ]
        content.append({"type": "text", "text": text})
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        return json.dumps(body).encode()

    def _run(self, request: Callable[[], bytes], n: int, deadline: float | None) -> _Outcome:
        """One request, retried on :class:`~diffrl.transport.client.Retry` within ``deadline``
        (:func:`~diffrl.transport.client.with_retries`, as the remote reward's); a failure as an outcome."""
        body = request()
        try:
            return with_retries(
                lambda wait: self._attempt(body, n, wait),
                self.timeout_s,
                self.retries,
                self.backoff_s,
                deadline,
            )
        except _Fatal as e:
            return _Outcome(None, str(e))
        except GaveUp as e:
            return _Outcome(None, f"failed after {e}")

    def _attempt(self, body: bytes, n: int, wait: float) -> _Outcome:
        """One attempt of at most ``wait`` seconds: POST ``body``, read the answer's ``n`` score(s)."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            status, data, _ = exchange(
                self.base_url, "POST", self._path, wait, body, headers, max_bytes=self.max_answer_bytes
            )
        except TimeoutError as e:
            raise Retry(f"no answer within {wait:.3g} s") from e
        except AnswerTooLarge as e:  # read no further than the bound: the same answer would come again
            raise _Fatal(f"the answer is over max_answer_bytes ({self.max_answer_bytes:,})") from e
        except (OSError, http.client.HTTPException) as e:
            raise Retry(f"{type(e).__name__}: {str(e)[:MAX_QUOTE]}") from e
        detail = data[: 2 * MAX_QUOTE].decode("utf-8", "replace").strip() or "(empty body)"
        if status == 429 or status >= 500:
            raise Retry(f"HTTP {status}: {quote(detail)}")
        if status in (401, 403):
            fix = (
                "set api_key_env to a variable holding the server's key"
                if self._token is None
                else ("check the key in the api_key_env variable")
            )
            raise _Fatal(f"the server refused the request (HTTP {status}: {quote(detail)}); {fix}")
        if status != 200:
            raise _Fatal(
                f"the server rejected the request (HTTP {status}: {quote(detail)}); check model "
                f"({self.model!r}) against its /v1/models"
            )
        return self._outcome(data, n)

    def _outcome(self, data: bytes, n: int) -> _Outcome:
        try:
            answer = json.loads(data)
            choice = answer["choices"][0]
            message = choice.get("message") or {}
        except (ValueError, RecursionError, KeyError, IndexError, TypeError, AttributeError):
            raise _Fatal(
                f"the answer is no chat completion ({quote(data[:MAX_QUOTE].decode('utf-8', 'replace'))}); is "
                f"{self.base_url} an OpenAI-compatible server?"
            ) from None
        if self.mode == "yes_logprob":
            logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
            content = logprobs.get("content") if isinstance(logprobs, dict) else None
            if not isinstance(content, list) or not content or not isinstance(content[0], dict):
                raise _Fatal(
                    f"the server at {self.base_url} answered without logprobs: it ignores logprobs/"
                    "top_logprobs (transformers serve does); score: yes_logprob needs a server that returns "
                    "them (vLLM, sglang, llama.cpp's), or use score: text"
                )
            top = content[0].get("top_logprobs")
            if not isinstance(top, list):
                raise _Fatal("the server answered logprobs without top_logprobs for the first token")
            value, why = yes_probability(top, self.yes, self.no)
            return _Outcome(None if value is None else [value], why)
        text = message.get("content") if isinstance(message, dict) else None
        if not isinstance(text, str):
            refusal = message.get("refusal") if isinstance(message, dict) else None
            return _Outcome(None, f"the judge gave no answer text (refusal: {quote(str(refusal))})")
        cut = " (cut at max_tokens)" if choice.get("finish_reason") == "length" else ""
        if self.judging == "group":
            scores, why = read_ranking(text, self.pattern, n)
            return _Outcome(scores, why + cut if why else "")
        if self.judging == "pairwise":
            scores, why = read_pair(text, self.pattern)
            return _Outcome(scores, why + cut if why else "")
        value, why = read_score(text, self.pattern, self.low, self.high)
        return _Outcome(None if value is None else [value], why + cut if why else "")

    # -- helpers ----------------------------------------------------------------------------------

    def _sized(self, pixels: np.ndarray) -> np.ndarray:
        """``(H, W, 3)`` uint8, resized to ``resize x resize`` (bicubic, as flow_grpo) if asked."""
        if self.resize is None:
            return np.ascontiguousarray(pixels)
        image = Image.fromarray(np.ascontiguousarray(pixels)).resize(
            (self.resize, self.resize), Image.BICUBIC
        )
        return np.asarray(image)

    def _executor(self) -> cf.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"reward-{self.name}")
            return self._pool

    def _cached(self, key: tuple) -> list[float] | None:
        with self._lock:
            value = self._cache.get(key)
            if value is not None:
                self._cache.move_to_end(key)
            return value

    def _store(self, key: tuple, scores: list[float]) -> None:
        if self.cache_size == 0:
            return
        with self._lock:
            self._cache[key] = scores
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


PROBE_TIMEOUT_S = 3.0
"""How long preflight waits for a judge server's ``/v1/models``, in all."""


def server_problems(base_url: str, api_key_env: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """Why no OpenAI-compatible server answers ``GET /v1/models`` at ``base_url`` (with the key)."""
    path = completions_path(base_url).removesuffix("/chat/completions") + "/models"
    headers = {"Authorization": f"Bearer {api_key(api_key_env)}"} if api_key_env else {}
    answer = probe(base_url, path, timeout_s, headers)
    if isinstance(answer, str):
        return [
            f"base_url: no judge server answers at {base_url} ({answer}); start it first (vLLM, sglang, "
            "llama.cpp's or transformers serve, with the judge model) or fix base_url"
        ]
    status, data = answer
    if status in (401, 403):
        fix = (
            "check the key in " + api_key_env
            if api_key_env
            else "set api_key_env to a variable holding its key"
        )
        return [f"api_key_env: the judge server at {base_url} refused {path} (HTTP {status}); {fix}"]
    if status != 200:
        detail = data[:MAX_QUOTE].decode("utf-8", "replace")
        return [
            f"base_url: GET {path} at {base_url} answered HTTP {status} {quote(detail)}; is it an OpenAI-compatible server?"
        ]
    return []


def api_key_problems(env: Any, check_env: bool) -> list[str]:
    if env is None:
        return []
    if not isinstance(env, str) or not ENV_NAME.fullmatch(env):
        return [f"api_key_env must be the name of an environment variable (e.g. JUDGE_API_KEY), got {env!r}"]
    if not check_env:
        return []
    key = api_key(env)
    if not key:
        return [
            f"api_key_env: the environment variable {env} is not set (or empty) here; export the judge "
            "server's key in it before starting the run"
        ]
    if not (key.isascii() and key.isprintable()):  # never quoted: it is a secret
        return [
            f"api_key_env: the key in {env} holds a control or non-ASCII character inside it (surrounding "
            "whitespace is stripped), which an HTTP header cannot carry; export the key alone"
        ]
    return []
