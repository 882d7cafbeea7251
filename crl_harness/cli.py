"""The ``crl`` command line.

Each subcommand lives in its own module, which provides ``add_arguments(parser)`` and
``run(args) -> int``; this file only maps names to modules, so ``crl --help`` stays fast and a
subcommand's heavy imports happen only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from crl_envs.errors import UserFacingError, missing_extra
from crl_harness.quiet import VERBOSE_COMMANDS, quiet_third_party

__all__ = ["main", "COMMANDS", "version"]

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("crl_harness.commands.demo", "run the main job on the embedded default"),
    "play": ("crl_harness.commands.play", "play any registered env in the terminal"),
    "data": ("crl_harness.commands.data", "fetch benchmark data from the upstream sources"),
    "train": ("crl_harness.commands.train", "train an agent with Complementary RL or a baseline arm"),
    "warmstart": ("crl_harness.commands.warmstart",
                  "supervised warm start of actor and extractor on scripted-oracle episodes"),
    "swe": ("crl_harness.commands.swe", "SWE-bench tools: filter tasks by pass rate, build the toy image"),
    "eval": ("crl_harness.commands.eval", "benchmark an agent (scripted or a model) on CRL envs"),
}


def version() -> str:
    """The installed crl-gym's version ("unknown" in a checkout that was never installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("crl-gym")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crl", description="Complementary RL Gym")
    parser.add_argument("--version", action="version", version=f"crl-gym {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(command)
        if name in VERBOSE_COMMANDS:
            command.add_argument("--verbose", action="store_true",
                                 help="show the libraries' own progress bars (model loads and "
                                      "saves, downloads), hidden by default")
        command.set_defaults(_module=module)
    return parser


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, with ``key=value`` overrides also after a flag (``crl train
    cpu-demo --no-progress run.steps=1``): argparse fills a ``nargs="*"`` positional once, from
    the words before the first flag, and cannot intermix with subcommands."""
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and not any(word.startswith("-") for word in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(build_parser(), argv)
    if args.command in VERBOSE_COMMANDS and not args.verbose:
        quiet_third_party()
    try:
        return int(args._module.run(args) or 0)
    except UserFacingError as err:
        print(f"crl {args.command}: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # an optional extra that is not installed: say which
        hint = missing_extra(err)
        if hint is None:
            raise
        print(f"crl {args.command}: {hint}", file=sys.stderr)
        return 2
    except OSError as err:  # the file system said no (disk full, permissions): say which file
        print(f"crl {args.command}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nInterrupted.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
