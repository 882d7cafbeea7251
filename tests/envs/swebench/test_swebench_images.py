"""The pieces of issue 14 that need no daemon: the mirror debootstrap uses, the container
limits, the grading client's hardening, the sweep of containers left by killed processes."""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import socket
import subprocess
import sys

import crl_envs.swebench.images as images
import crl_envs.swebench.sandbox as sandbox
from crl_envs.swebench.sandbox import (
    SANDBOX_LABEL,
    ContainerLimits,
    remove_stale_containers,
    sandbox_labels,
)
from crl_envs.swebench.sandbox.containers import _CONTAINER_INIT, _HardenedClient


def test_doctests_of_the_sandbox_and_images_modules():
    # doctest finds only what a module defines itself: each module of the sandbox package
    modules = [importlib.import_module(f"{sandbox.__name__}.{info.name}")
               for info in pkgutil.iter_modules(sandbox.__path__)]
    results = [doctest.testmod(module) for module in modules]
    assert all(result.failed == 0 for result in results)
    assert sum(result.attempted for result in results) > 0
    assert doctest.testmod(images).failed == 0


def test_apt_mirror_is_read_from_deb822_and_list_files(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert images.apt_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://other.example/debian bookworm main\n")
    assert images.apt_mirror(tmp_path) == "http://other.example/debian"
    (tmp_path / "sources.list").write_text("# nothing\n")
    assert images.apt_mirror(tmp_path) == "http://deb.debian.org/debian"


def test_hardening_limits_go_to_the_grading_container_too():
    created = []

    class Containers:
        def create(self, **kwargs):
            created.append(kwargs)

        def get(self, name):
            return name

    class Client:
        containers = Containers()
        api = "the api"

    hardened = _HardenedClient(Client(), ContainerLimits(memory="1g", pids=64, cpus=0.5))
    hardened.containers.create(image="i", command="tail -f /dev/null", cap_add=["SYS_ADMIN"])
    (sent,) = created
    assert "cap_add" not in sent and sent["command"] == _CONTAINER_INIT
    assert sent["network_mode"] == "none" and sent["mem_limit"] == sent["memswap_limit"] == "1g"
    assert sent["pids_limit"] == 64 and sent["nano_cpus"] == 500_000_000
    assert sent["labels"][SANDBOX_LABEL] == "1"
    assert hardened.api == "the api" and hardened.containers.get("x") == "x"  # the rest as is


def test_hardening_sweep_removes_only_containers_of_ended_processes():
    class Container:
        def __init__(self, name, owner):
            self.name, self.labels, self.removed = name, {"crl-gym.owner": owner}, False

        def remove(self, force=False):
            self.removed = force

    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()
    host = socket.gethostname()
    boxes = [Container("mine", sandbox_labels()["crl-gym.owner"]),
             Container("ended", f"{host}:{ended.pid}:1"),
             Container("elsewhere", f"another-host:{os.getpid()}:1"),
             Container("recycled pid", f"{host}:{os.getpid()}:0")]

    class Client:
        class containers:  # noqa: N801  (the SDK's attribute name)
            @staticmethod
            def list(all=False, filters=None):
                assert all and filters == {"label": SANDBOX_LABEL}
                return boxes

    assert remove_stale_containers(Client()) == ["ended", "recycled pid"]
    assert [box.removed for box in boxes] == [False, True, False, True]
