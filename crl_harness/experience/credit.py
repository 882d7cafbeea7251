"""Credit for the extractor: which extractor generations wrote experience that was used, and how
the episodes that used it ended.

Holds ``GenerationReward`` (what the trainer reads), ``CreditLedger``, ``EpisodeOutcome`` (what
crediting needs of a finished episode) and ``credit_episodes`` (the one place a step's finished
episodes are credited, by the experience service the trainer hands them to in one call). A generation's reward is
the mean, over the episodes that retrieved entries it wrote, of the credit each gave
(``entry_credit``): the paper's is the episode's score, with a score of 0 counted as -1
(docs/method.md, "The extractor: CISPO on credit by use"); the relative one
(``experience.credit: relative``) is the score minus the mean score of the group's free subgroup
(``free_baselines``), the same level at the same step without experience, so that a lesson is
credited with the help it gave rather than with its level's success rate. With the actor-critic
gate, the entries shown are credited by the actor's verdict instead (``gated_credit``). Its record
stays in the ledger until the trainer trains on it and ``release``-s it, so every use until then
counts.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["GenerationReward", "CreditLedger", "episode_credit", "gated_credit", "entry_credit",
           "free_baselines", "EpisodeOutcome", "OutcomeSink", "credit_episodes", "Kind"]

Kind = Literal["distill", "merge", "ask"]


def episode_credit(score: float) -> float:
    """The credit one episode gives: its score, or -1 when the score is 0 (a failure)."""
    return float(score) if score > 0 else -1.0


def gated_credit(score: float, critic: float) -> float:
    """The credit one gated episode gives the entries it was shown (the released code's rule):
    the critic score when below 1 (refine 0.5, reject -1, whatever the outcome), else (accept)
    the episode's score + 1.

    >>> gated_credit(1.0, 1.0), gated_credit(0.0, 1.0), gated_credit(1.0, 0.5), gated_credit(1.0, -1.0)
    (2.0, 1.0, 0.5, -1.0)
    """
    return float(critic) if critic < 1 else float(score) + float(critic)


def entry_credit(score: float, critic: float | None = None, baseline: float | None = None) -> float:
    """The credit one episode gives the writers of the entries it was shown: with no
    ``baseline`` the paper's (``episode_credit``, or ``gated_credit`` with the gate's ``critic``);
    with one (relative credit) the score minus it, which the gate's accept adds its critic to.

    >>> entry_credit(1.0), entry_credit(0.0), entry_credit(1.0, baseline=0.25)
    (1.0, -1.0, 0.75)
    >>> entry_credit(0.0, baseline=0.5), entry_credit(1.0, critic=1.0, baseline=0.5)
    (-0.5, 1.5)
    """
    if baseline is None:
        return episode_credit(score) if critic is None else gated_credit(score, critic)
    relative = float(score) - float(baseline)
    return relative if critic is None else gated_credit(relative, critic)


def free_baselines(episodes: Iterable[tuple[Hashable, bool, float]]) -> dict[Hashable, float]:
    """The mean score of each group's free subgroup, from ``(group, guided, score)`` rows, for
    the groups whose free episodes did not all end alike: where every free episode won (or
    every one lost) the free half tells nothing of what the lesson added (all won: a right
    lesson would get 0, then less than the batch's mean), so the group has no baseline and its
    guided half is credited by its own outcomes (``episode_credit``). A group none of whose
    free episodes finished has no baseline either.

    >>> free_baselines([("g0", True, 1.0), ("g0", False, 1.0), ("g0", False, 0.0),
    ...                 ("g1", True, 0.0), ("g2", False, 1.0), ("g2", False, 1.0)])
    {'g0': 0.5}
    """
    free: dict[Hashable, list[float]] = defaultdict(list)
    for group, guided, score in episodes:
        if not guided:
            free[group].append(float(score))
    return {group: sum(scores) / len(scores) for group, scores in free.items()
            if len(set(scores)) > 1}


@dataclass(frozen=True)
class EpisodeOutcome:
    """What crediting needs of one finished episode, as plain data (a step's outcomes cross to
    the experience service in one call, wherever it runs)."""

    env_id: str
    query: str
    """what the episode retrieved with (its level's key, else its task)"""
    group_id: int
    guided: bool
    """played with experience (the group's guided subgroup)"""
    score: float
    """the outcome score: 1 for a win, else the env's (``Trajectory.outcome_score``)"""
    entry_ids: tuple[str, ...] = ()
    """the bank entries the episode was shown"""
    critic: float | None = None
    """the actor-critic gate's score of those entries, where the gate judged them"""
    ask_generations: tuple[str, ...] = ()
    """the extractor generations that answered the episode's asks"""

    @classmethod
    def of(cls, episode: Any) -> EpisodeOutcome:
        """The outcome of ``episode``, a ``crl_harness.rollout.Trajectory``."""
        return cls(episode.env_id, episode.retrieval_key or episode.task, episode.group_id,
                   episode.use_experience, episode.outcome_score, tuple(episode.experience_ids),
                   episode.gate.critic if episode.gate is not None else None,
                   tuple(a.generation_id for a in episode.asks if a.generation_id is not None))


class OutcomeSink(Protocol):
    """What ``credit_episodes`` reports to (``ExperienceManager``)."""

    def report_outcome(self, entry_ids: Sequence[str], score: float,
                       critic: float | None = None, baseline: float | None = None,
                       env_id: str = "", query: str = "") -> None:
        """An episode of ``env_id`` that retrieved with ``query`` and was shown ``entry_ids``
        ended with ``score`` (``critic``: the gate's score of them; ``baseline``: its group's
        free mean, for relative credit)."""
        ...

    def report_ask_outcome(self, generation_ids: Sequence[str], score: float) -> None:
        """The episode whose asks ``generation_ids`` answered ended with ``score``."""
        ...


def credit_episodes(sink: OutcomeSink, outcomes: Sequence[EpisodeOutcome],
                    relative: bool = False) -> None:
    """Report a step's finished episodes to ``sink``: each one shown entries credits their
    writers and endorsers (``report_outcome`` with the episode's env and key, so that another
    level's entry credits nobody; by the gate's critic score when the gate judged them; with
    ``relative``, ``experience.credit: relative``, only guided episodes, relative to their
    group's free baseline where it has one, ``free_baselines``, else by their own outcome), and
    the generations that answered its asks get its score (``report_ask_outcome``).

    ``outcomes``: those of the step's trajectories, without those an error ended (they are no
    sample of the policy).

    >>> class Sink:
    ...     def report_outcome(self, entry_ids, score, critic=None, baseline=None, env_id="",
    ...                        query=""):
    ...         print("entries", entry_ids, score, critic, baseline, query)
    ...     def report_ask_outcome(self, generation_ids, score):
    ...         print("asks", generation_ids, score)
    >>> def episode(guided, won, ids=()):
    ...     return EpisodeOutcome("E", "x=1, y=2", 0, guided, float(won), tuple(ids))
    >>> guided = episode(True, True, ["e1"])
    >>> credit_episodes(Sink(), [guided, episode(False, False), episode(False, True)])
    entries ['e1'] 1.0 None None x=1, y=2
    >>> credit_episodes(Sink(), [guided, episode(False, False), episode(False, True)],
    ...                 relative=True)
    entries ['e1'] 1.0 None 0.5 x=1, y=2
    >>> credit_episodes(Sink(), [guided, episode(False, True), episode(False, True)],
    ...                 relative=True)  # the free half all won: the guided outcome alone
    entries ['e1'] 1.0 None None x=1, y=2
    """
    baselines = free_baselines((o.group_id, o.guided, o.score) for o in outcomes) \
        if relative else {}
    for o in outcomes:
        if o.entry_ids and (not relative or o.guided):
            sink.report_outcome(list(o.entry_ids), o.score, o.critic,
                                baselines.get(o.group_id), o.env_id, o.query)
        if o.ask_generations:
            sink.report_ask_outcome(list(o.ask_generations), o.score)


@dataclass
class GenerationReward:
    """One extractor generation with its reward, ready for the extractor's update."""

    generation_id: str
    prompt: str
    output: Any
    """What the extractor returned (a model backend's ``Generation`` keeps token ids/logprobs)."""
    reward: float
    n_uses: int
    kind: Kind


@dataclass
class _Record:
    prompt: str
    output: Any
    kind: Kind
    total: float = 0.0
    n_uses: int = 0
    fixed_reward: float | None = None


class CreditLedger:
    """Generations not trained yet, and the credit they received so far. Thread-safe.

    ``rewards`` reads the current mean of every used generation and keeps the records, so a
    generation used in several steps before it is trained gets the mean of all those uses;
    ``release`` forgets the generations once trained (later uses of what they wrote are not
    counted: the sample has been spent). ``drain`` is both at once, for one-shot readers.

    ``max_generations`` bounds memory: past it, the oldest generation that was never used is
    forgotten (its entries were probably evicted or merged away), else the oldest one.

    Example:
        >>> ledger = CreditLedger()
        >>> ledger.register("g1", "prompt", "output", "distill")
        >>> ledger.credit(["g1"], score=1.0)
        1
        >>> [(r.generation_id, r.reward, r.n_uses) for r in ledger.rewards()]
        [('g1', 1.0, 1)]
        >>> ledger.credit(["g1"], score=0.0)  # a later step: a failure counts -1
        1
        >>> [(r.generation_id, r.reward, r.n_uses) for r in ledger.rewards()]
        [('g1', 0.0, 2)]
        >>> ledger.release(["g1"]), ledger.rewards()
        (1, [])
    """

    def __init__(self, max_generations: int = 10_000) -> None:
        self.max_generations = max_generations
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()
        self.forgotten = 0

    def register(self, generation_id: str, prompt: str, output: Any,
                 kind: Kind, fixed_reward: float | None = None) -> None:
        """Remember a generation; ``fixed_reward`` makes it readable at once (format failures)."""
        with self._lock:
            self._records[generation_id] = _Record(prompt, output, kind, fixed_reward=fixed_reward)
            while len(self._records) > self.max_generations:
                victim = next((g for g, r in self._records.items()
                               if r.n_uses == 0 and r.fixed_reward is None),
                              next(iter(self._records)))
                del self._records[victim]
                self.forgotten += 1

    def credit(self, generation_ids: Iterable[str | None], score: float,
               critic: float | None = None, baseline: float | None = None) -> int:
        """Credit each distinct known generation with one episode (``entry_credit``: relative
        to ``baseline`` when given, by the actor-critic gate's ``critic`` score when it judged
        the entries); returns how many."""
        value = entry_credit(score, critic, baseline)
        credited = 0
        with self._lock:
            for generation_id in set(generation_ids):
                record = self._records.get(generation_id) if generation_id else None
                if record is not None and record.fixed_reward is None:
                    record.total += value
                    record.n_uses += 1
                    credited += 1
        return credited

    def rewards(self, min_uses: int = 1) -> list[GenerationReward]:
        """Every generation used at least ``min_uses`` times (and fixed-reward ones), with its
        reward so far; the records stay, and keep collecting credit, until ``release``."""
        with self._lock:
            return self._ready(min_uses)

    def release(self, generation_ids: Iterable[str]) -> int:
        """Forget these generations (they were trained on); returns how many were known."""
        with self._lock:
            return sum(self._records.pop(g, None) is not None for g in set(generation_ids))

    def drain(self, min_uses: int = 1) -> list[GenerationReward]:
        """``rewards`` and ``release`` of what it returned, at once. A reader that drains every
        step freezes each reward at its first step; the trainer uses ``rewards``/``release``."""
        with self._lock:
            out = self._ready(min_uses)
            for reward in out:
                del self._records[reward.generation_id]
        return out

    def export(self) -> list[tuple[str, Any]]:
        """Every record, as picklable data (a checkpoint's); ``load`` puts them back."""
        with self._lock:
            return list(self._records.items())

    def load(self, records: Iterable[tuple[str, Any]]) -> None:
        """Replace the records by an ``export``'s (a resumed run's)."""
        with self._lock:
            self._records.clear()
            self._records.update(records)

    def _ready(self, min_uses: int) -> list[GenerationReward]:
        out: list[GenerationReward] = []
        for generation_id, record in self._records.items():
            if record.fixed_reward is not None:
                reward = record.fixed_reward
            elif record.n_uses >= min_uses:
                reward = record.total / record.n_uses
            else:
                continue
            out.append(GenerationReward(generation_id, record.prompt, record.output, reward,
                                        record.n_uses, record.kind))
        return out

    def __len__(self) -> int:
        return len(self._records)
