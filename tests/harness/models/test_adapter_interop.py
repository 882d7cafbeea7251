"""The LoRA adapters crl ships and writes load with plain PEFT: their config names the base by its
Hugging Face id, their card says what they were trained on and with which command, and crl maps
that id back to its embedded copy of the model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from crl_harness.assets import assets_dir
from crl_harness.models.model_card import write_adapter_card
from crl_harness.models.model_folder import adapter_base
from crl_harness.models.names import MODELS, embedded_name, upstream_id

SHIPPED = sorted(p.parent for p in (assets_dir() / "warmstart").glob("*/*/adapter_config.json"))
UPSTREAM = MODELS["smollm2-135m"].upstream


def test_there_are_shipped_adapters():
    assert len(SHIPPED) >= 6


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_hardening_shipped_adapters_name_the_hub_id_and_a_filled_card(folder):
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == UPSTREAM == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert adapter_base(folder) == "smollm2-135m"  # crl loads them onto its embedded copy
    card = (folder / "README.md").read_text()
    assert f"base_model: {UPSTREAM}\n" in card
    assert "More Information Needed" not in card and "/.cache/" not in card
    assert "- Trained on: " in card and "- Made with: `crl warmstart " in card


def test_the_base_id_maps_both_ways():
    assert upstream_id("smollm2-135m") == UPSTREAM and embedded_name(UPSTREAM) == "smollm2-135m"
    assert upstream_id("/models/mine") == embedded_name("/models/mine") == "/models/mine"


def test_hardening_a_card_names_no_local_path_as_its_base(tmp_path):
    """A base given as a path (the training machine's folder) is no hub id: the card's metadata
    leaves base_model out rather than name a folder other machines lack."""
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"base_model_name_or_path": "/root/.cache/crl/models/x", "r": 4, "lora_alpha": 8,
         "target_modules": ["q_proj"], "layers_to_transform": None}))
    card = write_adapter_card(tmp_path, trained_on="tests", command="crl train t").read_text()
    assert "base_model:" not in card and "rank 4, alpha 8, on q_proj of every layer" in card
    assert "- Made with: `crl train t`" in card


@pytest.mark.slow
def test_a_shipped_adapter_loads_with_plain_peft(tmp_path, monkeypatch):
    """``AutoPeftModelForCausalLM`` finds the base by the config's hub id (here a local copy of
    it at that relative path, as a download would provide) and computes what crl's own load of
    the adapter computes."""
    torch = pytest.importorskip("torch", reason="pip install 'crl-gym[train]'")
    peft = pytest.importorskip("peft", reason="pip install 'crl-gym[train]'")
    from crl_harness.models.hf_loading import load_pretrained
    from crl_harness.models.names import resolve_model_path

    try:
        local_base = Path(resolve_model_path("smollm2-135m"))  # crl's copy of the upstream model
    except Exception as err:  # noqa: BLE001 - the embedded model's package may be absent
        pytest.skip(f"no local copy of the base: {err}")
    shutil.copytree(local_base, tmp_path / UPSTREAM)
    adapter = shutil.copytree(assets_dir() / "warmstart" / "cpu-demo" / "actor", tmp_path / "actor")
    monkeypatch.chdir(tmp_path)
    model = peft.AutoPeftModelForCausalLM.from_pretrained(str(adapter), torch_dtype=torch.float32)
    assert model.peft_config["default"].base_model_name_or_path == UPSTREAM
    tokenizer, merged, _ = load_pretrained(adapter, gguf_file=None, dtype="float32",
                                           attn_implementation="sdpa")
    ids = tokenizer("Reach the stairs.", return_tensors="pt").input_ids
    with torch.no_grad():
        plain, ours = model(ids).logits, merged(ids).logits
        base_only = model.get_base_model()
        with model.disable_adapter():
            unadapted = base_only(ids).logits
    assert torch.allclose(plain, ours, atol=1e-3)
    assert not torch.allclose(plain, unadapted, atol=1e-3)  # the adapter does change the output
