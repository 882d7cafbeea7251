"""CRL/ALFWorld-v0 on the real TextWorld/PDDL engine and the real json_2.1.1 games.

A new game takes 0.3-2.5 s to load (the engine translates its PDDL once), so each test plays few games.
The contract checks shared by every env (check_env, garbage actions) live in test_contract.py.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import zipfile
from collections import Counter

import gymnasium as gym
import pytest
from conftest import require_data

import crl_envs  # noqa: F401  (registers the ids)
from crl_envs.alfworld import data as alfworld_data
from crl_envs.alfworld.data import Game, list_games, parse_task_types
from crl_envs.alfworld.env import NOTHING_HAPPENS, ALFWorldEnv
from crl_envs.alfworld.oracle import ALFWorldExpert
from crl_envs.base import StepBudgetFromTimeLimit
from crl_envs.errors import UserFacingError
from crl_envs.oracles import make_oracle

pytestmark = pytest.mark.data
ENV_ID = "CRL/ALFWorld-v0"


@pytest.fixture(scope="module")
def unseen():
    require_data("alfworld", "valid.txz")
    env = gym.make(ENV_ID, split="eval_out_of_distribution")
    yield env
    env.close()


def play_expert(env, **reset_kwargs):
    obs, info = env.reset(**reset_kwargs)
    expert = make_oracle(ENV_ID, env)
    expert.reset(obs, info)
    terminated = truncated = False
    while not (terminated or truncated):
        obs, reward, terminated, truncated, info = env.step(expert.act(obs, info))
    return info, reward, terminated


# ----------------------------------------------------------------------------- splits
def test_split_sizes_and_task_types():
    require_data("alfworld", "train.txz", "valid.txz")
    sizes = {split: len(list_games(split)) for split in alfworld_data.SPLITS}
    assert sizes == {"train": 1465, "train_all": 3553, "eval_in_distribution": 140,
                     "eval_out_of_distribution": 134}
    train = list_games("train")
    assert len({game.task_folder for game in train}) == len(train), "one game per task folder"
    by_type = Counter(game.task_type for game in train)
    assert by_type == {"pick": 322, "look": 123, "clean": 268, "heat": 186, "cool": 212,
                       "pick_two": 354}
    heat = list_games("eval_out_of_distribution", parse_task_types(["heat"]))
    assert heat and all(g.game_id.split("/")[1].startswith("pick_heat_then") for g in heat)


def test_bad_options_raise_one_clear_error(unseen):
    with pytest.raises(ValueError, match="Unknown ALFWorld split"):
        ALFWorldEnv(split="test")
    with pytest.raises(ValueError, match="task type"):
        ALFWorldEnv(split="eval_out_of_distribution", task_types=["juggle"])
    with pytest.raises(ValueError, match="out of range"):
        unseen.reset(options={"task_id": 134})
    with pytest.raises(ValueError, match="not a game of this split"):
        unseen.reset(options={"task_id": "no-such-task"})
    with pytest.raises(TypeError):
        unseen.reset(options={"task_id": 1.5})


def test_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(UserFacingError, match="crl data fetch alfworld"):
        ALFWorldEnv(split="train", data_dir=tmp_path)


# ----------------------------------------------------------------------------- episodes
def test_reset_is_deterministic_and_task_id_picks_the_game(unseen):
    obs_a, info_a = unseen.reset(seed=11)
    obs_b, info_b = unseen.reset(seed=11)
    assert (obs_a, info_a["game_id"]) == (obs_b, info_b["game_id"])
    games = unseen.unwrapped.games()
    game = games[5]
    obs, info = unseen.reset(options={"task_id": 5})
    assert info["game_id"] == game.game_id
    assert unseen.reset(options={"task_id": game.game_id})[1]["game_id"] == game.game_id
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert info["task"].startswith("Your task is to: ") and obs.endswith(info["task"])
    assert "go to" in " ".join(info["admissible_actions"])


def test_invalid_command_is_nothing_happens_and_changes_nothing(unseen):
    obs, info = unseen.reset(options={"task_id": 0})
    walkthrough = unseen.unwrapped.walkthrough
    first = unseen.step(walkthrough[0])
    for bad in ["fly to the moon", "", "take the alarmclock", "🤖", "x" * 100_000]:
        obs, reward, terminated, truncated, info = unseen.step(bad)
        assert (obs, info["action_valid"], reward, terminated) == (NOTHING_HAPPENS, False, 0.0, False)
        assert info["admissible_actions"] == first[4]["admissible_actions"]
    # Case and spacing do not matter; the rest of the solution still wins.
    unseen.step("  " + walkthrough[1].upper().replace(" ", "   ") + " ")
    for command in walkthrough[2:]:
        obs, reward, terminated, truncated, info = unseen.step(command)
    assert (reward, terminated, info["won"], info["score"]) == (1.0, True, True, 1.0)


def test_reset_on_the_same_game_starts_it_fresh(unseen):
    obs, _ = unseen.reset(options={"task_id": 0})
    walkthrough = unseen.unwrapped.walkthrough
    seen_fresh = unseen.step(walkthrough[0])[0]
    unseen.step(walkthrough[1])  # takes the object
    assert unseen.reset(options={"task_id": 0})[0] == obs
    assert unseen.step(walkthrough[0])[0] == seen_fresh, "the object is back where it was"


def test_a_game_is_translated_once_and_replays_fresh_from_that_translation(monkeypatch):
    """The PDDL translation (about a second) runs once a game, plain and optimized, not again
    at each reset, nor for another env on that game, nor on a return to a recent game; a replay
    from it is a fresh game: same start, same plan, and it wins again."""
    require_data("alfworld", "valid.txz")
    import fast_downward

    from crl_envs.alfworld import env as alfworld_env

    translate, translated = fast_downward.pddl2sas, []

    def counting(domain, problem, verbose=False, optimize=False):
        translated.append(optimize)
        return translate(domain, problem, verbose=verbose, optimize=optimize)

    monkeypatch.setattr(fast_downward, "pddl2sas", counting)
    monkeypatch.setattr(alfworld_env, "_TRANSLATIONS", type(alfworld_env._TRANSLATIONS)())
    envs = [gym.make(ENV_ID, split="eval_out_of_distribution") for _ in range(2)]
    starts = []
    for env in (envs[0], envs[0], envs[1]):  # a replay, then a second env on the same game
        obs, info = env.reset(options={"task_id": 0})
        plan = env.unwrapped.replan()
        for command in env.unwrapped.walkthrough:
            _, reward, terminated, _, _ = env.step(command)
        starts.append((obs, info["admissible_actions"], plan, reward, terminated))
    assert translated == [False, True], "the game was translated again"
    assert starts[0] == starts[1] == starts[2] and starts[0][3:] == (1.0, True)
    envs[0].reset(options={"task_id": 1})
    assert translated == [False, True, False, True], "another game needs its own translation"
    assert envs[0].reset(options={"task_id": 0})[0] == starts[0][0]
    assert len(translated) == 4, "the last games' translations are kept"
    for env in envs:
        env.close()


def test_out_of_steps_pays_minus_one_on_the_last_step(unseen):
    unseen.reset(seed=3)
    limit = unseen.spec.max_episode_steps
    for step in range(limit):
        _, reward, terminated, truncated, info = unseen.step("look")
        assert info["action_valid"] and not terminated
        assert truncated == (step == limit - 1)
        assert reward == (-1.0 if truncated else 0.0)
    score_env = gym.make(ENV_ID, split="eval_out_of_distribution", reward_mode="score",
                         max_episode_steps=3)
    score_env.reset(seed=3)
    rewards = [score_env.step("inventory")[1] for _ in range(3)]
    assert rewards == [0.0, 0.0, 0.0] and score_env.unwrapped.elapsed_steps == 3
    score_env.close()


def test_make_max_episode_steps_moves_the_minus_one_budget():
    require_data("alfworld", "valid.txz")
    env = gym.make(ENV_ID, split="eval_out_of_distribution", max_episode_steps=4)
    assert env.unwrapped.step_budget == 4
    env.reset(seed=3)
    steps = [env.step("look")[1:4] for _ in range(4)]
    assert steps == [(0.0, False, False)] * 3 + [(-1.0, False, True)]
    env.close()
    # the spec remakes the same env; the registered limit is the default budget
    assert gym.make(env.spec).unwrapped.step_budget == 4
    assert gym.make(ENV_ID, split="eval_out_of_distribution").unwrapped.step_budget == 30
    # no TimeLimit, no budget; an explicit step_budget wins over the limit
    assert gym.make(ENV_ID, split="eval_out_of_distribution",
                    max_episode_steps=-1).unwrapped.step_budget is None
    assert gym.make(ENV_ID, split="eval_out_of_distribution", max_episode_steps=9,
                    step_budget=3).unwrapped.step_budget == 3
    assert ALFWorldEnv(split="eval_out_of_distribution").step_budget is None


def test_hardening_step_budget_wrapper_refuses_other_envs():
    sokoban = gym.make("CRL/Sokoban-v0")
    with pytest.raises(TypeError, match="wraps an env with follow_time_limit"):
        StepBudgetFromTimeLimit(sokoban)
    sokoban.close()


def test_expert_wins_seeded_train_games():
    require_data("alfworld", "train.txz")
    env = gym.make(ENV_ID, split="train")
    for seed in (0, 1):
        info, reward, terminated = play_expert(env, seed=seed)
        assert (info["won"], reward, terminated) == (True, 1.0, True), info["game_id"]
    env.close()


def test_expert_replans_after_other_moves(unseen):
    obs, info = unseen.reset(options={"task_id": 40})
    expert = ALFWorldExpert(unseen)
    expert.reset(obs, info)
    for command in ["look", "inventory", info["admissible_actions"][0]]:
        obs, reward, terminated, truncated, info = unseen.step(command)
    while not (terminated or truncated):
        obs, reward, terminated, truncated, info = unseen.step(expert.act(obs, info))
    assert info["won"] and reward == 1.0


def test_task_type_filter_only_offers_those_types():
    require_data("alfworld", "valid.txz")
    env = gym.make(ENV_ID, split="eval_in_distribution", task_types=["cool", "pick two"])
    games = env.unwrapped.games()
    assert {g.task_type for g in games} == {"cool", "pick_two"}
    assert all(g.task_folder.startswith(("pick_cool", "pick_two")) for g in games)
    assert len(games) < len(list_games("eval_in_distribution"))
    env.close()


# ----------------------------------------------------------------------------- hygiene
@pytest.mark.slow
def test_close_frees_the_engine_and_leaves_no_temp_files(monkeypatch, tmp_path):
    require_data("alfworld", "valid.txz")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    argv = sys.argv
    env = gym.make(ENV_ID, split="eval_out_of_distribution")
    assert env.unwrapped._engine is None, "making the env must not start the engine"
    for seed in (1, 2):
        env.reset(seed=seed)
        env.step("look")
    assert sys.argv is argv, "the PDDL translator must not leave sys.argv rewritten"
    env.close()
    assert env.unwrapped._engine is None
    assert list(tmp_path.iterdir()) == []
    assert env.reset(seed=1)[0], "a closed env starts a fresh engine on reset"
    env.close()


def _fake_tree(root, game_text):
    trial = root / "json_2.1.1" / "valid_unseen" / "look_at_obj_in_light-Box-None-DeskLamp-1" / "trial_1"
    trial.mkdir(parents=True)
    (trial / "game.tw-pddl").write_text(game_text)
    return root


def test_games_are_listed_without_parsing_them(monkeypatch, tmp_path):
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    tree = _fake_tree(tmp_path / "data", json.dumps({"solvable": True, "pddl_domain": "(broken"}))
    env = ALFWorldEnv(split="eval_out_of_distribution", data_dir=tree)
    assert [g.game_id for g in env.games()] == [
        "valid_unseen/look_at_obj_in_light-Box-None-DeskLamp-1/trial_1"]
    with pytest.raises(UserFacingError, match="could not be loaded"):
        env.reset(seed=0)
    env.close()


@pytest.mark.slow
def test_upstream_zip_is_extracted_once_and_atomically(monkeypatch, tmp_path):
    require_data("alfworld", "valid.txz")
    real = list_games("eval_out_of_distribution")[:2]
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    archive_dir = tmp_path / "fetched"
    archive_dir.mkdir()
    with zipfile.ZipFile(archive_dir / "json_2.1.1_tw-pddl.zip", "w") as zipped:
        for game in real:
            zipped.write(game.path, f"json_2.1.1/{game.game_id}/game.tw-pddl")
        zipped.writestr("json_2.1.1/valid_unseen/x-movable-1/trial_1/game.tw-pddl", "{}")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(alfworld_data, "_write_index", crash)
    with pytest.raises(KeyboardInterrupt):
        list_games("eval_out_of_distribution", data_dir=archive_dir)
    assert list((tmp_path / "cache" / "alfworld").iterdir()) == [], "no half cache is left"
    monkeypatch.undo()
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    games = list_games("eval_out_of_distribution", data_dir=archive_dir)
    assert [g.game_id for g in games] == [g.game_id for g in real]
    env = ALFWorldEnv(split="eval_out_of_distribution", data_dir=archive_dir)
    info, reward, _ = play_expert(env, options={"task_id": 1})
    assert info["won"] and info["game_id"] == real[1].game_id
    env.close()


def test_alfworld_data_tree_is_used_in_place(monkeypatch, tmp_path):
    require_data("alfworld", "valid.txz")
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    source = list_games("eval_in_distribution")[0]
    upstream = tmp_path / "alfworld_data"
    shutil.copytree(source.root / "valid_seen", upstream / "json_2.1.1" / "valid_seen")
    monkeypatch.setenv("ALFWORLD_DATA", str(upstream))
    games = list_games("eval_in_distribution")
    assert len(games) == 140 and games[0].root == upstream / "json_2.1.1"
    assert isinstance(games[0], Game) and games[0].path.is_file()
