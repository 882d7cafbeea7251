"""Quiet output: third-party progress bars a user cannot act on, switched off at their source.

Holds ``quiet_third_party``, which the ``crl`` commands that load models (``demo``, ``train``,
``eval``, ``warmstart``) call unless ``--verbose``, and ``VERBOSE_COMMANDS``, the commands that take that flag.
What it silences: transformers' "Loading weights" and "Writing model shards" bars (one at every
model load and save), huggingface_hub's download bars and vLLM's info and warning lines (a
screenful at every engine start). Each phase keeps one display of our
own (the training steps' bar, the episodes' bar); the one-time GGUF conversion of a packaged
model keeps its own bar, its phase's only one. vLLM's loader bar ("Loading safetensors
checkpoint shards") follows the same switch (``VLLMBackend``), its deprecation warnings (torch
names it renamed) are filtered by module, and torch's C++ warnings (vLLM's CPU worker: "NUMA
binding: Using MEMBIND policy") are raised to errors before torch is imported (``$TORCH_CPP_LOG_LEVEL``;
a value the user set wins). peft's hub lookup at an adapter save ("Unable to
fetch remote file", "Could not find a config file") is not made at all
(``PolicyLearner.save_adapter``).
"""

from __future__ import annotations

import os
import sys

__all__ = ["quiet_third_party", "VERBOSE_COMMANDS", "HUB_BARS_VARIABLE", "VLLM_LEVEL_VARIABLE",
           "TORCH_CPP_LEVEL_VARIABLE"]

VERBOSE_COMMANDS = ("demo", "train", "eval", "warmstart")
"""the ``crl`` commands that are quiet unless ``--verbose``"""

HUB_BARS_VARIABLE = "HF_HUB_DISABLE_PROGRESS_BARS"
"""huggingface_hub's switch, which transformers' bars follow too; a value the user set wins"""


TORCH_CPP_LEVEL_VARIABLE = "TORCH_CPP_LOG_LEVEL"
"""torch's C++ log level, read once when torch loads; a value the user set wins"""

VLLM_LEVEL_VARIABLE = "VLLM_LOGGING_LEVEL"
"""vLLM's log level (its own default INFO: a screenful at every engine start); a value the user
set wins"""


def quiet_third_party() -> None:
    """Switch off transformers' and huggingface_hub's progress bars and vLLM's log lines below
    errors, in this process and the ones it starts (Ray workers, vLLM's), unless
    ``$HF_HUB_DISABLE_PROGRESS_BARS`` (``$VLLM_LOGGING_LEVEL``) is set already, which then
    decides. Our own warnings are untouched."""
    import warnings

    os.environ.setdefault(TORCH_CPP_LEVEL_VARIABLE, "ERROR")  # (too late once torch is loaded)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\.|$)")
    level = os.environ.setdefault(VLLM_LEVEL_VARIABLE, "ERROR")
    # its logger directly too, at the variable's level (a child process inherits the variable,
    # not the logger): imported already, vLLM read the variable; and its import warns about
    # Triton before it configures its logger from the variable
    import logging

    logging.getLogger("vllm").setLevel(level.upper() if level.upper() in
                                       logging.getLevelNamesMapping() else logging.ERROR)
    if HUB_BARS_VARIABLE in os.environ:
        return
    os.environ[HUB_BARS_VARIABLE] = "1"
    # Both libraries read the variable once, at import: one imported already is told directly.
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()  # (huggingface_hub's bars too)
    elif "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
