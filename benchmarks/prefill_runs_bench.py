"""What one more prefill forward pass costs, in prompt tokens: the ``PASS_TOKENS`` with which
``prefill_runs`` trades padding against passes.

Times prefill forward passes of the HF backend's model over ``--context`` tokens of stored keys
and values (a later turn's prefill: new tokens after a reused history), at several sizes
(rows x new tokens), fits ``seconds = pass + per_token * tokens`` by least squares, and prints
``pass / per_token``: how many padded tokens cost as much as one more pass. Median of
``--repeats`` timings per size.

    .venv/bin/python benchmarks/prefill_runs_bench.py
    .venv/bin/python benchmarks/prefill_runs_bench.py --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="assets/warmstart/cpu-demo/actor")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--context", type=int, default=600, help="stored tokens per row (1..4096)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per size (1..50)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if not 1 <= args.context <= 4096 or not 1 <= args.repeats <= 50:
        parser.error("--context must be in 1..4096 and --repeats in 1..50")

    import torch

    from crl_harness.models import load_backend
    from crl_harness.models.kv_cache import SlabCache

    torch.set_num_threads(args.threads)
    backend = load_backend(f"hf:{args.model}", dtype=args.dtype)
    layout, model = backend.kv_layout, backend.model
    sizes = [(1, 16), (1, 64), (2, 64), (4, 64), (4, 128), (8, 128), (16, 128), (32, 128)]
    points = []
    for rows, new in sizes:
        width = args.context + new
        slab = torch.zeros((layout.layers, 2, rows, layout.kv_heads, width, layout.head_dim),
                           dtype=model.dtype)
        ids = torch.randint(100, 30000, (rows, new))
        positions = torch.arange(args.context, width).expand(rows, new)
        mask = torch.ones((rows, width), dtype=torch.long)
        times = []
        with torch.inference_mode():
            for _ in range(args.repeats + 1):  # the first: warm-up
                start = time.perf_counter()
                model(input_ids=ids, attention_mask=mask, position_ids=positions,
                      past_key_values=SlabCache(slab, args.context), use_cache=True,
                      logits_to_keep=1)
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times[1:])
        points.append((rows * new, seconds))
        print(f"{rows:3d} rows x {new:3d} new tokens: {seconds * 1000:8.1f} ms "
              f"({rows * new / seconds:6.0f} tok/s)", flush=True)
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    per_token = (sum((x - mean_x) * (y - mean_y) for x, y in points)
                 / sum((x - mean_x) ** 2 for x, _ in points))
    per_pass = mean_y - per_token * mean_x
    print(f"{args.model} ({args.dtype}, {args.threads} threads, {args.context} tokens of context): "
          f"a pass costs {per_pass * 1000:.1f} ms, a token {per_token * 1000:.2f} ms: one pass = "
          f"{per_pass / per_token:.0f} tokens")


if __name__ == "__main__":
    main()
