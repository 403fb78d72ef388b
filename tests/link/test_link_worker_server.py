"""The worker's end of the local link (scheduler/worker/server.py) against a broken peer: a line
whose job id is no string (a web side with a bug or of another version) is dropped by the reader,
as the web side's reader drops such a line from a worker; a Submit whose qos is a number too big
for an int is refused like any job it cannot read. The first reached the tick thread, whose
look-up of the id raised; the second raised in the reader itself (deciding whether it is urgent):
either ended the worker, every job on it with it."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from scheduler.link import messages as m
from scheduler.worker.server import LinkServer

from .conftest import completion, sim_worker

INFINITE_QOS = b'{"type":"submit","id":"j0","request":{"endpoint":"completions","prompt":"hi","max_tokens":3},"qos":1e999}\n'


@pytest.mark.parametrize(
    "bad",
    [b'{"type":"cancel","id":["x"]}\n', b'{"type":"cancel","id":{"a":1}}\n', INFINITE_QOS],
    ids=["id-list", "id-object", "qos-infinite"],
)
def test_a_message_whose_job_id_is_not_a_string_is_dropped_and_the_worker_serves_on(bad: bytes) -> None:
    ours, theirs = socket.socketpair()
    worker = sim_worker()
    link = LinkServer(worker.inbox, worker._on_message, worker.hello, inherited=theirs, on_closed=worker.drain)
    serving = threading.Thread(target=worker.serve, args=(link, 5.0), daemon=True)
    serving.start()
    ours.settimeout(30)  # bounds a hang only
    reader = ours.makefile("rb")
    try:
        assert json.loads(reader.readline())["type"] == "hello"
        ours.sendall(bad)
        ours.sendall(m.encode(m.Submit(id="j1", request=completion(max_tokens=3))))
        ended = None
        while ended is None:
            line = reader.readline()
            assert line, "the worker went away"
            body = json.loads(line)
            if body.get("id") == "j1" and body["type"] in ("done", "error", "rejected"):
                ended = body["type"]
        assert ended == "done" and serving.is_alive()
    finally:
        reader.close()
        ours.close()  # the web side leaves: the worker drains and stops
        serving.join(10)
