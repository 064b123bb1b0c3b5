"""Bad input to `specdec serve`: each answered at once with the right status and an error in OpenAI's
shape ({"error": {"message", "type", "param", "code"}}), and the server answers a good request after
it, after 100 bad requests in a row too. --api-key guards /v1/* with a Bearer token; /health and
/metrics stay open."""
from __future__ import annotations

import json

import openai
import pytest

from serve_helpers import post_json, request, scrape, target, tokenizer
from specdec import Speculator
from specdec.serve import Server
from specdec.strategies.prompt_lookup import PromptLookup

LIMIT = 4096          # the test server's body limit
KEY = "sk-test-0123456789"
GOOD = {"prompt": "def f(x):", "max_tokens": 5, "temperature": 0}
GOOD_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0}
JSON = {"Content-Type": "application/json"}

# (name, path, raw body or JSON-able body, headers, status, param or None)
BAD = [
    ("not JSON", "/v1/completions", b"{\"prompt\": ", JSON, 400, None),
    ("JSON not an object", "/v1/completions", b"[\"def f(x):\"]", JSON, 400, None),
    ("a JSON string", "/v1/completions", b"\"def\"", JSON, 400, None),
    ("not UTF-8", "/v1/completions", b"{\"prompt\": \"\xff\xfe\"}", JSON, 400, None),
    ("wrong Content-Type", "/v1/completions", json.dumps(GOOD).encode(), {"Content-Type": "text/plain"}, 415, None),
    ("no Content-Type", "/v1/completions", json.dumps(GOOD).encode(), {}, 415, None),
    ("unknown model", "/v1/completions", {**GOOD, "model": "gpt-17"}, JSON, 404, "model"),
    ("no prompt", "/v1/completions", {"max_tokens": 5}, JSON, 400, "prompt"),
    ("empty prompt", "/v1/completions", {**GOOD, "prompt": ""}, JSON, 400, "prompt"),
    ("empty id prompt", "/v1/completions", {**GOOD, "prompt": []}, JSON, 400, "prompt"),
    ("a prompt of the wrong type", "/v1/completions", {**GOOD, "prompt": 12}, JSON, 400, "prompt"),
    ("a token id out of the vocabulary", "/v1/completions", {**GOOD, "prompt": [5, 100000]}, JSON, 400, "prompt"),
    ("prompt + max_tokens past the context", "/v1/completions", {**GOOD, "max_tokens": 600}, JSON, 400,
     "max_tokens"),
    ("a prompt past the context", "/v1/completions", {**GOOD, "prompt": "x" * 700}, JSON, 400, "prompt"),
    ("max_tokens 0", "/v1/completions", {**GOOD, "max_tokens": 0}, JSON, 400, "max_tokens"),
    ("max_tokens negative", "/v1/completions", {**GOOD, "max_tokens": -3}, JSON, 400, "max_tokens"),
    ("max_tokens a string", "/v1/completions", {**GOOD, "max_tokens": "5"}, JSON, 400, "max_tokens"),
    ("temperature < 0", "/v1/completions", {**GOOD, "temperature": -0.5}, JSON, 400, "temperature"),
    ("top_p 0", "/v1/completions", {**GOOD, "top_p": 0}, JSON, 400, "top_p"),
    ("top_p > 1", "/v1/completions", {**GOOD, "top_p": 1.5}, JSON, 400, "top_p"),
    ("n 0", "/v1/completions", {**GOOD, "n": 0}, JSON, 400, "n"),
    ("a negative seed", "/v1/completions", {**GOOD, "seed": -1}, JSON, 400, "seed"),
    ("an empty stop string", "/v1/completions", {**GOOD, "stop": [""]}, JSON, 400, "stop"),
    ("stream_options without stream", "/v1/completions", {**GOOD, "stream_options": {"include_usage": True}}, JSON,
     400, "stream_options"),
    ("an unknown field", "/v1/completions", {**GOOD, "temprature": 0.5}, JSON, 400, "temprature"),
    ("logprobs (not supported)", "/v1/completions", {**GOOD, "logprobs": 3}, JSON, 400, "logprobs"),
    ("echo (not supported)", "/v1/completions", {**GOOD, "echo": True}, JSON, 400, "echo"),
    ("presence_penalty (not supported)", "/v1/completions", {**GOOD, "presence_penalty": 0.5}, JSON, 400,
     "presence_penalty"),
    ("an unknown sampler", "/v1/completions", {**GOOD, "sampler": "beam"}, JSON, 400, "sampler"),
    ("messages None", "/v1/chat/completions", {**GOOD_CHAT, "messages": None}, JSON, 400, "messages"),
    ("messages missing", "/v1/chat/completions", {"max_tokens": 5}, JSON, 400, "messages"),
    ("messages a string", "/v1/chat/completions", {**GOOD_CHAT, "messages": "hi"}, JSON, 400, "messages"),
    ("messages empty", "/v1/chat/completions", {**GOOD_CHAT, "messages": []}, JSON, 400, "messages"),
    ("messages [123]", "/v1/chat/completions", {**GOOD_CHAT, "messages": [123]}, JSON, 400, "messages[0]"),
    ("messages [{}]", "/v1/chat/completions", {**GOOD_CHAT, "messages": [{}]}, JSON, 400, "messages[0].role"),
    ("a message without a role", "/v1/chat/completions", {**GOOD_CHAT, "messages": [{"content": "hi"}]}, JSON, 400,
     "messages[0].role"),
    ("an unknown role", "/v1/chat/completions", {**GOOD_CHAT, "messages": [{"role": "robot", "content": "hi"}]}, JSON,
     400, "messages[0].role"),
    ("a content of the wrong type", "/v1/chat/completions",
     {**GOOD_CHAT, "messages": [{"role": "user", "content": 5}]}, JSON, 400, "messages[0].content"),
    ("an image part", "/v1/chat/completions",
     {**GOOD_CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     JSON, 400, "messages[0].content"),
    ("tools (not supported)", "/v1/chat/completions", {**GOOD_CHAT, "tools": [{"type": "function"}]}, JSON, 400,
     "tools"),
    ("chat stream_options without stream", "/v1/chat/completions",
     {**GOOD_CHAT, "stream_options": {"include_usage": True}}, JSON, 400, "stream_options"),
    ("a body over the size limit", "/v1/completions", {**GOOD, "prompt": "x" * (2 * LIMIT)}, JSON, 413, None),
    ("an unknown route", "/v1/embeddings", GOOD, JSON, 404, None),
    ("a GET on a POST route", "/v1/completions", None, {}, 405, None),
]


@pytest.fixture(scope="module")
def server():
    model = target()
    with Server(Speculator(model, tokenizer(), PromptLookup()), max_body_bytes=LIMIT) as running:
        yield running


def send(server: Server, path: str, body, headers: dict):
    if body is None:
        return request(server.url, "GET", path, headers=headers)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request(server.url, "POST", path, raw, headers)


def check_error(status: int, body, want_status: int, want_param):
    assert status == want_status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and len(error["message"]) > 10, error
    assert isinstance(error["type"], str), error
    if want_param is not None:
        assert error["param"] == want_param, error


def answers_a_good_request(server: Server) -> None:
    status, body = post_json(server.url, "/v1/completions", GOOD)
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] in ("length", "stop") and body["usage"]["completion_tokens"] >= 1
    status, body = post_json(server.url, "/v1/chat/completions", GOOD_CHAT)
    assert status == 200, body
    assert body["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("name, path, body, headers, status, param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_answered_with_its_status_and_an_openai_error(server, name, path, body, headers, status, param):
    check_error(*send(server, path, body, headers), status, param)
    answers_a_good_request(server)


def test_100_bad_requests_then_a_good_one(server):
    before = scrape(server.url)
    for i in range(100):
        name, path, body, headers, status, param = BAD[i % len(BAD)]
        check_error(*send(server, path, body, headers), status, param)
    answers_a_good_request(server)
    after = scrape(server.url)
    assert after["specdec:num_requests_running"] == 0 and after["specdec:num_requests_waiting"] == 0
    counted = sum(v - before.get(k, 0) for k, v in after.items()
                  if k.startswith("specdec:http_requests_total") and 'status="200"' not in k)
    assert counted == 100, "every bad request is counted by its status"


def test_the_openai_client_sees_the_errors(server):
    c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        c.completions.create(model=server.model, prompt="def", max_tokens=0)
    assert caught.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="not-this-one", prompt="def", max_tokens=3)
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        c.completions.create(model=server.model, prompt="def", max_tokens=3, stream_options={"include_usage": True})


def test_models_and_health(server):
    status, body = request(server.url, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [server.model] and body["object"] == "list"
    status, body = request(server.url, "GET", f"/v1/models/{server.model}")
    assert status == 200 and body["id"] == server.model
    check_error(*request(server.url, "GET", "/v1/models/other"), 404, "model")
    assert request(server.url, "GET", "/health") == (200, {"status": "ok"})
    c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    assert [m.id for m in c.models.list()] == [server.model]


def test_chat_without_a_chat_template_is_refused():
    model = target()
    with Server(Speculator(model, tokenizer(chat=False), PromptLookup())) as bare:
        status, body = post_json(bare.url, "/v1/chat/completions", GOOD_CHAT)
        check_error(status, body, 400, "messages")
        assert "chat template" in body["error"]["message"]
        assert post_json(bare.url, "/v1/completions", GOOD)[0] == 200


def test_the_api_key_guards_v1_only():
    model = target()
    with Server(Speculator(model, tokenizer(), PromptLookup()), api_key=KEY) as guarded:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                        {"Authorization": f"Bearer {KEY}x"}, {"Authorization": KEY}):
            check_error(*post_json(guarded.url, "/v1/completions", GOOD, headers), 401, None)
            check_error(*request(guarded.url, "GET", "/v1/models", headers=headers), 401, None)
        assert post_json(guarded.url, "/v1/completions", GOOD, {"Authorization": f"Bearer {KEY}"})[0] == 200
        assert request(guarded.url, "GET", "/health")[0] == 200
        assert request(guarded.url, "GET", "/metrics")[0] == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=guarded.base_url, api_key="wrong", max_retries=0).models.list()
        c = openai.OpenAI(base_url=guarded.base_url, api_key=KEY, max_retries=0)
        assert c.completions.create(model=guarded.model, prompt="def", max_tokens=3).usage.completion_tokens == 3


def test_the_key_is_compared_in_constant_time(monkeypatch):
    """The check goes through hmac.compare_digest (a plain == leaks the key's prefix through timing)."""
    import hmac
    from specdec.serve import app as app_module
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(app_module.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    model = target()
    with Server(Speculator(model, tokenizer(), PromptLookup()), api_key=KEY) as guarded:
        post_json(guarded.url, "/v1/completions", GOOD, {"Authorization": "Bearer guess"})
    assert calls == [(b"guess", KEY.encode())]
