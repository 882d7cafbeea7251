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


# ------------------------------------------------------------------ decode speed (issue 31)
def greedy_turns(backend: HFBackend, episodes: int = 6, turns: int = 3) -> list[Generation]:
    """``play_turns`` with greedy replies (what an old/new path comparison can pin down)."""
    chats = [[{"role": "system", "content": SYSTEM},
              {"role": "user", "content": f"Level {i}: the goal is {i + 1} east." + " far" * (9 * i)}]
             for i in range(episodes)]  # new-token counts from ~15 to ~60: several prefill runs
    out = []
    for turn in range(turns):
        generations = backend.generate(chats, max_new_tokens=12, temperature=0.0)
        out.extend(generations)
        for chat, g in zip(chats, generations, strict=True):
            chat += [{"role": "assistant", "content": g.text},
                     {"role": "user", "content": f"turn {turn}: a wall is north." * (turn + 1)}]
    return out


def test_grouped_decode_gives_the_sdpa_paths_greedy_tokens(tiny_dir):
    """The grouped decode attention (the tiny model has 2 query heads per KV head) against
    transformers' SDPA path with the keys repeated: the same greedy tokens, turn after turn."""
    new = greedy_turns(HFBackend(tiny_dir, dtype="float32"))
    old = greedy_turns(HFBackend(tiny_dir, dtype="float32", attn_implementation="sdpa"))
    assert [g.token_ids for g in new] == [g.token_ids for g in old]
    for a, b in zip(new, old, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_prefill_runs_and_finished_rows_keep_logprobs_exact(tiny_dir, monkeypatch):
    """A batch whose rows bring very different numbers of new tokens is prefilled in several
    runs, and rows that finish early leave the slab by a row move: sampled log-probs still equal
    teacher forcing, with and without reuse."""
    for kv_reuse in (True, False):
        backend = HFBackend(tiny_dir, dtype="float32", kv_reuse=kv_reuse)
        widths = []
        forward = backend.model.forward

        def counting(*args, _forward=forward, _widths=widths, **kwargs):
            _widths.append(kwargs["input_ids"].shape[1])
            return _forward(*args, **kwargs)

        monkeypatch.setattr(backend.model, "forward", counting)
        chats = [[{"role": "user", "content": "go" + " east" * (40 * i)}] for i in range(5)]
        # a stop string that random text meets soon, at a different step in each row
        generations = backend.generate(chats, max_new_tokens=24, temperature=1.0, seed=1,
                                       stop=("e",))
        assert len([w for w in widths if w > 1]) >= 3  # one prefill run per length class
        assert len({len(g.token_ids) for g in generations}) > 1  # rows finished apart
        for g in generations:
            assert g.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)


def test_adapter_is_merged_in_fp32_before_a_bf16_cast(tiny_dir, tmp_path):
    """A bf16 load of an adapter is the fp32 merge rounded once, not a merge in bf16."""
    from peft import LoraConfig, get_peft_model

    model = HFBackend(tiny_dir, dtype="float32").model
    adapter = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                               init_lora_weights=False))
    adapter.save_pretrained(tmp_path / "adapter")
    fp32 = HFBackend(tmp_path / "adapter", dtype="float32").model.state_dict()
    bf16 = HFBackend(tmp_path / "adapter", dtype="bfloat16").model.state_dict()
    for key, weight in bf16.items():
        assert weight.dtype == torch.bfloat16
        assert torch.equal(weight, fp32[key].to(torch.bfloat16)), key


def test_a_bf16_adapter_load_keeps_the_buffers_of_a_bf16_load(tiny_dir, tmp_path):
    """Only the weights are cast: the rotary frequencies stay as ``from_pretrained(dtype=bf16)``
    keeps them (fp32); rounded to bf16 they would turn the angles of far positions."""
    from peft import LoraConfig, get_peft_model

    adapter = get_peft_model(HFBackend(tiny_dir, dtype="float32").model,
                             LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    adapter.save_pretrained(tmp_path / "adapter")
    plain = dict(HFBackend(tiny_dir, dtype="bfloat16").model.named_buffers())
    merged = dict(HFBackend(tmp_path / "adapter", dtype="bfloat16").model.named_buffers())
    assert any("inv_freq" in name for name in plain)
    assert plain.keys() == merged.keys()
    for name, buffer in plain.items():
        assert merged[name].dtype == buffer.dtype and torch.equal(merged[name], buffer), name


@pytest.mark.slow
def test_smollm2_grouped_decode_gives_the_sdpa_paths_greedy_tokens():
    new = smollm2_or_skip()
    old = HFBackend(new.name.removeprefix("hf:"), dtype="float32", attn_implementation="sdpa")
    a, b = greedy_turns(new, episodes=4, turns=2), greedy_turns(old, episodes=4, turns=2)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


ALLOCATION = """
import ctypes, sys, torch

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
from crl_harness.models import HFBackend
from crl_harness.models.tiny import build_tiny_model
HFBackend(build_tiny_model(sys.argv[1]))
before = libc.mallinfo2().hblks  # blocks mmapped while loading, before the setting
blocks = [torch.empty(25_000_000) for _ in range(4)]  # 100 MB each
print(libc.mallinfo2().hblks - before)
"""


def test_loading_a_backend_keeps_large_blocks_out_of_mmap(tmp_path):
    """After a backend loads, 100 MB tensors come from the heap (no mmapped block, so no page
    faults each time one is freed and made again); ``CRL_MALLOC=system`` keeps glibc's way."""
    import os
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the allocator setting is glibc's")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def mmapped_blocks(**extra: str) -> int:
        done = subprocess.run([sys.executable, "-c", ALLOCATION, str(tmp_path / "m")],
                              env={**env, **extra}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    assert mmapped_blocks() == 0
    assert mmapped_blocks(CRL_MALLOC="system") >= 4


def test_hardening_seeded_sampling_does_not_depend_on_the_cache_or_the_other_rows(tiny_dir):
    """With KV reuse on, prefill grouping (rows ordered by how many tokens they bring) changed
    the order of the random draws, so one batch and seed at T=1 gave other tokens than with
    reuse off; a row's draws now depend on the seed and its place in the batch only."""
    reuse, fresh = HFBackend(tiny_dir, dtype="float32"), HFBackend(tiny_dir, dtype="float32",
                                                                   kv_reuse=False)
    tokenizer = reuse.tokenizer
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    stem = ids("<think>The goal is to the east, so I move east.</think>" * 3)
    # stored in the reusing backend only: the next batch's rows bring different new counts there
    reuse.generate_from_ids([stem + ids(" west")], max_new_tokens=4, temperature=1.0, seed=1)
    batch = [stem + ids(" west north"), ids("search[red shoes]") * 6, ids("pick up key") * 2,
             stem + ids(" up")]
    sample = dict(max_new_tokens=12, temperature=1.0, seed=3)
    with_reuse = [g.token_ids for g in reuse.generate_from_ids(batch, **sample)]
    assert reuse.cache_stats["reused_tokens"] > 0
    assert with_reuse == [g.token_ids for g in fresh.generate_from_ids(batch, **sample)]
    # row 0's draws are its own: other rows beside it change nothing
    alone = fresh.generate_from_ids([batch[0], batch[2]], **sample)[0].token_ids
    assert alone == with_reuse[0]


def test_hardening_the_unwritten_columns_of_the_cache_never_reach_an_answer(tiny_dir, monkeypatch):
    """A decode step attends over the cache's whole buffer, its unwritten columns masked: they
    are zeroed first, so whatever the allocator left there (NaN here) changes no log-prob."""
    backend = HFBackend(tiny_dir, dtype="float32")
    empty = torch.empty
    monkeypatch.setattr(torch, "empty",
                        lambda *args, **kwargs: empty(*args, **kwargs).fill_(float("nan")))
    generations = play_turns(backend, episodes=4, turns=2)
    monkeypatch.setattr(torch, "empty", empty)
    for g in generations:
        assert g.logprobs == pytest.approx(teacher_forced(backend, g), abs=1e-4)


def test_a_decode_step_sees_the_whole_buffer_and_a_fresh_prefill_its_own_columns():
    from crl_harness.models.kv_cache import SlabCache

    slab = torch.zeros(1, 2, 2, 3, 10, 4)  # layers, K/V, rows, heads, capacity, head dim
    fresh = SlabCache(slab.clone(), 0)
    assert fresh.layers[0].get_mask_sizes(4) == (4, 0)
    keys, _ = fresh.layers[0].update(torch.ones(2, 3, 4, 4), torch.ones(2, 3, 4, 4))
    assert keys.shape[-2] == 4  # unpadded rows keep the causal kernel
    assert fresh.layers[0].get_mask_sizes(1) == (10, 0)
    keys, _ = fresh.layers[0].update(torch.ones(2, 3, 1, 4), torch.ones(2, 3, 1, 4))
    assert keys.shape[-2] == 10 and keys.is_contiguous() and fresh.get_seq_length() == 5
