"""Where an SWE task's repository lives and its commands run: one interface, two sandboxes.

Holds:
- ``base``: ``Sandbox``, the interface the tools and the env use (shell, files, diff, grading
  run); ``CommandResult``, what one shell command produced (bounded output, exit code, timeout
  flag); ``cut_output``, the limits (``OUTPUT_LIMIT``, ``MAX_PATCH_BYTES``), ``CONTAINER_REPO``;
  ``PathOutsideSandboxError``, ``FileTooLargeError``, ``SandboxError``,
  ``UnisolatedSandboxWarning``.
- ``shell``: the persistent shell session, saved and restored around each command.
- ``git``: git run without the agent's configuration; ``init_repo_from_files``.
- ``reaper``: the program each ``LocalSandbox`` command runs under (a child subreaper);
  ``supervised``: a command under it and the pipes it is read through.
- ``files``: ``LocalSandbox``'s file methods, which never follow a symlink.
- ``local``: ``LocalSandbox``, a temporary git checkout on this host. Opt-in: commands run
  unisolated.
- ``containers``: ``docker_client``, ``ensure_image``; ``ContainerLimits``, what its containers
  may use (hardened defaults: no network, memory and process limits); ``sandbox_labels``,
  ``SANDBOX_LABEL`` and ``remove_stale_containers``: the labels that let a later run remove the
  containers of a killed process.
- ``docker``: ``DockerSandbox``, a container of the instance's SWE-bench image, repository at
  ``/testbed``, driven through the docker SDK; graded by swebench's own ``run_instance``.

The sandboxes assume an adversarial agent (an RL policy searching for holes): see
docs/threat-model.md. In short, ``LocalSandbox`` is no security boundary; it only keeps an
honest agent from harming the host by accident and keeps the grading and the tools from being
subverted through files of the checkout (git configuration, symlinks, oversized files).
"""

from crl_envs.swebench.sandbox.base import (
    CONTAINER_REPO,
    MAX_PATCH_BYTES,
    OUTPUT_LIMIT,
    CommandResult,
    FileTooLargeError,
    PathOutsideSandboxError,
    Sandbox,
    SandboxError,
    UnisolatedSandboxWarning,
    cut_output,
)
from crl_envs.swebench.sandbox.containers import (
    SANDBOX_LABEL,
    ContainerLimits,
    docker_client,
    ensure_image,
    remove_stale_containers,
    sandbox_labels,
)
from crl_envs.swebench.sandbox.docker import DockerSandbox
from crl_envs.swebench.sandbox.git import init_repo_from_files
from crl_envs.swebench.sandbox.local import LocalSandbox

__all__ = [
    "CommandResult",
    "Sandbox",
    "LocalSandbox",
    "DockerSandbox",
    "ContainerLimits",
    "SANDBOX_LABEL",
    "docker_client",
    "ensure_image",
    "remove_stale_containers",
    "sandbox_labels",
    "init_repo_from_files",
    "SandboxError",
    "PathOutsideSandboxError",
    "FileTooLargeError",
    "UnisolatedSandboxWarning",
    "OUTPUT_LIMIT",
    "MAX_PATCH_BYTES",
    "CONTAINER_REPO",
    "cut_output",
]
