"""ExperienceBank: operations, FIFO capacity, persistence, JSONL, and survival of ``kill -9``."""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from crl_harness.experience import AddEntry, DeleteEntries, ExperienceBank, VoteEntry

ENV = "CRL/Sokoban-v0"


@pytest.fixture
def bank(tmp_path):
    with ExperienceBank(tmp_path / "bank.sqlite", capacity=100) as bank:
        yield bank


def test_add_update_delete_vote(bank):
    a = bank.add(ENV, "Corners", "Never push a box into a corner.", generation_id="g1", step=3)
    b = bank.add(ENV, "Walls", "A box against a wall stays there.", generation_id="g1")
    c = bank.add("CRL/MiniHackRoom-v0", "Stairs", "Walk to > and you win.")
    assert (a.generation_id, a.created_step, a.retrieval_count, a.votes) == ("g1", 3, 0, 0)
    assert [e.id for e in bank.entries(ENV)] == [a.id, b.id]
    assert sorted(bank.env_ids()) == sorted([ENV, "CRL/MiniHackRoom-v0"])

    merged = bank.update([a.id, b.id], ENV, "Dead squares", "Corners and walls trap boxes.",
                         generation_id="g2")
    assert bank.get(a.id) is None and bank.get(b.id) is None
    assert [e.title for e in bank.entries(ENV)] == ["Dead squares"]
    assert merged.generation_id == "g2"

    assert bank.vote(merged.id, +1) is False and bank.get(merged.id).votes == 1
    assert bank.vote(merged.id, -1) is False and bank.get(merged.id).votes == 0
    assert bank.vote(merged.id, -1) is True and merged.id not in bank  # negative votes delete
    assert bank.delete([c.id, "no-such-id"]) == 1
    assert len(bank) == 0


def test_apply_is_one_transaction(bank):
    keep = bank.add(ENV, "Keep", "kept")
    with pytest.raises(TypeError):
        bank.apply([DeleteEntries((keep.id,)), AddEntry(ENV, "New", "new"), "not a change"])
    # The failed transaction left nothing behind, neither on disk nor in memory.
    assert [e.id for e in bank.entries()] == [keep.id]
    assert bank._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 1
    result = bank.apply([VoteEntry("gone", 1), DeleteEntries((keep.id,)), AddEntry(ENV, "N", "n")])
    assert result.missing == ["gone"] and result.deleted == [keep.id] and len(result.added) == 1
    assert result.envs == {ENV}


def test_fifo_eviction_at_capacity(tmp_path):
    with ExperienceBank(tmp_path / "b.sqlite", capacity=5) as bank:
        ids = [bank.add(ENV, f"t{i}", f"c{i}").id for i in range(8)]
        assert [e.id for e in bank.entries()] == ids[3:]
        assert bank.evictions == 3
        result = bank.apply([AddEntry(ENV, "x", "x"), AddEntry(ENV, "y", "y")])
        assert result.evicted == ids[3:5]
    # Reopening with less room evicts only when asked to (test_hardening_bank_keeps_its_capacity)
    with ExperienceBank(tmp_path / "b.sqlite", capacity=3, evict=True) as smaller:
        assert [e.title for e in smaller.entries()] == ["t7", "x", "y"]


def test_persistence_and_retrieval_counts(tmp_path):
    path = tmp_path / "bank.sqlite"
    with ExperienceBank(path) as bank:
        entry = bank.add(ENV, "Corners", "Never push a box into a corner.")
        bank.record_retrievals([entry.id, "unknown"], when=123.0)
        bank.record_retrievals([entry.id], when=456.0)
    with ExperienceBank(path) as bank:
        again = bank.get(entry.id)
        assert (again.title, again.content) == ("Corners", "Never push a box into a corner.")
        assert (again.retrieval_count, again.last_retrieved_at) == (2, 456.0)


def test_jsonl_round_trip_and_bad_file(tmp_path):
    with ExperienceBank(tmp_path / "a.sqlite") as source:
        for i in range(5):
            source.add(ENV, f"title {i}", f"content {i} with \"quotes\" and ünïcode",
                       generation_id=f"g{i}")
        assert source.export_jsonl(tmp_path / "bank.jsonl") == 5
        exported = source.entries()
    with ExperienceBank(tmp_path / "b.sqlite") as target:
        assert target.import_jsonl(tmp_path / "bank.jsonl") == 5
        assert target.import_jsonl(tmp_path / "bank.jsonl") == 0  # same ids: skipped
        assert target.entries() == exported
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"id": "x", "env_id": ENV, "title": "t", "content": "c"})
                       + "\n{not json\n")
        with pytest.raises(ValueError, match="bad.jsonl:2"):
            target.import_jsonl(bad)
        assert "x" not in target  # nothing of a bad file is added


def test_bad_settings_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="capacity"):
        ExperienceBank(tmp_path / "x.sqlite", capacity=0)
    with pytest.raises(ValueError, match="synchronous"):
        ExperienceBank(tmp_path / "x.sqlite", synchronous="OFF")


_WRITER = textwrap.dedent("""
    import sys
    from crl_harness.experience import ExperienceBank
    bank = ExperienceBank(sys.argv[1])
    i = 0
    while True:
        entry = bank.add("CRL/Sokoban-v0", f"title {i}", f"content {i} " + "x" * (i % 500))
        if i % 7 == 3:
            bank.update([entry.id], "CRL/Sokoban-v0", f"title {i}", f"content {i} " + "x" * (i % 500))
        else:
            print(entry.id, i, flush=True)  # acknowledged: the commit returned
        i += 1
""")


def test_acknowledged_writes_survive_sigkill(tmp_path):
    path = tmp_path / "crash.sqlite"
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE,
                             text=True, cwd=Path(__file__).resolve().parents[3])
    acknowledged: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while len(acknowledged) < 300 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line.endswith("\n"):  # end of output, or a line the kill cut: not acknowledged
            break
        entry_id, number = line.split()
        acknowledged[entry_id] = int(number)
    os.kill(child.pid, signal.SIGKILL)  # mid-write: the child never stops writing on its own
    rest = child.stdout.read()  # lines already acknowledged but not yet read
    child.wait()
    assert child.returncode == -signal.SIGKILL
    for line in rest.splitlines(keepends=True):
        if not line.endswith("\n"):  # the kill cut the child's last announcement short
            continue
        entry_id, number = line.split()
        acknowledged[entry_id] = int(number)
    assert len(acknowledged) >= 300

    check = sqlite3.connect(path)
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    check.close()
    with ExperienceBank(path) as bank:
        for entry_id, number in acknowledged.items():
            entry = bank.get(entry_id)
            assert entry is not None, f"acknowledged entry {number} lost"
            assert entry.title == f"title {number}"
            assert entry.content == f"content {number} " + "x" * (number % 500)
        bank.add(ENV, "after", "the reopened bank takes writes")


# ------------------------------------------------------------------ hardening (issue 19)
def test_hardening_bank_keeps_its_capacity(tmp_path):
    """A bank built larger than the default reopens whole; shrinking it must be asked for."""
    path = tmp_path / "big.sqlite"
    with ExperienceBank(path, capacity=20_010) as bank:
        bank.apply([AddEntry(ENV, f"t{i}", f"c{i}") for i in range(20_005)])
    with ExperienceBank(path) as reopened:  # what crl eval --experience does
        assert (len(reopened), reopened.capacity, reopened.evictions) == (20_005, 20_010, 0)
        reopened.export_jsonl(tmp_path / "bank.jsonl")
    from crl_harness.experience import BankError
    from crl_harness.experience.checkpoint import restore_bank

    with pytest.raises(BankError, match="capacity 20010"):
        ExperienceBank(path, capacity=100)
    with ExperienceBank(path, capacity=20_003, evict=True) as smaller:
        assert len(smaller) == 20_003 and smaller.entries()[0].title == "t2"
    with ExperienceBank(path) as reopened:  # the smaller capacity asked for is the stored one
        assert reopened.capacity == 20_003

    # --resume rebuilds the bank from the checkpoint's export at the run's capacity.
    run_dir, checkpoint = tmp_path / "run", tmp_path
    restore_bank(run_dir, checkpoint, 20_010)
    with ExperienceBank(run_dir / "bank.sqlite") as restored:
        assert len(restored) == 20_005
    with pytest.raises(BankError, match="more than its capacity"):
        restore_bank(run_dir, checkpoint, 20_000)

    # A bank written before the capacity was stored opens without evicting anything.
    legacy = tmp_path / "legacy.sqlite"
    with ExperienceBank(legacy, capacity=5) as bank:
        ids = [bank.add(ENV, f"t{i}", f"c{i}").id for i in range(4)]
    db = sqlite3.connect(legacy)
    db.execute("DROP TABLE bank_meta")
    db.commit()
    db.close()
    with ExperienceBank(legacy, read_only=True) as bank:
        assert [e.id for e in bank.entries()] == ids
    with pytest.raises(BankError, match="holds 4 entries"):
        ExperienceBank(legacy, capacity=3)
    with ExperienceBank(legacy) as bank:
        assert [e.id for e in bank.entries()] == ids and bank.capacity == 20_000


_HOLDER = textwrap.dedent("""
    import sys
    from crl_harness.experience import ExperienceBank
    bank = ExperienceBank(sys.argv[1])
    bank.add("CRL/Sokoban-v0", "held", "by another process")
    print("ready", flush=True)
    sys.stdin.read()  # hold the bank open until the test closes our stdin
""")


def test_hardening_bank_refuses_a_second_writer_and_foreign_files(tmp_path):
    """Two writing processes would each evict and vote on their own stale mirror: the second
    is refused with a clear error (readers are fine); a file that is no bank is not touched."""
    from crl_harness.experience import BankError

    path = tmp_path / "shared.sqlite"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[3])
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(BankError, match="open for writing in another process"):
            ExperienceBank(path)
        with ExperienceBank(path, read_only=True) as reader:
            assert [e.title for e in reader.entries()] == ["held"]
            with pytest.raises(BankError, match="read-only"):
                reader.add(ENV, "no", "writes")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    with ExperienceBank(path) as bank:  # the writer is gone: its lock went with it
        bank.add(ENV, "mine", "now")
        assert len(bank) == 2

    foreign = tmp_path / "app.sqlite"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE users (name TEXT)")
    db.execute("INSERT INTO users VALUES ('ada')")
    db.commit()
    db.close()
    text_file = tmp_path / "passwd"
    text_file.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for victim in (foreign, text_file):
        before = victim.read_bytes()
        for read_only in (False, True):
            with pytest.raises(BankError, match="not an experience bank"):
                ExperienceBank(victim, read_only=read_only)
        assert victim.read_bytes() == before
        assert sorted(p.name for p in tmp_path.glob(f"{victim.name}*")) == [victim.name]
    with pytest.raises(BankError, match="directory"):
        ExperienceBank(tmp_path)


def test_hardening_bank_sanitises_model_text(tmp_path):
    """Lone surrogates (a model's broken output, a JSON escape) are stored as U+FFFD."""
    lone, pair = chr(0xD800), chr(0xD83D) + chr(0xDE00)
    with ExperienceBank(tmp_path / "bank.sqlite") as bank:
        entry = bank.add(ENV, f"title {lone}", f"content {pair} {lone}", generation_id=f"g{lone}")
        assert (entry.title, entry.content) == ("title \ufffd", "content \U0001f600 \ufffd")
        assert bank.export_jsonl(tmp_path / "out.jsonl") == 1
        escaped = tmp_path / "escaped.jsonl"
        # json.dumps writes the lone surrogate as the escape \ud800, which json.loads restores
        escaped.write_text(json.dumps({"id": "x", "env_id": ENV, "title": f"t{lone}",
                                       "content": "c"}) + "\n")
        assert bank.import_jsonl(escaped) == 1 and bank.get("x").title == "t\ufffd"
    with ExperienceBank(tmp_path / "bank.sqlite") as reopened:
        assert reopened.get(entry.id).content == "content \U0001f600 \ufffd"


# ------------------------------------------------------------------ hardening (issue 34)
@pytest.fixture
def mount(tmp_path):
    """``mount(*args)``: a real file system for the test (root only: a read-only bind, a full
    tmpfs); the test is skipped where mounting is not allowed. Unmounted afterwards."""
    points = []

    def mount_(*args: str) -> None:
        done = subprocess.run(["mount", *args], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"needs a mount (root): {done.stderr.strip()}")
        points.append(args[-1])

    yield mount_
    for point in reversed(points):
        subprocess.run(["umount", "--lazy", point], check=True)


def _read_only(folder, mount):
    """``folder`` seen read-only: a read-only bind mount as root, else the folder unwritable."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return folder
    view = folder.with_name(f"{folder.name}-ro")
    view.mkdir()
    mount("--bind", "-o", "ro", str(folder), str(view))
    return view


def test_hardening_bank_on_a_read_only_file_system_opens_read_only(tmp_path, mount, capsys):
    from crl_harness.cli import main
    from crl_harness.experience import BankError

    folder = tmp_path / "shipped"
    with ExperienceBank(folder / "bank.sqlite") as bank:
        ids = [bank.add("CRL/Sokoban-v0", f"t{i}", "Push boxes onto targets.").id
               for i in range(3)]
    view = _read_only(folder, mount)
    with ExperienceBank(view / "bank.sqlite", read_only=True) as bank:
        assert [e.id for e in bank.entries()] == ids
    with pytest.raises(BankError, match="read-only file system"):
        ExperienceBank(view / "bank.sqlite")
    assert main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
                 "--experience", str(view / "bank.sqlite"), "--out", str(tmp_path / "out"),
                 "--no-progress"]) == 0
    assert sorted(p.name for p in view.iterdir()) == ["bank.sqlite", "bank.sqlite.lock"]
    folder.chmod(0o755)


def test_hardening_bank_on_a_full_disk_says_so_and_keeps_what_it_acknowledged(tmp_path, mount):
    from crl_harness.experience import ExperienceManager

    disk = tmp_path / "disk"
    disk.mkdir()
    mount("-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk))
    bank = ExperienceBank(disk / "bank.sqlite", capacity=1_000)
    acknowledged = []
    with pytest.raises(OSError) as full:
        while True:
            acknowledged.append(bank.add("CRL/Sokoban-v0", "Boxes", "x" * 4_000).id)
    assert full.value.errno == errno.ENOSPC and "rolled back" in str(full.value)
    assert "no transaction is active" not in str(full.value) and len(bank) == len(acknowledged)
    before = set(threading.enumerate())
    manager = ExperienceManager(bank)
    manager.retrieve("CRL/Sokoban-v0", "boxes", 1)
    # Counts for close() to write: every entry's row, more pages than the rolled-back write left
    # in the WAL, once the disk is filled to the last block.
    bank.record_retrievals(acknowledged)
    filler = disk / "filler"
    with pytest.raises(OSError, match="No space left"), open(filler, "ab") as handle:
        while True:
            handle.write(b"\0" * 4096)
            handle.flush()
    with pytest.raises(OSError, match="No space left"):
        manager.close()
    started = set(threading.enumerate()) - before
    assert not [t for t in started if t.name.startswith("experience-")]  # stopped all the same
    bank._release()
    filler.unlink()
    with ExperienceBank(disk / "bank.sqlite") as reopened:
        assert [e.id for e in reopened.entries()] == acknowledged


def test_hardening_crl_train_on_a_full_disk_is_one_line(tmp_path, mount, capsys):
    from crl_harness.cli import main
    from crl_harness.models.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    disk = tmp_path / "disk"
    disk.mkdir()
    mount("-t", "tmpfs", "-o", "size=600k", "tmpfs", str(disk))
    capsys.readouterr()
    assert main(["train", "cpu-demo", f"actor.model=hf:{tiny}", f"extractor.model=hf:{tiny}",
                 # the whole tiny model trained, as a full checkpoint outgrows the small disk
                 *(f"{role}.{key}" for role in ("actor", "extractor")
                   for key in ("lora.enabled=false", "lora.init_from=null", "dtype=auto")),
                 "tasks.envs=[{id: CRL/Sokoban-v0, kwargs: {max_episode_steps: 2}}]",
                 "tasks.groups_per_step=1", "tasks.group_size=2", "tasks.guided_per_group=1",
                 "actor.max_new_tokens=16", "extractor.max_new_tokens=32", "run.steps=2",
                 "run.checkpoint_every=1", "run.tensorboard=false", "run.torch_threads=1",
                 f"run.output_dir={disk / 'run'}", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "crl train: [Errno 28] No space left on device" in err.strip().splitlines()[-1]


def test_hardening_bank_with_a_damaged_page_is_one_bank_error(tmp_path, capsys):
    from crl_harness.cli import main
    from crl_harness.experience import BankError

    path = tmp_path / "bank.sqlite"
    with ExperienceBank(path) as bank:
        bank.apply([AddEntry("CRL/Sokoban-v0", f"t{i}", "push the box " * 20)
                    for i in range(300)])
    with open(path, "r+b") as handle:  # 8 KB overwritten in the middle of the entries
        handle.seek(path.stat().st_size // 2)
        handle.write(os.urandom(8192))
    for read_only in (True, False):
        with pytest.raises(BankError, match="is damaged"):
            ExperienceBank(path, read_only=read_only)
    assert main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
                 "--experience", str(path), "--out", str(tmp_path / "out"),
                 "--no-progress"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "is damaged (database disk image is malformed)" in line
