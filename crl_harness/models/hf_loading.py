"""Loading a transformers model for the HF backend: where its files are, on which device, in
which dtype.

Holds:
- ``load_pretrained``: the tokenizer and model of a local folder, a ``.gguf`` file, a LoRA adapter
  folder (its base loaded, the adapter merged) or a hub id, with one clear error for each failure.
- ``resolve_device`` / ``resolve_dtype``: what ``device="auto"``, ``dtype="auto"`` and
  ``dtype="bfloat16-if-native"`` (``BF16_IF_NATIVE``) mean here.
- ``hub_reachable`` (``crl_envs.data``'s): whether the Hugging Face hub answers (else only its
  local cache is read).
- ``cpu_computes_bf16``: whether this CPU multiplies bfloat16 natively.
- ``import_torch_transformers``: both libraries, or one error that says how to install them.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from crl_envs.data import hub_reachable
from crl_harness.models.base import BackendUnavailableError, ModelLoadError, ModelNotFoundError
from crl_harness.models.model_folder import adapter_base, check_model_folder, is_adapter_folder

__all__ = [
    "load_pretrained",
    "resolve_device",
    "resolve_dtype",
    "BF16_IF_NATIVE",
    "hub_reachable",
    "cpu_computes_bf16",
    "import_torch_transformers",
]


def import_torch_transformers():
    """``(torch, transformers)``, or ``BackendUnavailableError`` saying how to install them."""
    try:
        import torch
        import transformers
    except ImportError as err:  # pragma: no cover - depends on the install
        raise BackendUnavailableError(
            "The hf backend needs torch and transformers: pip install 'crl-gym[train]'."
        ) from err
    return torch, transformers


def resolve_device(torch: Any, device: str) -> str:
    """``auto``: CUDA where torch sees a device, else the CPU. A CUDA device asked for where none
    is gets one clear error here, instead of torch's from deep inside the first ``.to``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        why = ("this torch is a CPU-only build" if torch.version.cuda is None
               else f"this torch (CUDA {torch.version.cuda}) finds no usable GPU or driver")
        raise BackendUnavailableError(
            f"device={device!r} was asked for, but {why}. Install the CUDA build of torch (README, "
            "'On a GPU machine'), check nvidia-smi and CUDA_VISIBLE_DEVICES, or pass "
            "device='cpu' (or 'auto', which picks the CPU here).")
    return device


BF16_IF_NATIVE = "bfloat16-if-native"
"""the dtype setting for bfloat16 where the device computes it natively (CUDA; a CPU with
AVX512-BF16 or AMX), float32 elsewhere: an emulated bf16 runs a forward pass 6x slower than
float32 on an AMD EPYC with AVX2 only, 4x on an Intel Xeon with AVX-512 but no AVX512-BF16"""


def resolve_dtype(dtype: str, device: str) -> str:
    """The weights' dtype name: ``auto`` is bfloat16 on CUDA and float32 elsewhere;
    ``bfloat16-if-native`` is bfloat16 on CUDA and on a CPU that computes it natively, float32
    elsewhere (``cpu_computes_bf16``).

    >>> resolve_dtype("auto", "cuda:0"), resolve_dtype("auto", "cpu"), resolve_dtype("float16", "cpu")
    ('bfloat16', 'float32', 'float16')
    >>> resolve_dtype(BF16_IF_NATIVE, "cuda:0")
    'bfloat16'
    """
    if dtype == BF16_IF_NATIVE:
        return "bfloat16" if device.startswith("cuda") or cpu_computes_bf16() else "float32"
    if dtype == "bfloat16" and device == "cpu" and not cpu_computes_bf16():
        warnings.warn("bfloat16 on this CPU is emulated (no AVX512-BF16 or AMX): slower than "
                      "float32 (a forward pass 4-6x as long); set the model's dtype to float32 "
                      f"or {BF16_IF_NATIVE} (actor.dtype, extractor.dtype, --dtype).",
                      stacklevel=2)
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def cpu_computes_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX-BF16, from Linux's
    ``/proc/cpuinfo``), where a bf16 model runs about twice as fast as fp32; without them torch
    emulates bf16, slower than fp32. False where the flags cannot be read."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def load_pretrained(path: str | os.PathLike, *, gguf_file: str | None, dtype: str,
                    attn_implementation: str) -> tuple[Any, Any, str]:
    """``(tokenizer, model, name)`` of ``path``, the model in ``dtype`` (a resolved name, e.g.
    ``"float32"``) on the CPU; ``name`` is the backend's ``hf:...`` name.

    ``path`` is a local model folder, a ``.gguf`` file (or the folder of ``gguf_file``), a LoRA
    adapter folder (its base model is loaded and the adapter merged) or a hub id (read from the
    local cache only where the hub cannot be reached). A missing model raises
    ``ModelNotFoundError``, damaged files ``ModelLoadError``, each in one line.
    """
    torch, transformers = import_torch_transformers()
    path = str(path)
    local = Path(path).expanduser()
    if local.suffix == ".gguf" and gguf_file is None:
        path, gguf_file = str(local.parent), local.name
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    adapter = local if is_adapter_folder(local) else None
    if adapter is not None:  # LoRA adapters (e.g. a warm start): load their base, then merge
        from crl_harness.models.names import resolve_model_path

        path = resolve_model_path(adapter_base(adapter))
    if not gguf_file and Path(path).expanduser().is_dir():
        check_model_folder(Path(path).expanduser())
    elif not Path(path).expanduser().exists() and not hub_reachable():
        # a hub id on a machine without the hub: its cache only, at once (transformers would
        # retry the hub for about a minute before saying the same)
        extra["local_files_only"] = True
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, **extra)
        # An adapter is merged into an fp32 base and only then cast: merged in bf16, each
        # weight would be rounded after adding its update, which is not the trained function.
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32 if adapter is not None else getattr(torch, dtype),
            attn_implementation=attn_implementation, **extra
        )
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
            # The parameters alone, as from_pretrained(dtype=...) loads them: buffers such as the
            # rotary frequencies stay fp32 (in bf16 they would turn positions' angles by up to
            # radians at 900 tokens, a function that no one trained).
            for param in model.parameters():
                param.data = param.data.to(getattr(torch, dtype))
            # peft froze the base for inference; a merged model is a plain model again, which
            # the trainer may fine-tune in full
            model.requires_grad_(True)
    except OSError as err:
        reason = " ".join(str(err).split()).rstrip(".")  # one line
        raise ModelNotFoundError(
            f"Could not load a transformers model from {path!r}: {reason}. Pass a local model "
            "directory, a .gguf file, a Hugging Face id reachable from this machine, or a "
            "short name such as 'smollm2-135m' (see crl_harness.models.names)."
        ) from err
    except Exception as err:  # noqa: BLE001 - a damaged file fails in many library types
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        summary = " ".join(lines[:2])[:300].rstrip(".")
        raise ModelLoadError(
            f"Could not load {adapter or path}: {type(err).__name__}: {summary}. Its files "
            "are damaged or do not fit together (a truncated copy, adapters of another base "
            "model); write or copy it again."
        ) from err
    name = f"hf:{adapter or path}" + (f"#{gguf_file}" if gguf_file else "")
    return tokenizer, model, name
