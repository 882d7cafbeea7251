"""The warm start: oracle data rendered as the engine renders it, advice, extractor samples,
LoRA fitting, atomic adapters that ``hf:`` loads, and its errors."""

from __future__ import annotations

import json
import os
import random
import re

import pytest
import torch

import crl_envs
from crl_envs.minihack.oracle import parse_observation
from crl_envs.minihack.oracle.lessons import BREAK_OFF
from crl_harness.config import ConfigError, load_config
from crl_harness.experience.entries import ExperienceEntry
from crl_harness.experience.operations import Vote, parse_distillation
from crl_harness.models import HFBackend
from crl_harness.models.base import Generation, encode_chat
from crl_harness.models.tiny import build_tiny_model
from crl_harness.prompting import parse_answer
from crl_harness.rollout import EpisodeSpec, RolloutEngine
from crl_harness.warmstart import WarmStartError, run_warmstart
from crl_harness.warmstart.data import (
    actor_episodes,
    answer_class,
    extractor_episodes,
    extractor_sample,
    play_oracle_episode,
)
from crl_harness.warmstart.quotas import ANSWER_CLASSES, class_quotas
from crl_harness.warmstart.routes import advice_check, route_advice, route_moves, winning_route
from crl_harness.warmstart.sft import sample_rows

ROOM = "CRL/MiniHackRoom-v0"
DARK = {"variant": "dark", "max_episode_steps": 8}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("warm") / "tiny", hidden_size=64)


@pytest.fixture(scope="module")
def backend(tiny):
    return HFBackend(tiny)


def _play(backend, seed=0, **kwargs):
    return play_oracle_episode(ROOM, seed, tokenizer=backend.tokenizer,
                               max_context=backend.max_context, max_new_tokens=64, history=None,
                               env_kwargs=DARK, **kwargs)


class _Replay:
    """A backend double that answers with recorded replies and keeps the prompts it was sent."""

    def __init__(self, backend, replies):
        self.backend, self.replies, self.prompts = backend, list(replies), []
        self.max_context = backend.max_context

    def count_tokens(self, messages):
        return self.backend.count_tokens(messages)

    def generate(self, prompts, **_):
        out = []
        for messages in prompts:
            ids = encode_chat(self.backend.tokenizer, messages)
            self.prompts.append(ids)
            out.append(Generation(text=self.replies.pop(0), prompt_token_ids=ids, token_ids=[1],
                                  logprobs=[0.0], finish_reason="stop"))
        return out


def test_oracle_prompts_are_the_rollout_engines_and_targets_parse(backend):
    traj = _play(backend, seed=3)
    assert traj.won and traj.steps >= 2
    for turn in traj.turns:
        parsed = parse_answer(turn.text)
        assert parsed.format_ok and parsed.action == turn.action
        assert turn.token_ids[-1] == backend.tokenizer.eos_token_id
        assert f"x={turn.observation.split('are at x=')[1].split(',')[0]}" in parsed.think
    # The engine, fed the same replies, sends exactly the prompts the warm start trains on.
    replay = _Replay(backend, [t.text for t in traj.turns])
    engine = RolloutEngine(replay, max_new_tokens=64, env_kwargs={ROOM: DARK})
    [played] = engine.run([EpisodeSpec(ROOM, seed=3)])
    engine.close()
    assert played.won == traj.won
    assert replay.prompts == [t.prompt_token_ids for t in traj.turns]


def test_minihack_reasons_are_one_clause_that_starts_with_the_move(backend):
    import re

    for seed in range(4):
        traj = _play(backend, seed=seed)
        for turn in traj.turns:
            think = parse_answer(turn.text).think
            # one clause, the act first: a list of facts taught greedy replies to loop
            assert ";" not in think and think.count(".") == 1, think
            assert think.startswith(f"I move {turn.action} from x="), think
            stairs = re.search(r"stairs > at x=(\d+), y=(\d+)", think)
            if stairs:  # a goal the agent was shown, never one it could not see
                assert f"(>) at x={stairs[1]}, y={stairs[2]}" in turn.observation, think


def test_sokoban_reasons_count_down_the_moves_of_a_shortest_solution(backend):
    import re

    traj = _play_env(backend, "CRL/Sokoban-v0", 0, 30)
    thinks = [parse_answer(t.text).think for t in traj.turns]
    assert traj.won and len(thinks) >= 2
    for turn, think in zip(traj.turns, thinks, strict=True):
        assert ";" not in think and think.startswith(f"I move {turn.action}, "), think
    counts = [int(m[1]) for m in (re.search(r"first of (\d+) moves", t) for t in thinks) if m]
    assert counts == list(range(len(thinks), 1, -1)) and thinks[-1].endswith("solves the level.")


def test_full_history_episode_packs_into_one_row(backend):
    traj = _play(backend, seed=5)
    [row] = sample_rows(traj.turns)
    assert sum(row.completion_mask) == sum(len(t.token_ids) for t in traj.turns)
    assert row.prompt_ids == traj.turns[0].prompt_token_ids


def test_noise_teaches_random_allowed_moves(backend):
    traj = _play(backend, seed=1, noise=1.0, rng=random.Random(0))
    thinks = [parse_answer(t.text).think for t in traj.turns]
    assert all(think.startswith("I try ") for think in thinks)


class _FirstTurnNoise(random.Random):
    """Noise on the first turn only, always the allowed move ``move``."""

    def __init__(self, move):
        super().__init__(0)
        self.move, self.draws = move, 0

    def random(self):
        self.draws += 1
        return 0.0 if self.draws == 1 else 1.0

    def choice(self, seq):
        assert self.move in seq
        return self.move


def test_hardening_the_oracle_resumes_after_an_invalid_noise_move(backend):
    """An invalid noise move (a key applied before it is carried) leaves the level as it was;
    its message has no map, so the oracle goes on from the state before it, and wins."""
    traj = play_oracle_episode("CRL/MiniHackKeyRoom-v0", 10_000_001, tokenizer=backend.tokenizer,
                               max_context=backend.max_context, max_new_tokens=64, history=None,
                               env_kwargs={"max_episode_steps": 20}, noise=0.5,
                               rng=_FirstTurnNoise("apply key north"))
    assert traj.turns[0].action == "apply key north"
    assert traj.turns[1].observation.startswith("Invalid action")
    assert traj.won


def test_winning_route_is_a_shortest_walk_over_the_cells_seen(backend):
    # A wandering noisy attempt that still wins: its route keeps no detours.
    first = next(t for s in range(20) if (t := _play(backend, seed=s, noise=0.5,
                                                     rng=random.Random(s))).won and t.steps >= 3)
    route = winning_route(first)
    assert 1 <= len(route) <= first.steps
    replay = _play(backend, seed=first.seed, route=route)
    assert replay.won and replay.steps == len(route)
    # the transcript's one line of moves is that route: beside the played moves (with their
    # detours) a small extractor mixed the two lines and dropped the route's last move
    assert first.transcript.count("[Shortest route to the goal] " + ", ".join(route) + "\n") == 1
    assert "[Moves played]" not in first.transcript


def test_advice_is_in_the_system_prompt_and_followed(backend):
    first = _play(backend, seed=3)
    route = winning_route(first)
    entry = route_advice(ROOM, first.turns[0].observation, route)
    assert entry.title.startswith("Winning moves from x=")
    advised = _play(backend, seed=3, advice=entry, route=route)
    system = backend.tokenizer.decode(advised.turns[0].prompt_token_ids)
    assert entry.text in system
    assert [t.action for t in advised.turns] == route and advised.won
    assert all("advice" in parse_answer(t.text).think for t in advised.turns)
    # the first reason checks the lesson's start against the episode's own, as the actor can
    cell = re.search(r"You \(@\) are at (x=\d+, y=\d+)", advised.turns[0].observation)[1]
    assert parse_answer(advised.turns[0].text).think.startswith(
        f"I start at {cell}; the advice is from {cell}: mine; its move 1 of {len(route)}")


def test_another_levels_advice_is_set_aside(backend):
    first = _play(backend, seed=3)
    other = route_advice(ROOM, first.turns[0].observation, winning_route(first))
    traj = _play(backend, seed=4, advice=other)
    assert other.text in backend.tokenizer.decode(traj.turns[0].prompt_token_ids)
    theirs = re.search(r"(x=\d+, y=\d+)", other.title)[1]
    mine = re.search(r"You \(@\) are at (x=\d+, y=\d+)", traj.turns[0].observation)[1]
    assert theirs != mine
    assert parse_answer(traj.turns[0].text).think == (
        f"I start at {mine}; the advice is from {theirs}: set aside; I play {traj.turns[0].action}.")
    plain = _play(backend, seed=4)
    assert [t.action for t in traj.turns] == [t.action for t in plain.turns]


def test_advice_check_compares_the_lessons_start_and_view_with_the_episodes():
    def seen(cell, view=""):
        return f"You (@) are at {cell}. HP 12/12." + (f"\nIn view: {view}." if view else "")

    stairs = "staircase down (>) at x=39, y=12 (1 east)"
    entry = route_advice(ROOM, seen("x=38, y=12", stairs), ["east"])
    assert advice_check(entry, seen("x=38, y=12", stairs)) == (
        "I start at x=38, y=12; the advice is from x=38, y=12")
    assert advice_check(entry, seen("x=37, y=11")) == (
        "I start at x=37, y=11; the advice is from x=38, y=12")
    assert advice_check(entry, seen("x=38, y=12")) == (
        "I start at x=38, y=12 seeing nothing notable; the advice saw staircase down (>) 1 east")
    # not a route lesson, or no hero in view: nothing to check
    assert advice_check(route_advice(ROOM, "", ["east"], task="Reach it"), seen("x=1, y=1")) is None
    assert advice_check(entry, "Message: (none)") is None


def test_actor_episodes_mix_followed_and_foreign_advice(backend):
    episodes = actor_episodes(ROOM, list(range(12)), noise=0.0, experience_fraction=1.0,
                              rng=random.Random(1), tokenizer=backend.tokenizer,
                              max_context=backend.max_context, max_new_tokens=64, history=None,
                              env_kwargs=DARK)
    followed = [e for e in episodes if e.advice is not None and e.followed]
    foreign = [e for e in episodes if e.advice is not None and not e.followed]
    assert followed and foreign and all(e.trajectory.won for e in followed)
    for e in foreign:  # another level's entry: the extractor neither upvotes nor downvotes it
        sample = extractor_sample(e, tokenizer=backend.tokenizer, max_ops=3,
                                  max_transcript_chars=2000)
        parsed = parse_distillation(sample.text, 1)
        assert parsed.ok and not any(isinstance(op, Vote) for op in parsed.ops)



def _lesson_episodes(backend, seeds, **kwargs):
    return actor_episodes(ROOM, seeds, noise=0.1, rng=random.Random(2),
                          tokenizer=backend.tokenizer, max_context=backend.max_context,
                          max_new_tokens=64, history=None, env_kwargs=DARK, **kwargs)


def test_lesson_episodes_follow_the_lesson_and_break_off_when_the_stairs_come_into_view(backend):
    episodes = _lesson_episodes(backend, list(range(12)), experience_fraction=0.0,
                                lesson_fraction=1.0)
    lessons = [e for e in episodes if e.lesson]
    broken_off = 0
    assert len(lessons) >= 10 and all(e.trajectory.won for e in lessons)
    for e in lessons:
        traj = e.trajectory
        # the level's transferable lesson (its key's, within the step limit), in the system prompt
        assert (e.advice.title, e.advice.content) == crl_envs.transferable_lesson(
            ROOM, traj.retrieval_key, DARK["max_episode_steps"])
        assert e.advice.text in backend.tokenizer.decode(traj.turns[0].prompt_token_ids)
        moves = route_moves(e.advice.content)
        policy = crl_envs.lesson_policy(ROOM, e.advice.content)
        # a sweep breaks off where the stairs come into view; a key that shows them, a route
        seen = [BREAK_OFF in e.advice.content and bool(parse_observation(t.observation).find(">"))
                for t in traj.turns]
        first_seen = seen.index(True) if True in seen else None
        for t, turn in enumerate(traj.turns):
            assert turn.action == policy(turn.observation)  # the lesson's move, or the walk
            think = parse_answer(turn.text).think
            if first_seen is None or t < first_seen:
                assert not policy.to_goal and turn.action == moves[t]
                said = f"move {t + 1} of {len(moves)} is {turn.action}."
                assert think.endswith(f"mine; the lesson's {said}" if t == 0 else
                                      f"The lesson from my start cell: {said}"), think
            elif t == first_seen:  # the break-off, said on the turn the stairs are in view
                assert policy.to_goal
                assert think == "The stairs > are in view: I leave the lesson and walk to them."
                broken_off += 1
            else:
                assert policy.to_goal and "lesson" not in think
    assert broken_off >= 8


def test_lesson_spent_without_the_stairs_in_view_the_oracle_plays_on(backend):
    first = _play(backend, seed=2)
    key = first.retrieval_key
    assert key.endswith("in view: nothing notable")
    move = crl_envs.transferable_lesson(ROOM, key, 8)[1].split("play ")[1].split(",")[0]
    short = ExperienceEntry("short", ROOM, f"Winning moves from {key}",
                            f"from the start, play {move}. {BREAK_OFF}")
    traj = _play(backend, seed=2, advice=short, lesson=True)
    thinks = [parse_answer(t.text).think for t in traj.turns]
    assert traj.turns[0].action == move and thinks[0].endswith(f"the lesson's move 1 of 1 is {move}.")
    assert not parse_observation(traj.turns[1].observation).find(">")  # spent, stairs unseen
    assert len(thinks) > 2 and all(t.startswith("I move ") for t in thinks[1:]), thinks
    with pytest.raises(ValueError, match="give advice and no route"):
        _play(backend, seed=2, lesson=True)


def test_lesson_fraction_zero_gives_the_episodes_of_a_warm_start_without_it(backend):
    # Pinned from the code before warmstart.lesson_fraction: no lesson is drawn at 0, so the
    # random draws, and with them every episode, are what they were.
    before = [(None, True, "south"), ("route-1", True, "north northwest northwest"),
              ("route-2", True, "south southwest"), (None, True, "northeast southeast south"),
              (None, True, "southwest northwest southwest east east southeast southeast"),
              (None, True, "northwest northwest north northwest east southeast northeast "
                           "southwest"),
              ("route-1", False, "northwest northwest northeast northwest east south southeast "
                                 "northeast"),
              ("route-7", True, "east northeast")]
    episodes = _lesson_episodes(backend, list(range(8)), experience_fraction=0.5,
                                lesson_fraction=0.0)
    assert [(e.advice.id if e.advice else None, e.followed,
             " ".join(t.action for t in e.trajectory.turns)) for e in episodes] == before
    default = _lesson_episodes(backend, list(range(8)), experience_fraction=0.5)
    assert [t.text for e in episodes for t in e.trajectory.turns] == \
        [t.text for e in default for t in e.trajectory.turns]
    assert not any(e.lesson for e in episodes)


def test_hardening_warmstart_lesson_fraction_is_a_share():
    for value in ("1.5", "-0.1"):
        with pytest.raises(ConfigError, match=r"'warmstart.lesson_fraction': must be in \[0, 1\]"
                           ) as err:
            load_config("cpu-demo", [f"warmstart.lesson_fraction={value}"])
        assert "\n" not in str(err.value)
    assert load_config("cpu-demo").warmstart.lesson_fraction == 0.3  # the shipped recipe
    assert load_config("cpu-demo", ["warmstart.lesson_fraction=0"]).warmstart.lesson_fraction \
        == 0.0

def test_extractor_answers_parse_and_follow_the_outcome(backend):
    episodes = actor_episodes(ROOM, [3, 4], noise=0.0, experience_fraction=1.0,
                              rng=random.Random(0), tokenizer=backend.tokenizer,
                              max_context=backend.max_context, max_new_tokens=64, history=None,
                              env_kwargs=DARK)
    advised = next(e for e in episodes if e.advice is not None)
    sample = extractor_sample(advised, tokenizer=backend.tokenizer, max_ops=3,
                              max_transcript_chars=2000)
    assert "## Transcript" in backend.tokenizer.decode(sample.prompt_token_ids)
    parsed = parse_distillation(sample.text, 1)
    assert parsed.ok and parsed.ops[0].delta == 1  # won with the advice: upvote it
    plain = type(advised)(advised.trajectory, None)
    parsed = parse_distillation(extractor_sample(plain, tokenizer=backend.tokenizer, max_ops=3,
                                                 max_transcript_chars=2000).text, 0)
    assert parsed.ok and parsed.ops[0].title.startswith("Winning moves from x=")


def test_extractor_samples_are_balanced_over_the_answer_classes(backend):
    episodes = extractor_episodes(ROOM, list(range(100, 164)), 10, noise=0.1,
                                  rng=random.Random(0), tokenizer=backend.tokenizer,
                                  max_context=backend.max_context, max_new_tokens=64,
                                  history=None, env_kwargs=DARK)
    assert class_quotas(10) == {"add": 3, "return": 3, "upvote": 2, "downvote": 2}
    answered, shown_other = [], []
    for episode in episodes:
        sample = extractor_sample(episode, tokenizer=backend.tokenizer, max_ops=3,
                                  max_transcript_chars=2000)
        [op] = json.loads(sample.text.removeprefix("<answer>").removesuffix("</answer>"))
        assert parse_distillation(sample.text, int(episode.advice is not None)).ok
        assert op["op"] == answer_class(episode)
        prompt = backend.tokenizer.decode(sample.prompt_token_ids)
        assert ("[0] " in prompt) == (episode.advice is not None)
        own_title = f"Winning moves from {episode.trajectory.retrieval_key}"
        if op["op"] in ("upvote", "downvote"):  # a vote names an entry shown: the level's own
            assert episode.advice is not None and episode.followed
            assert episode.advice.title == own_title
        elif episode.advice is not None:  # another level's route: set aside, or misled and lost
            assert episode.advice.title != own_title
            assert f"Level: {episode.trajectory.retrieval_key}\n" in prompt
            shown_other.append(op["op"])
        if op["op"] == "add":  # the episode's own level and moves, whatever it was shown
            assert op["title"] == own_title
        assert episode.trajectory.won == (op["op"] in ("add", "upvote"))
        answered.append(op["op"])
    assert {name: answered.count(name) for name in ANSWER_CLASSES} == class_quotas(10)
    assert shown_other  # some adds or returns were shown another level's route
    followed_lost = [e for e in episodes if e.advice is not None and e.followed
                     and not e.trajectory.won]
    # a wrong lesson of the level's own (downvote), and one misled by another level's (return)
    assert sorted(answer_class(e) for e in followed_lost) == ["downvote", "downvote", "return"]
    for episode in followed_lost:  # the episode played the entry's moves first
        moves = episode.advice.content.removeprefix("from the start, play ").rstrip(".")
        played = [t.action for t in episode.trajectory.turns]
        assert played[:len(moves.split(", "))] == moves.split(", ")
        assert episode.advice.id != f"route-{episode.trajectory.seed}"


WEBSHOP, ALFWORLD = "CRL/WebShop-v0", "CRL/ALFWorld-v0"
WARM_SEED = 10_000_000  # the warm start's seed_offset


def _play_env(backend, env_id, seed, steps, **kwargs):
    return play_oracle_episode(env_id, seed, tokenizer=backend.tokenizer,
                               max_context=backend.max_context, max_new_tokens=256, history=None,
                               env_kwargs={"max_episode_steps": steps}, **kwargs)


def _oracle_actions(env_id, seed, steps):
    """The oracle's own moves on the bare env: what the targets must clone."""
    import gymnasium as gym

    from crl_envs.oracles import make_oracle, play_episode

    env = gym.make(env_id, max_episode_steps=steps)
    try:
        return play_episode(env, make_oracle(env_id, env), seed=seed).actions
    finally:
        env.close()


def test_webshop_targets_are_the_oracles_moves_with_reasons_from_the_page(backend):
    import re

    for seed in (WARM_SEED, WARM_SEED + 3):
        traj = _play_env(backend, WEBSHOP, seed, 10)
        assert traj.won and [t.action for t in traj.turns] == _oracle_actions(WEBSHOP, seed, 10)
        for turn in traj.turns:
            parsed = parse_answer(turn.text)
            assert parsed.format_ok and parsed.action == turn.action
            think, page = parsed.think, turn.observation
            # no product is named before a page shows it: every ASIN and quoted title is on it
            for asin in re.findall(r"\bb0[a-z0-9]{8}\b", think.lower()):
                assert asin in page.lower()
            for title in re.findall(r'"(.+?)(?: \.\.\.)?"', think):
                assert title in page
            if turn.action.startswith("search["):
                assert think.startswith("The instruction asks for ")
                assert think.split("asks for ")[1].split(";")[0] in page
            elif turn.action == "click[buy now]":
                assert "options the instruction names are selected" in think


def test_webshop_noisy_episode_leaves_another_product_and_still_wins(backend):
    traj = _play_env(backend, WEBSHOP, 3, 15, noise=0.3, rng=random.Random(3))
    thinks = [parse_answer(t.text).think for t in traj.turns]
    assert traj.won and any(think.startswith("I try click[b") for think in thinks)
    assert "click[< prev]" in [t.action for t in traj.turns]  # the oracle went back
    assert not any("search[<query>]" in t.action for t in traj.turns)  # a form, not a move


def test_alfworld_targets_are_the_experts_moves_with_reasons_from_what_was_seen(backend):
    import re

    seed = 0
    traj = _play_env(backend, ALFWORLD, seed, 20)
    assert traj.won and [t.action for t in traj.turns] == _oracle_actions(ALFWORLD, seed, 20)
    seen: list[str] = []
    for turn in traj.turns:
        parsed = parse_answer(turn.text)
        assert parsed.format_ok and parsed.action == turn.action
        seen.append(turn.observation)
        think = parsed.think
        # every object or place the reason names was in an observation so far, or is the move's
        for thing in re.findall(r"\b([a-z]+ \d+)\b", think):
            assert thing in turn.action or any(thing in text for text in seen), (thing, think)
        # "I saw Y" of a place X: one observation showed Y at X (an arrival there)
        for place, thing in re.findall(r"go to ([a-z]+ \d+), where I saw ([a-z]+ \d+)", think):
            assert any(f"arrive at {place}" in text and thing in text for text in seen)
        for thing, place in re.findall(r"take ([a-z]+ \d+), which I saw at ([a-z]+ \d+)", think):
            assert any(f"arrive at {place}" in text and thing in text for text in seen)
        if turn.action.startswith("go to "):
            place = turn.action.removeprefix("go to ")
            if not any(f"arrive at {place}" in text for text in seen):  # not looked at yet
                # not looked at yet: a search there, or the held object carried there
                assert "saw" not in think and ("not looked" in think or " with " in think)
    first_take = next(t for t in traj.turns if t.action.startswith("take "))
    assert "which I see here" in parse_answer(first_take.text).think


def test_alfworld_noisy_episode_replans_and_still_wins(backend):
    traj = _play_env(backend, ALFWORLD, 3, 20, noise=0.25, rng=random.Random(3))
    thinks = [parse_answer(t.text).think for t in traj.turns]
    assert traj.won and any(think.startswith("I try ") for think in thinks)


@pytest.mark.parametrize(("env_id", "count", "steps"), [(WEBSHOP, 8, 8), (ALFWORLD, 4, 15)])
def test_extractor_classes_fill_on_webshop_and_alfworld(backend, env_id, count, steps):
    episodes = extractor_episodes(env_id, list(range(WARM_SEED, WARM_SEED + 4 * count)), count,
                                  noise=0.1, rng=random.Random(0), tokenizer=backend.tokenizer,
                                  max_context=backend.max_context, max_new_tokens=256,
                                  history=None, env_kwargs={"max_episode_steps": steps})
    answered = [answer_class(e) for e in episodes]
    assert {name: answered.count(name) for name in ANSWER_CLASSES} == class_quotas(count)
    for episode in episodes:
        if episode.advice is not None:  # titled by the task: retrieval by the task finds it
            assert episode.advice.title.startswith("Winning moves for: ")
        if answer_class(episode) == "upvote":
            assert episode.advice.title.endswith(episode.trajectory.task)
        if answer_class(episode) == "downvote":  # a wrong lesson of its own task
            assert episode.advice.title.endswith(episode.trajectory.task)
            assert episode.advice.id.startswith("wrong-")


def test_extractor_classes_fill_on_sokoban_whose_levels_share_one_task(backend):
    """Every Sokoban level has the same task sentence: its lessons are titled by the level's
    retrieval key (goal and layout), so a lesson with another level's moves under the level's
    own title is a wrong lesson (downvote)."""
    kwargs = {"num_boxes": 1, "max_solution_length": 6, "max_episode_steps": 10}
    episodes = extractor_episodes("CRL/Sokoban-v0", list(range(WARM_SEED, WARM_SEED + 64)), 8,
                                  noise=0.1, rng=random.Random(0), tokenizer=backend.tokenizer,
                                  max_context=backend.max_context, max_new_tokens=64,
                                  history=None, env_kwargs=kwargs)
    answered = [answer_class(e) for e in episodes]
    assert {name: answered.count(name) for name in ANSWER_CLASSES} == class_quotas(8)
    for episode in episodes:
        if episode.advice is not None:
            own = episode.advice.title.endswith(episode.trajectory.retrieval_key)
            assert own == (answer_class(episode) in ("upvote", "downvote"))


def test_hardening_warm_start_refuses_swebench_with_one_clear_error(backend):
    with pytest.raises(ValueError, match="No honest oracle reasons for CRL/SWEBenchToy-v0"):
        play_oracle_episode("CRL/SWEBenchToy-v0", 0, tokenizer=backend.tokenizer,
                            max_context=backend.max_context, max_new_tokens=64, history=None)


def _config(tiny, tmp_path, *overrides):
    return load_config("cpu-demo", [f"warmstart.model=hf:{tiny}", f"actor.model=hf:{tiny}",
                                    "extractor.model=same",
                                    f"run.output_dir={tmp_path}/run",
                                    f"warmstart.output_dir={tmp_path}/run/warmstart",
                                    "warmstart.episodes=3", "warmstart.extractor_samples=2",
                                    "warmstart.batch_size=2", "warmstart.lora.r=4",
                                    "warmstart.lora.top_layers=1",
                                    # the tiny tokenizer spells a reply in up to ~100 tokens
                                    "actor.max_new_tokens=128", "extractor.max_new_tokens=192",
                                    *overrides])


def test_warmstart_writes_adapters_that_load_and_lower_the_loss(tiny, tmp_path):
    cfg = _config(tiny, tmp_path, "warmstart.epochs=3")
    metrics = run_warmstart(cfg, log=lambda _: None)
    out = tmp_path / "run" / "warmstart"
    assert metrics["actor_loss_last"] < metrics["actor_loss_first"]
    assert json.loads((out / "metrics.json").read_text())["episodes"] == 3
    config = json.loads((out / "actor" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny)
    card = (out / "actor" / "README.md").read_text()  # filled, not peft's empty template
    assert "3 scripted-oracle episodes" in card and "- Made with: `crl warmstart " in card
    assert "More Information Needed" not in card
    warm = HFBackend(out / "actor")
    base = HFBackend(tiny)
    changed = [name for name, p in warm.model.state_dict().items()
               if not p.equal(base.model.state_dict()[name])]
    assert any("q_proj" in name for name in changed)
    # lora.top_layers=1 of the tiny model's 2 layers: layer 0 keeps the base weights
    assert changed and all("layers.1." in name for name in changed)
    assert all(p.requires_grad for p in warm.model.parameters())  # trainable, as a plain model
    assert (out / "extractor" / "adapter_model.safetensors").exists()
    assert not list(out.glob(".*"))  # no staging directory left behind
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "actor").stat().st_mode & 0o777 == 0o777 & ~umask  # readable as a checkout is
    assert (out / "actor" / "adapter_model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_warmstart_on_a_bf16_base_fits_fp32_adapters_and_lowers_the_loss(tiny, tmp_path,
                                                                          monkeypatch):
    from crl_harness.warmstart import sft

    loaded = []
    real_load = sft.load_backend

    def spy(spec, **kwargs):
        backend = real_load(spec, **kwargs)
        loaded.append(backend.model)
        return backend

    monkeypatch.setattr(sft, "load_backend", spy)
    metrics = run_warmstart(_config(tiny, tmp_path, "warmstart.epochs=3",
                                    "warmstart.dtype=bfloat16"), log=lambda _: None)
    assert metrics["actor_loss_last"] < metrics["actor_loss_first"]
    for model in loaded:  # actor and extractor: the base in bf16, the adapters trained in fp32
        dtypes = {(p.requires_grad, p.dtype) for p in model.parameters()}
        assert (True, torch.float32) in dtypes and (False, torch.bfloat16) in dtypes
        assert (True, torch.bfloat16) not in dtypes
    assert (tmp_path / "run" / "warmstart" / "actor" / "adapter_model.safetensors").exists()


def test_warmstart_only_extractor_keeps_the_actor_and_its_record(tiny, tmp_path):
    out = tmp_path / "run" / "warmstart"
    both = run_warmstart(_config(tiny, tmp_path, "warmstart.extractor_samples=4"),
                         log=lambda _: None)
    assert both["parts"] == ["actor", "extractor"]
    assert both["extractor_classes"] == {name: 1 for name in ANSWER_CLASSES}
    actor = (out / "actor" / "adapter_model.safetensors").read_bytes()
    extractor = (out / "extractor" / "adapter_model.safetensors").read_bytes()
    # alone, the extractor comes out as in a run of both (its own seeded data and fit)
    alone = run_warmstart(_config(tiny, tmp_path, "warmstart.extractor_samples=4"),
                          log=lambda _: None, only="extractor")
    assert (out / "extractor" / "adapter_model.safetensors").read_bytes() == extractor
    assert alone["parts"] == ["extractor"] and "actor_config" not in alone
    # other extractor settings: a new extractor, the same actor, the actor's record kept
    eight = run_warmstart(_config(tiny, tmp_path, "warmstart.extractor_samples=8",
                                  "warmstart.extractor_epochs=1"),
                          log=lambda _: None, only="extractor")
    assert len(eight["extractor_losses"]) == 4  # one pass of 8 samples in batches of 2
    assert (out / "actor" / "adapter_model.safetensors").read_bytes() == actor
    assert (out / "extractor" / "adapter_model.safetensors").read_bytes() != extractor
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["actor_losses"] == both["actor_losses"]
    assert metrics["actor_config"]["extractor_samples"] == 4  # what the actor was made with
    assert metrics["config"]["extractor_samples"] == 8
    assert metrics["extractor_classes"] == {name: 2 for name in ANSWER_CLASSES}
    # the actor made again alone: its old record goes, the extractor's settings are kept
    again = run_warmstart(_config(tiny, tmp_path, "warmstart.extractor_samples=4"),
                          log=lambda _: None, only="actor")
    assert "actor_config" not in again
    assert again["extractor_config"]["extractor_samples"] == 8
    assert again["extractor_classes"] == {name: 2 for name in ANSWER_CLASSES}


def test_warmstart_extractor_init_from_continues_a_made_extractor(tiny, tmp_path):
    settings = ("warmstart.extractor_samples=4", "warmstart.lr=0.01")
    first = run_warmstart(_config(tiny, tmp_path, *settings), log=lambda _: None,
                          only="extractor")
    made = tmp_path / "made"
    (tmp_path / "run" / "warmstart" / "extractor").rename(made)
    # the same samples in the same order again: fresh adapters start from the first fit's first
    # loss, continued ones lower
    fresh = run_warmstart(_config(tiny, tmp_path, *settings), log=lambda _: None,
                          only="extractor")
    assert fresh["extractor_losses"][0] == pytest.approx(first["extractor_losses"][0])
    cont = run_warmstart(_config(tiny, tmp_path, *settings,
                                 f"warmstart.extractor_init_from={made}"),
                         log=lambda _: None, only="extractor")
    # the first batch again: about 5.96 fresh, about 5.85 after the first fit's two epochs
    assert cont["extractor_losses"][0] < fresh["extractor_losses"][0] - 0.05
    assert cont["config"]["extractor_init_from"] == str(made)
    out = tmp_path / "run" / "warmstart" / "extractor"
    assert f"continuing the adapters of {made}" in (out / "README.md").read_text()
    shape = json.loads((out / "adapter_config.json").read_text())
    assert shape["r"] == json.loads((made / "adapter_config.json").read_text())["r"]


def test_hardening_warmstart_extractor_init_from_bad_values(tiny, tmp_path):
    other = tmp_path / "other-base"
    other.mkdir()
    (other / "adapter_config.json").write_text(json.dumps(
        {"base_model_name_or_path": str(tmp_path / "another-model")}))
    (other / "adapter_model.safetensors").write_bytes(b"")
    for override, match in ((f"warmstart.extractor_init_from={tmp_path}",
                             "warmstart.extractor_init_from.*not a LoRA adapter folder"),
                            (f"warmstart.extractor_init_from={tmp_path}/none",
                             "warmstart.extractor_init_from"),
                            (f"warmstart.extractor_init_from={other}",
                             "holds adapters of .*another-model, not of warmstart.model")):
        with pytest.raises(ConfigError, match=match):
            _config(tiny, tmp_path, override)
    with pytest.raises(ConfigError, match="extractor_init_from.*extractor_samples is 0"):
        _config(tiny, tmp_path, f"warmstart.extractor_init_from={other}",
                "warmstart.extractor_samples=0")
    made = tmp_path / "made"
    run_warmstart(_config(tiny, tmp_path, f"warmstart.output_dir={made}",
                          "warmstart.extractor_epochs=1"), log=lambda _: None, only="extractor")
    for only, overrides in (("actor", ()), (None, ("arm=none",))):
        with pytest.raises(WarmStartError, match="extractor_init_from is set but this warm start "
                                                 "fits no extractor"):
            run_warmstart(_config(tiny, tmp_path, *overrides,
                                  f"warmstart.extractor_init_from={made / 'extractor'}"),
                          log=lambda _: None, only=only)
    assert not (tmp_path / "run" / "warmstart").exists()  # nothing trained or written


def test_warmstart_extractor_merges_teach_the_merge_pass(tiny, tmp_path):
    out = run_warmstart(_config(tiny, tmp_path, "warmstart.extractor_lesson=key",
                                "warmstart.extractor_merges=4", "warmstart.extractor_epochs=1",
                                "extractor.max_new_tokens=512"),  # the tiny tokenizer's spelling
                        log=lambda _: None, only="extractor")
    # a quarter of the merge samples leave a chunk of distinct keys alone
    assert (out["extractor_classes"]["merge"], out["extractor_classes"]["merge return"]) == (3, 1)
    assert out["extractor_rows"] == 2 + 4
    assert out["config"]["extractor_merges"] == 4


def test_hardening_warmstart_extractor_merges_bad_values(tiny, tmp_path):
    for overrides, match in (
            (("warmstart.extractor_merges=4",), "extractor_merges.*extractor_lesson=key"),
            (("warmstart.extractor_merges=4", "warmstart.extractor_lesson=key",
              "warmstart.extractor_samples=0"), "extractor_merges.*extractor_samples is 0"),
            (("warmstart.extractor_merges=-1",), "extractor_merges"),
            (("warmstart.extractor_merges=5000",), "extractor_merges")):
        with pytest.raises(ConfigError, match=match):
            _config(tiny, tmp_path, *overrides)


def test_warmstart_lesson_fraction_teaches_the_actor_lessons(tiny, tmp_path):
    out = run_warmstart(_config(tiny, tmp_path, "warmstart.epochs=1",
                                "warmstart.experience_fraction=0", "warmstart.lesson_fraction=1"),
                        log=lambda _: None, only="actor")
    # cpu-demo's dark rooms: every level's key has a lesson, and the oracle's episodes win
    assert out["episodes_with_lesson"] == out["episodes_with_advice"] == out["episodes"] == 3
    assert out["config"]["lesson_fraction"] == 1

def test_hardening_warmstart_only_bad_values(tiny, tmp_path, capsys):
    from crl_harness.cli import main

    with pytest.raises(WarmStartError, match="only must be one of actor, extractor"):
        run_warmstart(_config(tiny, tmp_path), only="critic")
    with pytest.raises(SystemExit):
        main(["warmstart", "cpu-demo", "--only", "critic"])
    assert "invalid choice: 'critic'" in capsys.readouterr().err
    base = ["warmstart", "cpu-demo", f"warmstart.model=hf:{tiny}", "warmstart.lora.r=4",
            "warmstart.lora.top_layers=1", f"warmstart.output_dir={tmp_path}/w", "--only",
            "extractor"]
    for override in ("warmstart.extractor_samples=0", "arm=none"):
        assert main([*base, override]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert "--only extractor" in line and "warmstart.extractor_samples" in line
    assert not list((tmp_path / "w").iterdir())  # nothing trained or written
    # an oracle that never loses without noise gives no lost episode without an entry (only
    # another level's route can make it lose): said, nothing written
    with pytest.raises(WarmStartError, match=r"\(return 0 of 1\).*warmstart.noise"):
        run_warmstart(_config(tiny, tmp_path, "tasks.envs=[{id: CRL/Sokoban-v0}]",
                              "warmstart.noise=0", "warmstart.extractor_samples=4"),
                      log=lambda _: None, only="extractor")
    assert not (tmp_path / "run" / "warmstart" / "extractor").exists()


def test_hardening_warmstart_kill_keeps_the_previous_adapter(tiny, tmp_path, monkeypatch):
    cfg = _config(tiny, tmp_path, "warmstart.extractor_samples=0")
    run_warmstart(cfg, log=lambda _: None)
    adapter = tmp_path / "run" / "warmstart" / "actor" / "adapter_model.safetensors"
    before = adapter.read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # killed while writing the new adapter

    monkeypatch.setattr("safetensors.torch.save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        run_warmstart(_config(tiny, tmp_path, "warmstart.episodes=4",
                              "warmstart.extractor_samples=0"), log=lambda _: None)
    assert adapter.read_bytes() == before
    assert not list(adapter.parent.parent.glob(".*"))


def test_hardening_warmstart_bad_configs(tiny, tmp_path):
    with pytest.raises(WarmStartError, match="CRL/SWEBenchToy-v0 has none.*remove it"):
        run_warmstart(_config(tiny, tmp_path, "tasks.envs=[{id: CRL/SWEBenchToy-v0}]"))
    with pytest.raises(WarmStartError, match="raise actor.max_new_tokens"):
        run_warmstart(_config(tiny, tmp_path, "actor.max_new_tokens=8"))  # targets would be cut
    with pytest.raises(WarmStartError, match="extractor reply is .* raise extractor.max_new_tokens"):
        run_warmstart(_config(tiny, tmp_path, "extractor.max_new_tokens=8"), log=lambda _: None)
    for override, match in (("warmstart.noise=1.5", "warmstart.noise"),
                            ("warmstart.dtype=int8", "warmstart.dtype"),
                            ("warmstart.episodes=0", "warmstart.episodes"),
                            ("warmstart.extractor_epochs=0", "warmstart.extractor_epochs"),
                            ("warmstart.lora.enabled=false", "LoRA adapters only"),
                            ("warmstart.seed_offset=0", "warm-start seeds"),
                            ("tasks.heldout_offset=2", "held-out seeds"),
                            ("tasks.heldout_offset=-1", "tasks.heldout_offset")):
        with pytest.raises(ConfigError, match=match):
            _config(tiny, tmp_path, override)


def test_hardening_crl_warmstart_command_errors(tiny, tmp_path, capsys):
    from crl_harness.cli import main

    assert main(["warmstart", "cpu-demo", "warmstart.noise=2"]) == 2
    assert "warmstart.noise" in capsys.readouterr().err
    assert main(["warmstart", "cpu-demo", f"warmstart.model=hf:{tiny}",
                 f"warmstart.output_dir={tmp_path}/w", "tasks.envs=[{id: CRL/SWEBenchToy-v0}]",
                 "warmstart.lora.top_layers=1"]) == 2
    assert "CRL/SWEBenchToy-v0 has none" in capsys.readouterr().err
    assert not (tmp_path / "w" / "actor").exists()


def test_hardening_warmstart_replaces_only_what_it_wrote(tiny, tmp_path, capsys):
    from crl_harness.cli import main

    models = tmp_path / "models"  # warmstart.output_dir=~/models: a folder of other things
    for name in ("actor", "extractor"):
        (models / name).mkdir(parents=True)
        (models / name / "weights.bin").write_text(f"someone's {name}")
    cfg = _config(tiny, tmp_path, f"warmstart.output_dir={models}")
    with pytest.raises(WarmStartError, match=f"{models / 'actor'} exists and is not what"):
        run_warmstart(cfg, log=lambda _: None)
    (models / "actor" / "weights.bin").unlink()  # an empty folder loses nothing; extractor/ would
    assert main(["warmstart", "cpu-demo", f"warmstart.model=hf:{tiny}", "warmstart.lora.r=4",
                 "warmstart.lora.top_layers=1", f"warmstart.output_dir={models}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"{models / 'extractor'} exists" in line and "warmstart.output_dir" in line
    (models / "extractor" / "weights.bin").unlink()
    (models / "metrics.json").write_text('{"mine": 1}')
    with pytest.raises(WarmStartError, match="metrics.json exists"):
        run_warmstart(cfg, log=lambda _: None)
    assert (models / "metrics.json").read_text() == '{"mine": 1}'
    assert sorted(p.name for p in models.iterdir()) == ["actor", "extractor", "metrics.json"]


def test_hardening_missing_warm_start_says_how_to_make_it():
    from crl_harness.models.base import ModelNotFoundError
    from crl_harness.models.registry import load_backend

    with pytest.raises(ModelNotFoundError, match="crl warmstart"):
        load_backend("hf:assets/warmstart/no-such-run/actor")


def test_demo_warm_starts_trains_and_reports_before_and_after(tiny, tmp_path, capsys):
    from crl_harness.commands.demo import train_and_evaluate
    from crl_harness.config import load_config

    cfg = load_config("cpu-demo", [
        f"warmstart.model=hf:{tiny}", f"warmstart.output_dir={tmp_path}/w",
        f"run.output_dir={tmp_path}/demo/run", "run.steps=2", "run.tensorboard=false",
        "warmstart.episodes=2", "warmstart.extractor_samples=1", "warmstart.epochs=1",
        "warmstart.lora.top_layers=1", "warmstart.lora.r=4",
        "tasks.envs.0.kwargs.max_episode_steps=2", "actor.max_new_tokens=128",
        "extractor.max_new_tokens=192", "extractor.train_after=1"])
    train_and_evaluate(cfg, 2, tmp_path / "demo", cache=tmp_path / "cache")
    out = capsys.readouterr().out
    assert (tmp_path / "w" / "actor" / "adapter_config.json").exists()  # warm start ran first
    assert "held-out" in out and "training" in out and "bank:" in out
    # every case of a phase played in one batch, reported apart
    for case, seeds in (("before/held-out", [50_000_000, 50_000_001]), ("before/training", [0, 1]),
                        ("after/held-out", [50_000_000, 50_000_001]),
                        ("after/training", [0, 1])):
        phase, name = case.split("/")
        report = json.loads((tmp_path / "demo" / f"eval-{phase}" / name / "report.json")
                            .read_text())
        assert [e["seed"] for e in report["episodes"]] == seeds
