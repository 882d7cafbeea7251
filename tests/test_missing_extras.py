"""Without an optional extra (or with a setuptools too new for minihack), ``gym.make`` raises an
``ImportError`` whose message is the install command, and ``crl play`` and ``crl eval
--env-kwargs`` print that one line instead of a traceback.

Each case runs in a child interpreter where the modules are hidden (``sys.modules[name] = None``
makes both ``import`` and ``find_spec`` miss them), since this process may have imported the envs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HIDE_THEN = "import sys\nfor name in {hidden!r}: sys.modules[name] = None\n"


def _run(hidden: list[str], code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", HIDE_THEN.format(hidden=hidden) + code], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def _cli(hidden: list[str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return _run(hidden, f"from crl_harness.cli import main\nsys.exit(main({argv!r}))", cwd)


CASES = [
    (["nle", "minihack"], "CRL/MiniHackRoom-v0", "variant=dark",
     "The MiniHack env needs the minihack extra (No module named 'nle'): "
     "pip install 'crl-gym[minihack]'."),
    (["pkg_resources"], "CRL/MiniHackRoom-v0", "variant=dark",
     "minihack 1.0.2 imports pkg_resources, which setuptools 82 and later no longer have: "
     "pip install 'setuptools<82'."),
    (["regex"], "CRL/WebShop-v0", "max_episode_steps=5",
     "The WebShop env needs the webshop extra (No module named 'regex'): "
     "pip install 'crl-gym[webshop]'."),
    (["swebench"], "CRL/SWEBenchToy-v0", "max_episode_steps=5",
     "SWE tasks need swebench: pip install 'crl-gym[swebench]'."),
]


@pytest.mark.parametrize(("hidden", "env_id", "kwarg", "line"), CASES,
                         ids=[c[1] + "-without-" + c[0][0] for c in CASES])
def test_hardening_a_missing_extra_is_one_line(tmp_path, hidden, env_id, kwarg, line):
    made = _run(hidden, "import gymnasium as gym, crl_envs\n"
                        "from crl_envs.errors import MissingExtraError\n"
                        "try:\n"
                        f"    gym.make({env_id!r})\n"
                        "except ImportError as err:\n"
                        "    assert isinstance(err, MissingExtraError), type(err)\n"
                        "    print(err)\n", tmp_path)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == line
    played = _cli(hidden, ["play", env_id], tmp_path)
    assert (played.returncode, played.stderr) == (2, f"crl play: {line}\n")
    evaluated = _cli(hidden, ["eval", "--agent", "scripted", "--envs", env_id, "--episodes", "1",
                              "--env-kwargs", kwarg, "--out", str(tmp_path / "ev"),
                              "--no-progress"], tmp_path)
    assert (evaluated.returncode, evaluated.stderr) == (2, f"crl eval: {line}\n")
