"""What a local model folder must hold, checked before transformers reads it.

Holds ``check_model_folder`` (a transformers model: config, weights, tokenizer) and
``adapter_base`` (a LoRA adapter folder: its config names the base model, its weights are
there). transformers' own errors for such folders name neither the folder nor the missing file
(an empty folder says "You need to have sentencepiece or tiktoken installed"); these raise one
``ModelLoadError`` line that does.
"""

from __future__ import annotations

import json
from pathlib import Path

from crl_harness.models.base import ModelLoadError
from crl_harness.models.names import embedded_name

__all__ = ["check_model_folder", "adapter_base", "is_adapter_folder"]

_MODEL_FILES = {
    "config.json": ("config.json",),
    "weights (model.safetensors)": ("model.safetensors", "model.safetensors.index.json",
                                    "pytorch_model.bin", "pytorch_model.bin.index.json"),
    "tokenizer files (tokenizer.json)": ("tokenizer.json", "tokenizer.model", "vocab.json",
                                         "vocab.txt"),
}
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def is_adapter_folder(folder: Path) -> bool:
    """A folder of LoRA adapters (peft's ``adapter_config.json``)."""
    return (folder / "adapter_config.json").is_file()


def check_model_folder(folder: Path) -> None:
    """Raise ``ModelLoadError`` unless ``folder`` holds a model's config, weights and tokenizer
    (a folder that holds one in a subfolder, as a checkpoint holds ``actor_hf``, is named)."""
    missing = [what for what, names in _MODEL_FILES.items()
               if not any((folder / name).is_file() for name in names)]
    if not missing:
        return
    inside = sorted(p.parent for p in folder.glob("*/config.json"))
    hint = f"; its subfolder {inside[0].name} holds one: use {inside[0]}" if inside else \
        "; give a transformers model folder (save_pretrained) or LoRA adapters"
    raise ModelLoadError(f"{folder} is not a model folder: it has no {', no '.join(missing)}"
                         f"{hint}.")


def adapter_base(folder: Path) -> str:
    """The base model that the adapters in ``folder`` were trained on (``base_model_name_or_path``
    of ``adapter_config.json``), after checking that the adapter weights are there. An embedded
    model's upstream id, which the adapters crl writes name, gives its short name: crl loads them
    onto its local copy, offline (``names.embedded_name``)."""
    config_file = folder / "adapter_config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{config_file} is damaged ({err}); write the adapters again "
                             "(crl warmstart) or restore the file.") from err
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base.strip():
        raise ModelLoadError(f"{config_file} names no base model (a JSON object with "
                             "base_model_name_or_path); write the adapters again (crl warmstart).")
    if not any((folder / name).is_file() for name in _ADAPTER_WEIGHTS):
        raise ModelLoadError(f"{folder} has adapter_config.json but no adapter weights "
                             "(adapter_model.safetensors): half written; write the adapters again "
                             "(crl warmstart).")
    return embedded_name(base)
