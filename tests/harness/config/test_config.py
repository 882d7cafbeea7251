"""Training configs: every shipped YAML loads, overrides apply, errors name the bad key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from crl_harness.cli import main
from crl_harness.config import (
    ConfigError,
    check_lora_fits,
    config_dir,
    load_config,
    updated_lesson_steps,
)

SHIPPED = sorted(p.stem for p in config_dir().glob("*.yaml"))


def test_every_env_and_both_mixtures_have_a_config():
    expected = {"minihack-room", "minihack-maze", "minihack-keyroom", "minihack-river", "sokoban",
                "webshop", "alfworld", "swebench", "mix3", "mix6", "cpu-demo"}
    assert expected <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_loads(name):
    cfg = load_config(name)
    assert cfg.name == name
    assert cfg.tasks.envs


def test_mixtures_hold_the_papers_envs_and_settings():
    mix3, mix6 = load_config("mix3"), load_config("mix6")
    assert [e.id for e in mix3.tasks.envs] == [
        "CRL/MiniHackRoom-v0", "CRL/WebShop-v0", "CRL/ALFWorld-v0"]
    assert [e.id for e in mix6.tasks.envs][3:] == [
        "CRL/MiniHackMaze-v0", "CRL/MiniHackKeyRoom-v0", "CRL/Sokoban-v0"]
    t, a, x = mix6.tasks, mix6.actor, mix6.extractor
    assert (t.group_size, t.guided_per_group, t.groups_per_step) == (8, 4, 16)
    assert (a.clip_eps, a.warmup_steps, a.lr, a.normalize_std) == (0.2, 5, 1e-6, False)
    assert (x.eps_low, x.eps_high, x.train_after) == (0.1, 0.1, 64)
    assert mix6.experience.merge_every == 5 and mix6.run.steps == 512


@pytest.mark.parametrize("arm", ["co-evolve", "static", "none"])
def test_the_three_arms_are_one_switch(arm):
    cfg = load_config("cpu-demo", [f"arm={arm}"])
    assert cfg.arm == arm
    assert cfg.uses_experience == (arm != "none")
    assert cfg.trains_extractor == (arm == "co-evolve")


def test_overrides_reach_nested_and_list_keys():
    cfg = load_config("mix3", ["run.steps=7", "tasks.envs.1.weight=2.5", "actor.lora.enabled=true"])
    assert cfg.run.steps == 7 and cfg.tasks.envs[1].weight == 2.5 and cfg.actor.lora.enabled
    assert cfg.run.output_dir == "runs/mix3"


@pytest.mark.parametrize("override, key", [
    (["actor.lrr=1"], "actor.lrr"),
    (["actor.lr=fast"], "actor.lr"),
    (["arm=both"], "arm"),
    (["tasks.envs.0.id=CRL/Chess-v0"], "tasks.envs.0.id"),
    (["tasks.guided_per_group=9"], "tasks.guided_per_group"),
    (["run.steps=0"], "run.steps"),
    (["actor.kv_cache_tokens=0"], "actor.kv_cache_tokens"),
    (["nonsense.key=1"], "nonsense"),
])
def test_errors_name_the_bad_key(override, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_config("cpu-demo", override)


def test_bad_file_and_bad_override_syntax(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor:\n  temperature: 1.0\n  warmup: 3\n")
    with pytest.raises(ConfigError, match="'actor.warmup'"):
        load_config(bad)
    with pytest.raises(ConfigError, match="key=value"):
        load_config("cpu-demo", ["run.steps"])


def test_crl_train_reports_a_config_error(capsys):
    assert main(["train", "cpu-demo", "actor.lrr=1"]) == 2
    assert "actor.lrr" in capsys.readouterr().err


def test_precision_and_extractor_reward_defaults_follow_the_paper():
    cfg = load_config("mix6")
    assert cfg.actor.dtype == cfg.extractor.dtype == "auto"
    assert cfg.actor.recompute_old_logprobs is None  # auto: on unless the model runs in fp32
    assert cfg.extractor.repeat_by_uses is False and cfg.extractor.format_penalty is None
    cfg = load_config("cpu-demo", ["actor.dtype=bfloat16", "extractor.dtype=float16",
                                   "actor.recompute_old_logprobs=false",
                                   "extractor.format_penalty=-1"])
    assert (cfg.actor.dtype, cfg.extractor.dtype) == ("bfloat16", "float16")
    assert cfg.actor.recompute_old_logprobs is False and cfg.extractor.format_penalty == -1.0
    with pytest.raises(ConfigError, match="'actor.dtype'"):
        load_config("cpu-demo", ["actor.dtype=bf16"])


@pytest.mark.parametrize(("native", "cuda", "dtype"), [
    (True, False, "bfloat16"), (False, False, "float32"), (False, True, "bfloat16")])
def test_bf16_if_native_is_the_dtype_this_machine_runs_once_the_config_loads(
        monkeypatch, native, cuda, dtype):
    """The CPU configs ask for bf16 only where it is native (an emulated bf16 ran a forward pass
    4-6x slower than fp32): every reader, a run's config.json included, sees the dtype that
    runs, and ``crl train cpu-demo`` needs no setting on a CPU without AVX512-BF16 or AMX."""
    from crl_harness.config import config_to_dict
    from crl_harness.models import hf_loading

    monkeypatch.setattr(hf_loading, "cpu_computes_bf16", lambda: native)
    monkeypatch.setattr("torch.cuda.is_available", lambda: cuda)
    for name in ("cpu-demo", "mix3-cpu", "mix6-cpu"):
        cfg = load_config(name)
        assert (cfg.actor.dtype, cfg.extractor.dtype) == (dtype, dtype), name
        assert config_to_dict(cfg)["actor"]["dtype"] == dtype
    assert load_config("mix3-cpu").warmstart.dtype == dtype
    forced = load_config("cpu-demo", ["actor.dtype=float32", "warmstart.dtype=bfloat16-if-native"])
    assert (forced.actor.dtype, forced.warmstart.dtype) == ("float32", dtype)


def test_hardening_a_dtype_outside_the_list_names_the_values():
    with pytest.raises(ConfigError, match="bfloat16-if-native"):
        load_config("cpu-demo", ["actor.dtype=bf16-native"])


@pytest.mark.parametrize("override, key", [
    (["actor.model=vllm:/models/qwen"], "actor.model"),
    (["actor.model=openai:http://localhost:8000/v1#qwen"], "actor.model"),
    (["extractor.model=vllm:/models/qwen"], "extractor.model"),
])
def test_hardening_models_the_trainer_cannot_update_are_rejected_at_load(override, key):
    with pytest.raises(ConfigError, match=f"'{key}'.*cannot be trained.*hf:NAME_OR_PATH"):
        load_config("cpu-demo", override)


def test_hardening_a_frozen_extractor_may_be_served_by_vllm():
    cfg = load_config("cpu-demo", ["arm=static", "extractor.model=vllm:/models/qwen"])
    assert cfg.extractor.model == "vllm:/models/qwen"


_ALIAS_BOMB = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a bomb must not take the host
    from crl_harness.config import ConfigError, load_config
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    try:
        load_config(None, ["tasks.envs.0.kwargs={" + ", ".join(levels) + "}"])
    except ConfigError as err:
        print(err)
""")


def test_hardening_override_alias_bomb_is_refused():
    """Nine nested aliases are 10^9 nodes once expanded: refused in a moment, in bounded
    memory (run in a child with a memory cap and a deadline, so a regression fails, not hangs)."""
    done = subprocess.run([sys.executable, "-c", _ALIAS_BOMB], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0 and "aliases" in done.stdout, done.stderr[-2000:]
    with pytest.raises(ConfigError, match="nests deeper"):
        load_config(None, ["name=" + "[" * 200 + "]" * 200])
    with pytest.raises(ConfigError, match="at most 10000"):
        load_config(None, ["name=" + "x" * 20_000])
    assert load_config(None, ["tasks.envs.0.kwargs={variant: dark}"]).tasks.envs[0].kwargs == {
        "variant": "dark"}


def test_hardening_top_p_zero_keeps_the_most_likely_token_and_the_config_wants_0_to_1():
    import torch

    from crl_harness.models.hf import sample_next_token

    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    tokens, logps = sample_next_token(logits, temperature=1.0, top_p=0.0)
    assert tokens.tolist() == [1, 0] and logps.tolist() == [0.0, 0.0]  # the nucleus of one
    for override in ("actor.top_p=0", "actor.top_p=-1", "extractor.top_p=7",
                     "extractor.top_p=.nan"):
        with pytest.raises(ConfigError, match=f"'{override.split('=')[0]}'"):
            load_config("cpu-demo", [override])
    assert load_config("cpu-demo", ["actor.top_p=0.9"]).actor.top_p == 0.9


@pytest.mark.parametrize("override, key", [
    ("run.seed=-1", "run.seed"), ("run.seed=4294967296", "run.seed"),
    ("actor.lr=.nan", "actor.lr"), ("extractor.lr=.inf", "extractor.lr"),
    ("warmstart.lr=.nan", "warmstart.lr"), ("actor.temperature=.inf", "actor.temperature"),
    ("actor.clip_eps=.nan", "actor.clip_eps"), ("extractor.eps_high=.inf", "extractor.eps_high"),
    ("actor.max_grad_norm=.nan", "actor.max_grad_norm"),
    ("extractor.max_grad_norm=0", "extractor.max_grad_norm"),
    ("tasks.envs.0.weight=.inf", "tasks.envs.0.weight"),
    ("actor.format_penalty=.nan", "actor.format_penalty"),
    ("extractor.format_penalty=-.inf", "extractor.format_penalty"),
    ("actor.lora.r=0", "actor.lora.r"), ("extractor.lora.r=-4", "extractor.lora.r"),
    ("actor.lora.dropout=1.5", "actor.lora.dropout"), ("actor.lora.alpha=0", "actor.lora.alpha"),
    ("extractor.lora.target_modules=[]", "extractor.lora.target_modules"),
    ("tasks.envs.0.kwargs={varient: dark}", "tasks.envs.0.kwargs"),
    ("tasks.envs.0.kwargs={max_episode_steps: 0}", "tasks.envs.0.kwargs"),
    ("tasks.envs.0.kwargs={variant: no-such-variant}", "tasks.envs.0.kwargs"),
    ("warmstart.seed_offset=-3", "warmstart.seed_offset"),
    ("experience.k=1000000000", "experience.k"),
    ("run.torch_threads=100000", "run.torch_threads"),
    ("extractor.kv_cache_tokens=0", "extractor.kv_cache_tokens"),
    ("extractor.kv_cache_tokens=many", "extractor.kv_cache_tokens"),
])
def test_hardening_values_that_would_crash_after_the_models_load_are_config_errors(override, key):
    with pytest.raises(ConfigError, match=f"bad config key '{key}'"):
        load_config("cpu-demo", [override])


def test_hardening_lora_that_does_not_fit_the_model_is_a_config_error_before_it_loads(
        tmp_path, capsys):
    from crl_harness.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")  # 2 layers
    for override, key in (("actor.lora.target_modules=[q_proj, no_such_proj]",
                           "actor.lora.target_modules"),
                          ("actor.lora.top_layers=3", "actor.lora.top_layers")):
        assert main(["train", "cpu-demo", f"actor.model=hf:{model}", "actor.lora.enabled=true",
                     "actor.lora.init_from=null", override, f"run.output_dir={tmp_path / 'run'}", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"bad config key '{key}'" in err and "Traceback" not in err
        assert not (tmp_path / "run" / "config.json").exists()  # refused before the run began


@pytest.mark.parametrize("override, key", [
    ("experience.count_penalty=-0.1", "experience.count_penalty"),
    ("experience.demotion_prob=1.5", "experience.demotion_prob"),
    ("experience.demotion_prob=-1", "experience.demotion_prob"),
    ("experience.recency_window_s=-300", "experience.recency_window_s"),
    ("experience.candidates=0", "experience.candidates"),
    ("experience.credit=shared", "experience.credit"),
    ("tasks.seeds=[]", "tasks.seeds"),
    ("tasks.seeds=[3, 5, 3]", "tasks.seeds"),
    ("tasks.seeds=[-2]", "tasks.seeds"),
    ("tasks.seeds=[1, 50000003]", "tasks.seeds"),   # a held-out level
    ("tasks.seeds=[10000001]", "tasks.seeds"),      # a warm-start level
    ("tasks.seeds=[one, two]", "tasks.seeds"),
])
def test_hardening_bad_retrieval_credit_and_pool_settings_are_one_config_error(override, key):
    with pytest.raises(ConfigError, match=f"bad config key '{key}") as err:
        load_config("cpu-demo", [override])
    assert "\n" not in str(err.value)


def test_explicit_training_seeds_replace_the_range():
    cfg = load_config("cpu-demo", ["tasks.seeds=[0, 5, 9]"])
    assert list(cfg.tasks.training_seeds()) == [0, 5, 9]
    assert load_config(None).tasks.training_seeds() == range(0, 1_000_000)
    assert len(set(load_config("cpu-demo").tasks.training_seeds())) == 32  # its pool


def test_updated_lessons_are_retrieved_in_two_steps_of_cpu_demo():
    """The extractor's first update can come at step 2 of cpu-demo (step 1 fills the bank, step
    2 retrieves and credits); what it writes after is retrieved from step 4 on (5 of 8 steps)."""
    cfg = load_config("cpu-demo")
    assert updated_lesson_steps(cfg) == 5
    assert updated_lesson_steps(load_config("cpu-demo", ["run.steps=5"])) == 2
    # train_after waits for generations from several steps: 32 at 16 a step take two
    assert updated_lesson_steps(load_config("cpu-demo", ["extractor.train_after=32",
                                                         "run.steps=5"])) == 1
    assert updated_lesson_steps(load_config("cpu-demo", [
        "experience.retrieval_warmup_steps=3", "run.steps=4"])) == 0
    # the lessons wait for the retrieval warm-up, not the actor's
    assert updated_lesson_steps(load_config("cpu-demo", [
        "actor.warmup_steps=3", "experience.retrieval_warmup_steps=1", "run.steps=4"])) == 1


def test_retrieval_warmup_follows_the_actor_warmup_unless_set():
    cfg = load_config(None, ["actor.warmup_steps=1"])
    assert cfg.experience.retrieval_warmup_steps is None
    assert (cfg.actor_warmup, cfg.retrieval_warmup) == (1, 1)
    cfg = load_config(None, ["actor.warmup_steps=0", "experience.retrieval_warmup_steps=2"])
    assert (cfg.actor_warmup, cfg.retrieval_warmup) == (0, 2)
    # arm none has no bank to wait for: its actor is never frozen
    assert load_config("cpu-demo", ["arm=none", "actor.warmup_steps=3"]).actor_warmup == 0


@pytest.mark.parametrize("override, key", [
    ("experience.retrieval_warmup_steps=-1", "experience.retrieval_warmup_steps"),
    ("experience.retrieval_warmup_steps=two", "experience.retrieval_warmup_steps"),
    ("actor.warmup_steps=-2", "actor.warmup_steps"),
    ("tasks.envs.0.kwargs={penalty_step: -2}", "tasks.envs.0.kwargs"),
    ("tasks.envs.0.kwargs={penalty_step: 0.05}", "tasks.envs.0.kwargs"),
])
def test_hardening_bad_warmup_and_wall_penalty_are_one_config_error(override, key):
    with pytest.raises(ConfigError, match=f"bad config key '{key}'") as err:
        load_config("cpu-demo", [override])
    assert "\n" not in str(err.value)


def test_a_signal_shape_is_expressible_by_config():
    """Issue 32's training shape: 32 episodes a step in groups of 8 (4 guided + 4 free), no std
    division, a wall penalty that breaks ties (-0.05), the actor trained from step 1."""
    shape = ["tasks.groups_per_step=4", "tasks.group_size=8", "tasks.guided_per_group=4",
             "actor.normalize_std=false", "actor.warmup_steps=0",
             "experience.retrieval_warmup_steps=1",
             "tasks.envs.0.kwargs={variant: dark, max_episode_steps: 6, penalty_step: -0.05}"]
    cfg = load_config("cpu-demo", shape)
    t = cfg.tasks
    assert (t.groups_per_step * t.group_size, t.group_size, t.guided_per_group) == (32, 8, 4)
    assert t.envs[0].kwargs["penalty_step"] == -0.05 and not cfg.actor.normalize_std
    assert (cfg.actor_warmup, cfg.retrieval_warmup) == (0, 1)


def _adapter_folder(folder: Path, base: str) -> Path:
    """What the config checks of an adapter folder: peft's config naming the base, weights."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(f'{{"base_model_name_or_path": "{base}"}}')
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def test_cpu_demo_continues_its_warm_starts_adapters_on_their_base():
    cfg = load_config("cpu-demo")
    assert (cfg.actor.model, cfg.extractor.model) == ("hf:smollm2-135m",) * 2
    assert cfg.actor.lora.init_from == "assets/warmstart/cpu-demo/actor"
    assert cfg.extractor.lora.init_from == "assets/warmstart/cpu-demo/extractor"
    assert cfg.starting_model("extractor") == "hf:assets/warmstart/cpu-demo/extractor"
    # they follow the warm start: its base and its output folder
    cfg = load_config("cpu-demo", ["warmstart.output_dir=/elsewhere", "warmstart.model=hf:tiny"])
    assert (cfg.actor.model, cfg.actor.lora.init_from) == ("hf:tiny", "/elsewhere/actor")


def test_hardening_a_warm_start_not_yet_made_loads_and_train_asks_for_it(tmp_path, capsys):
    cfg = load_config("cpu-demo", [f"warmstart.output_dir={tmp_path / 'w'}"])
    with pytest.raises(ConfigError, match="does not exist yet; `crl warmstart cpu-demo` writes"):
        check_lora_fits(cfg, ("actor", "extractor"))
    assert main(["train", "cpu-demo", f"warmstart.output_dir={tmp_path / 'w'}",
                 f"run.output_dir={tmp_path / 'run'}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "crl warmstart cpu-demo" in line and not (tmp_path / "run").exists()


def test_hardening_lora_init_from_that_cannot_continue_is_one_config_error(tmp_path):
    base, other = tmp_path / "base", tmp_path / "other"
    base.mkdir()
    other.mkdir()
    adapter = _adapter_folder(tmp_path / "adapter", str(base))
    on = ["actor.lora.enabled=true"]
    cases = [
        (on + [f"actor.model=hf:{base}", f"actor.lora.init_from={tmp_path / 'none'}"],
         "actor.lora.init_from", "not a LoRA adapter folder"),
        (on + [f"actor.model=hf:{base}", f"actor.lora.init_from={other}"],
         "actor.lora.init_from", "not a LoRA adapter folder"),
        (on + [f"actor.model=hf:{other}", f"actor.lora.init_from={adapter}"],
         "actor.lora.init_from", f"holds adapters of {base}, not of actor.model"),
        (on + [f"actor.model=hf:{adapter}", f"actor.lora.init_from={adapter}"],
         "actor.lora.init_from", "is itself an adapter folder"),
        (["actor.lora.enabled=false", f"actor.model=hf:{base}", f"actor.lora.init_from={adapter}"],
         "actor.lora.init_from", "actor.lora.enabled must be true"),
        ([f"warmstart.lora.init_from={adapter}"], "warmstart.lora.init_from", "fresh adapters"),
        # the shipped warm start's actor is itself an adapter folder, not a base
        (on + ["actor.model=hf:assets/warmstart/cpu-demo/actor"],
         "actor.lora.init_from", "is itself an adapter folder"),
        # the extractor ("same": the actor's base) is checked against the actor's model
        (["extractor.lora.enabled=true", "actor.model=hf:smollm2-135m", "extractor.model=same",
          f"extractor.lora.init_from={adapter}"], "extractor.lora.init_from",
         "not of actor.model hf:smollm2-135m"),
    ]
    for overrides, key, why in cases:
        with pytest.raises(ConfigError, match=f"bad config key '{key}'") as err:
            load_config("cpu-demo", overrides)
        assert why in str(err.value) and "\n" not in str(err.value), (overrides, str(err.value))
    # the matching base loads
    cfg = load_config("cpu-demo", on + [f"actor.model=hf:{base}", f"actor.lora.init_from={adapter}"])
    assert cfg.actor.lora.init_from == str(adapter)


def test_a_run_setting_is_declared_once_and_reaches_every_part_it_concerns():
    """The rollout engine's, the manager's and the retrieval's copies of a run's settings take
    their defaults from the schema, and ``from_config`` carries a config's values to each; the
    KV cache's default is one constant, the HF backend's too."""
    import inspect

    from crl_harness.config import ActorConfig, ExperienceConfig
    from crl_harness.experience import ManagerConfig, RetrievalConfig
    from crl_harness.models import HFBackend
    from crl_harness.rollout.settings import SAMPLING, RolloutConfig

    actor, experience, rollout = ActorConfig(), ExperienceConfig(), RolloutConfig()
    assert {name: getattr(rollout.actor, name) for name in SAMPLING if name != "temperature"} \
        == {name: getattr(actor, name) for name in SAMPLING if name != "temperature"}
    assert rollout.experience == experience and rollout.actor.temperature == 1.0  # bare: own
    assert ManagerConfig() == ManagerConfig.from_config(experience)
    assert inspect.signature(HFBackend).parameters["kv_cache_tokens"].default \
        == actor.kv_cache_tokens

    cfg = load_config(None, ["actor.temperature=0.5", "actor.top_p=0.9", "actor.history=2",
                             "experience.k=3", "experience.max_asks=4",
                             "experience.retrieval=dense", "experience.candidates=8",
                             "experience.max_transcript_chars=500",
                             "tasks.groups_per_step=2",
                             "tasks.group_size=4", "tasks.guided_per_group=2",
                             "run.rollout_workers=2"])
    rollout = RolloutConfig.from_config(cfg, seed=7)
    assert (rollout.actor.temperature, rollout.actor.top_p, rollout.actor.history,
            rollout.experience.k, rollout.experience.max_asks, rollout.max_live, rollout.workers,
            rollout.seed) == (0.5, 0.9, 2, 3, 4, 8, 2, 7)
    assert rollout.actor is not cfg.actor  # a copy: replacing a setting leaves the run's alone
    greedy = RolloutConfig.from_config(cfg, temperature=0.0, k=1)
    assert (greedy.actor.temperature, greedy.experience.k, cfg.actor.temperature) == (0, 1, 0.5)
    manager = ManagerConfig.from_config(cfg.experience, seed=5)
    assert manager.retrieval == RetrievalConfig(cfg.experience)
    assert (manager.retrieval.experience.retrieval, manager.retrieval.experience.candidates) \
        == ("dense", 8)
    assert (manager.experience.max_transcript_chars, manager.seed) == (500, 5)


@pytest.mark.parametrize("override, key", [
    ("actor.max_new_tokens=4097", "actor.max_new_tokens"),  # past the tiny model's 4,096
    ("extractor.max_new_tokens=2049", "extractor.max_new_tokens"),  # past half of it
])
def test_hardening_max_new_tokens_past_the_context_is_refused_before_the_run_and_dry_run(
        tmp_path, capsys, monkeypatch, override, key):
    from crl_harness.commands import train
    from crl_harness.models.tiny import build_tiny_model

    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("the run started"))
    model = build_tiny_model(tmp_path / "tiny")
    capsys.readouterr()  # the build's progress bar
    for dry_run in ([], ["--dry-run"]):
        assert main(["train", "cpu-demo", f"actor.model=hf:{model}", "actor.lora.init_from=null",
                     "extractor.model=same", "extractor.lora.init_from=null", override, f"run.output_dir={tmp_path / 'run'}", "--no-progress",
                     *dry_run]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"bad config key '{key}'" in lines[0], lines
        assert "context of 4096 tokens" in lines[0]
        assert not (tmp_path / "run").exists()


def test_hardening_env_weights_whose_sum_overflows_are_refused_at_load():
    with pytest.raises(ConfigError, match="bad config key 'tasks.envs': the weights add up"):
        load_config("mix3", ["tasks.envs.0.weight=1e308", "tasks.envs.1.weight=1e308"])


@pytest.mark.parametrize("override", ["actor.format_penalty=0.5", "extractor.format_penalty=1"])
def test_hardening_a_format_penalty_that_rewards_malformed_replies_is_refused(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"bad config key '{key}': must be <= 0"):
        load_config("cpu-demo", [override])


def test_hardening_initial_bank_given_the_bank_file_names_the_export_in_one_line(
        tmp_path, capsys, monkeypatch):
    from crl_harness.commands import train
    from crl_harness.experience import ExperienceBank

    bank = tmp_path / "bank.sqlite"
    with ExperienceBank(bank) as opened:
        opened.add("CRL/Sokoban-v0", "Corners", "Never push a box into a corner.")
    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("the run started"))
    assert main(["train", "cpu-demo", f"experience.initial_bank={bank}",
                 f"run.output_dir={tmp_path / 'run'}", "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "is a bank file (SQLite); give its JSONL export" in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("empty", ["/dev/null", "empty.yaml"])
def test_hardening_an_empty_config_file_is_refused_not_trained_with_the_defaults(
        tmp_path, capsys, monkeypatch, empty):
    from crl_harness.commands import train

    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("the run started"))
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    path = empty if empty.startswith("/") else str(tmp_path / empty)
    assert main(["train", path]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "the file sets nothing; give a config (e.g. cpu-demo) or write the keys that differ "
        "from the defaults")


@pytest.mark.parametrize("section, settings, key", [
    ("rollout", {"top_p": 0.0}, "actor.top_p"),
    ("rollout", {"k": 0}, "experience.k"),
    ("retrieval", {"count_penalty": float("nan")}, "experience.count_penalty"),
    ("retrieval", {"demotion_prob": 2.0}, "experience.demotion_prob"),
    ("manager", {"max_concurrent_extractions": 0}, "experience.max_concurrent_extractions"),
])
def test_hardening_runtime_settings_are_checked_by_the_schema_declarations(section, settings, key):
    """A setting declared in the schema is checked by that declaration alone, whether a config
    file or code (crl eval, a benchmark) hands it to the runtime object."""
    from crl_harness.config import ExperienceConfig
    from crl_harness.experience import ManagerConfig, RetrievalConfig
    from crl_harness.rollout import RolloutConfig

    build = {"rollout": lambda **s: RolloutConfig.from_config(None, **s),
             "retrieval": lambda **s: RetrievalConfig(ExperienceConfig(**s)),
             "manager": lambda **s: ManagerConfig.from_config(ExperienceConfig(**s))}
    with pytest.raises(ValueError, match=f"bad setting '{key}': must be"):
        build[section](**settings)


def test_hardening_zero_candidates_is_refused_by_its_declared_bound():
    with pytest.raises(ConfigError, match="'experience.candidates': must be >= 1"):
        load_config(None, ["experience.candidates=0"])
