"""Shared fixtures: a small classifier trained on scikit-learn's real digits data, and
an IPython shell with ckpt_nb's magics loaded."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from sklearn.datasets import load_digits

import warm_python
from ckpt_nb import _session

# The kernels jupyter_client starts here (the kernel tests', and nbval's for the notebooks:
# every worker imports this file) are forked from a warm interpreter: see warm_python.
warm_python.fork_kernels()


@functools.cache
def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, read once a process (each read parses its file again)."""
    data = load_digits()
    return data.data, data.target


class DigitsRun:
    """A model, optimizer and scheduler with a deterministic training step on digits."""

    def __init__(self, seed: int = 0, hidden: int = 64) -> None:
        torch.manual_seed(seed)
        features, target = digits_arrays()
        self.x = torch.tensor(features / 16.0, dtype=torch.float32)
        self.y = torch.tensor(target, dtype=torch.long)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=5, gamma=0.5)

    def train_step(self, batch: int = 128) -> float:
        """One step on a random batch: it draws from torch's RNG, so RNG state matters."""
        idx = torch.randint(0, len(self.x), (batch,))
        self.optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return loss.item()

    def accuracy(self) -> float:
        with torch.no_grad():
            return float((self.model(self.x).argmax(1) == self.y).float().mean())

    def weights(self) -> list[torch.Tensor]:
        return [t.detach().clone() for t in self.model.state_dict().values()]

    def optimizer_tensors(self) -> list[torch.Tensor]:
        return [v.clone() for s in self.optimizer.state_dict()["state"].values()
                for v in s.values() if isinstance(v, torch.Tensor)]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def collects_cycles() -> bool:
    """Whether Python's collector, left to itself, frees a reference cycle (what a
    paused one, or one off, never does): one is made, then objects enough to set off
    a collection of the youngest generation."""
    class Node:
        pass
    node = Node()
    node.itself = node
    freed = weakref.ref(node)
    del node
    kept = [[] for _ in range(100_000)]
    del kept
    return freed() is None


def same_safetensors_file(ours: Path, theirs: Path) -> bool:
    """Whether two safetensors files are the same but for the order of their metadata's
    entries (save_file writes them in a hash map's order, which changes from run to run)."""
    a, b = ours.read_bytes(), theirs.read_bytes()
    size, their_size = (struct.unpack("<Q", data[:8])[0] for data in (a, b))
    return size == their_size and json.loads(a[8:8 + size]) == json.loads(b[8:8 + size]) \
        and a[8 + size:] == b[8 + size:]


# A suite started in the background of a shell without job control (`bash .ci/run &`)
# inherits SIGINT ignored, as does every process it starts: the tests of Ctrl-C need
# Python's own handler (each pytest-xdist worker imports this file).
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch's operations on one thread for a test: tiny steps of a small model, on two
    cores shared with the suite's other worker, each waited for a second thread to be
    scheduled (the demo's hundred steps took ten times as long on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def digits() -> DigitsRun:
    np.random.seed(0)
    return DigitsRun()


@pytest.fixture
def file_size_limit() -> Iterator[Callable[[int | None], None]]:
    """Make the kernel refuse writes past a file size (EFBIG), as a full disk would;
    None lifts the limit again."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    yield lambda n: resource.setrlimit(resource.RLIMIT_FSIZE, (soft if n is None else n, hard))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


class Holder:
    """A user Stateful holding plain state."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[InteractiveShell]:
    """The process's IPython shell, with ckpt_nb loaded in the test's folder, its cwd (as
    a kernel's in its notebook's folder: the default stores are there)."""
    sh = InteractiveShell.instance()
    sh.user_ns.clear()
    sh.user_ns["__name__"] = "__main__"  # (as a kernel's: a cell's classes are __main__'s)
    sh.init_user_ns()
    old = os.getcwd()
    os.chdir(tmp_path)
    sh.run_cell("%load_ext ckpt_nb", store_history=False)
    yield sh
    os.chdir(old)
    sh.run_cell("%unload_ext ckpt_nb", store_history=False)


@pytest.fixture
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts like a new kernel: no last session, no kernel position (a test
    module takes it for all its tests: pytestmark = usefixtures("fresh_process_state"))."""
    monkeypatch.setattr(_session, "_last", None)
    monkeypatch.setattr(_session, "_positions", {})
    monkeypatch.setattr(_session, "_position_events", {})
    monkeypatch.setattr(_session, "_rolled_back_to", {})
    monkeypatch.setattr(_session, "_left_values", {})


@pytest.fixture(autouse=True)
def torch_determinism_as_it_was() -> Iterator[None]:
    """Cells run in this process's shell turn torch's deterministic algorithms on (for a
    resume to be bit-exact); left on, a later test's Int4 tensor could not be filled."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def start_s3_server(env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """An S3 server on loopback (``env``, moto's settings), answering: its process (a test
    may stop it) and its endpoint. Ready once that process listens on its port: the suite
    runs in several processes, and another's server could take the port this one picked
    (a connection alone would then be answered by the other's)."""
    for _ in range(3):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                   "-p", str(port)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 60
        while server.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error):
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                       for c in psutil.Process(server.pid).net_connections("tcp")):
                    return server, f"http://127.0.0.1:{port}"
            time.sleep(0.1)
        server.kill()
        server.wait()
    raise RuntimeError("the S3 server on loopback did not start")


def s3_server(env: dict[str, str] | None = None) -> Iterator[str]:
    """An S3 server on loopback (``env``, moto's settings) for as long as it is iterated."""
    server, endpoint = start_s3_server(env)
    yield endpoint
    server.terminate()
    server.wait(timeout=30)


CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    yield from s3_server()


@pytest.fixture
def bucket(endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on the module's S3 server; this process (and any it starts) talks to
    it on loopback."""
    import fsspec.config
    import s3fs

    for name, value in {**CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL": endpoint,
                        "HOME": str(tmp_path / "home")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
    name = f"ckpt-nb-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(endpoint_url=endpoint).mkdir(name)
    return name


def unconfigured_bucket(endpoint: str, key: str, secret: str, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on the S3 server at ``endpoint``, which nothing but a store's options
    will name: no endpoint, credentials or AWS configuration in the environment or
    fsspec's (nor an instance's metadata)."""
    import fsspec.config
    import s3fs

    for name in ("FSSPEC_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delitem(fsspec.config.conf, "s3", raising=False)
    name = f"ckpt-nb-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(endpoint_url=endpoint, key=key, secret=secret,
                      skip_instance_cache=True).mkdir(name)
    return name


def stderr_once_said(capsys: pytest.CaptureFixture[str], text: str,
                     seconds: float = 60) -> str:
    """What was written to stderr until it holds ``text`` (or ``seconds`` went by): a
    wait for a line that another thread writes, not for a fixed time."""
    err, deadline = "", time.monotonic() + seconds
    while text not in err and time.monotonic() < deadline:
        time.sleep(0.05)
        err += capsys.readouterr().err
    return err
