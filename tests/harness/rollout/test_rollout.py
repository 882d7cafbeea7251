"""The rollout engine on real envs: batching, masks, format failures, experience, wins."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_envs.sokoban.oracle import SokobanOracle  # noqa: E402
from crl_harness.agents import ModelAgent, run_episode  # noqa: E402
from crl_harness.experience import EpisodeOutcome, credit_episodes  # noqa: E402
from crl_harness.models import Generation, HFBackend  # noqa: E402
from crl_harness.models.tiny import build_tiny_model  # noqa: E402
from crl_harness.prompting import EXPERIENCE_HEADER, system_prompt  # noqa: E402
from crl_harness.rollout import (  # noqa: E402
    EpisodeSpec,
    LiveEpisode,
    RolloutConfig,
    RolloutEngine,
    make_env,
)

torch.set_num_threads(1)
SOKOBAN = "CRL/Sokoban-v0"
SHORT = {SOKOBAN: {"max_episode_steps": 6}}  # 6 turns instead of 30: fast, same code paths


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return HFBackend(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


class CountingBackend:
    """Wraps a backend and records the batch size of every generate call."""

    def __init__(self, inner):
        self.inner, self.batches, self.prompts = inner, [], []
        self.name, self.max_context = inner.name, inner.max_context

    def generate(self, prompts, **kwargs):
        self.batches.append(len(prompts))
        self.prompts.append(prompts)
        return self.inner.generate(prompts, **kwargs)

    def count_tokens(self, messages):
        return self.inner.count_tokens(messages)


class SokobanSolverBackend:
    """Test double of a perfect model: answers each prompt with the Sokoban oracle's move.

    It reads the grid from the last user message, exactly the text a model would see, so the
    engine's win path (env reward, ``won``, termination, batching of finished episodes) is
    exercised for real; the tiny-model tests cover the real generation path.
    """

    name, max_context = "solver", 100_000

    def __init__(self, malformed_first: bool = False):
        self.malformed_first, self.calls = malformed_first, 0

    def count_tokens(self, messages):
        return 0

    def generate(self, prompts, **kwargs):
        self.calls += 1
        out = []
        for messages in prompts:
            observation = messages[-1]["content"].split("\n\n")[-1]
            if self.malformed_first and self.calls == 1:
                text = "east"
            else:
                text = f"<think>plan</think><answer>{SokobanOracle().act(observation, {})}</answer>"
            out.append(Generation(text, [1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], "stop"))
        return out


def test_batches_every_live_episode_into_one_generate_call(tiny):
    backend = CountingBackend(tiny)
    engine = RolloutEngine(backend, max_new_tokens=6, seed=0, format_penalty=-0.1,
                           env_kwargs=SHORT)
    specs = [EpisodeSpec(SOKOBAN, seed=s, group_id=s // 2) for s in range(5)]
    trajectories = engine.run(specs)
    assert [(t.env_id, t.seed, t.group_id) for t in trajectories] == \
        [(s.env_id, s.seed, s.group_id) for s in specs]
    # The random tiny model never writes the answer format: every turn is a format failure, the
    # env never moves, and each episode ends at the step limit.
    assert backend.batches == [5] * 6
    for traj in trajectories:
        assert traj.steps == len(traj.turns) == 6 == traj.format_failures == traj.invalid_actions
        assert traj.reward == pytest.approx(6 * -0.1) and not traj.won and traj.truncated
        assert traj.task and traj.task_id == f"{SOKOBAN}:{traj.seed}"
        assert "[Outcome] failure" in traj.transcript
        for turn in traj.turns:
            assert not turn.format_ok and turn.action is None
            assert len(turn.input_ids) == len(turn.loss_mask)
            assert sum(turn.loss_mask) == len(turn.token_ids) == len(turn.logprobs) <= 6
            assert turn.loss_mask == [0] * len(turn.prompt_token_ids) + [1] * len(turn.token_ids)
            assert turn.input_ids[:len(turn.prompt_token_ids)] == turn.prompt_token_ids
    # Later prompts carry the history and the format error; the first holds the env rules.
    first, later = backend.prompts[0][0], backend.prompts[2][0]
    assert first[0]["role"] == "system" and "<answer>" in first[0]["content"]
    assert len(later) == len(first) + 4 and later[-1]["content"].startswith("Invalid format")
    engine.close()


def test_max_live_caps_the_batch_and_envs_are_reused(tiny):
    backend = CountingBackend(tiny)
    engine = RolloutEngine(backend, max_new_tokens=2, max_live=2, seed=0, history=0,
                           env_kwargs=SHORT)
    trajectories = engine.run([EpisodeSpec(SOKOBAN, seed=s) for s in range(3)])
    assert max(backend.batches) == 2 and sum(backend.batches) == 3 * 6
    assert len(engine._free_envs[SOKOBAN]) == 2  # the third episode reused a finished env
    assert all(len(p) == 2 for batch in backend.prompts for p in batch)  # history=0
    assert [t.seed for t in trajectories] == [0, 1, 2]
    engine.close()


def test_truncated_generations_keep_exact_masks(tiny):
    engine = RolloutEngine(tiny, max_new_tokens=3, seed=1, env_kwargs=SHORT)
    [traj] = engine.run([EpisodeSpec(SOKOBAN, seed=0)])
    for turn in traj.turns:
        assert turn.finish_reason in ("length", "stop")
        if turn.finish_reason == "length":
            assert len(turn.token_ids) == 3
        assert turn.loss_mask.count(1) == len(turn.token_ids)
    engine.close()


def test_a_perfect_policy_wins_every_episode():
    engine = RolloutEngine(SokobanSolverBackend(), format_penalty=-0.5)
    trajectories = engine.run([EpisodeSpec(SOKOBAN, seed=s) for s in range(4)])
    for traj in trajectories:
        assert traj.won and traj.terminated and not traj.truncated
        assert traj.reward == pytest.approx(1.0) and traj.format_failures == 0
        assert traj.turns[-1].reward == 1.0 and all(t.action_valid for t in traj.turns)
        assert "[Outcome] success" in traj.transcript
        # the level by its key, and the moves in one line: what a lesson about it copies
        assert traj.retrieval_key and f"Level: {traj.retrieval_key}\n" in traj.transcript
        moves = ", ".join(t.action for t in traj.turns)
        assert f"[Moves played] {moves}\n[Outcome]" in traj.transcript
    engine.close()


def test_a_format_failure_is_a_counted_no_op_with_the_penalty():
    engine = RolloutEngine(SokobanSolverBackend(malformed_first=True), format_penalty=-0.5)
    [traj] = engine.run([EpisodeSpec(SOKOBAN, seed=2)])
    assert traj.won and traj.format_failures == 1 and traj.invalid_actions == 1
    # the env did not step: its reward is 0, the penalty is the rollout's, recorded apart
    assert not traj.turns[0].format_ok and traj.turns[0].reward == 0.0
    assert traj.turns[0].format_penalty == -0.5 and traj.turns[-1].reward == 1.0
    assert traj.turns[1].observation.startswith("Invalid format")
    assert traj.reward == pytest.approx(1.0 - 0.5)
    assert traj.reward == pytest.approx(sum(t.reward + t.format_penalty for t in traj.turns))
    engine.close()


class Tips:
    """A retriever with one entry per env that records outcome reports (an ``OutcomeSink``, as
    the manager is for a step's credit)."""

    def __init__(self):
        self.reports = []

    def retrieve(self, env_id, query, k):
        class Item:
            id, text = "tip-1", "Never push a box into a corner."
        return [Item()]

    def report_outcome(self, ids, score, critic=None, baseline=None, env_id="", query=""):
        self.reports.append((ids, score))


def test_experience_goes_into_the_system_prompt_of_guided_episodes_only(tiny):
    backend, tips = CountingBackend(tiny), Tips()
    engine = RolloutEngine(backend, retriever=tips, max_new_tokens=2, seed=0,
                           env_kwargs=SHORT)
    guided, free = engine.run([EpisodeSpec(SOKOBAN, 0, use_experience=True),
                               EpisodeSpec(SOKOBAN, 0, use_experience=False)])
    system_guided, system_free = (p[0]["content"] for p in backend.prompts[0])
    assert "Never push a box into a corner." in system_guided
    assert system_guided.count("Never push a box") == 1
    assert "Never push a box" not in system_free and EXPERIENCE_HEADER not in system_free
    assert guided.experience_ids == ["tip-1"] and free.experience_ids == []
    assert tips.reports == []  # neither the engine nor its wrappers report: the trainer credits
    credit_episodes(tips, [EpisodeOutcome.of(guided), EpisodeOutcome.of(free)])
    assert tips.reports == [(["tip-1"], 0.0)]  # the failed guided episode is credited once
    engine.close()


def test_the_episode_system_prompt_is_the_wrappers_rendering_of_the_experience():
    """``LiveEpisode`` places the experience it is given after the env's instructions exactly as
    ``ExperienceAugmentation(placement="instructions")`` shows it; nothing is stripped."""
    import gymnasium as gym

    from crl_wrappers.experience import ExperienceAugmentation

    wrapped = ExperienceAugmentation(gym.make(SOKOBAN), Tips(), placement="instructions")
    observation, info = wrapped.reset(seed=0)
    episode = LiveEpisode(EpisodeSpec(SOKOBAN, 0, use_experience=True),
                          make_env(SOKOBAN, Tips()), history=None)
    episode.reset(with_experience_option=True)
    assert episode.experience == info["experience"] == "- Never push a box into a corner."
    assert episode.instructions == episode.env.unwrapped.instructions  # as the env wrote them
    assert episode.state == observation  # the observation is the env's own
    task = "" if info["task"] in observation else info["task"]
    assert episode.conversation.system == system_prompt(info["instructions"], task=task)
    episode.env.close()
    wrapped.close()


def test_model_agent_plays_step_by_step(tiny):
    import gymnasium as gym

    env = gym.make(SOKOBAN, max_episode_steps=5)
    agent = ModelAgent(tiny, RolloutConfig.from_config(None, max_new_tokens=4, seed=0))
    traj = run_episode(env, agent, EpisodeSpec(SOKOBAN, seed=1))
    assert traj.steps == 5 and traj.format_failures == 5 and not traj.won and traj.truncated
    env.close()


@pytest.mark.parametrize("placement", ["observation", "instructions", "info"])
def test_model_agent_shows_the_experience_once_wherever_the_wrapper_placed_it(tiny, placement):
    from types import SimpleNamespace

    from crl_harness.rollout import make_env

    class OneLesson:
        def retrieve(self, env_id, query, k):
            return [SimpleNamespace(id="e1", text="Push boxes away from corners.")]

    env = make_env(SOKOBAN, OneLesson(), placement=placement, max_episode_steps=1)
    observation, info = env.reset(seed=1)
    agent = ModelAgent(tiny, RolloutConfig.from_config(None, max_new_tokens=4, seed=0))
    agent.reset(observation, info)
    shown = agent.conversation.system + observation
    assert shown.count("Push boxes away from corners.") == 1
    env.close()
