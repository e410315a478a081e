"""Attacks on ``patchbox serve``'s bundles, over real HTTP with real git bundles: concurrent
submits against the queue quota, bundles that unpack to far more than they weigh (a huge
file, many files, folders nested without end, ``.gitattributes`` that would grow a file at
checkout), checkouts when a job starts rather than in the request, clones counted against
the tenant, and the service's own paths kept out of every answer."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import httpx

from controller.service.bundles import bundle_path, checkout, clone_path
from controller.service.config import load_service_config
from controller.service.runner import Runner
from controller.service.runner import Running as RunningJob
from controller.service.sqlitestore import SqliteStore
from controller.service.store import JobRow
from tests.support.git import Repo, git_env, init
from tests.support.jobs import FILES, make_repo
from tests.support.service import (
    CALLS,
    TASK,
    events,
    serving,
    stored,
    wait_status,
    write_config,
)
from tests.support.service_bundles import bundle_of, data_dir, submit_bundle, upload

MiB = 1024 * 1024
SMALL = {"bundle_max_tree_bytes": MiB, "bundle_max_tree_entries": 1000}
"""Tree limits small enough that a test's bundle goes over them cheaply."""


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    return response.status_code, body["error"]["code"], body["error"]["message"]


def disk_use(folder: Path) -> int:
    """The bytes of every file under ``folder`` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def zero_blob(repo: Repo, size: int) -> str:
    """A loose blob of ``size`` zero bytes written straight into ``repo``'s objects (no
    such file is ever on disk): its id."""
    header = f"blob {size}\0".encode()
    digest = hashlib.sha1(header)  # noqa: S324 - git's object id
    packer = zlib.compressobj(1)
    parts = [packer.compress(header)]
    chunk = bytes(MiB)
    left = size
    while left:
        piece = chunk[: min(left, MiB)]
        digest.update(piece)
        parts.append(packer.compress(piece))
        left -= len(piece)
    parts.append(packer.flush())
    oid = digest.hexdigest()
    folder = repo.git_dir / "objects" / oid[:2]
    folder.mkdir(exist_ok=True)
    (folder / oid[2:]).write_bytes(b"".join(parts))
    return oid


def huge_file_repo(path: Path, size: int) -> Repo:
    """A repository whose HEAD holds ``big.bin``, ``size`` zero bytes, and the greeting."""
    repo = init(path, FILES, message="greet")
    oid = zero_blob(repo, size)
    repo.git("update-index", "--add", "--cacheinfo", f"100644,{oid},big.bin")
    repo.git("commit", "-q", "-m", "big")
    return repo


def tree_commit(repo: Repo, tree: str) -> None:
    commit = repo.git("commit-tree", tree, "-m", "crafted")
    repo.git("update-ref", "HEAD", commit)


def many_files_repo(path: Path, count: int) -> Repo:
    """HEAD: one folder of ``count`` empty files (one blob, named ``count`` times)."""
    repo = init(path, FILES, message="greet")
    empty = repo.git("hash-object", "-w", "--stdin", stdin=b"")
    listing = "".join(f"100644 blob {empty}\tf{n:07d}\n" for n in range(count))
    tree_commit(repo, repo.git("mktree", stdin=listing.encode()))
    return repo


def nested_repo(path: Path, width: int, depth: int) -> Repo:
    """HEAD: folders ``width`` wide nested ``depth`` deep, ``width`` empty files in each
    innermost one: ``width ** (depth + 1)`` files from a few hundred bytes of trees."""
    repo = init(path, FILES, message="greet")
    empty = repo.git("hash-object", "-w", "--stdin", stdin=b"")
    listing = "".join(f"100644 blob {empty}\tf{n}\n" for n in range(width))
    tree = repo.git("mktree", stdin=listing.encode())
    for _ in range(depth):
        listing = "".join(f"040000 tree {tree}\td{n}\n" for n in range(width))
        tree = repo.git("mktree", stdin=listing.encode())
    tree_commit(repo, tree)
    return repo


def at_once(running: Any, tenant: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """``POST /v1/jobs`` of each body, all sent at the same moment, each on its own
    connection."""
    gate = threading.Barrier(len(bodies))
    answers: list[httpx.Response] = []

    def send(body: dict[str, Any]) -> None:
        with running.client(tenant) as client:
            gate.wait()
            answers.append(client.post("/v1/jobs", json=body))

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return answers


# -- without Docker ---------------------------------------------------------------------------


def test_ten_concurrent_submits_against_a_quota_of_three(tmp_path: Path) -> None:
    """Ten submits at once, bundle jobs and repository jobs: exactly three accepted, seven
    refused with QUOTA_EXCEEDED; no clone is made for a queued job."""
    laptop = init(tmp_path / "laptop" / "greet", FILES, message="greet")
    with serving(write_config(tmp_path, workers=0, max_queued_jobs=3)) as running:
        alpha = running.client("alpha")
        bundle_id = upload(alpha, bundle_of(laptop)).json()["bundle_id"]
        repos = [make_repo(tmp_path / "beta" / f"r{n}") for n in range(10)]
        for tenant, bodies in (
            ("alpha", [{"bundle": bundle_id, "task": TASK, "calls": CALLS}] * 10),
            ("beta", [{"repo": str(r), "task": TASK, "calls": CALLS} for r in repos]),
        ):
            answers = at_once(running, tenant, bodies)
            statuses = sorted(a.status_code for a in answers)
            assert statuses == [202] * 3 + [429] * 7, [a.text for a in answers]
            for refused in (a for a in answers if a.status_code == 429):
                assert error_of(refused)[1] == "QUOTA_EXCEEDED"
                assert "max_queued_jobs = 3" in error_of(refused)[2]
            with running.client(tenant) as client:
                listed = client.get("/v1/jobs").json()["jobs"]
            assert sorted(j["job_id"] for j in listed) == sorted(
                a.json()["job_id"] for a in answers if a.status_code == 202
            )
            for job in listed:  # each accepted job has exactly its one queued event
                stored = running.service.store.events_after(job["job_id"], 0)
                assert [(e.seq, e.data) for e in stored] == [(1, {"state": "queued"})]
        assert not (data_dir(running) / "alpha" / "clones").exists()


def test_queued_bundle_jobs_hold_no_clone_and_show_no_host_path(tmp_path: Path) -> None:
    laptop = init(tmp_path / "laptop" / "greet", FILES, message="greet")
    raw = bundle_of(laptop)
    with serving(write_config(tmp_path, workers=0)) as running:
        alpha = running.client("alpha")
        bundle_id = upload(alpha, raw).json()["bundle_id"]
        ids = [submit_bundle(alpha, bundle_id, calls=CALLS).json()["job_id"] for _ in range(5)]
        root = data_dir(running)
        assert files_under(root) == ["alpha", "alpha/bundles", f"alpha/bundles/{bundle_id}.bundle"]
        assert disk_use(root) == len(raw)  # five queued jobs: the bundle, and nothing else
        listed = alpha.get("/v1/jobs").json()["jobs"]
        assert [j["repo"] for j in listed] == [f"bundle:{bundle_id}"] * 5
        assert [j["bundle"] for j in listed] == [{"id": bundle_id, "head": laptop.head()}] * 5
        answers = [alpha.get("/v1/jobs").text]
        answers += [alpha.get(f"/v1/jobs/{job_id}").text for job_id in ids]
        answers.append(alpha.post(f"/v1/jobs/{ids[0]}/cancel").text)
        answers.append(json.dumps(events(alpha, ids[0])))
        for text in answers:
            assert str(root) not in text
            assert os.path.realpath(root) not in text
            assert "clones" not in text


def test_a_bundle_that_unpacks_too_large_is_refused_before_a_file_is_written(
    tmp_path: Path,
) -> None:
    """At a 1 MiB / 1000 entries limit: a 64 MiB file in a bundle of a few dozen KiB, 5000
    files, and folders nested to 10**9 files are each refused with BUNDLE_TREE_TOO_LARGE;
    the service keeps nothing of them; a bundle within the limits is taken."""
    config = write_config(tmp_path, workers=0, service=SMALL)
    huge = bundle_of(huge_file_repo(tmp_path / "laptop" / "huge", 64 * MiB))
    many = bundle_of(many_files_repo(tmp_path / "laptop" / "many", 5000))
    nested = bundle_of(nested_repo(tmp_path / "laptop" / "nested", 10, 8))
    assert len(huge) < 256 * 1024
    assert len(many) < 64 * 1024
    assert len(nested) < 64 * 1024
    with serving(config) as running:
        alpha = running.client("alpha")
        root = data_dir(running)
        for raw, limit in (
            (huge, "more than 1048576 bytes of files (bundle_max_tree_bytes)"),
            (many, "more than 1000 files and folders (bundle_max_tree_entries)"),
            (nested, "more than 1000 files and folders (bundle_max_tree_entries)"),
        ):
            started = time.monotonic()
            status, code, message = error_of(upload(alpha, raw))
            assert (status, code) == (413, "BUNDLE_TREE_TOO_LARGE"), message
            assert limit in message
            assert time.monotonic() - started < 30
            assert files_under(root / "alpha" / "bundles") == []  # no bundle, part or scratch
        assert alpha.get("/v1/jobs").json() == {"jobs": []}
        within = bundle_of(init(tmp_path / "laptop" / "greet", FILES, message="greet"))
        taken = upload(alpha, within)
        assert taken.status_code == 201, taken.text
        assert disk_use(root) == len(within)


def test_the_reports_bundles_are_refused_at_the_default_limits(tmp_path: Path) -> None:
    """The attack as it was reported, at the default limits (512 MiB, 100,000 entries): a
    bundle of about 1 MiB holding a 1 GiB file, one of a few hundred KiB holding 200,000
    files."""
    config = write_config(tmp_path, workers=0)
    _host, service = load_service_config(config)
    assert (service.bundle_max_tree_bytes, service.bundle_max_tree_entries) == (1 << 29, 100_000)
    gib = huge_file_repo(tmp_path / "laptop" / "gib", 1 << 30)
    huge = bundle_of(gib, "-c", "core.compression=1")
    many = bundle_of(many_files_repo(tmp_path / "laptop" / "many", 200_000))
    assert len(huge) < 8 * MiB
    assert len(many) < MiB
    with serving(config) as running:
        alpha = running.client("alpha")
        for raw, key in ((huge, "bundle_max_tree_bytes"), (many, "bundle_max_tree_entries")):
            status, code, message = error_of(upload(alpha, raw))
            assert (status, code) == (413, "BUNDLE_TREE_TOO_LARGE"), message
            assert key in message
        assert files_under(data_dir(running) / "alpha" / "bundles") == []


def test_a_job_whose_bundle_is_over_the_limits_when_it_starts_fails_with_the_code(
    tmp_path: Path,
) -> None:
    """The checkout is the worker's, when the job starts: a bundle taken under one limit and
    over the limit the service has when the job starts ends the job failed, with the code
    and message in its events and view, and no clone."""
    laptop = many_files_repo(tmp_path / "laptop" / "many", 50)
    with serving(write_config(tmp_path, workers=0)) as running:
        alpha = running.client("alpha")
        bundle_id = upload(alpha, bundle_of(laptop)).json()["bundle_id"]
        job_id = submit_bundle(alpha, bundle_id, calls=CALLS).json()["job_id"]
        root = data_dir(running)
    lower = {"bundle_max_tree_entries": 10}
    with serving(write_config(tmp_path, workers=1, service=lower)) as running:
        alpha = running.client("alpha")
        view = wait_status(alpha, job_id, {"failed"}, timeout=60)
        assert view["status"] == "failed"
        assert view["error"]["code"] == "BUNDLE_TREE_TOO_LARGE"
        assert "more than 10 files and folders" in view["error"]["message"]
        stream = events(alpha, job_id)
        assert [e["data"]["state"] for e in stream] == ["queued", "failed"]
        assert stream[-1]["data"]["error"] == view["error"]
        assert not clone_path(running.service.config, "alpha", job_id).exists()
        assert (
            not (root / "alpha" / "clones").exists() or files_under(root / "alpha" / "clones") == []
        )
        for text in (json.dumps(view), json.dumps(stream), alpha.get("/v1/jobs").text):
            assert str(root) not in text


def test_a_checkout_writes_each_blob_as_it_is(tmp_path: Path) -> None:
    """``.gitattributes`` asking for ``ident`` and CRLF would grow a file of ``$Id$`` lines
    about tenfold at checkout, past what the tree's sizes say: the checkout ignores them."""
    _host, config = load_service_config(write_config(tmp_path, workers=0, service=SMALL))
    content = b"$Id$\n" * 150_000  # 750,000 bytes: within 1 MiB; about 7 MB expanded
    laptop = init(
        tmp_path / "laptop" / "ident",
        {".gitattributes": "* ident text eol=crlf\n", "ids.txt": content},
        message="ids",
    )
    source = bundle_path(config, "alpha", "b" + "1" * 32)
    source.parent.mkdir(parents=True)
    source.write_bytes(bundle_of(laptop))
    dest = clone_path(config, "alpha", "job-1")
    checkout(config, "alpha", "b" + "1" * 32, laptop.head(), dest)
    assert (dest / "ids.txt").read_bytes() == content
    assert Repo(dest, git_env()).git("status", "--porcelain") == ""
    (laptop.path / "ids.txt").unlink()  # git's own checkout there honours the attributes
    laptop.git("checkout", "--", "ids.txt")
    assert (laptop.path / "ids.txt").stat().st_size > 6 * len(content)


def test_a_tenants_bundle_jobs_start_only_within_max_clones(tmp_path: Path) -> None:
    """With ``max_clones = 1`` and a bundle job running, the tenant's next bundle job waits
    and its next repository job starts."""
    path = write_config(
        tmp_path, workers=0, tenant={"max_clones": 1}, service={"visible_roots": ["/r"]}
    )
    host, config = load_service_config(path)
    assert [t.max_clones for t in config.tenants] == [1, 1]
    store = SqliteStore(tmp_path / "clones.db")
    runner = Runner(store, host, config)
    t = time.time()
    bundle = stored(bundle="b" + "0" * 32)
    rows = [
        JobRow("a1", "alpha", "/c/a1", bundle, "queued", t),
        JobRow("a2", "alpha", "/c/a2", bundle, "queued", t + 1),
        JobRow("a3", "alpha", "/r/a", stored(), "queued", t + 2),
    ]
    for row in rows:
        store.insert_job(row)
    picked = []
    while (started := runner._pick()) is not None:
        picked.append(started.job_id)
        runner._running[started.job_id] = RunningJob(started)
        store.update_state(started.job_id, "running")
    assert picked == ["a1", "a3"]  # a2 waits for a1's clone to go
    assert runner.clone_count("alpha") == 1
    runner._running.pop("a1")
    store.update_state("a1", "failed")
    assert runner._pick().job_id == "a2"  # type: ignore[union-attr]
    runner.shutdown(timeout=1)
    store.close()


def test_a_bundle_is_kept_while_a_queued_job_needs_it(tmp_path: Path) -> None:
    laptop = init(tmp_path / "laptop" / "greet", FILES, message="greet")
    raw = bundle_of(laptop)
    config = write_config(tmp_path, workers=0, service={"bundle_keep_seconds": 1})
    with serving(config) as running:
        alpha = running.client("alpha")
        first = upload(alpha, raw).json()["bundle_id"]
        job_id = submit_bundle(alpha, first, calls=CALLS).json()["job_id"]
        time.sleep(1.5)
        second = upload(alpha, raw).json()["bundle_id"]  # sweeps: the first is still needed
        bundles = data_dir(running) / "alpha" / "bundles"
        assert {p.name for p in bundles.iterdir()} == {f"{first}.bundle", f"{second}.bundle"}
        assert alpha.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
        time.sleep(1.5)
        upload(alpha, raw)  # sweeps again: neither older bundle is needed now
        assert f"{first}.bundle" not in {p.name for p in bundles.iterdir()}
        gone = submit_bundle(alpha, first, calls=CALLS)
        assert error_of(gone)[:2] == (404, "NOT_FOUND")
