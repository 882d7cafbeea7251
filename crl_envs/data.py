"""Benchmark data resolution and fetching (docs/design.md, "Benchmark data").

One resolver for every dataset: an explicit argument, else ``$CRL_DATA_DIR/NAME``, else
``../shared/data/NAME`` beside a checkout, else the user cache ``~/.cache/crl/data/NAME`` (filled by
``crl data fetch NAME`` from the upstream sources, with checksums). A missing dataset raises
``DataNotFoundError`` naming that command.

Each dataset's upstream sources live in ``SOURCES``: a file name, its URL and its sha256.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from crl_envs.errors import UserFacingError

__all__ = ["DataNotFoundError", "Source", "SOURCES", "resolve_data", "fetch", "cache_dir",
           "hub_offline", "hub_reachable"]


class DataNotFoundError(UserFacingError, FileNotFoundError):
    """A benchmark dataset is not on this machine; the message says how to get it."""


@dataclass(frozen=True)
class Source:
    """One upstream file of a dataset."""

    filename: str
    url: str
    sha256: str | None = None


# Upstream download locations, one entry per dataset (kept here so `crl data fetch` needs no
# heavy imports).
SOURCES: dict[str, list[Source]] = {
    # WebShop small (upstream setup.sh -d small, Google Drive); the attribute file is the same file
    # as ../shared/data/webshop/items_ins_v2_1000.json. The product file is read as upstream's raw
    # JSON (the shared data holds its recovered index documents, docs_1k.jsonl, instead).
    "webshop": [
        Source("items_shuffle_1000.json",
               "https://drive.google.com/uc?export=download&id=1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib"),
        Source("items_ins_v2_1000.json",
               "https://drive.google.com/uc?export=download&id=1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu",
               "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f"),
    ],
    # SWE-bench Verified in swebench 5.x's format, from the hub's current revision (no pinned
    # checksum: the upstream file is revised in place).
    "swebench": [
        Source("verified_test.parquet",
               "https://huggingface.co/datasets/SWE-bench/SWE-bench_Verified/resolve/main/data/"
               "test-00000-of-00001.parquet"),
    ],
    # ALFWorld json_2.1.1 games (every split), the archive `alfworld-download` fetches for them;
    # each game.tw-pddl is self-contained, so upstream's json and pddl archives are not needed.
    # GitHub publishes no digest for it: this sha256 (45,059,629 bytes, asset of 2024-02-29) is
    # one recorded from a download, not checked from this project's build machine.
    "alfworld": [
        Source("json_2.1.1_tw-pddl.zip",
               "https://github.com/alfworld/alfworld/releases/download/0.2.2/json_2.1.1_tw-pddl.zip",
               "d376c4bbb097c068528a2a9805e358e4cd14bc75c4d68a24e5141aebd234ef67"),
    ],
}


def cache_dir() -> Path:
    """The user cache where ``crl data fetch`` puts data and envs keep derived files."""
    return Path(os.environ.get("CRL_CACHE_DIR", Path.home() / ".cache" / "crl"))


def _checkout_shared_data() -> Path:
    # ../shared/data beside a checkout: <checkout>/crl_envs/data.py -> <checkout>/../shared/data
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def candidate_dirs(name: str, path: str | os.PathLike | None = None) -> list[Path]:
    """The places searched for dataset ``name``, in order."""
    if path is not None:
        return [Path(path).expanduser()]
    dirs = []
    if os.environ.get("CRL_DATA_DIR"):
        dirs.append(Path(os.environ["CRL_DATA_DIR"]).expanduser() / name)
    dirs.append(_checkout_shared_data() / name)
    dirs.append(cache_dir() / "data" / name)
    return dirs


def resolve_data(name: str, path: str | os.PathLike | None = None,
                 required: tuple[str, ...] = ()) -> Path:
    """Return the directory holding dataset ``name`` (with every file in ``required``).

    Raises ``DataNotFoundError`` with the places searched and the command that fetches it.
    """
    searched = candidate_dirs(name, path)
    for directory in searched:
        if directory.is_dir() and all((directory / f).exists() for f in required):
            return directory
    where = ", ".join(str(d) for d in searched)
    need = f" with {', '.join(required)}" if required else ""
    raise DataNotFoundError(
        f"Dataset '{name}'{need} not found (searched: {where}). "
        f"Run `crl data fetch {name}`, or set $CRL_DATA_DIR to a folder holding '{name}/', "
        f"or pass the directory explicitly."
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str, dest: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Download dataset ``name`` from its upstream sources into the cache, checking sha256."""
    if name not in SOURCES:
        raise KeyError(f"Unknown dataset '{name}'; known: {', '.join(sorted(SOURCES)) or 'none'}.")
    target = Path(dest) if dest else cache_dir() / "data" / name
    target.mkdir(parents=True, exist_ok=True)
    for source in SOURCES[name]:
        out = target / source.filename
        if out.exists() and not force and (source.sha256 is None or _sha256(out) == source.sha256):
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, delete=False) as tmp:
            try:
                with urllib.request.urlopen(source.url, timeout=60) as response:
                    shutil.copyfileobj(response, tmp)
            except OSError as err:  # URLError, timeouts, resets
                os.unlink(tmp.name)
                raise UserFacingError(
                    f"Could not download {source.url} ({err}). Check the network, or download it by "
                    f"hand to {out}, or point $CRL_DATA_DIR at a folder holding '{name}/'."
                ) from err
        got = _sha256(Path(tmp.name))
        if source.sha256 and got != source.sha256:
            os.unlink(tmp.name)
            raise UserFacingError(
                f"Checksum mismatch for {source.url}: expected {source.sha256}, got {got}. "
                "The upstream file changed or the download was corrupted; try again with --force."
            )
        os.replace(tmp.name, out)  # atomic: a crash never leaves a half file under the real name
    return target


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` tells the Hugging Face libraries to read their caches only."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub (``$HF_ENDPOINT``, default huggingface.co) answers a TCP
    connection within ``timeout`` seconds; False under ``HF_HUB_OFFLINE=1``."""
    import socket
    from urllib.parse import urlparse

    if hub_offline():
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname or "huggingface.co",
                                       url.port or (80 if url.scheme == "http" else 443)),
                                      timeout=timeout):
            return True
    except OSError:
        return False
