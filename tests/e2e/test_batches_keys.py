"""The Batch API under --require-key: the endpoints take keys like every /v1 route, a batch's
files and its object belong to its key, and its lines run as that key at the background class
even when the key's own default class is interactive."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from testkit.harness import ROOT

from .server import RunningServer, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
OWNER, OTHER = "batch-owner", "batch-other"  # the keyed server is shared: names no other test uses


@pytest.fixture(scope="module")
def keyed(keyed_server: RunningServer) -> tuple[RunningServer, str, str]:
    """The session's keyed server (tests/conftest.py) and two keys of this module's own."""
    secrets = []
    for name, flags in ((OWNER, ["--class", "interactive", "--max-class", "interactive"]), (OTHER, [])):
        done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "createkey", name, *flags], cwd=ROOT,
                              env={**os.environ, "SUPERFLUID_DATA_DIR": keyed_server.data_dir}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        secrets.append(done.stdout.strip().splitlines()[-1])
    for secret in secrets:  # the server reads new keys at its next poll of the database (0.25 s)
        keyed_server.wait_for(lambda s=secret: httpx.get(keyed_server.base + "/v1/models", headers={"authorization": f"Bearer {s}"}, timeout=30).status_code == 200, timeout_s=30)
    return keyed_server, secrets[0], secrets[1]


def test_keys_own_their_batches_and_lines_run_as_the_key_at_background(keyed: tuple[RunningServer, str, str]) -> None:
    srv, owner_secret, other_secret = keyed
    owner = openai_client(srv.base, owner_secret)
    other = openai_client(srv.base, other_secret)
    nobody = openai_client(srv.base, "sk-wrong")
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
    b = srv.wait_for(lambda: (x := owner.batches.retrieve(b.id)).status in ("completed", "failed", "cancelled") and x, timeout_s=300, interval_s=0.5)
    assert b.status == "completed" and b.request_counts.completed == 3, b
    with pytest.raises(openai.NotFoundError):
        other.files.content(b.output_file_id)
    assert len(owner.files.content(b.output_file_id).text.splitlines()) == 3
    # the activity log: three chat requests by the owner's key, all at the background class
    def rows() -> list[tuple[str, str]]:
        with sqlite3.connect(Path(srv.data_dir) / "superfluid.sqlite3") as db:
            return db.execute(
                "SELECT key_name, qos_class FROM activity_activityentry WHERE endpoint = 'chat' AND key_name IN (?, ?)", (OWNER, OTHER)
            ).fetchall()

    srv.wait_for(lambda: len(rows()) >= 3, timeout_s=60)
    assert sorted(rows()) == [(OWNER, "background")] * 3
