"""The text-env contract of docs/design.md, checked on every registered CRL env.

Each env also has its own tests; this file holds what every env must share: gymnasium's
``check_env`` (unwrapped and made), the info keys, deterministic reset, truncation through
TimeLimit, type errors, and 1,000 garbage actions answered as invalid-action steps.
"""

from __future__ import annotations

import random
import warnings

import gymnasium as gym
import pytest
from conftest import skip_without_extra
from gymnasium.spaces import Text
from gymnasium.utils.env_checker import check_env

import crl_envs
from crl_envs.base import MAX_ACTION_LENGTH, MAX_TEXT_LENGTH, TEXT_CHARSET, TextEnv
from crl_envs.errors import UserFacingError

# Envs whose every step runs a real engine process (textworld, a shell): their garbage-action
# sweep is slow, so it runs in the slow group (still in CI).
SLOW_ENVS = {"CRL/ALFWorld-v0", "CRL/SWEBench-v0", "CRL/SWEBenchToy-v0"}


def _params(ids):
    return [pytest.param(i, marks=pytest.mark.slow) if i in SLOW_ENVS else i for i in ids]


def make_or_skip(env_id: str) -> gym.Env:
    """Make and reset ``env_id``; skip only when the machine lacks its data, a Docker daemon or
    the env's optional extra."""
    try:
        env = gym.make(env_id)
        env.reset(seed=0)
    except UserFacingError as err:
        pytest.skip(f"{env_id}: {err}")
    except ImportError as err:
        skip_without_extra(err, env_id)
    return env


def garbage_actions(admissible: list[str] | None, count: int = 1000, seed: int = 0) -> list[str]:
    """Strings a model might write that are not actions: empty, blanks, unicode, 1 MB, look-alikes."""
    rng = random.Random(seed)
    base = admissible or ["north", "up", "click[buy now]", "search[red shoes]", "open fridge 1"]
    fixed = ["", " ", "\n\t  ", "\x00", "None", "[]", "{}", "<answer></answer>", "\u200b",
             "🤖🤖", "ACTION:", "x" * 1_000_000, "ñ" * 1_000_000, "up " * 350_000]
    out = list(fixed)
    alphabet = "abcdefghijklmnopqrstuvwxyz []<>{}()!?.,;:'\"\\/-_=+*&^%$#@~`|0123456789"
    unicode_pool = "éßøπжא中文語日本ü¿¡€™" + "".join(chr(c) for c in range(0x2190, 0x21FF))
    while len(out) < count:
        kind = rng.randrange(5)
        word = rng.choice(base)
        if kind == 0:  # typo: drop, double or swap a character
            i = rng.randrange(len(word))
            word = word[:i] + rng.choice(["", word[i] * 2, rng.choice(alphabet)]) + word[i + 1:]
            out.append(word + rng.choice(["!", "?", ".", "_", "1"]))
        elif kind == 1:  # wrapped in prose
            out.append(rng.choice(["please ", "I will ", "go ", "do: ", "action = "]) + word + " now!")
        elif kind == 2:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60))))
        elif kind == 3:
            out.append("".join(rng.choice(unicode_pool) for _ in range(rng.randrange(1, 40))))
        else:
            out.append(rng.choice(["\n", "\t", " ", "\r"]).join(rng.choice(alphabet) * 3 for _ in range(5)))
    return out


@pytest.mark.parametrize("env_id", crl_envs.ENV_IDS)
def test_registered_with_time_limit(env_id):
    spec = gym.spec(env_id)
    assert spec.max_episode_steps and spec.max_episode_steps > 0
    assert spec.entry_point.startswith("crl_envs.")


@pytest.mark.parametrize("env_id", _params(crl_envs.ENV_IDS))
def test_check_env_unwrapped_and_made(env_id):
    env = make_or_skip(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env.unwrapped, skip_render_check=False)
        check_env(env, skip_render_check=False)
    env.close()


@pytest.mark.parametrize("env_id", _params(crl_envs.ENV_IDS))
def test_info_keys_reset_determinism_and_types(env_id):
    env = make_or_skip(env_id)
    assert isinstance(env.unwrapped, TextEnv)
    assert env.unwrapped.instructions.strip(), "instructions must state the rules"
    obs_a, info = env.reset(seed=123)
    obs_b, _ = env.reset(seed=123)
    assert obs_a == obs_b, "same seed must give the same first observation"
    assert env.observation_space.contains(obs_a)
    for key in TextEnv.INFO_KEYS:
        assert key in info, key
    assert info["env_id"] == env_id and isinstance(info["task"], str) and info["task"]
    assert info["won"] is False and info["action_valid"] is True
    with pytest.raises(TypeError):
        env.step(3)
    with pytest.raises(TypeError):
        env.step(None)
    with pytest.raises(TypeError):
        env.step(b"up")
    env.close()


def test_text_spaces_hold_any_text_and_sample_printable_characters():
    env = gym.make("CRL/Sokoban-v0")
    obs, _ = env.reset(seed=0)
    for text in (obs + "\n\U0001f600\U0001f916", "65x43\xa0cm", "\x00\x1b[0m", "\ud800", ""):
        assert text in env.observation_space and text in env.action_space
    env.action_space.seed(0)
    sample = env.action_space.sample()
    assert sample and all(c.isprintable() or c in "\n\t" for c in sample)
    # a plain Text over the same charset is a different (narrower) space
    assert env.observation_space != Text(MAX_TEXT_LENGTH, min_length=0, charset=TEXT_CHARSET)
    assert env.observation_space == env.unwrapped.observation_space
    assert len(repr(env.observation_space)) < 200
    env.close()


def test_hardening_text_spaces_reject_what_is_not_text_of_allowed_length():
    env = gym.make("CRL/Sokoban-v0")
    env.reset(seed=0)
    for value in (b"up", None, 3, ["up"], "x" * (MAX_ACTION_LENGTH + 1)):
        assert value not in env.action_space
    assert "x" * (MAX_TEXT_LENGTH + 1) not in env.observation_space
    with pytest.raises(TypeError, match="actions are str"):
        env.step(b"\xf0\x9f\x98\x80")
    env.close()


@pytest.mark.parametrize("env_id", _params(crl_envs.ENV_IDS))
def test_garbage_actions_are_invalid_no_op_steps(env_id):
    env = make_or_skip(env_id)
    obs, info = env.reset(seed=7)
    invalid = 0
    actions = garbage_actions(info["admissible_actions"])
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and env.observation_space.contains(obs)
        for key in TextEnv.INFO_KEYS:
            assert key in info
        if not info["action_valid"]:
            invalid += 1
            assert not terminated
            # a no-op earns nothing, except the failure reward of the step that exhausts the
            # budget (ALFWorld's -1)
            assert reward == 0.0 or (truncated and reward == env.unwrapped.failure_reward)
            assert "invalid" in obs.lower() or "nothing happens" in obs.lower(), obs[:300]
            assert len(obs) < 50_000, "an invalid-action message must not echo a huge action"
        if terminated or truncated:
            obs, info = env.reset(seed=7)
    assert invalid >= 0.95 * len(actions), f"only {invalid}/{len(actions)} flagged invalid"
    env.close()


@pytest.mark.parametrize("env_id", _params(crl_envs.ENV_IDS))
def test_running_out_of_steps_truncates(env_id):
    env = make_or_skip(env_id)
    env.reset(seed=1)
    limit = env.spec.max_episode_steps
    for step in range(limit):
        _, _, terminated, truncated, _ = env.step("this is not an action")
        assert not terminated
        assert truncated == (step == limit - 1)
    env.close()


@pytest.mark.parametrize("env_id", _params(crl_envs.ENV_IDS))
def test_render_ansi_returns_the_observation(env_id):
    try:
        env = gym.make(env_id, render_mode="ansi")
        obs, _ = env.reset(seed=3)
    except UserFacingError as err:
        pytest.skip(f"{env_id}: {err}")
    except ImportError as err:
        skip_without_extra(err, env_id)
    assert env.render() == obs
    env.close()


def test_async_vector_env_passes_the_real_text_through_shared_memory():
    """make_vec(..., "async") (shared memory by default) gives each worker's own text, not
    gymnasium's Text padding (a megabyte of newlines)."""
    single = gym.make("CRL/Sokoban-v0")
    expected = [single.reset(seed=seed)[0] for seed in (3, 4)]
    after_step = single.step("up")[0]
    single.close()
    envs = gym.make_vec("CRL/Sokoban-v0", num_envs=2, vectorization_mode="async")
    try:
        observations, infos = envs.reset(seed=3)
        assert list(observations) == expected
        observations, *_ = envs.step(["up", "up"])
        assert observations[1] == after_step and max(map(len, observations)) < 10_000
    finally:
        envs.close()


def test_unicode_text_shared_memory_hardening_keeps_any_text():
    """Empty text, a full-length slot's neighbour, emoji and a lone surrogate survive the trip."""
    from gymnasium.vector.utils import (
        create_shared_memory,
        read_from_shared_memory,
        write_to_shared_memory,
    )

    from crl_envs.base import UnicodeText

    space = UnicodeText(max_length=6, min_length=0, charset="ab")
    memory = create_shared_memory(space, n=3)
    for index, text in enumerate(["", "a\U0001f600\ud800\n", "ab" * 3]):
        write_to_shared_memory(space, index, text, memory)
    assert tuple(read_from_shared_memory(space, memory, n=3)) == ("", "a\U0001f600\ud800\n",
                                                                 "ababab")
    write_to_shared_memory(space, 2, "b", memory)  # a shorter text replaces a longer one
    assert read_from_shared_memory(space, memory, n=3)[2] == "b"
