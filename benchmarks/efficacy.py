"""The three arms side by side: Complementary RL (co-evolve), a static extractor, and no
experience (plain GRPO), from the same warm start and the same task seeds.

    .venv/bin/python benchmarks/efficacy.py                      # cpu-demo, 3 arms x 3 seeds
    .venv/bin/python benchmarks/efficacy.py --steps 2 --repeats 1 --arms co-evolve none

2 seeds x 3 arms x 6 steps at 16 episodes a step took 76 min on 2 cores (benchmarks/RESULTS.md):
``--steps 6 --repeats 2 --eval-levels 64 --set actor.rollout_engine=vllm
extractor.rollout_engine=vllm tasks.group_size=4 tasks.guided_per_group=2
experience.max_concurrent_extractions=8``.

For each arm and repeat it trains a fresh run into ``--out`` (default a fresh
``runs/efficacy-TIMESTAMP``; ``--config``, default ``cpu-demo``, whose actor and extractor start
from the shipped warm start; ``--set key=value`` overrides every arm), reads its
``metrics.jsonl``, and plays the checkpoint that its trainer returned greedily on
``--eval-levels`` held-out levels (default 128), one episode a level, without a bank
(``ARM-seedN/heldout.json``: every level's outcome), and an arm that uses experience also with
its run's bank. The warm start plays the same levels
(cached: free the second time). Printed: per arm, held-out success and its paired difference
against the warm start (levels x seeds pooled), every pair of arms paired the same way, and guided
against free inside the same groups of training, an experience arm's actor with its bank
against itself without and against arm none's actor (paired slot by slot), each with its 95%
interval and McNemar's exact p; and the extractor's own quality at the start and the end of
the runs (``--extractor-quality`` episodes of held-out levels over the cases the warm start teaches,
``extractor_quality.py``'s measure: the warm extractor, and each co-evolve run's final one). Runs train ``--jobs`` at a time (default 1), each in a process of its own
with its share of the cores as ``run.torch_threads``: a cpu-demo run peaks at 13 GB (HF rollouts)
to 16 GB (vLLM), so two at once ran a 24 GB machine out of memory; on 2 cores a pair of runs
took 1.7x one run alone where they fit. It prints the
training-task success per step with the rollouts of the repeats pooled (95% Wilson intervals), a
markdown table (final-step success, mean over steps, guided vs free subgroups) and writes
``efficacy.png`` and ``efficacy.json`` into ``--out``. Run seeds are ``--seed``, ``--seed + 1``,
...: the arms of one repeat see the same task seeds (the task sampler depends only on the run
seed and the step). ``--reuse`` reads the runs that ``--out`` already holds, finished with this
invocation's config, instead of training them again (a second seed after a first)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import statistics
import time
from pathlib import Path

ARMS = ("co-evolve", "static", "none")


def run_config(config: str, arm: str, actor: str | None, seed: int, steps: int | None, out: Path,
               overrides: list[str]):
    """The config of one run, trained into ``out/ARM-seedSEED``."""
    from crl_harness.config import load_config

    settings = [*overrides, f"arm={arm}", f"run.seed={seed}",
                f"run.output_dir={out / f'{arm}-seed{seed}'}", "run.checkpoint_every=1000000"]
    if steps is not None:
        settings.append(f"run.steps={steps}")
    if actor:
        settings.append(f"actor.model={actor}")
    return load_config(config, settings)


WITH_BANK = "held-out, with its bank"
"""the case of a run's actor on the held-out levels with its run's bank"""


def heldout_seeds(cfg, levels: int) -> list[int]:
    return list(range(cfg.tasks.heldout_offset, cfg.tasks.heldout_offset + levels))


def extractor_quality(cfg, extractor: str, episodes: int, out: Path) -> None:
    """``benchmarks/extractor_quality.py``'s measure of ``extractor`` on ``episodes`` episodes
    of held-out levels, shared over the cases the warm start teaches (the same ones for every
    extractor), into ``out/extractor_quality.json``."""
    from extractor_quality import measure  # a sibling: this script's folder is on sys.path

    results = measure(cfg, extractor, cfg.extractor.dtype, episodes, samples=1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "extractor_quality.json").write_text(json.dumps(
        {"extractor": extractor, "episodes": episodes, "results": results}, indent=2))


def run_arm(levels: int, quality_episodes: int, report_to: list[str], *run: object) -> None:
    """Train one run (``run_config``'s arguments), its step metrics also to the services of
    ``report_to`` as ``crl train --report-to`` logs them, then play the checkpoint its trainer returned
    on ``levels`` held-out levels without a bank; its metrics.jsonl and heldout.json are what
    the tables read. A run whose extractor trained (co-evolve) saves it (``extractor_hf``) and
    measures its quality on ``quality_episodes`` episodes. A missing model or data, or a full
    disk, ends the process with one line, as ``crl`` does."""
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # a spawned process has the variables, not the filters and loggers
    from crl_envs.errors import UserFacingError
    from crl_harness.config import config_to_dict
    from crl_harness.eval.heldout import evaluate_levels, handed_lessons
    from crl_harness.tracking import open_trackers
    from crl_harness.training.checkpoint import actor_adapter_base
    from crl_harness.training.trainer import Trainer

    cfg = run_config(*run)
    run_dir = Path(cfg.run.output_dir)
    start = time.perf_counter()
    try:
        trainer = Trainer(cfg)
        # as crl train: opened once the trainer has made the run folder, which W&B writes into
        trackers = open_trackers(report_to, name=f"{cfg.name}-{cfg.arm}-seed{cfg.run.seed}",
                                 run_dir=run_dir, config=config_to_dict(cfg))
        trainer.on_step = trackers.log
        try:
            trainer.train()
        finally:
            trackers.close()
        actor = trainer.last_checkpoint / "actor_hf"
        seeds = heldout_seeds(cfg, levels)
        cases = {"held-out": (seeds, False)}
        if cfg.uses_experience:  # and with the run's bank: do its lessons lift unseen levels?
            cases[WITH_BANK] = (seeds, True)
        outcomes = evaluate_levels(cfg, f"hf:{actor}", cases, run_dir / "eval",
                                   bank=run_dir / "bank.sqlite")
        if quality_episodes and cfg.arm == "co-evolve" and trainer.extractor is not None:
            base = actor_adapter_base(cfg.extractor.model, trainer.extractor.lora)
            if base is None:
                trainer.extractor.save_merged(run_dir / "extractor_hf")
            else:
                trainer.extractor.save_adapter(run_dir / "extractor_hf", base)
            trainer.tokenizer.save_pretrained(run_dir / "extractor_hf")
            extractor_quality(cfg, f"hf:{run_dir / 'extractor_hf'}", quality_episodes, run_dir)
    except (UserFacingError, OSError) as err:
        raise SystemExit(f"efficacy: {cfg.run.output_dir}: {err}") from None
    banked = run_dir / "eval" / WITH_BANK / "report.json"
    (run_dir / "heldout.json").write_text(json.dumps(
        {"actor": str(actor), "outcomes": outcomes["held-out"],
         "outcomes_with_bank": outcomes.get(WITH_BANK),
         "handed_lessons": handed_lessons(banked) if WITH_BANK in outcomes else None}, indent=2))
    print(f"  {cfg.arm} seed {cfg.run.seed}: {time.perf_counter() - start:.0f} s", flush=True)


def finished_run(cfg, parser: argparse.ArgumentParser) -> bool:
    """Whether ``cfg``'s run folder holds a finished run (``heldout.json``) of this very config
    (``--reuse``); a finished run of another config there is a usage error that names the first
    setting that differs. These do not make another run: ``run.output_dir`` (a run folder moved
    or linked into ``--out``), a setting added since the run was made that holds its default,
    and, for arm none, the ``extractor`` section and ``experience.merge_every`` (that arm
    neither loads nor trains an extractor and keeps no bank to merge), so one arm none run pairs
    with experience arms whose extractors or merge passes differ."""
    from crl_harness.config import TrainConfig, config_to_dict
    from crl_harness.models.engines import SAMPLING_ENGINES

    run_dir = Path(cfg.run.output_dir)
    if not (run_dir / "heldout.json").is_file():
        return False
    try:
        saved = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError) as err:
        parser.error(f"--reuse: {run_dir} has heldout.json but no readable config.json ({err}); "
                     "move the folder away to train it again")
    wanted = config_to_dict(cfg)
    for role in ("actor", "extractor"):  # a run stores what `auto` chose where it trained
        if wanted[role]["rollout_engine"] == "auto" and \
                _at(saved, f"{role}.rollout_engine") in SAMPLING_ENGINES:
            wanted[role]["rollout_engine"] = saved[role]["rollout_engine"]
    wanted = _without_new_defaults(saved, wanted, config_to_dict(TrainConfig()))
    if isinstance(saved.get("run"), dict) and "output_dir" in saved["run"]:
        wanted["run"]["output_dir"] = saved["run"]["output_dir"]
    if cfg.arm == "none" and "extractor" in saved:
        wanted["extractor"] = saved["extractor"]
    if cfg.arm == "none" and "merge_every" in saved.get("experience", {}):
        wanted["experience"]["merge_every"] = saved["experience"]["merge_every"]
    if saved != wanted:
        key = _first_difference(saved, wanted)
        parser.error(f"--reuse: {run_dir} holds a run of another config ({key}: "
                     f"{_at(saved, key)!r} there, {_at(wanted, key)!r} now); use another --out, "
                     "or the settings of that run")
    return True


def _without_new_defaults(saved: object, wanted: object, defaults: object) -> object:
    """``wanted`` without the settings ``saved`` lacks that hold their default (``defaults``):
    settings added after the run was made, which it ran as their default does."""
    if not (isinstance(saved, dict) and isinstance(wanted, dict)):
        return wanted
    defaults = defaults if isinstance(defaults, dict) else {}
    return {key: _without_new_defaults(saved.get(key), value, defaults.get(key))
            for key, value in wanted.items()
            if key in saved or key not in defaults or defaults[key] != value}


def _first_difference(a: object, b: object, prefix: str = "") -> str:
    """The dotted key of the first value where ``a`` and ``b`` (nested dicts) differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
    return prefix.rstrip(".") or "(the whole config)"


def _at(tree: object, key: str) -> object:
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _stopped(signum: int, frame: object) -> None:
    raise SystemExit(f"efficacy: stopped by signal {signum}; the runs still training were "
                     "stopped (finished runs stay in --out: --reuse reads them)")


def train_all(runs: list[tuple[str, int]], args: argparse.Namespace, out: Path,
              overrides: list[str]) -> None:
    """Train every (arm, seed) run, ``args.jobs`` at a time, each in a fresh process (nothing of
    one run's memory stays for the next); the first run that fails stops the others, and so
    does a SIGTERM to this process (``timeout``, ``kill``), which the runs would otherwise
    outlive (Ctrl-C reaches them with the process group)."""
    context = multiprocessing.get_context("spawn")
    waiting, running = list(runs), {}
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        while waiting or running:
            while waiting and len(running) < args.jobs:
                arm, seed = waiting.pop(0)
                process = context.Process(target=run_arm, name=f"the {arm} run of seed {seed}",
                                          args=(args.eval_levels, args.extractor_quality,
                                                args.report_to, args.config, arm, args.actor, seed,
                                                args.steps, out, overrides))
                process.start()
                running[process.sentinel] = process
            for sentinel in multiprocessing.connection.wait(list(running)):
                process = running.pop(sentinel)
                process.join()
                if process.exitcode != 0:
                    raise SystemExit(f"efficacy: {process.name} failed (exit code "
                                     f"{process.exitcode}, its error above); the runs still "
                                     "training were stopped")
    finally:
        signal.signal(signal.SIGTERM, previous)
        for process in running.values():
            process.terminate()
        for process in running.values():
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def pooled_curve(runs: list[list[dict]], part: str) -> list[dict]:
    """Per step, the rollouts of ``part`` (all, guided, free) pooled over the runs: successes,
    episodes, rate and 95% Wilson interval."""
    from crl_harness.eval import wilson_interval

    curve = []
    for i in range(min(len(r) for r in runs)):
        n = sum(int(r[i].get(f"episodes/{part}", 0)) for r in runs)
        wins = sum(round(r[i][f"success/{part}"] * r[i][f"episodes/{part}"]) for r in runs
                   if r[i].get(f"episodes/{part}"))
        low, high = wilson_interval(wins, n) if n else (float("nan"), float("nan"))
        curve.append({"successes": wins, "episodes": n,
                      "rate": wins / n if n else float("nan"), "interval": [low, high]})
    return curve


def paired_report(runs: list[tuple[str, int]], args: argparse.Namespace, out: Path,
                  results: dict[str, list[list[dict]]], overrides: list[str]) -> dict:
    """Print and return the paired endpoints: held-out success per arm against the warm start
    and between arms (pairs: level x seed), and guided against free inside training's groups."""
    from crl_harness.eval import PairedDifference, format_paired, format_rate, paired_difference
    from crl_harness.eval.heldout import default_cache, evaluate_levels, handed_line
    from crl_harness.training.metrics import PAIR_SETS, pooled_pairs

    warm_cfg = run_config(args.config, args.arms[0], args.actor, args.seed, args.steps, out,
                          overrides)
    warm = evaluate_levels(warm_cfg, warm_cfg.starting_model(),
                           {"held-out": (heldout_seeds(warm_cfg, args.eval_levels), False)},
                           out / "warm-start", cache=default_cache())["held-out"]
    files = {(arm, seed): json.loads((out / f"{arm}-seed{seed}" / "heldout.json").read_text())
             for arm, seed in runs}
    heldout = {run: {int(s): won for s, won in f["outcomes"].items()} for run, f in files.items()}
    with_bank = {run: {int(s): won for s, won in f["outcomes_with_bank"].items()}
                 for run, f in files.items() if f.get("outcomes_with_bank")}
    seeds = sorted({seed for _, seed in runs})

    def pooled(a: dict[int, dict[int, bool]], b: dict[int, dict[int, bool]]) -> PairedDifference:
        """B minus A, the (seed, level) pairs of every seed pooled."""
        pairs = [(a[seed][level], b[seed][level]) for seed in seeds
                 for level in sorted(a[seed].keys() & b[seed].keys())]
        return paired_difference([x for x, _ in pairs], [y for _, y in pairs])

    by_arm = {arm: {seed: heldout[arm, seed] for seed in seeds} for arm in args.arms}
    warm_by_seed = {seed: warm for seed in seeds}  # greedy: the warm start plays each level once
    report: dict = {"eval_levels": args.eval_levels, "warm_start": warm, "arms": {},
                    "between_arms": {}, "guided_vs_free": {}, "guided_vs_free/revisits": {},
                    "guided_vs_free/first visits": {}, "lessons_replayed": {}}
    print(f"\nheld-out success, {args.eval_levels} levels x {len(seeds)} seed(s), greedy, no "
          "bank; [95% Wilson interval]; paired differences [95% CI], McNemar's exact p")
    print(f"  warm start: {format_rate(sum(warm.values()), len(warm))}")
    for arm in args.arms:
        d = pooled(warm_by_seed, by_arm[arm])
        report["arms"][arm] = d.to_dict()
        print(f"  {arm}: {format_rate(d.b_wins, d.n)}; against the warm start "
              f"{format_paired(d, 'warm start', arm)}")
    for i, a in enumerate(args.arms):
        for b in args.arms[i + 1:]:
            d = pooled(by_arm[a], by_arm[b])
            report["between_arms"][f"{b} - {a}"] = d.to_dict()
            print(f"  {b} - {a}: {format_paired(d, a, b)}")
    banked = [arm for arm in args.arms if all((arm, seed) in with_bank for seed in seeds)]
    if banked:
        print("\nheld-out, the arm's actor with its run's bank (lessons of the training levels: "
              "only lessons that hold for a retrieval key reach unseen levels)")
        report["with_bank"] = {}
    for arm in banked:
        mine = {seed: with_bank[arm, seed] for seed in seeds}
        d = pooled(by_arm[arm], mine)
        report["with_bank"][f"{arm}: with its bank - without"] = d.to_dict()
        print(f"  {arm}: with its bank {format_rate(d.b_wins, d.n)}; with - without (the same "
              f"actor) {format_paired(d, 'without', 'with')}")
        # where the bank acted, and whether its lessons could win there (runs that record it)
        recorded = [seed for seed in seeds if files[arm, seed].get("handed_lessons") is not None]
        if any(files[arm, seed]["handed_lessons"] for seed in recorded):
            handed = {(seed, int(level)): won for seed in recorded
                      for level, won in files[arm, seed]["handed_lessons"].items()}
            report["with_bank"][f"{arm}: handed lessons"] = {
                "seeds": recorded, "handed": len(handed), "win_replayed": sum(handed.values())}
            common = [(seed, level) for seed in recorded
                      for level in sorted(mine[seed].keys() & by_arm[arm][seed].keys())]
            which = "" if recorded == seeds else f"seed(s) {', '.join(map(str, recorded))}: "
            print(f"    {which}" + handed_line(
                handed, {pair: by_arm[arm][pair[0]][pair[1]] for pair in common},
                {pair: mine[pair[0]][pair[1]] for pair in common}))
        if "none" in args.arms:
            d = pooled(by_arm["none"], mine)
            report["with_bank"][f"{arm} with its bank - none"] = d.to_dict()
            print(f"  {arm} with its bank - none's actor: {format_paired(d, 'none', arm)}")
    print("\nguided against free inside the same training groups (slot by slot, steps and seeds "
          "pooled), on every group, on revisits (the bank may hold the level's lesson) and on "
          "first visits (it cannot)")
    for arm, arm_runs in results.items():
        if arm == "none":
            continue
        records = [r for run in arm_runs for r in run]
        for where, prefix in PAIR_SETS.items():
            d = pooled_pairs(records, prefix)
            report["guided_vs_free" if where == "all" else f"guided_vs_free/{where}"][arm] = \
                d.to_dict()
            print(f"  {arm}, {where}: guided {format_rate(d.b_wins, d.n)}, free "
                  f"{format_rate(d.a_wins, d.n)}; guided - free "
                  f"{format_paired(d, 'free', 'guided')}")
        replayed = [r["lessons/replay_win_rate"] for r in records
                    if r.get("lessons/handed") and r.get("lessons/replay_win_rate") == r.get(
                        "lessons/replay_win_rate")]
        handed = [r["lessons/handed"] for r in records if r.get("lessons/handed")]
        if handed:
            wins = sum(h * w for h, w in zip(handed, replayed, strict=False))
            report["lessons_replayed"][arm] = {"handed": sum(handed), "win": wins}
            print(f"  {arm}: handed lessons that win replayed without a model: "
                  f"{format_rate(round(wins), round(sum(handed)))}")
    return report


def quality_report(runs: list[tuple[str, int]], args: argparse.Namespace, out: Path,
                   overrides: list[str]) -> dict:
    """Print and return the extractor's quality at the start of the runs (the warm extractor,
    measured here) and at their end (each co-evolve run's, measured after it trained; a static
    run's extractor is the warm one throughout): greedy, the taught answer per case (an exact
    lesson of a won episode, ``return`` for a lost one, for one misled by another level's
    route, an upvote of the level's lesson that won, a downvote of its wrong one that lost) and
    the malformed answers, and the malformed at the sampling temperature, each with its 95%
    Wilson interval."""
    from crl_harness.eval import format_rate

    cfg = run_config(args.config, "co-evolve", args.actor, args.seed, args.steps, out, overrides)
    extractor_quality(cfg, cfg.starting_model("extractor"), args.extractor_quality,
                      out / "warm-start")
    measured = {"warm start": out / "warm-start"}
    measured.update({f"co-evolve seed {seed}": out / f"{arm}-seed{seed}" for arm, seed in runs
                     if arm == "co-evolve"})
    print(f"\nthe extractor's answers on {args.extractor_quality} episodes of held-out levels "
          "(the same for each), right per taught case, and malformed; greedy, and malformed at "
          "the sampling temperature")
    report = {}
    for name, folder in measured.items():
        results = json.loads((folder / "extractor_quality.json").read_text())["results"]
        greedy, sampled = results["greedy"]["counts"], next(
            v["counts"] for k, v in results.items() if k != "greedy")
        malformed = sum(c["malformed"] for c in greedy.values())
        n = sum(sum(c.values()) for c in greedy.values())
        sampled_malformed = sum(c["malformed"] for c in sampled.values())
        sampled_n = sum(sum(c.values()) for c in sampled.values())
        report[name] = results
        cases = "; ".join(f"{case} {format_rate(row['right'], sum(row.values()))}"
                          for case, row in greedy.items() if sum(row.values()))
        print(f"  {name}: {cases}; malformed {format_rate(malformed, n)}; sampled, malformed "
              f"{format_rate(sampled_malformed, sampled_n)}")
    if "static" in args.arms:
        print("  static: the warm start's extractor throughout (never trained)")
    return report


def _cell(point: dict) -> str:
    return (f"{100 * point['rate']:.0f}% [{100 * point['interval'][0]:.0f}, "
            f"{100 * point['interval'][1]:.0f}]")


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--actor", default=None,
                        help="actor model spec, e.g. hf:RUN/checkpoints/step-000010/actor_hf")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps of every run (default: the config's run.steps)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=ARMS)
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="key=value",
                        help="config overrides for every arm")
    parser.add_argument("--out", default=None,
                        help="the output folder (default a new runs/efficacy-TIMESTAMP; "
                             "with --reuse one that holds earlier runs)")
    parser.add_argument("--eval-levels", type=int, default=128,
                        help="held-out levels each run's final actor and the warm start play, "
                             "one greedy episode each (default 128: about 90%% power for +15 "
                             "points, paired)")
    parser.add_argument("--extractor-quality", type=int, default=48, metavar="EPISODES",
                        help="episodes of held-out levels, shared over the cases the warm "
                             "start teaches, on which the warm extractor and each co-evolve "
                             "run's final one answer (extractor_quality.py's measure; default "
                             "48, 0 skips it)")
    parser.add_argument("--reuse", action="store_true",
                        help="read the runs --out already holds instead of training them again "
                             "(a run folder with heldout.json and this invocation's config, "
                             "linked or moved there too; arm none's whatever the extractor): "
                             "e.g. --repeats 2 after a --repeats 1 trains the second seed only")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs trained at once, each in its own process (default 1: a "
                             "cpu-demo run peaks at 13-16 GB)")
    parser.add_argument("--report-to", nargs="+", default=[], choices=["wandb", "mlflow"],
                        help="also log each run's step metrics to wandb and/or mlflow, one "
                             "tracked run per arm and seed (as crl train --report-to; the "
                             "tracking extra)")
    args = parser.parse_args()

    if not 1 <= args.repeats <= 20 or (args.steps is not None and not 1 <= args.steps <= 10_000):
        parser.error("--repeats must be in 1..20 and --steps in 1..10000")
    if not 1 <= args.jobs <= 16:
        parser.error("--jobs must be in 1..16")
    if args.extractor_quality != 0 and not 4 <= args.extractor_quality <= 300:
        parser.error("--extractor-quality must be in 4..300, one or more of each taught "
                     "answer (0 skips it)")
    if not args.arms:
        parser.error(f"--arms needs at least one of: {', '.join(ARMS)}")
    from crl_envs.errors import UserFacingError
    from crl_harness.config import HELDOUT_RESERVED
    from crl_harness.tracking import check_services

    try:  # a missing package is one line before anything trains
        check_services(args.report_to)
    except UserFacingError as err:
        parser.error(str(err))

    if not 1 <= args.eval_levels <= HELDOUT_RESERVED:
        parser.error(f"--eval-levels must be in 1..{HELDOUT_RESERVED}")
    out = Path(args.out or time.strftime("runs/efficacy-%Y%m%d-%H%M%S"))
    # Each run's threads are its share of the cores: two runs with all of them each thrash.
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    overrides = [f"run.torch_threads={threads}", *args.set]
    runs = [(arm, args.seed + repeat) for repeat in range(args.repeats) for arm in args.arms]
    from crl_harness.config import ConfigError

    try:  # a bad --set stops here, not in every run's process
        for arm, seed in runs:
            run_config(args.config, arm, args.actor, seed, args.steps, out, overrides)
    except ConfigError as err:  # a --seed out of range too (run.seed)
        parser.error(str(err))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"--out {out}: cannot create this folder ({err.strerror or err}); pick "
                     "another")
    started = time.perf_counter()
    done = [(arm, seed) for arm, seed in runs if args.reuse and finished_run(
        run_config(args.config, arm, args.actor, seed, args.steps, out, overrides), parser)]
    from reused_runs import reused_run_problem  # a tampered folder: one line, before evaluating
    for problem in filter(None, (reused_run_problem(out / f"{a}-seed{s}", args.eval_levels)
                                 for a, s in done)):
        parser.error(f"--reuse: {problem}")
    if done:
        print("reused: " + ", ".join(f"{arm} seed {seed}" for arm, seed in done), flush=True)
    train_all([run for run in runs if run not in done], args, out, overrides)
    from crl_harness.training.metrics import read_metrics

    results = {arm: [read_metrics(out / f"{a}-seed{seed}" / "metrics.jsonl")
                     for a, seed in runs if a == arm] for arm in args.arms}

    curves = {arm: {part: pooled_curve(arm_runs, part)
                    for part in (("all", "guided", "free") if arm != "none" else ("all",))}
              for arm, arm_runs in results.items()}
    steps = min(len(c["all"]) for c in curves.values())
    print(f"\ntraining-task success per step, rollouts pooled over {args.repeats} seed(s), "
          "95% Wilson intervals")
    print("step  " + "".join(f"{arm:>18}" for arm in args.arms))
    for i in range(steps):
        print(f"{i + 1:>4}  " + "".join(f"{_cell(curves[a]['all'][i]):>18}" for a in args.arms))
    print("\n| arm | final-step success | mean over steps | guided (mean) | free (mean) |")
    print("|---|---|---|---|---|")
    for arm in args.arms:
        c = curves[arm]
        # over the steps that had such rollouts (no guided ones while the bank is empty)
        rates = {part: [p["rate"] for p in c[part] if p["episodes"]] for part in c}
        mean = {part: statistics.fmean(r) if r else float("nan") for part, r in rates.items()}
        guided = f"{100 * mean['guided']:.0f}%" if "guided" in mean else "-"
        free = f"{100 * mean['free']:.0f}%" if "free" in mean else "-"
        print(f"| {arm} | {_cell(c['all'][steps - 1])} | {100 * mean['all']:.0f}% | {guided} | "
              f"{free} |")
    paired = paired_report(runs, args, out, results, overrides)
    quality = quality_report(runs, args, out, overrides) if args.extractor_quality else {}
    print(f"\n{args.repeats} seed(s) x {len(args.arms)} arm(s) in "
          f"{time.perf_counter() - started:.0f} s")

    (out / "efficacy.json").write_text(json.dumps({"args": vars(args), "curves": curves,
                                                  "paired": paired,
                                                  "extractor_quality": quality,
                                                  "seconds": time.perf_counter() - started},
                                                  indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in args.arms:
        points = curves[arm]["all"]
        xs = range(1, len(points) + 1)
        ax.plot(xs, [p["rate"] for p in points], marker="o", label=arm)
        ax.fill_between(xs, [p["interval"][0] for p in points],
                        [p["interval"][1] for p in points], alpha=0.15)
    ax.set_xlabel("step")
    ax.set_ylabel("training-task success (pooled, 95% CI)")
    ax.set_title(f"{args.config}: three arms, {args.repeats} repeat(s)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "efficacy.png", dpi=100)
    print(f"\nwrote {out / 'efficacy.png'} and {out / 'efficacy.json'}")


if __name__ == "__main__":
    main()
