"""The program each ``LocalSandbox`` command runs under (``supervised``):
``python -I -S reaper.py STATUS_FD STATE_FD ARGV...``.

Holds ``main`` (the program) and what it is made of: ``descendants``, ``reap``, ``kill_all``.

Runs each LocalSandbox command: it becomes the child subreaper of everything the command
starts, so processes that leave the command's process group or session (setsid, a double
fork) are re-parented to it rather than to init and stay findable. It reports the command's
exit status on a pipe, then stays until its last descendant is gone; on SIGTERM it kills its
whole subtree. So a timeout or close() ends every process of the command, and only those.

It runs isolated (``-I -S``): standard library only, nothing of this package is imported.
STATUS_FD is the write end of the status pipe; STATE_FD the shell-state pipe's (``-1``: none),
which the command gets as its fd 3.
"""

import os
import signal
import sys

__all__ = ["descendants", "kill_all", "main", "reap"]


def descendants():
    children = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: only the process group can be reached (below)
        return []
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    parent = int(handle.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, frontier = [], [os.getpid()]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found


def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def kill_all(*_):
    for _ in range(200):
        pids = descendants()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
    os.killpg(0, signal.SIGKILL)  # and what is left of the command's group, this process too


def main():
    status_fd, state_fd, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    try:
        import ctypes
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass

    signal.signal(signal.SIGTERM, kill_all)
    child = os.fork()
    if child == 0:
        try:
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it; the command must not
            if state_fd >= 0:
                os.dup2(state_fd, 3)
            for fd in {status_fd, state_fd} - {-1, 3}:
                os.close(fd)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    if state_fd >= 0:
        os.close(state_fd)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == child:
            os.write(status_fd, str(os.waitstatus_to_exitcode(status)).encode())
            os.close(status_fd)


if __name__ == "__main__":
    main()
