"""The batched rollout engine: many episodes on many envs, one batched generate per turn.

Holds ``RolloutEngine``; its settings, ``RolloutConfig``, are in ``settings``.

Each turn, every live episode's conversation becomes one prompt and the backend answers all of
them in a single ``generate`` call; finished episodes hand their env to the next pending spec,
so the batch stays full. Generated token ids are kept exactly as sampled, never re-tokenised.
A reply that breaks the ``<think>...</think><answer>ACTION</answer>`` format is an invalid
action: the env does not move, the agent is told what was wrong, the turn counts toward the
step limit, and ``format_penalty`` is added to the episode reward.

The released method's two switches (``crl_harness.experience.gate`` and ``.ask``) add actor turns
that are trained like the others:
- ``actor_critic_gate``: before a guided episode that retrieved experience, the actor judges it in
  one batched turn of its own (``Trajectory.gate``); reject plays the episode without it, refine
  with the actor's restatement;
- ``search_and_ask``: a guided episode's reply may be an ask instead of an action (generation
  stops at the tool's closing tag); the Experience Manager's extractor answers it, the answer is
  the next observation, and the env does not move.
The engine reports no outcome: a trajectory keeps what credit needs (the entries shown, the
gate's verdict, the asks' generations), and the trainer credits a step's episodes at once
(``crl_harness.experience.credit_episodes``); the experience wrappers it builds only retrieve.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym

from crl_envs.errors import describe_error
from crl_harness.experience.ask import (
    ASK_CLOSE,
    AskRecord,
    answer_observation,
    empty_query_observation,
    parse_ask,
    refused_observation,
    tool_instructions,
)
from crl_harness.experience.client import ExperienceClient
from crl_harness.experience.entries import clean_text
from crl_harness.experience.gate import gate_messages, parse_verdict
from crl_harness.models.base import STOP, Generation, ModelBackend
from crl_harness.prompting import format_error_message, parse_answer
from crl_harness.rollout.episode import LiveEpisode, make_env
from crl_harness.rollout.records import EpisodeSpec, GateRecord, Trajectory, Turn
from crl_harness.rollout.settings import RolloutConfig
from crl_harness.rollout.transcript import transcript_of
from crl_wrappers.experience import Retriever

__all__ = ["RolloutEngine"]


class RolloutEngine:
    """Plays ``EpisodeSpec`` lists with a model backend, batching every turn across episodes.

    ``retriever`` (an ``ExperienceClient``, or anything with ``retrieve(env_id, query, k)``)
    turns on ``ExperienceAugmentation``; each spec's ``use_experience`` then chooses whether
    that episode sees experience. ``search_and_ask`` needs the client's ``ask``. No outcome is
    reported (``credit_episodes`` does it from the trajectories). Envs are kept between ``run``
    calls and reused; ``close()`` frees them.

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

    def __init__(self, backend: ModelBackend,
                 retriever: ExperienceClient | Retriever | None = None,
                 config: RolloutConfig | None = None, **overrides: Any) -> None:
        self.backend = backend
        self.retriever = retriever
        self.config = (config or RolloutConfig()).replace(**overrides)
        if self.config.experience.search_and_ask and not callable(getattr(retriever, "ask", None)):
            raise TypeError("search_and_ask needs a retriever with ask(env_id, query, k) (the "
                            "Experience Manager); turn it off or pass one.")
        self._tools = tool_instructions(self.config.experience.max_asks) if self.config.experience.search_and_ask else ""
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
                    tools = self._tools if spec.use_experience and self.retriever is not None else ""
                    started.append((index, LiveEpisode(spec, self._take_env(spec.env_id),
                                                       cfg.actor.history, tools)))
                fresh = []
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
                        fresh.append(episode)
                for episode in fresh:
                    episode.fit_experience(self._budget(), self.backend.count_tokens)
                if cfg.experience.actor_critic_gate:
                    self._gate([e for e in fresh if e.spec.use_experience and e.experience])
                if not live:
                    continue
                generations = self._generate([episode for _, episode in live])
                to_step, to_ask = [], []
                for (_, episode), generation in zip(live, generations, strict=True):
                    if generation.error or episode.done:
                        # no reply (a prompt over the server's context, a timeout): this episode
                        # ends with the error, the others go on
                        episode.trajectory.error = episode.trajectory.error or generation.error
                        episode.done = True
                        continue
                    turn = self._record(episode, generation)
                    if turn.ask is not None:
                        if turn.ask.status == "answered":
                            to_ask.append((episode, turn))
                    elif turn.format_ok:
                        to_step.append((episode, turn))
                self._answer(to_ask)
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
    def _next_seed(self) -> int | None:
        return next(self._seeds) if self._seeds is not None else None

    def _budget(self) -> int:
        """The tokens a prompt may hold: the context less a reply's."""
        return self.backend.max_context - self.config.actor.max_new_tokens

    def _generate(self, episodes: list[LiveEpisode]) -> list[Generation]:
        cfg = self.config
        budget = self._budget()
        prompts = [e.conversation.messages(budget, self.backend.count_tokens) for e in episodes]
        # The ask's closing tag ends a reply, as the released code's stop string does; passed
        # only when the tool is on, so backends without stop strings work as before.
        stop = {"stop": (ASK_CLOSE,)} if cfg.experience.search_and_ask else {}
        sampling = dict(max_new_tokens=cfg.actor.max_new_tokens, temperature=cfg.actor.temperature,
                        top_p=cfg.actor.top_p, seed=self._next_seed(), **stop)
        tokenizer = getattr(self.backend, "tokenizer", None)
        from_ids = getattr(self.backend, "generate_from_ids", None)
        if tokenizer is None or from_ids is None:  # a server: it tokenises the messages itself
            return self.backend.generate(prompts, **sampling)
        # Token in, token out: each prompt extends the last one and its sampled reply as they
        # were, so an episode packs into one training row and its keys and values are reused.
        ids = [episode.prompt_ids(tokenizer, messages, budget)
               for episode, messages in zip(episodes, prompts, strict=True)]
        # A prompt that does not fit even with its history dropped (an observation larger than
        # the context) ends its own episode; the batch goes on.
        fitting = [i for i, prompt in enumerate(ids) if len(prompt) <= budget]
        results = [Generation("", prompt, [], [], "", error=_over_context(len(prompt), budget))
                   for prompt in ids]
        for i, generation in zip(fitting, from_ids([ids[i] for i in fitting], **sampling),
                                 strict=True):
            results[i] = generation
        return results

    def _gate(self, episodes: list[LiveEpisode]) -> None:
        """The actor-critic gate, one batched turn: each episode's actor judges the experience
        it retrieved; reject removes it from the system prompt, refine restates it."""
        if not episodes:
            return
        cfg = self.config
        budget = self._budget()
        prompts = [gate_messages(e.task_prompt(), e.state, e.experience) for e in episodes]
        sizes = [self.backend.count_tokens(prompt) for prompt in prompts]
        for episode, size in zip(episodes, sizes, strict=True):
            if size > budget:
                episode.trajectory.error, episode.done = _over_context(size, budget), True
        episodes = [e for e, size in zip(episodes, sizes, strict=True) if size <= budget]
        prompts = [p for p, size in zip(prompts, sizes, strict=True) if size <= budget]
        if not episodes:
            return
        generations = self.backend.generate(
            prompts, max_new_tokens=cfg.actor.max_new_tokens, temperature=cfg.actor.temperature,
            top_p=cfg.actor.top_p, seed=self._next_seed())
        for episode, prompt, generation in zip(episodes, prompts, generations, strict=True):
            if generation.error:
                episode.trajectory.error, episode.done = generation.error, True
                continue
            verdict = parse_verdict(generation.text)
            turn = Turn(prompt_token_ids=generation.prompt_token_ids,
                        token_ids=generation.token_ids, logprobs=generation.logprobs,
                        text=generation.text, format_ok=verdict.format_ok,
                        finish_reason=generation.finish_reason, observation=prompt[-1]["content"],
                        usage_tokens=generation.usage_tokens)
            episode.trajectory.gate = GateRecord(verdict.verdict, verdict.critic, turn,
                                                 verdict.knowledge, verdict.format_ok)
            if verdict.verdict == "reject":
                episode.set_experience("")
            elif verdict.verdict == "refine":
                episode.set_experience(verdict.knowledge)
                episode.fit_experience(budget, self.backend.count_tokens)

    def _record(self, episode: LiveEpisode, generation: Generation) -> Turn:
        query = parse_ask(generation.text, stopped=generation.finish_reason == STOP) \
            if episode.tools else None
        parsed = parse_answer(generation.text) if query is None else None
        format_ok = parsed is None or parsed.format_ok
        turn = Turn(
            prompt_token_ids=generation.prompt_token_ids, token_ids=generation.token_ids,
            logprobs=generation.logprobs, text=generation.text,
            action=parsed.action if parsed is not None else None,
            format_ok=format_ok, action_valid=format_ok,
            finish_reason=generation.finish_reason, observation=episode.observation,
            usage_tokens=generation.usage_tokens,
        )
        traj = episode.trajectory
        traj.turns.append(turn)
        episode.conversation.reply(clean_text(generation.text))
        if query is not None:
            self._record_ask(episode, turn, query)
            return turn
        traj.steps += 1
        assert parsed is not None
        if not parsed.format_ok:
            turn.format_penalty = self.config.actor.format_penalty  # apart from the env's reward
            traj.reward += self.config.actor.format_penalty
            traj.format_failures += 1
            traj.invalid_actions += 1
            episode.observe(f"{format_error_message(parsed.error)}\n\n{episode.observation}")
        return turn

    def _record_ask(self, episode: LiveEpisode, turn: Turn, query: str) -> None:
        """An ask: within the limit it waits for its answer (``_answer``) and does not count
        toward the step limit; an empty one is an invalid action and one beyond the limit is
        refused, each a turn that counts."""
        cfg, traj = self.config, episode.trajectory
        query = query.strip()
        if not query:
            turn.ask = AskRecord("", "empty")
            turn.action_valid = False
            traj.steps += 1
            traj.invalid_actions += 1
            episode.observe(empty_query_observation(episode.state))
            return
        sent = query[: cfg.experience.max_query_chars]  # never sent whole when longer
        if episode.answered_asks >= cfg.experience.max_asks:
            turn.ask = AskRecord(sent, "refused", cut=len(sent) < len(query))
            traj.steps += 1
            episode.observe(refused_observation(cfg.experience.max_asks, episode.state))
            return
        turn.ask = AskRecord(sent, "answered", cut=len(sent) < len(query))
        episode.answered_asks += 1

    def _answer(self, asking: list[tuple[LiveEpisode, Turn]]) -> None:
        """Send this turn's asks to the retriever at once (its extractor batches them); each
        answer becomes its episode's next observation, the env's state unchanged."""
        if not asking:
            return
        k = self.config.experience.k

        def ask(pair: tuple[LiveEpisode, Turn]) -> None:
            episode, turn = pair
            assert turn.ask is not None
            answer = self.retriever.ask(episode.spec.env_id, turn.ask.query, k)
            turn.ask.answer, turn.ask.generation_id = answer.text, answer.generation_id
            episode.observe(answer_observation(answer.text, episode.state))

        with ThreadPoolExecutor(max_workers=len(asking)) as pool:
            for (episode, _), error in zip(asking, pool.map(self._guard(ask), asking), strict=True):
                if error:
                    episode.trajectory.error = error
                    episode.done = True

    def _finish(self, index: int, episode: LiveEpisode, results: list[Trajectory | None],
                on_done: Callable[[Trajectory], None] | None) -> None:
        traj = episode.trajectory
        if not (traj.terminated or traj.truncated or traj.error):
            traj.truncated = True  # ended by the engine's turn cap, which the env never saw
        traj.transcript = transcript_of(traj.task, traj.turns, traj.won, traj.score, traj.gate,
                                        traj.retrieval_key, traj.env_id)
        traj.system, traj.final_observation = episode.conversation.system, episode.state
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
        return make_env(env_id, self.retriever, cfg.experience.k, **cfg.env_kwargs.get(env_id, {}))

    @staticmethod
    def _guard(func: Callable[[Any], None]) -> Callable[[Any], str]:
        # An env that raises ends only its own episode (recorded in Trajectory.error), not the
        # whole batch of episodes around it.
        def call(item: Any) -> str:
            try:
                func(item)
            except Exception as err:  # noqa: BLE001 - reported on the trajectory
                return describe_error(err)  # a missing extra names its install command
            return ""

        return call


def _over_context(tokens: int, budget: int) -> str:
    """The error of an episode whose prompt does not fit the context."""
    return (f"the prompt holds {tokens} tokens, more than the {budget} the context leaves beside "
            "a reply (max_new_tokens), even with the history dropped and the experience cut: "
            "an observation too large for this model")
