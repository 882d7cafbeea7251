"""The Docker side of ``DockerSandbox``: the client, the containers' limits, labels and init.

Holds:
- ``docker_client``: a docker SDK client for the local daemon, or a ``SandboxError`` saying
  what is missing; ``ensure_image``: an image is local, or pulled.
- ``ContainerLimits``: what its containers may use (hardened defaults: no network, memory and
  process limits).
- ``sandbox_labels``, ``SANDBOX_LABEL`` and ``remove_stale_containers``: the labels that let a
  later run remove the containers of a killed process.
- ``_HardenedClient``: the client swebench's grading gets, whose containers are hardened too;
  the containers' init (``_CONTAINER_INIT``) and the kill of all its other processes
  (``_KILL_ALL_BUT_INIT``).
"""

from __future__ import annotations

import os
import socket
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from crl_envs.swebench.sandbox.base import SandboxError

__all__ = [
    "ContainerLimits",
    "SANDBOX_LABEL",
    "docker_client",
    "ensure_image",
    "remove_stale_containers",
    "sandbox_labels",
]


def docker_client() -> Any:
    """A docker SDK client for the local daemon, or ``SandboxError`` saying what is missing."""
    try:
        import docker
    except ImportError as err:
        raise SandboxError(
            "DockerSandbox needs the docker SDK: pip install 'crl-gym[swebench]'."
        ) from err
    try:
        client = docker.from_env(timeout=1800)
        client.ping()
    except Exception as err:  # the SDK raises several types for "no daemon"
        raise SandboxError(
            "DockerSandbox needs a running Docker daemon (none answered at $DOCKER_HOST or the "
            f"default socket: {err}). Start Docker, or use sandbox='local' for trusted tasks."
        ) from err
    return client


def _remove_container(container: Any) -> None:
    try:
        container.remove(force=True)
    except Exception as err:  # already gone, or the daemon went away
        warnings.warn(f"Could not remove container {container.id}: {err}", stacklevel=2)


@dataclass(frozen=True)
class ContainerLimits:
    """What a ``DockerSandbox`` container (the agent's and the grading one) may use.

    The defaults are the hardened ones: no network, 4 GB of memory and no swap beyond it,
    1024 processes, no privilege gain through setuid binaries.

    >>> ContainerLimits().run_kwargs()["network_mode"], ContainerLimits(network=True).run_kwargs()["network_mode"]
    ('none', 'bridge')
    """

    memory: str = "4g"
    """memory limit (docker's units); swap is limited to the same, so no swap is added"""
    pids: int = 1024
    """most processes and threads at once: a fork bomb stops there"""
    network: bool = False
    """False: the container has only a loopback interface"""
    cpus: float | None = None
    """CPU cores the container may use (None: no limit)"""

    def run_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the docker SDK's ``containers.run``/``create``."""
        kwargs: dict[str, Any] = {
            "network_mode": "bridge" if self.network else "none",
            "mem_limit": self.memory, "memswap_limit": self.memory, "pids_limit": self.pids,
            "security_opt": ["no-new-privileges"],
        }
        if self.cpus is not None:
            kwargs["nano_cpus"] = int(self.cpus * 1e9)
        return kwargs


# Every container a DockerSandbox starts carries SANDBOX_LABEL and the owner label (host, pid,
# process start time), so a later run can find the containers of a process killed with -9 and
# remove them, and leave alone those of processes still running (here or on another host).
SANDBOX_LABEL = "crl-gym.sandbox"
_OWNER_LABEL = "crl-gym.owner"
_swept_stale = threading.Event()


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (``None``: no such process):
    with the pid, it names a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


def _owner_gone(owner: str) -> bool:
    """Whether the process that started a container has ended (only said of this host's)."""
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return _process_start(int(pid)) != start


def sandbox_labels() -> dict[str, str]:
    """The labels of this process's sandbox containers."""
    return {SANDBOX_LABEL: "1", _OWNER_LABEL: _owner()}


def remove_stale_containers(client: Any) -> list[str]:
    """Remove the sandbox containers whose process has ended without removing them (killed
    with -9, say); returns their names. Containers of running processes are kept."""
    removed = []
    try:
        containers = client.containers.list(all=True, filters={"label": SANDBOX_LABEL})
    except Exception:  # the daemon went away, or a client double without listing
        return removed
    for container in containers:
        if _owner_gone(container.labels.get(_OWNER_LABEL, "")):
            try:
                container.remove(force=True)
                removed.append(container.name)
            except Exception:  # removed meanwhile by another run
                pass
    return removed


class _HardenedContainers:
    """``client.containers`` as swebench's ``run_instance`` sees it: the grading container it
    creates gets the sandbox's limits and labels instead of the extra capability swebench adds
    (``SYS_ADMIN``), and the sandbox's init, which ends on SIGTERM, so swebench's
    ``docker stop`` returns at once instead of after its 15 s grace period."""

    def __init__(self, containers: Any, limits: ContainerLimits) -> None:
        self._containers, self._limits = containers, limits

    def create(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("cap_add", None)
        kwargs.update(self._limits.run_kwargs(), labels=sandbox_labels(), command=_CONTAINER_INIT)
        return self._containers.create(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._containers, name)


class _HardenedClient:
    """A docker client whose new containers are hardened (``_HardenedContainers``)."""

    def __init__(self, client: Any, limits: ContainerLimits) -> None:
        self.client, self.containers = client, _HardenedContainers(client.containers, limits)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


# The container's init (see DockerSandbox.__init__): bash, which reaps every orphan (so no
# zombie keeps a process slot, or looks alive to `kill -0`), ends on SIGTERM (so `docker stop`
# returns at once) and starts its `tail` again when a kill took it. Its last argument marks
# it as ours: the kill below checks it first, so that it can never act outside our container.
_INIT_MARK = "crl-sandbox-init"
_CONTAINER_INIT = ["bash", "-c", "trap 'exit 0' TERM; while :; do tail -f /dev/null & wait $!; done",
                   _INIT_MARK]
# Ends every process of the container but its init (the kill's own shell is spared by -1).
_KILL_ALL_BUT_INIT = ["bash", "-c", "[ \"$(tr '\\0' '\\n' < /proc/1/cmdline | tail -n 1)\" = "
                      f"{_INIT_MARK} ] && kill -KILL -1"]


def ensure_image(client: Any, image: str, instance_id: str) -> None:
    """``image`` is local, or pulled; else ``SandboxError`` saying how to get it. Images of
    the ``crl-gym/`` namespace are built here, offline, never pulled."""
    try:
        client.images.get(image)
        return
    except Exception as missing:
        if image.startswith("crl-gym/"):
            raise SandboxError(
                f"Docker image {image} for {instance_id} is not on this machine; it is built "
                "offline: run `crl swe build-image toy` (as root; README, SWE-bench with Docker)."
            ) from missing
    try:
        client.images.pull(image)
    except Exception as err:
        raise SandboxError(
            f"Docker image {image} for {instance_id} is not on this machine and could not be "
            f"pulled ({err}). With network: `docker pull {image}`, or build it with "
            f"`python -m swebench.harness.prepare_images --instance_ids {instance_id}`."
        ) from err
