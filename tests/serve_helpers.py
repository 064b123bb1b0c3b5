"""What the server tests share: a tiny target whose tokenizer has a chat template, raw HTTP calls
(bodies the OpenAI client would never send) and a /metrics reader."""
from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse

from conftest import char_tokenizer, tiny_model

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def target():
    return tiny_model("llama", seed=1, sharpen=4.0)


def tokenizer(chat: bool = True):
    tok = char_tokenizer()
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            timeout: float = 30.0) -> tuple[int, dict | str]:
    """(status, JSON body or text) of one raw HTTP request."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read().decode()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data
    finally:
        conn.close()


def post_json(url: str, path: str, body, headers: dict | None = None) -> tuple[int, dict | str]:
    return request(url, "POST", path, json.dumps(body).encode(),
                   {"Content-Type": "application/json", **(headers or {})})


METRIC_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$")


def scrape(url: str) -> dict[str, float]:
    """/metrics as {name{labels}: value} (the _created series left out)."""
    status, text = request(url, "GET", "/metrics")
    assert status == 200
    values = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line)
        if match and not match.group(1).endswith("_created"):
            values[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return values


def wait_for(predicate, timeout: float = 10.0, every: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()
