"""Docker images for SWE tasks built offline: the toy task's image, without any registry.

Holds:
- ``TOY_IMAGE``: the toy task's image (its row's ``image`` field), ``BASE_IMAGE``: the Debian
  base it is built on.
- ``build_rootfs``: a minimal Debian root file system (python3, pytest, git, patch) made by
  ``debootstrap`` from the apt mirror this machine already uses.
- ``import_base_image``: that tree as an image, through ``docker import``.
- ``build_toy_image``: the base finished with the toy repository at ``/testbed``.
- ``ensure_toy_image``: all of the above, each step skipped when its result is there.
- ``ImageBuildError``.

Nothing here talks to a registry: the packages come from the Debian mirror (as ``apt-get``
does), the image is assembled by the local daemon. Real SWE-bench instance images are
``swebench/sweb.eval.x86_64.*`` on Docker Hub, pulled or built by swebench (docs/swebench.md).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crl_envs.errors import UserFacingError

__all__ = ["BASE_IMAGE", "TOY_IMAGE", "DEBIAN_SUITE", "BASE_PACKAGES", "ImageBuildError",
           "build_rootfs", "import_base_image", "build_toy_image", "ensure_toy_image",
           "apt_mirror", "default_rootfs_dir"]

DEBIAN_SUITE = "bookworm"
# What the toy's eval script and swebench's patch application call: python (-m pytest), git,
# patch (the last fallback of swebench's apply commands).
BASE_PACKAGES = ("python3", "python3-pytest", "git", "patch")
# Local names only (the `crl-gym/` namespace is on no registry, so nothing tries to pull it);
# the toy's follows swebench's `sweb.eval.x86_64.<id with __ as _1776_>` scheme.
BASE_IMAGE = f"crl-gym/swe-base:{DEBIAN_SUITE}"
TOY_IMAGE = "crl-gym/sweb.eval.x86_64.crl-gym_1776_toy-intervals-1:latest"
_DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Marks a finished root file system: an interrupted debootstrap leaves a tree without it.
_ROOTFS_DONE = ".crl-rootfs-complete"


class ImageBuildError(UserFacingError, RuntimeError):
    """An offline image could not be built; the message says what is missing."""


def apt_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt uses here (``URIs:`` of a deb822 file or a ``deb`` line), so
    debootstrap reaches the same one; ``http://deb.debian.org/debian`` when none is found."""
    files = sorted(sources.glob("sources.list.d/*.sources")) + \
        [sources / "sources.list", *sorted(sources.glob("sources.list.d/*.list"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        for url in re.findall(r"^(?:URIs:|deb)\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.MULTILINE):
            if url.rstrip("/").endswith("/debian"):  # not debian-security or a third party
                return url
    return _DEFAULT_MIRROR


def default_rootfs_dir() -> Path:
    """Where ``build_rootfs`` keeps the tree between builds: the crl cache."""
    from crl_envs.data import cache_dir

    return cache_dir() / "swe-rootfs" / DEBIAN_SUITE


def _run(argv: list[str], what: str, timeout: float) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError as err:
        raise ImageBuildError(f"{what} needs `{argv[0]}` (apt-get install -y {argv[0]}).") from err
    except subprocess.TimeoutExpired as err:
        raise ImageBuildError(f"{what} took over {timeout:.0f} s; stopped.") from err
    if done.returncode != 0:
        raise ImageBuildError(f"{what} failed ({done.returncode}): "
                              f"{(done.stderr or done.stdout)[-2000:]}")


def build_rootfs(dest: Path, mirror: str | None = None, timeout: float = 1200) -> Path:
    """A minimal Debian root file system with ``BASE_PACKAGES`` at ``dest`` (needs root and
    ``debootstrap``); kept and reused when a finished one is already there."""
    if (dest / _ROOTFS_DONE).exists():
        return dest
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root: run `crl swe build-image` as root, or "
                              "pass --rootfs a finished Debian tree.")
    shutil.rmtree(dest, ignore_errors=True)  # an interrupted earlier attempt
    dest.parent.mkdir(parents=True, exist_ok=True)
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
          DEBIAN_SUITE, str(dest), mirror or apt_mirror()], "debootstrap", timeout)
    # The eval scripts say `python`; Debian names it python3.
    (dest / "usr/bin/python").unlink(missing_ok=True)
    (dest / "usr/bin/python").symlink_to("python3")
    # Downloaded .debs and package lists are not needed in the image (about 100 MB).
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (dest / cache).glob("*"):
            if entry.is_file():
                entry.unlink()
    (dest / _ROOTFS_DONE).touch()
    return dest


def _image_exists(client: Any, name: str) -> bool:
    try:
        client.images.get(name)
    except Exception:  # docker.errors.ImageNotFound
        return False
    return True


def import_base_image(rootfs: Path, tag: str = BASE_IMAGE, timeout: float = 600) -> None:
    """``tar -C rootfs -c . | docker import - tag``: the tree as a one-layer image."""
    if not (rootfs / "usr/bin/python3").exists():
        raise ImageBuildError(f"{rootfs} is no Debian tree with python3 (build it with "
                              "debootstrap, see docs/swebench.md).")
    if shutil.which("docker") is None:
        raise ImageBuildError("`docker import` needs the docker CLI (apt-get install -y docker.io).")
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--exclude", f"./{_ROOTFS_DONE}", "-c", "."],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        done = subprocess.run(["docker", "import", "--change", "CMD [\"bash\"]", "-", tag],
                              stdin=tar.stdout, capture_output=True, text=True, timeout=timeout)
    finally:
        tar.stdout.close()
        tar.wait()
    if done.returncode != 0 or tar.returncode != 0:
        raise ImageBuildError(f"docker import of {rootfs} failed: {done.stderr[-2000:]}")


def _toy_context(toy_dir: Path, base: str, base_commit: str) -> bytes:
    """The build context of the toy image: a Dockerfile and the toy repository as a git
    checkout whose single commit is the task's ``base_commit`` (fixed author and dates)."""
    from crl_envs.swebench.sandbox import init_repo_from_files

    with tempfile.TemporaryDirectory(prefix="crl-toy-image-") as tmp:
        head = init_repo_from_files(toy_dir / "repo", Path(tmp) / "testbed")
        if head != base_commit:
            raise ImageBuildError(f"The toy repository commits as {head}, not the task's "
                                  f"base_commit {base_commit}: its files changed.")
        dockerfile = (f"FROM {base}\nCOPY testbed /testbed\nWORKDIR /testbed\n"
                      'CMD ["bash"]\n').encode()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile)
            tar.addfile(info, io.BytesIO(dockerfile))
            tar.add(Path(tmp) / "testbed", arcname="testbed")
        return buffer.getvalue()


def build_toy_image(client: Any, base: str = BASE_IMAGE, tag: str = TOY_IMAGE) -> str:
    """The toy image: ``base`` with the toy repository at ``/testbed``. Returns its id."""
    from crl_envs.swebench.data import TOY_DIR, load_instances

    (row,) = load_instances("toy")
    context = _toy_context(TOY_DIR, base, row["base_commit"])
    try:
        # No RUN step: nothing starts a container, nothing needs a network.
        image, _ = client.images.build(fileobj=io.BytesIO(context), custom_context=True,
                                       tag=tag, pull=False, rm=True, forcerm=True)
    except Exception as err:  # docker.errors.BuildError, APIError
        raise ImageBuildError(f"Building {tag} from {base} failed: {err}") from err
    return image.id


def ensure_toy_image(client: Any, rootfs: Path | None = None, mirror: str | None = None,
                     rebuild: bool = False, log: Callable[[str], None] = print) -> str:
    """Build whatever of rootfs -> ``BASE_IMAGE`` -> ``TOY_IMAGE`` is missing (all of it with
    ``rebuild``); returns ``TOY_IMAGE``."""
    if not rebuild and _image_exists(client, TOY_IMAGE):
        log(f"{TOY_IMAGE} is there already (--rebuild to build it again).")
        return TOY_IMAGE
    if rebuild or not _image_exists(client, BASE_IMAGE):
        tree = rootfs or default_rootfs_dir()
        if rootfs is None:
            log(f"Debian {DEBIAN_SUITE} root file system in {tree} (debootstrap from "
                f"{mirror or apt_mirror()}; reused when there)...")
            build_rootfs(tree, mirror)
        log(f"docker import {tree} as {BASE_IMAGE}...")
        import_base_image(tree)
    log(f"Finishing {TOY_IMAGE} (the toy repository at /testbed)...")
    build_toy_image(client)
    return TOY_IMAGE
