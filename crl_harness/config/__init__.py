"""Training configuration: one dataclass per concern, loaded from YAML with ``key=value`` overrides.

Holds:
- ``schema``: ``TrainConfig`` (the whole run) and its parts ``RunConfig``, ``TaskConfig``
  (+ ``EnvEntry``), ``ActorConfig``, ``ExtractorConfig``, ``ExperienceConfig``,
  ``WarmStartConfig``, ``LoRAConfig``, each field with its default and docstring;
  ``updated_lesson_steps``, ``HELDOUT_RESERVED``.
- ``fields``: ``choice`` and ``bounded``, a field's allowed values declared beside its default.
- ``validation``: ``ConfigError`` and the checks of a loaded config; ``check_lora_fits`` and
  ``check_context_fits``, the LoRA settings and the replies' length against their model before
  training.
- ``loading``: ``load_config`` (a shipped name or a YAML path, overrides, then the checks),
  ``config_dir``, ``config_to_dict``.

The defaults are the paper's released settings (docs/method.md, which also lists where this code
departs), except the released code's two switches ``experience.actor_critic_gate`` and
``experience.search_and_ask``, off here (docs/training.md); a YAML file under
``assets/configs/`` changes only what differs. The three arms are one switch, ``arm``:

- ``co-evolve``: Complementary RL, the extractor is trained by CISPO;
- ``static``: the extractor is frozen, but the bank is still written and used;
- ``none``: plain GRPO, no experience at all (every rollout of a group is free).

Types and keys are checked by OmegaConf (structured configs); an error names the bad key.

>>> cfg = load_config(None, ["arm=none", "run.steps=3"])
>>> cfg.arm, cfg.run.steps, cfg.tasks.group_size
('none', 3, 8)
"""

from crl_harness.config.loading import config_dir, config_to_dict, load_config
from crl_harness.config.schema import (
    HELDOUT_RESERVED,
    ActorConfig,
    EnvEntry,
    ExperienceConfig,
    ExtractorConfig,
    LoRAConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
    WarmStartConfig,
    updated_lesson_steps,
)
from crl_harness.config.validation import ConfigError, check_context_fits, check_lora_fits

__all__ = [
    "ConfigError",
    "EnvEntry",
    "TaskConfig",
    "LoRAConfig",
    "ActorConfig",
    "ExtractorConfig",
    "ExperienceConfig",
    "RunConfig",
    "WarmStartConfig",
    "TrainConfig",
    "load_config",
    "check_lora_fits",
    "check_context_fits",
    "config_to_dict",
    "config_dir",
    "updated_lesson_steps",
    "HELDOUT_RESERVED",
]
