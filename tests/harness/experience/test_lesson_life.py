"""A lesson's life end to end (docs/experience.md, "A lesson's life"): levels recur without
replacement, a level is handed only a lesson of its own key, an identical add endorses the entry,
the lesson with the best record ranks first, a confirmed lesson survives one downvote, votes
count only on the level's own lesson, and credit reaches every writer and endorser of what was
used, never for a retrieval miss. Each test failed before the change it guards."""

from __future__ import annotations

import pytest

from crl_harness.config import EnvEntry, ExperienceConfig, TaskConfig
from crl_harness.experience import (
    AddEntry,
    DistillationRequest,
    EpisodeOutcome,
    ExperienceBank,
    ExperienceManager,
    ManagerConfig,
    credit_episodes,
    episodes_to_distill,
)
from crl_harness.rollout import Trajectory
from crl_harness.training.sampler import TaskSampler

ENV = "CRL/MiniHackRoom-v0"
MINE = "x=38, y=12; in view: nothing notable"
OTHER = "x=40, y=11; in view: nothing notable"


def lesson(key: str, moves: str) -> tuple[str, str]:
    return f"Winning moves from {key}", f"from the start, play {moves}."


def keyed_manager(bank: ExperienceBank, extractor=None) -> ExperienceManager:
    return ExperienceManager(bank, extractor, ManagerConfig.from_config(
        ExperienceConfig(count_penalty=0.0, demotion_prob=0.0), exact_key_envs=[ENV]))


@pytest.fixture
def bank():
    bank = ExperienceBank(":memory:")
    yield bank
    bank.close()


def test_revisit_schedule_plays_new_levels_without_replacement_then_revisits_them():
    """D1: step 1 drew levels 3, 0, 0, 0 (with replacement): two levels had no lesson when
    retrieval started. Now step 1 plays distinct new levels and each later step revisits the
    levels the step before it played first."""
    tasks = TaskConfig(envs=[EnvEntry(ENV)], groups_per_step=4, seeds=list(range(100, 132)),
                       schedule="revisit")
    sampler = TaskSampler(tasks, run_seed=0)
    steps = [sampler.sample(s) for s in range(1, 9)]
    first = [d.seed for d in steps[0]]
    assert len(set(first)) == 4 and not any(d.revisit for d in steps[0])
    news = [d.seed for draws in steps for d in draws if not d.revisit]
    assert len(news) == len(set(news)) == 4 + 7 * 2  # no level is new twice while the pool lasts
    for before, now in zip(steps, steps[1:], strict=False):
        revisits = [d.seed for d in now if d.revisit]
        assert len(revisits) == 2
        assert set(revisits) <= {d.seed for d in before if not d.revisit}
    assert TaskSampler(tasks, run_seed=0).sample(5) == steps[4]  # a resumed run draws the same


def test_revisit_schedule_walks_the_pool_again_once_it_is_spent():
    """Past the pool's size the new levels start its permutation again (each level new once per
    walk, then counted as a revisit), instead of drawing one level over and over."""
    tasks = TaskConfig(envs=[EnvEntry(ENV)], groups_per_step=2, seeds=[7, 8, 9, 10],
                       schedule="revisit", new_per_step=1)
    sampler = TaskSampler(tasks, run_seed=0)
    # step 1: two new levels; each later step: one new (its first group), one revisit
    news = sampler.sample(1) + [sampler.sample(step)[0] for step in range(2, 12)]
    first_walk, second_walk = [d.seed for d in news[:4]], [d.seed for d in news[4:8]]
    assert sorted(first_walk) == sorted(second_walk) == [7, 8, 9, 10]
    assert all(d.revisit for d in news[4:]) and not any(d.revisit for d in news[:4])
    with pytest.raises(ValueError, match="count from 1"):
        sampler.sample(0)


def test_uniform_draws_are_distinct_within_a_step():
    """D1 for the uniform schedule: no level is played by two groups of one step."""
    tasks = TaskConfig(envs=[EnvEntry(ENV)], groups_per_step=4, seeds=[1, 2, 3, 4])
    sampler = TaskSampler(tasks, run_seed=0)
    for step in range(1, 30):
        assert sorted(d.seed for d in sampler.sample(step)) == [1, 2, 3, 4]


def test_coverage_floor_hands_a_level_without_its_own_lesson_nothing(bank):
    """D2: a level without a lesson of its own matched 3 of 4 words of any dark-start key and
    got another level's route. With exact keys it gets none."""
    with keyed_manager(bank) as manager:
        manager.apply([AddEntry(ENV, *lesson(OTHER, "south, east"))])
        manager.flush()
        assert manager.retrieve(ENV, MINE, k=1) == []
        assert len(manager.retrieve(ENV, OTHER, k=1)) == 1


def test_an_identical_add_endorses_the_entry_instead_of_copying_it(bank):
    """D4: 28 copies of one lesson piled up in one bank. An add equal to a live entry (case and
    whitespace aside) is an upvote of it, and its generation joins the entry's endorsers."""
    with keyed_manager(bank) as manager:
        title, content = lesson(MINE, "south")
        first = manager.apply([AddEntry(ENV, title, content, generation_id="g1")]).added[0]
        manager.apply([AddEntry(ENV, title.upper(), "  " + content.replace(" ", "  "),
                                generation_id="g2")])
        manager.apply([AddEntry(ENV, title, content, generation_id="g3"),
                       AddEntry(ENV, title, content, generation_id="g4")])
        assert [e.id for e in bank.entries(ENV)] == [first.id]
        assert bank.get(first.id).votes == 3
        assert manager.records.export()["endorsers"][first.id] == ["g2", "g3", "g4"]


def test_lessons_of_a_key_rank_by_their_record_not_their_length(bank):
    """D3: among a level's own lessons BM25's length normalisation handed out the shortest text
    (a miscopy). The lesson with the better record (votes, wins when used) ranks first."""
    with keyed_manager(bank) as manager:
        short, right = manager.apply([AddEntry(ENV, *lesson(MINE, "south")),
                                      AddEntry(ENV, *lesson(MINE, "south, east, east"))]).added
        manager.flush()
        assert manager.retrieve(ENV, MINE, k=1)[0].id == short.id  # BM25 alone: the shortest
        manager.report_outcome([right.id], 1.0, env_id=ENV, query=MINE)
        manager.report_outcome([short.id], 0.0, env_id=ENV, query=MINE)
        assert manager.retrieve(ENV, MINE, k=1)[0].id == right.id


def answer(text: str):
    return lambda prompt: text


def test_a_confirmed_lesson_survives_one_downvote_and_foreign_votes_do_not_count(bank):
    """D5: one downvote deleted a fresh entry, often after another level's episode lost with it.
    A vote counts only on the episode's own level's entry; an entry confirmed (endorsed) needs
    more than one downvote to go."""
    down = '<answer>[{"op": "downvote", "target_idx": 0}]</answer>'
    with keyed_manager(bank, answer(down)) as manager:
        other = manager.apply([AddEntry(ENV, *lesson(OTHER, "west"))]).added[0]
        manager.submit(DistillationRequest(ENV, "task", "...", False, 0.0, [other.id], 1,
                                           query=MINE))
        manager.flush()
        assert other.id in bank and manager.stats()["votes_ignored"] == 1
        title, content = lesson(MINE, "south")
        mine = manager.apply([AddEntry(ENV, title, content, generation_id="g1")]).added[0]
        manager.apply([AddEntry(ENV, title, content, generation_id="g2")])  # confirmed once
        manager.submit(DistillationRequest(ENV, "task", "...", False, 0.0, [mine.id], 1,
                                           query=MINE))
        manager.flush()
        assert mine.id in bank and bank.get(mine.id).votes == 0


def test_a_retrieval_miss_credits_nobody_and_endorsers_share_the_credit(bank):
    """D8: the writer of an entry handed to another level paid for the retriever's miss; the
    writers of an endorsed lesson beyond the first were never credited (D9)."""
    with keyed_manager(bank) as manager:
        for generation in ("g1", "g2", "g-other"):
            manager.ledger.register(generation, "prompt", "output", "distill")
        title, content = lesson(MINE, "south")
        mine = manager.apply([AddEntry(ENV, title, content, generation_id="g1")]).added[0]
        manager.apply([AddEntry(ENV, title, content, generation_id="g2")])
        other = manager.apply([AddEntry(ENV, *lesson(OTHER, "west"),
                                        generation_id="g-other")]).added[0]
        manager.report_outcome([other.id], 0.0, env_id=ENV, query=MINE)  # a miss
        manager.report_outcome([mine.id], 1.0, env_id=ENV, query=MINE)
        rewards = {r.generation_id: r.reward for r in manager.generation_rewards()}
        assert rewards == {"g1": 1.0, "g2": 1.0}
        assert manager.stats()["misses_uncredited"] == 1


def test_a_group_whose_free_half_all_won_credits_a_right_lesson_positively(bank):
    """D8: where every free episode won, relative credit gave a right lesson 0, below the batch
    mean of the extractor's advantages. The guided outcome alone credits it there."""
    with keyed_manager(bank) as manager:
        manager.ledger.register("g1", "prompt", "output", "distill")
        entry = manager.apply([AddEntry(ENV, *lesson(MINE, "south"), generation_id="g1")]).added[0]
        group = [Trajectory(ENV, 0, group_id=0, use_experience=guided, won=True, score=1.0,
                            retrieval_key=MINE, experience_ids=[entry.id] if guided else [])
                 for guided in (True, True, False, False)]
        credit_episodes(manager, [EpisodeOutcome.of(t) for t in group], relative=True)
        assert [(r.reward, r.n_uses) for r in manager.generation_rewards()] == [(1.0, 2)]


def test_votes_and_returns_are_credited_by_the_outcome_they_judged(bank):
    """D9: votes and returns were never registered for credit, so the extractor trained on
    about 4 samples a run. Each judgment is now a sample, rewarded by the episode's outcome."""
    up = '<answer>[{"op": "upvote", "target_idx": 0}]</answer>'
    with keyed_manager(bank, answer(up)) as manager:
        mine = manager.apply([AddEntry(ENV, *lesson(MINE, "south"))]).added[0]
        manager.submit(DistillationRequest(ENV, "task", "...", True, 1.0, [mine.id], 1, query=MINE))
        manager.submit(DistillationRequest(ENV, "task", "...", False, 0.0, [mine.id], 1,
                                           query=MINE))
        manager.flush()
        assert sorted(r.reward for r in manager.generation_rewards()) == [-1.0, 1.0]
    with keyed_manager(ExperienceBank(":memory:"), answer('<answer>[{"op": "return"}]</answer>')) \
            as manager:
        manager.submit(DistillationRequest(ENV, "task", "...", False, 0.0, [], 1, query=MINE))
        manager.flush()
        assert [r.reward for r in manager.generation_rewards()] == [1.0]


def test_an_add_that_restates_the_levels_own_lesson_is_judged_as_an_upvote(bank):
    """D9: a guided episode's extractor that wrote the lesson it was shown again (38 of the 42
    generations a demo run left uncredited) was an endorser, credited only when the lesson was
    used again, which a level's last visit never brings. Now it is judged at once, as an upvote,
    by the episode's outcome; the add still folds into the entry."""
    title, content = lesson(MINE, "south")
    restate = f'<answer>[{{"op": "add", "title": "{title}", "content": "{content}"}}]</answer>'
    with keyed_manager(bank, answer(restate)) as manager:
        mine = manager.apply([AddEntry(ENV, title, content)]).added[0]
        manager.submit(DistillationRequest(ENV, "task", "...", True, 1.0, [mine.id], 1, query=MINE))
        manager.submit(DistillationRequest(ENV, "task", "...", False, 0.0, [mine.id], 1,
                                           query=MINE))
        manager.flush()
        assert sorted(r.reward for r in manager.generation_rewards()) == [-1.0, 1.0]
        assert len(bank) == 1 and bank.get(mine.id).votes == 2  # folded: two upvotes
    with keyed_manager(ExperienceBank(":memory:"), answer(restate)) as manager:
        other = manager.apply([AddEntry(ENV, *lesson(OTHER, "west"))]).added[0]
        manager.submit(DistillationRequest(ENV, "task", "...", True, 1.0, [other.id], 1,
                                           query=MINE))  # shown another level's: a new lesson
        manager.flush()
        assert manager.generation_rewards() == []  # a writer's: credited when it is used


def test_free_winners_are_distilled_and_the_cap_holds():
    """D7: only guided episodes were distilled; the free half's winners (the better half)
    never were. Now: each guided episode shown a lesson, then the group's shortest win."""
    def episode(group, guided, won, steps, ids=()):
        return Trajectory(ENV, group, group_id=group, use_experience=guided, guided=guided,
                          won=won, score=float(won), steps=steps, experience_ids=list(ids))

    step = [episode(0, True, False, 6), episode(0, True, False, 6),
            episode(0, False, True, 3), episode(0, False, True, 2),
            episode(1, True, True, 4, ["e"]), episode(1, True, False, 6, ["e"]),
            episode(1, False, True, 2), episode(1, False, False, 6)]
    chosen = episodes_to_distill(step, per_group=2)
    assert [(t.group_id, t.use_experience, t.steps) for t in chosen] == \
        [(0, False, 2), (1, True, 4), (1, True, 6)]
