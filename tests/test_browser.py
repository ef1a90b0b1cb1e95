"""The explorer as a person sees it: JupyterLab on loopback, Debian's Chromium driven by
Playwright, the quickstart notebook run from the Run menu, the explorer's table and plot
checked in the page, and a click on Roll back checked against the kernel's real state.

Screenshots go to ``$CKPT_NB_ARTIFACTS`` (default ``tests/artifacts/``): the explorer's
table and its metrics plot once rendered, its DAG after the rollback, and the whole page
if the test failed. Without /usr/bin/chromium the test is skipped, except in CI (CI=true), where
it fails: ``.ci/install`` installs Chromium there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest

from ckpt_nb import CheckpointManager

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
NOTEBOOK = ROOT / "notebooks" / "01-quickstart.ipynb"
# Without the background-networking flags Chromium keeps dialling out, and this
# machine's closed network refuses each attempt.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
# A digest of the model's weights, printed by a cell this test appends to the notebook.
# __import__ keeps the kernel's namespace free of a new module variable.
PROBE = ('print("weights", __import__("hashlib").sha256(b"".join('
         't.detach().contiguous().numpy().tobytes() for t in model.state_dict().values()'
         ')).hexdigest())')
PROBE_OUTPUT = re.compile(r"weights ([0-9a-f]{64})")
# JupyterLab settings for a quiet, fully attached page: no news or update toast, and
# every cell in the DOM (windowing would detach the cells scrolled out of view).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def artifacts_dir() -> Path:
    path = Path(os.environ.get("CKPT_NB_ARTIFACTS") or ROOT / "tests" / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def weights_digest(state_dict: dict) -> str:
    """The probe's digest, computed here from a checkpoint's saved model state."""
    return hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes()
                                   for t in state_dict.values())).hexdigest()


@dataclass
class Lab:
    url: str
    token: str
    root: Path  # where the notebook lies
    store: Path  # the store the notebook explores
    log: Path


def _prepare_notebook(folder: Path) -> str:
    """The quickstart with its stored outputs and widget state removed (so that anything
    on the page was drawn by this run's kernel) and the probe cell appended; returns the
    notebook's STORE, the folder that it explores."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    stores = [m.group(1) for cell in nb.cells if cell.cell_type == "code"
              for m in [re.search(r'^STORE = "([^"]+)"', cell.source, re.M)] if m]
    assert stores, f"{NOTEBOOK.name} no longer sets STORE = \"...\": update this test"
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    nbformat.write(nb, folder / NOTEBOOK.name)
    return stores[0]


def _get(url: str, token: str) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        return reply.read()


def _stop_server(proc: subprocess.Popen, lab: Lab | None, runtime: Path) -> None:
    """Shut the server down with its kernels (``lab``: where it answers, if it does); then
    end, by pid, anything still running that was started for this test (kernels live in
    their own sessions, outside the server's process group: the notebook's own second
    kernel too)."""
    if proc.poll() is None and lab is not None:
        try:
            request = urllib.request.Request(f"{lab.url}/api/shutdown", method="POST", data=b"",
                                             headers={"Authorization": f"token {lab.token}"})
            urllib.request.urlopen(request, timeout=10).close()
            proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for p in psutil.process_iter(["pid", "cmdline"]):
        if any(str(runtime) in arg for arg in p.info["cmdline"] or ()):
            p.kill()


@pytest.fixture
def chromium() -> Path:
    """Debian's Chromium, or a skip (a failure in CI, which must run this test)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing in CI: .ci/install should have installed "
                        "Debian's chromium package")
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package "
                    "(apt-get install chromium) to run the browser test")
    return CHROMIUM


@pytest.fixture(scope="module", name="browser")
def shared_browser() -> Iterator[Callable[[Path], Any]]:
    """Chromium, launched for a test module's first ``page`` and shared by its tests (the
    view tests' modules import both fixtures): each test's page is in a new context of its
    own (its own storage, viewport and document)."""
    from playwright.sync_api import sync_playwright

    held: list[Any] = []  # (playwright, then its browser)

    def launched(executable: Path) -> Any:
        if not held:
            held.append(sync_playwright().start())
            held.append(held[0].chromium.launch(executable_path=str(executable),
                                                args=CHROMIUM_ARGS))
        return held[1]

    yield launched
    try:
        if len(held) == 2:
            held[1].close()
    finally:
        if held:
            held[0].stop()


@pytest.fixture(name="page")
def shared_page(chromium: Path, browser: Callable[[Path], Any]) -> Iterator[Any]:
    """A page of the shared browser, at the width of a notebook's output."""
    context = browser(chromium).new_context(viewport={"width": 950, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()


def _listening_port(proc: subprocess.Popen, runtime: Path, log: Path) -> int | None:
    """The loopback port that ``proc``, a Jupyter server told ``--ServerApp.port=0``,
    listens on: the one its runtime file (``jpserver-<pid>.json``) names, once this very
    process listens there. None if the server exited having lost that port: jupyter_server
    binds port 0, reads the number, lets go and binds it again later (``_find_http_port``),
    and another process can take it in between."""
    info = runtime / f"jpserver-{proc.pid}.json"  # (`jupyter lab` execs: the pid stays)
    port = None
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            said = log.read_text()
            if port is not None and f"The port {port} is already in use" in said:
                return None
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{said[-3000:]}")
        if port is None and info.exists():
            with contextlib.suppress(ValueError):  # (still being written)
                port = int(json.loads(info.read_text())["port"])
        if port is not None:
            with contextlib.suppress(psutil.Error):
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                       for c in psutil.Process(proc.pid).net_connections("tcp")):
                    return port
        if time.monotonic() > deadline:
            pytest.fail(f"jupyter lab did not listen on a port within 90 s "
                        f"({info.name} {'names ' + str(port) if port else 'not written'}):\n"
                        f"{log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture
def lab(chromium: Path, tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab on a loopback port the system gave it, serving a copy of the quickstart;
    its config, runtime, settings and workspace folders are this test's own."""
    root = tmp_path / "lab"
    root.mkdir()
    store = root / _prepare_notebook(root)
    settings = tmp_path / "settings"
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    runtime = tmp_path / "runtime"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_RUNTIME_DIR=str(runtime), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    env.pop("JPY_SESSION_NAME", None)
    token = secrets.token_hex(16)
    log = tmp_path / "jupyter.log"
    # sys.executable is the venv's python, so the "python3" kernelspec runs it too. Port 0:
    # the server takes a port the system gives it, rather than one this test picked and let
    # go, which another test process (the suite runs in several) could take first.
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
               "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", "--LabApp.news_url=",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.extension_manager=readonly", "--ServerApp.terminals_enabled=False"]
    for _ in range(3):
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, cwd=root, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        try:
            port = _listening_port(proc, runtime, log)
        except BaseException:
            _stop_server(proc, None, runtime)
            raise
        if port is not None:
            break
    else:
        pytest.fail(f"jupyter lab lost the port it chose to another process three times:\n"
                    f"{log.read_text()[-3000:]}")
    server = Lab(f"http://127.0.0.1:{port}", token, root, store, log)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n"
                            f"{log.read_text()[-3000:]}")
            try:
                json.loads(_get(f"{server.url}/api/status", token))
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab listens on {port} but did not answer "
                                f"/api/status within 90 s:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
        yield server
    finally:
        _stop_server(proc, server, runtime)


def wait_until(page, condition: Callable[[], object], seconds: float, what: str,
               fail_fast: Callable[[], str | None] = lambda: None) -> object:
    """Poll ``condition`` until it returns something truthy; ``fail_fast`` names an error
    seen on the page (a traceback in a cell), which ends the wait at once."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        error = fail_fast()
        if error:
            pytest.fail(f"while waiting for {what}: {error}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}")
        page.wait_for_timeout(200)


def cell_error(page) -> str | None:
    """The traceback of the first cell that raised, if one did."""
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
    return errors.first.inner_text()[-2000:] if errors.count() else None


def shot(element, path: Path) -> None:
    element.screenshot(path=path)
    print(f"screenshot: {path}")


def probe_digest(cell) -> str | None:
    match = PROBE_OUTPUT.search(cell.locator(".jp-OutputArea").inner_text())
    return match.group(1) if match else None


def test_explorer_in_jupyterlab_rolls_back_the_kernel(chromium: Path, lab: Lab) -> None:
    from playwright.sync_api import sync_playwright

    shots = artifacts_dir()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        # Tall enough for the whole explorer: an element screenshot of something taller
        # than the viewport comes out garbled.
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        try:
            _drive(page, lab, shots)
        except BaseException:
            with_failure = shots / "browser-failure.png"
            page.screenshot(path=with_failure)
            print(f"screenshot of the failure: {with_failure}\n"
                  f"the end of JupyterLab's log:\n{lab.log.read_text()[-3000:]}")
            raise
        finally:
            browser.close()


def _drive(page, lab: Lab, shots: Path) -> None:
    from playwright.sync_api import expect

    page.set_default_timeout(60_000)
    page.goto(f"{lab.url}/lab/tree/{NOTEBOOK.name}?token={lab.token}")
    panel = page.locator(".jp-NotebookPanel")
    panel.wait_for()
    cells = panel.locator(".jp-Notebook .jp-Cell")
    probe = cells.last
    expect(probe.locator(".jp-InputArea")).to_contain_text('print("weights"')
    # The status bar names the kernel once it has started, and says when it is idle.
    expect(page.locator("#jp-main-statusbar")).to_contain_text(
        re.compile(r"Python 3 \(ipykernel\) \| Idle"), timeout=90_000)

    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()

    digest_before = wait_until(page, lambda: probe_digest(probe), 140,
                               "the notebook to run to its last cell", lambda: cell_error(page))
    explorer = page.locator(".ckpt-nb-explorer")
    with CheckpointManager(lab.store) as mgr:
        ids = list(mgr.list()["id"])
    rows = explorer.locator(".ckpt-nb-row")
    wait_until(page, lambda: rows.count() == len(ids), 30,
               f"the explorer's table to show the store's {len(ids)} checkpoints")
    assert [rows.nth(i).get_attribute("data-id") for i in range(rows.count())] == ids
    shot(explorer, shots / "browser-explorer-table.png")

    explorer.get_by_role("tab", name="Metrics").click()
    plot = explorer.locator("img").first
    wait_until(page, lambda: plot.evaluate("img => img.complete && img.naturalWidth > 100"), 30,
               "the metrics plot to load")
    shot(explorer, shots / "browser-explorer-metrics.png")

    # Roll back to the oldest checkpoint: the one the killed kernel left at step 25.
    explorer.get_by_role("tab", name="Checkpoints").click()
    target = ids[0]
    rows.first.click()
    explorer.locator(f".ckpt-nb-row.ckpt-nb-selected[data-id='{target}']").wait_for()
    explorer.get_by_role("button", name="Roll back", exact=True).click()
    status = explorer.locator(".ckpt-nb-status")
    status.get_by_text(f"Roll the kernel's tracked objects and variables back to {target}?"
                       ).wait_for()
    explorer.get_by_role("button", name="Confirm", exact=True).click()
    status.get_by_text(f"rolled back to {target}").wait_for()
    explorer.get_by_role("tab", name="DAG").click()
    explorer.locator(f".ckpt-nb-node[data-id='{target}']").get_by_text("kernel →").wait_for()
    shot(explorer, shots / "browser-rollback.png")

    # Run the probe cell again, from its editor, as a person would.
    prompt = probe.locator(".jp-InputPrompt")
    ran_as = prompt.inner_text()
    probe.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    digest_after = wait_until(
        page, lambda: (p := prompt.inner_text()) != ran_as and "*" not in p
        and probe_digest(probe), 60, "the probe cell to run again", lambda: cell_error(page))

    with CheckpointManager(lab.store) as mgr:
        expected = weights_digest(mgr.load(target).state["model"])
    assert digest_before != expected, "the kernel already held the target's weights"
    assert digest_after == expected
