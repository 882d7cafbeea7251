"""SWE-bench Verified rows (the shared data) and the toy row, read with swebench's own loader."""

from __future__ import annotations

import json

import pytest

from crl_envs.swebench.data import TOY_DIR, load_instances, read_task_ids

swebench = pytest.importorskip("swebench")


@pytest.mark.data
def test_verified_loads_500_rows_and_every_test_spec_builds(data_dir):
    from swebench.harness.constants import START_TEST_OUTPUT
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.utils import make_test_spec

    rows = load_instances("verified", data_dir=data_dir("swebench", "verified_test.parquet"))
    ids = [row["instance_id"] for row in rows]
    assert len(ids) == 500 == len(set(ids))
    for row in rows:
        spec = make_test_spec(row)
        assert spec.instance_id == row["instance_id"]
        assert spec.image.startswith("swebench/sweb.eval.") and spec.FAIL_TO_PASS
        assert START_TEST_OUTPUT in spec.eval_script and spec.log_parser in PARSER_REGISTRY


@pytest.mark.data
def test_task_list_as_ids_or_file(data_dir, tmp_path):
    folder = data_dir("swebench", "verified_test.parquet")
    wanted = ["django__django-11099", "astropy__astropy-12907"]
    listed = tmp_path / "tasks.txt"
    listed.write_text("# kept by crl swe filter\n" + "\n".join(wanted) + "\n\n")
    for task_ids in (wanted, ",".join(wanted), listed):
        rows = load_instances("verified", data_dir=folder, task_ids=task_ids)
        assert [row["instance_id"] for row in rows] == wanted
    with pytest.raises(KeyError, match="not_a__task-1"):
        load_instances("verified", data_dir=folder, task_ids=["not_a__task-1"])


def test_missing_local_dataset_says_what_to_do(tmp_path):
    from crl_envs.data import DataNotFoundError

    with pytest.raises(DataNotFoundError, match="crl data fetch swebench"):
        load_instances("verified", data_dir=tmp_path / "nowhere")


def test_toy_row_is_in_swebench_format_and_matches_its_repo():
    from swebench.harness.utils import make_test_spec

    (row,) = load_instances("toy")
    spec = make_test_spec(row)
    assert spec.log_parser == "parse_log_pytest" and spec.eval_type == "pass_and_fail"
    assert json.loads(row["FAIL_TO_PASS"]) == spec.FAIL_TO_PASS and len(spec.PASS_TO_PASS) == 5
    assert row["base_commit"] in row["eval_script"] and row["test_patch"] in row["eval_script"]
    assert (TOY_DIR / "repo" / "intervals" / "core.py").is_file()


def test_read_task_ids_forms(tmp_path):
    assert read_task_ids(None) is None
    assert read_task_ids(["a"]) == ["a"]
    listed = tmp_path / "ids"
    listed.write_text("a  # first\n\nb\n")
    assert read_task_ids(listed) == ["a", "b"]


def test_hardening_verified_without_data_or_a_hub_fails_at_once_in_one_line(tmp_path, monkeypatch):
    """No local copy and a hub that does not answer: one line at once, not the datasets
    library's five retries (about 30 s and ten lines of `crl demo`'s output on such a machine)."""
    import time

    from crl_envs.data import DataNotFoundError
    from crl_envs.swebench import data

    monkeypatch.setenv("CRL_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing answers
    monkeypatch.setattr(data, "_verified_source", lambda data_dir: data.UPSTREAM_ID)
    monkeypatch.setattr(data, "_load", lambda name: pytest.fail("the hub was asked"))
    start = time.monotonic()
    with pytest.raises(DataNotFoundError) as err:
        load_instances("verified")
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert "\n" not in message and "crl data fetch swebench" in message
    assert "127.0.0.1:9" in message and "HF_HUB_OFFLINE=1" in message
    # told to read the datasets cache only, it does not probe the hub: the loader reads it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(data, "_load", lambda name: ({"instance_id": "a__b-1"},))
    assert [row["instance_id"] for row in load_instances("verified")] == ["a__b-1"]
