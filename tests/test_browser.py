"""The course as a learner meets it: `make lab`'s server, headless Chromium, Run All, a widget moved.

Opens lesson 00's solution and lesson 01's exercise copy (its stubs: a learner's first Run All) from a
server started exactly as `make lab` starts one (served from a copy, autosave off, so the repository
never changes), and checks what a learner would see: no error output, matplotlib figures, the stored
outputs of an untrusted notebook before anything runs, lesson 01's explorer through "off" and two
quick moves, and lesson 00's "what if" dropdown; on lesson 01's exercise copy also the checks of
test_exercise_notebooks.py (each stub reported, the give-away probe run in its kernel), which then
skips that copy. Screenshots land in the test's temporary directory.

Needs Debian's `chromium` (/usr/bin/chromium) and the `playwright` package (`make test` installs the
pinned `[test]` extra; `.ci/run` installs chromium). Playwright's own browser download is never used.
Skips, saying which is missing, only where one of them is.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import BROWSER_EXERCISE, CHROMIUM, browser_missing

# A JupyterLab server and a browser: ~60 s before the first check. `make test-slow` (and CI) run it.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-sync",
                 "--disable-component-update", "--no-first-run", "--disable-quic"]
SETTINGS = {  # fresh JupyterLab settings: never save into the notebooks, never fetch news
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
    # every cell stays in the DOM, so every prompt and output can be read
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}
# Lesson 00's solution (stored outputs, then Run All) and lesson 01 as a learner gets it: the exercise copy
# `make lab` opens, stubs and explorer included — two kernels, so the check fits in a minute on 2 cores.
# The exercise copy also gets test_exercise_notebooks.py's checks here (its stubs, then the give-away
# probe in its kernel), so that file does not run the same lesson again.
EXERCISE = f"notebooks/{BROWSER_EXERCISE}"
OPENED = ["solutions/00_tour.ipynb", EXERCISE]
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'

if browser_missing():
    pytest.skip(browser_missing(), allow_module_level=True)
from playwright import sync_api  # noqa: E402
from test_exercise_notebooks import _learner_names, check_run_all, probe_source  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A `make lab` server over a copy of the opened notebooks: ``(url, screenshot folder)``."""
    tmp = tmp_path_factory.mktemp("browser")
    served = tmp / "course"
    for rel in OPENED:
        (served / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, served / rel)
    for name, value in SETTINGS.items():
        (tmp / "settings" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "settings" / name).write_text(json.dumps(value))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "cfg"), "JUPYTER_DATA_DIR": str(tmp / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "rt"), "IPYTHONDIR": str(tmp / "ipy"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "ws"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    port = _free_port()
    # expose_app_in_browser: _wait_done reads execution counts from the notebook model
    args = ("--no-browser --ServerApp.token= --ServerApp.password= --ServerApp.ip=127.0.0.1 "
            "--LabApp.expose_app_in_browser=True")
    # -o install: this venv is already set up; never re-run pip from a test
    server = subprocess.Popen(["make", "-s", "-o", "install", "lab", f"PORT={port}", f"LAB_ROOT={served}",
                               f"LAB_ARGS={args}", f"VENV={Path(sys.executable).parent.parent}"],
                              cwd=ROOT, env=env, stdout=open(tmp / "server.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, \
                    f"`make lab` did not answer within 60 s:\n{(tmp / 'server.log').read_text()[-3000:]}"
                time.sleep(0.5)
        yield url, tmp
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _open(browser, url: str, rel: str):
    """A page loading ``rel`` (its kernel starts in the background: ``_wait_idle``)."""
    page = browser.new_page(viewport={"width": 1100, "height": 820})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{url}/lab/tree/{rel}?reset")
    return page, errors


def _wait_idle(page):
    """Until the notebook's kernel is up: the toolbar's idle indicator lies early; the status bar reads
    "| Idle" once the kernel is."""
    page.locator("#jp-main-statusbar").filter(has_text=re.compile(r"\| Idle")).wait_for(timeout=40_000)


def _menu(page, menu: str, item: str):
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()


def _start_run_all(page):
    """Clear every output, then Run All (the outputs that come back are this run's)."""
    _menu(page, "Edit", "Clear Outputs of All Cells")
    _menu(page, "Run", "Run All Cells")


def _execution_counts(page) -> list:
    """Each code cell's execution count from the notebook's model (None: not run). The prompts in the
    DOM cannot tell: a collapsed proof cell shows an empty placeholder prompt, never its ``[n]``."""
    return page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets
        .filter(cell => cell.model.type === 'code').map(cell => cell.model.executionCount)""")


def _wait_done(page, deadline: float):
    """Wait until every code cell, collapsed or not, has run."""
    while True:
        counts = _execution_counts(page)
        if counts and all(n is not None for n in counts):
            return
        assert time.monotonic() < deadline, f"Run All did not finish in time: execution counts {counts}"
        time.sleep(0.5)


def _stderr(page) -> list[str]:
    return page.locator(STDERR).all_inner_texts()


@pytest.fixture(scope="module")
def pages(lab, browser):
    """Every notebook in OPENED: stored outputs counted on open, then Run All in all at once.

    The kernels run side by side (one thread each), as two learners' tabs would: on 2 cores the
    whole check takes about as long as the slowest lesson.
    """
    url, _ = lab
    opened = {rel: _open(browser, url, rel) for rel in OPENED}  # the kernels start side by side
    for page, _ in opened.values():
        _wait_idle(page)
    page = opened["solutions/00_tour.ipynb"][0]
    stored = {"images": page.locator(".jp-RenderedImage img").count(),
              "coloured": page.locator('.jp-RenderedHTMLCommon span[style*="background"]').count()}
    page.screenshot(path=lab[1] / "00_stored.png")
    for page, _ in opened.values():
        _start_run_all(page)
    # generous: the whole test took 89 s at load 5 and 305 s at load 15 on 2 cores
    deadline = time.monotonic() + 480
    for page, _ in opened.values():
        _wait_done(page, deadline)
    yield opened, stored
    for page, _ in opened.values():
        page.close()


def test_stored_outputs_render_before_anything_runs(pages):
    """An untrusted solution notebook, just opened: its plots and the token viewer's colours show."""
    _, stored = pages
    assert stored["images"] >= 1, "stored plots render in an untrusted notebook"
    assert stored["coloured"] > 10, "the token viewer's coloured spans survive the untrusted sanitiser"


@pytest.mark.parametrize("rel", OPENED, ids=lambda r: r.replace("/", "_"))
def test_run_all_has_no_error_and_draws(lab, pages, rel):
    page, console = pages[0][rel]
    assert _stderr(page) == [], "no error or warning output after Run All"
    assert page.locator(".jp-RenderedImage img").count() >= 1, "a matplotlib figure rendered"
    assert not [e for e in console if "comm" in e or "Error" in e], console
    if rel.startswith("notebooks/"):
        text = page.locator(".jp-OutputArea-output").all_inner_texts()
        assert any("not implemented yet" in t for t in text), "each checker says its stub is not done"
    page.screenshot(path=lab[1] / f"{Path(rel).stem}_{rel.split('/')[0]}.png", full_page=True)


def test_lesson01_explorer_off_and_quick_moves(lab, pages):
    """The explorer: "off" is a choice; two moves 0.3 s apart end on the last plot, nothing in the log."""
    page, console_errors = pages[0][EXERCISE]
    explorer = page.locator(".jupyter-widgets.widget-vbox", has=page.locator(".widget-html img")).first
    explorer.scroll_into_view_if_needed()
    sliders = explorer.locator(".widget-hslider")
    k_handle, t_handle = (sliders.nth(i).locator(".noUi-handle") for i in (0, 1))
    picture = explorer.locator(".widget-html img")
    assert picture.get_attribute("title").startswith("pre-clip gradient norm"), "the explorer drew its plot"
    labels = explorer.locator(".widget-hslider .widget-label").all_inner_texts()
    assert "max_grad_norm" in labels and all("…" not in t for t in labels), "descriptions are not cut"

    t_handle.focus()
    page.keyboard.press("End")  # the last option: no clipping
    k_value = sliders.nth(0).locator(".widget-readout").inner_text()
    expected = f"pre-clip gradient norm, K = {k_value}, max_grad_norm = off"
    sync_api.expect(picture).to_have_attribute("title", expected, timeout=15_000)
    assert sliders.nth(1).locator(".widget-readout").inner_text() == "off"

    k_handle.focus()
    page.keyboard.press("Home")
    time.sleep(0.3)
    page.keyboard.press("ArrowRight")  # two quick moves: K = first option, then the second
    k_value = sliders.nth(0).locator(".widget-readout").inner_text()
    expected = f"pre-clip gradient norm, K = {k_value}, max_grad_norm = off"
    sync_api.expect(picture).to_have_attribute("title", expected, timeout=15_000)
    time.sleep(1.0)  # a late redraw of the first move would land here
    assert picture.get_attribute("title") == expected, "the last move's plot stays"
    width = picture.evaluate("img => img.naturalWidth")
    assert width > 100, "the plot is a real picture, not an empty figure"
    assert _stderr(page) == [], "no error output from the widget callbacks"
    assert not [e for e in console_errors if "comm" in e or "Error" in e], console_errors
    explorer.screenshot(path=lab[1] / "01_explorer.png")
    page.screenshot(path=lab[1] / "01_lesson.png")  # the README's picture (docs/lesson01.png)
    # a widget callback's exception goes to JupyterLab's log console, not to the cell: read it
    _menu(page, "View", "Show Log Console")
    log = page.locator(".jp-LogConsolePanel")
    log.wait_for(timeout=10_000)
    assert "Error" not in log.inner_text(), f"the log console holds an error: {log.inner_text()[-2000:]}"


def test_lesson00_what_if_dropdown_redraws(lab, pages):
    """Lesson 00's "what if" (a dropdown, as in every lesson whose knob is a named set-up): choosing
    another loss mode replaces the graded-token count in place."""
    page, console_errors = pages[0]["solutions/00_tour.ipynb"]
    control = page.locator(".jupyter-widgets.widget-vbox", has=page.locator(".widget-dropdown")).first
    control.scroll_into_view_if_needed()
    text = control.locator(".widget-html pre")
    assert "(100%)" in text.inner_text(), "the control opens on TRL's default: every token graded"
    control.locator(".widget-dropdown select").first.select_option("assistant only")
    sync_api.expect(text).to_contain_text("assistant only", timeout=15_000)
    assert "(100%)" not in text.inner_text(), "assistant-only loss grades only part of the chat"
    assert _stderr(page) == [], "no error output from the widget callback"
    assert not [e for e in console_errors if "comm" in e or "Error" in e], console_errors
    control.screenshot(path=lab[1] / "00_what_if.png")


def _run_in_kernel(url: str, runtime_dir: Path, rel: str, source: str) -> str:
    """Run ``source`` in the kernel of the notebook open at ``rel`` (a second client, as a console
    attached to it would be); return what it printed."""
    from jupyter_client import BlockingKernelClient

    with urllib.request.urlopen(f"{url}/api/sessions", timeout=10) as response:
        kernel = next(s["kernel"]["id"] for s in json.load(response) if s["path"] == rel)
    client = BlockingKernelClient(connection_file=str(runtime_dir / f"kernel-{kernel}.json"))
    client.load_connection_file()
    client.start_channels()
    printed = []

    def collect(msg):
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append("\n".join(msg["content"]["traceback"]))

    try:
        reply = client.execute_interactive(source, output_hook=collect, timeout=300)
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok", "".join(printed)[-3000:]
    return "".join(printed)


def test_exercise_copy_says_not_implemented_and_gives_nothing_away(lab, pages):
    """test_exercise_notebooks.py's checks on the copy the browser ran: each checker reports its stub,
    and no callable the learner can reach passes a checker. Last in this file: the probe calls the
    checkers with every reachable function, in the kernel the widgets above use."""
    url, tmp = lab
    page, _ = pages[0][EXERCISE]
    nb = nbformat.read(ROOT / EXERCISE, as_version=4)
    printed = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    stubs = sorted(_learner_names(nb))
    assert _run_in_kernel(url, tmp / "rt", EXERCISE, f"print(all(n in globals() for n in {stubs!r}))") \
        == "True\n", "the probe runs in the kernel that ran the notebook (its stubs are defined there)"
    check_run_all(nb, printed, _run_in_kernel(url, tmp / "rt", EXERCISE, probe_source(nb)))
