"""The file methods of a sandbox whose repository is a directory on this host.

Holds ``_CheckoutFiles``, the ``Sandbox`` file methods of ``LocalSandbox``: paths inside the
checkout are resolved one component at a time without following a symlink (``O_NOFOLLOW``
under a directory descriptor), so a link swapped in after a check cannot lead out; files are
replaced by renaming, never written through.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from pathlib import Path

from crl_envs.swebench.sandbox.base import FileTooLargeError, PathOutsideSandboxError, Sandbox

__all__: list[str] = []  # the local sandbox's own: every name here is private


class _CheckoutFiles(Sandbox):
    """``check_path``, ``read_file``, ``write_file``, ``remove_file``, ``path_kind`` and
    ``list_dir`` on the directory ``_checkout`` (the agent's ``repo_dir``), never following a
    symlink; the subclass sets both."""

    _checkout: Path

    # -- files
    def check_path(self, path: str) -> str:
        if not os.path.isabs(path):
            raise PathOutsideSandboxError(f"The path {path!r} is not absolute.")
        real = os.path.realpath(path)
        if os.path.commonpath([real, str(self._checkout)]) != str(self._checkout):
            raise PathOutsideSandboxError(
                f"The path {path} resolves to {real}, outside the repository {self.repo_dir}; "
                "the editor only touches files inside it."
            )
        return real

    def _parts(self, path: str) -> list[str]:
        """The components of ``path`` below the checkout, from its text alone (no lookup)."""
        normal = os.path.normpath(path)
        if not os.path.isabs(path) or os.path.commonpath([normal, str(self._checkout)]) \
                != str(self._checkout):
            raise PathOutsideSandboxError(
                f"The path {path} is outside the repository {self.repo_dir}; the editor only "
                "touches files inside it.")
        return [part for part in os.path.relpath(normal, self._checkout).split(os.sep)
                if part != "."]

    def _open_parent(self, path: str, create: bool = False) -> tuple[int, str]:
        """A descriptor of the directory holding ``path`` and the last component's name, reached
        from the checkout one component at a time without following a symlink (``O_NOFOLLOW``):
        a link swapped in at any moment makes the open fail rather than lead out."""
        parts = self._parts(path)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self._checkout, flags)
        try:
            for part in parts[:-1]:
                try:
                    next_fd = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, dir_fd=fd)
                    next_fd = os.open(part, flags, dir_fd=fd)
                except OSError as err:
                    if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise self._link_error(path, err) from err
                    raise FileNotFoundError(errno.ENOENT, "a component is a file", path) from err
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        return fd, (parts[-1] if parts else ".")

    def _link_error(self, path: str, err: BaseException) -> BaseException:
        if isinstance(err, OSError) and err.errno in (errno.ELOOP, errno.ENOTDIR):  # a link
            return PathOutsideSandboxError(
                f"The path {path} passes through a symbolic link; the editor does not follow "
                "links. Edit the file the link points to.")
        return err

    def _lstat(self, path: str) -> os.stat_result | None:
        try:
            parent, name = self._open_parent(path)
        except FileNotFoundError:
            return None
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(parent)

    def read_file(self, path: str, max_bytes: int | None = None) -> str:
        parent, name = self._open_parent(path)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=parent)
        except OSError as err:
            raise self._link_error(path, err) from err
        finally:
            os.close(parent)
        with open(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise OSError(f"{path} is not a regular file")
            if max_bytes is not None and info.st_size > max_bytes:
                raise FileTooLargeError(path, info.st_size, max_bytes)
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:  # it grew while we read
            raise FileTooLargeError(path, len(data), max_bytes)
        # surrogateescape: bytes that are not UTF-8 survive a read and write unchanged
        return data.decode("utf-8", errors="surrogateescape")

    def write_file(self, path: str, text: str) -> None:
        data = text.encode("utf-8", errors="surrogateescape")
        parent, name = self._open_parent(path, create=True)
        tmp = f".{name}.crl-{uuid.uuid4().hex[:8]}"
        try:
            try:
                old = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None and not stat.S_ISREG(old.st_mode):
                raise self._link_error(path, OSError(errno.ELOOP, "a symbolic link")) \
                    if stat.S_ISLNK(old.st_mode) else OSError(f"{path} is not a regular file")
            mode = stat.S_IMODE(old.st_mode) if old is not None else 0o644  # scripts stay executable
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         mode, dir_fd=parent)
            try:
                with open(fd, "wb") as handle:
                    os.fchmod(handle.fileno(), mode)  # exact, whatever the umask
                    handle.write(data)
                # replace() swaps directory entries: a link put at `name` meanwhile is replaced,
                # never written through
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=parent)
                except FileNotFoundError:
                    pass
                raise
        finally:
            os.close(parent)

    def remove_file(self, path: str) -> None:
        parent, name = self._open_parent(path)
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        finally:
            os.close(parent)

    def path_kind(self, path: str) -> str | None:
        self.check_path(path)
        found = self._lstat(path)
        if found is None:
            return None
        if stat.S_ISLNK(found.st_mode):
            raise self._link_error(path, OSError(errno.ELOOP, "a symbolic link"))
        return "dir" if stat.S_ISDIR(found.st_mode) else "file" if stat.S_ISREG(found.st_mode) \
            else None

    def list_dir(self, path: str, depth: int = 2) -> list[str]:
        parent, name = self._open_parent(path)
        try:
            root = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=parent)
        except OSError as err:
            raise self._link_error(path, err) from err
        finally:
            os.close(parent)
        found = []
        try:
            for current, dirs, files, _ in os.fwalk(".", dir_fd=root):
                level = len(Path(current).parts)
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                if level >= depth:
                    dirs[:] = []
                for entry in dirs + sorted(f for f in files if not f.startswith(".")):
                    found.append(os.path.normpath(os.path.join(path, current, entry)))
        finally:
            os.close(root)
        return sorted(found)
