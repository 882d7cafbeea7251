"""One episode being played, and the env it is played on.

Holds:
- ``LiveEpisode``: an episode's env, its conversation (the prompts exactly as the engine renders
  them) and its trajectory so far; the engine drives it, and so do the warm start and the TRL
  adapter;
- ``make_env``: ``gym.make``, wrapped in ``ExperienceAugmentation`` when a retriever is given
  (by default the experience stays in ``info``: the episode places it in its system prompt);
- ``task_id_of``: an episode's task id (the env's own, else ``ENV_ID:SEED``).

Importing it registers the CRL env ids (``crl_envs``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_harness.experience.entries import clean_text
from crl_harness.models.base import Message, chat_text, continued_prompt_ids
from crl_harness.prompting import (
    ANSWER_FORMAT,
    EXPERIENCE_SHARE,
    Conversation,
    cut_experience,
    system_prompt,
)
from crl_harness.rollout.records import EpisodeSpec, Trajectory, Turn
from crl_wrappers.experience import ExperienceAugmentation, Retriever, with_experience

__all__ = ["LiveEpisode", "make_env", "task_id_of"]


def make_env(env_id: str, retriever: Retriever | None = None, experience_k: int = 1,
             placement: str = "info", **kwargs: Any) -> gym.Env:
    """``gym.make(env_id)``, wrapped in ``ExperienceAugmentation`` when a retriever is given.

    ``placement``: the wrapper's. ``"info"`` (for ``LiveEpisode``, which places the experience
    itself) leaves the observation and the instructions as the env wrote them; an agent that
    reads ``info["instructions"]`` wants ``"instructions"``."""
    env = gym.make(env_id, **kwargs)
    if retriever is not None:
        env = ExperienceAugmentation(env, retriever, k=experience_k, placement=placement)
    return env


def task_id_of(env_id: str, seed: int, info: dict[str, Any]) -> str:
    """The env's own task id when it has one (e.g. an SWE-bench instance), else ``ENV_ID:SEED``."""
    return str(info.get("task_id") or f"{env_id}:{seed}")


class LiveEpisode:
    """One episode being played: its env, its conversation (the prompts exactly as the engine
    renders them) and its trajectory so far. The engine drives it; so does the warm start,
    which replays scripted oracles through the same rendering.

    ``tools``: a block appended to the system prompt (the search-and-ask instructions of a
    guided episode). ``answer_format``: how the system prompt asks the agent to answer
    (``prompting.ANSWER_FORMAT``; the TRL adapter's asks for a tool call).

    The env is ``make_env``'s: its experience, if any, comes in ``info["experience"]`` only, and
    the system prompt places it after the env's instructions (``with_experience``, the wrapper's
    own rendering of ``placement="instructions"``). ``experience`` is the text the system prompt
    carries; ``set_experience`` replaces it before the first turn (the actor-critic gate's
    verdict). ``fit_experience`` cuts it to what the context leaves room for (the engine calls
    it before the first prompt), keeping the ids of the entries still shown.

    Text enters the prompts as valid Unicode (``clean_text``): a lone surrogate, which a JSON
    escape in a model's reply or a foreign env can produce, makes a tokenizer raise, and would
    end every episode of the batch with it.
    """

    def __init__(self, spec: EpisodeSpec, env: gym.Env, history: int | None,
                 tools: str = "", answer_format: str = ANSWER_FORMAT) -> None:
        self.spec = spec
        self.env = env
        self.history = history
        self.tools = tools
        self.answer_format = answer_format
        self.max_turns = env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 50
        self.trajectory = Trajectory.of(spec)
        self.conversation = Conversation("", history)
        self.observation = ""  # what the agent sees next (the state, or a note and the state)
        self.state = ""  # the env's latest observation
        self.info: dict[str, Any] = {}  # the env's info of the latest reset or step
        self.done = False
        self.instructions = ""  # the env's instructions
        self.experience = ""
        # the experience as units that can be cut apart: (text, ids of the entries it shows)
        self._experience_units: list[tuple[str, list[str]]] = []
        self.task_line = ""  # the task, when the observation does not already state it
        self.answered_asks = 0
        self._prompt: tuple[str, list[int]] | None = None  # the last prompt's text and ids

    def reset(self, with_experience_option: bool) -> None:
        options = dict(self.spec.options or {})
        if with_experience_option:
            options["use_experience"] = self.spec.use_experience
        observation, info = self.env.reset(seed=self.spec.seed, options=options)
        self.info = info
        self.instructions = clean_text(info.get("instructions")
                                       or getattr(self.env.unwrapped, "instructions", ""))
        self.experience = clean_text(info.get("experience", "") or "")
        observation = clean_text(observation)
        task = clean_text(info.get("task", "") or "")
        self.task_line = "" if task in observation else task
        self.trajectory.task = task
        self.trajectory.task_id = task_id_of(self.spec.env_id, self.spec.seed, info)
        self.trajectory.retrieval_key = str(info.get("retrieval_query") or "")
        self.trajectory.experience_ids = list(info.get("experience_ids", []))
        self.trajectory.experience = self.experience
        ids, texts = self.trajectory.experience_ids, info.get("experience_texts")
        lines = [f"- {clean_text(t)}" for t in texts or ()]
        if len(lines) == len(ids) and "\n".join(lines) == self.experience:
            self._experience_units = [(line, [i]) for line, i in zip(lines, ids, strict=True)]
        else:  # a retriever's text without its items: cut as one block
            self._experience_units = [(self.experience, list(ids))] if self.experience else []
        self.conversation = Conversation(self._system(), self.history)
        self.state = observation
        self.observe(observation)

    def prompt_ids(self, tokenizer: Any, messages: list[Message], budget: int) -> list[int]:
        """The token ids of the next prompt, ``messages``: the last prompt's ids and its sampled
        reply as they were, then the new turn tokenised (``continued_prompt_ids``), when the
        conversation only grew and that fits ``budget``; else ``messages`` tokenised afresh (the
        first turn, a trimmed history, a system prompt the gate changed)."""
        text = chat_text(tokenizer, messages)
        ids = None
        turns = self.trajectory.turns
        if self._prompt is not None and turns and turns[-1].prompt_token_ids == self._prompt[1]:
            ids = continued_prompt_ids(tokenizer, text, *self._prompt, turns[-1].token_ids)
            if ids is not None and len(ids) > budget:
                ids = None
        if ids is None:
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        self._prompt = (text, ids)
        return ids

    def task_prompt(self) -> str:
        """The system prompt without experience or tools (what the gate shows as the task)."""
        return system_prompt(self.instructions, "", task=self.task_line,
                             answer_format=self.answer_format)

    def set_experience(self, text: str) -> None:
        """Replace the experience of the system prompt (before the first turn)."""
        self.experience = clean_text(text)
        ids = list(self.trajectory.experience_ids)
        self._experience_units = [(self.experience, ids)] if self.experience else []
        self.conversation.system = self._system()

    def fit_experience(self, budget: int, count_tokens: Callable[[list[Message]], int]) -> None:
        """Cut the experience (before the first turn) so that it takes at most
        ``EXPERIENCE_SHARE`` of the ``budget`` tokens that the first prompt without it leaves:
        the best entries whole, else the head of the first, and a note that says it was cut
        (``cut_experience``). Only the entries still shown stay in ``experience_ids`` (credit
        goes to what was used). Without this the system prompt, which history trimming always
        keeps, outgrows the context once entries are many or long."""
        if not self.experience:
            return
        base = count_tokens(self._first_prompt(""))
        allowed = base + int(max(0, budget - base) * EXPERIENCE_SHARE)
        units = [text for text, _ in self._experience_units]
        text, shown = cut_experience(
            units, lambda experience: count_tokens(self._first_prompt(experience)) <= allowed)
        if shown == len(units) and text == self.experience:
            return
        self.experience = text
        self.trajectory.experience_ids = [i for _, ids in self._experience_units[:shown]
                                          for i in ids]
        self.conversation.system = self._system()

    def _first_prompt(self, experience: str) -> list[Message]:
        return [{"role": "system", "content": self._system(experience)},
                {"role": "user", "content": self.observation}]

    def _system(self, experience: str | None = None) -> str:
        experience = self.experience if experience is None else experience
        system = system_prompt(with_experience(self.instructions, experience),
                               task=self.task_line, answer_format=self.answer_format)
        return f"{system}\n\n{self.tools}" if self.tools else system

    def observe(self, observation: str) -> None:
        self.observation = clean_text(observation)
        self.conversation.observe(self.observation)

    def step(self, turn: Turn) -> None:
        observation, reward, terminated, truncated, info = self.env.step(turn.action)
        self.info = info
        turn.reward = float(reward)
        turn.action_valid = bool(info.get("action_valid", True))
        traj = self.trajectory
        traj.reward += float(reward)
        traj.won = bool(info.get("won", traj.won))
        traj.score = float(info.get("score", traj.score))
        traj.invalid_actions += not turn.action_valid
        traj.terminated, traj.truncated = bool(terminated), bool(truncated)
        self.done = terminated or truncated
        self.state = clean_text(observation)
        self.observe(self.state)
