"""``load_backend``: a backend from an ``hf:`` / ``vllm:`` / ``openai:`` agent spec.

Holds ``load_backend``. Short model names resolve through ``crl_harness.models.names``.
"""

from __future__ import annotations

from typing import Any

from crl_harness.models.base import ModelBackend
from crl_harness.models.names import resolve_model_path

__all__ = ["load_backend"]


def load_backend(spec: str, **options: Any) -> ModelBackend:
    """Build a backend from an agent spec.

    ``hf:NAME_OR_PATH`` (short name, local directory, ``.gguf`` file or hub id),
    ``vllm:NAME_OR_PATH`` and ``openai:BASE_URL#MODEL``; ``options`` go to the backend's
    constructor (e.g. ``device``, ``dtype``, ``max_batch_size``, ``timeout``). ``dtype`` is
    dropped for ``openai:``, whose server decides it.
    """
    kind, _, target = spec.partition(":")
    if kind == "openai":
        options.pop("dtype", None)
    if not target:
        raise ValueError(
            f"Bad model spec {spec!r}: use hf:NAME_OR_PATH, vllm:NAME_OR_PATH or "
            "openai:BASE_URL#MODEL (e.g. hf:smollm2-135m)."
        )
    if kind == "hf":
        from crl_harness.models.hf import HFBackend

        return HFBackend(resolve_model_path(target), **options)
    if kind == "vllm":
        from crl_harness.models.vllm import VLLMBackend

        return VLLMBackend(resolve_model_path(target), **options)
    if kind == "openai":
        from crl_harness.models.openai import OpenAIBackend

        base_url, _, model = target.partition("#")
        if not model:
            raise ValueError(f"Bad model spec {spec!r}: openai needs BASE_URL#MODEL.")
        return OpenAIBackend(base_url, model, **options)
    raise ValueError(f"Unknown backend {kind!r} in {spec!r}; use hf:, vllm: or openai:.")
