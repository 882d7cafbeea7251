"""Which episodes an eval plays: env ids, seeds, and the specs that pair them.

Holds:
- ``expand_env_ids``: ids, ``all`` or a mixture config name such as ``mix3``;
- ``parse_seeds`` (``START``, ``A-B`` or ``A,B,C``) within ``MAX_EPISODES`` and ``MAX_SEED``;
- ``episode_specs``: every env id with every seed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from crl_envs import env_ids
from crl_envs.errors import UserFacingError
from crl_harness.rollout import EpisodeSpec

__all__ = ["expand_env_ids", "parse_seeds", "MAX_EPISODES", "MAX_SEED", "episode_specs"]


def expand_env_ids(text: str) -> list[str]:
    """Comma-separated env ids, ``all``, or a config name (``mix3``) whose mixture is used.

    Example:
        >>> expand_env_ids("CRL/Sokoban-v0,CRL/MiniHackRoom-v0")
        ['CRL/Sokoban-v0', 'CRL/MiniHackRoom-v0']
    """
    ids: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part == "all":
            ids.extend(env_ids())
        elif part in env_ids():
            ids.append(part)
        else:
            from crl_harness.config import ConfigError, load_config

            try:
                ids.extend(entry.id for entry in load_config(part).tasks.envs)
            except ConfigError as err:
                raise UserFacingError(
                    f"'{part}' is neither an env id ({', '.join(env_ids())}), 'all', nor a mixture "
                    f"config: {err}"
                ) from err
    if not ids:
        raise UserFacingError("--envs names no env; give ids, 'all' or a mixture such as mix3.")
    return list(dict.fromkeys(ids))


MAX_EPISODES = 100_000  # per env: more is a typo, and the seed list is held in memory
MAX_SEED = 2**63 - 1  # seeds reach numpy and torch generators, which take 64-bit values


def parse_seeds(text: str | None, episodes: int | None) -> list[int]:
    """Seeds from ``START`` (with ``episodes``), ``A-B`` (inclusive) or ``A,B,C``: at least one,
    at most ``MAX_EPISODES``, each in ``[0, MAX_SEED]``.

    Example:
        >>> parse_seeds("100", 3), parse_seeds("0-2", None), parse_seeds("5,7", None)
        ([100, 101, 102], [0, 1, 2], [5, 7])
    """
    if episodes is not None and not 1 <= episodes <= MAX_EPISODES:
        raise UserFacingError(f"--episodes must be between 1 and {MAX_EPISODES}, got {episodes}.")
    text = (text or "0").strip()
    try:
        seeds = _seed_sequence(text, episodes)
    except ValueError as err:  # a number past Python's 4300-digit conversion limit
        raise UserFacingError(f"Bad --seeds: {err}.") from err
    count = seeds.stop - seeds.start if isinstance(seeds, range) else len(seeds)  # no list yet
    if count > MAX_EPISODES:
        raise UserFacingError(f"--seeds {text[:40]} names {count} seeds; at most {MAX_EPISODES}.")
    if min(seeds) < 0 or max(seeds) > MAX_SEED:
        raise UserFacingError(f"--seeds {text[:40]}: seeds must lie in [0, {MAX_SEED}].")
    seeds = list(seeds)
    if episodes is not None and episodes != len(seeds):
        raise UserFacingError(f"--episodes {episodes} disagrees with the {len(seeds)} seeds of "
                              f"--seeds {text}; give one of them.")
    return seeds


def _seed_sequence(text: str, episodes: int | None) -> range | list[int]:
    """The seeds ``text`` names, as a range where it is one (a huge range costs nothing yet)."""
    if re.fullmatch(r"-?\d+", text):
        seeds = range(int(text), int(text) + (episodes if episodes is not None else 10))
    elif match := re.fullmatch(r"(-?\d+)-(-?\d+)", text):
        seeds = range(int(match[1]), int(match[2]) + 1)
        if seeds.stop <= seeds.start:  # not len(): a range past sys.maxsize has none
            raise UserFacingError(f"--seeds {text[:40]} is an empty range; write A-B with A <= B.")
    elif re.fullmatch(r"-?\d+(,\s*-?\d+)+,?", text):
        seeds = [int(s) for s in text.split(",") if s.strip()]
    else:
        raise UserFacingError(f"Bad --seeds {text[:40]!r}: use START, A-B or A,B,C.")
    return seeds


def episode_specs(env_ids: Sequence[str], seeds: Sequence[int],
                  use_experience: bool = False) -> list[EpisodeSpec]:
    """Every env id with every seed, interleaved so that envs share the batch from the start."""
    return [EpisodeSpec(env_id, seed, group_id=i, use_experience=use_experience)
            for i, seed in enumerate(seeds) for env_id in env_ids]
