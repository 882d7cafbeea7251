"""Task mixtures at CPU scale (issue 36, item 2): the mix3-cpu and mix6-cpu configs, the sampler's
env weights, per-env metrics and curves, the bank's per-env partitions under a mixed batch, and
the held-out evaluation of ``crl demo --config`` on every env of a mixture.

Real envs (Sokoban, MiniHack) and the tiny random Llama of ``crl_harness.models.tiny``.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_harness.cli import main
from crl_harness.config import HELDOUT_RESERVED, EnvEntry, TaskConfig, load_config
from crl_harness.eval.heldout import env_cases, evaluate_levels
from crl_harness.experience import AddEntry, ExperienceBank, ExperienceManager
from crl_harness.models.tiny import build_tiny_model
from crl_harness.rollout import EpisodeSpec, RolloutEngine, Trajectory
from crl_harness.training.metrics import MetricsLogger, curve_panels, plot_learning_curve
from crl_harness.training.sampler import TaskSampler
from crl_harness.training.step_metrics import step_metrics
from crl_wrappers import ExperienceAugmentation
from crl_wrappers.experience import retrieval_query

torch.set_num_threads(1)

SOKOBAN, ROOM, MAZE = "CRL/Sokoban-v0", "CRL/MiniHackRoom-v0", "CRL/MiniHackMaze-v0"
TWO_ENVS = (f"tasks.envs=[{{id: {SOKOBAN}, kwargs: {{max_episode_steps: 2}}}}, "
            f"{{id: {ROOM}, kwargs: {{variant: dark, max_episode_steps: 2}}}}]")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", hidden_size=64)


# ------------------------------------------------------------------ configs
@pytest.mark.parametrize(("name", "paper"), [("mix3-cpu", "mix3"), ("mix6-cpu", "mix6")])
def test_cpu_mixtures_load_with_the_papers_envs_short_limits_and_disjoint_seeds(name, paper):
    cfg, full = load_config(name), load_config(paper)
    assert [e.id for e in cfg.tasks.envs] == [e.id for e in full.tasks.envs]
    assert {e.weight for e in cfg.tasks.envs} == {1.0}
    assert all(1 <= e.kwargs["max_episode_steps"] <= 12 for e in cfg.tasks.envs)
    assert cfg.warmstart.output_dir == f"assets/warmstart/{name}"
    assert cfg.actor.lora.init_from == f"assets/warmstart/{name}/actor"
    assert cfg.extractor.lora.init_from == f"assets/warmstart/{name}/extractor"
    assert cfg.actor.max_new_tokens >= 96  # WebShop's search[<the whole instruction>]
    t = cfg.tasks
    assert t.groups_per_step == len(t.envs)  # one group per env a step, on average
    training = set(t.training_seeds())
    heldout = set(range(t.heldout_offset, t.heldout_offset + HELDOUT_RESERVED))
    warm = set(cfg.warmstart.seeds())
    assert not training & heldout and not training & warm and not heldout & warm


@pytest.mark.parametrize("name", ["mix3-cpu", "mix6-cpu"])
def test_dry_run_without_the_warm_start_names_it_in_one_line(name, capsys, tmp_path):
    from crl_harness.config import config_dir

    missing = f"warmstart.output_dir={tmp_path / 'not-made'}"  # mix3-cpu's own is shipped
    assert main(["train", str(config_dir() / f"{name}.yaml"), missing, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"crl warmstart {name}" in err


def test_dry_run_of_mix3_cpu_finds_its_shipped_warm_start_and_prints_each_env(capsys):
    assert main(["train", "mix3-cpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(env in out for env in ("MiniHackRoom", "WebShop", "ALFWorld"))


# ------------------------------------------------------------------ the mixture sampler
def test_sampler_draws_envs_by_weight_within_a_binomial_tolerance():
    envs = [EnvEntry(SOKOBAN, 1.0), EnvEntry(ROOM, 2.0), EnvEntry(MAZE, 1.0)]
    sampler = TaskSampler(TaskConfig(envs=envs, groups_per_step=40, seed_offset=100,
                                     seed_count=7), run_seed=3)
    draws = [d for step in range(100) for d in sampler.sample(step)]
    assert len(draws) == 4000
    assert all(d.env_id == envs[d.env_index].id and 100 <= d.seed < 107 for d in draws)
    for index, p in enumerate((0.25, 0.5, 0.25)):
        count = sum(d.env_index == index for d in draws)
        assert abs(count - 4000 * p) <= 4 * math.sqrt(4000 * p * (1 - p)), (index, count)


# ------------------------------------------------------------------ per-env metrics and curves
def _trajectory(env_id, group, guided, won, steps=4, format_failures=0):
    return Trajectory(env_id, seed=group, group_id=group, use_experience=guided, won=won,
                      reward=float(won), steps=steps, format_failures=format_failures)


def _metrics(trajectories, uses_experience):
    cfg = SimpleNamespace(uses_experience=uses_experience)
    return step_metrics(cfg, trajectories, None, None, {}, counters={})


def test_step_metrics_log_success_guided_free_and_format_failures_per_env():
    batch = [_trajectory(SOKOBAN, 0, True, True), _trajectory(SOKOBAN, 0, True, True),
             _trajectory(SOKOBAN, 0, False, False, format_failures=2),
             _trajectory(SOKOBAN, 0, False, True),
             _trajectory(ROOM, 1, True, False, steps=2, format_failures=1),
             _trajectory(ROOM, 1, False, False, steps=6)]
    m = _metrics(batch, uses_experience=True)
    assert m["success/Sokoban"] == 0.75 and m["success/MiniHackRoom"] == 0.0
    assert m["success/Sokoban/guided"] == 1.0 and m["success/Sokoban/free"] == 0.5
    assert m["success/MiniHackRoom/guided"] == 0.0 == m["success/MiniHackRoom/free"]
    assert m["format_failure_rate/Sokoban"] == 2 / 16
    assert m["format_failure_rate/MiniHackRoom"] == 1 / 8
    assert m["rollout/format_failure_rate"] == 3 / 24 and m["success/all"] == 0.5
    plain = _metrics([t for t in batch if not t.use_experience], uses_experience=False)
    assert "success/Sokoban" in plain and "format_failure_rate/Sokoban" in plain
    assert not any(k.endswith(("/guided", "/free")) for k in plain)  # arm none: no subgroups


def test_learning_curve_draws_a_line_per_env_of_a_mixture_and_one_env_as_before(tmp_path):
    both = [_trajectory(SOKOBAN, 0, True, True), _trajectory(SOKOBAN, 0, False, False),
            _trajectory(ROOM, 1, True, False, format_failures=1), _trajectory(ROOM, 1, False, True)]
    for name, batch in (("mix", both), ("one", both[:2])):
        log = MetricsLogger(tmp_path / name, tensorboard=False)
        for step in (1, 2):
            log.log(step, _metrics(batch, uses_experience=True))
        log.close()
        assert plot_learning_curve(log.path, tmp_path / name / "curve.png").stat().st_size > 0
    mix = dict(curve_panels([json.loads(x) for x in (tmp_path / "mix" / "metrics.jsonl")
                             .read_text().splitlines()]))
    assert mix["success rate"] == ["success/all", "success/free", "success/guided"]
    assert mix["success rate per env"] == ["success/MiniHackRoom", "success/Sokoban"]
    assert mix["format failure rate per env"] == ["format_failure_rate/MiniHackRoom",
                                                  "format_failure_rate/Sokoban"]
    one = curve_panels([json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl")
                        .read_text().splitlines()])
    assert [label for label, _ in one] == ["success rate", "mean episode reward", "loss",
                                           "bank size"]
    assert one[0][1] == ["success/Sokoban", "success/all", "success/free", "success/guided"]


# ------------------------------------------------------------------ bank partitions
ENVS = (SOKOBAN, ROOM, MAZE)
SEEDS = (0, 1)


def _queries() -> dict[tuple[str, int], str]:
    queries = {}
    for env_id in ENVS:
        env = gym.make(env_id)
        for seed in SEEDS:
            observation, info = env.reset(seed=seed)
            queries[env_id, seed] = retrieval_query(observation, info)
        env.close()
    return queries


@pytest.fixture(scope="module")
def mixed_bank(tmp_path_factory):
    """A bank whose every partition holds a lesson for every level of every env: each query
    matches entries of all three envs as well as its own."""
    queries = _queries()
    path = tmp_path_factory.mktemp("bank") / "bank.sqlite"
    with ExperienceBank(path) as bank, ExperienceManager(bank) as manager:
        added = manager.apply([AddEntry(env_id, f"Lesson {i}", f"About: {query}")
                               for env_id in ENVS for i, query in enumerate(queries.values())])
        assert manager.flush(timeout=60)
        owner = {entry.id: entry.env_id for entry in added.added}
        assert len(owner) == len(ENVS) * len(queries)
        yield manager, queries, owner


def test_mixed_bank_never_retrieves_an_entry_of_another_env(mixed_bank):
    manager, queries, owner = mixed_bank
    for (env_id, _), query in queries.items():
        found = manager.retrieve(env_id, query, k=len(owner))
        assert found and {owner[e.id] for e in found} == {env_id}
    for env_id in ENVS:  # through the wrapper: each env's reset retrieves from its own partition
        env = ExperienceAugmentation(gym.make(env_id), manager, k=3, env_id=env_id)
        for seed in SEEDS:
            _, info = env.reset(seed=seed)
            assert info["experience_ids"] and {owner[i] for i in info["experience_ids"]} == {env_id}
        env.close()


def test_mixed_batch_of_the_rollout_engine_retrieves_from_each_envs_partition(mixed_bank, tiny):
    from crl_harness.models import HFBackend

    manager, _, owner = mixed_bank
    engine = RolloutEngine(HFBackend(tiny), manager, max_new_tokens=4, seed=0, k=2,
                           env_kwargs={env_id: {"max_episode_steps": 1} for env_id in ENVS})
    try:
        specs = [EpisodeSpec(env_id, seed, group_id=g, use_experience=True)
                 for g, (env_id, seed) in enumerate((e, s) for s in SEEDS for e in ENVS)]
        trajectories = engine.run(specs)
    finally:
        engine.close()
    assert [t.env_id for t in trajectories] == [s.env_id for s in specs]
    for t in trajectories:
        assert not t.error and len(t.experience_ids) == 2
        assert {owner[i] for i in t.experience_ids} == {t.env_id}


# ------------------------------------------------------------------ held-out, per env
def test_evaluate_levels_plays_every_env_of_a_mixture_in_one_batch_and_caches_each(
        tiny, tmp_path, monkeypatch):
    from crl_harness import eval as eval_module

    plays = []
    evaluate = eval_module.evaluate
    monkeypatch.setattr(eval_module, "evaluate",
                        lambda agent, specs, **k: plays.append(sorted({s.env_id for s in specs}))
                        or evaluate(agent, specs, **k))
    cfg = load_config(None, [f"actor.model=hf:{tiny}", "actor.max_new_tokens=8", TWO_ENVS])
    cases = env_cases(cfg, {"held-out": ([50_000_000, 50_000_001], False)})
    assert cases == {"held-out/Sokoban": ([50_000_000, 50_000_001], False, 0),
                     "held-out/MiniHackRoom": ([50_000_000, 50_000_001], False, 1)}
    first = evaluate_levels(cfg, f"hf:{tiny}", cases, tmp_path / "out", cache=tmp_path / "cache")
    assert plays == [[ROOM, SOKOBAN]]  # one batch of both envs
    assert {name: sorted(o) for name, o in first.items()} == {
        name: [50_000_000, 50_000_001] for name in cases}
    for name, env_id in (("held-out/Sokoban", SOKOBAN), ("held-out/MiniHackRoom", ROOM)):
        report = json.loads((tmp_path / "out" / name / "report.json").read_text())
        assert {e["env_id"] for e in report["episodes"]} == {env_id}
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2  # a key per env
    again = evaluate_levels(cfg, f"hf:{tiny}", cases, tmp_path / "out", cache=tmp_path / "cache")
    assert again == first and len(plays) == 1  # cached: nothing played
    evaluate_levels(cfg, f"hf:{tiny}", cases, tmp_path / "out", cache=tmp_path / "cache",
                    refresh=True)
    assert len(plays) == 2  # refresh: played again (and the cache rewritten)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2


def test_demo_of_a_mixture_warm_starts_and_prints_each_env_and_the_pooled_pairs(
        tiny, tmp_path, capsys):
    from crl_harness.commands.demo import train_and_evaluate

    cfg = load_config("cpu-demo", [
        "name=mix-tiny", TWO_ENVS, f"warmstart.model=hf:{tiny}",
        # levels the oracle wins within the limit, so that the extractor has lessons to add
        "tasks.envs.0.kwargs={num_boxes: 1, max_solution_length: 4, max_episode_steps: 4}",
        f"warmstart.output_dir={tmp_path}/w", f"run.output_dir={tmp_path}/demo/run",
        "run.steps=1", "run.tensorboard=false", "run.torch_threads=1", "tasks.groups_per_step=2",
        "tasks.group_size=2", "tasks.guided_per_group=1", "warmstart.episodes=1",
        "warmstart.extractor_samples=1", "warmstart.epochs=1", "warmstart.lora.top_layers=1",
        # 80: the tiny model's tokenizer writes the advice check ("I start at x=38, y=12; the
        # advice is from x=38, y=12: mine; ...") in 74 tokens, SmolLM2's in about 50
        "warmstart.lora.r=4", "actor.max_new_tokens=80", "extractor.max_new_tokens=192",
        "extractor.train_after=1", "actor.dtype=float32", "extractor.dtype=float32"])
    train_and_evaluate(cfg, 2, tmp_path / "demo", cache=tmp_path / "cache")
    out = capsys.readouterr().out
    assert "crl warmstart mix-tiny" in out  # the warm start was missing: made first
    for line in ("held-out/Sokoban", "held-out, pooled", "training, pooled", "McNemar",
                 "training success per step and env: Sokoban ",
                 "held-out/Sokoban levels, the trained actor with the run's bank: "):
        assert line in out, line
    levels = json.loads((tmp_path / "demo" / "levels.json").read_text())
    assert sorted(levels["levels"]) == ["held-out/MiniHackRoom", "held-out/Sokoban",
                                        "training/MiniHackRoom", "training/Sokoban"]
    assert levels["pooled"]["held-out"]["n"] == 4  # 2 levels x 2 envs, paired
    assert sum(levels["levels"][f"held-out/{env}"]["paired"]["n"]
               for env in ("Sokoban", "MiniHackRoom")) == 4


# ------------------------------------------------------------------ crl demo --config
@pytest.mark.parametrize(("argv", "message"), [
    (["demo", "--config", "no-such-config", "--no-train"],
     "--config: config 'no-such-config' not found; give a YAML path or one of:"),
    (["demo", "--config", "mix3-cpu", "--eval-levels", "0"],
     "--eval-levels must be between 1 and 10000, got 0."),
    (["demo", "--config", "mix3-cpu", "--eval-levels", "10001"],
     "--eval-levels must be between 1 and 10000"),
    (["demo", "--config", "mix3-cpu", "--test-time-rounds", "0"],
     "--test-time-rounds must be between 1 and 8, got 0."),
    (["demo", "--config", "mix3-cpu", "--test-time-rounds", "9"],
     "--test-time-rounds must be between 1 and 8"),
    (["demo", "--config", "mix3-cpu", "--no-train", "actor.rollout_engine=llamacpp"],
     "bad config key 'actor.rollout_engine': invalid value 'llamacpp', expected one of auto, hf, vllm"),
    (["demo", "--config", "mix3-cpu", "--no-train", "actor.nosuch=1"],
     "--config and its settings: override 'actor.nosuch=1': bad config key 'actor.nosuch'"),
    (["demo", "--no-train", "actor.lr"],
     "--config and its settings: override 'actor.lr' must look like key=value"),
])
def test_hardening_demo_config_is_checked_with_one_line(argv, message, capsys, tmp_path,
                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_hardening_demo_config_with_a_bad_key_names_it_in_one_line(capsys, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("name: bad\ntasks: {groups_per_step: 0}\n")
    assert main(["demo", "--config", "bad.yaml", "--no-train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "tasks.groups_per_step" in err and "--config" in err


def test_demo_settings_reach_the_training_config(tmp_path, monkeypatch):
    """``crl demo [key=value ...]``: the settings reach the config that trains and evaluates;
    the run still goes under ``--out``."""
    from crl_harness.commands import demo

    seen, flags = [], []
    monkeypatch.setattr(demo, "train_and_evaluate",
                        lambda cfg, levels, out, **kw: seen.append(cfg) or flags.append(kw))
    assert main(["demo", "--config", "mix3-cpu", "--episodes", "1", "--envs", SOKOBAN,
                 "--out", str(tmp_path / "demo"), "--test-time-rounds", "3",
                 "actor.rollout_engine=vllm", "extractor.kv_cache_tokens=2048",
                 "run.output_dir=elsewhere"]) == 0
    [cfg] = seen
    assert flags == [{"test_time_levels": 32, "test_time_rounds": 3}]
    assert cfg.actor.rollout_engine == "vllm" and cfg.kv_cache_tokens("extractor") == 2048
    assert cfg.run.output_dir == str(tmp_path / "demo" / "mix3-cpu")
