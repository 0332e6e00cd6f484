"""The openai_judge reward's reading of answers (golden values from the formulas its docstring
cites) and its error paths against a small real HTTP server in the test (http.server on loopback,
scripted answers): a server ignoring logprobs, 500 then success, 429, a stuck server, an oversize
answer, a refused answer, 401, the cache, the concurrency bound, and its params' refusals."""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from diffrl.rewards.base import RewardError
from diffrl.rewards.openai_judge import (
    FINAL_SCORE,
    PAIR_ANSWER,
    RANKING,
    OpenAIJudge,
    completions_path,
    read_pair,
    read_ranking,
    read_score,
    server_problems,
    yes_probability,
)


def completion(text: str | None = None, top: list | None = None) -> dict:
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    if top is not None:
        choice["logprobs"] = {
            "content": [{"token": top[0]["token"], "logprob": top[0]["logprob"], "top_logprobs": top}]
        }
    return {"choices": [choice]}


class Script:
    """What the server answers: ``answers`` in turn (the last one repeats): ``(status, body bytes)``
    or ``("sleep", seconds)``; it records each request's JSON and how many ran at once."""

    def __init__(self, answers):
        self.answers, self.requests, self.lock = list(answers), [], threading.Lock()
        self.running = self.most = 0


@pytest.fixture
def server():
    scripts: list[Script] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            script = scripts[0]
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            with script.lock:
                script.requests.append((self.path, dict(self.headers), body))
                answer = script.answers.pop(0) if len(script.answers) > 1 else script.answers[0]
                script.running += 1
                script.most = max(script.most, script.running)
            if answer[0] == "sleep":
                time.sleep(answer[1])
                answer = (200, json.dumps(completion("Final Score: 3")).encode())
            with script.lock:  # done before answering: the client's next request comes after
                script.running -= 1
            status, data = answer
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

        do_GET = do_POST

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()

    def serve(*answers) -> tuple[str, Script]:
        scripts[:] = [Script(answers)]
        return f"http://127.0.0.1:{httpd.server_address[1]}", scripts[0]

    yield serve
    httpd.shutdown()
    httpd.server_close()


def ok(payload: dict) -> tuple[int, bytes]:
    return 200, json.dumps(payload).encode()


def images(n: int) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(n))


# -- reading answers --------------------------------------------------------------------------------


def test_text_score_as_flow_grpo_reads_unifiedreward():
    pattern = re.compile(FINAL_SCORE)
    assert read_score("The image is sharp.\nFinal Score: 4", pattern, 0, 5) == (0.8, "")  # 4 / 5
    assert read_score("Final Score:3.5 and more", pattern, 1, 5) == (0.625, "")  # (3.5 - 1) / 4
    assert read_score("Final Score: 2 then Final Score: 5", pattern, 0, 5)[0] == 0.4  # the first match
    for refused in ("I cannot help with that.", "Final Score: 7", "Final Score:"):
        score, why = read_score(refused, pattern, 0, 5)
        assert score is None and "no match" in why
    score, why = read_score("Score = 9", re.compile(r"Score = (\d)"), 0, 5)
    assert score is None and "outside [0, 5]" in why


def test_yes_probability_sums_the_spellings_of_each_word():
    top = [
        {"token": " Yes", "logprob": math.log(0.5)},
        {"token": "yes", "logprob": math.log(0.1)},
        {"token": "No", "logprob": math.log(0.2)},
        {"token": "Maybe", "logprob": math.log(0.2)},
    ]
    assert yes_probability(top, "Yes", "No")[0] == pytest.approx(0.6 / 0.8)
    assert yes_probability(top[:2], "Yes", "No")[0] == 1.0  # no "No" in the top-K counts as 0
    score, why = yes_probability([{"token": "Maybe", "logprob": -0.1}], "Yes", "No")
    assert score is None and "neither 'Yes' nor 'No'" in why


def test_ranking_scores_best_one_worst_zero_and_is_strict():
    pattern = re.compile(RANKING)
    assert read_ranking("Image 3 is sharpest.\nRanking: 3 > 1 > 2", pattern, 3) == ([0.5, 0.0, 1.0], "")
    for bad in ("Ranking: 3 > 1", "Ranking: 1 > 1 > 2", "Ranking: 1 > 2 > 4", "no ranking"):
        assert read_ranking(bad, pattern, 3)[0] is None


def test_pair_verdict_as_pref_grpo_reads_unifiedreward_think():
    pattern = re.compile(PAIR_ANSWER)
    think = "<think>Image 1 (9/10) ... Image 2 is better lit but</think>\n"
    assert read_pair(think + "<answer>Image 1 is better</answer>", pattern) == ([1.0, 0.0], "")
    assert read_pair("<answer>\nImage 2 is better\n</answer>", pattern) == ([0.0, 1.0], "")
    # only the first <answer> block counts, and a verdict outside one is none
    assert read_pair("<answer>tie</answer><answer>Image 2 is better</answer>", pattern)[0] is None
    assert read_pair(think + "Image 1 is better", pattern)[0] is None


def test_the_endpoint_path_takes_a_base_url_with_or_without_v1():
    assert completions_path("http://h:1") == "/v1/chat/completions"
    assert completions_path("http://h:1/v1/") == "/v1/chat/completions"
    assert completions_path("http://h:1/judge") == "/judge/v1/chat/completions"


# -- against a server -------------------------------------------------------------------------------


def test_request_carries_the_image_the_question_and_the_key(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "s3cret")
    url, script = server(ok(completion("Final Score: 5")))
    reward = OpenAIJudge(base_url=url, model="judge-7b", template="Rate {prompt}", api_key_env="JUDGE_KEY")
    assert reward(images(1), ["a cat"], [{}]).tolist() == [1.0]
    path, headers, body = script.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer s3cret"
    image, text = body["messages"][0]["content"]
    assert image["image_url"]["url"].startswith("data:image/png;base64,")
    assert text == {"type": "text", "text": "Rate a cat"} and body["model"] == "judge-7b"
    assert body["temperature"] == 0.0


def test_yes_logprob_asks_for_one_token_with_top_logprobs(server):
    top = [{"token": "Yes", "logprob": math.log(0.3)}, {"token": "No", "logprob": math.log(0.1)}]
    url, script = server(ok(completion("Yes", top)))
    reward = OpenAIJudge(base_url=url, model="m", score="yes_logprob", top_logprobs=7)
    assert reward(images(1), ["a"], [{}]).item() == pytest.approx(0.75)
    body = script.requests[0][2]
    assert (body["max_tokens"], body["logprobs"], body["top_logprobs"]) == (1, True, 7)


def test_a_server_without_logprobs_is_an_error_not_a_half(server):
    url, _ = server(ok(completion("Yes")))
    reward = OpenAIJudge(base_url=url, model="m", score="yes_logprob")
    with pytest.raises(RewardError, match="answered without logprobs"):
        reward(images(2), ["a", "b"], [{}] * 2)


def test_500_and_429_are_retried(server):
    url, script = server((500, b"busy"), (429, b"slow down"), ok(completion("Final Score: 2")))
    reward = OpenAIJudge(base_url=url, model="m", retries=2, backoff_s=0.01)
    assert reward(images(1), ["a"], [{}]).item() == pytest.approx(0.4)
    assert len(script.requests) == 3


def test_retries_run_out(server):
    url, script = server((503, b"down"))
    reward = OpenAIJudge(base_url=url, model="m", retries=1, backoff_s=0.01)
    with pytest.raises(RewardError, match=r"failed after 2 attempt\(s\): HTTP 503"):
        reward(images(1), ["a"], [{}])
    assert len(script.requests) == 2


def test_401_is_not_retried_and_names_the_fix(server):
    url, script = server((401, b"bad key"))
    reward = OpenAIJudge(base_url=url, model="m", retries=3, backoff_s=0.01)
    with pytest.raises(RewardError, match="HTTP 401.*set api_key_env"):
        reward(images(1), ["a"], [{}])
    assert len(script.requests) == 1


def test_a_stuck_server_costs_the_deadline_not_more(server):
    url, script = server(("sleep", 5.0))
    reward = OpenAIJudge(base_url=url, model="m", timeout_s=30, retries=5, backoff_s=0.01)
    with pytest.raises(RewardError, match="at the reward's deadline: no answer within"):
        reward.call_by(images(2), ["a", "b"], [{}] * 2, time.monotonic() + 0.5)
    # each attempt ends at the deadline (the timer), which leaves no time for the 5 retries
    assert len(script.requests) <= 2
    reward.close()


def test_an_oversize_answer_is_refused_not_retried(server):
    url, script = server(ok(completion("Final Score: 4 " + "x" * 5000)))
    reward = OpenAIJudge(base_url=url, model="m", max_answer_bytes=1024, retries=3, backoff_s=0.01)
    with pytest.raises(RewardError, match="over max_answer_bytes"):
        reward(images(1), ["a"], [{}])
    assert len(script.requests) == 1


def test_a_refused_answer_fails_its_sample_only(server):
    url, _ = server(
        ok(completion("Final Score: 3")),
        ok(completion("I can't rate people.")),
        ok(completion("Final Score: 3")),
    )
    reward = OpenAIJudge(base_url=url, model="m", concurrency=1)
    scores = reward(images(3), ["a", "b", "c"], [{}] * 3)
    assert (
        scores[0].item() == pytest.approx(0.6)
        and scores[1].isnan()
        and scores[2].item() == pytest.approx(0.6)
    )


def test_no_answer_text_fails_the_sample(server):
    url, _ = server(ok(completion(None)))
    with pytest.raises(RewardError, match="no answer text"):
        OpenAIJudge(base_url=url, model="m")(images(1), ["a"], [{}])


def test_not_a_chat_completion_is_named(server):
    url, _ = server((200, b"<html>hello</html>"))
    with pytest.raises(RewardError, match="no chat completion.*OpenAI-compatible"):
        OpenAIJudge(base_url=url, model="m")(images(1), ["a"], [{}])


def test_scores_are_cached_by_image_and_prompt(server):
    url, script = server(ok(completion("Final Score: 1")))
    reward = OpenAIJudge(base_url=url, model="m", cache_size=2)
    x = images(3)
    reward(x[:2], ["a", "b"], [{}] * 2)
    reward(x[:2], ["a", "b"], [{}] * 2)
    assert len(script.requests) == 2
    reward(x[2:], ["c"], [{}])  # a third entry drops the oldest ("a")
    reward(x[:1], ["a"], [{}])
    assert len(script.requests) == 4
    reward(x[:1], ["other prompt"], [{}])  # same image, other prompt: asked
    assert len(script.requests) == 5


def test_requests_at_a_time_are_bounded_by_concurrency(server):
    url, script = server(("sleep", 0.2))
    reward = OpenAIJudge(base_url=url, model="m", concurrency=2, cache_size=0)
    reward(images(6), [f"p{i}" for i in range(6)], [{}] * 6)
    assert script.most <= 2 and len(script.requests) == 6
    reward.close()


def test_group_judging_sends_a_prompts_images_in_one_request(server):
    url, script = server(ok(completion("Image 2 is best.\nRanking: 2 > 3 > 1")))
    reward = OpenAIJudge(base_url=url, model="m", judging="group", group_template="Rank {n} of {prompt}")
    assert reward(images(3), ["a"] * 3, [{}] * 3, groups=[7, 7, 7]).tolist() == [0.0, 1.0, 0.5]
    content = script.requests[0][2]["messages"][0]["content"]
    assert [c["type"] for c in content] == ["text", "image_url"] * 3 + ["text"]
    assert content[0]["text"] == "Image 1:" and content[-1]["text"] == "Rank 3 of a"


def test_group_judging_refuses_videos_and_single_judging_scores_their_frames(server):
    from diffrl.rewards.base import submit_scores

    url, script = server(ok(completion("Final Score: 5")))
    clips = torch.rand(2, 3, 3, 8, 8)  # (B, 3, F, H, W)
    grouped = OpenAIJudge(base_url=url, model="m", judging="group")
    with pytest.raises(RewardError, match="judging: group compares still images"):
        submit_scores(grouped, clips, ["a", "a"], [{}] * 2).result()
    single = OpenAIJudge(base_url=url, model="m")
    assert submit_scores(single, clips, ["a", "b"], [{}] * 2).result().tolist() == [1.0, 1.0]
    assert len(script.requests) == 6  # each frame judged


def test_pairwise_judging_scores_win_rates_and_fails_a_group_together(server):
    url, script = server(ok(completion("<answer>Image 2 is better</answer>")))
    reward = OpenAIJudge(base_url=url, model="m", judging="pairwise", concurrency=1)
    x = images(5)
    scores = reward(x[:3], ["a"] * 3, [{}] * 3, groups=[0, 0, 0])
    # the second image of every pair wins: image 1 loses both (0), 2 wins one of two, 3 wins both
    assert scores.tolist() == [0.0, 0.5, 1.0] and len(script.requests) == 3
    content = script.requests[0][2]["messages"][0]["content"]
    assert [c["type"] for c in content] == ["text", "image_url", "text", "image_url", "text"]
    url, script = server(ok(completion("<answer>Image 1 is better</answer>")), ok(completion("no verdict")))
    reward = OpenAIJudge(base_url=url, model="m", judging="pairwise", concurrency=1, cache_size=0)
    scores = reward(x[:4], ["a", "a", "b", "b"], [{}] * 4, groups=[0, 0, 1, 1])  # 0 answered, 1 not
    assert scores[:2].tolist() == [1.0, 0.0] and scores[2:].isnan().all()


# -- params ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"model": "m"}, "base_url is required"),
        ({"base_url": "ftp://x", "model": "m"}, "base_url must be http"),
        ({"base_url": "http://h:1/v1/chat/completions", "model": "m"}, "base address"),
        ({"base_url": "http://h:1"}, "model is required"),
        ({"base_url": "http://h:1", "model": "m", "template": "Rate it"}, "holding {prompt}"),
        ({"base_url": "http://h:1", "model": "m", "template": "{prompt} {x}"}, "no template"),
        ({"base_url": "http://h:1", "model": "m", "pattern": "Score: \\d"}, "has 0 groups"),
        ({"base_url": "http://h:1", "model": "m", "pattern": "(("}, "no regular expression"),
        ({"base_url": "http://h:1", "model": "m", "score_min": 5, "score_max": 1}, "must be below"),
        ({"base_url": "http://h:1", "model": "m", "yes": "no", "no": "No"}, "same word"),
        (
            {"base_url": "http://h:1", "model": "m", "judging": "group", "score": "yes_logprob"},
            "needs score: text",
        ),
        ({"base_url": "http://h:1", "model": "m", "api_key_env": "1BAD"}, "name of an environment variable"),
    ],
)
def test_param_problems(params, expected):
    problems = OpenAIJudge.param_problems(params, check_files=False)
    assert any(expected in p for p in problems), problems


def test_an_unset_key_variable_is_named_before_the_run(monkeypatch):
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    params = {"base_url": "http://h:1", "model": "m", "api_key_env": "NO_SUCH_JUDGE_KEY"}
    assert OpenAIJudge.param_problems(params, check_files=False) == []
    [problem] = OpenAIJudge.param_problems(params, check_files=True)
    assert "NO_SUCH_JUDGE_KEY is not set" in problem
    with pytest.raises(RewardError, match="NO_SUCH_JUDGE_KEY is not set"):
        OpenAIJudge(**params)


def test_preflight_asks_the_server_for_its_models(server, monkeypatch):
    url, script = server(ok({"object": "list", "data": [{"id": "judge-7b"}]}))
    params = {"base_url": url + "/v1", "model": "judge-7b"}
    assert OpenAIJudge.param_problems(params, check_files=True) == []
    assert script.requests[0][0] == "/v1/models"
    monkeypatch.setenv("JUDGE_KEY", "k")
    server((401, b"no key"))
    [problem] = server_problems(url, None)
    assert "HTTP 401" in problem and "set api_key_env" in problem
    server((404, b"not here"))
    [problem] = server_problems(url, "JUDGE_KEY")
    assert "answered HTTP 404 'not here'" in problem


def test_preflight_names_a_server_that_is_not_there():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    [problem] = server_problems(f"http://127.0.0.1:{port}", None, timeout_s=1.0)
    assert f"no judge server answers at http://127.0.0.1:{port}" in problem and "start it first" in problem


# -- groups: by the caller's ids, never by prompt text ----------------------------------------------


def test_two_prompts_of_the_same_text_are_two_groups(server):
    # an epoch boundary (or a prompt file's duplicate line) brings one text twice into a call
    url, script = server(ok(completion("Ranking: 2 > 1")))
    reward = OpenAIJudge(base_url=url, model="m", judging="group", group_template="{n} of {prompt}")
    scores = reward(images(4), ["a cat"] * 4, [{}] * 4, groups=[10, 10, 11, 11])
    assert scores.tolist() == [0.0, 1.0, 0.0, 1.0] and len(script.requests) == 2
    assert all(r[2]["messages"][0]["content"][-1]["text"] == "2 of a cat" for r in script.requests)
    url, script = server(ok(completion("<answer>Image 1 is better</answer>")))
    pairwise = OpenAIJudge(base_url=url, model="m", judging="pairwise", concurrency=1)
    scores = pairwise(images(4), ["a cat"] * 4, [{}] * 4, groups=[3, 3, 4, 4])
    assert scores.tolist() == [1.0, 0.0, 1.0, 0.0] and len(script.requests) == 2  # not 4 * 3 / 2


def test_group_judging_without_groups_is_refused_not_guessed_from_text(server):
    url, script = server(ok(completion("Ranking: 2 > 1")))
    reward = OpenAIJudge(base_url=url, model="m", judging="group")
    with pytest.raises(RewardError, match="needs each sample's prompt group.*gave none"):
        reward(images(2), ["a", "a"], [{}] * 2)
    with pytest.raises(RewardError, match="gave 1 for 2 samples"):
        reward(images(2), ["a", "a"], [{}] * 2, groups=[0])
    assert script.requests == []


def test_a_reward_set_gives_groups_to_a_group_judge_only(server, tmp_path):
    from diffrl.config import RewardConfig
    from diffrl.rewards.base import RewardSet

    url, script = server(ok(completion("Ranking: 1 > 2")))
    judge = RewardConfig(name="openai_judge", params={"base_url": url, "model": "m", "judging": "group"})
    other = RewardConfig(name="jpeg_compressibility")  # its call takes no groups: it must get none
    rewards = RewardSet([judge, other])
    try:
        assert rewards.rewards[0].by_group and not rewards.rewards[1].by_group
        out = rewards(images(4), ["a"] * 4, [{}] * 4, groups=torch.tensor([5, 5, 6, 6]))
        assert out.per_reward["openai_judge"].tolist() == [1.0, 0.0, 1.0, 0.0] and len(script.requests) == 2
        assert torch.isfinite(out.per_reward["jpeg_compressibility"]).all()
        out = rewards.submit(images(2), ["a"] * 2, [{}] * 2).result()  # a caller that knows no groups
        assert out.per_reward["openai_judge"].isnan().all() and "gave none" in out.errors[0]
    finally:
        rewards.close()


def test_the_ray_reward_worker_passes_groups(server):
    from diffrl.config import RewardConfig
    from diffrl.distributed.ray.reward_worker import RewardWorker

    url, script = server(ok(completion("Ranking: 2 > 1")))
    cfg = RewardConfig(name="openai_judge", params={"base_url": url, "model": "m", "judging": "group"})
    worker = RewardWorker(cfg, threads=1)
    try:
        out = worker.score(images(4), ["a"] * 4, [{}] * 4, None, [0, 0, 1, 1])
        assert out.per_reward["openai_judge"].tolist() == [0.0, 1.0, 0.0, 1.0] and len(script.requests) == 2
    finally:
        worker.rewards.close()


# -- review findings: answers and params that used to crash or be ignored ----------------------------


def test_a_ranking_with_a_huge_number_fails_its_group_only():
    pattern = re.compile(RANKING)
    scores, why = read_ranking("Ranking: " + "9" * 5000 + " > 1", pattern, 2)
    assert scores is None and "not the numbers 1 to 2" in why and len(why) < 2000


def test_yes_and_no_are_compared_stripped():
    top = [{"token": "Yes", "logprob": math.log(0.3)}, {"token": " no", "logprob": math.log(0.1)}]
    assert yes_probability(top, " Yes", "No ")[0] == pytest.approx(0.75)


def test_a_key_is_stripped_and_one_with_a_control_character_is_refused_unquoted(server, monkeypatch):
    url, script = server(ok(completion("Final Score: 5")))
    monkeypatch.setenv("JUDGE_KEY", "sk-abc\r\n")  # a key file read with its line end
    OpenAIJudge(base_url=url, model="m", api_key_env="JUDGE_KEY")(images(1), ["a"], [{}])
    assert script.requests[0][1]["Authorization"] == "Bearer sk-abc"
    monkeypatch.setenv("JUDGE_KEY", "sk-a\nbc")
    params = {"base_url": url, "model": "m", "api_key_env": "JUDGE_KEY"}
    [problem] = OpenAIJudge.param_problems(params, check_files=True)
    assert "control or non-ASCII character" in problem and "sk-a" not in problem
    with pytest.raises(RewardError, match="control or non-ASCII") as e:
        OpenAIJudge(**params)
    assert "sk-a" not in str(e.value)


P = {"base_url": "http://h:1", "model": "m"}


@pytest.mark.parametrize(
    "params, expected",
    [
        (
            {**P, "base_url": "http://judge..host:8000"},
            "is no valid host name (each dot-separated part must be 1 to 63",
        ),
        (
            {**P, "base_url": f"http://{'a' * 64}.example:8000"},
            "is no valid host name (each dot-separated part must be 1 to 63",
        ),
        (
            {**P, "judging": "group", "group_template": "{prompt} {n.x}"},
            "of {prompt}, {n}: '{n.x}' is none of them",
        ),
        ({**P, "judging": "group", "group_template": "{prompt} {n[0]}"}, "'{n[0]}' is none of"),
        ({**P, "template": "{prompt} {prompt:>999999999}"}, "{prompt}: '{prompt:>999999999}' is none of"),
        ({**P, "template": "{prompt} {"}, "is no template of {prompt}"),
        ({**P, "judging": "group", "pattern": "S: (\\d)"}, "pattern: score: text with judging: group does"),
        (
            {**P, "judging": "group", "template": "{prompt}"},
            "(it asks group_template and reads with rank_pattern",
        ),
        ({**P, "rank_pattern": "R: (.*)"}, "rank_pattern: score: text with judging: single does not use it"),
        ({**P, "judging": "pairwise", "group_template": "{prompt}"}, "it asks pair_template"),
        ({**P, "score": "yes_logprob", "pattern": "(x)"}, "reads with yes, no, top_logprobs)"),
        ({**P, "score": "yes_logprob", "score_min": 1}, "score_min: score: yes_logprob"),
        ({**P, "yes": "Oui"}, "yes: score: text with judging: single does not use it"),
    ],
)
def test_params_that_used_to_crash_or_be_ignored_are_refused(params, expected):
    problems = OpenAIJudge.param_problems(params, check_files=False)
    assert any(expected in p for p in problems), problems


def test_the_params_each_mode_uses_are_accepted():
    for params in (
        {**P, "template": "{prompt}", "pattern": "(x)", "score_min": 1, "max_tokens": 9},
        {**P, "score": "yes_logprob", "template": "{prompt}", "yes": "Oui", "no": "Non", "top_logprobs": 5},
        {**P, "judging": "group", "group_template": "{n} {prompt}", "rank_pattern": "R: (.*)"},
        {**P, "judging": "pairwise", "pair_template": "{prompt}", "pair_pattern": "(1)"},
    ):
        assert OpenAIJudge.param_problems(params, check_files=False) == [], params


def test_eval_judges_each_prompt_apart_even_where_two_share_their_text(server, tmp_path):
    from diffrl.evaluation.evaluate import evaluate
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.rewards.base import RewardSet
    from tests.conftest import tiny_overrides

    url, script = server(ok(completion("Ranking: 2 > 1")))
    (tmp_path / "prompts.txt").write_text("a cat\na cat\n")  # a prompt file's repeated line
    judge = f"{{name: openai_judge, params: {{base_url: '{url}', model: m, judging: group}}}}"
    overrides = {"eval.rewards": f"[{judge}]", "eval.prompts": str(tmp_path / "prompts.txt")}
    overrides.update({"eval.samples_per_prompt": 2, "eval.batch_size": 4})
    config = load_config("recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **overrides))
    rewards = RewardSet(config.eval.rewards)
    try:
        result = evaluate(load_family(config), config, rewards)
    finally:
        rewards.close()
    assert result.errors == [] and result.rewards["openai_judge"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert [r[0] for r in script.requests].count("/v1/chat/completions") == 2
