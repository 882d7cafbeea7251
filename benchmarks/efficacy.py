"""The three arms side by side: Complementary RL (co-evolve), a static extractor, and no
experience (plain GRPO), from the same config and the same seeds.

    .venv/bin/python benchmarks/efficacy.py --steps 4 --repeats 1
    .venv/bin/python benchmarks/efficacy.py --actor hf:runs/warm/checkpoints/step-000050/actor_hf

For each arm and repeat it trains a fresh run (``--config``, default ``cpu-demo``, with
``--set key=value`` overrides) and reads its ``metrics.jsonl``. It prints, per step, the median
over repeats of the success rate of every arm (all rollouts, and guided vs free where the arm
has experience), the mean over steps, and writes ``efficacy.png`` and ``efficacy.json`` into
``--out``. Run seeds are ``--seed``, ``--seed + 1``, ...: the arms of one repeat see the same
task seeds (the task sampler depends only on the run seed and the step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ARMS = ("co-evolve", "static", "none")


def run_arm(config: str, arm: str, actor: str | None, seed: int, steps: int, out: Path,
            overrides: list[str]) -> list[dict]:
    from crl_harness.config import load_config
    from crl_harness.trainer import Trainer
    from crl_harness.training.metrics import read_metrics

    run_dir = out / f"{arm}-seed{seed}"
    settings = [*overrides, f"arm={arm}", f"run.seed={seed}", f"run.steps={steps}",
                f"run.output_dir={run_dir}", "run.checkpoint_every=1000000"]
    if actor:
        settings.append(f"actor.model={actor}")
    cfg = load_config(config, settings)
    start = time.perf_counter()
    Trainer(cfg).train()
    print(f"  {arm} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    return read_metrics(run_dir / "metrics.jsonl")


def median_curve(runs: list[list[dict]], key: str) -> list[float]:
    steps = min(len(r) for r in runs)
    return [statistics.median(r[i].get(key, float("nan")) for r in runs) for i in range(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--actor", default=None,
                        help="actor model spec, e.g. hf:RUN/checkpoints/step-000010/actor_hf")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=ARMS)
    parser.add_argument("--set", nargs="*", default=[], metavar="key=value",
                        help="config overrides for every arm")
    parser.add_argument("--out", default="runs/efficacy")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[list[dict]]] = {arm: [] for arm in args.arms}
    for repeat in range(args.repeats):
        for arm in args.arms:
            results[arm].append(run_arm(args.config, arm, args.actor, args.seed + repeat,
                                        args.steps, out, args.set))

    curves: dict[str, dict[str, list[float]]] = {}
    for arm, runs in results.items():
        keys = ["success/all"] + (["success/guided", "success/free"] if arm != "none" else [])
        curves[arm] = {key: median_curve(runs, key) for key in keys}
    header = "step  " + "  ".join(f"{arm:>10}" for arm in args.arms)
    print(f"\nsuccess rate per step (median over {args.repeats} repeat(s)), all rollouts")
    print(header)
    for i in range(min(len(c["success/all"]) for c in curves.values())):
        print(f"{i + 1:>4}  " + "  ".join(f"{curves[a]['success/all'][i]:>10.3f}"
                                          for a in args.arms))
    print("mean  " + "  ".join(f"{statistics.fmean(curves[a]['success/all']):>10.3f}"
                               for a in args.arms))
    for arm in args.arms:
        if arm != "none":
            g, f = curves[arm]["success/guided"], curves[arm]["success/free"]
            print(f"{arm}: guided {statistics.fmean(g):.3f} vs free {statistics.fmean(f):.3f} "
                  "(mean over steps)")

    (out / "efficacy.json").write_text(json.dumps({"args": vars(args), "curves": curves},
                                                  indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in args.arms:
        ys = curves[arm]["success/all"]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=arm)
    ax.set_xlabel("step")
    ax.set_ylabel("success rate (all rollouts)")
    ax.set_title(f"{args.config}: three arms, {args.repeats} repeat(s)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "efficacy.png", dpi=100)
    print(f"\nwrote {out / 'efficacy.png'} and {out / 'efficacy.json'}")


if __name__ == "__main__":
    main()
