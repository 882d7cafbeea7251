"""The toy task's repository is data for the SWE env, not part of this project's test suite."""

collect_ignore_glob = ["repo/*"]
