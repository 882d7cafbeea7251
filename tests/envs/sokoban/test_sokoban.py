"""CRL/Sokoban-v0: generator, solver, rules, text contract and the text-only oracle."""

from __future__ import annotations

import copy
import random
import warnings
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import crl_envs  # noqa: F401  (registers the ids)
from crl_envs.oracles import make_oracle, play_episode
from crl_envs.sokoban.env import SokobanEnv
from crl_envs.sokoban.generator import generate_level
from crl_envs.sokoban.level import Level
from crl_envs.sokoban.solver import solve

ACTIONS = ["up", "down", "left", "right"]


def independent_optimal_length(level: Level, limit: int) -> int | None:
    """Shortest solution length by plain BFS over (row, col) coordinates, sharing no code with
    the package (no bitmasks, no dead-square pruning, no reverse search)."""
    walls = {(r, c) for r in range(level.height) for c in range(level.width)
             if not level.floor >> (r * level.width + c) & 1}
    targets = frozenset(divmod(c, level.width) for c in range(level.width * level.height)
                        if level.targets >> c & 1)
    boxes = frozenset(divmod(c, level.width) for c in range(level.width * level.height)
                      if level.boxes >> c & 1)
    start = (divmod(level.player, level.width), boxes)
    seen = {start}
    queue = deque([(start, 0)])
    while queue:
        (player, boxes), depth = queue.popleft()
        if boxes == targets:
            return depth
        if depth == limit:
            continue
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            to = (player[0] + dr, player[1] + dc)
            if to in walls:
                continue
            new_boxes = boxes
            if to in boxes:
                behind = (to[0] + dr, to[1] + dc)
                if behind in walls or behind in boxes:
                    continue
                new_boxes = (boxes - {to}) | {behind}
            state = (to, new_boxes)
            if state not in seen:
                seen.add(state)
                queue.append((state, depth + 1))
    return None


def grid_of(observation: str) -> str:
    return Level.from_text(observation).to_text()


# ----------------------------------------------------------------------------- gymnasium API
def test_check_env_passes_unwrapped_and_made():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(gym.make("CRL/Sokoban-v0").unwrapped)
    assert not caught, [str(w.message) for w in caught]
    env = gym.make("CRL/Sokoban-v0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    # gymnasium always notes that a made env is wrapped; nothing else may be reported.
    assert all("different from the unwrapped version" in str(w.message) for w in caught)
    assert env.spec.max_episode_steps == 30


def test_reset_observation_and_info():
    env = gym.make("CRL/Sokoban-v0")
    obs, info = env.reset(seed=7)
    level = Level.from_text(obs)
    assert (level.width, level.height, level.num_boxes) == (6, 6, 2)
    assert level.floor & ~_interior(6, 6) == 0, "the outer ring is wall"
    assert info["task"] == "Push both boxes onto the two targets."
    assert info["admissible_actions"] == ACTIONS
    assert info["action_valid"] is True and info["won"] is False
    assert obs.splitlines()[-1].endswith("Boxes on targets: 0 of 2.")
    for symbol in "#_OX√PS":
        assert symbol in env.unwrapped.instructions


def _interior(height: int, width: int) -> int:
    return sum(1 << (r * width + c) for r in range(1, height - 1) for c in range(1, width - 1))


# ----------------------------------------------------------------------------- generator
def test_thousand_seeds_generate_solvable_levels_of_verified_optimal_length():
    lengths = []
    for seed in range(1000):
        level = generate_level(np.random.default_rng(seed))
        lengths.append(level.solution_length)
        assert 4 <= level.solution_length <= 20
        assert level.boxes_on_targets == 0 and level.num_boxes == 2
        assert not level.boxes >> level.player & 1
        assert independent_optimal_length(level, level.solution_length) == level.solution_length, (
            f"seed {seed}:\n{level.to_text()}"
        )
    # The start is the farthest state of its room within the bounds, so levels are not trivial.
    assert np.mean(lengths) > 10 and lengths.count(20) > 50


def test_same_seed_same_level_and_seeds_differ():
    env = SokobanEnv()
    first = [env.reset(seed=seed)[0] for seed in range(50)]
    again = [env.reset(seed=seed)[0] for seed in range(50)]
    assert first == again
    assert len(set(first)) == 50
    assert generate_level(np.random.default_rng(11)) == generate_level(np.random.default_rng(11))


def test_solution_length_bounds_are_respected():
    for seed in range(100):
        level = generate_level(np.random.default_rng(seed), min_solution_length=12,
                               max_solution_length=14)
        assert 12 <= level.solution_length <= 14
        assert len(solve(level)) == level.solution_length


def test_unsatisfiable_or_bad_bounds_raise_one_clear_error():
    with pytest.raises(ValueError, match="widen the bounds"):
        SokobanEnv(min_solution_length=150, max_solution_length=160)
    with pytest.raises(ValueError, match="min_solution_length"):
        SokobanEnv(min_solution_length=10, max_solution_length=5)
    with pytest.raises(ValueError, match="num_boxes"):
        SokobanEnv(num_boxes=20)


def test_variants_are_kwargs():
    env = SokobanEnv(dim_room=(7, 7), num_boxes=1)
    obs, info = env.reset(seed=0)
    level = Level.from_text(obs)
    assert (level.height, level.width, level.num_boxes) == (7, 7, 1)
    assert info["task"] == "Push the box onto the target."


# ----------------------------------------------------------------------------- rules
ROOM = """\
# # # # # # #
# _ _ _ _ _ #
# _ X _ X O #
# P _ _ _ _ #
# O _ _ _ _ #
# # # # # # #"""


def play(env: SokobanEnv, *actions: str):
    result = None
    for action in actions:
        result = env.step(action)
    return result


def test_wall_bump_is_a_valid_move_that_changes_nothing():
    env = SokobanEnv()
    obs, _ = env.reset(options={"level": ROOM})
    obs2, reward, terminated, truncated, info = env.step("left")
    assert info["action_valid"] is True and reward == 0.0 and not terminated
    assert grid_of(obs2) == grid_of(obs)
    assert "You bump into a wall." in obs2


def test_push_onto_target_then_against_the_wall():
    env = SokobanEnv()
    env.reset(options={"level": ROOM})
    obs, *_ = play(env, "right", "right", "up")  # player stands left of the box at row 2, col 4
    obs, _, _, _, info = env.step("right")
    assert "You push a box right onto a target." in obs
    assert Level.from_text(obs).boxes_on_targets == 1 and info["score"] == 0.5
    obs2, _, _, _, info = env.step("right")  # the box is now against the east wall
    assert info["action_valid"] is True
    assert "against a wall and does not move" in obs2
    assert grid_of(obs2) == grid_of(obs)


def test_push_into_another_box_changes_nothing():
    env = SokobanEnv()
    obs, _ = env.reset(options={"level": "# # # # # # #\n# P X X _ O #\n# _ _ _ _ O #\n# # # # # # #"})
    obs2, _, _, _, info = env.step("right")
    assert info["action_valid"] is True
    assert "against another box" in obs2
    assert grid_of(obs2) == grid_of(obs)


def test_winning_gives_reward_one_and_terminates():
    env = gym.make("CRL/Sokoban-v0")
    env.reset(options={"level": "# # # # # # #\n# P X _ O _ #\n# _ X _ O _ #\n# # # # # # #"})
    obs, reward, terminated, truncated, info = play(env, "right", "right")
    assert (reward, terminated, info["won"], info["score"]) == (0.0, False, False, 0.5)
    assert "1 of 2" in obs
    obs, reward, terminated, truncated, info = play(env, "left", "left", "down", "right", "right")
    assert reward == 1.0 and terminated and not truncated and info["won"] and info["score"] == 1.0
    assert "solved" in obs
    assert Level.from_text(obs).is_solved


def test_a_deep_copy_steps_independently_of_the_original():
    """Tree search copies envs: a copy has its own level, step count and sampling RNG, and shares
    only the read-only charset tables of the text spaces."""
    env = gym.make("CRL/Sokoban-v0", render_mode="ansi")
    start, _ = env.reset(options={"level": "# # # # # # #\n# P X _ O _ #\n# _ X _ O _ #\n# # # # # # #"})
    env.action_space.seed(0)
    clone = copy.deepcopy(env)
    assert clone.unwrapped is not env.unwrapped
    assert clone.observation_space.character_list is env.observation_space.character_list
    # the copy wins while the original has not moved
    obs, reward, terminated, *_ = play(clone, "right", "right", "left", "left", "down", "right",
                                       "right")
    assert reward == 1.0 and terminated and Level.from_text(obs).is_solved
    assert env.render() == start and not env.unwrapped.level.is_solved
    # the original moves on its own; the copy's finished episode is untouched
    obs, reward, terminated, truncated, info = env.step("down")
    assert info["action_valid"] and grid_of(obs) != grid_of(start) and not terminated
    assert clone.render().endswith("solved!") and Level.from_text(clone.render()).is_solved
    # the copy's seven steps did not count against the original's TimeLimit
    assert [env.step("up")[3] for _ in range(29)] == [False] * 28 + [True]
    # the sampling RNG was copied, not shared: both draw the same next sample
    assert clone.action_space.sample() == env.action_space.sample()


def test_truncation_at_thirty_steps_is_not_termination():
    env = gym.make("CRL/Sokoban-v0")
    env.reset(seed=0)
    for step in range(1, 31):
        _, reward, terminated, truncated, info = env.step(["up", "down"][step % 2])
        assert not terminated and reward == 0.0
        assert truncated == (step == 30)


def test_bad_level_option_raises_value_error():
    env = SokobanEnv()
    with pytest.raises(ValueError, match="exactly one player"):
        env.reset(options={"level": "# # #\n# X O\n# # #"})


# ----------------------------------------------------------------------------- bad actions
def bad_actions(count: int = 1000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = ["", " ", "\n\t ", "upp", "Up!", "move up", "u p", "u", "UP.", "up down", "north",
           "<answer>up</answer>", "🤖", "\x00", "↑", "ＵＰ", "x" * 1_000_000, "up " * 350_000]
    letters = "abcdefghijklmnopqrstuvwxyz !?.,<>[]_-éß中文↑↓←→"
    while len(out) < count:
        word = rng.choice(ACTIONS)
        kind = rng.randrange(4)
        if kind == 0:
            i = rng.randrange(len(word))
            out.append(word[:i] + rng.choice(letters) + word[i:])
        elif kind == 1:
            out.append(rng.choice(["go ", "move ", "I choose ", "action: "]) + word)
        elif kind == 2:
            out.append(word + rng.choice(["!", ".", "?", " now", "wards"]))
        else:
            out.append("".join(rng.choice(letters) for _ in range(rng.randrange(1, 30))))
    return [a for a in out if a.strip().lower() not in ACTIONS]


def test_thousand_bad_strings_are_invalid_noop_steps():
    env = SokobanEnv()
    obs, _ = env.reset(seed=3)
    grid = grid_of(obs)
    actions = bad_actions()
    assert len(actions) >= 990
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_valid"] is False and reward == 0.0 and not terminated
        assert "Valid actions: up, down, left, right" in obs
        assert grid_of(obs) == grid
        assert len(obs) < 500
    assert env.step("  UP \n")[4]["action_valid"] is True


def test_non_string_action_raises_type_error():
    env = SokobanEnv()
    env.reset(seed=0)
    for action in (0, None, b"up", ["up"]):
        with pytest.raises(TypeError):
            env.step(action)


# ----------------------------------------------------------------------------- oracle
def test_text_only_oracle_wins_every_episode_within_the_limit():
    env = gym.make("CRL/Sokoban-v0")
    oracle = make_oracle("CRL/Sokoban-v0", env)
    for seed in range(200):
        episode = play_episode(env, oracle, seed=seed)
        assert episode.won and episode.reward == 1.0 and not episode.truncated, f"seed {seed}"


def test_solver_agrees_with_independent_bfs_on_hand_levels():
    level = Level.from_text(ROOM)
    assert len(solve(level)) == independent_optimal_length(level, 40)
    stuck = Level.from_text("# # # # #\n# X _ _ #\n# _ P O #\n# # # # #")  # box in a corner
    assert solve(stuck) is None and independent_optimal_length(stuck, 30) is None


def test_hardening_the_oracle_plays_on_in_a_level_with_no_solution_left():
    """A box pushed into a corner (by a move the oracle did not choose) leaves no solution: the
    level is lost, and the oracle answers a move instead of failing."""
    from crl_envs.sokoban.env import ACTIONS
    from crl_envs.sokoban.oracle import SokobanOracle

    deadlocked = ("# # # # # #\n# # # # # #\n# # _ _ _ #\n# # X _ _ #\n# # _ _ S #\n# # # # # #\n"
                  "You move down. Boxes on targets: 0 of 1.")
    assert SokobanOracle().act(deadlocked, {}) in ACTIONS
