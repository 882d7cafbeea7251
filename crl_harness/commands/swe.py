"""``crl swe``: SWE-bench tools: ``crl swe filter RESULTS``, the paper's SWE task filter over a
results file of attempts (``FILTER_HELP``), and ``crl swe build-image toy``, the toy task's
Docker image built offline (``BUILD_IMAGE_HELP``, ``build_image``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crl_harness.results import TaskTally, read_attempts, tally


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="swe_command", required=True)
    keep = sub.add_parser("filter", help="keep tasks with min-rate < pass rate < max-rate",
                          description=FILTER_HELP,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    keep.add_argument("results", help="results file of attempts (JSON Lines, crl-results/1)")
    keep.add_argument("--min-rate", type=float, default=0.0,
                      help="keep tasks whose pass rate is strictly above this (default 0)")
    keep.add_argument("--max-rate", type=float, default=0.8,
                      help="keep tasks whose pass rate is strictly below this (default 0.8)")
    keep.add_argument("--min-attempts", type=int, default=1,
                      help="ignore tasks with fewer attempts (default 1; the paper uses 16)")
    keep.add_argument("--out", default=None, help="write the kept ids here (default: stdout)")
    build = sub.add_parser("build-image", help="build the toy task's Docker image offline",
                           description=BUILD_IMAGE_HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    build.add_argument("task", choices=["toy"], help="the task whose image to build")
    build.add_argument("--rootfs", default=None,
                       help="a finished Debian root file system to import instead of running "
                            "debootstrap (it needs python3, pytest, git and patch)")
    build.add_argument("--mirror", default=None,
                       help="Debian mirror for debootstrap (default: the one apt uses here)")
    build.add_argument("--rebuild", action="store_true",
                       help="build the root file system and both images again")


FILTER_HELP = """\
The paper's SWE task filter over a results file of attempts (crl-results/1, the format of
crl_harness/results.py, which crl eval writes as results.jsonl).

Keeps the tasks whose pass rate (successes / attempts, the base model's pass@16 in the paper)
lies strictly between --min-rate (0) and --max-rate (0.8): tasks neither hopeless nor already
solved, 124 of SWE-bench Verified in the paper. Writes the kept ids one a line (to --out or
stdout), a file that SWEBenchEnv(task_ids=...) and crl eval accept as a task list.
"""

BUILD_IMAGE_HELP = """\
Build crl-gym/sweb.eval.x86_64.crl-gym_1776_toy-intervals-1 (the toy row's image) without
any registry: debootstrap a minimal Debian root file system with python3, pytest, git and patch
from the apt mirror (cached under ~/.cache/crl/swe-rootfs), "docker import" it as
crl-gym/swe-base:bookworm, then add the toy repository at /testbed. Needs root, debootstrap
and a running Docker daemon. Steps whose result is there are skipped.
"""


def build_image(args: argparse.Namespace) -> int:
    """``crl swe build-image toy``: the toy task's image, built offline."""
    from crl_envs.swebench.images import ImageBuildError, ensure_toy_image
    from crl_envs.swebench.sandbox import SandboxError, docker_client

    try:
        image = ensure_toy_image(docker_client(), rootfs=Path(args.rootfs) if args.rootfs else None,
                                 mirror=args.mirror, rebuild=args.rebuild,
                                 log=lambda line: print(line, file=sys.stderr))
    except (ImageBuildError, SandboxError) as err:
        print(f"crl swe build-image: {err}", file=sys.stderr)
        return 1
    print(image)
    return 0


def select_tasks(tallies: dict[str, TaskTally], min_rate: float = 0.0, max_rate: float = 0.8,
                 min_attempts: int = 1) -> list[str]:
    """The task ids with ``min_rate < pass rate < max_rate`` and enough attempts, sorted.

    >>> select_tasks({"a": TaskTally(16, 0), "b": TaskTally(16, 4), "c": TaskTally(16, 13)})
    ['b']
    """
    return sorted(task_id for task_id, entry in tallies.items()
                  if entry.attempts >= min_attempts and min_rate < entry.pass_rate < max_rate)


def run(args: argparse.Namespace) -> int:
    if args.swe_command == "build-image":
        return build_image(args)
    if not 0.0 <= args.min_rate < args.max_rate <= 1.0:
        print(f"crl swe filter: need 0 <= --min-rate < --max-rate <= 1, got {args.min_rate} and "
              f"{args.max_rate}.", file=sys.stderr)
        return 2
    if args.min_attempts < 1:
        print(f"crl swe filter: --min-attempts must be >= 1, got {args.min_attempts}.",
              file=sys.stderr)
        return 2
    try:
        tallies = tally(read_attempts(args.results))
    except (OSError, ValueError) as err:
        print(f"crl swe filter: {err}", file=sys.stderr)
        return 2
    kept = select_tasks(tallies, args.min_rate, args.max_rate, args.min_attempts)
    too_few = sum(entry.attempts < args.min_attempts for entry in tallies.values())
    header = (f"# crl swe filter: {len(kept)} of {len(tallies)} tasks with "
              f"{args.min_rate:g} < pass rate < {args.max_rate:g} "
              f"(at least {args.min_attempts} attempts; {too_few} had fewer)")
    text = "\n".join([header, *kept]) + "\n"
    if args.out:
        Path(args.out).write_text(text)
        print(header.lstrip("# "), f"-> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
