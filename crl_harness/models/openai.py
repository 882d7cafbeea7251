"""Client of any OpenAI-compatible chat server (vLLM's, llama.cpp's, ``transformers serve``,
hosted APIs), on the official ``openai`` client package (the ``openai`` extra).

Holds ``OpenAIBackend``, ``OpenAIServerError``, ``check_base_url`` and ``reply_byte_limit``. One
chat completion per conversation, sent concurrently; connection errors, 408, 409, 429 and 5xx are
retried with exponential backoff.

- Time: ``timeout`` bounds a request whole, its retries and their backoff included, whatever the
  server sends (``http_deadline``: a server that trickles its reply a byte at a time cannot
  extend it).
- Size: a reply is read up to ``reply_byte_limit`` (64 KiB, plus 2 KiB per token asked for, plus
  16 bytes per token of context for vLLM's prompt ids); of it, at most ``max_new_tokens``
  log-probs, token ids and counted tokens are kept, and 64 characters of text per token, the
  rest cut as a reply that reached its length.

- Tokens: each reply's length is the server's own count (``usage.completion_tokens``, kept in
  ``Generation.usage_tokens``), and the prompt counts (``usage.prompt_tokens``) calibrate
  ``count_tokens``: tokens per character of what was sent, the largest seen (before the first
  answer, 2 characters a token, as MiniHack's maps run; English prose runs about 4).
- Context: ``max_context`` as given (``crl eval --max-context``), else the server's model info
  (``GET /models``: vLLM's ``max_model_len``, llama.cpp's ``n_ctx``, ``context_length``), else
  8192; ``context_source`` says which.
- Errors: a request the server refuses for that conversation (400, e.g. a prompt over the context;
  413, 422), that times out or still fails after the retries (429, 5xx), or whose 200 reply is no
  chat completion (not JSON, no choices, a field of the wrong type, over the size limit) becomes
  that Generation's ``error``: the rollout ends that episode with it and the others go on. A
  server that cannot be reached, a wrong path (404) or a refused key (401, 403) raise
  ``OpenAIServerError``: then nothing can be evaluated.

Log-probs are asked for (``logprobs: true``) and kept when the server returns them. Token ids
come back only from servers that can name them: with ``token_ids=True`` the request adds vLLM's
``return_tokens_as_token_ids`` (tokens then read ``token_id:123``) and ``return_token_ids``
(the prompt's ids); hosted APIs reject unknown fields, so it is off by default and such a
backend serves evaluation, not training.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from crl_envs.errors import UserFacingError
from crl_harness.models.base import LENGTH, STOP, BackendUnavailableError, Generation, Message
from crl_harness.models.http_deadline import Deadline, bound_by_deadline

__all__ = ["OpenAIBackend", "OpenAIServerError", "check_base_url", "reply_byte_limit",
           "DEFAULT_CONTEXT"]

DEFAULT_CONTEXT = 8192
"""the context budget when neither ``max_context`` nor the server's model info gives one"""
_FIRST_TOKENS_PER_CHAR = 0.5
"""``count_tokens`` before the server has counted a prompt: 2 characters a token"""
_MESSAGE_TOKENS = 8
"""a message's chat-template tokens (role, start and end markers), counted on top of its text"""
_CONTEXT_KEYS = ("max_model_len", "context_length", "context_window", "max_context_length",
                 "n_ctx", "n_ctx_train")
"""where servers put a model's context in ``GET /models`` (vLLM, hosted APIs, llama.cpp's
``meta``)"""
_FATAL_STATUS = {401, 403, 404}
"""a wrong key, path or model: every request would fail the same way"""
_RETRIED_STATUS = {408, 409, 429}
"""statuses worth another try (and every 5xx): the server is busy or briefly broken"""
_MAX_BACKOFF = 8.0
"""the longest wait between two tries, in seconds (0.5, 1, 2, 4, 8, 8, ...)"""
_MODEL_INFO_SECONDS = 10.0
"""how long ``GET /models`` may take: no model info is no error"""
_MAX_CHARS_PER_TOKEN = 64
"""text kept per token asked for: no tokenizer's tokens come near it on average"""


def reply_byte_limit(max_new_tokens: int, max_context: int) -> int:
    """The most bytes of a reply body read for a request of ``max_new_tokens``: 64 KiB, 2 KiB
    a token asked for (the token's text and its log-prob entry in JSON), 16 bytes a token of
    context (vLLM's prompt token ids).

    >>> reply_byte_limit(16, 8192)
    229376
    """
    return 65_536 + 2048 * max_new_tokens + 16 * max_context


class _Malformed(ValueError):
    """A 200 reply that is no chat completion; the message says what is wrong."""


class OpenAIServerError(UserFacingError):
    """The server cannot serve this evaluation: unreachable, a wrong path or model, or a
    refused key."""


def check_base_url(base_url: str) -> None:
    """Raise ``UserFacingError`` (one line, with the fix) unless ``base_url`` has a scheme.

    >>> check_base_url("http://localhost:8000/v1")
    >>> check_base_url("localhost:8000")
    Traceback (most recent call last):
    ...
    crl_envs.errors.UserFacingError: openai: 'localhost:8000' is not a URL; write its scheme and API root, e.g. openai:http://localhost:8000/v1#MODEL.
    """
    if not base_url.startswith(("http://", "https://")):
        example = base_url.split("/")[0] if base_url.strip() else "localhost:8000"
        raise UserFacingError(f"openai: {base_url[:80]!r} is not a URL; write its scheme and API "
                              f"root, e.g. openai:http://{example}/v1#MODEL.")


def _openai() -> Any:
    try:
        import openai
    except ImportError as err:
        raise BackendUnavailableError(
            "The openai backend needs the openai client: pip install 'crl-gym[openai]'.") from err
    return openai


class OpenAIBackend:
    """Chat completions over HTTP behind the ``ModelBackend`` protocol.

    ``base_url`` is the API root (``http://localhost:8000/v1``); ``api_key`` defaults to
    ``$OPENAI_API_KEY`` (a placeholder where unset: local servers want none). ``max_context``:
    the context in tokens (None: the server's model info, else ``DEFAULT_CONTEXT``).
    ``timeout`` bounds one request in seconds, its ``max_retries`` retries and their backoff
    included, however the server answers.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout: float = 120.0, max_retries: int = 2, concurrency: int = 16,
                 max_context: int | None = None, token_ids: bool = False) -> None:
        check_base_url(base_url)
        if max_context is not None and max_context < 1:
            raise UserFacingError(f"max_context must be a positive number of tokens, got "
                                  f"{max_context}.")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.concurrency = concurrency
        self.token_ids = token_ids
        self.name = f"openai:{self.base_url}#{model}"
        self.timeout, self.max_retries = float(timeout), max_retries
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        openai = _openai()
        http_client = openai.DefaultHttpxClient(timeout=timeout)
        self._deadline = Deadline()
        bound_by_deadline(http_client, self._deadline)
        # Retries are this class's (_complete): the client's own would sleep past the deadline.
        self.client = openai.OpenAI(base_url=self.base_url, api_key=key or "none",
                                    timeout=timeout, max_retries=0, http_client=http_client)
        self._tokens_per_char: float | None = None  # the largest the server has counted
        self._lock = threading.Lock()
        if max_context is not None:
            self.max_context, self.context_source = int(max_context), "--max-context"
        else:
            served = self._served_context()
            self.max_context = served or DEFAULT_CONTEXT
            self.context_source = ("the server's model info" if served else
                                   "a default: the server names none; set --max-context")

    # ----------------------------------------------------------------- ModelBackend
    def count_tokens(self, messages: list[Message]) -> int:
        """The prompt's tokens as this server counts them (calibrated by its ``usage``)."""
        per_char = self._tokens_per_char or _FIRST_TOKENS_PER_CHAR
        chars = sum(len(m["content"]) for m in messages)
        return math.ceil(chars * per_char) + _MESSAGE_TOKENS * len(messages)

    def generate(self, prompts: list[list[Message]], *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, seed: int | None = None,
                 stop: Sequence[str] = ()) -> list[Generation]:
        """One reply per prompt; a prompt the server could not answer gets a Generation with
        ``error`` set (see the module's docstring), the others their replies."""
        def one(item: tuple[int, list[Message]]) -> Generation:
            index, messages = item
            options: dict[str, Any] = {"logprobs": True}
            if seed is not None:
                options["seed"] = seed + index
            if stop:  # the server leaves the matched stop string out of the text
                options["stop"] = list(stop)
            if self.token_ids:
                options["extra_body"] = {"return_tokens_as_token_ids": True,
                                         "return_token_ids": True}
            return self._complete(messages, max_new_tokens, temperature, top_p, options)

        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(one, enumerate(prompts)))

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError("An HTTP server's weights cannot be replaced from the client.")

    def close(self) -> None:
        """Close the client's connection pool."""
        self.client.close()

    # ----------------------------------------------------------------- HTTP
    def _complete(self, messages: list[Message], max_new_tokens: int, temperature: float,
                  top_p: float, options: dict[str, Any]) -> Generation:
        """One chat completion, tried until it is answered, refused for good or out of time."""
        import openai

        deadline = time.monotonic() + self.timeout
        tries = 0
        while True:
            tries += 1
            with self._deadline.until(deadline):
                try:
                    return self._request(messages, max_new_tokens, temperature, top_p, options,
                                         deadline)
                except openai.APITimeoutError:  # the deadline, or one read as long as it
                    return self._out_of_time(tries)
                except openai.APIConnectionError as err:
                    unreachable, failure = err, None
                except openai.APIStatusError as err:
                    detail = _detail(err)
                    if err.status_code in _FATAL_STATUS:
                        raise OpenAIServerError(f"{self.base_url}/chat/completions answered "
                                                f"{err.status_code}: {detail}") from err
                    failure = f"HTTP {err.status_code}: {detail}"
                    if err.status_code not in _RETRIED_STATUS and err.status_code < 500:
                        return _failed(failure)
                    unreachable = None
            backoff = min(0.5 * 2 ** (tries - 1), _MAX_BACKOFF)
            if tries > self.max_retries or time.monotonic() + backoff >= deadline:
                break
            time.sleep(backoff)
        if unreachable is not None:
            raise OpenAIServerError(f"{self.base_url} cannot be reached ({unreachable}); is the "
                                    "server running?") from unreachable
        return _failed(f"{failure} ({tries} tries)")

    def _out_of_time(self, tries: int) -> Generation:
        return _failed(f"the server did not answer within {self.timeout:g} s"
                       + (f" ({tries} tries)" if tries > 1 else ""))

    def _request(self, messages: list[Message], max_new_tokens: int, temperature: float,
                 top_p: float, options: dict[str, Any], deadline: float) -> Generation:
        """One try: the reply read up to ``reply_byte_limit`` and parsed."""
        limit = reply_byte_limit(max_new_tokens, self.max_context)
        with self.client.chat.completions.with_streaming_response.create(
                model=self.model, messages=messages, max_tokens=max_new_tokens,  # type: ignore[arg-type]
                temperature=temperature, top_p=top_p, **options) as response:
            body = bytearray()
            try:
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        return _failed(f"the reply is over {limit} bytes, too long for "
                                       f"max_new_tokens={max_new_tokens}")
            except Exception as err:  # noqa: BLE001 - any failure to read this reply is its own
                if time.monotonic() >= deadline:
                    return self._out_of_time(1)
                return _failed(f"the reply broke off ({type(err).__name__}: "
                               f"{' '.join(str(err).split())[:200]})")
        try:
            data = _chat_completion(bytes(body))
            generation = _generation(data, max_new_tokens, self.max_context)
        except _Malformed as err:
            return _failed(f"the reply is no chat completion ({err})")
        self._calibrate(messages, data.get("usage") or {})
        return generation

    def _calibrate(self, messages: list[Message], usage: dict[str, Any]) -> None:
        prompt_tokens = usage.get("prompt_tokens") or 0  # checked by _generation
        chars = sum(len(m["content"]) for m in messages)
        if prompt_tokens <= 0 or chars <= 0:
            return
        per_char = max(prompt_tokens - _MESSAGE_TOKENS * len(messages), 1) / chars
        with self._lock:
            if self._tokens_per_char is None or per_char > self._tokens_per_char:
                self._tokens_per_char = per_char

    def _served_context(self) -> int | None:
        """The model's context from ``GET /models``, where the server names it."""
        try:
            with self._deadline.until(time.monotonic() + _MODEL_INFO_SECONDS):
                models = self.client.with_options(timeout=_MODEL_INFO_SECONDS).models.list()
                entries = [m.model_dump() for m in models.data]
        except Exception:  # noqa: BLE001 - no model info (or no server yet): generate says why
            return None
        entry = next((e for e in entries if e.get("id") == self.model), None)
        if entry is None and len(entries) == 1:
            entry = entries[0]
        if entry is None:
            return None
        for where in (entry, entry.get("meta") or {}):
            for key in _CONTEXT_KEYS:
                value = where.get(key)
                if isinstance(value, int) and value > 0:
                    return value
        return None


def _chat_completion(body: bytes) -> dict[str, Any]:
    """The JSON object of a reply body, or ``_Malformed``."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as err:  # not JSON (an HTML page), not UTF-8, too deep
        shown = " ".join(body[:80].decode("utf-8", "replace").split())
        raise _Malformed(f"not JSON: {shown!r}") from err
    if not isinstance(data, dict):
        raise _Malformed(f"a JSON {type(data).__name__}, not an object")
    return data


def _generation(data: dict[str, Any], max_new_tokens: int, max_context: int) -> Generation:
    """The ``Generation`` of a chat completion, every field checked (``_Malformed`` names the
    first that is wrong) and cut to what the request asked for."""
    choices = _field(data, "choices", list, [])
    if not choices:
        raise _Malformed("no choices")
    choice = _checked(choices[0], "choices[0]", dict)
    message = _checked(choice.get("message"), "message", dict)
    text = _field(message, "content", str, "")
    content = _field(_field(choice, "logprobs", dict, {}), "content", list, [])
    entries = [_checked(item, "a logprobs entry", dict) for item in content[:max_new_tokens]]
    logprobs = [float(_field(item, "logprob", float, None, required=True)) for item in entries]
    tokens = [_field(item, "token", str, None, required=True) for item in entries]
    token_ids = [int(token.removeprefix("token_id:")) for token in tokens
                 if token.startswith("token_id:") and token[9:].isascii()
                 and token[9:].isdigit()]
    if len(token_ids) != len(tokens):
        token_ids = _ids(choice, "token_ids", max_new_tokens)
    usage = _field(data, "usage", dict, {})
    counted = _field(usage, "completion_tokens", int, 0)
    _field(usage, "prompt_tokens", int, 0)  # read by _calibrate
    finish = _field(choice, "finish_reason", str, STOP)
    cut = (len(text) > max_new_tokens * _MAX_CHARS_PER_TOKEN or len(content) > max_new_tokens
           or counted > max_new_tokens)
    return Generation(
        text=text[:max_new_tokens * _MAX_CHARS_PER_TOKEN],
        prompt_token_ids=_ids(data, "prompt_token_ids", max_context),
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=LENGTH if finish == "length" or cut else STOP,
        meta={"usage": usage},
        usage_tokens=min(counted or len(token_ids) or len(logprobs), max_new_tokens),
    )


_KINDS = {dict: "an object", list: "a list", str: "a string", float: "a number",
          int: "a whole number >= 0"}


def _checked(value: Any, name: str, kind: type) -> Any:
    """``value`` if it is of ``kind`` (a bool is no number here), else ``_Malformed``."""
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise _Malformed(f"{name} is {json.dumps(value)[:40]}, not {_KINDS[kind]}")
    return value


def _field(container: dict[str, Any], key: str, kind: type, default: Any,
           required: bool = False) -> Any:
    """``container[key]`` checked to be of ``kind``; ``default`` where it is absent or null
    (unless ``required``)."""
    value = container.get(key)
    if value is None and not required:
        return default
    return _checked(value, key, kind)


def _ids(container: dict[str, Any], key: str, most: int) -> list[int]:
    """The token ids under ``key`` (none where absent), at most ``most`` of them."""
    return [_checked(item, f"an id of {key}", int) for item in _field(container, key, list, [])[:most]]


def _failed(why: str) -> Generation:
    return Generation(text="", prompt_token_ids=[], token_ids=[], logprobs=[], finish_reason=STOP,
                      error=f"openai: {why}")


def _detail(err: Any) -> str:
    """The server's own words for an HTTP error, on one line."""
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        body = body.get("message") or body.get("error") or body
        if isinstance(body, dict):
            body = body.get("message") or body
    text = str(body if body is not None else err.message)
    return " ".join(text.split())[:300]
