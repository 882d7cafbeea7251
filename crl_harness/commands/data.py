"""``crl data fetch NAME``: download a benchmark dataset from its upstream sources; ``crl data
where``: where each dataset and the embedded model resolve on this machine."""

from __future__ import annotations

import argparse

from crl_envs import data
from crl_envs.errors import UserFacingError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", required=True)
    fetch = sub.add_parser("fetch", help="download NAME into the cache (or --dest), checking sha256")
    fetch.add_argument("name", help=f"dataset name ({', '.join(sorted(data.SOURCES)) or 'none yet'})")
    fetch.add_argument("--dest", default=None, help="target directory (default: the user cache)")
    fetch.add_argument("--force", action="store_true", help="download again even if present")
    sub.add_parser("where", help="print where each dataset and the embedded model resolve")


def run(args: argparse.Namespace) -> int:
    if args.data_command == "fetch":
        if args.name not in data.SOURCES:
            print(f"Unknown dataset '{args.name}'. Known: {', '.join(sorted(data.SOURCES))}.")
            return 2
        try:
            path = data.fetch(args.name, dest=args.dest, force=args.force)
        except OSError as err:  # an unwritable --dest or cache; download errors say more
            raise UserFacingError(f"cannot write {args.name} to "
                                  f"{args.dest or data.cache_dir() / 'data'} ({err}).") from err
        print(f"{args.name}: {path}")
        return 0
    for name in sorted(data.SOURCES):
        try:
            print(f"{name}: {data.resolve_data(name)}")
        except data.DataNotFoundError as err:
            print(f"{name}: missing. {err}")
    from crl_harness.models.names import MODELS, model_location

    for name in MODELS:
        print(f"model {name}: {model_location(name)}")
    return 0
