"""ALFWorld: env construction, reset and step times against upstream, memory over many resets.

Measures, in one run and on the same games:
- construction: ``gym.make("CRL/ALFWorld-v0")`` (train split) in a fresh Python process
  (imports included) and in a warm one; upstream's ``AlfredTWEnv(config, "train")`` on the
  same 3,553 train games (laid out as upstream expects: a ``traj_data.json`` beside each game,
  which the project's archives do not ship, so the benchmark writes minimal ones in a temp dir);
- reset and step times (median, p90) of our env and of upstream's ``AlfredTWEnv.init_env``
  TextWorld gym env on the same games: upstream resets to its next game, ours to that same game
  (which one goes first alternates); both then play one command that is not admissible and the
  game's walkthrough; then ours resets to the same game again (the next rollout of a group);
- RSS after 10 and after ``--resets`` resets of our env (a different game each reset), and the
  files left in the temp dir.

``--expert`` instead runs ``ALFWorldExpert`` over every eval_out_of_distribution (valid_unseen)
game and prints the win count.

Run: ``nice -n 10 .venv/bin/python benchmarks/alfworld_bench.py [--games 10] [--resets 200]``
and ``.venv/bin/python benchmarks/alfworld_bench.py --expert``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil

import crl_envs  # noqa: F401  (registers the ids)
from crl_envs.alfworld.data import TASK_TYPES, list_games
from crl_envs.oracles import make_oracle, play_episode

ENV_ID = "CRL/ALFWorld-v0"
MAKE_IN_FRESH_PROCESS = (
    "import time; t = time.perf_counter(); import gymnasium as gym, crl_envs; "
    "env = gym.make('CRL/ALFWorld-v0', split='train'); print(time.perf_counter() - t)"
)


def median_p90(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def show(name: str, ours: list[float], theirs: list[float] | None = None) -> None:
    med, p90 = median_p90(ours)
    line = f"{name:<34} ours median {med * 1000:8.1f} ms  p90 {p90 * 1000:8.1f} ms  (n={len(ours)})"
    if theirs:
        up_med, up_p90 = median_p90(theirs)
        line += (f" | upstream median {up_med * 1000:8.1f} ms  p90 {up_p90 * 1000:8.1f} ms"
                 f" | ours/upstream median {med / up_med:.2f}  p90 {p90 / up_p90:.2f}")
    print(line, flush=True)


def upstream_config(tree: Path, split_folder: str) -> dict:
    """The parts of alfworld's base_config.yaml that AlfredTWEnv reads, for the text-only env."""
    path = str(tree / split_folder)
    return {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6],
                "domain_randomization": False, "expert_type": "handcoded"},
        "dataset": {"data_path": path, "eval_id_data_path": path, "eval_ood_data_path": path,
                    "num_train_games": -1, "num_eval_games": -1},
        "general": {"training_method": "dqn"},
        "rl": {"training": {"max_nb_steps_per_episode": 30}},
    }


def upstream_layout(games, workdir: Path) -> Path:
    """The games as upstream's collector expects them: traj_data.json beside game.tw-pddl."""
    for game in games:
        folder = workdir / game.game_id
        folder.mkdir(parents=True)
        (folder / "game.tw-pddl").symlink_to(game.path)
        (folder / "traj_data.json").write_text(json.dumps({"task_type": TASK_TYPES[game.task_type]}))
    return workdir


def bench_construction(repeats: int) -> None:
    fresh = [float(subprocess.run([sys.executable, "-c", MAKE_IN_FRESH_PROCESS], check=True,
                                  capture_output=True, text=True).stdout.split()[-1])
             for _ in range(repeats)]
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        gym.make(ENV_ID, split="train").close()
        warm.append(time.perf_counter() - start)
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    upstream = []
    with tempfile.TemporaryDirectory() as workdir:
        tree = upstream_layout(list_games("train_all"), Path(workdir))
        for _ in range(repeats):
            start = time.perf_counter()
            AlfredTWEnv(upstream_config(tree, "train"), train_eval="train")
            upstream.append(time.perf_counter() - start)
    print(f"construction, train split ({len(list_games('train'))} games; upstream lists all "
          f"{len(list_games('train_all'))}):")
    show("  make in a fresh process", fresh)
    show("  make in a warm process", warm, upstream)


def bench_reset_step(n_games: int) -> None:
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    games = list_games("eval_out_of_distribution")
    ours = gym.make(ENV_ID, split="eval_out_of_distribution")
    resets, repeat_resets, steps, invalid = [], [], [], []
    up_resets, up_steps, up_invalid = [], [], []
    with tempfile.TemporaryDirectory() as workdir:
        tree = upstream_layout(games, Path(workdir))
        alfred = AlfredTWEnv(upstream_config(tree, "valid_unseen"), train_eval="eval_out_of_distribution")
        upstream = alfred.init_env(batch_size=1)
        # The order upstream plays its games: textworld's batch env shuffles them with seed 1234.
        order = list(alfred.game_files)
        np.random.RandomState(1234).shuffle(order)
        ours.reset(options={"task_id": 0})  # start both engines before timing
        for i in range(n_games):
            game_id = Path(order[i]).parent.relative_to(tree).as_posix()
            for engine in ("upstream", "ours") if i % 2 == 0 else ("ours", "upstream"):
                # alternate which one resets first, so neither always finds the file cached
                start = time.perf_counter()
                if engine == "ours":
                    ours.reset(options={"task_id": game_id})
                    resets.append(time.perf_counter() - start)
                else:
                    _, up_info = upstream.reset()
                    up_resets.append(time.perf_counter() - start)
                    assert up_info["extra.gamefile"][0] == order[i], "upstream's order changed"
            start = time.perf_counter()
            upstream.step(["fly to the moon"])
            up_invalid.append(time.perf_counter() - start)
            start = time.perf_counter()
            ours.step("fly to the moon")
            invalid.append(time.perf_counter() - start)
            for command in ours.unwrapped.walkthrough:
                start = time.perf_counter()
                upstream.step([command])
                up_steps.append(time.perf_counter() - start)
                start = time.perf_counter()
                ours.step(command)
                steps.append(time.perf_counter() - start)
            start = time.perf_counter()
            ours.reset(options={"task_id": game_id})  # e.g. the next rollout of a GRPO group
            repeat_resets.append(time.perf_counter() - start)
        upstream.close()
    ours.close()
    print(f"reset and step on the same {n_games} valid_unseen games:")
    show("  reset (a new game)", resets, up_resets)
    show("  reset (the same game again)", repeat_resets)
    show("  step (walkthrough commands)", steps, up_steps)
    show("  step (not admissible)", invalid, up_invalid)


def bench_memory(n_resets: int) -> None:
    games = list_games("eval_out_of_distribution")
    process = psutil.Process()
    private_tmp = tempfile.mkdtemp(prefix="alfworld-bench-")
    tempfile.tempdir = private_tmp  # the engine's temp files would land here
    env = gym.make(ENV_ID, split="eval_out_of_distribution")
    rss = {}
    for i in range(n_resets):
        env.reset(options={"task_id": i % len(games)})
        env.step("look")
        if i + 1 in (10, n_resets):
            rss[i + 1] = process.memory_info().rss
    env.close()
    left = os.listdir(private_tmp)
    os.rmdir(private_tmp) if not left else None
    print(f"memory over {n_resets} resets (a different game each time, cycling the "
          f"{len(games)} valid_unseen games):")
    print(f"  RSS after 10 resets {rss[10] / 2**20:.0f} MiB, after {n_resets} "
          f"{rss[n_resets] / 2**20:.0f} MiB, growth {(rss[n_resets] - rss[10]) / 2**20:+.0f} MiB; "
          f"files left in the temp dir: {len(left)}", flush=True)


def expert_all() -> int:
    env = gym.make(ENV_ID, split="eval_out_of_distribution")
    games = env.unwrapped.games()
    wins, lost = 0, []
    start = time.perf_counter()
    for task_id, game in enumerate(games):
        episode = play_episode(env, make_oracle(ENV_ID, env), options={"task_id": task_id})
        wins += bool(episode.won and episode.reward == 1.0)
        if not episode.won:
            lost.append(game.game_id)
        if (task_id + 1) % 25 == 0:
            print(f"  {wins}/{task_id + 1} won so far", flush=True)
    env.close()
    print(f"expert won {wins}/{len(games)} valid_unseen games "
          f"({time.perf_counter() - start:.0f} s)")
    for game_id in lost:
        print(f"  lost: {game_id}")
    return 0 if wins == len(games) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", type=int, default=10, help="games for reset/step timings")
    parser.add_argument("--resets", type=int, default=200, help="resets for the memory check")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each construction")
    parser.add_argument("--expert", action="store_true",
                        help="only run the expert over all 134 valid_unseen games")
    args = parser.parse_args()
    if args.expert:
        return expert_all()
    bench_construction(args.repeats)
    bench_reset_step(args.games)
    bench_memory(args.resets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
