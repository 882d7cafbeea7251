"""The ``openai:`` backend: token counts from the server's usage, the context budget (the server's
model info or ``--max-context``), a URL without a scheme as one line, and per-episode errors
(a prompt over the context, a timeout) recorded in that episode while the eval goes on.

Two servers: a small real HTTP server in this file that speaks the chat-completions protocol
(canned replies, vLLM's error shapes, on demand), and, marked slow, ``transformers serve`` with
the tiny model.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("openai", reason="the openai extra: pip install 'crl-gym[openai]'")

from crl_envs.errors import UserFacingError  # noqa: E402
from crl_harness.cli import main  # noqa: E402
from crl_harness.eval import episode_specs, evaluate, summarize  # noqa: E402
from crl_harness.models.openai import DEFAULT_CONTEXT, OpenAIBackend, OpenAIServerError  # noqa: E402
from crl_harness.models.registry import load_backend  # noqa: E402
from crl_harness.rollout import RolloutConfig  # noqa: E402

REPLY = "<think>I try north.</think><answer>north</answer>"
OVERFLOW = ("This model's maximum context length is 64 tokens. However, you requested 99 tokens "
            "in the messages. Please reduce the length of the messages.")


class ChatServer(ThreadingHTTPServer):
    """Chat completions with a canned reply; ``max_messages`` (a prompt with more messages is a
    vLLM-style 400 context overflow), ``slow_word`` (a prompt holding it is answered after
    ``delay`` s), ``context`` (the model info's ``max_model_len``; None: no model info).
    A hostile server on demand: ``reply`` (the content sent), ``raw`` (the whole body of a 200
    reply), ``trickle`` ((where, seconds): the headers or the body sent a byte every 0.1 s for
    that long), ``refuse_after`` ((n, status): every request after the n-th answered so)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ChatHandler)
        self.max_messages: int | None = None
        self.slow_word, self.delay = "", 0.0
        self.context: int | None = None
        self.requests: list[dict] = []
        self.reply = REPLY
        self.raw: bytes | None = None
        self.trickle: tuple[str, float] | None = None
        self.refuse_after: tuple[int, int] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class ChatHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        server: ChatServer = self.server  # type: ignore[assignment]
        if self.path != "/v1/models":
            return self._send(404, {"error": {"message": "not found"}})
        data = [] if server.context is None else [
            {"id": "canned", "object": "model", "created": 0, "owned_by": "test",
             "max_model_len": server.context}]
        self._send(200, {"object": "list", "data": data})

    def do_POST(self):
        server: ChatServer = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.requests.append(body)
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": "not found"}})
        if server.refuse_after and len(server.requests) > server.refuse_after[0]:
            return self._send(server.refuse_after[1], {"error": {"message": "key revoked"}})
        if server.raw is not None:
            return self._send_bytes(200, server.raw)
        if server.trickle:
            return self._trickle(*server.trickle)
        messages = body["messages"]
        if server.max_messages is not None and len(messages) > server.max_messages:
            return self._send(400, {"object": "error", "message": OVERFLOW,
                                    "type": "BadRequestError", "param": None, "code": 400})
        text = " ".join(m["content"] for m in messages)
        if server.slow_word and server.slow_word in text:
            time.sleep(server.delay)
        self._send(200, {
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": server.reply},
                         "finish_reason": "stop", "logprobs": None}],
            # 2 characters a token, as MiniHack's maps run
            "usage": {"prompt_tokens": len(text) // 2 + 8 * len(messages),
                      "completion_tokens": 12, "total_tokens": 0}})

    def _send(self, code: int, payload: dict) -> None:
        self._send_bytes(code, json.dumps(payload).encode())

    def _send_bytes(self, code: int, data: bytes) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            pass

    def _trickle(self, where: str, seconds: float) -> None:
        """A valid reply, sent one byte every 0.1 s for ``seconds`` first: JSON whitespace
        before the body, or a header's value."""
        body = json.dumps({"choices": [{"message": {"content": REPLY}}]}).encode()
        pad = int(seconds / 0.1)
        if where == "body":
            head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {pad + len(body)}\r\n\r\n").encode()
            slow, tail = b" " * pad, body
        else:
            head = b"HTTP/1.1 200 OK\r\nX-Pad: "
            slow = b"x" * pad
            tail = (f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                    f"\r\n\r\n").encode() + body
        try:
            self.wfile.write(head)
            for byte in slow:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.1)
            self.wfile.write(tail)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


@pytest.fixture
def server():
    server = ChatServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_tokens_come_from_the_servers_usage_and_calibrate_the_budget(server):
    client = OpenAIBackend(server.url, "canned")
    prompt = [{"role": "user", "content": "#" * 400}]
    assert client.count_tokens(prompt) == 200 + 8  # before any answer: 2 characters a token
    [g] = client.generate([[{"role": "user", "content": "x" * 1000}]], max_new_tokens=16,
                          temperature=0.0)
    assert g.text == REPLY and g.usage_tokens == 12 and not g.error
    assert client.count_tokens(prompt) == 200 + 8  # the server counted 2 characters a token


def test_context_from_max_context_else_the_servers_model_info_else_the_default(server):
    assert OpenAIBackend(server.url, "canned").max_context == DEFAULT_CONTEXT
    server.context = 4096
    served = OpenAIBackend(server.url, "canned")
    assert (served.max_context, served.context_source) == (4096, "the server's model info")
    given = load_backend(f"openai:{server.url}#canned", max_context=1024, dtype="auto")
    assert (given.max_context, given.context_source) == (1024, "--max-context")


def test_a_prompt_over_the_context_or_a_timeout_is_that_prompts_error(server):
    server.max_messages, server.slow_word, server.delay = 1, "SLOW", 3.0
    client = OpenAIBackend(server.url, "canned", timeout=0.5, max_retries=0)
    ok, over, slow = client.generate(
        [[{"role": "user", "content": "go"}],
         [{"role": "system", "content": "rules"}, {"role": "user", "content": "go"}],
         [{"role": "user", "content": "SLOW"}]], max_new_tokens=16, temperature=0.0)
    assert ok.text == REPLY and not ok.error
    assert over.error.startswith("openai: HTTP 400: This model's maximum context length is 64")
    assert "did not answer within 0.5 s" in slow.error
    assert "\n" not in over.error + slow.error


def test_no_server_or_a_wrong_path_still_stops_at_once_with_one_line(server):
    with pytest.raises(OpenAIServerError, match="404"):
        OpenAIBackend(server.url.removesuffix("/v1") + "/nope", "canned").generate(
            [[{"role": "user", "content": "go"}]], max_new_tokens=4, temperature=0.0)
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    closed = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "canned", max_retries=0, timeout=2)
    with pytest.raises(OpenAIServerError, match="is the server running"):
        closed.generate([[{"role": "user", "content": "go"}]], max_new_tokens=4, temperature=0.0)


def test_a_url_without_its_scheme_is_one_line(tmp_path, capsys):
    with pytest.raises(UserFacingError, match=r"openai:http://localhost:8000/v1#MODEL"):
        load_backend("openai:localhost:8000#m")
    code = main(["eval", "--agent", "openai:localhost:8000#m", "--envs", "CRL/Sokoban-v0",
                 "--episodes", "1", "--no-progress", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "'localhost:8000' is not a URL" in err and len(err.strip().splitlines()) == 1


def test_an_overflowing_episode_is_recorded_and_the_eval_goes_on(server, tmp_path):
    """Sokoban episodes of 2 steps fit; MiniHack episodes of 6 steps pass 6 messages at their
    4th turn, which this server refuses as a context overflow: each of those ends with the
    error in its own record, and every other episode is played."""
    pytest.importorskip("nle", reason="the minihack extra: pip install 'crl-gym[minihack]'")
    server.max_messages = 6
    envs = ["CRL/Sokoban-v0", "CRL/MiniHackRoom-v0"]
    rollout = RolloutConfig.from_config(None, max_new_tokens=16, env_kwargs={
        "CRL/Sokoban-v0": {"max_episode_steps": 2},
        "CRL/MiniHackRoom-v0": {"max_episode_steps": 6}})
    agent = f"openai:{server.url}#canned"
    trajectories = evaluate(agent, episode_specs(envs, [0, 1]), backend=load_backend(agent),
                            rollout=rollout, results_path=tmp_path / "results.jsonl")
    by_env = {s.env_id: s for s in summarize(trajectories)}
    assert by_env["CRL/Sokoban-v0"].episodes == 2 and by_env["CRL/Sokoban-v0"].errors == 0
    assert by_env["CRL/Sokoban-v0"].generated_tokens == 2 * 2 * 12  # the server's usage
    assert by_env["CRL/MiniHackRoom-v0"].errors == 2
    for t in trajectories:
        if t.env_id == "CRL/MiniHackRoom-v0":
            assert "maximum context length" in t.error and t.steps == 3
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert sum('"CRL/Sokoban-v0"' in line for line in lines) == 2


GO = [{"role": "user", "content": "go"}]


@pytest.mark.parametrize("where", ["headers", "body"])
def test_hardening_a_trickling_server_cannot_extend_a_request_past_its_timeout(server, where):
    """One byte every 0.1 s for 4 s once kept a timeout=1 request alive the whole 4 s (the
    timeout was per read); now the request, retries included, ends by its timeout."""
    server.trickle = (where, 4.0)
    client = OpenAIBackend(server.url, "canned", timeout=1.0, max_retries=2)
    started = time.monotonic()
    [g] = client.generate([GO], max_new_tokens=16, temperature=0.0)
    assert time.monotonic() - started < 3.0  # it trickles for 4 s
    assert g.error.startswith("openai: the server did not answer within 1 s"), g.error
    server.trickle = None
    [g] = client.generate([GO], max_new_tokens=16, temperature=0.0)  # the client still works
    assert g.text == REPLY and not g.error


def _completion(**changes) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": REPLY},
              "finish_reason": "stop",
              "logprobs": {"content": [{"token": "a", "logprob": -0.5, "bytes": [97]}]}}
    reply = {"id": "x", "object": "chat.completion", "choices": [choice],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    for path, value in changes.items():
        *parents, key = path.split("__")
        where = reply
        for parent in parents:
            where = where[parent][0] if parent == "choices" else where[parent]
        where[key] = value
    return reply


@pytest.mark.parametrize("raw", [
    pytest.param(b"not json", id="not-json"),
    pytest.param(b"<html><body>502 Bad Gateway</body></html>", id="html"),
    pytest.param(b"[1, 2]", id="a-list"),
    pytest.param(b"\xff\xfe{}", id="not-utf8"),
    pytest.param(json.dumps(_completion(choices=[])).encode(), id="no-choices"),
    pytest.param(json.dumps(_completion(choices__message=None)).encode(), id="null-message"),
    pytest.param(json.dumps(_completion(choices__message={"content": 7})).encode(),
                 id="integer-content"),
    pytest.param(json.dumps(_completion(choices__logprobs={"content": [{"token": "a",
                 "logprob": None}]})).encode(), id="null-logprob"),
    pytest.param(json.dumps(_completion(choices__logprobs={"content": [{"token": None,
                 "logprob": -1.0}]})).encode(), id="null-token"),
    pytest.param(json.dumps(_completion(choices__token_ids=[1, "2"])).encode(), id="text-id"),
    pytest.param(json.dumps(_completion(usage="12")).encode(), id="usage-text"),
    pytest.param(json.dumps(_completion(usage={"completion_tokens": -3})).encode(),
                 id="usage-negative"),
])
def test_hardening_a_malformed_200_reply_is_that_episodes_error(server, raw):
    server.raw = raw
    client = OpenAIBackend(server.url, "canned", max_retries=0)
    [g] = client.generate([GO], max_new_tokens=16, temperature=0.0)
    assert g.error.startswith("openai: the reply is no chat completion ("), g.error
    assert "\n" not in g.error and not g.text


def test_hardening_a_server_that_stops_mid_eval_leaves_the_report_of_what_was_played(
        server, tmp_path, capsys):
    """A key revoked after the 4th request: the eval stops in one line, as before, and its
    report and chart now hold the two episodes played (they were lost)."""
    server.refuse_after = (4, 401)
    out = tmp_path / "ev"
    code = main(["eval", "--agent", f"openai:{server.url}#canned", "--envs", "CRL/Sokoban-v0",
                 "--seeds", "0-3", "--max-live", "1", "--max-new-tokens", "16", "--env-kwargs",
                 "max_episode_steps=2", "--no-progress", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and "answered 401" in captured.err and "Traceback" not in captured.err
    assert "stopped after 2 of 4 episode(s)" in captured.out
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["meta"]["stopped"] and len(report["episodes"]) == 2
    assert (out / "success.png").stat().st_size > 0
    assert len((out / "results.jsonl").read_text(encoding="utf-8").splitlines()) == 2


def test_hardening_what_is_kept_of_a_reply_is_bounded_by_the_request(server):
    """A 5 MB reply to max_new_tokens=16 was kept whole (50 MB replies: a 150 MB transcript);
    now a body over ``reply_byte_limit`` is that episode's error, and of a smaller one at most
    64 characters and one log-prob a token asked for are kept."""
    from crl_harness.models.openai import reply_byte_limit

    client = OpenAIBackend(server.url, "canned", max_retries=0)
    server.reply = "x" * 5_000_000
    [g] = client.generate([GO], max_new_tokens=16, temperature=0.0)
    limit = reply_byte_limit(16, DEFAULT_CONTEXT)
    assert g.error == (f"openai: the reply is over {limit} bytes, too long for "
                       "max_new_tokens=16") and not g.text
    server.raw = json.dumps(_completion(
        choices__message={"content": "y" * 50_000}, usage={"completion_tokens": 10**12},
        choices__logprobs={"content": [{"token": "y", "logprob": -0.1}] * 500})).encode()
    [g] = client.generate([GO], max_new_tokens=16, temperature=0.0)
    assert not g.error and len(g.text) == 16 * 64 and g.finish_reason == "length"
    assert len(g.logprobs) == 16 and g.usage_tokens == 16


def test_hardening_a_lone_surrogate_in_a_reply_reaches_the_transcript(server, tmp_path):
    """The JSON escape \\ud800 in a reply once crashed the transcript write after the attempt
    was recorded, so no --resume ever wrote that transcript."""
    server.reply = REPLY + "\ud800"  # json.dumps sends it as the escape \ud800
    out = tmp_path / "ev"
    assert main(["eval", "--agent", f"openai:{server.url}#canned", "--envs", "CRL/Sokoban-v0",
                 "--seeds", "0-1", "--max-new-tokens", "16", "--env-kwargs",
                 "max_episode_steps=2", "--no-progress", "--out", str(out)]) == 0
    records = [json.loads(line) for line in
               (out / "transcripts.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted(r["seed"] for r in records) == [0, 1]
    assert records[0]["turns"][0]["reply"] == REPLY + "\ufffd"
    assert len((out / "results.jsonl").read_text(encoding="utf-8").splitlines()) == 2


# ----------------------------------------------------------------- a real server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def transformers_server(tmp_path_factory):
    """``transformers serve`` pinned to the tiny model (about 10 s to start here)."""
    pytest.importorskip("torch")
    needs = "transformers serve needs the serving extra: pip install 'crl-gym[serving]'"
    pytest.importorskip("fastapi", reason=needs)
    pytest.importorskip("uvicorn", reason=needs)
    command = shutil.which("transformers", path=str(Path(sys.executable).parent))
    if command is None:
        pytest.skip("no transformers command beside this Python")
    from crl_harness.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("serve")
    model = build_tiny_model(root / "tiny")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(root / "hub"),
           "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    (root / "hub").mkdir()
    log = open(root / "serve.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen([command, "serve", str(model), "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.skip(f"transformers serve exited: {(root / 'serve.log').read_text()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("transformers serve did not listen within 120 s")
                time.sleep(0.5)
        yield url, str(model)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.mark.slow
def test_crl_eval_against_transformers_serve(transformers_server, tmp_path, capsys):
    url, model = transformers_server
    out = tmp_path / "run"
    code = main(["eval", "--agent", f"openai:{url}#{model}", "--envs", "CRL/Sokoban-v0",
                 "--episodes", "2", "--max-new-tokens", "16", "--max-context", "1024",
                 "--no-progress", "--out", str(out), "--env-kwargs", "max_episode_steps=3"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "context 1024 tokens (--max-context)" in printed.out
    report = json.loads((out / "report.json").read_text())
    [sokoban] = report["envs"]
    assert sokoban["episodes"] == 2 and sokoban["errors"] == 0
    assert sokoban["generated_tokens"] > 0  # the server's usage: the tiny model's replies
    assert all(e["generated_tokens"] > 0 for e in report["episodes"])


@pytest.mark.slow
def test_crl_eval_against_transformers_serve_30_steps_transcripts_and_resume(
        transformers_server, tmp_path, capsys):
    """Issue 37's must-show against a real server: a 30-step MiniHack eval whose full-history
    prompts outgrow the context budget completes (the oldest turns are dropped, nothing
    aborts), counts the server's tokens and writes every turn's transcript; an interrupted eval
    resumed with ``--resume`` plays only the episode it had not finished."""
    url, model = transformers_server
    out = tmp_path / "run"
    argv = ["eval", "--agent", f"openai:{url}#{model}", "--envs", "CRL/MiniHackRoom-v0",
            "--episodes", "2", "--max-new-tokens", "8", "--max-context", "512", "--no-progress",
            "--out", str(out), "--env-kwargs", "max_episode_steps=30"]
    assert main(argv) == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    [room] = report["envs"]
    assert room["episodes"] == 2 and room["errors"] == 0 and room["generated_tokens"] > 0
    records = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    # the tiny model never wins: every episode plays its 30 turns, each recorded
    assert [len(r["turns"]) for r in records] == [30, 30]
    # interrupted after the first episode: one result and one transcript kept, no report
    for name in ("results.jsonl", "transcripts.jsonl"):
        first = (out / name).read_text().splitlines(keepends=True)[0]
        (out / name).write_text(first)
    (out / "report.json").unlink()
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    assert "1 episode(s) done, 1 to play" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert sorted(r["seed"] for r in records) == sorted({r["seed"] for r in records})
    assert len(records) == 2 and json.loads((out / "report.json").read_text())["envs"][0][
        "episodes"] == 2
