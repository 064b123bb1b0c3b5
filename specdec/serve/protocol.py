"""OpenAI's request bodies, checked by hand (no FastAPI model: its 422s are not OpenAI's 400s): every
known field is honoured, refused with a 400 that names it, or (`user`) documented as ignored; an
unknown field is refused too, so nothing a client sends is dropped in silence. The checks are the
library's own (specdec.arguments), with the OpenAI field names in their messages."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..arguments import (check_flag, check_max_new_tokens, check_sampler, check_seed, check_stop, check_temperature,
                         check_text, check_token_ids, check_top_k, check_top_p, as_int)


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                             413: "invalid_request_error", 415: "invalid_request_error",
                             429: "rate_limit_error"}.get(status, "server_error")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str | None):
    """An `error=` for the library's checks: their message, a 400 naming `param`."""
    return lambda message: APIError(400, message, param)


# fields the server reads beyond OpenAI's, through the client's extra_body
EXTRA_FIELDS = {"top_k", "sampler", "ignore_eos", "stop_token_ids"}
# accepted and ignored, as the docs say
IGNORED_FIELDS = {"user"}
# known OpenAI fields the server does not support: refused unless at their neutral value
NEUTRAL = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
           "best_of": (None, 1), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
           "logit_bias": (None,), "tools": (None,), "tool_choice": (None, "none"), "functions": (None,),
           "function_call": (None, "none"), "response_format": (None,), "parallel_tool_calls": (None, True, False),
           "store": (None, False), "metadata": (None,), "service_tier": (None, "auto", "default"),
           "prediction": (None,), "modalities": (None,), "audio": (None,), "reasoning_effort": (None,),
           "web_search_options": (None,), "verbosity": (None,), "prompt_cache_key": (None,),
           "safety_identifier": (None,)}
COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream", "stream_options"}
COMPLETION_FIELDS = COMMON | {"prompt", "logprobs", "echo", "suffix", "best_of", "presence_penalty",
                              "frequency_penalty", "logit_bias"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "presence_penalty",
                        "frequency_penalty", "logit_bias", "tools", "tool_choice", "functions", "function_call",
                        "response_format", "parallel_tool_calls", "store", "metadata", "service_tier", "prediction",
                        "modalities", "audio", "reasoning_effort", "web_search_options", "verbosity",
                        "prompt_cache_key", "safety_identifier"}
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 64


@dataclass
class Request:
    """A checked request: its prompts (text or ids; chat: the rendered template's ids) and the
    generation arguments of each row. Row k = prompt k // n, choice k % n."""
    kind: str                                  # "completion" | "chat"
    model: str | None
    prompts: list                              # each a string or a list of token ids
    n: int
    stream: bool
    include_usage: bool
    args: dict = field(default_factory=dict)   # Speculator.batch_job's generation arguments
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def rows(self) -> list[tuple[Any, dict]]:
        """(prompt, generation arguments) of every row: choice j of a seeded request samples with
        seed + j (the n choices differ; the same request gives the same n texts)."""
        rows = []
        for prompt in self.prompts:
            for j in range(self.n):
                args = dict(self.args)
                if self.seed is not None:
                    args["seed"] = (self.seed + j) % 2 ** 64
                rows.append((prompt, args))
        return rows


def _refuse_unknown(body: dict, known: set[str]) -> None:
    for name in body:
        if name in known or name in EXTRA_FIELDS or name in IGNORED_FIELDS:
            continue
        raise APIError(400, f"unknown field {name!r}: this server reads {', '.join(sorted(known - set(NEUTRAL)))} "
                            f"and specdec's own {', '.join(sorted(EXTRA_FIELDS))}", name, "unknown_field")
    for name, neutral in NEUTRAL.items():
        if name in body and name in known:
            value = body[name]
            ok = any(value is n or (type(value) is type(n) and value == n) for n in neutral) or value in ({}, []) \
                or (name == "response_format" and value == {"type": "text"})
            if not ok:
                raise APIError(400, f"{name}={value!r} is not supported by specdec serve (leave it out"
                                    f"{', or give ' + repr(neutral[1]) if len(neutral) > 1 else ''})", name,
                               "unsupported_field")


def _common(body: dict, kind: str) -> dict:
    args: dict = {}
    if body.get("max_tokens") is not None:
        args["max_new_tokens"] = check_max_new_tokens(body["max_tokens"], "max_tokens", bad("max_tokens"))
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        args["max_new_tokens"] = check_max_new_tokens(body["max_completion_tokens"], "max_completion_tokens",
                                                      bad("max_completion_tokens"))
    if body.get("temperature") is not None:
        args["temperature"] = check_temperature(body["temperature"], "temperature", bad("temperature"))
    if body.get("top_p") is not None:
        args["top_p"] = check_top_p(body["top_p"], "top_p", bad("top_p"))
    if body.get("top_k") is not None:
        args["top_k"] = check_top_k(body["top_k"], "top_k", bad("top_k"))
    if body.get("sampler") is not None:
        args["sampler"] = check_sampler(body["sampler"], "sampler", bad("sampler"))
    if "stop" in body:
        args["stop"] = list(check_stop(body["stop"], "stop", bad("stop")))
    if body.get("ignore_eos") is not None:
        args["ignore_eos"] = check_flag(body["ignore_eos"], "ignore_eos", bad("ignore_eos"))
    if body.get("stop_token_ids") is not None:
        args["stop_token_ids"] = check_token_ids(body["stop_token_ids"], "stop_token_ids", bad("stop_token_ids"))
    return args


def parse(body: Any, kind: str) -> Request:
    """Check a decoded JSON body of /v1/completions (kind "completion") or /v1/chat/completions ("chat")."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got a JSON {_json_type(body)}", None,
                       "invalid_body")
    _refuse_unknown(body, COMPLETION_FIELDS if kind == "completion" else CHAT_FIELDS)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(400, f"model must be a string, got {_json_type(model)}", "model")
    stream = body.get("stream")
    if stream is None:
        stream = False
    stream = check_flag(stream, "stream", bad("stream"))
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise APIError(400, "stream_options is only allowed with stream=true", "stream_options")
        if not isinstance(options, dict):
            raise APIError(400, f"stream_options must be an object, got {_json_type(options)}", "stream_options")
        unknown = set(options) - {"include_usage", "continuous_usage_stats"}
        if unknown:
            raise APIError(400, f"stream_options holds unknown key(s) {sorted(unknown)}; it may hold include_usage",
                           "stream_options")
        if options.get("continuous_usage_stats"):
            raise APIError(400, "stream_options.continuous_usage_stats is not supported", "stream_options")
        include_usage = check_flag(options.get("include_usage", False), "stream_options.include_usage",
                                   bad("stream_options"))
    n = 1 if body.get("n") is None else as_int(body["n"])
    if n is None or not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be an integer in [1, {MAX_N}], got {body.get('n')!r}", "n")
    seed = check_seed(body.get("seed"), "seed", bad("seed"))
    args = _common(body, kind)
    if kind == "completion":
        prompts = _prompts(body.get("prompt", None))
    else:
        prompts = [_messages(body.get("messages", None))]
    return Request(kind, model, prompts, n, stream, include_usage, args, seed, tuple(args.get("stop", ())))


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _prompts(prompt: Any) -> list:
    """A completion's `prompt`: a string, a list of strings, a list of ids or a list of id lists."""
    if prompt is None:
        raise APIError(400, "prompt is required: a string, a list of strings, or token ids", "prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = [check_token_ids(p, f"prompt[{i}]", bad("prompt")) for i, p in enumerate(prompt)]
    elif isinstance(prompt, list) and prompt:
        prompts = [check_token_ids(prompt, "prompt", bad("prompt"))]
    elif isinstance(prompt, list):
        raise APIError(400, "the prompt is empty: give at least one token", "prompt")
    else:
        raise APIError(400, f"prompt must be a string, a list of strings, or token ids, got {_json_type(prompt)}",
                       "prompt")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise APIError(400, "the prompt is empty: give at least one token" if len(prompts) == 1 else
                           f"prompt[{i}] is empty: give at least one token", "prompt")
        if isinstance(p, str):
            check_text(p, "the prompt", bad("prompt"))
    return prompts


def _messages(messages: Any) -> list[dict]:
    """A chat's `messages`: a non-empty list of {"role", "content"} objects; content a string or a
    list of text parts (joined). Returned as the chat template reads them."""
    if messages is None:
        raise APIError(400, "messages is required: a list of {\"role\": ..., \"content\": ...} objects", "messages")
    if not isinstance(messages, list):
        raise APIError(400, f"messages must be a list of {{\"role\", \"content\"}} objects, got "
                            f"{_json_type(messages)}", "messages")
    if not messages:
        raise APIError(400, "messages is empty: give at least one message", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(400, f"{where} must be an object with a role and a content, got {_json_type(message)}",
                           where)
        role = message.get("role")
        if role is None:
            raise APIError(400, f"{where} has no role: give one of {', '.join(ROLES)}", f"{where}.role")
        if role not in ROLES:
            raise APIError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
        unknown = set(message) - {"role", "content", "name", "tool_call_id", "tool_calls", "refusal"}
        if unknown:
            raise APIError(400, f"{where} holds unknown key(s) {sorted(unknown)}", where)
        if message.get("tool_calls"):
            raise APIError(400, f"{where}.tool_calls: tool calls are not supported", f"{where}.tool_calls")
        content = message.get("content")
        if content is None and role != "assistant":
            raise APIError(400, f"{where} has no content", f"{where}.content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"{where}.content[{j}] must be a text part {{\"type\": \"text\", \"text\": "
                                        f"...}}: only text is supported", f"{where}.content")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is not None and not isinstance(content, str):
            raise APIError(400, f"{where}.content must be a string or a list of text parts, got "
                                f"{_json_type(content)}", f"{where}.content")
        entry = {"role": role, "content": check_text(content or "", f"{where}.content", bad(f"{where}.content"))}
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        out.append(entry)
    return out
