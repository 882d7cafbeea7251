"""The extractor's warm-start lessons (``warmstart.extractor_lesson``): a level's own route, as
before, or the env's transferable lesson of the level's key (``crl_envs.transferable_lesson``)."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("nle", reason="the minihack extra: pip install 'crl-gym[minihack]'")

import crl_envs  # noqa: E402
from crl_harness.config import ConfigError, load_config  # noqa: E402
from crl_harness.models import HFBackend  # noqa: E402
from crl_harness.models.tiny import build_tiny_model  # noqa: E402
from crl_harness.warmstart.data import (  # noqa: E402
    answer_case,
    answer_class,
    extractor_episodes,
    taught_answer,
)
from crl_harness.warmstart.quotas import ANSWER_CLASSES, class_quotas  # noqa: E402

ROOM = "CRL/MiniHackRoom-v0"
DARK = {"variant": "dark", "max_episode_steps": 8}


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    return HFBackend(build_tiny_model(tmp_path_factory.mktemp("keyext") / "tiny", hidden_size=64))


def _episodes(backend, **kwargs):
    return extractor_episodes(ROOM, list(range(100, 164)), 10, noise=0.1, rng=random.Random(0),
                              tokenizer=backend.tokenizer, max_context=backend.max_context,
                              max_new_tokens=64, history=None, env_kwargs=DARK, **kwargs)


@pytest.fixture(scope="module")
def keyed(backend):
    return _episodes(backend, lesson="key")


def _lesson(episode):
    """The env's transferable lesson of the episode's key, ``(title, content)``."""
    return crl_envs.transferable_lesson(ROOM, episode.trajectory.retrieval_key,
                                        DARK["max_episode_steps"])


def test_extractor_lesson_route_gives_the_data_of_a_warm_start_without_it(backend):
    # Pinned from the code before warmstart.extractor_lesson: its default teaches the same
    # answers from the same episodes (and the same random draws)
    before = [
        ("add", 103, None, None, '<answer>[{"op": "add", "title": "Winning moves from x=38, y=13; '
         'in view: nothing notable", "content": "from the start, play north, northwest."}]'
         '</answer>'),
        ("add", 104, None, None, '<answer>[{"op": "add", "title": "Winning moves from x=36, y=9; '
         'in view: nothing notable", "content": "from the start, play east, east."}]</answer>'),
        ("add", 105, "route-101", "from the start, play east, east.",
         '<answer>[{"op": "add", "title": "Winning moves from x=38, y=12; in view: nothing '
         'notable", "content": "from the start, play north, northeast, northeast."}]</answer>'),
        ("return", 100, None, None, '<answer>[{"op": "return"}]</answer>'),
        ("return", 101, "route-100", "from the start, play east, east, east, southeast.",
         '<answer>[{"op": "return"}]</answer>'),
        ("misled", 102, "route-101", "from the start, play east, east.",
         '<answer>[{"op": "return"}]</answer>'),
        ("upvote", 100, "route-100", "from the start, play east, east, east, southeast.",
         '<answer>[{"op": "upvote", "target_idx": 0}]</answer>'),
        ("upvote", 101, "route-101", "from the start, play east, east.",
         '<answer>[{"op": "upvote", "target_idx": 0}]</answer>'),
        ("downvote", 102, "wrong-102", "from the start, play east, east.",
         '<answer>[{"op": "downvote", "target_idx": 0}]</answer>'),
        ("downvote", 103, "wrong-103", "from the start, play east, east, east, southeast.",
         '<answer>[{"op": "downvote", "target_idx": 0}]</answer>'),
    ]
    routed = _episodes(backend, lesson="route")
    assert [(answer_case(e), e.trajectory.seed, e.advice.id if e.advice else None,
             e.advice.content if e.advice else None, taught_answer(e)) for e in routed] == before
    default = _episodes(backend)
    assert [t.text for e in default for t in e.trajectory.turns] == \
        [t.text for e in routed for t in e.trajectory.turns]


def test_key_lesson_is_the_add_answer_and_the_upvoted_lesson(keyed):
    answered = [answer_class(e) for e in keyed]
    assert {name: answered.count(name) for name in ANSWER_CLASSES} == class_quotas(10, "key")
    adds = [e for e in keyed if answer_class(e) == "add"]
    sweeps = 0
    for episode in adds:
        [op] = json.loads(taught_answer(episode).removeprefix("<answer>").removesuffix("</answer>"))
        title, content = _lesson(episode)
        assert (op["title"], op["content"]) == (title, content)
        sweeps += "Once the staircase down (>) is in view" in content
    assert sweeps  # a sweep from the start cell, not the moves that episode played
    for episode in keyed:
        if answer_class(episode) == "upvote":  # followed its key's lesson, by its policy, won
            assert (episode.advice.title, episode.advice.content) == _lesson(episode)
            assert episode.lesson and episode.trajectory.won


def test_key_lesson_downvote_follows_another_keys_lesson_under_the_levels_title(keyed):
    downvotes = [e for e in keyed if answer_class(e) == "downvote"]
    assert len(downvotes) == class_quotas(10, "key")["downvote"]
    for episode in downvotes:
        title, content = _lesson(episode)
        assert episode.advice.title == title and episode.advice.content != content
        assert episode.advice.id == f"wrong-{episode.trajectory.seed}"
        assert not episode.trajectory.won
        # another key's lesson, word for word: one a key of another level writes
        others = {e.advice.content for e in keyed if e.lesson}
        assert episode.advice.content in others
        moves = episode.advice.content.removeprefix("from the start, play ").split(".")[0]
        assert [t.action for t in episode.trajectory.turns][:1] == moves.split(", ")[:1]


def test_key_lesson_keeps_routes_where_the_env_writes_no_lesson(backend):
    kwargs = {"num_boxes": 1, "max_solution_length": 6, "max_episode_steps": 10}
    episodes = extractor_episodes("CRL/Sokoban-v0", list(range(10_000_000, 10_000_064)), 4,
                                  noise=0.1, rng=random.Random(0), tokenizer=backend.tokenizer,
                                  max_context=backend.max_context, max_new_tokens=64,
                                  history=None, env_kwargs=kwargs, lesson="key")
    assert all(e.own is None and not e.lesson for e in episodes)
    assert {e.advice.id.split("-")[0] for e in episodes if e.advice} <= {"route", "wrong"}


def test_hardening_warmstart_extractor_lesson_is_route_or_key(backend):
    with pytest.raises(ConfigError, match=r"'warmstart.extractor_lesson': invalid value "
                                          r"'sweep', expected one of route, key") as err:
        load_config("cpu-demo", ["warmstart.extractor_lesson=sweep"])
    assert "\n" not in str(err.value)
    assert load_config("cpu-demo").warmstart.extractor_lesson == "route"  # the shipped recipe
    assert load_config("cpu-demo", ["warmstart.extractor_lesson=key"]).warmstart \
        .extractor_lesson == "key"
    with pytest.raises(ValueError, match="lesson must be one of route, key, got 'sweep'"):
        _episodes(backend, lesson="sweep")


def test_warmstart_extractor_lesson_reaches_the_extractors_samples(tmp_path, monkeypatch):
    from crl_harness.warmstart import run_warmstart, sft

    tiny = build_tiny_model(tmp_path / "tiny", hidden_size=64)
    taught: list[str] = []
    asked: list[str | None] = []

    def recorded(*args, **kwargs):
        asked.append(kwargs.get("lesson"))
        episodes = extractor_episodes(*args, **kwargs)
        taught.extend(taught_answer(e) for e in episodes if answer_class(e) == "add")
        return episodes

    monkeypatch.setattr(sft, "extractor_episodes", recorded)
    cfg = load_config("cpu-demo", [
        f"warmstart.model=hf:{tiny}", f"run.output_dir={tmp_path}/run",
        f"warmstart.output_dir={tmp_path}/run/warmstart", "warmstart.extractor_samples=4",
        "warmstart.extractor_epochs=1", "warmstart.batch_size=2", "warmstart.lora.r=4",
        "warmstart.lora.top_layers=1", "extractor.max_new_tokens=192",
        "warmstart.extractor_lesson=key"])
    out = run_warmstart(cfg, log=lambda _: None, only="extractor")
    assert out["config"]["extractor_lesson"] == "key" and asked == ["key"]
    assert len(taught) == class_quotas(4, "key")["add"] == 2  # half the samples add
    env = cfg.tasks.envs[0]
    for answer in taught:
        [op] = json.loads(answer.removeprefix("<answer>").removesuffix("</answer>"))
        key = op["title"].removeprefix("Winning moves from ")
        assert (op["title"], op["content"]) == crl_envs.transferable_lesson(
            env.id, key, env.kwargs["max_episode_steps"])


def test_key_lesson_adds_spread_over_keys(backend, monkeypatch):
    # a sweep is its start cell's, learnt from adds of that key: no key takes the add quota
    import crl_harness.warmstart.data as data

    monkeypatch.setattr(data, "adds_per_key", lambda adds: 1)
    many = extractor_episodes(ROOM, list(range(100, 420)), 40, noise=0.1, rng=random.Random(0),
                              lesson="key", tokenizer=backend.tokenizer,
                              max_context=backend.max_context, max_new_tokens=64, history=None,
                              env_kwargs=DARK)
    titles = [e.own.title for e in many if answer_class(e) == "add"]
    assert len(titles) == class_quotas(40, "key")["add"]
    assert len(set(titles)) == len(titles)
