"""The released method's two switches, end to end through the rollout engine and the Experience
Manager: the actor-critic gate (accept / refine / reject and the extractor's credit by verdict)
and search-and-ask (answers by the extractor, the limit, bad queries, credit by outcome), the
loss masks of those turns, the HF backend's stop string, and the config checks.

The actor is scripted (the gate verdict and the asks are chosen by the test, the moves are the
Sokoban oracle's) and speaks through the tiny model's tokenizer and chat template, so its turns
carry real token ids; the extractor is scripted the same way.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_envs.sokoban.oracle import SokobanOracle  # noqa: E402
from crl_harness.config import ConfigError, load_config  # noqa: E402
from crl_harness.experience import (  # noqa: E402
    EpisodeOutcome,
    ExperienceBank,
    ExperienceManager,
    credit_episodes,
    parse_verdict,
)
from crl_harness.experience.ask import ASK_CLOSE, NO_KNOWLEDGE, parse_ask  # noqa: E402
from crl_harness.experience.gate import MAX_REFINED_CHARS  # noqa: E402
from crl_harness.models import Generation, HFBackend  # noqa: E402
from crl_harness.models.base import encode_chat  # noqa: E402
from crl_harness.models.tiny import build_tiny_model  # noqa: E402
from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from crl_harness.training.batches import actor_rows  # noqa: E402
from crl_harness.training.trainer import Trainer  # noqa: E402
from crl_wrappers.experience import DEFAULT_HEADER  # noqa: E402

torch.set_num_threads(1)
SOKOBAN = "CRL/Sokoban-v0"
LESSON = "Never push a box into a corner that is not a target."
WON_SEED = 2  # the oracle solves it


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


def _generation(tokenizer, messages, text: str) -> Generation:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return Generation(text, encode_chat(tokenizer, messages), ids, [-0.5] * len(ids), "stop")


class ScriptedActor:
    """The actor: the gate's verdict from ``verdict``, then ``asks`` (one per turn, in order),
    then the Sokoban oracle's moves (or ``fail``: a move into the wall, forever)."""

    name, max_context = "scripted", 100_000

    def __init__(self, tokenizer, verdict: str = "", asks=(), fail: bool = False):
        self.tokenizer, self.verdict, self.asks, self.fail = tokenizer, verdict, list(asks), fail
        self.prompts, self.kwargs = [], []

    def count_tokens(self, messages):
        return 0

    def generate(self, prompts, **kwargs):
        self.kwargs.append(kwargs)
        self.prompts.append(prompts)
        return [_generation(self.tokenizer, m, self._reply(m)) for m in prompts]

    def _reply(self, messages) -> str:
        if "Judge the knowledge" in messages[-1]["content"]:
            return self.verdict
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn < len(self.asks):
            return f"<think>unsure</think><knowledge_search_and_ask>{self.asks[turn]}{ASK_CLOSE}"
        observation = messages[-1]["content"].split("\n\n")[-1]
        move = "up" if self.fail else SokobanOracle().act(observation, {})
        return f"<think>plan</think><answer>{move}</answer>"


class ScriptedExtractor:
    """The extractor: answers every ask with one lesson (token ids from the tiny tokenizer)."""

    def __init__(self, tokenizer, text="<think>ok</think><answer>Push boxes only onto targets.</answer>"):
        self.tokenizer, self.text, self.prompts = tokenizer, text, []

    def __call__(self, prompt: str) -> Generation:
        self.prompts.append(prompt)
        return _generation(self.tokenizer, [{"role": "user", "content": prompt}], self.text)


@pytest.fixture
def manager(tmp_path, tokenizer):
    """A bank with one lesson written by the extractor generation "writer" (awaiting credit)."""
    bank = ExperienceBank(tmp_path / "bank.sqlite")
    bank.add(SOKOBAN, "Corners", LESSON, generation_id="writer")
    manager = ExperienceManager(bank, ScriptedExtractor(tokenizer))
    manager.ledger.register("writer", "p", "o", "distill")
    yield manager
    manager.close()
    bank.close()


def _verdict(name: str, **extra) -> str:
    return f"<think>judging</think><answer>{json.dumps({'verdict': name, **extra})}</answer>"


def _play(actor, manager, *, seed=WON_SEED, guided=True, **settings):
    """One episode, credited as the trainer credits a step's (``credit_episodes``)."""
    engine = RolloutEngine(actor, retriever=manager, **settings)
    try:
        [traj] = engine.run([EpisodeSpec(SOKOBAN, seed, use_experience=guided)])
    finally:
        engine.close()
    if not traj.error:
        credit_episodes(manager, [EpisodeOutcome.of(traj)])
    return traj


def _rewards(manager) -> dict[str, float]:
    return {g.generation_id: g.reward for g in manager.generation_rewards()}


def _first_action_system(actor) -> str:
    return next(p[0][0]["content"] for p in actor.prompts
                if "Judge the knowledge" not in p[0][-1]["content"])


# ------------------------------------------------------------------ the gate
@pytest.mark.parametrize("fail", [False, True])
def test_gate_reject_empties_the_experience_and_credits_minus_one_whatever_the_outcome(
        tokenizer, manager, fail):
    actor = ScriptedActor(tokenizer, _verdict("reject"), fail=fail)
    traj = _play(actor, manager, actor_critic_gate=True,
                 env_kwargs={SOKOBAN: {"max_episode_steps": 4}} if fail else {})
    assert traj.won is not fail
    assert traj.gate.verdict == "reject" and traj.gate.critic == -1.0
    system = _first_action_system(actor)
    assert LESSON not in system and DEFAULT_HEADER not in system
    assert traj.experience_ids  # still recorded: their writer is credited by the verdict
    assert _rewards(manager) == {"writer": -1.0}
    assert "[Lessons] the agent rejected" in traj.transcript


def test_gate_accept_and_a_win_credits_two(tokenizer, manager):
    actor = ScriptedActor(tokenizer, _verdict("accept"))
    traj = _play(actor, manager, actor_critic_gate=True)
    assert traj.won and traj.gate.verdict == "accept"
    assert LESSON in _first_action_system(actor)
    assert _rewards(manager) == {"writer": 2.0}


def test_gate_accept_keeps_the_prompt_exactly_as_without_the_gate(tokenizer, manager):
    gated, plain = ScriptedActor(tokenizer, _verdict("accept")), ScriptedActor(tokenizer)
    _play(gated, manager, actor_critic_gate=True)
    _play(plain, manager)
    assert _first_action_system(gated) == _first_action_system(plain)


def test_gate_refine_restates_the_experience_and_credits_one_half(tokenizer, manager):
    refined = "Push each box straight onto the nearest target."
    actor = ScriptedActor(tokenizer, _verdict("refine", knowledge=refined))
    traj = _play(actor, manager, actor_critic_gate=True)
    system = _first_action_system(actor)
    assert traj.gate.verdict == "refine" and traj.gate.knowledge == refined
    assert f"{DEFAULT_HEADER}\n{refined}" in system and LESSON not in system
    assert _rewards(manager) == {"writer": 0.5}


def test_gate_runs_only_for_guided_episodes_that_retrieved(tokenizer, manager):
    actor = ScriptedActor(tokenizer, _verdict("reject"))
    free = _play(actor, manager, guided=False, actor_critic_gate=True)
    assert free.gate is None and not any("Judge" in p[0][-1]["content"] for p in actor.prompts)


@pytest.mark.parametrize("reply", [
    "east",                                                        # no answer block
    "<answer>accept</answer>",                                     # not JSON
    '<answer>["reject"]</answer>',                                 # not an object
    '<answer>{"verdict": "maybe"}</answer>',                       # unknown verdict
    '<answer>{"verdict": "refine"}</answer>',                      # refine without knowledge
    '<answer>{"verdict": "refine", "knowledge": "  "}</answer>',   # empty knowledge
    '<answer>{"verdict": "refine", "knowledge": 3}</answer>',      # not a string
])
def test_hardening_malformed_gate_verdict_counts_as_accept_with_a_format_failure(reply):
    verdict = parse_verdict(reply)
    assert verdict.verdict == "accept" and verdict.critic == 1.0
    assert not verdict.format_ok and verdict.error


def test_hardening_malformed_verdict_in_an_episode_keeps_the_experience(tokenizer, manager):
    actor = ScriptedActor(tokenizer, "<think>hm</think><answer>up</answer>")
    traj = _play(actor, manager, actor_critic_gate=True)
    assert traj.gate.verdict == "accept" and not traj.gate.format_ok
    assert LESSON in _first_action_system(actor)
    assert _rewards(manager) == {"writer": 2.0}  # a won episode, the verdict taken as accept


def test_hardening_refined_knowledge_is_cut_to_its_bound():
    verdict = parse_verdict(_verdict("refine", knowledge="x" * (3 * MAX_REFINED_CHARS)))
    assert verdict.format_ok and len(verdict.knowledge) == MAX_REFINED_CHARS


def test_hardening_refine_knowledge_with_a_lone_surrogate_is_cleaned_not_a_crash(tokenizer,
                                                                                   manager):
    # Plain ASCII a model can write; json.loads makes it a lone surrogate, which the tokenizer
    # of the next prompt (the episode's system prompt) cannot encode (issue 34, defect 1).
    reply = '<think>j</think><answer>{"verdict": "refine", "knowledge": "\\ud83d go up"}</answer>'
    assert parse_verdict(reply).knowledge == "\ufffd go up"
    actor = ScriptedActor(tokenizer, reply)
    traj = _play(actor, manager, actor_critic_gate=True)
    assert traj.error == "" and traj.won and traj.gate.verdict == "refine"
    assert f"{DEFAULT_HEADER}\n\ufffd go up" in _first_action_system(actor)


def test_hardening_reply_parsers_answer_pathological_replies():
    """Unclosed and repeated tags: no block, no crash (that they take linear time is measured
    by ``benchmarks/hardening_speed.py``)."""
    from crl_harness.experience.ask import parse_answer_text
    from crl_harness.prompting import parse_answer

    def long(reply: str) -> str:
        return (reply * (65_536 // len(reply) + 1))[:65_536]

    assert parse_answer(long("<think>" + "</think><answer>" * 4_000)).action is None
    assert parse_verdict(long("<answer>" * 8_000)).format_ok is False
    assert parse_answer_text(long("<answer>" * 8_000)) is None
    assert parse_ask(long("<think>" + "</think>" * 8_000)) is None
    assert parse_verdict('<answer>{"verdict": "reject"}</answer><answer>x').verdict == "reject"
    assert parse_verdict("<answer>" + "[" * 100_000 + "</answer>").error  # too deep, no crash


# ------------------------------------------------------------------ search-and-ask
def test_two_asks_are_answered_by_the_extractor_and_a_third_is_refused(tokenizer, manager):
    actor = ScriptedActor(tokenizer, asks=["where do boxes go?", "what blocks a box?", "more?"])
    traj = _play(actor, manager, search_and_ask=True, max_asks=2)
    assert traj.won
    assert [a.status for a in traj.asks] == ["answered", "answered", "refused"]
    extractor = manager.jobs.extractor
    assert len(extractor.prompts) == 2 and "where do boxes go?" in extractor.prompts[0]
    assert LESSON in extractor.prompts[0]  # the entry retrieved for the query
    # Each answer is the next observation, over the unchanged state; the refusal says why.
    assert traj.turns[1].observation.startswith("Answer from the knowledge base:\n"
                                                "Push boxes only onto targets.")
    assert traj.turns[1].observation.endswith(traj.turns[0].observation)
    assert "limit of 2 asks per episode is reached" in traj.turns[3].observation
    # Asks do not move the env and are not invalid actions; the refused one counts as a turn.
    assert traj.invalid_actions == 0 and all(t.reward == 0.0 for t in traj.turns[:3])
    assert traj.steps == len(traj.turns) - 2
    assert all(kw.get("stop") == (ASK_CLOSE,) for kw in actor.kwargs)
    assert "(asked the knowledge base: where do boxes go?)" in traj.transcript


@pytest.mark.parametrize("fail, credit", [(False, 1.0), (True, -1.0)])
def test_an_asks_generation_is_credited_with_the_episode_outcome(tokenizer, manager, fail, credit):
    actor = ScriptedActor(tokenizer, asks=["where do boxes go?"], fail=fail)
    traj = _play(actor, manager, search_and_ask=True,
                 env_kwargs={SOKOBAN: {"max_episode_steps": 4}} if fail else {})
    [ask] = traj.asks
    assert traj.won is not fail and ask.generation_id is not None
    rewards = {g.generation_id: (g.reward, g.kind, g.n_uses) for g in manager.generation_rewards()}
    assert rewards[ask.generation_id] == (credit, "ask", 1)
    assert rewards["writer"][0] == credit  # the entry shown at the start, credited as before


def test_asks_are_offered_to_guided_episodes_only(tokenizer, manager):
    actor = ScriptedActor(tokenizer, asks=["where do boxes go?"])
    free = _play(actor, manager, guided=False, search_and_ask=True,
                 env_kwargs={SOKOBAN: {"max_episode_steps": 3}})
    assert free.asks == [] and free.format_failures == 1  # an ask is no action here
    assert "knowledge_search_and_ask" not in actor.prompts[0][0][0]["content"]


def test_hardening_an_empty_query_is_an_invalid_action(tokenizer, manager):
    actor = ScriptedActor(tokenizer, asks=["   "])
    traj = _play(actor, manager, search_and_ask=True)
    [ask] = traj.asks
    assert ask.status == "empty" and traj.invalid_actions == 1 and traj.steps == len(traj.turns)
    assert traj.turns[1].observation.startswith("Invalid ask")
    assert manager.jobs.extractor.prompts == []


def test_hardening_a_long_query_is_cut_never_sent_whole(tokenizer, manager):
    query = "may a box go into a corner? " + "x" * 5_000 + " END"
    actor = ScriptedActor(tokenizer, asks=[query])
    traj = _play(actor, manager, search_and_ask=True, max_query_chars=200)
    [ask] = traj.asks
    assert ask.cut and len(ask.query) == 200
    [prompt] = manager.jobs.extractor.prompts
    assert ask.query in prompt and "END" not in prompt


def test_hardening_ask_parser_forms():
    assert parse_ask("<think>a</think> <knowledge_search_and_ask> q </knowledge_search_and_ask>\n") \
        == " q "
    # a server that leaves the stop string out of the text: the reply stopped, so it asks
    assert parse_ask("<knowledge_search_and_ask>q", stopped=True) == "q"
    assert parse_ask("<knowledge_search_and_ask>q", stopped=False) is None  # cut by the limit
    assert parse_ask("<think>a</think><answer>up</answer>") is None


def test_hardening_search_and_ask_needs_a_retriever_that_answers(tokenizer):
    with pytest.raises(TypeError, match="ask"):
        RolloutEngine(ScriptedActor(tokenizer), retriever=None, search_and_ask=True)


def test_ask_with_nothing_in_the_partition_answers_so_without_a_generation(tokenizer, manager):
    answer = manager.ask("CRL/MiniHackRoom-v0", "where are the stairs?")
    assert answer.text == NO_KNOWLEDGE and answer.generation_id is None


def test_hardening_malformed_extractor_answer_shows_the_entries_untrained(tokenizer, manager):
    manager.set_extractor(ScriptedExtractor(tokenizer, text="no tags at all"))
    answer = manager.ask(SOKOBAN, "where do boxes go?")
    assert LESSON in answer.text and answer.generation_id is None
    assert manager.stats()["ask_format_failures"] == 1
    assert set(_rewards(manager)) <= {"writer"}


# ------------------------------------------------------------------ what the actor trains on
def test_loss_masks_cover_the_gate_and_ask_replies(tokenizer, manager):
    played = []
    for verdict, fail in ((_verdict("accept"), False), (_verdict("reject"), True)):
        actor = ScriptedActor(tokenizer, verdict, asks=["where do boxes go?"], fail=fail)
        played.append(_play(actor, manager, actor_critic_gate=True, search_and_ask=True,
                            env_kwargs={SOKOBAN: {"max_episode_steps": 4}} if fail else {}))
    assert [t.won for t in played] == [True, False]  # one subgroup, two rewards: A != 0
    rows, _ = actor_rows(played, normalize_std=load_config(None, []).actor.normalize_std)

    def trained_spans(row):
        mask = row.completion_mask or [1] * len(row.completion_ids)
        return [(row.completion_ids, mask)]

    spans = [span for row in rows for span in trained_spans(row)]
    for traj in played:
        replies = [traj.gate.turn] + [t for t in traj.turns if t.ask is not None]
        assert len(replies) == 2
        for turn in replies:
            n = len(turn.token_ids)
            assert any(ids[i:i + n] == turn.token_ids and all(mask[i:i + n])
                       for ids, mask in spans for i in range(len(ids) - n + 1)), turn.text
    assert sum(t.generated_tokens for t in played) == sum(
        sum(m for m in mask) for _, mask in spans)


# ------------------------------------------------------------------ the backend's stop string
def test_hf_backend_stops_at_the_stop_string(tmp_path):
    backend = HFBackend(build_tiny_model(tmp_path / "tiny"))
    prompt = [[{"role": "user", "content": "hi"}]]
    [free] = backend.generate(prompt, max_new_tokens=24, temperature=1.0, seed=3)
    text = backend.tokenizer.decode(free.token_ids[:6], skip_special_tokens=True)
    assert text.strip()
    [stopped] = backend.generate(prompt, max_new_tokens=24, temperature=1.0, seed=3, stop=(text,))
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) <= 6
    assert stopped.token_ids == free.token_ids[:len(stopped.token_ids)]
    assert text in stopped.text


# ------------------------------------------------------------------ the config
def test_switches_reach_the_rollout_engine(tmp_path):
    cfg = load_config(None, ["experience.actor_critic_gate=true", "experience.search_and_ask=true",
                             "experience.max_asks=3", "experience.max_query_chars=300"])
    rollout = RolloutConfig.from_config(cfg)
    use = rollout.experience
    assert (use.actor_critic_gate, use.search_and_ask, use.max_asks,
            use.max_query_chars) == (True, True, 3, 300)
    defaults = load_config(None, []).experience
    assert not defaults.actor_critic_gate and not defaults.search_and_ask


@pytest.mark.parametrize("override, message", [
    ("experience.gate=true", "known keys: k, capacity"),
    ("experience.actor_critic_gate=2", "must be true or false, got 2"),
    ("experience.search_and_ask=maybe", "must be true or false, got 'maybe'"),
    ("experience.max_asks=0", "experience.max_asks"),
    ("experience.max_query_chars=0", "experience.max_query_chars"),
])
def test_hardening_experience_keys_are_checked(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(None, [override])


def test_hardening_switches_need_experience():
    with pytest.raises(ConfigError, match="experience.search_and_ask': needs experience"):
        load_config(None, ["arm=none", "experience.search_and_ask=true"])


def test_hardening_yaml_experience_section_is_checked(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("experience:\n  actor_critic_gate: 1\n")
    with pytest.raises(ConfigError, match="actor_critic_gate': must be true or false"):
        load_config(path)
    path.write_text("experience:\n  search_and_ask_limit: 3\n")
    with pytest.raises(ConfigError, match="experience.search_and_ask_limit.*known keys"):
        load_config(path)


# ------------------------------------------------------------------ the trainer
def test_trainer_runs_both_switches_and_logs_their_metrics(tmp_path):
    """A step with random tiny models: the actor's gate verdicts are malformed (taken as accept,
    counted), its replies rarely ask; the metrics carry the gate rates and asks per episode."""
    from crl_harness.training.metrics import read_metrics

    model = build_tiny_model(tmp_path / "tiny")
    with ExperienceBank(tmp_path / "seed" / "bank.sqlite") as bank:
        bank.add(SOKOBAN, "Corners", LESSON, generation_id="seed")
        bank.export_jsonl(tmp_path / "seed" / "bank.jsonl")
    cfg = load_config(None, [
        f"actor.model=hf:{model}", f"extractor.model=hf:{model}", f"run.output_dir={tmp_path / 'run'}",
        f"experience.initial_bank={tmp_path / 'seed' / 'bank.jsonl'}",
        "tasks.envs.0.id=CRL/Sokoban-v0", "tasks.envs.0.kwargs={max_episode_steps: 2}",
        "tasks.groups_per_step=1", "tasks.group_size=2", "tasks.guided_per_group=1",
        "actor.warmup_steps=0", "actor.max_new_tokens=8", "extractor.max_new_tokens=8",
        "run.steps=1", "run.tensorboard=false", "run.torch_threads=1",
        "experience.actor_critic_gate=true", "experience.search_and_ask=true",
        "experience.min_query_coverage=0"])  # a lesson in words, not one of the level's key
    Trainer(cfg).train()
    [record] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert record["gate/episodes"] == 1 and record["gate/accept_rate"] == 1.0
    assert record["gate/format_failures"] == 1 and record["gate/reject_rate"] == 0.0
    assert record["ask/per_episode"] == 0.0 and record["ask/answered"] == 0
    assert record["gate/entry_credit"] in (1.0, 2.0)  # accept: the episode's score + 1


def test_doctests_of_the_gate_ask_and_credit_modules():
    import doctest

    from crl_harness.experience import ask, credit, gate

    assert all(doctest.testmod(module).failed == 0 for module in (gate, ask, credit))
