"""Held-out levels (``crl_harness.eval.heldout``): the outcomes of a model that does not change
are cached, and replayed only when its weights, the env or the dtype change.

The tiny random Llama of ``crl_harness.models.tiny`` on Sokoban: it wins nothing, but plays and
caches as any actor does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from crl_harness.config import load_config
from crl_harness.models.tiny import build_tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def _overrides(model: Path, run_dir: Path) -> list[str]:
    return [f"actor.model=hf:{model}", f"extractor.model=hf:{model}",
            "tasks.envs.0.id=CRL/Sokoban-v0", "tasks.envs.0.kwargs={max_episode_steps: 2}",
            "actor.max_new_tokens=8", f"run.output_dir={run_dir}", "run.tensorboard=false",
            "run.torch_threads=1"]


def test_warm_start_cache_is_free_the_second_time_and_invalidated_by_the_adapter(
        model, tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file

    from crl_harness import eval as eval_module
    from crl_harness.eval.heldout import evaluate_levels

    actor = tmp_path / "actor"
    shutil.copytree(model, actor)
    plays = []
    evaluate = eval_module.evaluate
    monkeypatch.setattr(eval_module, "evaluate",
                        lambda agent, specs, **k: plays.append(len(specs))
                        or evaluate(agent, specs, **k))
    cfg = load_config(None, _overrides(model, tmp_path / "run"))
    cases = {"held-out": ([50_000_000, 50_000_001], False)}

    def before(config=cfg, dtype="auto"):
        return evaluate_levels(config, f"hf:{actor}", cases, tmp_path / "out",
                               cache=tmp_path / "cache", dtype=dtype)

    first = before()
    assert plays == [2] and set(first["held-out"]) == {50_000_000, 50_000_001}
    assert before() == first and plays == [2]  # cached: nothing played
    weights = load_file(actor / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 0.01
    save_file(weights, actor / "model.safetensors", metadata={"format": "pt"})
    before()
    assert plays == [2, 2]  # the changed weights are played again
    other_env = load_config(None, [*_overrides(model, tmp_path / "run"),
                                   "tasks.envs.0.kwargs={max_episode_steps: 3}"])
    before(other_env)
    assert plays == [2, 2, 2]  # as are other env kwargs
    before(dtype="bfloat16")
    assert plays == [2, 2, 2, 2]  # and another dtype of the weights (crl demo's bf16)
