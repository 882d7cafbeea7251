"""Shared fixtures: data-dependent tests skip with the fetch command when the data is absent."""

from __future__ import annotations

import pytest

from crl_envs.data import DataNotFoundError, resolve_data


def require_data(name: str, *files: str):
    """Return the dataset directory, or skip the test with the message that says how to get it."""
    try:
        return resolve_data(name, required=tuple(files))
    except DataNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture
def data_dir():
    return require_data
