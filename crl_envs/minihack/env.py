"""MiniHack tasks on the real NetHack Learning Environment, as CRL text envs.

Holds:
- ``TASKS``: the CRL task names, their variants and the upstream MiniHack ids they run;
- ``make_raw_env(task, variant)``: the bare upstream MiniHack env a task runs on;
- ``MiniHackEnv``: the text env (fog-of-war map, actions by name, success from MiniHack's
  ``end_status``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator
from nle import nethack

from crl_envs.base import TextEnv, Transition
from crl_envs.minihack.render import LEGEND, FogOfWarView, level_key

with warnings.catch_warnings():
    # minihack 1.0.2 imports pkg_resources, which setuptools warns about on import: a user of our
    # envs can do nothing about it, so it is silenced here, for this import only.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="pkg_resources")
    import minihack  # noqa: F401  (registers the MiniHack-* ids)

__all__ = ["TASKS", "MiniHackTask", "make_raw_env", "MiniHackEnv", "DIRECTIONS"]

# Our TimeLimit (30 steps, from the registration) ends episodes. MiniHack's own limit would
# end them as `terminated` ("aborted"), so it is pushed out of reach.
_RAW_STEP_LIMIT = 1_000_000
# Only what the text view reads: MiniHack's default adds cropped views that cost time each step.
_OBSERVATION_KEYS = ("glyphs", "chars", "message", "blstats", "inv_strs", "inv_letters")

DIRECTIONS: dict[str, nethack.CompassDirection] = {
    "north": nethack.CompassDirection.N,
    "south": nethack.CompassDirection.S,
    "east": nethack.CompassDirection.E,
    "west": nethack.CompassDirection.W,
    "northeast": nethack.CompassDirection.NE,
    "northwest": nethack.CompassDirection.NW,
    "southeast": nethack.CompassDirection.SE,
    "southwest": nethack.CompassDirection.SW,
}
_ORTHOGONAL_OFFSETS = {"north": (0, -1), "south": (0, 1), "east": (1, 0), "west": (-1, 0)}
_CLOSED_DOOR_GLYPHS = (nethack.GLYPH_CMAP_OFF + 15, nethack.GLYPH_CMAP_OFF + 16)
_MAX_DOOR_TRIES = 10  # a door can be "stuck" several times in a row before it opens


@dataclass(frozen=True)
class MiniHackTask:
    """One CRL MiniHack task: its upstream ids per variant, its goal and its extra actions."""

    env_id: str
    variants: dict[str, str]
    default_variant: str
    goal: str
    hints: str = ""
    uses_key: bool = False


TASKS: dict[str, MiniHackTask] = {
    "room": MiniHackTask(
        env_id="CRL/MiniHackRoom-v0",
        variants={
            "ultimate": "MiniHack-Room-Ultimate-5x5-v0",
            "plain": "MiniHack-Room-5x5-v0",
            "random": "MiniHack-Room-Random-5x5-v0",
            "dark": "MiniHack-Room-Dark-5x5-v0",
        },
        default_variant="ultimate",
        goal="Reach the staircase down (>) in a 5x5 room.",
        hints="The room may be dark (you see only next to you) and hold a monster and a trap.",
    ),
    "maze": MiniHackTask(
        env_id="CRL/MiniHackMaze-v0",
        variants={"default": "MiniHack-MazeWalk-9x9-v0"},
        default_variant="default",
        goal="Find and reach the staircase down (>) in a 9x9 maze.",
        hints="Diagonal moves between corridor cells are allowed.",
    ),
    "keyroom": MiniHackTask(
        env_id="CRL/MiniHackKeyRoom-v0",
        variants={"default": "MiniHack-KeyRoom-S5-v0"},
        default_variant="default",
        goal="Reach the staircase down (>), which lies behind a locked door: fetch the key first.",
        hints=(
            "Stand on the key and `pickup`. Then stand next to the locked door (straight north, "
            "south, east or west of it) and `apply key <direction>`: it unlocks and opens the "
            "door. Walk through the door straight, not diagonally."
        ),
        uses_key=True,
    ),
    "river": MiniHackTask(
        env_id="CRL/MiniHackRiver-v0",
        variants={"default": "MiniHack-River-v0"},
        default_variant="default",
        goal="Cross the river and reach the staircase down (>).",
        hints=(
            "You cannot swim. Walk into a boulder (`) to push it one cell; a boulder pushed into "
            "water (}) fills that cell and makes it floor. Fill a line of water cells to cross."
        ),
    ),
}


def _task(task: str, variant: str | None) -> tuple[MiniHackTask, str]:
    if task not in TASKS:
        raise ValueError(f"Unknown MiniHack task {task!r}; use one of {sorted(TASKS)}.")
    spec = TASKS[task]
    variant = spec.default_variant if variant is None else variant
    if variant not in spec.variants:
        raise ValueError(
            f"Unknown variant {variant!r} for MiniHack task {task!r}; use one of {sorted(spec.variants)}."
        )
    return spec, variant


def make_raw_env(
    task: str, variant: str | None = None, observation_keys: tuple[str, ...] | None = None
) -> gym.Env:
    """The bare upstream MiniHack env of a CRL task (no gymnasium wrappers).

    ``observation_keys=None`` keeps MiniHack's own default observation (what a MiniHack user
    gets, cropped views included); ``MiniHackEnv`` asks only for the keys its text view reads.
    MiniHack's own step limit is pushed out of reach, so that only the CRL TimeLimit ends episodes.
    """
    spec, variant = _task(task, variant)
    upstream = gym.spec(spec.variants[variant])
    kwargs = dict(upstream.kwargs, max_episode_steps=_RAW_STEP_LIMIT)
    if observation_keys is not None:
        kwargs["observation_keys"] = observation_keys
    return load_env_creator(upstream.entry_point)(**kwargs)


class MiniHackEnv(TextEnv):
    """A MiniHack task (real NetHack, via NLE) with a fog-of-war text map and actions by name.

    ``task`` is one of ``room``, ``maze``, ``keyroom``, ``river``; ``variant`` picks a room
    variant (``ultimate`` by default, ``plain``, ``random``, ``dark``). ``penalty_step`` is
    MiniHack's own reward for a step after which the game's clock stands still (a move into a
    wall): upstream's default is -0.01; ours is 0, a binary reward.

    Example:
        >>> import gymnasium as gym, crl_envs
        >>> env = gym.make("CRL/MiniHackRoom-v0", variant="plain")
        >>> obs, info = env.reset(seed=0)
        >>> "You (@) are at" in obs, info["admissible_actions"][:2]
        (True, ['north', 'south'])
        >>> obs, reward, terminated, truncated, info = env.step("go north")
        >>> info["action_valid"]
        False
        >>> env.close()
    """

    # The retrieval key (start cell and what is in view) names the level exactly.
    metadata = {**TextEnv.metadata, "retrieval_key": "exact"}

    def __init__(
        self,
        task: str = "room",
        variant: str | None = None,
        render_mode: str | None = None,
        reward_mode: str = "binary",
        penalty_step: float = 0.0,
    ) -> None:
        super().__init__(render_mode=render_mode, reward_mode=reward_mode)
        if not -1.0 <= penalty_step <= 0.0:  # also rejects NaN
            raise ValueError(f"penalty_step={penalty_step!r} must lie in [-1, 0] (MiniHack's "
                             "default is -0.01; 0 keeps the reward binary).")
        self.penalty_step = float(penalty_step)
        self.spec_task, self.variant = _task(task, variant)
        self.task_name = task
        self.env_id = self.spec_task.env_id
        self._raw = make_raw_env(task, self.variant, observation_keys=_OBSERVATION_KEYS)
        self._nle = self._raw.unwrapped
        self._actions = list(DIRECTIONS)
        if self.spec_task.uses_key:
            self._actions += ["pickup"] + [f"apply key {d}" for d in _ORTHOGONAL_OFFSETS]
        self._action_index = {keystroke: i for i, keystroke in enumerate(self._nle.actions)}
        self._view = FogOfWarView()
        self._obs: dict[str, np.ndarray] = {}
        self._status = ""
        self._level_key: str | None = None
        self.instructions = self._instructions()

    # ----------------------------------------------------------------- text
    def _instructions(self) -> str:
        legend = "\n".join(f"  {char}  {meaning}" for char, meaning in LEGEND.items())
        moves = ", ".join(DIRECTIONS)
        lines = [
            "You play NetHack (MiniHack). " + self.spec_task.goal,
            self.spec_task.hints,
            f"Actions: move one cell with {moves}.",
        ]
        if self.spec_task.uses_key:
            lines.append(
                "Also: `pickup` (take the item you stand on) and `apply key north|south|east|west` "
                "(unlock and open the door on that side)."
            )
        lines += [
            "Answer with exactly one action, e.g. `north`. Anything else is an invalid action.",
            "The map shows only what you have seen; cells you saw earlier stay drawn. Symbols:",
            legend,
        ]
        return "\n".join(line for line in lines if line)

    @property
    def task(self) -> str:
        return self.spec_task.goal

    @property
    def retrieval_query(self) -> str | None:
        """Every level has the same goal: the key is where it starts and what is in view there
        (``level_key`` of the first observation), kept for the whole episode."""
        return self._level_key

    def admissible_actions(self) -> list[str]:
        return list(self._actions)

    def _message(self) -> str:
        return self._obs["message"].tobytes().split(b"\0", 1)[0].decode("latin-1").strip()

    def _keys_carried(self) -> list[str]:
        """Inventory lines of the keys carried (the rogue's other starting gear does not matter)."""
        lines = []
        for letter, item in zip(self._obs["inv_letters"], self._obs["inv_strs"], strict=True):
            if letter == 0:
                break
            text = item.tobytes().split(b"\0", 1)[0].decode("latin-1")
            if " key" in text:
                lines.append(f"{chr(letter)} - {text}")
        return lines

    def _observe(self, outcome: str = "") -> str:
        """Render the current game state (or, once the game is over, the last picture)."""
        message = self._message()
        if self._nle.nethack.in_normal_game():
            blstats = self._obs["blstats"]
            self._view.update(self._obs["glyphs"], self._obs["chars"], int(blstats[0]), int(blstats[1]))
            self._status = f"HP {blstats[nethack.NLE_BL_HP]}/{blstats[nethack.NLE_BL_HPMAX]}."
        lines = [
            f"Message: {message}" if message else "Message: (none)",
            self._view.render(self._status),
        ]
        if self.spec_task.uses_key:
            lines.append("Key: " + ("; ".join(self._keys_carried()) or "none carried"))
        if outcome:
            lines.append(outcome)
        return "\n".join(lines)

    # ----------------------------------------------------------------- episode
    def _reset(self, seed: int | None, options: dict[str, Any]) -> str:
        # NLE ignores reset(seed=): NetHack's own RNGs must be set before the reset.
        core, disp = (int(s) for s in self.np_random.integers(0, 2**62, size=2))
        self._nle.seed(core, disp, reseed=False)
        self._obs, _ = self._raw.reset()
        self._view.reset()
        observation = self._observe()
        self._level_key = level_key(observation)
        return observation

    def _step(self, action: str) -> Transition:
        command = self.normalize_action(action)
        if command not in self._actions:
            return self.invalid(f"{action[:80]!r} is not an action.", self._actions)
        if command.startswith("apply key "):
            return self._apply_key(command.removeprefix("apply key "))
        keystroke = nethack.Command.PICKUP if command == "pickup" else DIRECTIONS[command]
        return self._game_step(keystroke)

    def _game_step(self, keystroke: int) -> Transition:
        clock = int(self._obs["blstats"][nethack.NLE_BL_TIME])  # the step refills self._obs
        self._obs, _, terminated, _, info = self._raw.step(self._action_index[keystroke])
        # MiniHack's penalty_step: a step after which the game's clock stands still (a move into
        # a wall) wasted a turn.
        wasted = self._nle.nethack.in_normal_game() and \
            int(self._obs["blstats"][nethack.NLE_BL_TIME]) == clock
        won = info["end_status"] == self._nle.StepStatus.TASK_SUCCESSFUL
        outcome = ""
        if won:
            outcome = "Outcome: you reached the staircase down. Task complete."
        elif terminated:
            outcome = f"Outcome: the game ended ({info['end_status'].name.lower()}). Task failed."
        return Transition(
            observation=self._observe(outcome),
            won=won,
            terminated=terminated,
            score=float(won),
            info={"end_status": int(info["end_status"])},
            penalty=self.penalty_step if wasted else 0.0,
        )

    def _apply_key(self, direction: str) -> Transition:
        """Unlock the door on one side with the key and open it: one text action.

        NetHack asks three follow-up questions (which item, which direction, "Unlock it?");
        the env answers them, then walks into the door until it opens (a door can be stuck),
        as MiniHack's own KeyRoom apply does.
        """
        keys = self._keys_carried()
        if not keys:
            return self.invalid(
                "you carry no key. Stand on the key and use `pickup` first.", self._actions
            )
        hx, hy = (int(v) for v in self._obs["blstats"][:2])
        dx, dy = _ORTHOGONAL_OFFSETS[direction]
        if self._obs["glyphs"][hy + dy, hx + dx] not in _CLOSED_DOOR_GLYPHS:
            return self.invalid(f"there is no closed door to the {direction}.", self._actions)
        # Keystrokes straight to NetHack; self._obs views NLE's buffers, which every step refills.
        game = self._nle.nethack
        game.step(nethack.Command.APPLY)
        game.step(ord(keys[0][0]))
        game.step(DIRECTIONS[direction])
        if "Unlock it?" in self._message():
            game.step(ord("y"))
        elif "Lock it?" in self._message():  # already unlocked: keep it so
            game.step(ord("n"))
        for _ in range(_MAX_DOOR_TRIES):
            transition = self._game_step(DIRECTIONS[direction])
            if transition.terminated or self._obs["glyphs"][hy + dy, hx + dx] not in _CLOSED_DOOR_GLYPHS:
                break
        return transition

    def close(self) -> None:
        if getattr(self, "_raw", None) is not None:
            self._raw.close()
            self._raw = None
        super().close()
