"""Benchmark any agent on any CRL envs: success rates with confidence intervals, report files.

Holds, from its modules:
- ``intervals``: ``wilson_interval`` and ``format_rate``; ``PairedDifference`` /
  ``paired_difference`` (two agents, or one before and after training, on the same levels: the
  difference of their success rates with its 95% interval and McNemar's exact p) and
  ``format_paired``.
- ``episodes``: ``expand_env_ids`` (ids, ``all`` or a mixture config name such as ``mix3``),
  ``parse_seeds`` (within ``MAX_EPISODES`` and ``MAX_SEED``), ``episode_specs``.
- ``loop``: ``evaluate``, which plays the episodes (scripted/human agents one step at a time in
  worker threads, model agents through the batched ``RolloutEngine``) and records each one as
  soon as it ends, so a crash loses nothing already played.
- ``folder``: an eval folder's files (``RESULTS``, ``TRANSCRIPTS``, ``SETTINGS``, ``LOCK``), the
  lock that lets one eval at a time write it (``lock_folder``), and the repairs ``--resume``
  makes before it appends (``cut_torn_line``, ``keep_transcripts``).
- ``records``: ``transcript_record`` / ``append_transcript`` (one episode as a JSON line) and
  ``RecordedTrajectory`` / ``recorded_trajectory`` (an attempt read back, for ``crl eval
  --resume``).
- ``report``: ``EnvSummary`` / ``summarize`` (per-env success rate, mean steps of successes,
  invalid-action and format-failure rates, generated tokens, errors), ``write_report`` (JSON),
  ``plot_success`` (bar chart PNG), ``render_table`` (rich).
- ``heldout`` (imported by name, not here: it loads models): ``evaluate_levels``, an actor's
  greedy outcome on each held-out level, cached for a model that does not change, and
  ``paired`` / ``pooled``, the before/after differences of ``crl demo`` and the benchmarks.
"""

from crl_harness.eval.episodes import (
    MAX_EPISODES,
    MAX_SEED,
    episode_specs,
    expand_env_ids,
    parse_seeds,
)
from crl_harness.eval.intervals import (
    PairedDifference,
    format_paired,
    format_rate,
    paired_difference,
    wilson_interval,
)
from crl_harness.eval.loop import evaluate
from crl_harness.eval.records import (
    RecordedTrajectory,
    append_transcript,
    recorded_trajectory,
    transcript_record,
)
from crl_harness.eval.report import (
    EnvSummary,
    plot_success,
    render_table,
    summarize,
    write_report,
)

__all__ = ["EnvSummary", "summarize", "wilson_interval", "PairedDifference", "paired_difference",
           "format_rate", "format_paired", "expand_env_ids", "parse_seeds",
           "MAX_EPISODES", "MAX_SEED",
           "episode_specs", "evaluate", "write_report", "plot_success", "render_table",
           "transcript_record", "append_transcript", "RecordedTrajectory", "recorded_trajectory"]
