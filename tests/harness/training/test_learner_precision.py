"""PolicyLearner in low precision, on CPU with the tiny model: fp32 master weights make an update
at the released lr (1e-6) land in bf16, recomputed old log-probs make on-policy ratios 1, and the
sampler/learner log-prob gap is measured.

The completions are sampled by ``HFBackend`` from the very model the learner trains, in the same
dtype, as in a training run in one process.
"""

from __future__ import annotations

import pytest
import torch

from crl_harness.models.hf import HFBackend
from crl_harness.models.tiny import build_tiny_model
from crl_harness.training.learner import PolicyLearner, TrainingRow
from crl_harness.training.losses import LossTerms, cispo_loss, grpo_loss

torch.set_num_threads(1)

ADVANTAGES = [1.0, -1.0, 0.5, -0.5]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def _sampled(path, dtype: str) -> tuple[HFBackend, list[TrainingRow]]:
    backend = HFBackend(path, dtype=dtype, device="cpu")
    generations = backend.generate(
        [[{"role": "user", "content": f"Which way to the goal, room {i}?"}] for i in range(4)],
        max_new_tokens=12, temperature=1.0, seed=0)
    rows = [TrainingRow(g.prompt_token_ids, g.token_ids, g.logprobs, a, 1 / (4 * g.num_tokens))
            for g, a in zip(generations, ADVANTAGES, strict=True)]
    return backend, rows


def _learner(backend: HFBackend, **kwargs) -> PolicyLearner:
    return PolicyLearner(backend.model, lr=1e-6, max_grad_norm=1.0, temperature=1.0,
                         micro_batch_size=2, **kwargs)


def _recording(loss, ratios: list[torch.Tensor]):
    """``loss`` that also keeps each micro-batch's ratios of real tokens."""
    def wrapped(logprobs, old_logprobs, advantages, mask, **kwargs) -> LossTerms:
        ratios.append(torch.exp(logprobs.detach() - old_logprobs)[mask > 0])
        return loss(logprobs, old_logprobs, advantages, mask, **kwargs)
    return wrapped


def test_bf16_update_at_lr_1e_6_changes_every_trainable_parameter_with_a_gradient(tiny):
    backend, rows = _sampled(tiny, "bfloat16")
    learner = _learner(backend)
    assert learner.dtype == torch.bfloat16 and learner.parameters
    assert all(m.dtype == torch.float32 for m in learner.masters)
    before = [m.detach().clone() for m in learner.masters]
    had_gradient: list[bool] = []
    learner.optimizer.register_step_pre_hook(lambda *_: had_gradient.extend(
        m.grad is not None and bool(m.grad.abs().sum() > 0) for m in learner.masters))

    stats = learner.update(rows, grpo_loss)

    assert stats.rows == 4 and stats.grad_norm > 0
    assert sum(had_gradient) == len(learner.masters)  # every parameter of this model gets one
    for master, old, grad in zip(learner.masters, before, had_gradient, strict=True):
        if grad:
            assert not torch.equal(master, old)
    # The bf16 weights the rollouts use are the masters rounded: most of a 1e-6 step is below
    # bf16's resolution, which is why it must accumulate in fp32.
    for param, master in zip(learner.parameters, learner.masters, strict=True):
        assert param.dtype == torch.bfloat16 and torch.equal(param, master.to(torch.bfloat16))


def test_bf16_recomputed_old_logprobs_give_on_policy_ratios_of_one(tiny):
    backend, rows = _sampled(tiny, "bfloat16")
    learner = _learner(backend)
    assert learner.recompute_old_logprobs  # the default in bf16
    ratios: list[torch.Tensor] = []
    stats = learner.update(rows, _recording(cispo_loss, ratios))
    ratios_on = torch.cat(ratios)
    assert torch.allclose(ratios_on, torch.ones_like(ratios_on), atol=1e-3)
    assert stats.clip_fraction == 0.0
    assert stats.logprob_gap_max >= stats.logprob_gap_mean > 0  # sampler and learner differ

    # Off: the ratio is against the sampler's log-probs, off by exactly the reported gap.
    backend, rows = _sampled(tiny, "bfloat16")
    learner = _learner(backend, recompute_old_logprobs=False)
    ratios = []
    stats = learner.update(rows, _recording(cispo_loss, ratios))
    log_ratios = torch.cat(ratios).log().abs()
    assert float(log_ratios.max()) == pytest.approx(stats.logprob_gap_max, rel=1e-4)
    assert float(log_ratios.mean()) == pytest.approx(stats.logprob_gap_mean, rel=1e-4)


def test_fp32_keeps_the_samplers_logprobs_and_needs_no_masters(tiny):
    backend, rows = _sampled(tiny, "float32")
    learner = _learner(backend)
    assert not learner.recompute_old_logprobs
    assert all(m is p for m, p in zip(learner.masters, learner.parameters, strict=True))
    stats = learner.update(rows, grpo_loss)
    assert stats.logprob_gap_max < 1e-4  # the same numbers up to float rounding


def test_fp16_update_scales_the_loss_and_keeps_fp32_masters(tiny):
    backend, rows = _sampled(tiny, "float16")
    learner = _learner(backend)
    assert learner.scaler is not None and learner.recompute_old_logprobs
    before = [m.detach().clone() for m in learner.masters]
    stats = learner.update(rows, grpo_loss)
    assert stats.rows == 4 and torch.isfinite(torch.tensor(stats.grad_norm))
    assert all(not torch.equal(m, old) for m, old in zip(learner.masters, before, strict=True))
    assert "scaler" in learner.optimizer_state()


def test_checkpoint_state_carries_the_fp32_masters(tiny):
    backend, rows = _sampled(tiny, "bfloat16")
    learner = _learner(backend)
    learner.update(rows, grpo_loss)
    state = learner.trainable_state_dict()
    assert all(v.dtype == torch.float32 for v in state.values())
    masters = [m.detach().clone() for m in learner.masters]

    other, _ = _sampled(tiny, "bfloat16")
    restored = _learner(other)
    restored.load_trainable_state_dict(state)
    restored.load_optimizer_state(learner.optimizer_state())
    for master, expected in zip(restored.masters, masters, strict=True):
        assert torch.equal(master, expected)  # not the bf16 rounding of it
    for param, master in zip(restored.parameters, restored.masters, strict=True):
        assert torch.equal(param, master.to(torch.bfloat16))


def test_bf16_base_with_lora_trains_fp32_adapters_and_freezes_the_base(tiny):
    from crl_harness.config import LoRAConfig

    backend, rows = _sampled(tiny, "bfloat16")
    base_before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    learner = _learner(backend, lora=LoRAConfig(enabled=True, r=4))
    assert learner.recompute_old_logprobs and learner.parameters
    assert all(m is p and p.dtype == torch.float32  # the adapters are their own masters
               for m, p in zip(learner.masters, learner.parameters, strict=True))
    before = learner.trainable_state_dict()
    stats = learner.update(rows, grpo_loss)
    assert stats.rows == 4 and stats.grad_norm > 0
    after = learner.trainable_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)
    base_after = {k.replace(".base_layer", ""): v
                  for k, v in learner.base_model.state_dict().items() if "lora_" not in k}
    assert base_after.keys() == base_before.keys()
    assert all(torch.equal(base_before[k], v) for k, v in base_after.items())


def test_lora_save_merged_keeps_biases_and_matches_the_adapted_model(tmp_path):
    """A model whose adapted projections have biases (Qwen2's q/k/v): the merged checkpoint keeps
    them and gives the adapted model's logits; the live model is left as it was."""
    import transformers

    from crl_harness.config import LoRAConfig

    config = transformers.Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    for name, parameter in model.named_parameters():
        if name.endswith("bias"):  # initialised to zero, which a lost bias would also give
            parameter.data.normal_()
    learner = PolicyLearner(model, lr=1e-3, max_grad_norm=1.0, temperature=1.0,
                            micro_batch_size=1, lora=LoRAConfig(enabled=True, r=4, alpha=8))
    for name, parameter in learner.model.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_()
    ids = torch.tensor([[3, 17, 42, 5, 9]])
    with torch.no_grad():
        expected = learner.model(input_ids=ids).logits
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    learner.save_merged(tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert any(k.endswith("q_proj.bias") for k in merged.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


def _warm_adapter(tiny, folder) -> dict[str, torch.Tensor]:
    """LoRA adapters of the tiny model with non-zero weights (a fresh lora_B is 0, which a
    fresh start would also give), saved to ``folder`` as a warm start writes them."""
    from crl_harness.config import LoRAConfig

    backend = HFBackend(tiny, dtype="float32", device="cpu")
    learner = _learner(backend, lora=LoRAConfig(enabled=True, r=4, alpha=8))
    torch.manual_seed(1)
    for name, parameter in learner.model.named_parameters():
        if "lora_" in name:
            parameter.data.normal_(std=0.05)
    learner.save_adapter(folder, str(tiny))
    return learner.trainable_state_dict()


def test_lora_init_from_continues_the_given_adapters_fp32_on_a_bf16_base(tiny, tmp_path):
    from crl_harness.config import LoRAConfig

    warm = _warm_adapter(tiny, tmp_path / "warm")
    backend, rows = _sampled(tiny, "bfloat16")
    base_before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    learner = _learner(backend, lora=LoRAConfig(enabled=True, r=16,  # its own r=4 wins
                                                init_from=str(tmp_path / "warm")))
    # the warm adapters, unmerged and trainable, not fresh ones; fp32 on the bf16 base
    start = learner.trainable_state_dict()
    assert start.keys() == warm.keys() and all(torch.equal(start[k], warm[k]) for k in warm)
    assert learner.dtype == torch.bfloat16 and learner.parameters
    assert all(m is p and p.dtype == torch.float32 and p.requires_grad and "lora_" in n
               for (n, p), m in zip(((n, p) for n, p in learner.model.named_parameters()
                                     if p.requires_grad), learner.masters, strict=True))
    learner.optimizer.param_groups[0]["lr"] = 1e-3
    stats = learner.update(rows, grpo_loss)
    assert stats.rows == 4 and stats.grad_norm > 0
    after = learner.trainable_state_dict()
    assert any(not torch.equal(start[k], after[k]) for k in after)
    assert all(t.dtype == torch.float32 for s in learner.optimizer.state.values()
               for t in s.values() if t.dim())  # AdamW's moments are fp32 too
    base_after = {k.replace(".base_layer", ""): v
                  for k, v in learner.base_model.state_dict().items() if "lora_" not in k}
    assert base_after.keys() == base_before.keys()
    assert all(v.dtype == torch.bfloat16 and torch.equal(base_before[k], v)
               for k, v in base_after.items() if v.is_floating_point())


def test_lora_adapter_save_is_small_and_the_merged_export_is_fp32(tiny, tmp_path):
    import json

    from safetensors.torch import load_file

    from crl_harness.config import LoRAConfig

    _warm_adapter(tiny, tmp_path / "warm")
    backend = HFBackend(tiny, dtype="bfloat16", device="cpu")
    learner = _learner(backend, lora=LoRAConfig(enabled=True, init_from=str(tmp_path / "warm")))
    learner.save_adapter(tmp_path / "adapter", "tiny-base")
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert saved and all("lora_" in k and v.dtype == torch.float32 for k, v in saved.items())
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-base" and config["r"] == 4

    learner.save_merged(tmp_path / "merged")
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    assert all(v.dtype == torch.float32 for v in merged.values() if v.is_floating_point())
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["dtype"] == "float32"
    # an adapted weight is the bf16 base, upcast, plus the fp32 delta (not rounded to bf16)
    q_proj = learner.model.get_base_model().model.layers[0].self_attn.q_proj
    with torch.no_grad():
        expected = q_proj.get_base_layer().weight.float() + q_proj.get_delta_weight("default")
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], expected,
                               atol=0, rtol=0)
    assert not torch.equal(expected.to(torch.bfloat16).float(), expected)
