"""The persistent shell session both sandboxes run commands in.

Holds the bash text of the session protocol: ``_SAVER`` (writes the session to fd 3, ending
with ``_STATE_END``) and ``_SHELL_WRAPPER`` (restores a session, runs one command, saves the
session again); ``_STATE_LIMIT``, the largest session kept.

The shell is persistent in the sense of SWE-agent: the working directory, shell and exported
variables, functions and aliases carry over from one command to the next. Each command runs as
a fresh ``bash`` that first restores that state and saves it on exit, so a timeout can kill
everything the command started without losing the session. The state travels through pipes
and lives in this process, where the agent's commands cannot delete or rewrite it.
"""

from __future__ import annotations

import shlex

__all__: list[str] = []  # the protocol is the sandboxes' own: every name here is private

# Writes the session (shell and exported variables, functions, aliases, cwd) to fd 3, ending
# with _STATE_END. It runs after the command and on `exit`, in the command's own shell, so it
# first removes functions the command may have defined over the builtins it uses: in POSIX mode
# (entered by an assignment, which no function can intercept) `unset` is found before functions.
# Bash's own dynamic and read-only variables are not saved.
_STATE_END = "# crl-state-end"
_SAVER = r"""POSIXLY_CORRECT=y
unset -f builtin command declare alias compgen printf set shopt trap exit eval
unset POSIXLY_CORRECT
{
  for __crl_v in $(builtin compgen -v); do
    case $__crl_v in
      __crl_*|BASH|BASH[_O]*|BASHPID|COMP_*|DIRSTACK|EPOCH*|EUID|FUNCNAME|GROUPS|HISTCMD|\
      LINENO|OPTIND|PIPESTATUS|POSIXLY_CORRECT|PPID|PWD|RANDOM|SECONDS|SHELLOPTS|SHLVL|\
      SRANDOM|UID|_) ;;
      *) builtin declare -p "$__crl_v" ;;
    esac
  done
  builtin declare -f; builtin alias -p
  builtin printf 'builtin cd -- %q\n' "$PWD"
  builtin printf '%s\n' '""" + _STATE_END + r"""'
} >&3 2>/dev/null"""

# Restores the session read from stdin, runs the command with stdin closed (an interactive
# program must not wait for input that never comes) and without fd 3, then saves the session,
# on `exit N` too; the exit status stays the command's. An EXIT trap the command sets is
# dropped, as a persistent shell would run it only when the session ends.
_SHELL_WRAPPER = rf"""
__crl_cmd=$1; set --
__crl_env=$(< /dev/stdin); exec < /dev/null
shopt -s expand_aliases
if [ -n "$__crl_env" ]; then
  unset $(compgen -e) 2>/dev/null  # the saved session's environment, not the inherited one
  eval "$__crl_env" 2>/dev/null
fi
unset __crl_env
trap {shlex.quote(_SAVER)} EXIT
eval "$__crl_cmd" 3>&-
__crl_rc=$?
{_SAVER}
trap - EXIT
exit $__crl_rc
"""
# A saved session larger than this is not kept (the previous one is): it is held in memory.
_STATE_LIMIT = 8_000_000
