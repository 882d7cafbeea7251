"""Per-step metrics: one JSON line per step (``metrics.jsonl``), TensorBoard scalars, and a
learning-curve PNG drawn from the JSONL.

Holds ``MetricsLogger``, ``read_metrics``, ``short_env_name`` (an env's name in metric keys),
``env_names``, ``curve_panels`` and ``plot_learning_curve``. Each line is flushed and fsynced
when the step ends, so a killed run loses nothing it logged; a resumed run first drops the lines
of steps after its checkpoint, which the resumed run will log again.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "read_metrics", "pooled_pairs", "PAIR_SETS", "short_env_name", "env_names", "curve_panels",
           "plot_learning_curve"]


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a ``metrics.jsonl`` (a torn last line, from a killed run, is skipped)."""
    records = []
    p = Path(path)
    if not p.exists():
        return records
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class MetricsLogger:
    """Appends ``{"step": s, **metrics}`` to ``run_dir/metrics.jsonl`` and to TensorBoard.

    ``resume_step``: drop logged steps after it (they happened after the last checkpoint).

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> log = MetricsLogger(d, tensorboard=False)
    >>> log.log(1, {"success/all": 0.5}); log.log(2, {"success/all": 1.0}); log.close()
    >>> log = MetricsLogger(d, tensorboard=False, resume_step=1); log.close()
    >>> [r["step"] for r in read_metrics(log.path)]
    [1]
    """

    def __init__(self, run_dir: str | os.PathLike, *, tensorboard: bool = True,
                 resume_step: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None:
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
            os.replace(tmp, self.path)
        self._handle = open(self.path, "a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self._writer = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def close(self) -> None:
        self._handle.close()
        if self._writer is not None:
            self._writer.close()


PAIR_SETS = {"all": "pairs", "revisits": "pairs_revisit", "first visits": "pairs_first"}
"""Where guided - free is counted (``step_metrics``): every group, the groups of levels an
earlier step played (the bank may hold their lesson), the groups of levels played first."""


def pooled_pairs(records: Sequence[Mapping[str, float]], prefix: str = "pairs") -> Any:
    """Guided against free (``crl_harness.eval.PairedDifference``, A free, B guided), the pairs
    ``step_metrics`` counted under ``prefix`` summed over ``records`` (steps, runs).

    >>> d = pooled_pairs([{"pairs_revisit/guided_free": 4, "pairs_revisit/free_wins": 1,
    ...                    "pairs_revisit/guided_wins": 3, "pairs_revisit/free_only": 0,
    ...                    "pairs_revisit/guided_only": 2}] * 2, "pairs_revisit")
    >>> d.n, d.difference
    (8, 0.5)
    """
    from crl_harness.eval import PairedDifference

    def total(key: str) -> int:
        return sum(int(r.get(f"{prefix}/{key}", 0) or 0) for r in records)

    return PairedDifference(n=total("guided_free"), a_wins=total("free_wins"),
                            b_wins=total("guided_wins"), only_a=total("free_only"),
                            only_b=total("guided_only"))


def short_env_name(env_id: str) -> str:
    """An env's name in metric keys (``success/ENV``) and in ``crl demo``'s tables.

    >>> short_env_name("CRL/MiniHackRoom-v0")
    'MiniHackRoom'
    """
    return env_id.split("/")[-1].removesuffix("-v0")


_POOLED_SUCCESS = {"success/all", "success/guided", "success/free"}


def env_names(records: list[dict]) -> list[str]:
    """The envs whose success the records log (``success/ENV``, the trainer's short names).

    >>> env_names([{"step": 1, "success/all": 0.5, "success/Sokoban": 0.5,
    ...             "success/Sokoban/guided": 1.0, "success/WebShop": 0.5}])
    ['Sokoban', 'WebShop']
    """
    return sorted({k.split("/")[1] for r in records for k in r if _env_success(k)})


def _env_success(key: str) -> bool:
    """Whether ``key`` is one env's success rate (``success/ENV``)."""
    return key.startswith("success/") and key.count("/") == 1 and key not in _POOLED_SUCCESS


def curve_panels(records: list[dict]) -> list[tuple[str, list[str]]]:
    """The panels of the learning curve, each a label and the keys it draws a line for: a run
    of one env draws its env's success beside the pooled rates; a mixture draws one line per env
    in panels of their own, success and the format failure rate (replies that break the answer
    format over turns).

    >>> one = [{"step": 1, "success/all": 1.0, "success/Sokoban": 1.0, "success/Sokoban/free": 1.0}]
    >>> curve_panels(one)[0]
    ('success rate', ['success/Sokoban', 'success/all'])
    >>> two = [{"step": 1, "success/all": 0.5, "success/Sokoban": 1.0, "success/WebShop": 0.0,
    ...         "format_failure_rate/Sokoban": 0.0, "format_failure_rate/WebShop": 0.5}]
    >>> [label for label, _ in curve_panels(two)][:3]
    ['success rate', 'success rate per env', 'format failure rate per env']
    >>> curve_panels(two)[1][1]
    ['success/Sokoban', 'success/WebShop']
    """
    envs = env_names(records)
    wanted = [
        ("success rate", lambda k: k in _POOLED_SUCCESS or (len(envs) == 1 and _env_success(k))),
        ("mean episode reward", lambda k: k.startswith("reward/")),
        ("loss", lambda k: k.startswith("loss/")),
        ("bank size", lambda k: k == "bank/size"),
    ]
    if len(envs) > 1:  # a mixture: a line per env, apart from the pooled rates
        wanted[1:1] = [("success rate per env", _env_success),
                       ("format failure rate per env",
                        lambda k: k.startswith("format_failure_rate/"))]
    return [(label, sorted({k for r in records for k in r if test(k)})) for label, test in wanted]


def plot_learning_curve(metrics_path: str | os.PathLike, png_path: str | os.PathLike,
                        title: str = "") -> Path:
    """Success (all, guided, free, per env), reward and losses against the step, as one PNG
    (``curve_panels``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    panels = curve_panels(records)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (label, keys) in zip(axes, panels, strict=True):
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r and math.isfinite(r[key])]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=key)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        if keys:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    png_path = Path(png_path)
    tmp = png_path.with_name(f".{png_path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, png_path)
    return png_path
