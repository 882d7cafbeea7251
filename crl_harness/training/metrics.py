"""Per-step metrics: one JSON line per step (``metrics.jsonl``), TensorBoard scalars, and a
learning-curve PNG drawn from the JSONL.

Holds ``MetricsLogger`` and ``plot_learning_curve``. Each line is flushed and fsynced when the
step ends, so a killed run loses nothing it logged; a resumed run first drops the lines of steps
after its checkpoint, which the resumed run will log again.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["MetricsLogger", "read_metrics", "plot_learning_curve"]


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


def plot_learning_curve(metrics_path: str | os.PathLike, png_path: str | os.PathLike,
                        title: str = "") -> Path:
    """Success (all, guided, free, per env), reward and losses against the step, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    panels = [
        ("success rate", lambda k: k.startswith("success/")),
        ("mean episode reward", lambda k: k.startswith("reward/")),
        ("loss", lambda k: k.startswith("loss/")),
        ("bank size", lambda k: k == "bank/size"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (label, wanted) in zip(axes, panels, strict=True):
        keys = sorted({k for r in records for k in r if wanted(k)})
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
