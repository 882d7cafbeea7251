"""Device correctness: no dependency takes accelerator memory, every tensor the harness makes
lands on the model's device, and the checks that need a CUDA device (``gpu`` marker).

The ``gpu`` tests are parametrised over ``cpu`` and ``cuda``: the CPU case runs everywhere (so
the test itself is exercised), the CUDA case only where torch sees a device (see conftest).
"""

from __future__ import annotations

import ast
import copy
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_harness.config import LoRAConfig, load_config  # noqa: E402
from crl_harness.models.base import BackendUnavailableError  # noqa: E402
from crl_harness.models.hf import HFBackend  # noqa: E402
from crl_harness.models.tiny import build_tiny_model  # noqa: E402
from crl_harness.training.learner import PolicyLearner, TrainingRow  # noqa: E402
from crl_harness.training.losses import LossTerms, grpo_loss  # noqa: E402

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
CHATS = [[{"role": "user", "content": "go"}],
         [{"role": "system", "content": "You play a grid game."},
          {"role": "user", "content": "A wall is to the north. The goal is east. What now?"}]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


# ---------------------------------------------------------------------------- JAX stays away
FAKE_JAX = {
    "__init__.py": "import os\nopen(os.environ['FAKE_JAX_LOG'], 'a').write('import jax\\n')\n",
    "lax.py": "import os\n\ndef top_k(*args, **kwargs):\n"
              "    open(os.environ['FAKE_JAX_LOG'], 'a').write('jax.lax.top_k\\n')\n"
              "    raise RuntimeError('fake JAX: a GPU client would start here')\n",
}

RETRIEVE = textwrap.dedent("""
    import sys
    import crl_harness.cli, crl_harness.training.trainer, crl_harness.models.hf  # everything a run imports
    from crl_harness.experience import ExperienceBank, ExperienceManager
    from crl_harness.experience.retrieval import BM25Index

    index = BM25Index.from_texts(["a", "b"], ["push boxes onto targets", "keys open doors"])
    assert index.search("which key opens the door", 2)[0][0] == "b"
    with ExperienceBank(sys.argv[1]) as bank:
        bank.add("CRL/Sokoban-v0", "Corners", "Never push a box into a corner.")
        manager = ExperienceManager(bank)
        assert manager.retrieve("CRL/Sokoban-v0", "box in a corner", 1)
    print("jax modules after retrieval:", sorted(m for m in sys.modules if m.split(".")[0] == "jax"))
    import jax  # the user's own import still works afterwards (the fake here)
""")


def test_bm25_retrieval_never_imports_jax(tmp_path):
    """bm25s imports JAX (and runs a top-k on it, starting a GPU client) when it can: a fake
    ``jax`` first on the path records any import; importing the harness and retrieving must leave
    it alone."""
    fake = tmp_path / "site" / "jax"
    fake.mkdir(parents=True)
    for name, text in FAKE_JAX.items():
        (fake / name).write_text(text)
    log = tmp_path / "jax.log"
    env = {**os.environ, "FAKE_JAX_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", RETRIEVE, str(tmp_path / "bank.sqlite")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "jax modules after retrieval: []" in done.stdout
    # the only import is the script's own, after retrieval: the fake was reachable all along
    assert log.read_text() == "import jax\n"


# ---------------------------------------------------------------------------- tensors' devices
CONSTRUCTORS = {"tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange",
                "rand", "randn", "randint", "randperm", "eye", "linspace", "logspace"}
"""torch functions that make a new tensor on the default (CPU) device unless given ``device=``
(``*_like`` and ``Tensor.new_*`` follow their argument's device)."""

HOST_SIDE = {
    ("crl_harness/training/losses.py", "subgroup_advantages"):
        "rewards are Python floats; the trainer reads the advantages back as floats",
    ("crl_harness/training/losses.py", "extractor_advantages"): "as subgroup_advantages",
    ("crl_harness/training/batches.py", "actor_rows"):
        "token counts for the per-token weights, read back as floats into TrainingRow",
    ("crl_harness/training/trainer.py", "Trainer._update_extractor"): "as actor_rows (training/batches.py)",
    ("crl_harness/training/learner.py", "PolicyLearner.token_logprobs"):
        "the mask and the targets built on the host row by row, then one .to(self.device) each",
    ("crl_harness/models/hf_generation.py", "decode_batch"):
        "padded on the host element by element, then one .to(backend.device) each",
    ("crl_harness/models/hf_generation.py", "decode_batch.store_row"):
        "column indices joined to decode_batch's host-side ones, then one .to(backend.device)",
    ("crl_harness/models/hf.py", "HFBackend.generate_from_ids"):
        "a seed drawn from the CPU random stream, used as an int",
}
"""Functions allowed to build tensors without ``device=``, and why they stay correct."""


def _constructor_calls(path: Path) -> list[tuple[str, str, int]]:
    """(enclosing function's qualified name, constructor, line) of each ``torch.X(...)`` call
    with ``X`` in CONSTRUCTORS and no ``device=`` keyword."""
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*scope, child.name])
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and isinstance(child.func.value, ast.Name) and child.func.value.id == "torch"
                    and child.func.attr in CONSTRUCTORS
                    and not any(k.arg == "device" for k in child.keywords)):
                found.append((".".join(scope), child.func.attr, child.lineno))
            visit(child, scope)

    visit(ast.parse(path.read_text()), [])
    return found


def test_tensor_constructors_in_crl_harness_name_their_device():
    """A tensor made without ``device=`` is on the CPU: on a GPU it meets the model's tensors and
    fails ("Expected all tensors to be on the same device"), so only the listed host-side
    functions may make one."""
    seen, stray = set(), []
    for path in sorted((ROOT / "crl_harness").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for function, constructor, line in _constructor_calls(path):
            if (relative, function) in HOST_SIDE:
                seen.add((relative, function))
            else:
                stray.append(f"{relative}:{line} torch.{constructor} in {function or 'module'}")
    assert not stray, "pass device= (the model's), or list the function in HOST_SIDE: " + \
        "; ".join(stray)
    assert seen == set(HOST_SIDE), f"stale HOST_SIDE entries: {set(HOST_SIDE) - seen}"


class _DeviceCheckingDecoder(torch.nn.Module):
    """The decoder of ``_DeviceCheckingLM``: refuses an input that is not on its own device."""

    def __init__(self, vocab: int, device: str) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, vocab, device=device)

    def forward(self, *, input_ids, use_cache, past_key_values=None):
        device = self.embed.weight.device
        assert input_ids.device == device, f"input_ids is on {input_ids.device}, the model on {device}"
        return type("Output", (), {"last_hidden_state": self.embed(input_ids),
                                   "past_key_values": past_key_values})()


class _DeviceCheckingLM(torch.nn.Module):
    """A causal LM stub on any device (``meta`` here: no data, no CPU fallback) whose decoder
    refuses an input that is not on its own device; its head is the identity."""

    def __init__(self, vocab: int = 11, device: str = "meta") -> None:
        super().__init__()
        from transformers import PretrainedConfig

        self.decoder = _DeviceCheckingDecoder(vocab, device)
        self.head = torch.nn.Identity()
        self.config = PretrainedConfig()

    def get_decoder(self) -> torch.nn.Module:
        return self.decoder

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


@pytest.mark.parametrize("packed", [False, True])
def test_learner_log_probs_are_built_on_the_models_device(packed):
    learner = PolicyLearner(_DeviceCheckingLM(), lr=1e-3, max_grad_norm=1.0, temperature=1.0,
                            micro_batch_size=2)
    rows = [TrainingRow([1, 2, 3], [4, 5], [-1.0, -1.0], 1.0, 0.5),
            TrainingRow([1, 2], [4, 5, 6], [-1.0, -1.0, -1.0], -1.0, 0.5,
                        [1, 0, 1] if packed else None)]
    logprobs, mask = learner.token_logprobs(rows)
    assert logprobs.device.type == mask.device.type == "meta"
    assert logprobs.shape == mask.shape == (2, 3)


def test_hardening_cuda_asked_for_where_none_is(tiny, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailableError, match="device='cuda' was asked for.*CUDA build"):
        HFBackend(tiny, device="cuda")
    backend = HFBackend(tiny)  # "auto" falls back to the CPU, in fp32
    assert backend.device == "cpu" and backend.model.dtype == torch.float32


# ---------------------------------------------------------------------------- on each device
def _teacher_forced(model, generation) -> list[float]:
    """Log-probs of the generated tokens from one full forward pass of ``model``, in fp32."""
    device = next(model.parameters()).device
    ids = torch.tensor([generation.prompt_token_ids + generation.token_ids], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(generation.prompt_token_ids) - 1:-1].float()
    targets = torch.tensor(generation.token_ids, device=device)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0].tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_generation_logprobs_match_an_fp32_recomputation(tiny, device):
    """fp32: the sampled tokens' log-probs are exact; bf16 (the CUDA default): within bf16's
    rounding of an fp32 recomputation with the same weights (CPU: at most 0.003 seen)."""
    exact = HFBackend(tiny, device=device, dtype="float32")
    for g in exact.generate(CHATS, max_new_tokens=10, temperature=0.0, seed=1):
        assert g.logprobs == pytest.approx(_teacher_forced(exact.model, g), abs=2e-4)
    low = HFBackend(tiny, device=device, dtype="bfloat16")
    reference = copy.deepcopy(low.model).float()
    for g in low.generate(CHATS, max_new_tokens=10, temperature=1.0, seed=1):
        assert g.logprobs == pytest.approx(_teacher_forced(reference, g), abs=0.02)


def _rows(backend: HFBackend) -> list[TrainingRow]:
    """Completions sampled by ``backend`` with fixed mixed advantages: a gradient on any device."""
    generations = backend.generate(CHATS * 2, max_new_tokens=8, temperature=1.0, seed=0)
    return [TrainingRow(g.prompt_token_ids, g.token_ids, g.logprobs, a, 1 / (4 * g.num_tokens))
            for g, a in zip(generations, [1.0, -1.0, 0.5, -0.5], strict=True)]


def _bound_grpo(*args, **kwargs) -> LossTerms:
    return grpo_loss(*args, clip_eps=0.2, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_learner_step_changes_the_weights_on_the_device(tiny, device):
    backend = HFBackend(tiny, device=device, dtype="bfloat16")
    learner = PolicyLearner(backend.model, lr=1e-3, max_grad_norm=1.0, temperature=1.0,
                            micro_batch_size=2)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    stats = learner.update(_rows(backend), _bound_grpo)
    assert stats.rows == 4 and stats.tokens > 0 and math.isfinite(stats.loss)
    after = backend.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert {p.device.type for p in backend.model.parameters()} == {device}
    assert {p.dtype for p in backend.model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("device", DEVICES)
def test_lora_step_trains_only_the_adapters_on_the_device(tiny, device):
    backend = HFBackend(tiny, device=device, dtype="bfloat16")
    learner = PolicyLearner(backend.model, lr=1e-2, max_grad_norm=1.0, temperature=1.0,
                            micro_batch_size=2, lora=LoRAConfig(enabled=True, r=4))
    base_before = {k: v.clone() for k, v in backend.model.state_dict().items() if "lora_" not in k}
    adapters_before = learner.trainable_state_dict()
    stats = learner.update(_rows(backend), _bound_grpo)
    assert stats.grad_norm > 0.0  # (the loss is 0 at ratio 1: the advantages sum to 0)
    adapters_after = learner.trainable_state_dict()
    assert any(not torch.equal(adapters_before[k], adapters_after[k]) for k in adapters_after)
    base_after = {k: v for k, v in backend.model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base_before[k], base_after[k]) for k in base_before)
    assert {p.device.type for p in learner.model.parameters()} == {device}


@pytest.mark.parametrize("device", DEVICES)
def test_one_trainer_step_in_bf16_changes_the_weights(tiny, tmp_path, device, alternating_rewards):
    """The whole loop (rollout, GRPO, weights pushed back) on the device ``auto`` picks."""
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the trainer's device is 'auto': CUDA here, checked by the cuda case")
    cfg = load_config(None, [
        "arm=none", "name=device-step", f"actor.model=hf:{tiny}", "actor.dtype=bfloat16",
        "tasks.envs.0.id=CRL/Sokoban-v0", "tasks.envs.0.kwargs={max_episode_steps: 2}",
        "tasks.groups_per_step=1", "tasks.group_size=4", "actor.warmup_steps=0",
        "actor.max_new_tokens=8", "actor.lr=1e-3", "run.steps=1", "run.checkpoint_every=1",
        f"run.output_dir={tmp_path}", "run.tensorboard=false", "run.torch_threads=1"])
    from crl_harness.training.trainer import Trainer

    trainer = Trainer(cfg)
    alternating_rewards(trainer)
    model = trainer.actor_backend.model
    assert next(model.parameters()).device.type == device
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = trainer.train()
    assert metrics["grad_norm/actor"] > 0.0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    # bf16 rollouts: the learner recomputes the old log-probs and the metrics report its gap to
    # the sampler's, within the bound
    assert trainer.actor.recompute_old_logprobs
    gap_mean, gap_max = metrics["actor/logprob_gap_mean"], metrics["actor/logprob_gap_max"]
    assert 0.0 <= gap_mean <= gap_max and gap_mean < cfg.actor.max_logprob_gap
    assert metrics["actor/logprob_gap_over_bound"] == 0.0
    if device == "cpu":
        # oneDNN's bf16 kernels for one decoded token and for a whole sequence round apart; on
        # CUDA the tiny model's sampler and learner agreed bit for bit (gap 0.0 on an H200)
        assert gap_mean > 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_decode_attention_equals_sdpa_on_the_device(device, dtype):
    """SmolLM2's shape (9 query heads on 3 KV heads), the query laid out as Llama's attention
    makes it ([B, 1, H, D] transposed): on CUDA, SDPA's output for the grouped query is not
    mergeable by a view (a 3x3-head decode step failed on an H200 until it was reshaped)."""
    from types import SimpleNamespace

    from crl_harness.models.attention import grouped_decode_attention

    generator = torch.Generator().manual_seed(0)
    query = torch.randn(4, 1, 9, 64, generator=generator).transpose(1, 2).to(device, dtype)
    key, value = (torch.randn(4, 3, 40, 64, generator=generator).to(device, dtype)
                  for _ in range(2))
    mask = torch.ones(4, 1, 1, 40, dtype=torch.bool, device=device)
    mask[::2, ..., :7] = False  # left padding
    out, _ = grouped_decode_attention(SimpleNamespace(training=False), query, key, value, mask)
    reference = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1), attn_mask=mask)
    assert out.shape == (4, 1, 9, 64)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), reference.transpose(1, 2).float(),
                               atol=tolerance, rtol=tolerance)
