"""crl-gym's requirements install beside the stacks its users run: pip's resolver (a dry run, no
install) resolves them with Hydra 1.3 (``omegaconf<2.4``) and with Gymnasium 1.3 and later.

The requirements are read from ``pyproject.toml``, the source of the wheel's ``Requires-Dist``.
The tests skip, with the reason, where no package index answers. Each extra's resolution runs
beside the others, one a core (pip's resolver uses one, and the suite runs one test at a time),
all started when the first of them is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomli on 3.10")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def requirements(*extras: str) -> list[str]:
    """The base requirements of crl-gym plus those of ``extras`` (one level of extras)."""
    project = _project()
    found = list(project["dependencies"])
    for extra in extras:
        found += project["optional-dependencies"][extra]
    return found


def _pip(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture(scope="module")
def index() -> None:
    """Skip unless pip reaches a package index that lists hydra-core."""
    probe = _pip("index", "versions", "hydra-core")
    if probe.returncode != 0 or "1.3.8" not in probe.stdout:
        pytest.skip("no package index reachable (pip index versions hydra-core failed: "
                    f"{(probe.stderr.strip().splitlines() or ['?'])[-1]})")


def resolve(requirements: list[str]) -> dict[str, str]:
    """What pip would install for ``requirements`` in an empty environment: name -> version."""
    done = _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
                *requirements)
    assert done.returncode == 0, f"pip cannot resolve {requirements}:\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout)
    return {item["metadata"]["name"].lower(): item["metadata"]["version"]
            for item in report["install"]}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2])


def test_exact_pins_carry_their_reason():
    """An ``==`` pin in pyproject.toml has a comment on its line or the lines just above."""
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    for i, line in enumerate(lines):
        if "==" in line and not line.lstrip().startswith("#"):
            context = lines[max(0, i - 4):i + 1]
            assert any("#" in c for c in context), f"pyproject.toml:{i + 1}: a pin without a reason"


@pytest.mark.parametrize("extras", [(), ("minihack",)], ids=["base", "minihack"])
def test_installs_beside_hydra_1_3(index, extras):
    resolved = resolve([*requirements(*extras), "hydra-core==1.3.8"])
    assert resolved["hydra-core"] == "1.3.8"
    assert _release(resolved["omegaconf"]) == (2, 3)


def test_installs_beside_current_gymnasium(index):
    resolved = resolve([*requirements(), "gymnasium>=1.3", "hydra-core==1.3.8"])
    assert _release(resolved["gymnasium"]) >= (1, 3)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="TRL 1.16 needs Python 3.11")
def test_trl_extra_installs_beside_the_train_extra(index):
    """The ``trl`` extra keeps the ``train`` extra's torch (install.sh's 2.13.0) and its
    transformers range; it is part of ``all`` on Python 3.11+."""
    resolved = resolve([*requirements("train", "trl"), "torch==2.13.0"])
    assert _release(resolved["trl"]) >= (1, 16) and resolved["torch"].startswith("2.13.0")
    assert _release(resolved["transformers"]) < (5, 20)
    assert "crl-gym[trl]; python_version >= '3.11'" in _project()["optional-dependencies"]["all"]


@pytest.fixture(scope="module")
def extras_resolved(index, request):
    """The resolution of each extra that this session's ``test_every_extra_keeps_what_minihack_needs``
    cases ask for (extra -> a future of ``resolve``), all started at once, one a core."""
    extras = [item.callspec.params["extra"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_every_extra_keeps_what_minihack_needs"]
    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
        futures = {extra: pool.submit(resolve, requirements(extra)) for extra in extras}
        yield futures
        for future in futures.values():
            future.cancel()  # (a run stopped early waits for the running ones only)


@pytest.mark.parametrize("extra", [e for e in _project()["optional-dependencies"] if e != "all"])
def test_every_extra_keeps_what_minihack_needs(extras_resolved: dict[str, Future], extra):
    """minihack 1.0.2 imports pkg_resources, which setuptools 82 removed: an extra installed after
    ``minihack`` (``train``'s torch, ``webshop``'s spaCy pull setuptools in) keeps it below 82."""
    resolved = extras_resolved[extra].result()
    if "setuptools" in resolved:
        assert _release(resolved["setuptools"]) < (82,), f"[{extra}] brings {resolved['setuptools']}"


def test_the_serving_extra_asks_for_the_train_extras_transformers():
    """``transformers serve`` (the serving extra) serves with the transformers crl trains with."""
    extras = _project()["optional-dependencies"]
    [train] = [r for r in extras["train"] if r.startswith("transformers")]
    [serving] = [r for r in extras["serving"] if r.startswith("transformers")]
    assert serving == train.replace("transformers", "transformers[serving]", 1)
