"""Supervised warm start from the scripted oracles (``crl warmstart``).

- ``reasons``: short true reasons for an action, read from the observation;
- ``data``: oracle episodes rendered as the rollout engine renders them, advice, extractor samples;
- ``lessons``: episodes that follow a transferable lesson and break it off for the goal;
- ``sft``: LoRA fine-tuning with the learner and ``sft_loss``, atomic adapter files.
"""

from crl_harness.warmstart.sft import WarmStartError, run_warmstart

__all__ = ["WarmStartError", "run_warmstart"]
