"""Shared fixtures: data-dependent tests skip with the fetch command when the data is absent,
tests of an optional extra with the pip command when it is not installed; ``gpu`` tests skip with the reason where torch sees no CUDA device; ``alternating_rewards``; ``without_module``."""

from __future__ import annotations

import dataclasses
import os

import pytest

from crl_envs.data import DataNotFoundError, resolve_data
from crl_harness.models.engines import ENGINE_VARIABLE

# rollout_engine auto means vLLM where it is installed: the suite's models generate with
# transformers unless a test (or CRL_ROLLOUT_ENGINE=vllm for the whole suite) asks for vLLM;
# tests/harness/models/test_engines.py checks auto's own rule with the variable removed.
os.environ.setdefault(ENGINE_VARIABLE, "hf")


def require_data(name: str, *files: str):
    """Return the dataset directory, or skip the test with the message that says how to get it."""
    try:
        return resolve_data(name, required=tuple(files))
    except DataNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture
def data_dir():
    return require_data


EXTRAS = {"nle": "minihack", "minihack": "minihack", "nltk": "webshop", "regex": "webshop",
          "spacy": "webshop", "alfworld": "alfworld", "textworld": "alfworld",
          "swebench": "swebench", "docker": "swebench", "unidiff": "swebench"}
"""top-level modules of the optional extras, and the extra that installs each"""


def skip_without_extra(err: ImportError, what: str) -> None:
    """Skip ``what`` when ``err`` is a missing optional extra (a GPU image carries only some);
    re-raise any other import error, which is a bug."""
    module = (err.name or "").split(".")[0]
    if module not in EXTRAS:
        raise err
    pytest.skip(f"{what}: {module} is not installed (pip install 'crl-gym[{EXTRAS[module]}]')")


def _no_cuda_reason() -> str | None:
    """Why the ``gpu`` tests cannot run here, or None where they can."""
    try:
        import torch
    except ImportError:
        return "needs a CUDA device: torch is not installed (pip install 'crl-gym[train]')"
    if not torch.cuda.is_available():
        build = "a CPU-only torch build" if torch.version.cuda is None else "no visible GPU"
        return f"needs a CUDA device: torch.cuda.is_available() is False ({build})"
    return None


def pytest_collection_modifyitems(config, items):
    gpu = [item for item in items if "gpu" in item.keywords]
    reason = _no_cuda_reason() if gpu else None
    if reason is not None:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def alternating_rewards():
    """Makes a ``Trainer``'s rollouts return rewards 1, 0, 1, 0, ... in order, so every GRPO
    group has reward variance whatever the device's random stream sampled."""
    def patch(trainer) -> None:
        run = trainer.rollouts.run

        def run_with_rewards(specs):
            return [dataclasses.replace(t, reward=float(i % 2)) for i, t in enumerate(run(specs))]

        trainer.rollouts.run = run_with_rewards
    return patch


@pytest.fixture
def without_module(monkeypatch):
    """Makes ``gymnasium.make`` of the env ids that contain a word fail as on a machine without
    an extra's module (a test double: the env's modules may be imported already, and dropping
    them from ``sys.modules`` to re-import them would leave other tests with stale classes)."""
    def patch(word: str, module: str) -> None:
        import gymnasium

        make = gymnasium.make

        def make_without(env_id, *args, **kwargs):
            if word in str(env_id):
                raise ModuleNotFoundError(f"No module named '{module}'", name=module)
            return make(env_id, *args, **kwargs)

        monkeypatch.setattr(gymnasium, "make", make_without)
    return patch
