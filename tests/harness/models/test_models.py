"""Model backends: exact sampled-token log-probs, stop/pad handling, loading, the HTTP client."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_harness.models import Generation, HFBackend, ModelNotFoundError, load_backend  # noqa: E402
from crl_harness.models.openai import OpenAIBackend, OpenAIServerError  # noqa: E402
from crl_harness.models.tiny import build_tiny_model  # noqa: E402

torch.set_num_threads(1)

CHATS = [
    [{"role": "user", "content": "go"}],
    [{"role": "system", "content": "You play a grid game."},
     {"role": "user", "content": "A wall is to the north. The goal is east. What now?"}],
    [{"role": "user", "content": "pick up the key and open the door to the east please"}],
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def backend(tiny_dir):
    # fp32 on whatever device "auto" picks: the exact-log-prob checks below hold in fp32 (bf16,
    # the CUDA default, is checked against an fp32 recomputation in test_device.py)
    return HFBackend(tiny_dir, dtype="float32")


def recomputed_logprobs(backend: HFBackend, g: Generation, temperature: float) -> list[float]:
    """Teacher-forced log-probs of the generated tokens, one unpadded sequence at a time, on the
    backend's device."""
    device = backend.model.device
    ids = torch.tensor([g.prompt_token_ids + g.token_ids], device=device)
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0, len(g.prompt_token_ids) - 1:-1].float()
    if temperature > 0:
        logits = logits / temperature
    logps = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor(g.token_ids, device=device)
    return logps.gather(-1, targets[:, None])[:, 0].tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_are_those_of_the_sampling_distribution(backend, temperature):
    generations = backend.generate(CHATS, max_new_tokens=12, temperature=temperature, seed=1)
    assert len(generations) == len(CHATS)
    for g in generations:
        assert len(g.token_ids) == len(g.logprobs) >= 1
        assert g.token_ids  # kept as sampled, never re-tokenised from text
        assert g.prompt_token_ids[-3:] == backend.tokenizer("<|im_start|>assistant\n",
                                                            add_special_tokens=False)["input_ids"][-3:]
        assert g.logprobs == pytest.approx(recomputed_logprobs(backend, g, temperature), abs=2e-4)


def test_top_p_logprobs_are_renormalised_over_the_nucleus(backend):
    [g] = backend.generate(CHATS[:1], max_new_tokens=8, temperature=1.0, top_p=0.5, seed=3)
    full = recomputed_logprobs(backend, g, 1.0)
    # Renormalising over a nucleus of half the mass raises every sampled token's log-prob.
    assert all(lp >= f - 1e-5 for lp, f in zip(g.logprobs, full, strict=True))
    assert any(lp > f + 1e-3 for lp, f in zip(g.logprobs, full, strict=True))


def test_same_seed_same_tokens_and_batch_equals_single(backend):
    a = backend.generate(CHATS, max_new_tokens=10, temperature=1.0, seed=7)
    b = backend.generate(CHATS, max_new_tokens=10, temperature=1.0, seed=7)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    greedy_batch = backend.generate(CHATS, max_new_tokens=10, temperature=0.0)
    greedy_single = [backend.generate([c], max_new_tokens=10, temperature=0.0)[0] for c in CHATS]
    assert [g.token_ids for g in greedy_batch] == [g.token_ids for g in greedy_single]


def test_stops_with_pad_equal_to_eos_and_truncation(tiny_dir):
    """Rows stop at different steps while the pad id is itself a stop id; others hit the cap."""
    backend = HFBackend(tiny_dir, dtype="float32", max_batch_size=2)
    vocab = backend.model.config.vocab_size
    stop = set(range(0, vocab, 9))  # about one token in nine ends an answer
    backend.stop_ids = stop
    backend.pad_id = min(stop)  # pad == a stop token, as with SmolLM2 (pad == EOS == 2)
    generations = backend.generate(CHATS * 4, max_new_tokens=6, temperature=1.0, seed=0)
    reasons = {g.finish_reason for g in generations}
    assert reasons == {"stop", "length"}  # both kinds occur in one batch
    for g in generations:
        assert len(g.token_ids) == len(g.logprobs)
        body = g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids
        assert not set(body) & stop  # nothing generated after the stop token
        if g.finish_reason == "stop":
            assert g.token_ids[-1] in stop  # the stop token is kept (it is trained on)
        else:
            assert len(g.token_ids) == 6
        assert g.logprobs == pytest.approx(recomputed_logprobs(backend, g, 1.0), abs=2e-4)


def test_load_weights_changes_outputs_and_rejects_bad_keys(tiny_dir):
    backend = HFBackend(tiny_dir)
    before = backend.generate(CHATS, max_new_tokens=8, temperature=0.0)
    state = {k: v.clone() for k, v in backend.model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    for key in state:
        if key.endswith("proj.weight"):
            state[key] = torch.randn(state[key].shape, generator=generator)
    backend.load_weights(state)
    after = backend.generate(CHATS, max_new_tokens=8, temperature=0.0)
    assert [g.token_ids for g in before] != [g.token_ids for g in after]
    with pytest.raises(RuntimeError):
        backend.load_weights({"not.a.weight": torch.zeros(1)})


def test_context_overflow_and_missing_models_raise_one_clear_error(tiny_dir, tmp_path):
    backend = HFBackend(tiny_dir, max_context=16)
    with pytest.raises(ValueError, match="context"):
        backend.generate(CHATS[1:2], max_new_tokens=8, temperature=0.0)
    with pytest.raises(ModelNotFoundError, match="local model directory"):
        HFBackend(tmp_path / "nothing-here")
    with pytest.raises(ModelNotFoundError, match="known"):
        _resolve("no-such-model")
    with pytest.raises(ValueError, match="hf:NAME_OR_PATH"):
        load_backend("smollm2-135m")


def _resolve(name):
    from crl_harness.models.names import resolve_model

    return resolve_model(name)


def test_tiny_model_builds_once(tiny_dir):
    stamp = (tiny_dir / "config.json").stat().st_mtime_ns
    assert build_tiny_model(tiny_dir) == tiny_dir
    assert (tiny_dir / "config.json").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_smollm2_short_name_answers_and_stops_on_eos():
    try:
        backend = load_backend("hf:smollm2-135m")
    except ModelNotFoundError as err:
        pytest.skip(str(err))
    assert backend.pad_id in backend.stop_ids  # SmolLM2: pad == EOS
    [g] = backend.generate([[{"role": "user", "content": "Say hello."}]], max_new_tokens=48,
                           temperature=0.0)
    assert g.finish_reason == "stop" and g.token_ids[-1] == backend.tokenizer.eos_token_id
    assert g.text.strip() and "<|im_end|>" not in g.text
    assert g.logprobs == pytest.approx(recomputed_logprobs(backend, g, 0.0), abs=1e-3)


# ----------------------------------------------------------------- OpenAI-compatible client
class _ChatServer(ThreadingHTTPServer):
    """A real OpenAI-compatible HTTP server in front of an HFBackend (vLLM's response shape)."""

    def __init__(self, backend: HFBackend, fail_first: int = 0):
        super().__init__(("127.0.0.1", 0), _ChatHandler)
        self.backend, self.fail_left, self.requests = backend, fail_first, []


class _ChatHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        server: _ChatServer = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.requests.append(body)
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": "not found"})
        if server.fail_left > 0:
            server.fail_left -= 1
            return self._send(503, {"error": "warming up"})
        [g] = server.backend.generate([body["messages"]], max_new_tokens=body["max_tokens"],
                                      temperature=body["temperature"], top_p=body["top_p"],
                                      seed=body.get("seed"))
        as_ids = body.get("return_tokens_as_token_ids")
        content = [{"token": f"token_id:{t}" if as_ids else server.backend.tokenizer.decode([t]),
                    "logprob": lp} for t, lp in zip(g.token_ids, g.logprobs, strict=True)]
        response = {"choices": [{"index": 0, "message": {"role": "assistant", "content": g.text},
                                 "logprobs": {"content": content},
                                 "finish_reason": g.finish_reason}],
                    "usage": {"completion_tokens": len(g.token_ids)}}
        if body.get("return_token_ids"):
            response["prompt_token_ids"] = g.prompt_token_ids
        self._send(200, response)

    def _send(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def chat_server(backend):
    server = _ChatServer(backend, fail_first=2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_openai_client_against_a_local_server(backend, chat_server):
    url = f"http://127.0.0.1:{chat_server.server_address[1]}/v1"
    client = load_backend(f"openai:{url}#tiny", token_ids=True)
    remote = client.generate(CHATS, max_new_tokens=8, temperature=0.0, seed=5)
    local = backend.generate(CHATS, max_new_tokens=8, temperature=0.0)
    assert [g.token_ids for g in remote] == [g.token_ids for g in local]
    assert [g.prompt_token_ids for g in remote] == [g.prompt_token_ids for g in local]
    for r, g in zip(remote, local, strict=True):
        assert r.text == g.text and r.finish_reason == g.finish_reason
        assert r.logprobs == pytest.approx(g.logprobs, abs=1e-5)
    assert len(chat_server.requests) == len(CHATS) + 2  # the two 503s were retried
    assert all(req["logprobs"] is True for req in chat_server.requests)


def test_openai_client_errors_are_clear(chat_server):
    port = chat_server.server_address[1]
    wrong_path = OpenAIBackend(f"http://127.0.0.1:{port}/nope", "tiny")
    chat_server.fail_left = 0
    with pytest.raises(OpenAIServerError, match="404"):
        wrong_path.generate(CHATS[:1], max_new_tokens=4, temperature=0.0)
    chat_server.server_close()  # nothing listens any more
    closed = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "tiny", max_retries=1,
                           timeout=2)
    with pytest.raises(OpenAIServerError, match="is the server running"):
        closed.generate(CHATS[:1], max_new_tokens=4, temperature=0.0)


def test_hardening_a_wrong_or_damaged_model_folder_is_one_line_naming_it(tiny_dir, tmp_path,
                                                                       capsys):
    import shutil

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from crl_harness.cli import main
    from crl_harness.models.base import ModelLoadError

    adapter = tmp_path / "adapter"
    lora = LoraConfig(r=4, target_modules=["q_proj"])
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_dir), lora).save_pretrained(adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": str(tiny_dir)}))

    def truncate(file):
        file.write_bytes(file.read_bytes()[:300])

    def set_config(folder, **changes):
        (folder / "adapter_config.json").write_text(json.dumps({**config, **changes}))

    cases = {  # name: (copy of, damage, words of the message)
        "empty": (None, lambda d: None, "no config.json"),
        "checkpoint": (None, lambda d: shutil.copytree(tiny_dir, d / "actor_hf"), "use "),
        "no-tokenizer": (tiny_dir, lambda d: (d / "tokenizer.json").unlink(), "no tokenizer"),
        "truncated": (tiny_dir, lambda d: truncate(d / "model.safetensors"), "damaged"),
        "adapter-not-json": (adapter, lambda d: (d / "adapter_config.json").write_text("{x"),
                             "adapter_config.json is damaged"),
        "adapter-list": (adapter, lambda d: (d / "adapter_config.json").write_text("[]"),
                         "names no base model"),
        "adapter-half": (adapter, lambda d: (d / "adapter_model.safetensors").unlink(),
                         "no adapter weights"),
        "adapter-truncated": (adapter, lambda d: truncate(d / "adapter_model.safetensors"),
                              "damaged"),
        "adapter-rank": (adapter, lambda d: set_config(d, base_model_name_or_path=str(tiny_dir),
                                                       r=8), "do not fit"),
        "adapter-targets": (adapter, lambda d: set_config(
            d, base_model_name_or_path=str(tiny_dir), target_modules=["nope_proj"]), "nope_proj"),
    }
    for name, (source, damage, words) in cases.items():
        folder = tmp_path / name
        shutil.copytree(source, folder) if source else folder.mkdir()
        damage(folder)
        with pytest.raises(ModelLoadError, match=str(folder)) as caught:
            HFBackend(folder)
        message = str(caught.value)
        assert words in message and "\n" not in message, name
    capsys.readouterr()
    assert main(["eval", "--agent", f"hf:{tmp_path / 'empty'}", "--envs", "CRL/Sokoban-v0",
                 "--episodes", "1", "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "sentencepiece" not in line and "is not a model folder" in line


def test_hardening_a_hub_id_without_the_hub_fails_at_once_in_one_line(monkeypatch):
    """An `hf:` id that is neither a folder nor cached, on a machine that cannot reach the hub:
    one line at once (transformers alone retried the hub for about a minute here)."""
    import transformers

    from crl_harness.models import hf_loading

    # patched where load_pretrained looks it up
    monkeypatch.setattr(hf_loading, "hub_reachable", lambda timeout=3.0: False)
    calls, load = [], transformers.AutoTokenizer.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return load(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    with pytest.raises(ModelNotFoundError) as err:
        HFBackend("someorg/no-such-model-anywhere")
    # the cache only: no retries of the hub (how long it takes: benchmarks/hardening_speed.py)
    assert [kwargs.get("local_files_only") for kwargs in calls] == [True]
    message = str(err.value)
    assert "\n" not in message and "someorg/no-such-model-anywhere" in message
    assert "cached files" in message and ".." not in message


def test_hub_reachable_honours_hf_hub_offline(monkeypatch):
    from crl_harness.models.hf import hub_reachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_reachable() is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing answers
    assert hub_reachable(timeout=1.0) is False


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_that_emulates_it_warns_and_says_what_to_set(monkeypatch, native):
    import warnings

    from crl_harness.models import hf_loading

    monkeypatch.setattr(hf_loading, "cpu_computes_bf16", lambda: native)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hf_loading.resolve_dtype("bfloat16", "cpu") == "bfloat16"
        assert hf_loading.resolve_dtype("float32", "cpu") == "float32"
        assert hf_loading.resolve_dtype("bfloat16", "cuda:0") == "bfloat16"
        # the setting that asks for bf16 only where it is native: never a warning
        assert hf_loading.resolve_dtype("bfloat16-if-native", "cpu") == \
            ("bfloat16" if native else "float32")
        assert hf_loading.resolve_dtype("bfloat16-if-native", "cuda:0") == "bfloat16"
    messages = [str(w.message) for w in caught]
    assert messages == ([] if native else [messages[0]])
    assert native or "emulated" in messages[0] and "bfloat16-if-native (actor.dtype" in messages[0]
