"""ExperienceAugmentation on every CRL env: check_env through the wrapper, placement, the
experience-free switch, and credit for the writer of a used entry after a real episode (by the
caller: the wrapper reports nothing)."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import crl_envs
from crl_envs.errors import UserFacingError
from crl_envs.oracles import make_oracle, play_episode
from crl_harness.experience import AddEntry, ExperienceBank, ExperienceManager
from crl_wrappers import DEFAULT_HEADER, ExperienceAugmentation
from crl_wrappers.experience import retrieval_query

# Envs that run a real engine process per step (textworld, a shell): slow group (still in CI).
SLOW_ENVS = {"CRL/ALFWorld-v0", "CRL/SWEBench-v0", "CRL/SWEBenchToy-v0"}
PARAMS = [pytest.param(i, marks=pytest.mark.slow) if i in SLOW_ENVS else i
          for i in crl_envs.ENV_IDS]


def make_or_skip(env_id: str) -> gym.Env:
    """Make and reset ``env_id``; skip only when this machine lacks its data or Docker."""
    try:
        env = gym.make(env_id)
        env.reset(seed=0)
    except UserFacingError as err:
        pytest.skip(f"{env_id}: {err}")
    except Exception as err:
        if "docker" in str(err).lower():
            pytest.skip(f"{env_id} needs a Docker daemon: {err}")
        raise
    return env


@pytest.fixture
def manager(tmp_path):
    with ExperienceBank(tmp_path / "bank.sqlite") as bank, ExperienceManager(bank) as manager:
        yield manager


def seed_bank(manager: ExperienceManager, env_id: str, task: str) -> str:
    """One entry that matches ``task`` (the env's retrieval query), written by a registered
    extractor generation."""
    manager.ledger.register("gen-under-test", "the extractor's prompt", "its output", "distill")
    result = manager.apply([
        AddEntry(env_id, "Lesson", f"About: {task}", generation_id="gen-under-test"),
        AddEntry("CRL/Other-v0", "Elsewhere", f"About: {task}"),  # another partition
    ])
    assert manager.flush(timeout=60)
    return result.added[0].id


@pytest.mark.parametrize("env_id", PARAMS)
def test_check_env_and_placement(env_id, manager):
    env = make_or_skip(env_id)
    _, info = env.reset(seed=0)
    key = retrieval_query("", info)
    entry_id = seed_bank(manager, env_id, key)
    wrapped = ExperienceAugmentation(env, manager, k=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(wrapped, skip_render_check=True)

    obs, info = wrapped.reset(seed=0)
    assert info["experience_ids"] == [entry_id]  # only this env's partition
    assert info["experience"] == f"- Lesson: About: {key}"
    assert obs.startswith(f"{DEFAULT_HEADER}\n{info['experience']}\n\n")
    assert wrapped.observation_space.contains(obs)

    plain_obs, plain_info = wrapped.reset(seed=0, options={"use_experience": False})
    assert plain_info["experience"] == "" and plain_info["experience_ids"] == []
    assert obs.endswith(plain_obs)

    by_instructions = ExperienceAugmentation(env, manager, placement="instructions")
    obs, info = by_instructions.reset(seed=0)
    assert obs == plain_obs
    assert info["instructions"].endswith(f"{DEFAULT_HEADER}\n{info['experience']}")
    assert info["instructions"].startswith(env.unwrapped.instructions)
    wrapped.close()


@pytest.mark.parametrize("env_id", PARAMS)
def test_episode_end_reports_nothing_and_the_caller_credits_the_writer(env_id, manager):
    """The wrapper reports no outcome; whoever plays the episode credits the ids the reset
    gave with the outcome score (docs/experience.md, "Credit and schedule")."""
    env = make_or_skip(env_id)
    _, info = env.reset(seed=3)
    key = retrieval_query("", info)
    seed_bank(manager, env_id, key)
    # Instructions placement: the oracle reads the observation, which stays the env's own.
    wrapped = ExperienceAugmentation(env, manager, placement="instructions")
    episode = play_episode(wrapped, make_oracle(env_id, wrapped), seed=3)
    assert manager.drain_generation_rewards() == []  # the episode ended: nothing reported
    _, reset_info = wrapped.reset(seed=3)
    info = episode.info
    score = 1.0 if info["won"] else info["score"]
    manager.report_outcome(reset_info["experience_ids"], score, env_id=env_id, query=key)
    [reward] = manager.drain_generation_rewards()
    expected = score if score > 0 else -1.0
    assert (reward.generation_id, reward.n_uses, reward.reward) == ("gen-under-test", 1, expected)
    wrapped.close()


def test_bad_arguments(manager):
    env = gym.make("CRL/MiniHackRoom-v0")
    with pytest.raises(ValueError, match="placement"):
        ExperienceAugmentation(env, manager, placement="system")
    with pytest.raises(TypeError, match="retrieve"):
        ExperienceAugmentation(env, object())
    env.close()


class _NarrowEnv(gym.Env[str, str]):
    """A text env with a short, alphanumeric observation space (gymnasium's default charset)."""

    observation_space = gym.spaces.Text(max_length=40)
    action_space = gym.spaces.Text(max_length=8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {"task": "go", "env_id": "Narrow-v0"}

    def step(self, action):
        return "done", 0.0, True, False, {}


class _ModelText:
    """A retriever whose entries carry what a model may write: emoji, control bytes, length."""

    def retrieve(self, env_id, query, k):
        class Item:
            id, text = "e1", "Jump \U0001f600 twice\x00\n" + "very long advice " * 20
        return [Item()]


def test_hardening_wrapper_stays_in_the_observation_space():
    wrapped = ExperienceAugmentation(_NarrowEnv(), _ModelText())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(wrapped, skip_render_check=True)
    assert not [w for w in caught if "not within the observation space" in str(w.message)]
    obs, info = wrapped.reset(seed=0)
    assert wrapped.observation_space.contains(obs) and obs.endswith("start")
    assert obs.startswith("Distilled") and "\U0001f600" in info["experience"]  # info keeps it
    # The CRL envs' own space takes any character: the retrieved text arrives as written.
    env = ExperienceAugmentation(gym.make("CRL/Sokoban-v0"), _ModelText())
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs) and "\ufffd" not in obs
    assert obs.startswith(f"Distilled knowledge from earlier experience:\n{info['experience']}")
    env.close()


class RecordingRetriever:
    """Records every query; retrieves nothing."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def retrieve(self, env_id: str, query: str, k: int) -> list:
        self.queries.append(query)
        return []


@pytest.mark.parametrize("env_id", PARAMS)
def test_retrieval_key_when_given_else_task_text(env_id):
    """The env's key of the level is the query where it gives one (MiniHack, Sokoban: levels
    share one task text), else the task text, never the whole first observation."""
    env = make_or_skip(env_id)
    recorder = RecordingRetriever()
    wrapped = ExperienceAugmentation(env, recorder)
    observation, info = wrapped.reset(seed=1)
    key = info.get("retrieval_query")
    if env_id.startswith("CRL/MiniHack") or env_id == "CRL/Sokoban-v0":
        assert key and key != info["task"]
    assert recorder.queries == [key or info["task"]]
    assert observation not in recorder.queries
    wrapped.close()


def test_minihack_key_tells_levels_apart():
    """Two dark-room levels that start on the same cell but see different things have different
    keys; the key stays the level's for the whole episode."""
    env = gym.make("CRL/MiniHackRoom-v0", variant="dark")
    try:
        keys: dict[str, set[str]] = {}
        for seed in range(40):
            _, info = env.reset(seed=seed)
            start = info["retrieval_query"].split(";")[0]
            keys.setdefault(start, set()).add(info["retrieval_query"])
        assert any(len(seen) > 1 for seen in keys.values())
        _, info = env.reset(seed=0)
        key = info["retrieval_query"]
        for action in ("north", "east", "south"):
            *_, info = env.step(action)
            assert info["retrieval_query"] == key
    finally:
        env.close()
