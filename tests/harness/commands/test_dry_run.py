"""``crl train CONFIG --dry-run``: the plan of a config that can run, one line for each problem of
one that cannot, and nothing trained or written either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from crl_harness.cli import main


def _no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from crl_harness.commands import train

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run started training")

    monkeypatch.setattr(train, "train", refuse)


def test_dry_run_prints_the_plan_of_cpu_demo_and_writes_nothing(tmp_path: Path, capsys,
                                                                monkeypatch) -> None:
    _no_training(monkeypatch)
    run_dir = tmp_path / "run"
    code = main(["train", "cpu-demo", "--dry-run", f"run.output_dir={run_dir}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "CRL/MiniHackRoom-v0" in out and "turns cap 6" in out
    assert "Episodes per step: 4 groups x 8 = 32" in out
    assert "Tokens per step: ~" in out and "estimate" in out
    assert "Model actor:" in out and "Model extractor:" in out and "134.5M parameters" in out
    assert "KV cache" in out and "Checkpoint: ~" in out
    assert not run_dir.exists()


def test_dry_run_plan_numbers_follow_the_config() -> None:
    from crl_harness.commands.dry_run import make_plan
    from crl_harness.config import load_config

    cfg = load_config("cpu-demo", ["arm=static", "actor.lora.enabled=true", "actor.lora.r=8",
                                   "actor.dtype=bfloat16", "extractor.kv_cache_tokens=1024"])
    plan = make_plan(cfg)
    actor, extractor = plan.models
    assert extractor.trained == 0  # static: a frozen extractor
    assert (actor.kv_tokens, extractor.kv_tokens) == (65_536, 1024)  # each its own KV cache
    assert 0 < actor.trained < actor.params // 100  # only the adapters train
    memory = actor.memory()
    assert memory["weights"] == actor.params * 2 and memory["AdamW"] == actor.trained * 8
    # 30 layers x 2 x 3 KV heads x 64 dims in bf16
    assert actor.kv_bytes_per_token == 30 * 2 * 3 * 64 * 2
    assert plan.checkpoint_bytes == actor.trained * (4 + 8) + actor.trained * 4
    env = plan.envs[0]
    assert plan.tokens_per_step() == 32 * 6 * (env.prompt_tokens + 64)


def test_dry_run_hardening_names_a_missing_model_in_one_line(tmp_path: Path, capsys,
                                                             monkeypatch) -> None:
    _no_training(monkeypatch)
    missing = tmp_path / "no-such-model"
    code = main(["train", "cpu-demo", "--dry-run", f"actor.model=hf:{missing}",
                 "extractor.model=same", "actor.lora.init_from=null",
                 "extractor.lora.init_from=null"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    # the actor is missing, and the extractor is "same" as it: one line for the key given
    assert len(lines) == 1 and lines[0].startswith("crl train --dry-run: actor.model")
    assert str(missing) in lines[0] and "Hugging Face cache" in lines[0]


@pytest.mark.parametrize("kwarg, expected", [("no_such_kwarg=1", "no_such_kwarg"),
                                              ("variant=nope", "Unknown variant 'nope'")])
def test_dry_run_hardening_names_a_bad_env_kwarg_in_one_line(kwarg: str, expected: str, capsys,
                                                             monkeypatch) -> None:
    """A kwarg the env does not take, or a value it refuses: the config's check (the env is
    made as the config loads) names the key, in one line."""
    _no_training(monkeypatch)
    code = main(["train", "cpu-demo", "--dry-run", f"tasks.envs.0.kwargs.{kwarg}"])
    captured = capsys.readouterr()
    assert code == 2 and "Dry run" not in captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "bad config key 'tasks.envs.0.kwargs'" in lines[0]
    assert expected in lines[0]


def test_dry_run_hardening_names_a_missing_extra_in_one_line(capsys, monkeypatch,
                                                           without_module) -> None:
    """An env whose extra is not installed: its install command."""
    without_module("MiniHack", "nle")
    _no_training(monkeypatch)
    assert main(["train", "cpu-demo", "--dry-run"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "No module named 'nle'" in lines[0]
    assert "pip install 'crl-gym[minihack]'" in lines[0]


def test_dry_run_hardening_names_missing_data_in_one_line(tmp_path: Path, capsys,
                                                          monkeypatch) -> None:
    """WebShop with an empty data folder: the line names the dataset and how to fetch it."""
    from crl_envs import data
    from crl_envs.webshop import env as webshop_env

    monkeypatch.setattr(data, "candidate_dirs", lambda name, path=None: [tmp_path / name])
    # past the per-process cache of the catalogue, which an earlier test may have filled
    monkeypatch.setattr(webshop_env, "shared_resources", webshop_env.shared_resources.__wrapped__)
    _no_training(monkeypatch)
    config = tmp_path / "webshop.yaml"
    config.write_text("name: ws\ntasks:\n  envs:\n    - {id: CRL/WebShop-v0}\n")
    assert main(["train", str(config), "--dry-run"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "tasks.envs.0 CRL/WebShop-v0" in lines[0]
    assert "crl data fetch" in lines[0]
