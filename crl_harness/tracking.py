"""Run tracking beyond ``metrics.jsonl`` and TensorBoard: Weights & Biases and MLflow, as TRL's and
BALROG's users have them (``report_to``).

Holds ``REPORT_TO`` (the services), ``check_services``, ``open_trackers`` and ``Trackers``, which ``crl train
--report-to`` feeds each step's metrics and ``crl eval --report-to`` the results per env. Each
service is configured the way its own users configure it, by its environment variables:
W&B by ``WANDB_MODE`` (``offline``: a run folder under the run's own, to ``wandb sync`` later),
``WANDB_PROJECT`` (default ``crl-gym``), ``WANDB_ENTITY``; MLflow by ``MLFLOW_TRACKING_URI``
(a server, ``sqlite:///mlflow.db``, or a file store with ``MLFLOW_ALLOW_FILE_STORE=true``) and
``MLFLOW_EXPERIMENT_NAME`` (default ``crl-gym``). Both are the ``tracking`` extra.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from crl_envs.errors import UserFacingError, require_extra

__all__ = ["REPORT_TO", "Tracker", "Trackers", "check_services", "open_trackers"]

REPORT_TO: dict[str, str] = {"wandb": "wandb", "mlflow": "mlflow"}
"""service name (what ``--report-to`` takes) -> the module that reports to it"""

PROJECT = "crl-gym"
"""the W&B project and MLflow experiment where none is set"""


class Tracker(Protocol):
    """One service's run: numeric metrics by step, then closed."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class WandbTracker:
    """A W&B run (``wandb.init``) in ``run_dir``, with ``config`` as its config."""

    def __init__(self, name: str, run_dir: Path, config: Mapping[str, Any]) -> None:
        import wandb

        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=name,
                               dir=str(run_dir), config=dict(config))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    """An MLflow run of the experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``crl-gym``), with
    ``config`` as its ``config.json`` artifact (params cap a value at 6,000 characters)."""

    def __init__(self, name: str, run_dir: Path, config: Mapping[str, Any]) -> None:
        import mlflow

        self._mlflow = mlflow
        # Looked up in the store in use now, not through mlflow's process-wide active experiment,
        # which would name another store's experiment after a change of MLFLOW_TRACKING_URI.
        experiment = os.environ.get("MLFLOW_EXPERIMENT_ID")
        if experiment is None:
            client = mlflow.tracking.MlflowClient()
            title = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
            found = client.get_experiment_by_name(title)
            experiment = found.experiment_id if found else client.create_experiment(title)
        self._run = mlflow.start_run(run_name=name, experiment_id=experiment)
        mlflow.log_dict(dict(config), "config.json")
        mlflow.set_tag("crl.run_dir", str(run_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._mlflow.log_metrics(dict(metrics), step=step, run_id=self._run.info.run_id)

    def close(self) -> None:
        self._mlflow.end_run()


_TRACKERS = {"wandb": WandbTracker, "mlflow": MlflowTracker}


class Trackers:
    """The runs ``open_trackers`` opened; ``log`` passes each the finite numbers of a step.

    >>> trackers = Trackers([])
    >>> trackers.log(1, {"success/all": 0.5})
    >>> trackers.close()
    """

    def __init__(self, trackers: Iterable[Tracker]) -> None:
        self._trackers = list(trackers)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log the finite numeric ``metrics`` of ``step`` to every service (a NaN, such as an
        env's success rate where all its episodes failed, is left out, not charted as 0)."""
        numbers = {key: float(value) for key, value in metrics.items()
                   if isinstance(value, int | float) and not isinstance(value, bool)
                   and math.isfinite(value)}
        for tracker in self._trackers:
            tracker.log(step, numbers)

    def close(self) -> None:
        for tracker in self._trackers:
            tracker.close()


def check_services(report_to: Iterable[str]) -> list[str]:
    """The services of ``report_to`` without repeats, after checking that each is one of
    ``REPORT_TO`` and its package is installed (one ``UserFacingError`` otherwise); no run
    is opened, so a command checks this before it loads anything."""
    services = list(dict.fromkeys(report_to))
    for service in services:
        if service not in REPORT_TO:
            raise UserFacingError(f"--report-to {service}: not a service crl reports to; choose "
                                  f"from {', '.join(REPORT_TO)}.")
        require_extra("tracking", [REPORT_TO[service]], f"--report-to {service}")
    return services


def open_trackers(report_to: Iterable[str], *, name: str, run_dir: Path,
                  config: Mapping[str, Any]) -> Trackers:
    """Open a run on each service of ``report_to`` (names of ``REPORT_TO``), named ``name``, with
    ``config``; a service whose package is missing, or that refuses to start, is one
    ``UserFacingError`` naming it, before anything runs.

    >>> open_trackers(["neptune"], name="r", run_dir=Path("."), config={})
    Traceback (most recent call last):
    ...
    crl_envs.errors.UserFacingError: --report-to neptune: not a service crl reports to; choose from wandb, mlflow.
    """
    services = check_services(report_to)
    opened: list[Tracker] = []
    try:
        for service in services:
            try:
                opened.append(_TRACKERS[service](name, run_dir, config))
            except Exception as err:  # noqa: BLE001 - each service raises types of its own
                reason = " ".join(str(err).split())[:400]
                raise UserFacingError(f"--report-to {service}: the run did not start "
                                      f"({type(err).__name__}: {reason})") from err
    except BaseException:
        Trackers(opened).close()
        raise
    return Trackers(opened)
