"""SWE task rows: SWE-bench Verified (local data or the upstream dataset) and the toy task.

Holds ``load_instances`` (rows in swebench 5.x's format, through ``crl_envs.data.resolve_data``),
``read_task_ids`` (a task list given as ids or a file), ``UPSTREAM_ID``, ``TOY_DIR``.

Rows are read with swebench's own ``load_swebench_dataset``. SWE-bench Verified resolves as
``swebench/verified_test.parquet`` under the data directories of docs/design.md; where it is absent,
the upstream dataset id is loaded from the Hugging Face hub (machines with internet).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from crl_envs.data import DataNotFoundError, hub_offline, hub_reachable, resolve_data
from crl_envs.errors import MissingExtraError

__all__ = ["UPSTREAM_ID", "TOY_DIR", "VERIFIED_FILE", "load_instances", "read_task_ids"]

# The hub id swebench 5.x reads Verified from (it has `eval_script`, `image`, `log_parser`);
# `princeton-nlp/SWE-bench_Verified` is its former name.
UPSTREAM_ID = "SWE-bench/SWE-bench_Verified"
VERIFIED_FILE = "verified_test.parquet"
# Shipped inside the package (not the checkout's assets/), so a pip-installed crl-gym has it.
TOY_DIR = Path(__file__).resolve().parent / "toy"


@functools.lru_cache(maxsize=8)
def _load(name: str) -> tuple[dict[str, Any], ...]:
    import datasets
    from swebench.harness.utils import load_swebench_dataset

    # The datasets library draws a "Generating ... split" bar the first time it caches a file;
    # that is our loading, not the user's, so it is hidden, and the user's setting restored.
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        return tuple(dict(row) for row in load_swebench_dataset(name, split="test"))
    finally:
        if bars:
            datasets.enable_progress_bars()


def _verified_source(data_dir: str | os.PathLike | None) -> str:
    try:
        return str(resolve_data("swebench", data_dir, required=(VERIFIED_FILE,)) / VERIFIED_FILE)
    except DataNotFoundError:
        if data_dir is not None:
            raise
        return UPSTREAM_ID


def read_task_ids(task_ids: str | os.PathLike | list[str] | tuple[str, ...] | None) -> list[str] | None:
    """A task list: ids (list, or a comma-separated string), or a file with one id a line.

    Blank lines and ``#`` comments in a file are skipped (``crl swe filter`` writes such files).

    >>> read_task_ids("a__b-1, c__d-2")
    ['a__b-1', 'c__d-2']
    """
    if task_ids is None:
        return None
    if isinstance(task_ids, (list, tuple)):
        return [str(task_id) for task_id in task_ids]
    path = Path(task_ids)
    if path.is_file():
        lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
        return [line for line in lines if line]
    return [part.strip() for part in str(task_ids).split(",") if part.strip()]


def load_instances(dataset: str = "verified", data_dir: str | os.PathLike | None = None,
                   task_ids: str | os.PathLike | list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of ``dataset`` in swebench's format, restricted to ``task_ids`` (in that order).

    ``dataset``: ``"verified"`` (SWE-bench Verified: local data, else the upstream id),
    ``"toy"`` (the shipped toy task), a ``.parquet``/``.json``/``.jsonl`` path, or a hub id.
    Raises ``DataNotFoundError`` (saying how to get the data) or ``KeyError`` for unknown ids.

    >>> [row["instance_id"] for row in load_instances("toy")]
    ['crl-gym__toy-intervals-1']
    """
    if dataset == "toy":
        name = str(TOY_DIR / "task.json")
    elif dataset == "verified":
        name = _verified_source(data_dir)
        if name == UPSTREAM_ID and not hub_offline() and not hub_reachable():
            # the datasets library would retry the hub five times (about 30 s, ten lines)
            raise DataNotFoundError(
                f"SWE-bench Verified is not on this machine and the hub does not answer here "
                f"({os.environ.get('HF_ENDPOINT') or 'huggingface.co'}). Run `crl data fetch "
                f"swebench` where it does, or set $CRL_DATA_DIR to a folder holding "
                f"swebench/{VERIFIED_FILE} (a copy in the datasets cache loads with "
                "HF_HUB_OFFLINE=1).")
    else:
        name = str(dataset)
    try:
        rows = _load(name)
    except ImportError as err:
        raise MissingExtraError("SWE tasks need swebench: pip install 'crl-gym[swebench]'.",
                                name=err.name) from err
    except Exception as err:
        if name != UPSTREAM_ID:
            raise
        raise DataNotFoundError(
            f"SWE-bench Verified is not on this machine and the hub dataset {UPSTREAM_ID} could "
            f"not be loaded ({type(err).__name__}: {err}). Run `crl data fetch swebench`, or set "
            f"$CRL_DATA_DIR to a folder holding swebench/{VERIFIED_FILE}."
        ) from err
    wanted = read_task_ids(task_ids)
    if wanted is None:
        return [dict(row) for row in rows]
    by_id = {row["instance_id"]: row for row in rows}
    unknown = [task_id for task_id in wanted if task_id not in by_id]
    if unknown:
        raise KeyError(f"{len(unknown)} task id(s) not in {dataset}: {', '.join(unknown[:5])}")
    return [dict(by_id[task_id]) for task_id in wanted]
