"""Warm-start data: scripted-oracle episodes rendered exactly as the rollout engine renders them.

Holds ``play_oracle_episode`` (one episode through the engine's own ``LiveEpisode``: same env
wrappers, system prompt, history and chat template; the replies are the oracle's actions with a
reason read from the observations), ``earlier_route`` (an earlier attempt at a level and its
route lesson, ``crl_harness.warmstart.routes``), ``actor_episodes`` (the mix of plain, noisy,
advised and lesson-following episodes: ``crl_harness.warmstart.lessons``),
``extractor_episodes`` (episodes for the extractor, as many of each answer class as of the
others), ``answer_class``, ``extractor_prompt`` (the Experience Manager's distillation prompt
for an episode), ``taught_answer`` (the operations answer built from its transcript) and
``extractor_sample`` (the two as a training sample).
"""

from __future__ import annotations

import json
import random
import re
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any

from crl_envs.oracles import make_oracle
from crl_harness.experience.distill import DistillationRequest, distill_prompt
from crl_harness.experience.entries import ExperienceEntry
from crl_harness.models.base import encode_chat
from crl_harness.rollout import EpisodeSpec, LiveEpisode, Trajectory, Turn, make_env, transcript_of
from crl_harness.warmstart.lessons import KeyLessons, LessonTurns
from crl_harness.warmstart.quotas import adds_per_key, class_quotas
from crl_harness.warmstart.reasons import REASONS, random_reason
from crl_harness.warmstart.routes import (
    advice_check,
    route_advice,
    route_content,
    route_moves,
    winning_route,
)

__all__ = ["AdvisedEpisode", "earlier_route",
           "play_oracle_episode", "actor_episodes", "answer_case", "answer_class",
           "EXTRACTOR_LESSONS", "extractor_episodes", "extractor_prompt",
           "extractor_sample", "reply_ids", "taught_answer"]

EARLIER_ATTEMPT_STEPS = 40  # the attempt an advice entry is written from explores without hurry
STRAY_NOISE = 1.0
"""the noise of the extra episode ``extractor_episodes`` plays for a lost class when the oracle
recovered from ``noise`` (WebShop's and ALFWorld's do: a random click or step rarely hurts)"""
_PLACEHOLDER = re.compile(r"\[<\w+>\]$")  # WebShop's "search[<query>]": a form, not an action
FOREIGN_SHARE = 1 / 2  # of the advised episodes: shown another level's route, taught to set it aside
MISLED_SHARE = 1 / 3  # of the extractor's return samples: misled by another level's route
EXTRACTOR_LESSONS = ("route", "key")
"""what ``extractor_episodes`` teaches to add and follows for the votes: the level's own
route, or the env's transferable lesson of its key (``KeyLessons``) where it writes one"""

@dataclass
class AdvisedEpisode:
    """A played warm-start episode and the entry its system prompt carried (if any)."""

    trajectory: Trajectory
    advice: ExperienceEntry | None = None
    followed: bool = True  # False: the entry was another level's and the episode set it aside
    lesson: bool = False  # the entry is the env's transferable lesson of the level's key
    own: ExperienceEntry | None = None
    """the lesson an ``add`` teaches (``extractor_lesson`` ``key``: the env's lesson of the
    level's key); None: the level's own route (``_own_lesson``)"""


class _FixedAdvice:
    """A retriever that hands every episode the same entry (the episode's own advice)."""

    def __init__(self, entry: ExperienceEntry) -> None:
        self.entry = entry

    def retrieve(self, env_id: str, query: str, k: int) -> list[ExperienceEntry]:
        return [self.entry][:k]


def reply_ids(tokenizer: Any, text: str) -> list[int]:
    """The token ids a model emits for ``text``, ending with the EOS that stops generation."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def play_oracle_episode(env_id: str, seed: int, *, tokenizer: Any, max_context: int,
                        max_new_tokens: int, history: int | None,
                        env_kwargs: dict[str, Any] | None = None,
                        options: dict[str, Any] | None = None, noise: float = 0.0,
                        rng: random.Random | None = None,
                        advice: ExperienceEntry | None = None,
                        route: list[str] | None = None, lesson: bool = False) -> Trajectory:
    """Play one episode with the scripted oracle, recording each turn as the engine would.

    Each turn's prompt is what ``RolloutEngine`` would send (``LiveEpisode``'s conversation,
    trimmed to ``max_context - max_new_tokens``, encoded with the chat template); the reply is
    ``<think>REASON</think><answer>ACTION</answer>`` + EOS, the reason from ``REASONS`` (given
    the episode's observations so far). With probability ``noise`` a turn plays and teaches a
    random allowed action instead (a form such as ``search[<query>]`` is not one). With ``advice`` the system prompt
    carries the entry, and for the first ``len(route)`` turns it plays the route's moves (the
    ones the advice names) and says so; with ``advice`` and no ``route`` the entry is another
    level's, and the first reason says it is set aside. With ``lesson`` the entry is the env's
    transferable lesson of the level's key (``crl_envs.transferable_lesson``), played by its
    policy (``LessonTurns``): its moves, and on the turn the goal comes into view, where the
    lesson says to break off, the walk to it; once the policy says no more, the oracle plays on.
    """
    if env_id not in REASONS:
        raise ValueError(f"No honest oracle reasons for {env_id}; warm start supports "
                         f"{', '.join(REASONS)}.")
    if lesson and (advice is None or route is not None):
        raise ValueError("lesson=True plays the advice's lesson: give advice and no route")
    lesson_turns = LessonTurns(env_id, advice) if lesson else None
    rng = rng or random.Random(seed)
    env = make_env(env_id, _FixedAdvice(advice) if advice else None, 1, **(env_kwargs or {}))
    try:
        episode = LiveEpisode(EpisodeSpec(env_id, seed, use_experience=advice is not None,
                                          options=options), env, history)
        episode.reset(with_experience_option=advice is not None)
        oracle = make_oracle(env_id, env)
        oracle.reset(episode.observation, episode.info)
        budget = max_context - max_new_tokens
        traj = episode.trajectory
        left_plan = False  # a route or lesson move left the oracle's plan
        state = episode.observation  # the last observation of a move the env took
        while not episode.done and traj.steps < episode.max_turns:
            observation, info = episode.observation, episode.info
            earlier = [t.observation for t in traj.turns]
            t = traj.steps
            allowed = [a for a in info.get("admissible_actions") or [] if not _PLACEHOLDER.search(a)]
            planned: str | None = None  # the oracle's move, where asked (a noise turn does not)
            check = advice_check(advice, observation) if advice is not None and t == 0 else None
            # the lesson's turn, until it says no more: then the oracle plays on
            said = lesson_turns.next(observation, earlier, check) if lesson_turns else None
            following = said is not None or (route is not None and t < len(route))
            if following and not left_plan:  # once a move left the oracle's plan, no need to ask
                planned = oracle.act(observation, info)
            if said is not None:
                action, reason = said
            elif route is not None and t < len(route):
                action = route[t]
                # a long move (WebShop's search of a whole instruction) is not said twice
                named = f" is {action}" if len(action) <= 40 else ""
                reason = (f"{check}: mine; its move 1 of {len(route)}{named}." if check else
                          f"The advice's winning moves: move {t + 1} of {len(route)}{named}.")
            elif noise and allowed and rng.random() < noise:
                action = rng.choice(allowed)
                reason = random_reason(observation, action, earlier)
            else:
                planned = action = oracle.act(observation, info)
                reason = REASONS[env_id](observation, action, earlier)
            if advice is not None and route is None and not lesson and t == 0:
                # the check, then the move alone: with the move's own reason too, the reply
                # outgrows cpu-demo's 64 new tokens
                reason = (f"{check}: set aside; I play {action}." if check
                          else f"Advice for another level: set aside. {reason}")
            text = f"<think>{reason}</think><answer>{action}</answer>"
            messages = episode.conversation.messages(
                budget, lambda m: len(encode_chat(tokenizer, m)))
            ids = reply_ids(tokenizer, text)
            turn = Turn(prompt_token_ids=encode_chat(tokenizer, messages), token_ids=ids,
                        logprobs=[0.0] * len(ids), text=text, action=action,
                        observation=observation)
            traj.turns.append(turn)
            traj.steps += 1
            episode.conversation.reply(text)
            episode.step(turn)
            if episode.info.get("action_valid", True):
                state = episode.observation
            if action != planned:
                # The oracle learns blocked moves from its own last move; after a move it did
                # not choose, it starts afresh from the state now: an invalid move left it as
                # it was, and its message (no map) is no state to plan from.
                left_plan = following
                oracle.reset(state, episode.info)
        traj.transcript = transcript_of(traj.task, traj.turns, traj.won, traj.score,
                                        level=traj.retrieval_key, env_id=traj.env_id)
        return traj
    finally:
        env.close()


def earlier_route(env_id: str, seed: int, **play: Any) -> tuple[ExperienceEntry, list[str]] | None:
    """An earlier attempt at level ``seed``: the oracle plays without noise and without hurry
    (at least ``EARLIER_ATTEMPT_STEPS``); if it wins, its ``winning_route`` and the entry
    ``route_advice`` writes of it (id ``route-SEED``)."""
    kwargs = play.get("env_kwargs") or {}
    steps = max(EARLIER_ATTEMPT_STEPS, kwargs.get("max_episode_steps") or 0)
    attempt = play_oracle_episode(env_id, seed, **{**play, "env_kwargs": {
        **kwargs, "max_episode_steps": steps}})
    if not attempt.won:
        return None
    route = winning_route(attempt)
    return route_advice(env_id, attempt.turns[0].observation, route, entry_id=f"route-{seed}",
                        task=attempt.task, key=attempt.retrieval_key), route


def actor_episodes(env_id: str, seeds: list[int], *, noise: float, experience_fraction: float,
                   rng: random.Random, lesson_fraction: float = 0.0,
                   **play: Any) -> list[AdvisedEpisode]:
    """One episode per seed. ``lesson_fraction`` of them, where the env writes a transferable
    lesson for the level's key (``crl_envs.transferable_lesson``), carry that lesson and follow
    it until the goal comes into view, then walk to it (``play_oracle_episode``'s ``lesson``;
    the actor learns to break a lesson off, not only to play a route to its end); one that does
    not win that way, or a level without such a lesson, is drawn as the others are. Of the
    others, ``experience_fraction`` carry an entry: mostly the route that an earlier, unhurried,
    noise-free attempt at the same level found, which the episode follows (if following it does
    not win, a plain episode replaces it: the actor only learns to follow advice that is right);
    ``FOREIGN_SHARE`` of them another level's route, which the episode sets aside (a bank holds
    entries of other levels; retrieval can bring one). The others play with ``noise``. With
    ``lesson_fraction`` 0 no lesson is drawn: the episodes (and ``rng``'s draws) are those of a
    warm start without the setting."""
    episodes: list[AdvisedEpisode] = []
    own_routes: list[ExperienceEntry] = []
    with closing(KeyLessons(env_id, play.get("env_kwargs"), play.get("options"))) as lessons:
        for seed in seeds:
            # no draw at 0: the other episodes stay what they were before the setting
            if lesson_fraction and rng.random() < lesson_fraction:
                lesson = lessons(seed)
                if lesson is not None:
                    traj = play_oracle_episode(env_id, seed, rng=rng, advice=lesson, lesson=True,
                                               **play)
                    if traj.won:
                        episodes.append(AdvisedEpisode(traj, lesson, lesson=True))
                        continue
            if rng.random() < experience_fraction:
                found = earlier_route(env_id, seed, **play)
                if found is not None:
                    entry, route = found
                    foreign = [e for e in own_routes if e.title != entry.title]
                    if foreign and rng.random() < FOREIGN_SHARE:
                        other = rng.choice(foreign)
                        episodes.append(AdvisedEpisode(play_oracle_episode(
                            env_id, seed, noise=noise, rng=rng, advice=other, **play), other,
                            followed=False))
                        continue
                    own_routes.append(entry)
                    traj = play_oracle_episode(env_id, seed, rng=rng, advice=entry, route=route,
                                               **play)
                    if traj.won:
                        episodes.append(AdvisedEpisode(traj, entry))
                        continue
            episodes.append(AdvisedEpisode(play_oracle_episode(env_id, seed, noise=noise,
                                                               rng=rng, **play)))
    return episodes


def answer_class(episode: AdvisedEpisode) -> str:
    """The operation ``extractor_sample`` answers ``episode`` with: a won episode upvotes the
    entry it followed (``upvote``) or adds its own route (``add``); a lost one downvotes the entry
    it followed if the entry is its own level's (``downvote``: the lesson is wrong), and otherwise
    changes nothing (``return``): another level's route that misled the episode is right for its
    own level (a downvote deletes an entry with no votes, and levels whose keys look alike would
    delete each other's lessons). An entry set aside counts as none."""
    followed = episode.advice is not None and episode.followed
    if episode.trajectory.won:
        return "upvote" if followed else "add"
    own = (followed and bool(episode.trajectory.turns)
           and episode.advice.title == (episode.own or _own_lesson(episode.trajectory)).title)
    return "downvote" if own else "return"


def answer_case(episode: AdvisedEpisode) -> str:
    """``answer_class``, with ``misled`` for the returns of episodes that followed another
    level's route (the share of the return class ``extractor_episodes`` fills apart)."""
    name = answer_class(episode)
    misled = name == "return" and episode.advice is not None and episode.followed
    return "misled" if misled else name


def extractor_episodes(env_id: str, seeds: list[int], count: int, *, noise: float,
                       rng: random.Random, lesson: str = "route",
                       **play: Any) -> list[AdvisedEpisode]:
    """Episodes whose ``extractor_sample`` answers are balanced over ``ANSWER_CLASSES``
    (``class_quotas(count, lesson)``), from consecutive levels of ``seeds`` until every class is full:

    - ``add`` / ``return``: an episode with ``noise`` that won / lost, ``FOREIGN_SHARE`` of them
      shown another level's route, which they set aside (its title is not the episode's
      ``Level``): the answer is the episode's own, as without it (without such samples a warm
      extractor upvoted another level's route that a won episode had set aside, and the level
      never got a lesson of its own);
    - ``return``, ``MISLED_SHARE`` of them (rounded down): an episode that followed another
      level's route (retrieval brought it; the actor took it for its own), then played on with
      ``noise``, and lost: the route is not at fault (a downvote deletes an entry with no votes,
      and levels whose first views look alike would delete each other's lessons);
    - ``upvote``: an episode that followed its own level's route (an earlier, unhurried attempt's,
      as ``actor_episodes`` advises) and won;
    - ``downvote``: an episode that followed a wrong lesson of its own level (its title, another
      level's moves: a lesson written from the wrong moves), then played on, and lost.

    With ``lesson`` ``key`` (``EXTRACTOR_LESSONS``), on a level whose env writes a transferable
    lesson for its key (``KeyLessons``), that lesson takes the route's place: an ``add`` teaches
    it (``AdvisedEpisode.own``), the ``upvote`` episode follows it by its policy
    (``play_oracle_episode``'s ``lesson``), the ``downvote`` one follows another key's lesson
    under this key's title, and the routes shown or misled by are other keys' lessons; a level
    without one keeps its route; the adds take ``KEY_ADD_SHARE`` of ``count`` and no key gets
    more than ``adds_per_key`` of them.

    Where the oracle recovers from ``noise`` (a random WebShop click or ALFWorld step rarely
    costs the episode), a lost class that is still wanted gets one more episode of the level,
    played on at ``STRAY_NOISE`` (after the route, for a followed one): an agent that wanders and
    loses, the case the answer is for. With ``noise`` 0 none wanders: the oracle's episodes
    alone.

    Without balance the extractor learns the frequent answer for every episode (24 samples
    drawn from the actor's episodes, most of them won with an entry, taught ``upvote`` to
    everything). Returns fewer of a class when ``seeds`` run out first (the caller checks)."""
    if lesson not in EXTRACTOR_LESSONS:
        raise ValueError(f"lesson must be one of {', '.join(EXTRACTOR_LESSONS)}, got {lesson!r}")
    quotas = class_quotas(count, lesson)
    key_cap = adds_per_key(quotas["add"])
    misled_quota = int(quotas["return"] * MISLED_SHARE)
    # "misled" is a share of the return class, filled apart so that plain losses cannot crowd it
    slots = {**quotas, "return": quotas["return"] - misled_quota, "misled": misled_quota}
    found: dict[str, list[AdvisedEpisode]] = {name: [] for name in slots}

    def wants(name: str) -> bool:
        return len(found[name]) < slots[name]

    def following(entry: ExperienceEntry, moves: list[str], keyed: bool) -> dict[str, Any]:
        """How an episode follows ``entry``: a key's lesson by its policy, a route move by move."""
        return {"advice": entry, "lesson": True} if keyed else {"advice": entry, "route": moves}

    def lost_following(seed: int, slot: str, follow: dict[str, Any]) -> None:
        """Play ``seed`` following ``follow``'s advice until an episode loses."""
        for level_noise in (noise, STRAY_NOISE) if 0 < noise < STRAY_NOISE else (noise,):
            episode = AdvisedEpisode(play_oracle_episode(
                env_id, seed, noise=level_noise, rng=rng, **follow, **play), follow["advice"])
            if not episode.trajectory.won:
                found[slot].append(episode)
                return

    # earlier levels' lessons: winning routes, or key lessons (keyed) with their moves
    routes: list[tuple[ExperienceEntry, list[str], bool]] = []
    with closing(KeyLessons(env_id, play.get("env_kwargs"), play.get("options"))) as lessons:
        for seed in seeds:
            if not any(wants(name) for name in slots):
                break
            # read only where asked: a route warm start opens no env for it
            key_lesson = lessons(seed) if lesson == "key" else None
            if wants("add") or wants("return"):
                # FOREIGN_SHARE are shown another level's route (retrieval can bring one),
                # which the episode sets aside: the answer is still the episode's own
                other = rng.choice(routes)[0] if routes and rng.random() < FOREIGN_SHARE else None
                plain = AdvisedEpisode(play_oracle_episode(env_id, seed, noise=noise, rng=rng,
                                                           advice=other, **play), other,
                                       followed=False, own=key_lesson)
                if other is not None and other.title == _own_lesson(plain.trajectory).title:
                    # an earlier level with this level's key: its route is no other level's
                    plain = AdvisedEpisode(play_oracle_episode(env_id, seed, noise=noise,
                                                               rng=rng, **play), own=key_lesson)
                name = answer_class(plain)
                key_full = name == "add" and key_lesson is not None and key_cap <= sum(
                    e.own.title == key_lesson.title for e in found["add"] if e.own)
                if wants(name) and not key_full:
                    found[name].append(plain)
                if plain.trajectory.won and wants("return") and 0 < noise < STRAY_NOISE:
                    stray = AdvisedEpisode(play_oracle_episode(env_id, seed, noise=STRAY_NOISE,
                                                               rng=rng, **play))
                    if answer_class(stray) == "return":
                        found["return"].append(stray)
            if not (wants("upvote") or wants("downvote") or wants("misled")):
                continue
            keyed = key_lesson is not None
            earlier = ((key_lesson, route_moves(key_lesson.content) or []) if keyed
                       else earlier_route(env_id, seed, **play))
            if earlier is None:
                continue
            entry, route = earlier
            foreign = [known for known in routes if known[0].title != entry.title]
            routes.append((entry, route, keyed))
            if wants("upvote"):
                own = AdvisedEpisode(play_oracle_episode(
                    env_id, seed, rng=rng, **following(entry, route, keyed), **play), entry,
                    lesson=keyed, own=key_lesson)
                if answer_class(own) == "upvote":
                    found["upvote"].append(own)
            if not foreign or not (wants("downvote") or wants("misled")):
                continue
            other, moves, other_keyed = rng.choice(foreign)
            if wants("downvote") and moves != route:
                # the level's title over another level's moves (a key lesson: its whole text)
                wrong = replace(entry, id=f"wrong-{seed}",
                                content=other.content if keyed else route_content(moves))
                lost_following(seed, "downvote", following(wrong, moves, keyed))
            if wants("misled"):
                lost_following(seed, "misled", following(other, moves, other_keyed))
    return [episode for name in ("add", "return", "misled", "upvote", "downvote")
            for episode in found[name]]


def _own_lesson(trajectory: Trajectory) -> ExperienceEntry:
    """The lesson ``route_advice`` writes for the trajectory's level: the shortest route its
    observations show where the env has one (``winning_route``: what the transcript's
    "[Shortest route to the goal]" line says, and the routes the actor learnt to follow), else
    its moves as played."""
    moves = winning_route(trajectory) if trajectory.won else \
        [t.action or "" for t in trajectory.turns]
    return route_advice(trajectory.env_id, trajectory.turns[0].observation, moves,
                        task=trajectory.task, key=trajectory.retrieval_key)


def taught_answer(episode: AdvisedEpisode) -> str:
    """The answer the warm start teaches for ``episode`` (``answer_class``): a won episode
    upvotes the entry it followed, or adds its own route (the shortest the transcript states,
    "[Shortest route to the goal]", else its moves as played: a lesson the extractor can copy
    from the transcript it reads); a lost one downvotes the entry it
    followed if that is its level's own, or changes nothing."""
    kind = answer_class(episode)
    ops: list[dict[str, Any]]
    if kind == "add":
        lesson = episode.own or _own_lesson(episode.trajectory)
        ops = [{"op": "add", "title": lesson.title, "content": lesson.content}]
    elif kind == "return":
        ops = [{"op": "return"}]
    else:
        ops = [{"op": kind, "target_idx": 0}]
    return f"<answer>{json.dumps(ops)}</answer>"


def extractor_prompt(episode: AdvisedEpisode, *, max_ops: int, max_transcript_chars: int) -> str:
    """The distillation prompt the Experience Manager builds for ``episode``, with the entry it
    was shown (if any) numbered 0."""
    traj = episode.trajectory
    shown = [episode.advice] if episode.advice is not None else []
    request = DistillationRequest(traj.env_id, traj.task, traj.transcript, traj.won, traj.score,
                                  [e.id for e in shown])
    return distill_prompt(request, shown, max_ops=max_ops,
                          max_transcript_chars=max_transcript_chars)


def extractor_sample(episode: AdvisedEpisode, *, tokenizer: Any, max_ops: int,
                     max_transcript_chars: int) -> Turn:
    """The ``extractor_prompt`` (chat-encoded as the extractor receives it) and the
    ``taught_answer``."""
    prompt = extractor_prompt(episode, max_ops=max_ops, max_transcript_chars=max_transcript_chars)
    text = taught_answer(episode)
    ids = reply_ids(tokenizer, text)
    return Turn(prompt_token_ids=encode_chat(tokenizer, [{"role": "user", "content": prompt}]),
                token_ids=ids, logprobs=[0.0] * len(ids), text=text)
