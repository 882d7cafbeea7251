"""Where a prefill and a decode step of the HF backend spend their time.

Builds ``--rows`` real first prompts (the env's system prompt and first observation, as the
rollout engine writes them), pads their context to ``--context`` tokens of history, and times:
- a decode step at that context (the batch's KV cache filled, one new token per row; median of
  ``--steps``), the issue's "32 rows with 900 tokens of context";
- a fresh prefill of the real prompts (no reuse);
then profiles both with ``torch.profiler`` and sums self CPU time by kind of work: matrix
products (the linear layers and the LM head), attention, K/V copies and cache writes, sampling
over the vocabulary, norms/activations/rotary, and the rest; "Python and dispatch" is the wall
time no operator accounts for.

    .venv/bin/python benchmarks/generation_profile.py                         # fp32, grouped decode
    .venv/bin/python benchmarks/generation_profile.py --attn sdpa             # the path before
    CRL_MALLOC=system .venv/bin/python benchmarks/generation_profile.py --attn sdpa
    .venv/bin/python benchmarks/generation_profile.py --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

KINDS = {  # aten operator name fragments -> kind of work (first match wins; sampling before
    # attention, so that the sampler's log_softmax is not counted as attention's softmax)
    "matmul": ("addmm", "aten::mm", "bmm", "matmul", "linear"),
    "K/V copies and cache writes": ("copy_", "index_select", "expand", "clone", "cat", "contiguous",
                                    "index_put", "slice_scatter", "fill_"),
    "sampling": ("log_softmax", "multinomial", "argmax", "sort", "searchsorted", "gather", "exp",
                 "cumsum", "masked_fill", "scatter", "div", "rand", "uniform"),
    "attention": ("scaled_dot_product", "_flash_attention", "softmax", "baddbmm"),
    "norms, activations, rotary": ("mul", "add", "rsqrt", "pow", "mean", "silu", "neg", "sin",
                                   "cos", "embedding"),
}


def _kind(name: str) -> str:
    for kind, fragments in KINDS.items():
        if any(f in name for f in fragments):
            return kind
    return "other operators"


def _profile(fn, wall: float) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    seconds: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        seconds[_kind(event.key)] += event.self_cpu_time_total / 1e6
    seconds["Python and dispatch"] = max(wall - sum(seconds.values()), 0.0)
    return seconds


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="assets/warmstart/cpu-demo/actor")
    parser.add_argument("--env", default="CRL/MiniHackRoom-v0")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--context", type=int, default=900, help="tokens of context per row")
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--attn", default="grouped_decode", choices=["grouped_decode", "sdpa"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from crl_harness.models import HFBackend
    from crl_harness.models.base import encode_chat
    from crl_harness.models.hf import sample_next_token
    from crl_harness.models.kv_cache import SlabCache
    from crl_harness.models.names import resolve_model_path
    from crl_harness.rollout import EpisodeSpec, LiveEpisode, make_env

    backend = HFBackend(resolve_model_path(args.model), dtype=args.dtype, kv_reuse=False,
                        attn_implementation=args.attn)
    model, layout = backend.model, backend.kv_layout
    prompts = []
    for seed in range(args.rows):
        env = make_env(args.env, variant="dark", max_episode_steps=6)
        episode = LiveEpisode(EpisodeSpec(args.env, seed=seed), env, history=None)
        episode.reset(with_experience_option=False)
        prompts.append(encode_chat(backend.tokenizer, episode.conversation.messages()))
        env.close()
    print(f"{args.model}: {args.rows} rows, {args.dtype}, attention {args.attn}, "
          f"{args.threads} threads, malloc {os.environ.get('CRL_MALLOC', 'tuned')}; real prompts "
          f"of {statistics.mean(map(len, prompts)):.0f} tokens")

    B, T = args.rows, args.context
    slab = torch.randn(layout.layers, 2, B, layout.kv_heads, T + args.steps + 1, layout.head_dim,
                       dtype=model.dtype)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[::2, : T // 10] = 0  # left padding on half the rows, as a length-sorted batch has
    token = torch.randint(0, model.config.vocab_size, (B, 1))

    def decode_step(step: int) -> None:
        cache = SlabCache(slab, T + step)
        attention = torch.cat([mask, mask.new_ones((B, step + 1))], dim=-1)
        out = model(input_ids=token, attention_mask=attention, past_key_values=cache,
                    position_ids=torch.full((B, 1), T + step), use_cache=True)
        sample_next_token(out.logits[:, -1, :], 0.99, 1.0)

    def prefill() -> None:
        backend.generate_from_ids(prompts, max_new_tokens=1, temperature=0.99, seed=0)

    with torch.inference_mode():
        decode_step(0)  # warm-up
        times = []
        for step in range(args.steps):
            start = time.perf_counter()
            decode_step(step)
            times.append(time.perf_counter() - start)
        decode = statistics.median(times)
        start = time.perf_counter()
        prefill()
        prefill_seconds = time.perf_counter() - start
        print(f"decode step at {B} rows x {T} tokens: {decode:.3f} s (median of {args.steps}: "
              f"{', '.join(f'{t:.3f}' for t in times)}); {B / decode:.0f} tok/s")
        print(f"fresh prefill of {sum(map(len, prompts))} prompt tokens: {prefill_seconds:.2f} s "
              f"({sum(map(len, prompts)) / prefill_seconds:.0f} tok/s)")
        for name, fn, wall in (("decode step", lambda: decode_step(0), decode),
                               ("prefill", prefill, prefill_seconds)):
            seconds = _profile(fn, wall)
            total = sum(seconds.values())
            parts = sorted(seconds.items(), key=lambda kv: -kv[1])
            print(f"{name} profile: " + "; ".join(f"{k} {v:.3f} s ({100 * v / total:.0f}%)"
                                                  for k, v in parts if v > 0))


if __name__ == "__main__":
    main()
