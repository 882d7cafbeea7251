"""``ALFWorldEnv``: ALFWorld's text household tasks on the real engine (``CRL/ALFWorld-v0``).

Holds ``ALFWorldEnv`` (its registration's ``crl_envs.base.StepBudgetFromTimeLimit`` hands it
the ``TimeLimit``). The engine is TextWorld's ``PddlEnv`` (PDDL planning state through
fast-downward) wrapped in alfworld's ``AlfredDemangler(shuffle=False)`` and ``AlfredInfos``, which
is what upstream's ``AlfredTWEnv`` plays, minus its game-list scan and batch machinery.

Rules worth knowing (also in ``instructions``):
- Observations are the engine's text: the room and the task on reset, the feedback after each
  command. ``info["task"]`` is the "Your task is to: ..." sentence, ``info["admissible_actions"]``
  the engine's admissible commands.
- A command is matched after lower-casing and collapsing whitespace. One that is not admissible
  gets the engine's own answer, "Nothing happens.", changes nothing, and has
  ``info["action_valid"] = False`` (the engine is not even called: it would do nothing).
- Reward (the paper's): +1 on the step that completes the task (``terminated``), -1 on the step
  that exhausts the step budget without success, 0 otherwise. Running out of steps is gymnasium's
  ``TimeLimit`` (30 in the registration); the env cannot see that wrapper, so it counts its own
  steps against its budget: ``step_budget`` if given, else the limit of the ``TimeLimit`` that
  ``gym.make`` applied (``gym.make(..., max_episode_steps=N)`` moves both), else none.
  ``reward_mode="score"`` pays the engine's score (1 won, 0 not) on those steps instead.
- Splits (``split=`` or ``options={"split": ...}``): ``train`` (1,465 games, one per task
  folder), ``train_all`` (3,553), ``eval_in_distribution`` (valid_seen, 140) and
  ``eval_out_of_distribution`` (valid_unseen, 134, the paper's held-out set); ``task_types=``
  keeps some of pick, look, clean, heat, cool, pick_two. ``reset(seed=s)`` picks a game from the
  seeded rng; ``options={"task_id": i}`` picks game ``i`` of the split (or a game id string).

Making an env reads the split's index only (``crl_envs.alfworld.data``); the engine starts, and a
game is parsed, when a reset needs it. A reset that picks the game already loaded skips the parse
and reuses the game's PDDL translation (fast-downward's, about a second a game), so replaying a
game restarts in a fraction of that; a new game is translated once, not twice (load and reset),
and the process's envs share the last games' translations (a group playing one game, an env
returning to a recent one).
"""

from __future__ import annotations

import importlib.util
import numbers
import os
import sys
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any

import gymnasium as gym

from crl_envs.alfworld.data import SPLITS, Game, list_games, parse_task_types
from crl_envs.base import TextEnv, Transition
from crl_envs.errors import UserFacingError

__all__ = ["ALFWorldEnv", "NOTHING_HAPPENS"]

NOTHING_HAPPENS = "Nothing happens."
TASK_PREFIX = "Your task is to:"

# fast-downward's PDDL translator keeps its options in module globals and rewrites sys.argv and
# sys.stdout while it runs, so two envs loading games at once in threads would mix their
# settings; loads and resets take this lock (steps do not translate and need no lock).
_TRANSLATOR_LOCK = threading.Lock()

# The last games' fast-downward translations, by (domain, problem, optimize), oldest first,
# shared by the process's envs and read and written under _TRANSLATOR_LOCK only; at most
# TRANSLATED_GAMES_KEPT games (two translations each). See _translations_reused.
TRANSLATED_GAMES_KEPT = 8
_TRANSLATIONS: OrderedDict[tuple[str, str, bool], Any] = OrderedDict()


class ALFWorldEnv(TextEnv):
    """Solve a household task (find, clean, heat, cool, examine, place objects) by text commands.

    Args:
        split: ``train``, ``train_all``, ``eval_in_distribution`` or ``eval_out_of_distribution``.
        task_types: keep only these task types (``pick``, ``look``, ``clean``, ``heat``,
            ``cool``, ``pick_two``); ``None`` keeps all.
        data_dir: a folder holding the games (see ``crl_envs.alfworld.data``); ``None`` resolves.
        step_budget: the step on which an unfinished episode pays the failure reward; ``None``
            takes the limit of the ``TimeLimit`` ``gym.make`` applied (its ``max_episode_steps``),
            and an env made without ``gym.make`` (or with ``max_episode_steps=-1``) has no budget.
        render_mode: ``None`` or ``"ansi"``.
        reward_mode: ``"binary"`` (+1 won, -1 out of steps) or ``"score"`` (1 won, 0 not).

    Example:
        >>> import gymnasium as gym, crl_envs
        >>> env = gym.make("CRL/ALFWorld-v0", split="eval_out_of_distribution")
        >>> obs, info = env.reset(options={"task_id": 0})
        >>> info["task"]
        'Your task is to: examine the alarmclock with the desklamp.'
        >>> obs, reward, terminated, truncated, info = env.step("fly to the moon")
        >>> obs, info["action_valid"], reward
        ('Nothing happens.', False, 0.0)
        >>> for command in env.unwrapped.walkthrough:
        ...     obs, reward, terminated, truncated, info = env.step(command)
        >>> obs, reward, terminated
        ('You turn on the desklamp 1.', 1.0, True)
        >>> env.close()
    """

    env_id = "CRL/ALFWorld-v0"
    success_reward = 1.0
    failure_reward = -1.0
    instructions = (
        "You are in a household and must complete the task given at the start of the episode "
        "(\"Your task is to: ...\"). Each turn, answer with exactly one command. Commands:\n"
        "  look, inventory, examine (something), go to (receptacle), open (receptacle), "
        "close (receptacle), take (object) from (receptacle), move (object) to (receptacle), "
        "use (object), heat (object) with (receptacle), cool (object) with (receptacle), "
        "clean (object) with (receptacle), slice (object) with (object), help.\n"
        "Objects and receptacles are named with a number, e.g. \"go to cabinet 1\", "
        "\"take apple 2 from countertop 1\". A command that is not possible now gets the answer "
        "\"Nothing happens.\" and changes nothing.\n"
        "Reward: +1 when the task is done; -1 if the step budget runs out first."
    )

    def __init__(
        self,
        split: str = "train",
        task_types: str | list[str] | tuple[str, ...] | None = None,
        data_dir: str | os.PathLike | None = None,
        step_budget: int | None = None,
        render_mode: str | None = None,
        reward_mode: str = "binary",
    ) -> None:
        super().__init__(render_mode=render_mode, reward_mode=reward_mode)
        if importlib.util.find_spec("textworld") is None or importlib.util.find_spec("alfworld") is None:
            raise UserFacingError(
                "CRL/ALFWorld-v0 needs the ALFWorld engine: pip install 'crl-gym[alfworld]' "
                "(alfworld and textworld with fast-downward)."
            )
        if step_budget is not None and step_budget < 1:
            raise ValueError(f"step_budget must be a positive number of steps, got {step_budget}.")
        self.split = _check_split(split)
        self.task_types = parse_task_types(task_types)
        self.data_dir = data_dir
        self._step_budget = step_budget
        self._time_limit: int | None = None  # set by StepBudgetFromTimeLimit
        self._games: dict[str, list[Game]] = {}
        self.games(self.split)  # a missing dataset or an empty filter fails here, not at reset
        self._engine: Any = None
        self._loaded: Game | None = None
        self.game: Game | None = None
        self._state: Any = None
        self._intro = ""
        self._steps = 0

    # ----------------------------------------------------------------- games
    def games(self, split: str | None = None) -> list[Game]:
        """The games of ``split`` (default: the env's) after the task-type filter, by id."""
        split = _check_split(split or self.split)
        if split not in self._games:
            games = list_games(split, self.task_types, self.data_dir)
            if not games:
                raise ValueError(
                    f"No ALFWorld game of type {', '.join(self.task_types)} in split {split!r}."
                )
            self._games[split] = games
        return self._games[split]

    def _pick(self, games: list[Game], task_id: Any) -> Game:
        if task_id is None:
            return games[int(self.np_random.integers(len(games)))]
        if isinstance(task_id, bool) or not isinstance(task_id, (numbers.Integral, str)):
            raise TypeError(f"options['task_id'] is an int index or a game id str, got {task_id!r}.")
        if isinstance(task_id, numbers.Integral):
            task_id = int(task_id)
            if not 0 <= task_id < len(games):
                raise ValueError(f"options['task_id']={task_id} is out of range: this split has "
                                 f"{len(games)} games (0 to {len(games) - 1}).")
            return games[task_id]
        wanted = task_id.strip("/")
        for game in games:  # a full game id, "<task folder>/<trial>", or a task folder
            if wanted in (game.game_id, game.game_id.split("/", 1)[1], game.task_folder):
                return game
        raise ValueError(f"options['task_id']={task_id!r} is not a game of this split; ids look "
                         f"like {games[0].game_id!r} (see env.unwrapped.games()).")

    # ----------------------------------------------------------------- contract
    @property
    def task(self) -> str:
        """The "Your task is to: ..." sentence of the current game."""
        if self._state is None:
            return ""
        lines = [line for line in self._intro.splitlines() if line.startswith(TASK_PREFIX)]
        return lines[-1].strip() if lines else self._intro.strip().splitlines()[-1]

    def admissible_actions(self) -> list[str] | None:
        if self._state is None:
            return None
        return list(self._state["admissible_commands"])

    @property
    def walkthrough(self) -> list[str]:
        """The current game's own solution (its ``walkthrough``), from the start of the episode."""
        if self._state is None:
            raise gym.error.ResetNeeded("Call reset() before asking for the walkthrough.")
        return list(self._state["extra.walkthrough"])

    @property
    def elapsed_steps(self) -> int:
        """Steps taken since the last reset (valid or not), as TimeLimit counts them."""
        return self._steps

    def replan(self) -> list[str]:
        """A plan from the current state, by the engine's planner (fast-downward); ~0.5 s."""
        if self._state is None:
            raise gym.error.ResetNeeded("Call reset() before asking for a plan.")
        engine = self._engine.unwrapped
        with _TRANSLATOR_LOCK, _argv_kept():
            return list(engine._pddl_state.replan(engine._entity_infos))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        observation, info = super().reset(seed=seed, options=options)
        info["game_id"] = self.game.game_id
        return observation, info

    def _reset(self, seed: int | None, options: dict[str, Any]) -> str:
        games = self.games(options.get("split", self.split))
        game = self._pick(games, options.get("task_id"))
        with _TRANSLATOR_LOCK, _argv_kept(), _translations_reused():
            if self._engine is None:
                self._engine = _start_engine()
            if self._loaded != game:
                self._loaded = None  # a failed load must not look loaded
                _drop_interned_facts()
                try:
                    self._engine.load(str(game.path))
                except Exception as err:  # the engine raises anything on a broken file
                    raise UserFacingError(
                        f"ALFWorld game {game.path} could not be loaded ({type(err).__name__}: "
                        f"{err}); the file is damaged: delete the cache folder "
                        f"{game.root.parent} (it is rebuilt), or fetch the data again."
                    ) from err
                self._loaded = game
            self._state = self._engine.reset()
        self.game = game
        self._intro = self._state.feedback
        self._steps = 0
        return self._state.feedback

    def _step(self, action: str) -> Transition:
        self._steps += 1
        command = self.normalize_action(action)
        if command not in self._state["admissible_commands"]:
            return Transition(observation=NOTHING_HAPPENS, valid=False)
        self._state, _, _ = self._engine.step(command)
        won = bool(self._state["won"])
        return Transition(
            observation=self._state.feedback,
            won=won,
            terminated=won,
            score=float(won),
            info={"game_id": self.game.game_id},
        )

    @property
    def step_budget(self) -> int | None:
        """The step on which an unfinished episode pays the failure reward (``None``: never)."""
        return self._step_budget if self._step_budget is not None else self._time_limit

    def follow_time_limit(self, max_episode_steps: int | None) -> None:
        """Take a ``TimeLimit``'s ``max_episode_steps`` as the budget (unless ``step_budget`` was
        given): the step that truncates is the one that pays the failure reward."""
        self._time_limit = max_episode_steps

    def _reward(self, result: Transition, terminated: bool) -> float:
        budget = self.step_budget
        if terminated or budget is None or self._steps < budget:
            return super()._reward(result, terminated)
        return self.failure_reward if self.reward_mode == "binary" else self._score

    def close(self) -> None:
        """Free the engine's planning state and drop the game (a later reset starts afresh).

        The engine's private copy of the fast-downward library stays mapped until the process
        ends: unloading it (``fast_downward.close_lib``) crashes the process at a later load or
        at exit, so only its state is freed (``cleanup``).
        """
        if self._engine is not None:
            self._engine.unwrapped.downward_lib.cleanup()
        self._engine = None
        self._loaded = None
        self._state = None
        self._needs_reset = True
        super().close()


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"Unknown ALFWorld split {split!r}; use one of {', '.join(SPLITS)}.")
    return split


@contextmanager
def _argv_kept():
    """fast-downward's translator overwrites ``sys.argv``; put the program's back."""
    argv = sys.argv  # the translator rebinds sys.argv, so the original list stays intact
    try:
        yield
    finally:
        sys.argv = argv


@contextmanager
def _translations_reused():
    """Make fast-downward's ``pddl2sas`` answer a problem translated before from ``_TRANSLATIONS``.

    textworld's ``PddlState`` translates the game's PDDL problem twice (plain and optimized for
    the planner) every time it is built: once when a game is loaded and again at each reset,
    although the problem text is the same. The translation is a pure function of the domain and
    problem text, and ``PddlState`` only reads the task it returns, so one translation per game
    serves every reset. textworld calls ``fast_downward.pddl2sas`` by attribute at call time and
    offers no other hook, so the function is swapped for the time of a load or reset, under
    ``_TRANSLATOR_LOCK`` (every translation in this process runs under it). The last
    ``TRANSLATED_GAMES_KEPT`` games' translations are kept for the whole process (1 to 3 MB a
    game): envs that play the same game (a group of rollouts) translate it once, and an env
    that returns to a recent game does not translate it again. Each env still has its own
    planner library and state; the shared task is only read.
    """
    import fast_downward

    translate = fast_downward.pddl2sas

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        key = (domain, problem, bool(optimize))
        if key in _TRANSLATIONS:
            _TRANSLATIONS.move_to_end(key)
            return _TRANSLATIONS[key]
        _TRANSLATIONS[key] = translate(domain, problem, verbose=verbose, optimize=optimize)
        while len(_TRANSLATIONS) > 2 * TRANSLATED_GAMES_KEPT:  # two translations a game
            _TRANSLATIONS.popitem(last=False)
        return _TRANSLATIONS[key]

    fast_downward.pddl2sas = pddl2sas
    try:
        yield
    finally:
        fast_downward.pddl2sas = translate


def _drop_interned_facts() -> None:
    """Let go of the facts textworld interned for earlier games.

    textworld builds every ``Proposition`` and ``Signature`` through a memoizing metaclass
    (``mementos``) whose global cache is never emptied, so memory grows with every new game
    loaded (about 2 MB a game). Both classes compare by value, so a game still being played
    keeps working with the instances it holds; the next game just builds its own.
    """
    from mementos.core import _memento_cache
    from textworld.logic import Proposition, Signature

    for key in list(_memento_cache):  # list() first: another env may be adding entries
        if key[0] in (Proposition, Signature):
            _memento_cache.pop(key, None)


def _start_engine() -> Any:
    """TextWorld's PDDL engine with alfworld's wrappers, as upstream's ``AlfredTWEnv`` plays it.

    Imported here, not at the top: textworld takes about a second to import, and making an env
    should not pay it (nor need the extra installed just to import this module).
    """
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs.pddl import PddlEnv

    request = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile", "walkthrough"])
    return AlfredInfos(AlfredDemangler(PddlEnv(request), shuffle=False))
