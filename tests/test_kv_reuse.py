"""KV reuse in the HF backend: exact log-probs with and without reuse, across turns, after an
eviction and after a weight update; what is reused; the cap; the old path as a switch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_harness.models import Generation, HFBackend  # noqa: E402
from crl_harness.models.kv_cache import PrefixStore  # noqa: E402
from crl_harness.models.tiny import build_tiny_model  # noqa: E402
from crl_harness.rollout import EpisodeSpec, RolloutEngine  # noqa: E402

torch.set_num_threads(1)

SYSTEM = "You play a grid game. Walls are #, the goal is >. Moves: north, south, east, west. " * 3


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def teacher_forced(backend: HFBackend, g: Generation, temperature: float = 1.0) -> list[float]:
    """One full forward pass on the backend's device (the backends here are fp32, where reuse
    must be exact; bf16 is checked in test_device.py)."""
    device = backend.model.device
    ids = torch.tensor([g.prompt_token_ids + g.token_ids], device=device)
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0, len(g.prompt_token_ids) - 1:-1].float()
    logps = torch.log_softmax(logits / temperature, dim=-1)
    targets = torch.tensor(g.token_ids, device=device)
    return logps.gather(-1, targets[:, None])[:, 0].tolist()


def play_turns(backend: HFBackend, episodes: int, turns: int, seed: int = 0) -> list[Generation]:
    """Multi-turn chats that only grow: each turn appends the reply and a new observation."""
    chats = [[{"role": "system", "content": SYSTEM},
              {"role": "user", "content": f"Level {i // 2}: the goal is {i // 2 + 1} east."}]
             for i in range(episodes)]  # pairs of episodes share a first observation (a group)
    out = []
    for turn in range(turns):
        generations = backend.generate(chats, max_new_tokens=10, temperature=1.0, seed=seed + turn)
        out.extend(generations)
        for chat, g in zip(chats, generations, strict=True):
            chat += [{"role": "assistant", "content": g.text},
                     {"role": "user", "content": f"turn {turn}: you moved, a wall is north."}]
    return out


def test_reuse_logprobs_equal_teacher_forced_across_turns(tiny_dir):
    backend = HFBackend(tiny_dir, dtype="float32")
    generations = play_turns(backend, episodes=6, turns=3)
    for g in generations:
        assert g.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)
    assert backend.cache_stats["reused_tokens"] > backend.cache_stats["prefilled_tokens"]


def test_reuse_prefills_only_the_new_tokens_of_a_growing_chat(tiny_dir):
    backend = HFBackend(tiny_dir, dtype="float32")
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "start"}]
    [g] = backend.generate([chat], max_new_tokens=6, temperature=1.0, seed=0)
    before = dict(backend.cache_stats)
    chat += [{"role": "assistant", "content": g.text}, {"role": "user", "content": "next"}]
    [g2] = backend.generate([chat], max_new_tokens=6, temperature=1.0, seed=1)
    reused = backend.cache_stats["reused_tokens"] - before["reused_tokens"]
    prefilled = backend.cache_stats["prefilled_tokens"] - before["prefilled_tokens"]
    assert reused + prefilled == len(g2.prompt_token_ids)
    # Everything fed last turn (prompt + answer but its final token) is reused when the answer
    # re-tokenises to the same ids.
    fed = g.prompt_token_ids + g.token_ids[:-1]
    if g2.prompt_token_ids[: len(fed)] == fed:
        assert reused == len(fed)
    assert prefilled < 40


def test_shared_prefix_of_a_batch_is_computed_once(tiny_dir):
    backend = HFBackend(tiny_dir, dtype="float32")
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"obs {i}"}]
             for i in range(8)]
    generations = backend.generate(chats, max_new_tokens=4, temperature=1.0, seed=0)
    total = sum(len(g.prompt_token_ids) for g in generations)
    # The system prompt is prefilled once, not eight times.
    assert backend.cache_stats["prefilled_tokens"] < total / 3
    for g in generations:
        assert g.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)


def test_eviction_under_a_small_cap_keeps_logprobs_exact(tiny_dir):
    backend = HFBackend(tiny_dir, dtype="float32", kv_cache_tokens=400)
    generations = play_turns(backend, episodes=6, turns=3, seed=5)
    assert backend.prefix_store.tokens <= 400
    assert backend.prefix_store.evictions > 0
    for g in generations:
        assert g.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)


def test_weight_update_drops_the_cache_and_logprobs_follow_the_new_weights(tiny_dir):
    backend = HFBackend(tiny_dir, dtype="float32")
    play_turns(backend, episodes=2, turns=1)
    assert len(backend.prefix_store) > 0
    with torch.no_grad():  # an optimiser step changes parameters in place
        for p in backend.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    generations = play_turns(backend, episodes=2, turns=2, seed=9)
    for g in generations:
        assert g.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)
    backend.load_weights(backend.model.state_dict())
    assert len(backend.prefix_store) == 0


def test_without_reuse_every_prompt_is_prefilled_in_full(tiny_dir):
    backend = HFBackend(tiny_dir, dtype="float32", kv_reuse=False)
    generations = play_turns(backend, episodes=3, turns=2)
    assert backend.prefix_store is None
    assert backend.cache_stats["reused_tokens"] == 0
    assert backend.cache_stats["prefilled_tokens"] == sum(len(g.prompt_token_ids) for g in generations)
    for g in generations:
        assert g.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)


def test_rollout_engine_with_reuse_matches_teacher_forcing(tiny_dir):
    backend = HFBackend(tiny_dir, dtype="float32")
    engine = RolloutEngine(backend, max_new_tokens=8, seed=0, history=None,
                           env_kwargs={"CRL/Sokoban-v0": {"max_episode_steps": 3}})
    trajectories = engine.run([EpisodeSpec("CRL/Sokoban-v0", seed=s % 2) for s in range(4)])
    engine.close()
    assert backend.cache_stats["reused_tokens"] > 0
    for traj in trajectories:
        for turn in traj.turns:
            g = Generation("", turn.prompt_token_ids, turn.token_ids, turn.logprobs, "")
            assert turn.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)


def test_hardening_bad_cache_settings_and_overlong_prompts(tiny_dir):
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        HFBackend(tiny_dir, dtype="float32", kv_cache_tokens=0)
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixStore(0)
    backend = HFBackend(tiny_dir, dtype="float32", max_context=64)
    assert backend.generate_from_ids([], max_new_tokens=4, temperature=1.0) == []
    with pytest.raises(ValueError, match="at least one token"):
        backend.generate_from_ids([[5, 6], []], max_new_tokens=4, temperature=1.0)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        backend.generate([[{"role": "user", "content": "x " * 200}]], max_new_tokens=4,
                         temperature=1.0)


def test_prefix_store_lookup_replace_and_lru():
    store = PrefixStore(max_tokens=10)
    kv = lambda n: torch.zeros(1, 2, 1, n, 2)  # noqa: E731
    store.add([1, 2, 3], kv(3), shared=True)
    store.add([1, 2, 3, 4, 5], kv(5))
    entry, n = store.lookup([1, 2, 3, 4, 5, 6])
    assert n == 5 and entry.tokens == 5
    store.add([1, 2, 3, 4, 5, 6], kv(6), replaces=entry)  # the episode's old entry goes
    assert sorted(e.tokens for e in store.entries) == [3, 6]  # the shared one stays
    store.lookup([1, 2, 3])
    store.add([7, 8], kv(2))  # 11 > 10: the least recently used (the 6-token entry) is evicted
    assert sorted(e.tokens for e in store.entries) == [2, 3]


@pytest.mark.slow
def test_smollm2_reuse_logprobs_equal_teacher_forced():
    backend = smollm2_or_skip()
    generations = play_turns(backend, episodes=2, turns=2)
    for g in generations:
        assert g.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)
    assert backend.cache_stats["reused_tokens"] > 0


def smollm2_or_skip() -> HFBackend:
    from crl_harness.models import ModelNotFoundError, load_backend

    try:
        return load_backend("hf:smollm2-135m")
    except ModelNotFoundError as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("write", ["vector_to_parameters", "data_add", "data_assign"])
def test_hardening_weights_written_through_data_are_synced_by_clear_prefix_cache(tiny_dir,
                                                                                  write):
    """Writes through ``.data`` bump no version counter, so the backend cannot see them: the
    weight-sync contract is ``clear_prefix_cache()`` after one (HFBackend's docstring)."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    backend = HFBackend(tiny_dir, dtype="float32")
    play_turns(backend, episodes=2, turns=1)
    params = list(backend.model.parameters())
    versions = [p._version for p in params]
    if write == "vector_to_parameters":
        vector = parameters_to_vector(params).detach()
        vector_to_parameters(vector + 0.05 * torch.randn_like(vector), params)
    for p in params if write != "vector_to_parameters" else ():
        if write == "data_add":
            p.data.add_(0.05 * torch.randn_like(p))
        else:
            p.data = p.data + 0.05 * torch.randn_like(p)
    assert [p._version for p in params] == versions  # invisible to the backend
    backend.clear_prefix_cache()
    assert len(backend.prefix_store) == 0
    for g in play_turns(backend, episodes=2, turns=2, seed=9):
        assert g.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)
