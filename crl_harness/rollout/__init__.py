"""The multi-turn rollout engine: many episodes on many envs, one batched generate per turn.

Holds:
- ``records``: ``EpisodeSpec`` (what to play), ``Turn``, ``GateRecord`` and ``Trajectory`` (what
  was played, with the token ids, log-probs and loss masks the trainer needs);
- ``episode``: ``LiveEpisode`` (one episode being played: its env, its conversation and its
  trajectory so far), ``make_env`` and ``task_id_of``;
- ``transcript``: ``transcript_of``, an episode as plain text (the extractor's input);
- ``settings``: ``RolloutConfig`` (the engine's settings: the run's actor and experience
  sections and its own; ``from_config`` builds it, a training run's or bare) and
  ``env_kwargs_by_id``;
- ``engine``: ``RolloutEngine``, which plays many episodes at once and
  batches every turn across them (its docstring says how a turn is played, what an invalid
  reply costs, and what the released method's two switches, the actor-critic gate and
  search-and-ask, add).

Imports go one way only: ``engine`` imports ``settings``, ``episode`` and ``transcript``; those
import ``records``, but ``settings``, which reads ``crl_harness.config.schema`` instead. Importing the package registers the CRL env ids.
"""

from crl_harness.rollout.engine import RolloutEngine
from crl_harness.rollout.episode import LiveEpisode, make_env, task_id_of
from crl_harness.rollout.records import EpisodeSpec, GateRecord, Trajectory, Turn
from crl_harness.rollout.settings import RolloutConfig, env_kwargs_by_id
from crl_harness.rollout.transcript import transcript_of

__all__ = ["EpisodeSpec", "Turn", "GateRecord", "Trajectory", "RolloutConfig", "RolloutEngine",
           "env_kwargs_by_id", "LiveEpisode", "make_env", "task_id_of", "transcript_of"]
