"""Client of any OpenAI-compatible chat server (vLLM's, llama.cpp's, hosted APIs).

Holds ``OpenAIBackend``. Standard library only (``urllib``): one POST to
``BASE_URL/chat/completions`` per conversation, sent concurrently, each with a timeout and
retries with exponential backoff on connection errors, timeouts, 429 and 5xx.

Log-probs are asked for (``logprobs: true``) and kept when the server returns them. Token ids
come back only from servers that can name them: with ``token_ids=True`` the request adds vLLM's
``return_tokens_as_token_ids`` (tokens then read ``token_id:123``) and ``return_token_ids``
(the prompt's ids); hosted APIs reject unknown fields, so it is off by default and such a
backend serves evaluation, not training.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from crl_envs.errors import UserFacingError
from crl_harness.models.base import LENGTH, STOP, Generation, Message

__all__ = ["OpenAIBackend", "OpenAIServerError"]

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIServerError(UserFacingError):
    """The server refused a request or could not be reached after every retry."""


class OpenAIBackend:
    """Chat completions over HTTP behind the ``ModelBackend`` protocol.

    ``base_url`` is the API root (``http://localhost:8000/v1``); ``api_key`` defaults to
    ``$OPENAI_API_KEY``. ``max_context`` is only used to budget the history (characters / 4
    estimate tokens, since the client has no tokenizer).
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout: float = 120.0, max_retries: int = 4, backoff: float = 0.5,
                 concurrency: int = 16, max_context: int = 8192, token_ids: bool = False) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}.")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.concurrency = concurrency
        self.max_context = max_context
        self.token_ids = token_ids
        self.name = f"openai:{self.base_url}#{model}"

    def count_tokens(self, messages: list[Message]) -> int:
        return sum(len(m["content"]) + 16 for m in messages) // 4

    def generate(self, prompts: list[list[Message]], *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, seed: int | None = None,
                 stop: Sequence[str] = ()) -> list[Generation]:
        def one(item: tuple[int, list[Message]]) -> Generation:
            index, messages = item
            body: dict[str, Any] = {
                "model": self.model, "messages": messages, "max_tokens": max_new_tokens,
                "temperature": temperature, "top_p": top_p, "logprobs": True,
            }
            if seed is not None:
                body["seed"] = seed + index
            if stop:  # the server leaves the matched stop string out of the text
                body["stop"] = list(stop)
            if self.token_ids:
                body["return_tokens_as_token_ids"] = True
                body["return_token_ids"] = True
            return self._parse(self._post("/chat/completions", body))

        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(one, enumerate(prompts)))

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError("An HTTP server's weights cannot be replaced from the client.")

    def close(self) -> None:
        """Nothing to free: every request opens and closes its own connection."""

    # ----------------------------------------------------------------- HTTP
    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(self.base_url + path, data=data, headers=headers,
                                             method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as err:
                detail = err.read().decode(errors="replace")[:500]
                if err.code not in _RETRY_STATUS:
                    raise OpenAIServerError(
                        f"{self.base_url}{path} answered {err.code}: {detail}") from err
                last = f"HTTP {err.code}: {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        raise OpenAIServerError(f"{self.base_url}{path} failed after {self.max_retries + 1} "
                                f"tries (last: {last}); is the server running?")

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
        return Generation(
            text=text,
            prompt_token_ids=list(response.get("prompt_token_ids") or []),
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=LENGTH if finish == "length" else STOP,
            meta={"usage": response.get("usage", {})},
        )
