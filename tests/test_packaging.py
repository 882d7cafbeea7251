"""The shipped assets (configs, prompts, warm starts) from a checkout and from an installed wheel."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

import crl_harness.assets as assets
from crl_harness.assets import AssetsNotFoundError, assets_dir
from crl_harness.models.names import resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
WARM_START = "assets/warmstart/cpu-demo/actor"


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment minus PYTHONPATH, so a child imports what its interpreter has installed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def test_assets_dir_is_the_checkouts():
    assert assets_dir() == ROOT / "assets"


def test_warm_start_spec_resolves_from_another_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Path(resolve_model_path(WARM_START)) == ROOT / WARM_START
    # A path that exists from here is the user's own and wins over the shipped one.
    (tmp_path / WARM_START).mkdir(parents=True)
    assert resolve_model_path(WARM_START) == WARM_START


def test_hardening_no_assets_anywhere_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(assets, "_checkout_assets", lambda: None)
    monkeypatch.setattr(assets, "_installed_assets", lambda: None)
    assets_dir.cache_clear()
    try:
        with pytest.raises(AssetsNotFoundError, match="reinstall crl-gym"):
            assets_dir()
    finally:
        assets_dir.cache_clear()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """crl-gym's wheel, built offline from a copy of this checkout."""
    # A copy, so the build's build/ and egg-info folders (which keep stale files) stay out of the
    # checkout; no build isolation: setuptools is installed, and no index is needed.
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "runs", "*.egg-info", "__pycache__", ".*_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(work / "dist"), str(source)], check=True, cwd=work,
                   env=_clean_env())
    return next((work / "dist").glob("crl_gym-*.whl"))


def test_hardening_the_wheel_owns_no_generic_top_level_name(wheel):
    """Every top-level name the wheel installs is crl's own: no ``wrappers`` package that another
    distribution's ``wrappers`` would overwrite (or delete on its uninstall)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        top_level = archive.read(f"{dist_info}/top_level.txt").decode().split()
    assert {n.split("/")[0] for n in names} == {
        "crl_envs", "crl_wrappers", "crl_harness", dist_info, dist_info.replace(".dist-info", ".data")}
    assert sorted(top_level) == ["crl_envs", "crl_harness", "crl_wrappers"]


WHEEL_CHECKS = textwrap.dedent(f"""
    import sys
    from pathlib import Path

    import gymnasium

    import crl_envs  # noqa: F401  (registers the CRL ids)
    import crl_harness
    from crl_harness.assets import assets_dir
    from crl_harness.config import load_config
    from crl_harness.experience.prompts import load_prompt
    from crl_harness.models.names import resolve_model_path

    assert Path(crl_harness.__file__).is_relative_to(sys.prefix), crl_harness.__file__
    assert Path(assets_dir()).is_relative_to(sys.prefix), assets_dir()
    from crl_harness.config import check_lora_fits

    cpu_demo = load_config("cpu-demo")
    assert cpu_demo.starting_model() == "hf:{WARM_START}"
    check_lora_fits(cpu_demo, ("actor", "extractor"))  # the shipped adapters, from elsewhere
    assert "$transcript" in load_prompt("experience_distill").template
    assert (Path(resolve_model_path("{WARM_START}")) / "adapter_config.json").is_file()
    env = gymnasium.make("CRL/Sokoban-v0")
    env.reset(seed=0)
    # LocalSandbox's commands run under the installed reaper program, a file run by path.
    import warnings

    from crl_envs.swebench.sandbox import LocalSandbox, reaper

    assert Path(reaper.__file__).is_relative_to(sys.prefix), reaper.__file__
    Path("box-source").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        box = LocalSandbox("box-source")
    result = box.run("echo reaped; exit 3", timeout=30)
    box.close()
    assert (result.output, result.exit_code) == ("reaped\\n", 3), result
    print("wheel checks ok")
""")


@pytest.mark.slow
def test_wheel_installs_assets_that_an_installed_copy_finds(tmp_path, wheel):
    """Install the wheel (no dependencies: this venv's are reused) into a fresh venv, beside a
    distribution that ships `wrappers`, and use configs, prompts, the warm start and an env from
    elsewhere."""
    target = tmp_path / "venv"
    venv.create(target, with_pip=False)
    python = target / "bin" / "python"
    # --ignore-installed: the editable crl-gym of this venv is left alone, the wheel shadows it.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--ignore-installed", str(wheel)],
                   check=True, cwd=tmp_path, env=_clean_env())
    # The dependencies come from this venv (a venv's --system-site-packages would be the base
    # interpreter's): its folders go after the new venv's own on sys.path. Plain paths in a .pth
    # file do not run this venv's .pth hooks, so its editable crl-gym finder stays out.
    child_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                                check=True, capture_output=True, text=True).stdout.strip()
    Path(child_site, "parent_venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    elsewhere = tmp_path / "project"
    elsewhere.mkdir()

    # Another distribution that ships a top-level `wrappers`, installed beside crl-gym and then
    # uninstalled, changes no file of crl-gym's.
    def crl_files() -> dict[str, bytes]:
        return {str(p.relative_to(child_site)): p.read_bytes()
                for name in ("crl_envs", "crl_wrappers", "crl_harness", "wrappers")
                for p in Path(child_site, name).rglob("*.py")}

    before = crl_files()
    other = tmp_path / "other"
    (other / "wrappers").mkdir(parents=True)
    (other / "wrappers" / "__init__.py").write_text("MINE = True\n")
    (other / "pyproject.toml").write_text(
        '[project]\nname = "other-wrappers"\nversion = "1.0"\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n')
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "other-dist"), str(other)], check=True,
                   cwd=tmp_path, env=_clean_env())
    for command in (["install", "--no-deps", next((tmp_path / "other-dist").glob("*.whl"))],
                    ["uninstall", "-y", "other-wrappers"]):
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "-q", *map(str, command)],
                       check=True, cwd=tmp_path, env=_clean_env())
    assert before and crl_files() == before

    shipped = {p.relative_to(ROOT / "assets") for p in (ROOT / "assets").rglob("*") if p.is_file()}
    installed_root = Path(subprocess.run(
        [str(python), "-c", "from crl_harness.assets import assets_dir; print(assets_dir())"],
        check=True, capture_output=True, text=True, cwd=elsewhere, env=_clean_env()).stdout.strip())
    installed = {p.relative_to(installed_root) for p in installed_root.rglob("*") if p.is_file()}
    assert shipped == installed  # pyproject's data-files miss nothing (a new warm start folder)
    docs = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert docs and docs == {p.name for p in (installed_root.parent / "docs").glob("*.md")}

    checks = subprocess.run([str(python), "-c", WHEEL_CHECKS], capture_output=True, text=True,
                            cwd=elsewhere, env=_clean_env())
    assert checks.returncode == 0, checks.stderr
    assert "wheel checks ok" in checks.stdout
    run = subprocess.run([str(target / "bin" / "crl"), "eval", "--agent", "scripted", "--envs",
                          "CRL/Sokoban-v0", "--episodes", "3", "--no-progress"],
                         capture_output=True, text=True, cwd=elsewhere, env=_clean_env())
    assert run.returncode == 0, run.stderr
    assert "CRL/Sokoban-v0" in run.stdout


# README's commands for MiniHack with training, in its order ("Installing into your own project"):
# the [minihack] extra, then torch's CPU build, then [minihack,train]. Installed that way, torch
# once pulled setuptools 84, and minihack then failed to import (no pkg_resources).
README_MINIHACK_INSTALL = (
    "pip install './crl-gym[minihack]' 'hydra-core==1.3.8'",
    "pip install torch --index-url https://download.pytorch.org/whl/cpu",
    "pip install './crl-gym[minihack,train]'",
)
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"

MAKE_EVERY_MINIHACK_ID = textwrap.dedent("""
    import gymnasium

    import crl_envs  # noqa: F401  (registers the CRL ids)
    import torch

    ids = sorted(i for i in gymnasium.registry if i.startswith("CRL/MiniHack"))
    assert len(ids) >= 4, ids
    for env_id in ids:
        env = gymnasium.make(env_id)
        env.reset(seed=0)
        env.close()
    print("made", " ".join(ids), "torch", torch.__version__)
""")


def _reachable(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=15):
            return True
    except OSError:
        return False


@pytest.mark.slow
def test_readme_minihack_install_order_makes_every_minihack_id(tmp_path, wheel):
    """The wheel installed into a fresh venv by README's MiniHack commands, in README's order, with
    their dependencies from the package index: every CRL/MiniHack id makes and resets there.
    About 30 s with pip's cache warm (unpacking torch's CPU wheel is most of it)."""
    readme = (ROOT / "README.md").read_text()
    at = [readme.find(f"\n{command} ") for command in README_MINIHACK_INSTALL]
    assert -1 not in at and at == sorted(at), "README's MiniHack commands changed: update this test"
    pip = [sys.executable, "-m", "pip"]
    probe = subprocess.run([*pip, "index", "versions", "nle"], capture_output=True, text=True,
                           timeout=120, env=_clean_env())
    if probe.returncode != 0:
        pytest.skip("no package index reachable (pip index versions nle failed: "
                    f"{(probe.stderr.strip().splitlines() or ['?'])[-1]})")
    cpu_index_reachable = _reachable(CPU_TORCH_INDEX + "/torch/")
    target = tmp_path / "venv"
    venv.create(target, with_pip=False)
    python = str(target / "bin" / "python")
    for command in README_MINIHACK_INSTALL:
        args = [a.strip("'").replace("./crl-gym", str(wheel)) for a in command.split()[2:]]
        # --retries 0: where download.pytorch.org is unreachable, pip falls through to its other
        # configured sources (a local CPU wheel) at once, instead of after five retries per name.
        # --no-compile: no .pyc for the whole of torch and transformers (what is installed, and
        # in what order, is the same; the check below compiles only what it imports).
        done = subprocess.run([*pip, "--python", python, "install", "-q", "--retries", "0",
                               "--no-compile", *args],
                              capture_output=True, text=True, timeout=900, cwd=tmp_path,
                              env=_clean_env())
        if done.returncode != 0 and "torch" in args and not cpu_index_reachable:
            pytest.skip(f"{CPU_TORCH_INDEX} is unreachable and pip's other sources hold no torch")
        assert done.returncode == 0, f"{command}:\n{done.stderr[-3000:]}"
    made = subprocess.run([python, "-c", MAKE_EVERY_MINIHACK_ID], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=_clean_env())
    assert made.returncode == 0, made.stderr[-3000:]
    assert "CRL/MiniHackRoom-v0" in made.stdout
    assert "+cpu" in made.stdout, f"README's torch command installed no CPU build: {made.stdout}"
