"""crl-gym's import names do not collide with a project's own packages: a ``wrappers`` package of
the importing project (common in RL code) shadows crl-gym's older ``wrappers`` name, never the
library, which imports its wrappers as ``crl_wrappers``. (The wheel does not install ``wrappers``
at all: tests/test_packaging.py.)"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -c code`` in ``cwd`` (first on sys.path), with this checkout after it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_projects_own_wrappers_package_leaves_the_library_working(tmp_path):
    (tmp_path / "wrappers").mkdir()
    (tmp_path / "wrappers" / "__init__.py").write_text("MINE = True\n")
    (tmp_path / "wrappers" / "experience.py").write_text("MINE_TOO = True\n")
    done = _run("import gymnasium as gym, wrappers, crl_envs, crl_harness.rollout\n"
                "from crl_wrappers import ExperienceAugmentation\n"
                "assert wrappers.MINE  # the project's own package\n"
                "class NoTips:\n"
                "    def retrieve(self, env_id, query, k): return []\n"
                "env = ExperienceAugmentation(gym.make('CRL/Sokoban-v0'), NoTips())\n"
                "obs, info = env.reset(seed=0)\n"
                "assert info['experience_ids'] == []\n"
                "print('ok')", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_older_name_in_a_checkout_warns_and_is_the_same_objects(tmp_path):
    done = _run("import warnings\n"
                "import crl_wrappers, crl_wrappers.experience as new\n"
                "with warnings.catch_warnings(record=True) as caught:\n"
                "    warnings.simplefilter('always')\n"
                "    from wrappers import ExperienceAugmentation\n"
                "assert [w.category for w in caught] == [DeprecationWarning], caught\n"
                "assert 'crl_wrappers' in str(caught[0].message)\n"
                "assert caught[0].filename == '<string>', caught[0].filename  # the importing line\n"
                "from wrappers.experience import retrieval_query\n"
                "assert ExperienceAugmentation is crl_wrappers.ExperienceAugmentation\n"
                "assert retrieval_query is new.retrieval_query\n"
                "print('ok')", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_older_name_is_every_public_name_of_crl_wrappers_and_holds_no_code(tmp_path):
    # drifted copies once lacked experience_block / with_experience: the alias re-exports them all
    done = _run("import warnings\n"
                "with warnings.catch_warnings():\n"
                "    warnings.simplefilter('ignore', DeprecationWarning)\n"
                "    import wrappers, wrappers.experience\n"
                "import crl_wrappers, crl_wrappers.experience\n"
                "for old, new in ((wrappers, crl_wrappers),\n"
                "                 (wrappers.experience, crl_wrappers.experience)):\n"
                "    assert sorted(old.__all__) == sorted(new.__all__), (old, old.__all__)\n"
                "    missing = [n for n in new.__all__ if getattr(old, n, None) is not getattr(new, n)]\n"
                "    assert not missing, (old.__name__, missing)\n"
                "print('ok')", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    for module in (ROOT / "wrappers").glob("*.py"):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        defined = [node.name for node in ast.walk(tree)
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        assert defined == [], f"{module.name} defines {defined}: re-export crl_wrappers instead"
