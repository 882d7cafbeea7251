"""What a prefill and a decode step of the vLLM engine cost by batch size: why fewer episodes a
step hardly shorten a rollout step on a CPU.

    .venv/bin/python benchmarks/vllm_step_latency.py                    # cpu-demo's warm actor
    .venv/bin/python benchmarks/vllm_step_latency.py --batches 1 32 --context 1000

Loads the config's starting actor as training rolls out with it (``heldout.load_actor``, vLLM;
float32 where the CPU has no native bf16, as ``crl demo`` and ``efficacy.py`` do) and, for each
``--batches`` size, generates from that many fresh prompts of ``--context`` random token ids
(no prefix-cache hits), sampled as the trainer samples (temperature 1, the sampled token's
log-prob): one token (the prefill), then ``--new-tokens`` more with the end-of-sequence token
ignored, from the same prompts (in the prefix cache by then, all but a last partial block): that
call over ``--new-tokens`` is the decode step; median of ``--repeats``.
A rollout step plays its episodes' turns in lockstep, so its time is about turns x (prefill of
the new tokens + the longest reply's decode steps): where a decode step of 18 sequences costs
nearly what one of 32 does, the episode count matters little.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path


def timed_generate(llm, prompts: list[list[int]], new_tokens: int) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=1.0, logprobs=0)
    started = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                 [params] * len(prompts), use_tqdm=False)
    return time.perf_counter() - started


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="key=value",
                        help="config overrides (the actor, its dtype, its KV cache)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 18, 32],
                        help="sequences generated at once (1..256 each, at most 8 sizes)")
    parser.add_argument("--context", type=int, default=600,
                        help="prompt tokens of each sequence (16..4096)")
    parser.add_argument("--new-tokens", type=int, default=48, help="decode steps timed (1..512)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size, median (1..10)")
    parser.add_argument("--out", default="runs/vllm-step-latency")
    args = parser.parse_args()
    if not 1 <= len(args.batches) <= 8 or not all(1 <= b <= 256 for b in args.batches):
        parser.error("--batches takes 1..8 sizes, each in 1..256")
    for name, low, high in (("context", 16, 4096), ("new_tokens", 1, 512), ("repeats", 1, 10)):
        if not low <= getattr(args, name) <= high:
            parser.error(f"--{name.replace('_', '-')} must be in {low}..{high}")

    from crl_harness.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, ["actor.rollout_engine=vllm", *args.set])
    except ConfigError as err:
        parser.error(str(err))
    if max(args.batches) * (args.context + args.new_tokens + 1) > cfg.actor.kv_cache_tokens:
        parser.error(f"the largest batch x (--context + --new-tokens) must fit "
                     f"actor.kv_cache_tokens ({cfg.actor.kv_cache_tokens}), or the engine "
                     "would preempt sequences and time their recomputation")

    from crl_harness.eval.heldout import load_actor

    rng = random.Random(0)
    backend = load_actor(cfg, cfg.starting_model(), cfg.actor.dtype)
    vocab = len(backend.tokenizer)

    def fresh(n: int) -> list[list[int]]:
        return [[rng.randrange(vocab) for _ in range(args.context)] for _ in range(n)]

    try:
        timed_generate(backend.llm, fresh(2), 4)  # the engine's first call pays its warm-up
        rows = []
        for batch in args.batches:
            prefill, decode = [], []
            for _ in range(args.repeats):
                prompts = fresh(batch)
                prefill.append(timed_generate(backend.llm, prompts, 1))
                # the same prompts again: their keys and values are in the prefix cache (all
                # but a last partial block), so this call is the decode steps
                decode.append(timed_generate(backend.llm, prompts, args.new_tokens + 1)
                              / args.new_tokens)
            row = {"batch": batch, "prefill_s": statistics.median(prefill),
                   "prefill_tokens_per_s": batch * args.context / statistics.median(prefill),
                   "decode_step_ms": 1000 * statistics.median(decode),
                   "decode_tokens_per_s": batch / statistics.median(decode)}
            rows.append(row)
            print(f"batch {batch:3d}: prefill of {batch} x {args.context} tokens "
                  f"{row['prefill_s']:.2f} s ({row['prefill_tokens_per_s']:.0f} tok/s); decode step "
                  f"{row['decode_step_ms']:.0f} ms ({row['decode_tokens_per_s']:.0f} tok/s)",
                  flush=True)
    finally:
        backend.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_step_latency.json").write_text(json.dumps(
        {"config": args.config, "overrides": args.set, "dtype": cfg.actor.dtype,
         "context": args.context, "new_tokens": args.new_tokens, "repeats": args.repeats,
         "rows": rows}, indent=2))
    print(f"wrote {out / 'vllm_step_latency.json'}")


if __name__ == "__main__":
    main()
