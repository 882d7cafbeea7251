"""Seconds the hardening cases take: pathological replies and tool calls, a hub id without the hub.

The tests check what these cases return (no block found, a refusal, one error line); this script
checks how fast, against the bounds the tests once asserted, which a busy 2-core machine can
miss. A parser that backtracks takes seconds on these inputs where a linear one takes
milliseconds; an ``hf:`` hub id on a machine without the hub fails at once from the local cache
where transformers alone retried the hub for about a minute; SWE-bench Verified with no local copy
and no hub fails at once where the datasets library retried the hub for about 30 s. Each figure
is the median of ``--repeats`` runs; the script exits 1 when one is over its bound. The hub case
needs the ``train`` extra (torch, transformers) and is left out, with the reason, without it.

    .venv/bin/python benchmarks/hardening_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from crl_envs.swebench.sandbox import LocalSandbox, UnisolatedSandboxWarning
from crl_envs.swebench.tools import MAX_ACTION_CHARS, ToolCallError, Tools, parse_tool_call
from crl_harness.experience import parse_verdict
from crl_harness.experience.ask import parse_answer_text, parse_ask
from crl_harness.prompting import parse_answer


def _long(reply: str, chars: int = 65_536) -> str:
    return (reply * (chars // len(reply) + 1))[:chars]


def _refused(call: Callable[[], object]) -> None:
    try:
        call()
    except ToolCallError:
        return
    raise AssertionError("the pathological tool call was not refused")


def tool_calls(tools: Tools) -> None:
    """The pathological actions of tests/envs/swebench/test_swebench_hardening.py, in turn."""
    _refused(lambda: parse_tool_call("<function=bash>" * (190_000 // len("<function=bash>"))))
    _refused(lambda: parse_tool_call("<function=" * 19_000))  # tags without their ">"
    _refused(lambda: parse_tool_call("<function=bash><parameter=command>"
                                     + "<parameter=x>" * 14_000))
    assert not tools.call("<function=bash>" * (MAX_ACTION_CHARS // 10)).valid


def hub_id_without_the_hub() -> None:
    """Load a hub id with the hub unreachable: one ``ModelNotFoundError``."""
    from crl_harness.models import HFBackend, ModelNotFoundError, hf_loading

    reachable = hf_loading.hub_reachable
    hf_loading.hub_reachable = lambda timeout=3.0: False
    try:
        HFBackend("someorg/no-such-model-anywhere")
    except ModelNotFoundError:
        return
    finally:
        hf_loading.hub_reachable = reachable
    raise AssertionError("a model that does not exist was loaded")


def verified_without_data_or_hub() -> None:
    """SWE-bench Verified with no local copy and a hub that does not answer (the discard port):
    one ``DataNotFoundError``."""
    from crl_envs.data import DataNotFoundError
    from crl_envs.swebench import data

    source, saved = data._verified_source, {k: os.environ.pop(k, None)
                                            for k in ("HF_ENDPOINT", "HF_HUB_OFFLINE")}
    data._verified_source = lambda data_dir: data.UPSTREAM_ID  # as where no copy is found
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
    try:
        data.load_instances("verified")
    except DataNotFoundError:
        return
    finally:
        data._verified_source = source
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value
    raise AssertionError("SWE-bench Verified loaded without its data or the hub")


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_cases(box: LocalSandbox, repeats: int) -> int:
    """Print each case's median against its bound; return how many were over."""
    # (case, run, bound in seconds)
    cases: list[tuple[str, Callable[[], object], float]] = [
        ("parse_answer, 64 KB",
         lambda: parse_answer(_long("<think>" + "</think><answer>" * 4_000)), 0.1),
        ("parse_verdict, 64 KB", lambda: parse_verdict(_long("<answer>" * 8_000)), 0.1),
        ("parse_answer_text, 64 KB", lambda: parse_answer_text(_long("<answer>" * 8_000)), 0.1),
        ("parse_ask, 64 KB", lambda: parse_ask(_long("<think>" + "</think>" * 8_000)), 0.1),
        ("4 pathological tool calls", lambda: tool_calls(Tools(box)), 2.0),
        ("SWE-bench Verified, no data, no hub", verified_without_data_or_hub, 5.0),
    ]
    if importlib.util.find_spec("transformers") is None:
        print("hf: hub id without the hub: left out, transformers is not installed "
              "(pip install 'crl-gym[train]')")
    else:
        hub_id_without_the_hub()  # once before timing: imports torch and transformers
        cases.append(("hf: hub id without the hub", hub_id_without_the_hub, 20.0))
    over = 0
    print(f"{'case':<36} {'median s':>9} {'bound s':>8}")
    for name, run, bound in cases:
        seconds = median_seconds(run, repeats)
        over += seconds >= bound
        print(f"{name:<36} {seconds:>9.4f} {bound:>8g}{'  OVER' if seconds >= bound else ''}",
              flush=True)
    return over


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per case (the median counts)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)
        source = Path(tmp) / "src"
        source.mkdir()
        (source / "mod.py").write_text("a = 1\n")
        box = LocalSandbox(source)
        try:
            over = run_cases(box, args.repeats)
        finally:
            box.close()
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
