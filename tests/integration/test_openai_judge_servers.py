"""The openai_judge reward against real OpenAI-compatible servers on loopback, tiny models built
here (tests/integration/judge_models.py).

- ``score: text``, ``judging: group`` and ``judging: pairwise`` against ``transformers serve`` (5.24;
  started in about 5 s): a scripted LLaVA writes "Final Score: 4", a refusal, "Ranking: 2 > 1" or
  "<answer>Image 2 is better</answer>", as the user's text asks.
  The same server ignores ``logprobs``, so ``score: yes_logprob`` on it must say so.
- ``score: yes_logprob`` against llama.cpp's server (llama-cpp-python, ``.ci/llama-env`` builds it;
  ``DIFFRL_LLAMA_PYTHON`` is its python): a tiny Qwen2.5-VL converted to GGUF + mmproj, compared with
  the in-process judge (:class:`~diffrl.rewards.judge.JudgeReward`, ``normalize: true``, the same
  P(Yes) / (P(Yes) + P(No))) on the transformers model. Images are 84 x 84: llama.cpp resizes Qwen
  images to at least 6272 pixels and the HF processor here to 784, so only sides that both keep
  (multiples of 28 above 6272 pixels) give both the same patches; text log-probs are compared too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from diffrl.config import RewardConfig
from diffrl.core.parallel import listen_port
from diffrl.rewards.base import RewardError, RewardSet
from diffrl.rewards.openai_judge import YES_NO_QUESTION, OpenAIJudge
from tests.conftest import ROOT
from tests.integration.judge_models import REFUSE, to_gguf, yes_no_qwen
from tests.integration.test_bad_inputs import BAD, GRPO, Case, _check, run_row

START_S = 120.0
LLAMA = os.environ.get("DIFFRL_LLAMA_PYTHON")


class PortTaken(RuntimeError):
    pass


def lists_model(base_url: str, model: str) -> bool:
    """Whether ``GET {base_url}/v1/models`` answers a list naming ``model`` (a folder or file path
    of the test's own: no other server on the machine serves it)."""
    try:
        with urllib.request.urlopen(base_url + "/v1/models", timeout=2) as answer:
            listed = json.loads(answer.read(2**20)).get("data", [])
    except (OSError, ValueError, AttributeError):
        return False
    return any(isinstance(m, dict) and m.get("id") == model for m in listed)


def started(cmd: list[str], url: str, base_url: str, model: str, log: Path) -> subprocess.Popen:
    """``cmd`` started in a session of its own, once it is alive, ``url`` answers 200 and its
    ``/v1/models`` lists ``model`` (within :data:`START_S`): another process answering on the port
    (it was free when drawn, and may be taken before the server binds it) is not taken for it."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    end = time.monotonic() + START_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")
            taken = "address already in use" in text.lower()
            raise (PortTaken if taken else RuntimeError)(
                f"{cmd[0]} exited with {proc.returncode}:\n{text[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                ready = answer.status == 200
        except OSError:
            ready = False
        if ready and lists_model(base_url, model) and proc.poll() is None:
            return proc
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(
        f"{url} did not answer within {START_S:g} s:\n{log.read_text(errors='replace')[-3000:]}"
    )


def serving(
    command: Callable[[int], list[str]], path: str, model: str, log: Path
) -> tuple[subprocess.Popen, str]:
    """A server ``command(port)`` answering ``path`` on loopback and listing ``model``, and its base
    URL. The port is drawn below the ephemeral range (:func:`~diffrl.core.parallel.listen_port`), and
    drawn again (3 tries) when another program took it between drawing and binding."""
    for attempt in range(3):
        base_url = f"http://127.0.0.1:{listen_port('127.0.0.1')}"
        try:
            return started(
                command(int(base_url.rsplit(":", 1)[1])), base_url + path, base_url, model, log
            ), base_url
        except PortTaken:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(base_url, model)`` of ``transformers serve`` serving the scripted LLaVA."""
    from tests.integration.judge_models import scripted_llava

    folder = scripted_llava(tmp_path_factory.mktemp("llava"))
    cli = "from transformers.cli.transformers import main; main()"  # the `transformers` command

    def command(port: int) -> list[str]:
        return [
            sys.executable,
            "-c",
            cli,
            "serve",
            str(folder),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
        ]

    proc, url = serving(command, "/health", str(folder), folder / "serve.log")
    try:
        yield url, str(folder)
    finally:
        stop(proc)


def judge(served, **params) -> OpenAIJudge:
    url, model = served
    if params.get("judging", "single") == "single":
        params.setdefault("template", "Rate {prompt}")
    return OpenAIJudge(base_url=url, model=model, timeout_s=30, **params)


def pictures(n: int, side: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, side, side, generator=torch.Generator().manual_seed(seed))


def test_text_score_parsed_from_the_servers_answer(served):
    # "Final Score: 4" / 5 = 0.8 (flow_grpo's scaling); the refused samples fail alone
    reward = judge(served)
    prompts = ["a cat", f"{REFUSE} a dog", "a red dog", f"{REFUSE}"]
    scores = reward.call_by(pictures(4), prompts, [{}] * 4, time.monotonic() + 60)
    assert scores[0].item() == pytest.approx(0.8) and scores[2].item() == pytest.approx(0.8)
    assert scores[1].isnan() and scores[3].isnan()
    reward.close()


def test_preflight_finds_both_servers(served, llama_or_none):
    for url in [served[0], *([llama_or_none[0]] if llama_or_none else [])]:
        assert OpenAIJudge.param_problems({"base_url": url, "model": "m"}, check_files=True) == []


def test_refused_samples_are_counted_failed_in_a_reward_set(served):
    url, model = served
    params = {
        "base_url": url + "/v1",
        "model": model,
        "template": "Rate {prompt}",
        "score_min": 1,
        "score_max": 5,
    }
    rewards = RewardSet([RewardConfig(name="openai_judge", params=params, timeout_s=60)])
    try:
        out = rewards.submit(pictures(3), ["a cat", f"{REFUSE} it", "a dog"], [{}] * 3).result()
    finally:
        rewards.close()
    scores = out.per_reward["openai_judge"]
    assert scores[0].item() == pytest.approx(0.75) and scores[2].item() == pytest.approx(0.75)  # (4 - 1) / 4
    assert scores[1].isnan() and out.metrics("rollout")["rollout/openai_judge/failed"] == 1.0
    assert any("non-finite" in e for e in out.errors)


def test_an_answer_refused_everywhere_says_what_the_judge_wrote(served):
    with pytest.raises(RewardError, match=r"I cannot judge this image"):
        judge(served)(pictures(2), [f"{REFUSE} a", f"{REFUSE} b"], [{}] * 2)


def test_yes_logprob_on_a_server_that_ignores_logprobs_is_an_error(served):
    reward = judge(served, score="yes_logprob")
    with pytest.raises(RewardError, match="answered without logprobs: it ignores logprobs"):
        reward(pictures(1), ["a cat"], [{}])


def test_pairwise_judging_scores_win_rates(served):
    # every pair answered "<answer>Image 2 is better</answer>": of three images, the first loses both
    # comparisons, the second wins one of two, the third wins both (Pref-GRPO's win rates)
    reward = judge(served, judging="pairwise", pair_template="PAIR: which image shows {prompt}?")
    scores = reward.call_by(pictures(3), ["a cat"] * 3, [{}] * 3, time.monotonic() + 60, groups=[0, 0, 0])
    assert scores.tolist() == [0.0, 0.5, 1.0]


def test_group_judging_reads_the_ranking(served):
    # one request per prompt: 2 images answered "Ranking: 2 > 1" -> image 2 best (1.0), image 1 worst
    # (0.0); the same answer for 3 images names 2 of 3 and fails the group; a lone image fails
    reward = judge(served, judging="group", group_template="RANK the {n} images of {prompt}")
    prompts = ["a cat", "a cat", "a dog", "a dog", "a dog", "a bird"]
    groups = [0, 0, 1, 1, 1, 2]
    scores = reward.call_by(pictures(6), prompts, [{}] * 6, time.monotonic() + 60, groups=groups)
    assert scores[:2].tolist() == [0.0, 1.0]
    assert scores[2:].isnan().all()


def test_a_grpo_run_ranks_each_prompts_samples_by_their_group(served, tmp_path):
    # the collector's group_id reaches the judge: 2 prompts x 2 samples in one micro-group are two
    # requests "Ranking: 2 > 1" (scores 0 and 1 each), none failed; without groups every call fails
    from diffrl.launch import train
    from tests.integration.test_flow_grpo import grpo

    url, model = served
    template = "RANK the {n} images of {prompt}"
    params = f"{{base_url: '{url}', model: '{model}', judging: group, group_template: '{template}', timeout_s: 60}}"
    cfg = grpo(
        tmp_path,
        **{
            "rewards": f"[{{name: openai_judge, timeout_s: 120, params: {params}}}]",
            "rollout.n_samples_per_prompt": 2,
            "train.batch_size": 4,
            "sampling.num_steps": 2,
            "algorithm.params": "{step_strategy: {name: sde_window, size: 1, range: [0, 1]}}",
        },
    )
    m = train(cfg).history[0]
    assert m["rollout/reward_failed"] == 0 and m["rollout/reward/openai_judge/failed"] == 0
    assert (m["rollout/reward/raw_min"], m["rollout/reward/raw_mean"], m["rollout/reward/raw_max"]) == (
        0,
        0.5,
        1,
    )


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """``(base_url, hf folder)`` of llama.cpp's server serving the Yes/No Qwen2.5-VL."""
    if not LLAMA:
        pytest.skip(
            "no llama.cpp server environment: run .ci/llama-env and set DIFFRL_LLAMA_PYTHON to what it prints"
        )
    folder = tmp_path_factory.mktemp("qwen")
    yes_no_qwen(folder / "hf")
    model, mmproj = to_gguf(folder / "hf", Path(LLAMA).parent.parent / "share" / "llama-convert", folder)

    def command(port: int) -> list[str]:
        cmd = [LLAMA, "-m", "llama_cpp.server", "--model", str(model), "--clip_model_path", str(mmproj)]
        return cmd + ["--chat_format", "mtmd", "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512"]

    proc, url = serving(command, "/v1/models", str(model), folder / "llama.log")
    try:
        yield url, folder / "hf"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def llama_or_none(request):
    return request.getfixturevalue("llama") if LLAMA else None


def test_yes_logprob_equals_the_in_process_judge(llama):
    from diffrl.rewards.judge import JudgeReward

    url, hf = llama
    prompts = ["a cat", "a dog", "a red dog", "a cat on a red dog"]
    images = pictures(4, side=84)
    reward = OpenAIJudge(base_url=url, model="tiny", score="yes_logprob", top_logprobs=5, timeout_s=60)
    served = reward.call_by(images, prompts, [{}] * 4, time.monotonic() + 120)
    local = JudgeReward(model=str(hf), question=YES_NO_QUESTION, normalize=True)(images, prompts, [{}] * 4)
    assert torch.isfinite(served).all()
    assert (served - local).abs().max().item() < 1e-3  # measured 2.4e-5
    assert served.std().item() > 1e-5  # the images move the score: not one constant


def test_text_logprobs_equal_a_transformers_forward(llama):
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    url, hf = llama
    messages = [{"role": "user", "content": "Does this figure show a cat? Please answer yes or no."}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 1, "logprobs": True, "top_logprobs": 5}
    request = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        top = json.loads(answer.read())["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    tok = AutoTokenizer.from_pretrained(hf)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(hf).eval()
    inputs = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        logprobs = torch.log_softmax(model(**inputs).logits[0, -1].double(), dim=-1)
    words = {e["token"]: e["logprob"] for e in top}
    assert list(words)[:2] == ["Yes", "No"]  # the fixture's bias puts them on top
    for word in ("Yes", "No"):
        [token] = tok.encode(word, add_special_tokens=False)
        assert words[word] == pytest.approx(logprobs[token].item(), abs=1e-4)  # measured 2e-6


# -- refusals at the command line ----------------------------------------------------------------

JUDGE = "rewards=[{{name: openai_judge, params: {{base_url: 'http://127.0.0.1:9', model: judge{}}}}}]"
# fmt: off
CASES = [
    Case("judge-server-down", ["train", GRPO, JUDGE.format("")], BAD, "rewards[0] (openai_judge).params: base_url: no judge server answers at http://127.0.0.1:9"),
    Case("judge-no-model", ["train", GRPO, "rewards=[{name: openai_judge, params: {base_url: 'http://127.0.0.1:9'}}]"], BAD, "(openai_judge).params: model is required: the model name the server serves"),
    Case("judge-endpoint-as-base-url", ["train", GRPO, "rewards=[{name: openai_judge, params: {base_url: 'http://127.0.0.1:9/v1/chat/completions', model: m}}]"], BAD, "give the server's base address (the reward adds /v1/chat/completions)"),
    Case("judge-pattern-without-group", ["train", GRPO, JUDGE.format(", pattern: 'Score: [0-9]'")], BAD, "has 0 groups; it needs exactly one"),
    Case("judge-template-without-prompt", ["train", GRPO, JUDGE.format(", template: 'Rate this image'")], BAD, "template must be text holding {prompt}"),
    Case("judge-group-by-logprob", ["train", GRPO, JUDGE.format(", judging: group, score: yes_logprob")], BAD, "judging: group reads its verdict from the answer's text; it needs score: text"),
    Case("judge-unknown-mode", ["train", GRPO, JUDGE.format(", score: logprob")], BAD, "params.score: 'logprob' is not one of ['text', 'yes_logprob']"),
    Case("judge-key-unset", ["train", GRPO, JUDGE.format(", api_key_env: DIFFRL_NO_SUCH_JUDGE_KEY")], BAD, "the environment variable DIFFRL_NO_SUCH_JUDGE_KEY is not set"),
    Case("judge-group-split-prompts", ["train", GRPO, JUDGE.format(", judging: group"), "rollout.micro_group_size=12"], BAD, "judges a prompt's samples together, so each call must hold whole prompts: rollout.micro_group_size (12) must be a multiple of rollout.n_samples_per_prompt (8)"),
    Case("judge-group-eval-one-sample", ["train", GRPO, "eval.rewards=[{name: openai_judge, params: {base_url: 'http://127.0.0.1:9', model: j, judging: pairwise}}]"], BAD, "eval.rewards[0] (openai_judge) judges a prompt's samples together and eval.samples_per_prompt is 1; set it to 2 or more"),
    Case("judge-group-served", ["serve-reward", "--reward", "openai_judge", "--params", "{base_url: 'http://127.0.0.1:9', model: j, judging: group}"], BAD, "it judges a prompt's samples together, and a request to this server carries no groups"),
    Case("judge-range-upside-down", ["train", GRPO, JUDGE.format(", score_min: 5, score_max: 1")], BAD, "score_min (5) must be below score_max (1)"),
    Case("judge-key-with-a-line-break", ["train", GRPO, JUDGE.format(", api_key_env: DIFFRL_JUDGE_KEY_BROKEN")], BAD, "the key in DIFFRL_JUDGE_KEY_BROKEN holds a control or non-ASCII character", absent="sk-secret"),
    Case("judge-key-with-a-line-end", ["train", GRPO, JUDGE.format(", api_key_env: DIFFRL_JUDGE_KEY_LINE")], BAD, "base_url: no judge server answers at http://127.0.0.1:9", absent="sk-secret"),
    Case("judge-host-idna-refuses", ["train", GRPO, "rewards=[{name: openai_judge, params: {base_url: 'http://judge..host:8000', model: m}}]"], BAD, "is no valid host name (each dot-separated part must be 1 to 63"),
    Case("judge-template-attribute", ["train", GRPO, JUDGE.format(", judging: group, group_template: '{prompt} {n.x}'")], BAD, "'{n.x}' is none of them"),
    Case("judge-param-the-mode-ignores", ["train", GRPO, JUDGE.format(", judging: group, pattern: 'S: (.)'")], BAD, "pattern: score: text with judging: group does not use it (it asks group_template and reads with rank_pattern, max_tokens)"),
    Case("judge-group-on-videos", ["train", GRPO, JUDGE.format(", judging: group"), "model.family=wan"], BAD, "rewards[0] (openai_judge) compares a prompt's still images, and model family 'wan' makes videos"),
]
# fmt: on


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_refused(case, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # rows name the shipped recipes by their relative path
    monkeypatch.delenv("DIFFRL_NO_SUCH_JUDGE_KEY", raising=False)
    monkeypatch.setenv("DIFFRL_JUDGE_KEY_BROKEN", "sk-secret\nsk-secret")  # two keys, one a line
    monkeypatch.setenv("DIFFRL_JUDGE_KEY_LINE", "sk-secret\r\n")  # stripped: a good key
    _check(case, *run_row(case, case.argv, monkeypatch, capsys))
