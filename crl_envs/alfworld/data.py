"""ALFWorld games on disk: where they are, which split holds which, without parsing any game.

Holds:
- ``SPLITS``: our split names -> the upstream ``json_2.1.1`` folder (and the train rule).
- ``TASK_TYPES``: short task-type names -> the upstream folder prefixes.
- ``Game``: one playable ``game.tw-pddl`` file and its id.
- ``list_games``: the games of a split, from an index built once per data source.
- ``games_root``: the ``json_2.1.1`` folder that holds a split, extracting archives into the cache.

Where the games come from, first match wins (``crl_envs.data`` is the project's resolver):

1. ``data_dir`` given explicitly (a folder holding ``json_2.1.1/``, the splits, or the archives);
2. ``$ALFWORLD_DATA/json_2.1.1``, the layout ``alfworld-download`` writes;
3. ``$CRL_DATA_DIR/alfworld``, ``../shared/data/alfworld`` beside a checkout, then the user cache
   ``~/.cache/crl/data/alfworld`` that ``crl data fetch alfworld`` fills.

A folder may hold an extracted ``json_2.1.1/`` tree or archives: ``train.txz`` and ``valid.txz``
(the project's data) or upstream's ``json_2.1.1_tw-pddl.zip``. Archives are extracted once into
``crl_envs.data.cache_dir() / "alfworld"``, atomically (into a temporary folder that is renamed
when complete), so an interrupted extraction never leaves a half cache behind.

Upstream (``AlfredTWEnv.collect_game_files``) reads every game file when an env is made, to keep
the solvable ones; that is the slow start users complain about. Here the same filter (solvable,
no ``movable``/``Sliced`` trials) runs once per data source and is saved as ``index.json`` beside
the games; making an env reads only that index, and a game is parsed when a reset picks it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from crl_envs.data import DataNotFoundError, cache_dir, candidate_dirs

__all__ = ["SPLITS", "TASK_TYPES", "Game", "list_games", "games_root", "parse_task_types"]

# split -> (upstream folder, one game per task folder?). "train" is the paper's training set:
# one game per ALFRED task folder (its first solvable trial in name order), 1,465 games on the
# json_2.1.1 release (the paper says 1,466; the release has 1,465 task folders with a solvable
# game, so one instance of theirs cannot be identified); "train_all" is upstream's full training
# set (every solvable trial, 3,553 games).
SPLITS: dict[str, tuple[str, bool]] = {
    "train": ("train", True),
    "train_all": ("train", False),
    "eval_in_distribution": ("valid_seen", False),
    "eval_out_of_distribution": ("valid_unseen", False),
}

TASK_TYPES: dict[str, str] = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick_two": "pick_two_obj_and_place",
}

# archive file name -> the upstream split folders it holds
ARCHIVES: dict[str, tuple[str, ...]] = {
    "train.txz": ("train",),
    "valid.txz": ("valid_seen", "valid_unseen"),
    "json_2.1.1_tw-pddl.zip": ("train", "valid_seen", "valid_unseen"),
}

GAME_FILE = "game.tw-pddl"
INDEX_FILE = "index.json"
_INDEX_VERSION = 1


@dataclass(frozen=True)
class Game:
    """One ALFWorld game: ``game_id`` is ``<split folder>/<task folder>/<trial>``.

    Example:
        >>> game = Game("valid_unseen/look_at_obj_in_light-Mug-None-DeskLamp-308/trial_T1",
        ...             Path("/data/json_2.1.1"))
        >>> game.task_type, game.path.name
        ('look', 'game.tw-pddl')
    """

    game_id: str
    root: Path

    @property
    def path(self) -> Path:
        """The ``game.tw-pddl`` file."""
        return self.root / self.game_id / GAME_FILE

    @property
    def task_folder(self) -> str:
        """The ALFRED task folder, e.g. ``pick_and_place_simple-Watch-None-Safe-219``."""
        return self.game_id.split("/")[1]

    @property
    def task_type(self) -> str:
        """The short task type (a key of ``TASK_TYPES``; an unknown folder prefix as it is)."""
        prefix = self.task_folder.split("-", 1)[0]
        return next((short for short, upstream in TASK_TYPES.items() if upstream == prefix), prefix)


def parse_task_types(task_types: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """Normalise a task-type filter to short names; ``None`` means all six.

    Accepts the short names, ``"pick two"``, and upstream's folder prefixes.

    Example:
        >>> parse_task_types(["heat", "pick two", "look_at_obj_in_light"])
        ('heat', 'pick_two', 'look')
    """
    if task_types is None:
        return tuple(TASK_TYPES)
    if isinstance(task_types, str):
        task_types = [task_types]
    by_upstream = {upstream: short for short, upstream in TASK_TYPES.items()}
    out = []
    for name in task_types:
        key = str(name).strip().lower().replace(" ", "_")
        key = by_upstream.get(key, key)
        if key not in TASK_TYPES:
            raise ValueError(
                f"Unknown ALFWorld task type {name!r}; use one of {', '.join(TASK_TYPES)} "
                f"(or upstream's {', '.join(TASK_TYPES.values())})."
            )
        out.append(key)
    return tuple(dict.fromkeys(out))


def list_games(split: str, task_types: tuple[str, ...] | None = None,
               data_dir: str | os.PathLike | None = None) -> list[Game]:
    """The games of ``split`` (a key of ``SPLITS``), sorted by id, filtered by task type.

    Reads one small index file (built on first use); parses no game.
    """
    if split not in SPLITS:
        raise ValueError(f"Unknown ALFWorld split {split!r}; use one of {', '.join(SPLITS)}.")
    folder, one_per_task = SPLITS[split]
    root = games_root(folder, data_dir)
    ids = _read_or_build_index(root, folder)
    if one_per_task:
        first: dict[str, str] = {}
        for game_id in ids:  # sorted, so the first trial of each task folder wins
            first.setdefault(game_id.split("/")[1], game_id)
        ids = list(first.values())
    wanted = set(parse_task_types(task_types))
    games = [Game(game_id, root) for game_id in ids]
    return [game for game in games if game.task_type in wanted]


# ----------------------------------------------------------------------------- locating data
def _candidate_dirs(data_dir: str | os.PathLike | None) -> list[Path]:
    if data_dir is not None:
        return [Path(data_dir).expanduser()]
    dirs = []
    if os.environ.get("ALFWORLD_DATA"):
        dirs.append(Path(os.path.expandvars(os.environ["ALFWORLD_DATA"])).expanduser())
    return dirs + candidate_dirs("alfworld")


def games_root(folder: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The ``json_2.1.1`` folder holding ``folder`` (``train``, ``valid_seen``, ``valid_unseen``).

    Raises ``DataNotFoundError`` saying where it looked and how to get the data.
    """
    searched = _candidate_dirs(data_dir)
    for directory in searched:
        for tree in (directory / "json_2.1.1", directory):
            if (tree / folder).is_dir():
                return tree
        for archive, folders in ARCHIVES.items():
            if folder in folders and (directory / archive).is_file():
                return _extracted(directory / archive)
    where = ", ".join(str(d) for d in searched)
    raise DataNotFoundError(
        f"ALFWorld games for '{folder}' not found (searched: {where}). Run `crl data fetch "
        f"alfworld`, or set $ALFWORLD_DATA to a folder holding json_2.1.1/ (what "
        f"`alfworld-download` writes), or $CRL_DATA_DIR to a folder holding 'alfworld/' with "
        f"train.txz and valid.txz, or pass data_dir=."
    )


def _extracted(archive: Path) -> Path:
    """Extract ``archive`` into the cache once; return the ``json_2.1.1`` folder inside."""
    stat = archive.stat()
    # Name and size and mtime identify the archive without reading 45 MB at every env creation.
    key = hashlib.sha256(f"{archive.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    target = cache_dir() / "alfworld" / f"{archive.name.split('.')[0]}-{key[:16]}"
    if (target / "json_2.1.1" / INDEX_FILE).is_file():
        return target / "json_2.1.1"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        if archive.suffix == ".zip":
            with zipfile.ZipFile(archive) as zipped:
                members = [m for m in zipped.namelist()
                           if m.startswith("json_2.1.1/") and m.endswith("/" + GAME_FILE)]
                zipped.extractall(partial, members=members)
        else:
            with tarfile.open(archive) as tarred:
                if hasattr(tarfile, "data_filter"):  # refuses links and paths outside the target
                    tarred.extractall(partial, filter="data")
                else:  # Python < 3.10.12 has no extraction filters
                    tarred.extractall(partial)
        tree = partial / "json_2.1.1"
        if not tree.is_dir():
            raise DataNotFoundError(f"{archive} holds no json_2.1.1/ folder; is it an ALFWorld archive?")
        for folder in ARCHIVES[archive.name]:
            if (tree / folder).is_dir():
                _write_index(tree, folder)
        try:
            os.rename(partial, target)
        except OSError:  # another process finished first: use its copy
            if not (target / "json_2.1.1" / INDEX_FILE).is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target / "json_2.1.1"


# ----------------------------------------------------------------------------- the index
def _scan(tree: Path, folder: str) -> list[str]:
    """Upstream's filter: solvable games, no movable-receptacle or sliced-object trials."""
    ids = []
    for game_file in sorted((tree / folder).glob(f"*/*/{GAME_FILE}")):
        game_id = game_file.parent.relative_to(tree).as_posix()
        if "movable" in game_id or "Sliced" in game_id:
            continue
        with open(game_file, encoding="utf-8") as handle:
            if json.load(handle).get("solvable", False):
                ids.append(game_id)
    return ids


def _write_index(tree: Path, folder: str, index_path: Path | None = None) -> list[str]:
    index_path = index_path or tree / INDEX_FILE
    index = {"version": _INDEX_VERSION, "splits": {}}
    if index_path.is_file():
        index = json.loads(index_path.read_text())
    index["splits"][folder] = _scan(tree, folder)
    tmp = index_path.with_name(f".{index_path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(index))
    os.replace(tmp, index_path)
    return index["splits"][folder]


def _read_or_build_index(tree: Path, folder: str) -> list[str]:
    own = tree / INDEX_FILE
    if own.is_file():
        index = json.loads(own.read_text())
        if folder in index.get("splits", {}):
            return index["splits"][folder]
    # A tree we did not extract (e.g. $ALFWORLD_DATA): its index lives in the cache, keyed by
    # the folder's path and modification time, and is built once (the one slow start).
    stat = (tree / folder).stat()
    key = hashlib.sha256(f"{tree.resolve()}|{folder}|{stat.st_mtime_ns}".encode()).hexdigest()
    index_path = cache_dir() / "alfworld" / "index" / f"{folder}-{key[:16]}.json"
    if index_path.is_file():
        return json.loads(index_path.read_text())["splits"][folder]
    index_path.parent.mkdir(parents=True, exist_ok=True)
    return _write_index(tree, folder, index_path)
