"""The OpenAI-compatible wire format of `specrt serve`: request bodies checked field by field at the edge and
turned into GenerationOptions, and the shapes of responses, stream chunks and errors.

Every field is validated once, here, and a bad one is a `RequestError` naming it (400 unless said
otherwise), never a guess: fields that would change the output and that specrt cannot honour (`logprobs`,
`n > 1`, penalties, `logit_bias`, ...) are refused, not ignored. Fields that cannot change the output
(`user`, `metadata`, ...) are accepted and ignored. No model work and no engine state here.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from ..options import GenerationOptions

# Fields that would change the output if honoured: refused unless at their neutral value.
UNSUPPORTED = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "n": (None, 1),
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None,),
    "echo": (None, False),
    "suffix": (None,),
    "tools": (None,),
    "tool_choice": (None, "none"),
    "functions": (None,),
    "function_call": (None, "none"),
    "response_format": (None,),
    "guided_json": (None,),
    "min_tokens": (None, 0),
}
ROLES = ("system", "user", "assistant")


class RequestError(Exception):
    """A request the server refuses: an HTTP status and OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code or {400: "invalid_request", 401: "invalid_api_key", 404: "not_found"}.get(status)
        self.type = {
            401: "authentication_error",
            404: "not_found_error",
            413: "invalid_request_error",
            429: "rate_limit_error",
            503: "unavailable_error",
        }.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Defaults:
    """What a request gets for the fields it leaves out (`specrt serve` flags)."""

    max_tokens: int = 256
    temperature: float = 1.0  # OpenAI's default: sampling unless the client asks for 0
    top_p: float = 1.0
    top_k: int = 0
    num_draft_tokens: int | None = None  # auto


@dataclass
class Parsed:
    """A checked request: the prompt (text, token ids, or chat messages) and its generation options."""

    kind: str  # "completion" or "chat"
    model: str
    options: GenerationOptions
    prompt: str | list[int] | None = None
    messages: list[dict] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def _need(ok: bool, param: str, expected: str, value: Any) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise RequestError(f"'{param}' must be {expected}; got {shown}", param)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse(body: Any, kind: str, defaults: Defaults, model_names: tuple[str, ...]) -> Parsed:
    """Check a /v1/completions (kind "completion") or /v1/chat/completions ("chat") body."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", None)
    model = body.get("model")
    _need(isinstance(model, str) and bool(model), "model", "the name of a served model", model)
    if model not in model_names:
        raise RequestError(
            f"model '{model}' does not exist; this server serves {', '.join(model_names)}",
            "model",
            status=404,
            code="model_not_found",
        )
    for name, neutral in UNSUPPORTED.items():
        if name in body and not any(body[name] == v and type(body[name]) is type(v) for v in neutral):
            raise RequestError(f"'{name}' is not supported by this server (got {body[name]!r}); drop it", name)
    parsed = Parsed(kind, model, GenerationOptions())
    if kind == "completion":
        parsed.prompt = _prompt(body.get("prompt"))
    else:
        parsed.messages = _messages(body.get("messages"))
    stream = body.get("stream", False)
    _need(isinstance(stream, bool) or stream is None, "stream", "true or false", stream)
    parsed.stream = bool(stream)
    stream_options = body.get("stream_options")
    if stream_options is not None:
        _need(isinstance(stream_options, dict), "stream_options", "an object", stream_options)
        _need(parsed.stream, "stream_options", "given only with stream: true", stream_options)
        usage = stream_options.get("include_usage", False)
        _need(isinstance(usage, bool), "stream_options.include_usage", "true or false", usage)
        parsed.include_usage = usage
    parsed.options = _options(body, defaults)
    return parsed


def _prompt(prompt: Any) -> str | list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        _need(bool(prompt), "prompt", "a non-empty string or a list of token ids", prompt)
        return prompt
    ok = isinstance(prompt, list) and bool(prompt) and all(_int(t) and t >= 0 for t in prompt)
    _need(ok, "prompt", "a non-empty string, or a list of token ids (one prompt per request)", prompt)
    return prompt


def _messages(messages: Any) -> list[dict]:
    _need(isinstance(messages, list) and bool(messages), "messages", "a non-empty list of messages", messages)
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        _need(isinstance(m, dict), where, "an object with 'role' and 'content'", m)
        role, content = m.get("role"), m.get("content")
        _need(role in ROLES, f"{where}.role", " or ".join(ROLES), role)
        if isinstance(content, list):  # content parts: text only
            texts = []
            for j, part in enumerate(content):
                ok = isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                _need(ok, f"{where}.content[{j}]", "a text part {'type': 'text', 'text': ...}", part)
                texts.append(part["text"])
            content = "".join(texts)
        _need(isinstance(content, str), f"{where}.content", "a string or a list of text parts", content)
        out.append({"role": role, "content": content})
    return out


def _options(body: dict, defaults: Defaults) -> GenerationOptions:
    opts = {}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if max_tokens is not None:
        _need(_int(max_tokens) and max_tokens >= 1, param, "an integer >= 1", max_tokens)
    opts["max_new_tokens"] = max_tokens if max_tokens is not None else defaults.max_tokens
    temperature = body.get("temperature")
    if temperature is not None:
        _need(_num(temperature) and 0 <= temperature <= 2, "temperature", "a number in [0, 2]", temperature)
    opts["temperature"] = float(temperature if temperature is not None else defaults.temperature)
    top_p = body.get("top_p")
    if top_p is not None:
        _need(_num(top_p) and 0 < top_p <= 1, "top_p", "a number in (0, 1]", top_p)
    opts["top_p"] = float(top_p if top_p is not None else defaults.top_p)
    top_k = body.get("top_k")
    if top_k is not None:
        _need(_int(top_k) and top_k >= -1, "top_k", "an integer >= 0 (0 or -1: off)", top_k)
    opts["top_k"] = max(top_k, 0) if top_k is not None else defaults.top_k
    seed = body.get("seed")
    if seed is not None:
        _need(_int(seed) and 0 <= seed < 2**63, "seed", "an integer in [0, 2^63)", seed)
        opts["seed"] = seed
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        ok = isinstance(stops, list) and len(stops) <= 16 and all(isinstance(s, str) and s for s in stops)
        _need(ok, "stop", "a non-empty string or a list of up to 16 of them", stop)
        opts["stop"] = tuple(stops)
    k = body.get("num_draft_tokens", "unset")
    if k == "unset":
        opts["num_draft_tokens"] = defaults.num_draft_tokens
    elif k == "auto" or k is None:
        opts["num_draft_tokens"] = None
    else:
        _need(_int(k) and 0 <= k <= 64, "num_draft_tokens", "'auto' or an integer in 0..64", k)
        opts["num_draft_tokens"] = k
    ignore_eos = body.get("ignore_eos", False)
    _need(isinstance(ignore_eos, bool), "ignore_eos", "true or false", ignore_eos)
    opts["ignore_eos"] = ignore_eos
    return GenerationOptions(**opts)


# ------------------------------------------------------------------ responses

FINISH = {"eos": "stop", "stop": "stop", "max_new_tokens": "length", "length": "length", "cancelled": "stop"}


def new_id(kind: str) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + secrets.token_hex(12)


def usage(prompt_tokens: int, completion_tokens: int, stats: dict | None = None) -> dict:
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if stats is not None and "cached_tokens" in stats:  # as OpenAI reports its prompt cache
        out["prompt_tokens_details"] = {"cached_tokens": stats["cached_tokens"]}
    if stats is not None and "replica" in stats:  # specrt's extension (on Ray Serve): which replica answered
        out["replica"] = stats["replica"]
    if stats is not None:  # specrt's extension: what speculation did for this request
        out["speculative"] = {
            "drafted_tokens": stats["drafted"],
            "accepted_tokens": stats["accepted"],
            "target_passes": stats["target_passes"],
            "acceptance_rate": stats["acceptance_rate"],
        }
    return out


def response(p: Parsed, rid: str, text: str, finish: str | None, use: dict) -> dict:
    created = int(time.time())
    reason = FINISH.get(finish or "stop", "stop")
    if p.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": p.model,
            "choices": [choice],
            "usage": use,
        }
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": p.model,
        "choices": [choice],
        "usage": use,
    }


def chunk(p: Parsed, rid: str, text: str | None, finish: str | None = None, first: bool = False) -> dict:
    """One server-sent event's data: a piece of text, or (finish given) the closing chunk."""
    created = int(time.time())
    reason = FINISH.get(finish, "stop") if finish is not None else None
    if p.kind == "completion":
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        return {"id": rid, "object": "text_completion", "created": created, "model": p.model, "choices": [choice]}
    delta = {} if finish is not None else {"content": text or ""}
    if first:
        delta = {"role": "assistant", **delta}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": p.model, "choices": [choice]}


def usage_chunk(p: Parsed, rid: str, use: dict) -> dict:
    obj = "text_completion" if p.kind == "completion" else "chat.completion.chunk"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": p.model, "choices": [], "usage": use}
