"""``crl eval``: benchmark an agent on CRL envs and write a table, a JSON report and a chart.

Example: ``crl eval --agent scripted --envs all --episodes 20`` or
``crl eval --agent hf:smollm2-135m --envs CRL/MiniHackRoom-v0 --episodes 8
--env-kwargs variant=dark max_episode_steps=6``.
Writes into ``--out`` (default ``runs/eval-TIMESTAMP``): ``eval.json`` (the settings),
``results.jsonl`` (one attempt a line, appended as episodes finish; the input of ``crl swe
filter``), ``transcripts.jsonl`` (one episode a line: prompts, replies, actions, observations,
rewards), ``report.json`` and ``success.png``. ``--resume --out FOLDER`` continues an
interrupted eval there: the (env, seed) pairs already in ``results.jsonl`` are not played again.
One eval at a time writes a folder (``eval.lock``); an eval stopped by an error or Ctrl-C still
writes the report and chart of the episodes it played (``crl_harness.eval.folder`` says how a
crash between or within appends is repaired).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from crl_envs.errors import UserFacingError
from crl_harness.commands.checks import AGENT_SPECS, check_agent, check_range, output_dir
from crl_harness.commands.env_kwargs import check_env_kwargs, parse_env_kwargs
from crl_harness.eval.folder import LOCK, RESULTS, SETTINGS, TRANSCRIPTS
from crl_harness.models.base import KV_CACHE_TOKENS
from crl_harness.models.hf_loading import BF16_IF_NATIVE

if TYPE_CHECKING:
    from crl_wrappers.experience import Retriever


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", required=True, help=AGENT_SPECS)
    parser.add_argument("--envs", required=True,
                        help="comma-separated env ids, 'all', or a mixture config name (mix3, mix6)")
    parser.add_argument("--episodes", type=int, default=None,
                        help="episodes per env (default 10, or the number of --seeds)")
    parser.add_argument("--seeds", default=None,
                        help="START (default 0), A-B or A,B,C: the seeds played on every env")
    parser.add_argument("--experience", default=None, metavar="BANK_PATH",
                        help="an experience bank (SQLite file): retrieved entries go into prompts")
    parser.add_argument("--experience-k", type=int, default=1, help="entries retrieved per episode")
    parser.add_argument("--workers", type=int, default=1,
                        help="threads for env steps (scripted: episodes played at once); "
                             "keep 1 for ALFWorld, whose game loading is not thread-safe")
    parser.add_argument("--out", default=None, help="output folder (default runs/eval-TIMESTAMP)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the interrupted eval in --out (same settings): episodes "
                             "already in its results.jsonl are not played again")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="cap on one reply")
    parser.add_argument("--max-context", type=int, default=None, metavar="TOKENS",
                        help="the model's context in tokens, which prompt and reply share (the "
                             "history is cut to fit); default: the model's own (openai: the "
                             "server's model info, else 8192)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--history", type=int, default=None,
                        help="earlier turns kept in the prompt (default: all that fit)")
    parser.add_argument("--max-live", type=int, default=64,
                        help="model agents: episodes generated for in one batch")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--kv-cache-tokens", type=int, default=KV_CACHE_TOKENS,
                        help="hf and vllm agents: tokens of keys/values kept for reuse between "
                             "turns (least recently used evicted; SmolLM2-135M: 46 KB a token)")
    parser.add_argument("--dtype", default="auto",
                        choices=["auto", "float32", "bfloat16", "float16", BF16_IF_NATIVE],
                        help="hf and vllm agents: the weights' precision (auto: bfloat16 on a "
                             "GPU, float32 on a CPU; bfloat16 doubles a CPU's speed where it has "
                             f"AVX512-BF16 or AMX, and {BF16_IF_NATIVE} picks it only there)")
    parser.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"],
                        help="hf agents: what generates, transformers (hf) or vLLM (adapters "
                             "merged); auto (default): vllm where it imports and runs here, else "
                             "hf, said in one line")
    parser.add_argument("--no-kv-reuse", action="store_true",
                        help="hf agents: prefill every prompt in full (the slow path, to compare)")
    parser.add_argument("--env-kwargs", nargs="+", default=None, metavar="KEY=VALUE",
                        help="keyword arguments for gym.make of every env: KEY=VALUE pairs, a "
                             "value read as JSON where it parses (6, 0.5, true, null, [1, 2]) and "
                             "as a string otherwise, e.g. variant=dark max_episode_steps=6; or "
                             "one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--report-to", nargs="+", default=[], choices=["wandb", "mlflow"],
                        metavar="SERVICE",
                        help="also log the results per env to wandb and/or mlflow (the tracking "
                             "extra; configured by their own WANDB_* / MLFLOW_* variables)")


def tracked_results(summaries: Sequence[Any]) -> dict[str, float]:
    """The numbers of each env's ``EnvSummary`` that ``--report-to`` logs, as ``ENV_ID/name``.

    >>> from crl_harness.eval import summarize
    >>> from crl_harness.rollout import Trajectory
    >>> results = tracked_results(summarize([Trajectory("CRL/Sokoban-v0", 0, won=True, steps=4)]))
    >>> results["CRL/Sokoban-v0/success_rate"], results["CRL/Sokoban-v0/episodes"]
    (1.0, 1.0)
    """
    fields = ("episodes", "successes", "success_rate", "ci_low", "ci_high", "mean_steps_success",
              "invalid_action_rate", "format_failure_rate", "mean_reward", "mean_score",
              "generated_tokens", "errors")
    return {f"{s.env_id}/{name}": float(getattr(s, name)) for s in summaries for name in fields
            if getattr(s, name) is not None}


class EpisodeTally:
    """The progress bar's count of finished episodes: wins among those played, and the episodes
    that failed with an error (not played, so neither a win nor a loss).

    >>> from crl_harness.rollout import Trajectory
    >>> tally = EpisodeTally()
    >>> for traj in (Trajectory("E", 0, won=True), Trajectory("E", 1, error="RuntimeError: x")):
    ...     tally.add(traj)
    >>> tally.line()
    'wins 1/1 played, errors 1'
    """

    def __init__(self) -> None:
        self.played = self.wins = self.errors = 0

    def add(self, traj: Any) -> None:
        """Count one finished ``Trajectory``."""
        if traj.error:
            self.errors += 1
        else:
            self.played += 1
            self.wins += bool(traj.won)

    def line(self) -> str:
        errors = f", errors {self.errors}" if self.errors else ""
        return f"wins {self.wins}/{self.played} played{errors}"


def check_arguments(args: argparse.Namespace) -> None:
    """The numeric flags and the agent's shape, before any env, bank or model is opened."""
    from crl_harness.eval import MAX_SEED

    check_agent(args.agent)
    check_range("--seed", args.seed, 0, MAX_SEED)
    check_range("--workers", args.workers, 1, 1024)
    check_range("--experience-k", args.experience_k, 1, 100)
    check_range("--max-new-tokens", args.max_new_tokens, 1)
    check_range("--max-context", args.max_context, 2)
    check_range("--max-live", args.max_live, 1)
    check_range("--history", args.history, 0)
    check_range("--temperature", args.temperature, 0.0)
    check_range("--top-p", args.top_p, 0.0, 1.0)
    if args.top_p == 0:  # no token left to sample (the most likely one is what greedy is for)
        raise UserFacingError("--top-p must be > 0 (0 < top-p <= 1); for the most likely token "
                              "every time use --temperature 0.")
    check_range("--kv-cache-tokens", args.kv_cache_tokens, 1)


def choose_agent_engine(args: argparse.Namespace, console: Any) -> None:
    """``--engine`` of an ``hf:`` agent (``crl_harness.models.engines``'s rule, said in one
    line): where it means vllm, the agent becomes ``vllm:`` of the same model. ``--no-kv-reuse``
    is transformers' own, so auto means hf with it."""
    from crl_harness.models.engines import choose_engine, sampling_engine

    if not args.agent.startswith("hf:"):
        if args.engine != "auto":
            raise UserFacingError(f"--engine {args.engine} is for hf: agents; {args.agent} "
                                  "chooses its own.")
        return
    choice = choose_engine(args.engine, hf_because="--no-kv-reuse is the hf engine's"
                           if args.no_kv_reuse else None)
    engine = sampling_engine(choice.engine)
    if not engine.own_model and args.no_kv_reuse:
        raise UserFacingError("--no-kv-reuse is the hf engine's; drop it or give --engine hf.")
    console.print(choice.line(args.agent), highlight=False)
    args.agent = engine.spec(args.agent)


def eval_settings(args: argparse.Namespace, env_ids: list[str], seeds: list[int],
                  env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What decides an eval's episodes and outcomes: ``--resume`` requires the same."""
    return {"agent": args.agent, "envs": env_ids, "seeds": seeds, "env_kwargs": env_kwargs,
            "experience": args.experience, "experience_k": args.experience_k,
            "temperature": args.temperature, "top_p": args.top_p,
            "max_new_tokens": args.max_new_tokens, "history": args.history, "seed": args.seed,
            "dtype": args.dtype}


def resume_target(out: str | None) -> Path:
    """The eval folder ``--resume`` continues, or one clear error: no ``--out``, or no eval
    folder there."""
    if not out:
        raise UserFacingError("--resume needs --out FOLDER: the folder of the eval to continue.")
    folder = Path(out)
    if not (folder / SETTINGS).is_file():
        what = "does not exist" if not folder.exists() else f"holds no {SETTINGS}"
        raise UserFacingError(f"--resume: {folder} {what}, so it is no crl eval folder to "
                              "continue; drop --resume to start one there.")
    return folder


def resume_folder(folder: Path, settings: dict[str, Any], console: Any) -> list:
    """The episodes the eval folder ``folder`` (locked by this process) already holds, with its
    files made ready to append to (see ``crl_harness.eval.folder``), or one clear error: settings
    other than ``settings``, or a file that is not what ``crl eval`` writes."""
    from crl_harness.eval import recorded_trajectory
    from crl_harness.eval.folder import cut_torn_line, keep_transcripts
    from crl_harness.results import ResultsFormatError, read_attempts

    try:
        saved = json.loads((folder / SETTINGS).read_bytes())
    except (OSError, ValueError, RecursionError) as err:  # ValueError: not JSON, not UTF-8
        raise UserFacingError(f"--resume: cannot read {folder / SETTINGS} "
                              f"({str(err)[:160]}).") from err
    if not isinstance(saved, dict):
        raise UserFacingError(f"--resume: {folder / SETTINGS} is not an eval's settings.")
    differ = [key for key in settings if saved.get(key) != settings[key]]
    if differ:
        shown = "; ".join(f"{key}: {saved.get(key)!r} there, {settings[key]!r} now"[:160]
                          for key in differ)
        raise UserFacingError(f"--resume: {folder} is an eval with other settings ({shown}); "
                              "give the same flags, or another --out.")
    if cut_torn_line(folder / RESULTS):
        console.print(f"cut the unfinished last line of {folder / RESULTS}: its episode is "
                      "played again")
    try:
        attempts = read_attempts(folder / RESULTS) if (folder / RESULTS).exists() else []
    except ResultsFormatError as err:
        raise UserFacingError(f"--resume: {err}") from err
    wanted = {(env_id, seed) for env_id in settings["envs"] for seed in settings["seeds"]}
    earlier = {}
    for attempt in attempts:
        if (attempt.env_id, attempt.seed) in wanted:
            try:
                earlier.setdefault((attempt.env_id, attempt.seed), recorded_trajectory(attempt))
            except ResultsFormatError as err:
                raise UserFacingError(f"--resume: {folder / RESULTS}: {err}") from err
    dropped = keep_transcripts(folder / TRANSCRIPTS, earlier.keys())
    if dropped:
        console.print(f"dropped {dropped} line(s) of {folder / TRANSCRIPTS} without an attempt "
                      "in results.jsonl (episodes played again, torn lines)")
    return list(earlier.values())


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from crl_harness.eval import expand_env_ids, parse_seeds

    console = Console()
    if not console.is_terminal:
        console.width = 140  # logs and CI: room for every column
    check_arguments(args)
    choose_agent_engine(args, console)
    env_ids = expand_env_ids(args.envs)
    seeds = parse_seeds(args.seeds, args.episodes)
    env_kwargs = parse_env_kwargs(args.env_kwargs)
    if env_kwargs:
        check_env_kwargs(env_ids, env_kwargs)

    manager = retriever = None
    if args.experience:
        from crl_harness.experience import ExperienceBank, ExperienceManager

        # Read-only: evaluation leaves the bank as it was, and may run beside its trainer; it
        # reports no outcome either (credit is left alone: only a trainer credits).
        manager = retriever = ExperienceManager(ExperienceBank(args.experience, read_only=True))
    if not args.resume:
        args.out = args.out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        return _evaluate_in_folder(args, console, env_ids, seeds, env_kwargs, retriever)
    finally:
        if manager is not None:  # its threads stop and the bank closes (a mount can go)
            manager.close()
            manager.bank.close()


def _remove_unused(folder: Path) -> None:
    """Remove ``folder`` if it holds nothing but the settings and the lock (no episode was
    recorded)."""
    try:
        if folder.is_dir() and {entry.name for entry in folder.iterdir()} <= {SETTINGS, LOCK}:
            (folder / SETTINGS).unlink(missing_ok=True)
            (folder / LOCK).unlink(missing_ok=True)
            folder.rmdir()
    except OSError:
        pass  # best effort: the original error is the one to show


def _evaluate_in_folder(args: argparse.Namespace, console: Any, env_ids: list[str],
                        seeds: list[int], env_kwargs: dict[str, Any],
                        retriever: Retriever | None) -> int:
    """``_evaluate`` while this process holds the lock of the ``--out`` folder (one eval at a
    time appends there)."""
    from crl_harness.eval.folder import lock_folder

    fresh = not args.resume and not Path(args.out).exists()
    out = resume_target(args.out) if args.resume else output_dir(args.out, "--out")
    lock = lock_folder(out)
    try:
        return _evaluate(args, console, out, env_ids, seeds, env_kwargs, retriever)
    except BaseException:
        if fresh:  # a failed start (a model that does not load) leaves no empty eval folder
            _remove_unused(out)  # still locked: no other eval can be using it
        raise
    finally:
        lock.close()  # closing the descriptor releases the flock


def _evaluate(args: argparse.Namespace, console: Any, out: Path, env_ids: list[str],
              seeds: list[int], env_kwargs: dict[str, Any],
              retriever: Retriever | None) -> int:
    """``crl eval``'s episodes, table, report and chart in the locked folder ``out``, once the
    arguments are checked."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from crl_harness.eval import (
        episode_specs,
        evaluate,
        plot_success,
        render_table,
        summarize,
        write_report,
    )
    from crl_harness.rollout import RolloutConfig
    from crl_harness.tracking import check_services, open_trackers

    check_services(args.report_to)  # a missing package is one line before any model loads
    specs = episode_specs(env_ids, seeds, use_experience=retriever is not None)
    settings = eval_settings(args, env_ids, seeds, env_kwargs)
    if args.resume:
        earlier = resume_folder(out, settings, console)
        specs = [spec for spec in specs if (spec.env_id, spec.seed) not in
                 {(t.env_id, t.seed) for t in earlier}]
        console.print(f"resuming {out}: {len(earlier)} episode(s) done, {len(specs)} to play")
    else:
        earlier = []
        if (out / RESULTS).exists():
            raise UserFacingError(f"{out / RESULTS} already exists; pick another --out, or "
                                  f"continue that eval with --resume --out {out}.")
        (out / SETTINGS).write_text(json.dumps(settings, indent=2), encoding="utf-8")
    results_path = out / RESULTS
    backend = None
    if args.agent.startswith("hf:"):
        from crl_harness.models.registry import load_backend

        backend = load_backend(args.agent, kv_reuse=not args.no_kv_reuse,
                               kv_cache_tokens=args.kv_cache_tokens, dtype=args.dtype,
                               max_context=args.max_context)
        # A reply may take at most half the context: the rest is for the prompt.
        check_range("--max-new-tokens", args.max_new_tokens, 1, backend.max_context // 2)
        dtype = str(backend.model.dtype).removeprefix("torch.")
        console.print(f"model on {backend.device} ({dtype})")
    elif args.agent.startswith("vllm:"):
        from crl_harness.models.registry import load_backend

        extra = {} if args.max_context is None else {"max_context": args.max_context}
        backend = load_backend(args.agent, dtype=args.dtype, kv_cache_tokens=args.kv_cache_tokens,
                               **extra)
    elif args.agent.startswith("openai:"):
        from crl_harness.models.registry import load_backend

        backend = load_backend(args.agent, max_context=args.max_context)
        check_range("--max-new-tokens", args.max_new_tokens, 1, backend.max_context // 2)
        console.print(f"context {backend.max_context} tokens ({backend.context_source})")
    rollout = RolloutConfig.from_config(
        None, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        history=args.history, max_live=args.max_live, workers=args.workers, k=args.experience_k,
        seed=args.seed, env_kwargs=dict.fromkeys(env_ids, env_kwargs),
        # the env's rewards as they are: the format penalty is training's shaping, and format
        # failures have their own column
        format_penalty=0.0)
    console.print(f"[bold]crl eval[/]: {args.agent} on {len(env_ids)} env(s) x {len(seeds)} "
                  f"episodes -> {out}")

    def meta(seconds: float) -> dict[str, Any]:
        return {"agent": args.agent, "envs": env_ids, "seeds": seeds,
                "experience": args.experience, "temperature": args.temperature,
                "max_new_tokens": args.max_new_tokens, "history": args.history,
                "env_kwargs": env_kwargs, "seconds": round(seconds, 2)}

    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[tally]}"), TimeElapsedColumn(),
                  console=console, disable=args.no_progress or args.agent == "human") as progress:
        tally = EpisodeTally()
        bar = progress.add_task("episodes", total=len(specs), tally=tally.line())

        played: list = []

        def done(traj) -> None:
            played.append(traj)
            tally.add(traj)
            progress.update(bar, advance=1, tally=tally.line())

        try:
            trajectories = earlier + evaluate(
                args.agent, specs, results_path=results_path, transcripts_path=out / TRANSCRIPTS,
                retriever=retriever, rollout=rollout, workers=args.workers, on_done=done,
                backend=backend) if specs else earlier
        except BaseException:  # a server gone mid-eval, Ctrl-C: report what was played
            if played:
                _report_stopped(out, earlier + played, meta(time.perf_counter() - started),
                                len(earlier) + len(specs), console)
            raise
    seconds = time.perf_counter() - started
    summaries = summarize(trajectories)
    trackers = open_trackers(args.report_to, name=out.name, run_dir=out, config=settings)
    try:
        trackers.log(0, tracked_results(summaries))
    finally:
        trackers.close()
    title = f"{args.agent}: {len(trajectories)} episodes in {seconds:.1f}s"
    console.print(render_table(summaries, title=title))
    for env_id, error in dict.fromkeys((t.env_id, t.error) for t in trajectories if t.error):
        # escaped: an install hint's [EXTRA] is text, not markup
        console.print(f"[red]{escape(env_id)}[/]: {escape(error)}", markup=True, highlight=False)
    write_report(out / "report.json", trajectories, meta(seconds))
    plot_success(out / "success.png", summaries, title=args.agent)
    console.print(f"wrote {results_path}, {out / TRANSCRIPTS}, {out / 'report.json'}, "
                  f"{out / 'success.png'}")
    if all(t.error for t in trajectories):
        console.print("[red]No episode ran to the end[/] (errors above): nothing was measured.")
        return 1
    return 0


def _report_stopped(out: Path, trajectories: list, meta: dict[str, Any], planned: int,
                    console: Any) -> None:
    """The report and chart of the episodes played before the eval stopped (best effort: the
    error that stopped it is the one to show)."""
    from crl_harness.eval import plot_success, summarize, write_report

    try:
        write_report(out / "report.json", trajectories, {**meta, "stopped": True})
        plot_success(out / "success.png", summarize(trajectories), title=meta["agent"])
    except Exception:  # noqa: BLE001 - the stopping error follows
        return
    console.print(f"stopped after {len(trajectories)} of {planned} episode(s): "
                  f"{out / 'report.json'} reports those; --resume --out {out} plays the rest")
