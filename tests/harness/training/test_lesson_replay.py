"""Lessons replayed without a model: a route's moves as they stand, and a transferable lesson
played as the policy it states (the env's oracle reads it)."""

from __future__ import annotations

import pytest

pytest.importorskip("nle", reason="the minihack extra: pip install 'crl-gym[minihack]'")

import crl_envs  # noqa: E402
from crl_harness.rollout import Trajectory  # noqa: E402
from crl_harness.training.lesson_replay import LessonReplay  # noqa: E402
from crl_harness.warmstart.routes import route_advice, route_moves  # noqa: E402

ROOM = "CRL/MiniHackRoom-v0"
DARK = {"variant": "dark", "max_episode_steps": 6, "penalty_step": -0.05}  # cpu-demo's
LEVEL = 20_000_000  # unseen; starts at x=37, y=11 with nothing in view
KEY = "x=37, y=11; in view: nothing notable"


@pytest.fixture
def replay():
    replay = LessonReplay({ROOM: DARK})
    yield replay
    replay.close()


def test_a_transferable_lesson_is_in_the_route_lessons_form():
    title, content = crl_envs.transferable_lesson(ROOM, KEY, 6)
    # retrieved by the key a route lesson of this start is, its moves read as a route's are
    assert title == route_advice(ROOM, "You (@) are at x=37, y=11. HP 12/12.", [], key=KEY).title
    assert route_moves(f"{title}: {content}") == \
        ["northeast", "southeast", "south", "west", "west"]


def test_replay_of_a_transferable_lesson_wins_where_its_moves_alone_lose(replay):
    title, content = crl_envs.transferable_lesson(ROOM, KEY, 6)
    assert replay.wins_following(ROOM, LEVEL, f"{title}: {content}") is True
    # the stairs come into view mid-sweep: played on as a route, the lesson walks past them
    assert replay.wins(ROOM, LEVEL, route_moves(content)) is False


def test_replay_of_a_route_lesson_plays_its_moves_as_they_stand(replay):
    # LEVEL + 4 starts at x=39, y=12 with the stairs 1 south
    assert replay.wins_following(ROOM, LEVEL + 4, "from the start, play south.") is True
    assert replay.wins_following(ROOM, LEVEL + 4, "from the start, play north.") is False
    assert replay.wins(ROOM, LEVEL + 4, ["south"]) is True


def test_replay_reads_no_policy_where_the_env_or_the_text_has_none(replay):
    assert replay.wins_following(ROOM, LEVEL, "Avoid the walls.") is None
    assert replay.wins_following("CRL/Sokoban-v0", 0, "from the start, play south.") is None


def shown(seed: int, experience: str) -> Trajectory:
    return Trajectory(env_id=ROOM, seed=seed, use_experience=True, experience=experience,
                      experience_ids=["e"])


def test_a_step_counts_a_handed_transferable_lesson_as_the_policy_it_states(replay):
    title, content = crl_envs.transferable_lesson(ROOM, KEY, 6)
    # its moves alone walk past the stairs on LEVEL (above); broken off for them, it wins
    metrics = replay.step_metrics([shown(LEVEL, f"Experience:\n- {title}: {content}"),
                                   shown(LEVEL + 4, "- x: from the start, play north."),
                                   shown(LEVEL, "Avoid the walls.")])
    assert metrics == {"lessons/handed": 2.0, "lessons/replay_win_rate": 0.5}
