"""The library's layout holds (docs/design.md): the layers import down only, no module imports
itself back through others, no module outgrows a reader (450 lines), and a new env needs
nothing outside ``crl_envs``.

The import graph is read from the source (``ast``), not by importing it: an import counts where
it runs when its module is imported (the module's body, ``try`` and ``if`` blocks included) and
under ``if TYPE_CHECKING:`` (a circle a type checker follows is still a circle of concepts); an
import inside a function runs on call and does not count. ``from A import B`` counts as an
import of the module ``A.B`` where that is a module, else of ``A``; importing ``A.B`` does not
count as importing its package ``A`` (every package would then import its own submodules).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import gymnasium as gym
import pytest

import crl_envs
from crl_envs import TextEnv, Transition
from crl_envs.oracles import ORACLES
from crl_harness.cli import main

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("crl_envs", "crl_wrappers", "crl_harness")
MAX_LINES = 450
LAYERS = {"crl_envs": set(), "crl_wrappers": set(), "crl_harness": {"crl_envs", "crl_wrappers"}}
"""package -> the library packages it may import (docs/design.md: imports point down only)"""


def _module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


MODULES = _module_files()


def _imported(name: str, node: ast.ImportFrom | ast.Import, module: str, path: Path) -> list[str]:
    """The library modules that one import statement of ``module`` names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in MODULES]
    base = node.module or ""
    if node.level:  # relative: from the package that holds the module
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    found = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
    if base in MODULES and len(found) < len(node.names):  # some names are the module's own
        found.append(base)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _load_time_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when a module is imported (or that a type checker reads):
    those of its body and of the blocks in it, not those inside functions."""
    found: list[ast.Import | ast.ImportFrom] = []
    for statement in body:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            found.append(statement)
        elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        else:
            for field in ("body", "orelse", "finalbody"):
                found += _load_time_imports(getattr(statement, field, []))
            for handler in getattr(statement, "handlers", []):
                found += _load_time_imports(handler.body)
    return found


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def _graph(imports_of) -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[module] = {target for node in imports_of(tree)
                         for target in _imported(module, node, module, path)} - {module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_walk_finds_a_planted_circle_and_a_type_checking_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import crl_envs.base\n"
                     "try:\n    import crl_envs.data\nexcept ImportError:\n    pass\n"
                     "def later():\n    import crl_envs.oracles\n")
    assert [ast.unparse(n) for n in _load_time_imports(tree.body)] == [
        "from typing import TYPE_CHECKING", "import crl_envs.base", "import crl_envs.data"]
    assert _imported("m", ast.parse("from crl_envs import base, ENV_IDS").body[0], "crl_envs.x",
                     MODULES["crl_envs.oracles"]) == ["crl_envs.base", "crl_envs"]


def test_no_import_circle_among_the_library_modules():
    circles = _circles(_graph(lambda tree: _load_time_imports(tree.body)))
    assert circles == [], "import circles (module-level or TYPE_CHECKING imports): " + \
        "; ".join(" <-> ".join(circle) for circle in circles)


def test_the_layers_import_down_only():
    graph = _graph(_all_imports)  # an import inside a function crosses a layer all the same
    upward = sorted(f"{module} imports {target}" for module, targets in graph.items()
                    for target in targets
                    if target.split(".")[0] != module.split(".")[0]
                    and target.split(".")[0] not in LAYERS[module.split(".")[0]])
    assert upward == []


def test_no_library_module_is_over_450_lines():
    long = {module: n for module, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines (split them by concept): {long}"


# ------------------------------------------------------------------ a new env
class CorridorEnv(TextEnv):
    """A corridor of ``length`` cells: ``right`` until the end. Made here, by a test, to show
    that an env registered in the CRL namespace needs nothing of the harness."""

    env_id = "CRL/TestCorridor-v0"
    instructions = "Actions: left, right. Reach the end of the corridor."

    def __init__(self, length: int = 3, **kwargs) -> None:
        super().__init__(**kwargs)
        self.length, self.position = length, 0

    @property
    def task(self) -> str:
        return f"walk to cell {self.length}"

    def admissible_actions(self) -> list[str]:
        return ["left", "right"]

    def _reset(self, seed, options) -> str:
        self.position = 0
        return f"You are at cell 0 of {self.length}."

    def _step(self, action: str) -> Transition:
        if action.strip() not in ("left", "right"):
            return Transition(f"{action!r:.40} is no action; allowed: left, right.", valid=False)
        self.position = max(0, self.position + (1 if action.strip() == "right" else -1))
        won = self.position >= self.length
        return Transition(f"You are at cell {self.position} of {self.length}.", won=won,
                          score=float(won))


class CorridorOracle:
    """Walks right."""

    def __init__(self, env: gym.Env) -> None:
        pass

    def reset(self, observation: str, info: dict) -> None:
        pass

    def act(self, observation: str, info: dict) -> str:
        return "right"


@pytest.fixture
def corridor(monkeypatch):
    """``CRL/TestCorridor-v0`` registered (and its oracle known) for one test, then removed."""
    gym.register(id=CorridorEnv.env_id, entry_point=f"{__name__}:CorridorEnv",
                 max_episode_steps=6, kwargs={"length": 3})
    monkeypatch.setitem(ORACLES, CorridorEnv.env_id, f"{__name__}:CorridorOracle")
    yield CorridorEnv.env_id
    del gym.registry[CorridorEnv.env_id]


def test_an_env_registered_by_a_test_is_listed_configured_and_evaluated_by_the_harness(
        corridor, tmp_path, capsys):
    from crl_harness.config import load_config
    from crl_harness.eval import expand_env_ids

    assert corridor in crl_envs.env_ids() and corridor in expand_env_ids("all")
    assert expand_env_ids(corridor) == [corridor]
    cfg = load_config(None, [f"tasks.envs.0.id={corridor}", "tasks.envs.0.kwargs={length: 2}"])
    assert [entry.id for entry in cfg.tasks.envs] == [corridor]
    out = tmp_path / "eval"
    assert main(["eval", "--agent", "scripted", "--envs", corridor, "--episodes", "2",
                 "--out", str(out), "--no-progress"]) == 0
    assert corridor in capsys.readouterr().out
    [env] = json.loads((out / "report.json").read_text())["envs"]
    assert (env["episodes"], env["successes"]) == (2, 2)  # the oracle walks the corridor

