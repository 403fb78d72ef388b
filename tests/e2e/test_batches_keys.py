"""The Batch API under --require-key: the endpoints take keys like every /v1 route, a batch's
files and its object belong to its key, and its lines run as that key at the background class
even when the key's own default class is interactive."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from testkit.harness import ROOT

from .server import RunningServer

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def keyed() -> Iterator[tuple[RunningServer, str, str]]:
    srv = RunningServer("--require-key", "--max-batch", "4", "--ctx-size", "1024").start()
    try:
        secrets = []
        for name, flags in (("owner", ["--class", "interactive", "--max-class", "interactive"]), ("other", [])):
            done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "createkey", name, *flags], cwd=ROOT,
                                  env={**os.environ, "SUPERFLUID_DATA_DIR": srv.data_dir}, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            secrets.append(done.stdout.strip().splitlines()[-1])
        yield srv, secrets[0], secrets[1]
    finally:
        srv.stop()


def test_keys_own_their_batches_and_lines_run_as_the_key_at_background(keyed: tuple[RunningServer, str, str]) -> None:
    srv, owner_secret, other_secret = keyed
    owner = openai.OpenAI(base_url=srv.base + "/v1", api_key=owner_secret, max_retries=0)
    other = openai.OpenAI(base_url=srv.base + "/v1", api_key=other_secret, max_retries=0)
    nobody = openai.OpenAI(base_url=srv.base + "/v1", api_key="sk-wrong", max_retries=0)
    data = "".join(json.dumps({"custom_id": f"k{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}}) + "\n" for i in range(3))
    with pytest.raises(openai.AuthenticationError):
        nobody.files.create(file=("in.jsonl", data.encode()), purpose="batch")
    f = owner.files.create(file=("in.jsonl", data.encode()), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        other.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        other.files.content(f.id)
    b = owner.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(b.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(b.id)
    assert other.batches.list().data == []
    deadline = time.monotonic() + 300
    while (b := owner.batches.retrieve(b.id)).status not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert b.status == "completed" and b.request_counts.completed == 3, b
    with pytest.raises(openai.NotFoundError):
        other.files.content(b.output_file_id)
    assert len(owner.files.content(b.output_file_id).text.splitlines()) == 3
    # the activity log: three chat requests by the owner's key, all at the background class
    rows: list[tuple[str, str]] = []
    while len(rows) < 3 and time.monotonic() < deadline:
        with sqlite3.connect(Path(srv.data_dir) / "superfluid.sqlite3") as db:
            rows = db.execute("SELECT key_name, qos_class FROM activity_activityentry WHERE endpoint = 'chat'").fetchall()
        time.sleep(0.3)
    assert sorted(rows) == [("owner", "background")] * 3
