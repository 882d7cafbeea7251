"""Where the shipped assets (configs, prompts, warm-start adapters) lie.

- ``assets_dir``: the ``assets/`` folder of the checkout (a source tree or an editable install),
  else the one a wheel installed as data files under ``<prefix>/share/crl-gym/assets``.
- ``AssetsNotFoundError``: neither exists (a broken install).

The folder stays at the checkout's root, where the docs and ``hf:assets/...`` specs name it; a
wheel cannot put it beside the packages without a top-level ``assets`` package, so
``pyproject.toml`` maps it to data files, and an installed copy finds them through the
distribution's file list (right for a venv, ``--user`` and ``--prefix`` installs alike).
"""

from __future__ import annotations

from functools import cache
from importlib import metadata
from pathlib import Path

__all__ = ["AssetsNotFoundError", "assets_dir", "DISTRIBUTION", "DATA_SUBDIR"]

DISTRIBUTION = "crl-gym"
DATA_SUBDIR = "share/crl-gym/assets"  # under the install prefix; pyproject's data-files


class AssetsNotFoundError(FileNotFoundError):
    """Neither the checkout's nor an installed copy's assets folder exists."""


def _checkout_assets() -> Path | None:
    """``<checkout>/assets`` when this package runs from a source tree."""
    root = Path(__file__).resolve().parents[1]
    # pyproject.toml tells a checkout from site-packages, where another distribution may have
    # put a top-level ``assets`` folder of its own.
    if (root / "pyproject.toml").is_file() and (root / "assets").is_dir():
        return root / "assets"
    return None


def _installed_assets() -> Path | None:
    """The data-files copy a wheel install recorded, wherever its scheme put it."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    marker = DATA_SUBDIR + "/"
    for record in dist.files or []:
        # RECORD names data files relative to site-packages (``../../../share/crl-gym/...``).
        posix = record.as_posix()
        at = posix.find(marker)
        if at >= 0:
            folder = Path(dist.locate_file(posix[: at + len(DATA_SUBDIR)])).resolve()
            if folder.is_dir():
                return folder
    return None


@cache
def assets_dir() -> Path:
    """The assets folder: the checkout's first (its files are the ones being edited), else the
    installed copy.

    Example:
        >>> (assets_dir() / "configs" / "cpu-demo.yaml").is_file()
        True
    """
    found = _checkout_assets() or _installed_assets()
    if found is None:
        raise AssetsNotFoundError(
            f"crl-gym's assets folder was not found: not beside the package "
            f"({Path(__file__).resolve().parents[1]}) and not in the installed data files "
            f"({DATA_SUBDIR}); reinstall crl-gym (pip install --force-reinstall crl-gym).")
    return found
