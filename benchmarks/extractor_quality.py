"""Extractor quality: does the warm extractor write the lesson its warm start teaches?

    .venv/bin/python benchmarks/extractor_quality.py              # cpu-demo, 16 won + 8 lost
    .venv/bin/python benchmarks/extractor_quality.py --extractor hf:RUN/checkpoints/.../extractor_hf

On the config's first env and held-out levels (``tasks.heldout_offset``, never in a warm start)
the scripted oracle plays episodes the way the warm start records them (without noise); for each,
the Experience Manager's own distillation prompt (no entry shown) goes to the extractor, greedy
and at the config's ``extractor.temperature`` (the one training samples at, ``--samples`` answers
each). What the warm start teaches (``crl_harness.warmstart.data.extractor_sample``): a won
episode adds its moves as played ("Winning moves from x=.., y=..: from the start, play ..."), a
lost one returns. Each answer is counted as malformed (the strict parser rejects it: nothing is
written), right (that add with exactly those title and content; a lost episode: ``return``), or
other (well-formed, but a lesson with other moves, or another operation). Printed per outcome
with 95% Wilson intervals; the bank of a training run holds what this measures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def oracle_episodes(cfg, backend, won: int, lost: int) -> list:
    """``won`` won and ``lost`` lost oracle episodes on consecutive held-out levels."""
    from crl_harness.warmstart.data import play_oracle_episode

    env = cfg.tasks.envs[0]
    episodes: dict[bool, list] = {True: [], False: []}
    seed = cfg.tasks.heldout_offset
    while len(episodes[True]) < won or len(episodes[False]) < lost:
        if seed - cfg.tasks.heldout_offset > 50 * (won + lost):
            raise SystemExit(f"the oracle gave {len(episodes[True])} won and "
                             f"{len(episodes[False])} lost episodes in {seed - cfg.tasks.heldout_offset} "
                             "levels; ask for fewer")
        trajectory = play_oracle_episode(env.id, seed, tokenizer=backend.tokenizer,
                                         max_context=backend.max_context,
                                         max_new_tokens=cfg.actor.max_new_tokens,
                                         history=cfg.actor.history, env_kwargs=env.kwargs,
                                         options=env.options or None)
        if len(episodes[trajectory.won]) < (won if trajectory.won else lost):
            episodes[trajectory.won].append(trajectory)
        seed += 1
    return episodes[True] + episodes[False]


def taught_ops(trajectory, tokenizer, max_transcript_chars: int) -> tuple:
    """The operations the warm start teaches for ``trajectory`` (its own ``extractor_sample``)."""
    from crl_harness.experience.operations import ParseLimits, parse_distillation
    from crl_harness.warmstart.data import AdvisedEpisode, extractor_sample

    sample = extractor_sample(AdvisedEpisode(trajectory), tokenizer=tokenizer,
                              max_ops=ParseLimits().max_ops,
                              max_transcript_chars=max_transcript_chars)
    return parse_distillation(sample.text, 0).ops


def verdict(answer: str, taught: tuple) -> str:
    """``malformed``, ``right`` (the ``taught`` operations) or ``other``."""
    from crl_harness.experience.operations import parse_distillation

    parsed = parse_distillation(answer, 0)
    if not parsed.ok:
        return "malformed"
    return "right" if parsed.ops == taught else "other"


def measure(cfg, extractor: str, dtype: str, won: int, lost: int, samples: int) -> dict:
    """Play ``won`` won and ``lost`` lost oracle episodes on ``cfg``'s held-out levels and ask
    ``extractor`` (a model spec) for each one's operations, greedy and ``samples`` times at
    ``cfg.extractor.temperature``; print and return, per label and outcome, how many answers
    were right, other and malformed."""
    from crl_harness.eval import wilson_interval
    from crl_harness.experience.distill import DistillationRequest, distill_prompt
    from crl_harness.experience.operations import ParseLimits
    from crl_harness.models.registry import load_backend

    backend = load_backend(extractor, dtype=dtype)
    episodes = oracle_episodes(cfg, backend, won, lost)
    prompts = [[{"role": "user", "content": distill_prompt(
        DistillationRequest(t.env_id, t.task, t.transcript, t.won, t.score), [],
        max_ops=ParseLimits().max_ops,
        max_transcript_chars=cfg.experience.max_transcript_chars)}] for t in episodes]
    taught = [taught_ops(t, backend.tokenizer, cfg.experience.max_transcript_chars)
              for t in episodes]
    print(f"extractor quality: {extractor} ({dtype}) on {cfg.tasks.envs[0].id}, {won} won and "
          f"{lost} lost oracle episodes from held-out level {cfg.tasks.heldout_offset}",
          flush=True)
    results: dict[str, dict] = {}
    for label, temperature, repeats in (("greedy", 0.0, 1),
                                        (f"T={cfg.extractor.temperature}",
                                         cfg.extractor.temperature, samples)):
        started = time.perf_counter()
        counts = {outcome: {"right": 0, "other": 0, "malformed": 0} for outcome in ("won", "lost")}
        examples = []
        for _ in range(repeats):
            answers = backend.generate(prompts, max_new_tokens=cfg.extractor.max_new_tokens,
                                       temperature=temperature, top_p=cfg.extractor.top_p)
            for trajectory, answer, ops in zip(episodes, answers, taught, strict=True):
                kind = verdict(answer.text, ops)
                counts["won" if trajectory.won else "lost"][kind] += 1
                if kind != "right" and len(examples) < 3:
                    examples.append(answer.text)
        results[label] = {"counts": counts, "seconds": time.perf_counter() - started}
        for outcome, row in counts.items():
            n = sum(row.values())
            if not n:
                continue
            low, high = wilson_interval(row["right"], n)
            print(f"  {label:8s} {outcome:4s}: right {row['right']:3d}/{n} = "
                  f"{100 * row['right'] / n:5.1f}% [{100 * low:.1f}, {100 * high:.1f}], other "
                  f"{row['other']}, malformed {row['malformed']}", flush=True)
        for text in examples:
            print(f"    e.g. {text[:150]!r}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--extractor", default=None, help="default: the extractor the config starts from")
    parser.add_argument("--won", type=int, default=16, help="won episodes (1..200)")
    parser.add_argument("--lost", type=int, default=8, help="lost episodes (0..200)")
    parser.add_argument("--samples", type=int, default=2,
                        help="answers per episode at the training temperature (0..8)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "auto"),
                        help="the extractor's weights (default: the config's extractor.dtype, "
                             "what training samples with)")
    parser.add_argument("--out", default="runs/extractor-quality")
    args = parser.parse_args()
    for name, low, high in (("won", 1, 200), ("lost", 0, 200), ("samples", 0, 8)):
        if not low <= getattr(args, name) <= high:
            parser.error(f"--{name} must be in {low}..{high}")

    from crl_harness.config import load_config

    cfg = load_config(args.config)
    extractor = args.extractor or cfg.starting_model("extractor")
    results = measure(cfg, extractor, args.dtype or cfg.extractor.dtype, args.won, args.lost,
                      args.samples)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "extractor_quality.json").write_text(json.dumps(
        {"extractor": extractor, "config": args.config, "won": args.won, "lost": args.lost,
         "results": results}, indent=2))
    print(f"wrote {out / 'extractor_quality.json'}")


if __name__ == "__main__":
    main()
