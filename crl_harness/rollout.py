"""The multi-turn rollout engine: many episodes on many envs, one batched generate per turn.

Holds ``EpisodeSpec`` (what to play), ``Turn`` and ``Trajectory`` (what was played, with the
token ids, log-probs and loss masks the trainer needs), ``RolloutConfig`` and ``RolloutEngine``.

Each turn, every live episode's conversation becomes one prompt and the backend answers all of
them in a single ``generate`` call; finished episodes hand their env to the next pending spec,
so the batch stays full. Generated token ids are kept exactly as sampled, never re-tokenised.
A reply that breaks the ``<think>...</think><answer>ACTION</answer>`` format is an invalid
action: the env does not move, the agent is told what was wrong, the turn counts toward the
step limit, and ``format_penalty`` is added to the episode reward.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_harness.models.base import Generation, ModelBackend
from crl_harness.prompting import Conversation, format_error_message, parse_answer, system_prompt

__all__ = ["EpisodeSpec", "Turn", "Trajectory", "RolloutConfig", "RolloutEngine", "LiveEpisode",
           "make_env", "task_id_of", "transcript_of"]


@dataclass
class EpisodeSpec:
    """One episode to play: which env and seed, its GRPO group, and whether experience is on."""

    env_id: str
    seed: int
    group_id: int = 0
    use_experience: bool = False
    options: dict[str, Any] | None = None


@dataclass
class Turn:
    """One model reply and what it did.

    ``input_ids`` / ``loss_mask`` give the training view: the prompt tokens (mask 0) followed by
    the generated tokens (mask 1, EOS included when the model stopped by itself).

    Example:
        >>> t = Turn(prompt_token_ids=[5, 6], token_ids=[7, 2], logprobs=[-0.5, -0.1], text="x")
        >>> t.input_ids, t.loss_mask
        ([5, 6, 7, 2], [0, 0, 1, 1])
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    action: str | None = None
    format_ok: bool = True
    action_valid: bool = True
    reward: float = 0.0
    finish_reason: str = ""
    observation: str = ""  # what the agent saw before this reply

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_token_ids + self.token_ids

    @property
    def loss_mask(self) -> list[int]:
        return [0] * len(self.prompt_token_ids) + [1] * len(self.token_ids)


@dataclass
class Trajectory:
    """A finished episode.

    ``task_id`` names the task (the env's ``info["task_id"]``, else ``ENV_ID:SEED``).
    ``reward`` is the episode return (env rewards plus format penalties), ``won`` and ``score``
    the env's verdict, ``steps`` the number of agent turns, ``experience_ids`` the bank entries
    shown to the agent (for the extractor's credit), ``transcript`` the episode as text (the
    extractor's input). ``error`` is set when the env itself failed; such an episode is not a
    sample of the policy.
    """

    env_id: str
    seed: int
    group_id: int = 0
    use_experience: bool = False
    task: str = ""
    task_id: str = ""
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    won: bool = False
    score: float = 0.0
    steps: int = 0
    experience_ids: list[str] = field(default_factory=list)
    transcript: str = ""
    format_failures: int = 0
    invalid_actions: int = 0
    terminated: bool = False
    truncated: bool = False
    error: str = ""

    @property
    def generated_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns)


@dataclass
class RolloutConfig:
    """Settings of the rollout engine."""

    max_new_tokens: int = 256
    """Cap on the tokens of one reply (a reply cut there is usually a format failure)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy); log-probs are taken under it."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    history: int | None = None
    """None: every earlier turn that fits the context; k: the last k turns."""
    format_penalty: float = -0.1
    """Added to the episode reward for each reply that breaks the answer format (0 disables)."""
    max_live: int = 64
    """Episodes played at once (the generate batch)."""
    workers: int = 1
    """Threads for env resets and steps (envs whose steps wait on a process or C code); keep 1
    for ALFWorld, whose game loading is not thread-safe."""
    experience_k: int = 1
    """Bank entries retrieved per episode when experience is on."""
    seed: int | None = None
    """Base seed of the sampling; each generate call gets the next derived seed."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for gym.make, per env id."""


def make_env(env_id: str, retriever: Any = None, experience_k: int = 1, **kwargs: Any) -> gym.Env:
    """``gym.make(env_id)``, wrapped in ``ExperienceAugmentation`` when a retriever is given."""
    env = gym.make(env_id, **kwargs)
    if retriever is not None:
        from wrappers.experience import ExperienceAugmentation

        env = ExperienceAugmentation(env, retriever, k=experience_k, placement="instructions")
    return env


def task_id_of(env_id: str, seed: int, info: dict[str, Any]) -> str:
    """The env's own task id when it has one (e.g. an SWE-bench instance), else ``ENV_ID:SEED``."""
    return str(info.get("task_id") or f"{env_id}:{seed}")


def transcript_of(task: str, turns: Sequence[Turn], won: bool, score: float) -> str:
    """The episode as plain text: task, then each observation and action, then the outcome."""
    lines = [f"Task: {task}"] if task else []
    for index, turn in enumerate(turns, start=1):
        lines.append(f"[Observation {index}]\n{turn.observation}")
        action = turn.action if turn.format_ok else "(reply not in the answer format)"
        lines.append(f"[Action {index}] {action}")
    lines.append(f"[Outcome] {'success' if won else 'failure'} (score {score:g})")
    return "\n".join(lines)


class LiveEpisode:
    """One episode being played: its env, its conversation (the prompts exactly as the engine
    renders them) and its trajectory so far. The engine drives it; so does the warm start,
    which replays scripted oracles through the same rendering."""

    def __init__(self, spec: EpisodeSpec, env: gym.Env, history: int | None) -> None:
        self.spec = spec
        self.env = env
        self.history = history
        self.max_turns = env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 50
        self.trajectory = Trajectory(spec.env_id, spec.seed, spec.group_id, spec.use_experience)
        self.conversation = Conversation("", history)
        self.observation = ""
        self.info: dict[str, Any] = {}  # the env's info of the latest reset or step
        self.done = False

    def reset(self, with_experience_option: bool) -> None:
        options = dict(self.spec.options or {})
        if with_experience_option:
            options["use_experience"] = self.spec.use_experience
        observation, info = self.env.reset(seed=self.spec.seed, options=options)
        self.info = info
        instructions = info.get("instructions") or getattr(self.env.unwrapped, "instructions", "")
        experience = info.get("experience", "") or ""
        if experience and experience in instructions:
            experience = ""  # the wrapper already put it into the instructions
        task = info.get("task", "") or ""
        self.trajectory.task = task
        self.trajectory.task_id = task_id_of(self.spec.env_id, self.spec.seed, info)
        self.trajectory.experience_ids = list(info.get("experience_ids", []))
        self.conversation = Conversation(
            system_prompt(instructions, experience, task="" if task in observation else task),
            self.history,
        )
        self.observe(observation)

    def observe(self, observation: str) -> None:
        self.observation = observation
        self.conversation.observe(observation)

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
        self.observe(observation)


class RolloutEngine:
    """Plays ``EpisodeSpec`` lists with a model backend, batching every turn across episodes.

    ``retriever`` (the experience manager, or anything with ``retrieve(env_id, query, k)``)
    turns on ``ExperienceAugmentation``; each spec's ``use_experience`` then chooses whether
    that episode sees experience. Envs are kept between ``run`` calls and reused; ``close()``
    frees them.

    Example:
        >>> import tempfile
        >>> from crl_harness.models import HFBackend
        >>> from crl_harness.models.tiny import build_tiny_model
        >>> engine = RolloutEngine(HFBackend(build_tiny_model(tempfile.mkdtemp())),
        ...                        max_new_tokens=8, seed=0,
        ...                        env_kwargs={"CRL/Sokoban-v0": {"max_episode_steps": 4}})
        >>> [traj] = engine.run([EpisodeSpec("CRL/Sokoban-v0", seed=3)])
        >>> traj.steps, traj.format_failures, traj.truncated  # a random model: no valid answer
        (4, 4, True)
        >>> engine.close()
    """

    def __init__(self, backend: ModelBackend, retriever: Any = None,
                 config: RolloutConfig | None = None, **overrides: Any) -> None:
        self.backend = backend
        self.retriever = retriever
        self.config = config or RolloutConfig()
        for key, value in overrides.items():
            if not hasattr(self.config, key):
                raise TypeError(f"Unknown rollout setting {key!r}; see RolloutConfig.")
            setattr(self.config, key, value)
        self._free_envs: dict[str, list[gym.Env]] = {}
        self._seeds = itertools.count(self.config.seed) if self.config.seed is not None else None

    # ----------------------------------------------------------------- public
    def run(self, specs: Sequence[EpisodeSpec],
            on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """Play every spec; return the trajectories in the order of ``specs``.

        ``on_done`` is called with each trajectory as soon as its episode ends (progress bars,
        writing results as they come).
        """
        cfg = self.config
        pending = list(enumerate(specs))[::-1]
        results: list[Trajectory | None] = [None] * len(specs)
        live: list[tuple[int, LiveEpisode]] = []
        with ThreadPoolExecutor(max_workers=max(1, cfg.workers)) as pool:
            while pending or live:
                started = []
                while pending and len(live) + len(started) < cfg.max_live:
                    index, spec = pending.pop()
                    started.append((index, LiveEpisode(spec, self._take_env(spec.env_id), cfg.history)))
                for (index, episode), error in zip(
                    started, pool.map(self._guard(lambda e: e.reset(self.retriever is not None)),
                                      [e for _, e in started]),
                    strict=True,
                ):
                    if error:
                        episode.trajectory.error = error
                        self._finish(index, episode, results, on_done)
                    else:
                        live.append((index, episode))
                if not live:
                    continue
                generations = self._generate([episode for _, episode in live])
                to_step = []
                for (_, episode), generation in zip(live, generations, strict=True):
                    turn = self._record(episode, generation)
                    if turn.format_ok:
                        to_step.append((episode, turn))
                for (episode, _), error in zip(
                    to_step, pool.map(self._guard(lambda pair: pair[0].step(pair[1])), to_step),
                    strict=True,
                ):
                    if error:
                        episode.trajectory.error = error
                        episode.done = True
                still_live = []
                for index, episode in live:
                    if episode.done or episode.trajectory.steps >= episode.max_turns:
                        self._finish(index, episode, results, on_done)
                    else:
                        still_live.append((index, episode))
                live = still_live
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Close every env the engine holds."""
        for envs in self._free_envs.values():
            for env in envs:
                env.close()
        self._free_envs.clear()

    # ----------------------------------------------------------------- steps of run
    def _generate(self, episodes: list[LiveEpisode]) -> list[Generation]:
        cfg = self.config
        budget = self.backend.max_context - cfg.max_new_tokens
        prompts = [e.conversation.messages(budget, self.backend.count_tokens) for e in episodes]
        return self.backend.generate(
            prompts, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
            top_p=cfg.top_p, seed=next(self._seeds) if self._seeds is not None else None,
        )

    def _record(self, episode: LiveEpisode, generation: Generation) -> Turn:
        parsed = parse_answer(generation.text)
        turn = Turn(
            prompt_token_ids=generation.prompt_token_ids, token_ids=generation.token_ids,
            logprobs=generation.logprobs, text=generation.text, action=parsed.action,
            format_ok=parsed.format_ok, action_valid=parsed.format_ok,
            finish_reason=generation.finish_reason, observation=episode.observation,
        )
        traj = episode.trajectory
        traj.turns.append(turn)
        traj.steps += 1
        episode.conversation.reply(generation.text)
        if not parsed.format_ok:
            turn.reward = self.config.format_penalty
            traj.reward += self.config.format_penalty
            traj.format_failures += 1
            traj.invalid_actions += 1
            episode.observe(f"{format_error_message(parsed.error)}\n\n{episode.observation}")
        return turn

    def _finish(self, index: int, episode: LiveEpisode, results: list[Trajectory | None],
                on_done: Callable[[Trajectory], None] | None) -> None:
        traj = episode.trajectory
        if not (traj.terminated or traj.truncated or traj.error):
            # Ended by the engine's turn cap (format failures), which the env's TimeLimit and the
            # experience wrapper never saw: the outcome still goes to the entries' credit.
            traj.truncated = True
            report = getattr(self.retriever, "report_outcome", None)
            if traj.experience_ids and report is not None:
                report(list(traj.experience_ids), 1.0 if traj.won else traj.score)
        traj.transcript = transcript_of(traj.task, traj.turns, traj.won, traj.score)
        results[index] = traj
        if traj.error:
            episode.env.close()  # an env that raised is not trusted with another episode
        else:
            self._free_envs.setdefault(traj.env_id, []).append(episode.env)
        if on_done is not None:
            on_done(traj)

    def _take_env(self, env_id: str) -> gym.Env:
        free = self._free_envs.get(env_id)
        if free:
            return free.pop()
        cfg = self.config
        return make_env(env_id, self.retriever, cfg.experience_k, **cfg.env_kwargs.get(env_id, {}))

    @staticmethod
    def _guard(func: Callable[[Any], None]) -> Callable[[Any], str]:
        # An env that raises ends only its own episode (recorded in Trajectory.error), not the
        # whole batch of episodes around it.
        def call(item: Any) -> str:
            try:
                func(item)
            except Exception as err:  # noqa: BLE001 - reported on the trajectory
                return f"{type(err).__name__}: {err}"
            return ""

        return call
