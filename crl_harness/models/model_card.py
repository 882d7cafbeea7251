"""The model card (``README.md``) of the LoRA adapters crl writes: their base, what they were
trained on, with which command, their figures, and how plain PEFT loads them.

Holds ``write_adapter_card``; peft's ``save_pretrained`` writes an empty template there, which
this replaces.
"""

from __future__ import annotations

import json
from pathlib import Path

from crl_harness.models.names import MODELS, embedded_name

__all__ = ["write_adapter_card"]


def _is_hub_id(base: str) -> bool:
    """Whether ``base`` reads as a Hugging Face id (``owner/name``), not a local path."""
    return base.count("/") == 1 and not base.startswith((".", "~", "/", "assets/"))


def write_adapter_card(directory: Path, *, trained_on: str, command: str,
                       results: str = "") -> Path:
    """Write ``directory/README.md`` for the adapters there (their ``adapter_config.json`` gives
    the base and the LoRA shape): ``trained_on`` and ``results`` are Markdown sentences,
    ``command`` the command that made them. Returns the card's path."""
    config = json.loads((directory / "adapter_config.json").read_text(encoding="utf-8"))
    base = config["base_model_name_or_path"]
    header = ["---"]
    if _is_hub_id(base):  # a local path in base_model would be the training machine's folder
        header += [f"base_model: {base}"]
    header += ["library_name: peft", "pipeline_tag: text-generation", "tags:"]
    if _is_hub_id(base):
        header += [f"- base_model:adapter:{base}"]
    header += ["- lora", "- transformers", "- crl-gym", "---", ""]
    layers = config.get("layers_to_transform")
    shape = (f"rank {config.get('r')}, alpha {config.get('lora_alpha')}, on "
             f"{', '.join(sorted(config.get('target_modules') or []))}"
             + (f" of layers {min(layers)}-{max(layers)}" if layers else " of every layer"))
    lines = [f"# LoRA adapters on {base}, made with crl-gym", "",
             f"- Trained on: {trained_on}",
             f"- Made with: `{command}`",
             f"- Adapters: {shape} (`adapter_model.safetensors`).",
             f"- Results: {results or 'none measured with these adapters.'}", ""]
    short = embedded_name(base)
    if short in MODELS:
        lines += [f"crl-gym trained them on its embedded copy of {base}: the "
                  f"`{MODELS[short].gguf_file}` file of the `{MODELS[short].pip_name}` package, "
                  "dequantised to fp32 (`crl data where` prints where it lives). crl-gym loads "
                  "them onto that copy, offline; other tools load the hub's weights, which differ "
                  "from it by that quantisation.", ""]
    lines += ["## Loading", "", "```python", "from peft import PeftModel",
              "from transformers import AutoModelForCausalLM", "",
              f'base = AutoModelForCausalLM.from_pretrained("{base}")',
              'model = PeftModel.from_pretrained(base, "PATH/TO/THIS/FOLDER")', "```", "",
              "In crl-gym: `crl eval --agent hf:PATH/TO/THIS/FOLDER --envs ENV_ID`, or "
              "`lora.init_from` of a training config to continue them.", ""]
    card = directory / "README.md"
    card.write_text("\n".join(header + lines), encoding="utf-8")
    return card
