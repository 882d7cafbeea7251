"""What this CPU's matrix products give: GFLOP/s of torch's GEMM at SmolLM2-135M's shapes, fp32
and bf16, the ceiling under every generation figure (0.27 GFLOP a token).

    .venv/bin/python benchmarks/gemm_rate.py                 # all cores
    .venv/bin/python benchmarks/gemm_rate.py --threads 1 --repeats 20

Shapes (rows x inner x columns, the weights being inner x columns): a prefill pass of 2,048
tokens and a decode step of 32 rows through the MLP's up projection (576 -> 1536), its down
projection (1536 -> 576) and, in decode, the vocabulary head (576 -> 49,152; a prefill needs the
last position's logits only). Median of ``--repeats`` timed
products after one untimed; bf16 is marked where the CPU lacks AVX512-BF16 / AMX (torch then
emulates it).
"""

from __future__ import annotations

import argparse
import statistics
import time

SHAPES = {  # name: (rows, inner, columns)
    "prefill up 2048x576x1536": (2048, 576, 1536),
    "prefill down 2048x1536x576": (2048, 1536, 576),
    "decode up 32x576x1536": (32, 576, 1536),
    "decode head 32x576x49152": (32, 576, 49152),
}


def gflops(rows: int, inner: int, columns: int, dtype, repeats: int) -> float:
    """Median GFLOP/s of ``[rows, inner] @ [inner, columns]`` in ``dtype``."""
    import torch

    a = torch.randn(rows, inner, dtype=dtype)
    b = torch.randn(inner, columns, dtype=dtype)
    torch.mm(a, b)  # first call: kernel selection, pages
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * rows * inner * columns / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--repeats", type=int, default=10, help="timed products a shape (1..1000)")
    args = parser.parse_args()
    if not 1 <= args.repeats <= 1000 or args.threads < 0:
        parser.error("--repeats must be in 1..1000 and --threads >= 0")

    import torch

    from crl_harness.models.hf import cpu_computes_bf16

    if args.threads:
        torch.set_num_threads(args.threads)
    native = cpu_computes_bf16()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); bf16 "
          f"{'native' if native else 'emulated (no AVX512-BF16 / AMX)'}")
    print(f"{'shape':<30}{'fp32 GFLOP/s':>14}{'bf16 GFLOP/s':>14}")
    for name, shape in SHAPES.items():
        fp32 = gflops(*shape, torch.float32, args.repeats)
        bf16 = gflops(*shape, torch.bfloat16, args.repeats)
        print(f"{name:<30}{_rate(fp32):>14}{_rate(bf16):>14}")


def _rate(gflop_s: float) -> str:
    """Whole GFLOP/s, or two decimals under 10: an emulated bf16 product can run under 1 GFLOP/s
    (an AMD EPYC with AVX2 only), which a whole number would print as 0."""
    return f"{gflop_s:.0f}" if gflop_s >= 10 else f"{gflop_s:.2f}"


if __name__ == "__main__":
    main()
