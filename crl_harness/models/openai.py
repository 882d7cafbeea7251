"""Client of any OpenAI-compatible chat server (vLLM's, llama.cpp's, ``transformers serve``,
hosted APIs), on the official ``openai`` client package (the ``openai`` extra).

Holds ``OpenAIBackend``, ``OpenAIServerError`` and ``check_base_url``. One chat completion per
conversation, sent concurrently; the client retries connection errors, timeouts, 408, 409, 429 and
5xx with exponential backoff.

- Tokens: each reply's length is the server's own count (``usage.completion_tokens``, kept in
  ``Generation.usage_tokens``), and the prompt counts (``usage.prompt_tokens``) calibrate
  ``count_tokens``: tokens per character of what was sent, the largest seen (before the first
  answer, 2 characters a token, as MiniHack's maps run; English prose runs about 4).
- Context: ``max_context`` as given (``crl eval --max-context``), else the server's model info
  (``GET /models``: vLLM's ``max_model_len``, llama.cpp's ``n_ctx``, ``context_length``), else
  8192; ``context_source`` says which.
- Errors: a request the server refuses for that conversation (400, e.g. a prompt over the context;
  413, 422), or that times out or still fails after the retries (429, 5xx), becomes that
  Generation's ``error``: the rollout ends that episode with it and the others go on. A server that
  cannot be reached, a wrong path (404) or a refused key (401, 403) raise ``OpenAIServerError``:
  then nothing can be evaluated.

Log-probs are asked for (``logprobs: true``) and kept when the server returns them. Token ids
come back only from servers that can name them: with ``token_ids=True`` the request adds vLLM's
``return_tokens_as_token_ids`` (tokens then read ``token_id:123``) and ``return_token_ids``
(the prompt's ids); hosted APIs reject unknown fields, so it is off by default and such a
backend serves evaluation, not training.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from crl_envs.errors import UserFacingError
from crl_harness.models.base import LENGTH, STOP, BackendUnavailableError, Generation, Message

__all__ = ["OpenAIBackend", "OpenAIServerError", "check_base_url", "DEFAULT_CONTEXT"]

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


class OpenAIServerError(UserFacingError):
    """The server cannot serve this evaluation: unreachable, a wrong path or model, a refused
    key, or not a chat completion server."""


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


def _client_class() -> Any:
    try:
        from openai import OpenAI
    except ImportError as err:
        raise BackendUnavailableError(
            "The openai backend needs the openai client: pip install 'crl-gym[openai]'.") from err
    return OpenAI


class OpenAIBackend:
    """Chat completions over HTTP behind the ``ModelBackend`` protocol.

    ``base_url`` is the API root (``http://localhost:8000/v1``); ``api_key`` defaults to
    ``$OPENAI_API_KEY`` (a placeholder where unset: local servers want none). ``max_context``:
    the context in tokens (None: the server's model info, else ``DEFAULT_CONTEXT``).
    ``timeout`` is per request in seconds, ``max_retries`` the client's retries of one.
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
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.client = _client_class()(base_url=self.base_url, api_key=key or "none",
                                      timeout=timeout, max_retries=max_retries)
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
        import openai

        try:
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=max_new_tokens,  # type: ignore[arg-type]
                temperature=temperature, top_p=top_p, **options)
        except openai.APIConnectionError as err:
            if isinstance(err, openai.APITimeoutError):
                return _failed(f"the server did not answer within {self.client.timeout} s "
                               f"({self.client.max_retries + 1} tries)")
            raise OpenAIServerError(f"{self.base_url} cannot be reached ({err}); is the server "
                                    "running?") from err
        except openai.APIStatusError as err:
            detail = _detail(err)
            if err.status_code in _FATAL_STATUS:
                raise OpenAIServerError(f"{self.base_url}/chat/completions answered "
                                        f"{err.status_code}: {detail}") from err
            return _failed(f"HTTP {err.status_code}: {detail}")
        data = response.model_dump()
        self._calibrate(messages, data.get("usage") or {})
        return self._parse(data)

    def _calibrate(self, messages: list[Message], usage: dict[str, Any]) -> None:
        prompt_tokens = usage.get("prompt_tokens") or 0
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
            models = self.client.with_options(timeout=10, max_retries=0).models.list()
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

    def _parse(self, response: dict[str, Any]) -> Generation:
        try:
            choice = response["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError) as err:
            raise OpenAIServerError(f"Not a chat completion response: {str(response)[:300]}") from err
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(item["logprob"]) for item in content]
        token_ids = [int(item["token"].removeprefix("token_id:")) for item in content
                     if item.get("token", "").startswith("token_id:")]
        if len(token_ids) != len(content):
            token_ids = list(choice.get("token_ids") or [])
        finish = choice.get("finish_reason") or STOP
        usage = response.get("usage") or {}
        return Generation(
            text=text,
            prompt_token_ids=list(response.get("prompt_token_ids") or []),
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=LENGTH if finish == "length" else STOP,
            meta={"usage": usage},
            usage_tokens=int(usage.get("completion_tokens") or len(token_ids) or len(logprobs)),
        )


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
