"""Transferable lessons of MiniHack Room: the sweep search, the lesson's form, the policy it
states, and its win rate over real dark-Room levels."""

from __future__ import annotations

import itertools

import gymnasium as gym
import pytest

pytest.importorskip("nle", reason="the minihack extra: pip install 'crl-gym[minihack]'")

import crl_envs  # noqa: E402
from crl_envs.minihack.oracle.lessons import (  # noqa: E402
    BREAK_OFF,
    LESSON_MOVES,
    LESSON_TITLE,
    MAX_LESSON_MOVES,
    ROOM_CELLS,
    best_sweep,
    lesson_policy,
    room_lesson,
)
from crl_envs.minihack.oracle.view import MOVES  # noqa: E402

ROOM = "CRL/MiniHackRoom-v0"
DARK = {"variant": "dark", "max_episode_steps": 6, "penalty_step": -0.05}  # cpu-demo's


def _wins_by_brute_force(start, moves):
    """Stairs places in view along ``moves`` from ``start`` (walls stop a move), counted
    without the search's bound."""
    seen, cell = set(), start
    for move in (None, *moves):
        if move is not None:
            nxt = (cell[0] + MOVES[move][0], cell[1] + MOVES[move][1])
            cell = nxt if nxt in ROOM_CELLS else cell
        seen |= {(cell[0] + dx, cell[1] + dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1)}
    return len((seen & ROOM_CELLS) - {start})


def test_best_sweep_wins_93_7_percent_of_levels_in_5_moves_and_all_in_7():
    # every start cell equally likely, the stairs on any other cell: 562 of 600 levels
    wins = sum(best_sweep(cell, 5).wins for cell in ROOM_CELLS)
    assert (wins, len(ROOM_CELLS) * 24) == (562, 600)
    assert round(100 * wins / 600, 1) == 93.7
    assert all(best_sweep(cell, 7).wins == 24 for cell in ROOM_CELLS)


@pytest.mark.parametrize("start", [(36, 9), (38, 11), (37, 13)])
def test_best_sweep_is_no_worse_than_any_5_move_sequence(start):
    best = max(_wins_by_brute_force(start, seq) for seq in itertools.product(MOVES, repeat=5))
    sweep = best_sweep(start, 5)
    assert sweep.wins == best == _wins_by_brute_force(start, sweep.moves)


def test_room_lesson_is_a_sweep_with_the_break_off_where_nothing_is_in_view():
    key = "x=37, y=11; in view: nothing notable"
    title, content = room_lesson(key, 6)
    sweep = best_sweep((37, 11), 5)
    assert title == f"{LESSON_TITLE}{key}"
    assert content == f"{LESSON_MOVES}{', '.join(sweep.moves)}. {BREAK_OFF}"
    # the step budget sets the sweep's length; 7 moves see the whole room
    assert room_lesson(key, 4)[1].startswith(f"{LESSON_MOVES}{', '.join(best_sweep((37, 11), 3).moves)}.")
    assert room_lesson(key, 30) == room_lesson(key, 8)
    assert room_lesson(key, 1) is None  # no move to sweep with


def test_room_lesson_is_the_route_where_the_stairs_are_in_view():
    assert room_lesson("x=40, y=9; in view: staircase down (>) 1 west", 6)[1] == \
        f"{LESSON_MOVES}west."
    # a lit room shows far stairs: the shortest walk to them
    assert room_lesson("x=36, y=9; in view: staircase down (>) 2 south, 4 east", 30)[1] == \
        f"{LESSON_MOVES}east, east, southeast, southeast."


def test_transferable_lesson_is_found_for_room_only():
    key = "x=36, y=9; in view: nothing notable"
    assert crl_envs.transferable_lesson(ROOM, key, 6) == room_lesson(key, 6)
    assert crl_envs.transferable_lesson("CRL/MiniHackMaze-v0", key, 6) is None
    assert crl_envs.lesson_policy("CRL/Sokoban-v0", f"{LESSON_MOVES}west.") is None


@pytest.mark.parametrize("key", [
    "", "x=36, y=9", "x=35, y=9; in view: nothing notable",  # off the room
    "x=36, y=9; in view: monster jackal (d) 1 east",  # no sweep accounts for a monster
    "x=36, y=9; in view: staircase down (>) 1 east; trap: web (^) 1 south",
    "x=36, y=9; in view: staircase down (>) 1 up",
    "x=36, y=9; in view: staircase down (>) 9 south",  # off the room: no walk
    "x=36, y=9; in view: nothing notable" + "x" * 10_000,
])
def test_hardening_room_lesson_reads_only_a_room_key(key):
    assert room_lesson(key, 6) is None


@pytest.mark.parametrize("steps", [0, -1, True, 6.0, "6"])
def test_hardening_room_lesson_rejects_a_step_budget_that_is_none(steps):
    with pytest.raises(ValueError, match="max_episode_steps must be a whole number"):
        room_lesson("x=36, y=9; in view: nothing notable", steps)


def test_hardening_best_sweep_rejects_a_start_off_the_room_and_a_length_out_of_range():
    with pytest.raises(ValueError, match="no cell of the 5x5 room"):
        best_sweep((0, 0), 5)
    with pytest.raises(ValueError, match="a sweep has 0..7 moves"):
        best_sweep((36, 9), 8)


@pytest.mark.parametrize("text", [
    "Avoid the walls.", f"{LESSON_MOVES}south, jump.", f"{LESSON_MOVES}.",
    LESSON_MOVES + ", ".join(["south"] * (MAX_LESSON_MOVES + 1)) + ".",
    LESSON_MOVES + "south," * 100_000,
])
def test_hardening_lesson_policy_reads_only_moves_and_at_most_max_lesson_moves(text):
    assert lesson_policy(text) is None


def test_lesson_policy_breaks_off_only_where_the_lesson_says_so():
    assert lesson_policy(f"{LESSON_MOVES}south, east. {BREAK_OFF}").break_off
    assert not lesson_policy(f"{LESSON_MOVES}south, east.").break_off
    assert len(lesson_policy(LESSON_MOVES + ", ".join(["south"] * MAX_LESSON_MOVES)).moves) == \
        MAX_LESSON_MOVES


def _play(env, seed, policy_of_key):
    observation, info = env.reset(seed=seed)
    policy = policy_of_key(info["retrieval_query"])
    while (move := policy(observation)) is not None:
        observation, _, terminated, truncated, info = env.step(move)
        if terminated or truncated:
            return info["won"]
    return False


def test_the_oracle_lessons_win_most_unseen_dark_room_levels_played_as_policies():
    env = gym.make(ROOM, **DARK)
    seeds = range(20_000_000, 20_000_200)

    def sweep(key):
        return lesson_policy(": ".join(crl_envs.transferable_lesson(ROOM, key, 6)))

    def moves_only(key):  # the same moves, never broken off for the stairs
        policy = sweep(key)
        policy.break_off = False
        return policy

    try:
        wins = sum(_play(env, seed, sweep) for seed in seeds)
        without_break_off = sum(_play(env, seed, moves_only) for seed in seeds)
    finally:
        env.close()
    # 93.5% expected for these levels' start cells (93.3% measured on 3000)
    assert 0.88 <= wins / len(seeds) <= 0.98
    assert without_break_off < wins - 80  # a sweep is no route: it stops for the stairs


def test_the_policy_says_when_it_breaks_off_for_the_stairs():
    # what a warm start's episode following a sweep says it does, turn by turn
    env = gym.make(ROOM, **DARK)
    try:
        observation, info = env.reset(seed=20_000_000)  # x=37, y=11, nothing in view
        policy = lesson_policy(crl_envs.transferable_lesson(ROOM, info["retrieval_query"], 6)[1])
        said = []
        while (move := policy(observation)) is not None:
            said.append((move, policy.to_goal, policy.played))
            observation, _, terminated, truncated, info = env.step(move)
            if terminated or truncated:
                break
    finally:
        env.close()
    assert info["won"]
    assert [to_goal for _, to_goal, _ in said] == [False] * (len(said) - 1) + [True]
    assert [move for move, _, _ in said[:-1]] == policy.moves[:len(said) - 1]
    assert said[-1][2] == len(said) - 1 < len(policy.moves)  # broken off mid-sweep
