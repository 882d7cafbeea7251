"""Packed episodes: a full-history trajectory trained as one row gives the per-turn rows'
log-probs, GRPO loss and gradient; slid windows and re-tokenised replies fall back to one row
per turn; masked tokens never reach the loss or the metrics; the trainer's rows and metric."""

from __future__ import annotations

import doctest
import math
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_harness.config import LoRAConfig  # noqa: E402
from crl_harness.models import HFBackend  # noqa: E402
from crl_harness.models.base import Generation, encode_chat  # noqa: E402
from crl_harness.models.tiny import build_tiny_model  # noqa: E402
from crl_harness.rollout import EpisodeSpec, RolloutEngine, Trajectory, Turn  # noqa: E402
from crl_harness.training import learner as learner_module  # noqa: E402
from crl_harness.training import packing  # noqa: E402
from crl_harness.training.batches import actor_rows  # noqa: E402
from crl_harness.training.learner import (  # noqa: E402
    PolicyLearner,
    SharedPrefix,
    TrainingRow,
    UpdateStats,
)
from crl_harness.training.losses import grpo_loss, sequence_token_weights  # noqa: E402
from crl_harness.training.packing import pack_turns  # noqa: E402
from crl_harness.training.step_metrics import step_metrics  # noqa: E402

torch.set_num_threads(1)

SOKOBAN = "CRL/Sokoban-v0"
MOVES = ["up", "left", "down", "right"]


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    return HFBackend(build_tiny_model(tmp_path_factory.mktemp("pack") / "tiny"), dtype="float32",
                     device="cpu")


class _Scripted:
    """A backend double that answers with well-formed replies (the tiny model's samples never
    re-tokenise to themselves) and the tiny model's own log-probs of them, jittered so that the
    sampler and the learner differ and some tokens clip."""

    def __init__(self, backend: HFBackend, seed: int) -> None:
        self.backend, self.rng = backend, random.Random(seed)
        self.max_context = backend.max_context

    def count_tokens(self, messages) -> int:
        return self.backend.count_tokens(messages)

    def generate(self, prompts, **_) -> list[Generation]:
        tokenizer, out = self.backend.tokenizer, []
        for messages in prompts:
            prompt = encode_chat(tokenizer, messages)
            move = self.rng.choice(MOVES)
            text = f"<think>I try {move}.</think><answer>{move}</answer>"
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            with torch.no_grad():
                logits = self.backend.model(input_ids=torch.tensor([prompt + ids])).logits
            logps = torch.log_softmax(logits[0, len(prompt) - 1:-1].float(), dim=-1)
            true = logps.gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()
            jittered = [lp + self.rng.uniform(-0.4, 0.4) for lp in true]
            out.append(Generation(text, prompt, ids, jittered, "stop"))
        return out


def _play(backend: HFBackend, seed: int, history: int | None = None) -> Trajectory:
    engine = RolloutEngine(_Scripted(backend, seed), max_new_tokens=64, history=history,
                           env_kwargs={SOKOBAN: {"max_episode_steps": 4}})
    [traj] = engine.run([EpisodeSpec(SOKOBAN, seed=seed)])
    engine.close()
    assert not traj.error and len(traj.turns) >= 3
    return traj


def _learner(backend: HFBackend, micro_batch_size: int = 3) -> PolicyLearner:
    return PolicyLearner(backend.model, lr=1e-3, max_grad_norm=1e9, temperature=1.0,
                         micro_batch_size=micro_batch_size, recompute_old_logprobs=False)


def _rows(trajectories: list[Trajectory], advantages: list[float], packed: bool) -> list[TrainingRow]:
    """Each trajectory's rows with its advantage and its "sequence-mean then batch-mean" weight."""
    weights = sequence_token_weights(torch.tensor([t.generated_tokens for t in trajectories]))
    rows = []
    for traj, a, w in zip(trajectories, advantages, weights.tolist(), strict=True):
        if packed:
            [part] = pack_turns(traj.turns)
            assert part.packed
            rows.append(TrainingRow(part.prompt_ids, part.completion_ids, part.old_logprobs, a,
                                    w, part.completion_mask))
        else:
            rows += [TrainingRow(t.prompt_token_ids, t.token_ids, t.logprobs, a, w)
                     for t in traj.turns]
    return rows


def _trained_logprobs(learner: PolicyLearner, rows: list[TrainingRow]) -> list[float]:
    """The learner's log-probs of every trained token, row by row, in order."""
    with torch.no_grad():
        logprobs, mask = learner.token_logprobs(rows)
    return logprobs[mask > 0].tolist()


def _loss_and_gradient(learner: PolicyLearner, rows: list[TrainingRow]) -> tuple[float, torch.Tensor]:
    """GRPO (sampler old log-probs, the rows' weights) in one batch, and its flat gradient."""
    learner.model.zero_grad(set_to_none=True)
    logprobs, mask = learner.token_logprobs(rows)
    K = logprobs.shape[1]
    old = torch.zeros_like(logprobs)
    for i, r in enumerate(rows):
        old[i, K - len(r.old_logprobs):] = torch.tensor(r.old_logprobs)
    terms = grpo_loss(logprobs, old, torch.tensor([r.advantage for r in rows]), mask,
                      token_weight=torch.tensor([r.token_weight for r in rows]))
    terms.loss.backward()
    gradient = torch.cat([p.grad.flatten() for p in learner.parameters if p.grad is not None])
    learner.model.zero_grad(set_to_none=True)
    return float(terms.loss.detach()), gradient


def test_module_examples_run():
    assert doctest.testmod(packing).failed == 0


def test_full_history_episode_is_one_row_with_the_per_turn_logprobs_loss_and_gradient(backend):
    trajectories = [_play(backend, seed=0), _play(backend, seed=1)]
    first = trajectories[0]
    [part] = pack_turns(first.turns)
    assert part.prompt_ids == first.turns[0].prompt_token_ids
    assert part.prompt_ids + part.completion_ids == first.turns[-1].input_ids
    assert sum(part.completion_mask) == first.generated_tokens
    assert part.completion_mask[0] == 1 and part.completion_mask[-1] == 1  # reply to reply
    assert [lp for lp, m in zip(part.old_logprobs, part.completion_mask, strict=True) if m] == \
        [lp for t in first.turns for lp in t.logprobs]

    learner = _learner(backend)
    per_turn = _rows(trajectories, [0.7, -0.4], packed=False)
    packed = _rows(trajectories, [0.7, -0.4], packed=True)
    assert len(packed) == 2 and len(per_turn) == sum(len(t.turns) for t in trajectories)
    assert sum(len(r.prompt_ids) + len(r.completion_ids) for r in packed) < \
        sum(len(r.prompt_ids) + len(r.completion_ids) for r in per_turn) / 2

    # Per-token log-probs: alone, in one batch, and batched with per-turn rows (the learner
    # keeps only the logits some row trains, a union of columns).
    reference = _trained_logprobs(learner, per_turn)
    assert _trained_logprobs(learner, packed) == pytest.approx(reference, abs=1e-5)
    assert sum((_trained_logprobs(learner, [r]) for r in packed), []) == \
        pytest.approx(reference, abs=1e-5)
    mixed = _trained_logprobs(learner, [packed[0]] + per_turn[len(first.turns):])
    assert mixed == pytest.approx(reference, abs=1e-5)

    # The GRPO loss and its gradient: the jittered old log-probs clip some tokens.
    loss_turns, grad_turns = _loss_and_gradient(learner, per_turn)
    loss_packed, grad_packed = _loss_and_gradient(learner, packed)
    assert loss_packed == pytest.approx(loss_turns, abs=1e-5)
    assert grad_turns.abs().max() > 1e-3
    assert torch.allclose(grad_packed, grad_turns, atol=1e-5, rtol=0)


def test_update_statistics_are_those_of_the_per_turn_rows(tmp_path):
    # Each formulation updates its own copy of the model (an update steps the weights).
    directory = build_tiny_model(tmp_path / "tiny")
    copies = [HFBackend(directory, dtype="float32", device="cpu") for _ in range(2)]
    trajectories = [_play(copies[0], seed=2), _play(copies[0], seed=3)]
    per_turn = _rows(trajectories, [1.0, -1.0], packed=False)
    packed = _rows(trajectories, [1.0, -1.0], packed=True)
    turns_stats = _learner(copies[0]).update(per_turn, grpo_loss)
    packed_stats = _learner(copies[1]).update(packed, grpo_loss)
    assert packed_stats.rows == 2 and turns_stats.rows == len(per_turn)
    assert packed_stats.tokens == turns_stats.tokens == sum(t.generated_tokens for t in trajectories)
    assert packed_stats.loss == pytest.approx(turns_stats.loss, abs=1e-5)
    assert packed_stats.clip_fraction == turns_stats.clip_fraction > 0
    assert packed_stats.grad_norm == pytest.approx(turns_stats.grad_norm, rel=1e-4)
    assert packed_stats.logprob_gap_mean == pytest.approx(turns_stats.logprob_gap_mean, abs=1e-5)
    assert packed_stats.logprob_gap_max == pytest.approx(turns_stats.logprob_gap_max, abs=1e-5)


def test_history_window_keeps_one_row_per_turn(backend):
    traj = _play(backend, seed=0, history=1)
    # The third prompt has dropped the first turn: not an extension of the second one.
    assert not traj.turns[2].prompt_token_ids[:len(traj.turns[1].input_ids)] == \
        traj.turns[1].input_ids
    parts = pack_turns(traj.turns)
    assert [(p.prompt_ids, p.completion_ids, p.old_logprobs, p.packed) for p in parts] == \
        [(t.prompt_token_ids, t.token_ids, t.logprobs, False) for t in traj.turns]


def test_reply_not_a_prefix_of_the_next_prompt_falls_back(backend):
    turns = _play(backend, seed=0).turns
    assert pack_turns(turns)[0].packed
    # The second reply as the same text in other ids (one token per character): it decodes
    # the same, but the next prompt holds its canonical ids.
    tokenizer = backend.tokenizer
    spelled = [i for ch in turns[1].text for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]
    spelled.append(tokenizer.eos_token_id)
    assert tokenizer.decode(spelled, skip_special_tokens=True) == turns[1].text
    assert spelled != turns[1].token_ids
    odd = [turns[0], replace(turns[1], token_ids=spelled, logprobs=[-1.0] * len(spelled)),
           *turns[2:]]
    parts = pack_turns(odd)
    assert len(parts) == len(turns) and not any(p.packed for p in parts)
    assert [p.completion_ids for p in parts] == [t.token_ids for t in odd]


def test_turns_without_tokens_are_left_out():
    def turn(prompt: list[int], ids: list[int]) -> Turn:
        return Turn(prompt, ids, [-0.5] * len(ids), "")

    turns = [turn([1, 2], []), turn([1, 2, 7], [3, 4]), turn([1, 2, 7, 3, 4, 8], []),
             turn([1, 2, 7, 3, 4, 8, 9], [5]), turn([1, 2, 7, 3, 4, 8, 9, 5, 6], [])]
    [row] = pack_turns(turns)
    # The row starts at the first reply and ends with the last one.
    assert row.prompt_ids == [1, 2, 7]
    assert row.completion_ids == [3, 4, 8, 9, 5] and row.completion_mask == [1, 1, 0, 0, 1]
    assert row.old_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert pack_turns([turn([1], []), turn([1, 2], [])]) == []
    [single] = pack_turns([turn([1, 2], [3])])
    assert single.packed and single.completion_mask == [1]


def test_masked_tokens_reach_neither_the_loss_nor_the_metrics(backend):
    learner = _learner(backend, micro_batch_size=4)
    prompt, completion = [5, 6, 7, 8], [9, 10, 11, 12, 13, 14]
    mask = [1, 1, 0, 0, 0, 1]
    with torch.no_grad():
        logprobs, got = learner.token_logprobs([TrainingRow(prompt, completion, [0.0] * 6, 1.0, 1.0,
                                                            mask)])
    assert got[0].tolist() == [float(m) for m in mask]

    def stats(masked_old: float):
        old = [-2.0, -3.0, masked_old, masked_old, masked_old, -4.0]
        return learner.update([TrainingRow(prompt, completion, old, 1.0, 1 / 3, mask)], grpo_loss)

    model_state = {k: v.clone() for k, v in backend.model.state_dict().items()}
    a = stats(0.0)
    backend.model.load_state_dict(model_state)
    b = stats(1e30)  # would overflow the ratio if it were read
    backend.model.load_state_dict(model_state)
    assert a.tokens == b.tokens == 3
    assert a.loss == b.loss and a.clip_fraction == b.clip_fraction
    assert a.logprob_gap_mean == b.logprob_gap_mean and a.logprob_gap_max == b.logprob_gap_max
    assert math.isfinite(a.loss) and math.isfinite(a.grad_norm)
    # A row whose mask trains nothing is not a row of the update.
    assert learner.update([TrainingRow(prompt, completion, [0.0] * 6, 1.0, 1.0, [0] * 6)],
                          grpo_loss).rows == 0
    with pytest.raises(ValueError, match="one mask flag"):
        TrainingRow(prompt, completion, [0.0] * 6, 1.0, 1.0, [1, 0])


def test_trainer_rows_pack_what_packs_and_report_the_fraction(backend):
    full, window = _play(backend, seed=0), _play(backend, seed=0, history=1)
    full.group_id = window.group_id = 0
    full.reward, window.reward = 1.0, 0.0
    zero = _play(backend, seed=1)
    zero.group_id, zero.reward = 1, 0.5  # alone in its subgroup: advantage 0, not trained
    rows, packed_fraction = actor_rows([full, window, zero], normalize_std=False)
    assert packed_fraction == 0.5
    assert len(rows) == 1 + len(window.turns)
    weights = sequence_token_weights(torch.tensor([full.generated_tokens,
                                                   window.generated_tokens,
                                                   zero.generated_tokens]))
    assert rows[0].completion_mask is not None and rows[0].advantage == 0.5
    assert rows[0].token_weight == pytest.approx(float(weights[0]))
    assert all(r.completion_mask is None and r.advantage == -0.5
               and r.token_weight == pytest.approx(float(weights[1])) for r in rows[1:])
    cfg = SimpleNamespace(uses_experience=False, actor=SimpleNamespace(max_logprob_gap=0.1))
    metrics = step_metrics(cfg, [full, window, zero], UpdateStats(0.0, 0.0, 0.0, 1, 1), None, {},
                           packed_fraction=packed_fraction, counters={})
    assert metrics["actor/packed_fraction"] == 0.5
    rows, packed_fraction = actor_rows([], normalize_std=False)
    assert rows == [] and math.isnan(packed_fraction)  # nothing trained


def test_sampled_replies_pack_as_sampled_and_keep_their_logprobs(backend):
    """The real tiny model's samples: pieces the tokenizer would join differently. Each prompt
    still extends the last prompt and its reply token for token (the engine continues the ids,
    it does not re-tokenise the conversation), so the episode is one row, and the learner's
    log-probs of that row are the sampler's."""
    engine = RolloutEngine(backend, max_new_tokens=12, temperature=1.0, seed=3,
                           env_kwargs={SOKOBAN: {"max_episode_steps": 4}})
    trajectories = engine.run([EpisodeSpec(SOKOBAN, seed=s) for s in range(4)])
    engine.close()
    tokenizer = backend.tokenizer
    turns = [t for traj in trajectories for t in traj.turns]
    assert len(turns) == 16
    assert any(tokenizer(tokenizer.decode(t.token_ids, skip_special_tokens=False),
                         add_special_tokens=False)["input_ids"] != t.token_ids for t in turns)
    # A special token inside a reply (a random model samples <|im_start|> too) is not in the
    # reply's text, so the conversation does not continue those ids: such an episode falls back
    # to one row per turn, also exact.
    special = set(tokenizer.all_special_ids)
    plain = [traj for traj in trajectories
             if not any(special & set(t.token_ids[:-1]) for t in traj.turns)]
    assert len(plain) >= 2
    learner = _learner(backend)
    for traj in plain:
        [row] = pack_turns(traj.turns)
        assert row.packed
        sampled = [lp for t in traj.turns for lp in t.logprobs]
        assert _trained_logprobs(learner, [TrainingRow(row.prompt_ids, row.completion_ids,
                                                       row.old_logprobs, 1.0, 1.0,
                                                       row.completion_mask)]) == \
            pytest.approx(sampled, abs=1e-4)


def _lora_learner(directory, share_prefix: bool) -> PolicyLearner:
    """A learner of LoRA adapters on the top layer of a fresh copy of the tiny model (the bottom
    one frozen), the adapters set to the same values in every copy, B non-zero so that the
    gradient reaches A."""
    model = HFBackend(directory, dtype="float32", device="cpu").model
    learner = PolicyLearner(model, lr=1e-2, max_grad_norm=1e9, temperature=1.0,
                            micro_batch_size=2, recompute_old_logprobs=False,
                            lora=LoRAConfig(enabled=True, r=4, alpha=8, top_layers=1),
                            share_prefix=share_prefix)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in learner.model.named_parameters():
            if "lora_" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    return learner


def _assert_same_step(after_whole: dict, after_shared: dict) -> None:
    """The two learners' weights after one step agree within 0.1% of a step (lr 1e-2): AdamW
    divides by sqrt(v), so an element whose gradient is near 0 moves by an amount that float
    rounding changes (1.2e-6 on an AMD EPYC with AVX2 only)."""
    for key, value in after_whole.items():
        assert torch.allclose(after_shared[key], value, atol=1e-5), key


def test_shared_prefix_gives_the_whole_rows_update(tmp_path):
    """The rows' common first tokens forward-passed once: the same log-probs, loss, statistics
    and step as whole rows, packed and per-turn rows mixed over several micro-batches."""
    directory = build_tiny_model(tmp_path / "tiny")
    whole, shared = _lora_learner(directory, False), _lora_learner(directory, True)
    trajectories = [_play(HFBackend(directory, dtype="float32", device="cpu"), seed=s)
                    for s in range(4, 8)]
    rows = _rows(trajectories[:3], [0.9, -0.3, -0.6], packed=True) + \
        _rows(trajectories[3:], [0.5], packed=False)
    prefix = SharedPrefix.of(rows, shared.model)
    assert prefix is not None and len(prefix) >= SharedPrefix.MIN_TOKENS
    assert all(r.prompt_ids[:len(prefix)] == prefix and len(r.prompt_ids) > len(prefix)
               for r in rows)

    whole.model.train()
    shared.model.train()
    with torch.no_grad():
        a, mask = whole.token_logprobs(rows)
        b, _ = shared.token_logprobs(rows, SharedPrefix(shared.model, prefix, shared.device))
    assert torch.allclose(a * mask, b * mask, atol=1e-5)

    stats_whole, stats_shared = whole.update(rows, grpo_loss), shared.update(rows, grpo_loss)
    assert stats_whole.rows == stats_shared.rows == len(rows) > whole.micro_batch_size
    assert stats_shared.grad_norm > 1e-3
    assert stats_shared.grad_norm == pytest.approx(stats_whole.grad_norm, rel=1e-5)
    assert stats_shared.loss == pytest.approx(stats_whole.loss, abs=1e-6)
    assert stats_shared.clip_fraction == stats_whole.clip_fraction
    assert stats_shared.logprob_gap_mean == pytest.approx(stats_whole.logprob_gap_mean, abs=1e-6)
    after_whole, after_shared = whole.trainable_state_dict(), shared.trainable_state_dict()
    assert after_whole.keys() == after_shared.keys()
    before = _lora_learner(directory, True).trainable_state_dict()  # a fresh copy's weights
    _assert_same_step(after_whole, after_shared)
    assert max(float((after_shared[k] - before[k]).abs().max()) for k in before) > 1e-4


def test_rows_that_share_first_tokens_forward_them_once(tmp_path, monkeypatch):
    """Episodes of one level that played the same first replies: within a micro-batch each row
    continues from the row before it where their tokens agree (the update orders them so), which
    forwards fewer tokens and gives the same log-probs, gradient and step as whole rows."""
    directory = build_tiny_model(tmp_path / "tiny")
    whole, shared = _lora_learner(directory, False), _lora_learner(directory, True)
    whole.micro_batch_size = shared.micro_batch_size = 3
    [traj] = [_play(HFBackend(directory, dtype="float32", device="cpu"), seed=4)]
    [row] = _rows([traj], [0.7], packed=True)
    n = len(row.completion_ids)
    cut = n - 5  # a sibling that agrees on all but its last five tokens, trained there
    sibling = replace(row, completion_ids=row.completion_ids[:cut] + [7, 8, 9, 10, 11],
                      advantage=-0.4)
    rows = [row, sibling, replace(row, advantage=0.2), _rows([_play(HFBackend(
        directory, dtype="float32", device="cpu"), seed=5)], [-0.5], packed=True)[0]]

    def forwarded(learner: PolicyLearner) -> tuple[int, torch.Tensor]:
        """Tokens through the embedding, and the trained log-probs, of the rows in token order."""
        counts = []
        hook = learner._decoder.embed_tokens.register_forward_hook(
            lambda _m, args, _o: counts.append(args[0].numel()))
        learner.model.train()
        with torch.no_grad():
            logprobs, mask = learner.token_logprobs(sorted(rows, key=lambda r: r.prompt_ids
                                                           + r.completion_ids))
        hook.remove()
        return sum(counts), logprobs * mask

    (whole_tokens, whole_logprobs), (shared_tokens, shared_logprobs) = \
        forwarded(whole), forwarded(shared)
    assert shared_tokens < whole_tokens - len(row.prompt_ids)
    assert torch.allclose(shared_logprobs, whole_logprobs, atol=1e-5)
    # a model with a sliding window keeps no earlier row's keys: each row forwards all its tokens
    monkeypatch.setattr(learner_module, "attends_fully", lambda model: False)
    assert forwarded(shared)[0] == whole_tokens
    monkeypatch.undo()

    stats_whole, stats_shared = whole.update(rows, grpo_loss), shared.update(rows, grpo_loss)
    assert stats_shared.grad_norm > 1e-3
    assert stats_shared.grad_norm == pytest.approx(stats_whole.grad_norm, rel=1e-5)
    assert stats_shared.loss == pytest.approx(stats_whole.loss, abs=1e-6)
    after_whole, after_shared = whole.trainable_state_dict(), shared.trainable_state_dict()
    _assert_same_step(after_whole, after_shared)


def test_shared_prefix_only_where_it_is_common_long_and_leaves_a_prompt_token(tmp_path):
    model = HFBackend(build_tiny_model(tmp_path / "tiny"), dtype="float32", device="cpu").model
    start = list(range(3, 23))  # 20 tokens

    def row(prompt: list[int]) -> TrainingRow:
        return TrainingRow(prompt, [40, 41], [-1.0, -1.0], 1.0, 0.5)

    assert SharedPrefix.of([row(start + [30, 31]), row(start + [32])], model) == start
    # a row whose whole prompt is common keeps its last prompt token out of the prefix
    assert SharedPrefix.of([row(start + [30]), row(start)], model) == start[:-1]
    assert SharedPrefix.of([row(start[:10] + [99] + start[11:]), row(start + [5])], model) is None
    assert SharedPrefix.of([row([7] + start), row(start + [5])], model) is None
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    assert SharedPrefix.of([row(start + [30, 31]), row(start + [32])], model) is None


def test_token_logprobs_are_each_rows_own_forward_pass(tmp_path):
    """Logits only at each row's trained tokens (``token_logprobs``), rows of other lengths and
    masks padded into one batch: each trained token's log-prob is that of the row's own unpadded
    forward pass, by hand (log-softmax of the full logits); untrained places hold 0."""
    directory = build_tiny_model(tmp_path / "tiny")
    learner = _lora_learner(directory, share_prefix=False)
    trajectories = [_play(HFBackend(directory, dtype="float32", device="cpu"), seed=s)
                    for s in range(4, 7)]
    rows = _rows(trajectories[:2], [0.9, -0.3], packed=True) + \
        _rows(trajectories[2:], [0.5], packed=False)
    assert len({len(r.prompt_ids) + len(r.completion_ids) for r in rows}) > 1
    learner.model.eval()
    with torch.no_grad():
        logprobs, mask = learner.token_logprobs(rows)
        K = logprobs.shape[1]
        for i, r in enumerate(rows):
            ids = torch.tensor([r.prompt_ids + r.completion_ids])
            by_hand = torch.log_softmax(learner.model(input_ids=ids).logits[0].float(), dim=-1)
            n = len(r.completion_ids)
            targets = ids[0, -n:]
            expected = by_hand[-n - 1:-1].gather(-1, targets[:, None])[:, 0]
            flags = torch.tensor(r.completion_mask or [1] * n, dtype=torch.bool)
            got = logprobs[i, K - n:]
            assert torch.allclose(got[flags], expected[flags], atol=1e-5)
            assert bool((got[~flags] == 0).all()) and bool((logprobs[i, :K - n] == 0).all())
            assert bool((mask[i, K - n:].bool() == flags).all())
