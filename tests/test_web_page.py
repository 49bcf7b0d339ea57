"""The page `dflash2 serve` answers at `/`, in a real headless browser.

Debian's chromium and its driver, driven through selenium (nothing is downloaded
at test time; .ci/run installs both from the distribution). One server on the
built-in pair: the page loads with no console error and no request leaving the
machine, a chat message streams with drafted tokens marked, a race runs to its
parity verdict with the figures of its JSON record, and the page comes back when
the server restarts (here with --api-key, so the page also asks for the key).

Screenshots go to a temporary folder, or to DFLASH2_SCREENSHOTS when set (the
ones in docs/screenshots were made with
`DFLASH2_SCREENSHOTS=docs/screenshots python -m pytest -n 0 tests/test_web_page.py`).
"""

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from serve_helpers import Server

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
MISSING = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
WHY_MISSING = f"{' and '.join(MISSING)} absent: apt-get install chromium chromium-driver (.ci/run does)"
# .ci/run sets DFLASH2_REQUIRE_BROWSER=1: there a missing browser fails the run instead of skipping
# (conftest.py prints one line for a local run that skips them).
REQUIRED = os.environ.get("DFLASH2_REQUIRE_BROWSER") == "1"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING) and not REQUIRED, reason=f"browser test: {WHY_MISSING}"),
]
KEY = "page-key-7"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1280,900")


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("web")


@pytest.fixture(scope="module")
def server(tmp):
    # A fixed block size: greedy decoding then drafts the same tokens every time, so the page's marks
    # can be checked against a second stream (auto's choices depend on the clock; the restarted
    # server below runs auto).
    s = Server("--max-tokens", "24", "--block-size", "4", tmp=tmp, wait=False)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser(server, tmp):
    if MISSING:
        pytest.fail(f"DFLASH2_REQUIRE_BROWSER=1 and {WHY_MISSING}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(dir=tmp)
    options.add_argument(f"--user-data-dir={profile}")  # a fresh profile: nothing carried over
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    server.wait_ready()
    driver.get(server.url + "/")
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def shots(tmp) -> Path:
    folder = Path(os.environ.get("DFLASH2_SCREENSHOTS") or tmp / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def wait(browser, condition, timeout=30.0, what="the page"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen in {timeout:.0f} s")


def by_id(browser, name):
    return browser.find_element("id", name)


def seen(element) -> str:
    """The element's text as a person sees it (`innerText`). Selenium's `.text` is the
    driver's own rendering of it: chromium 156.0.8078.114's drops the newlines of a
    `white-space: pre-wrap` block ('import sysimport sys…') that the page shows as lines."""
    return element.get_property("innerText")


def view(browser, name):
    browser.find_element("css selector", f"[data-view={name}]").click()


def test_page_loads_offline_clean(browser, server):
    wait(browser, lambda: seen(by_id(browser, "status")) == "online", what="the status badge saying online")
    wait(browser, lambda: "DFlash 2" in seen(by_id(browser, "pair-line")), what="the pair line")
    view(browser, "server")
    wait(browser, lambda: "qwen3" in seen(by_id(browser, "state-pair")), what="the pair")
    assert "fixed block size" in seen(by_id(browser, "state-costs-note"))  # auto's table: the restart test
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    urls = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(u.startswith(server.url + "/") for u in urls), urls  # nothing left the machine
    for name in ("index.html", "app.js", "style.css"):  # no CDN or font: only this server is named
        text = (Path(__file__).parents[1] / "dflash2_mlx/serve/static" / name).read_text()
        assert "http://" not in text.replace("http://127", "") and "https://" not in text


def stream_pieces(server, body) -> tuple[list, dict]:
    """[(content, from_draft)] of a streamed chat answer, and its usage."""
    import httpx

    pieces, usage = [], None
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    pieces.append((chunk["choices"][0]["delta"]["content"], chunk["dflash"]["from_draft"]))
    return pieces, usage


def test_chat_streams_with_drafted_tokens_marked(browser, server, shots):
    view(browser, "chat")
    by_id(browser, "chat-max-tokens").clear()
    by_id(browser, "chat-max-tokens").send_keys("24")
    by_id(browser, "chat-input").send_keys("def fibonacci(n):")
    by_id(browser, "chat-send").click()
    meta = wait(browser, lambda: (m := browser.find_elements("css selector", ".msg.assistant .meta"))
                and "tok/s" in seen(m[-1]) and m[-1], what="the answer's closing line")
    answer = browser.find_elements("css selector", ".msg.assistant")[-1]
    assert "24 tokens" in seen(meta) and "τ" in seen(meta) and "prompt tokens cached" in seen(meta)
    shown = browser.execute_script(
        "return [...arguments[0].querySelectorAll('.content span')].map(s => [s.textContent, s.className === 'drafted'])",
        answer)
    # The same request again: the page showed each streamed piece, marked as the stream said.
    pieces, usage = stream_pieces(server, {"messages": [{"role": "user", "content": "def fibonacci(n):"}],
                                           "max_tokens": 24, "temperature": 0})
    assert [tuple(x) for x in shown] == pieces
    drafted = sum(d for _, d in pieces)
    assert 0 < drafted <= usage["dflash2"]["accepted"] == int(answer.get_attribute("data-accepted"))
    browser.save_screenshot(str(shots / "chat.png"))


def test_race_runs_to_parity_with_the_record_figures(browser, shots):
    view(browser, "race")
    by_id(browser, "race-max-tokens").clear()
    by_id(browser, "race-max-tokens").send_keys("24")
    by_id(browser, "race-run").click()
    wait(browser, lambda: by_id(browser, "race-figures").is_displayed(), timeout=60, what="the race's figures")
    record = json.loads(browser.execute_async_script(
        "const done = arguments[0]; fetch(document.getElementById('race-save').href)"
        ".then(r => r.text()).then(done)"))
    s = record["summary"]
    assert by_id(browser, "race-parity").get_attribute("data-verdict") == record["parity"]["verdict"] == "identical"
    for arm in ("ar", "spec"):
        for cell, key in (("tps", "decode_tps"), ("e2e", "e2e_tps"), ("tokens", "tokens"), ("ttft", "prompt_s"),
                          ("total", "total_s"), ("passes", "target_passes")):
            assert float(by_id(browser, f"race-{arm}-{cell}").get_attribute("data-value")) == s[arm][key]
    assert float(by_id(browser, "race-speedup").get_attribute("data-value")) == s["speedup_decode"]
    assert float(by_id(browser, "race-tau").get_attribute("data-value")) == s["mean_acceptance_length"]
    assert len(browser.find_elements("css selector", "#race-accept .bar")) == len(s["acceptance_by_position"])
    runs = record["runs"]
    assert seen(by_id(browser, "race-ar-text")).strip() == runs["ar"][0]["text"].strip()
    assert seen(by_id(browser, "race-spec-text")).strip() == runs["dflash2"][0]["text"].strip()
    assert "backend cpu" in seen(by_id(browser, "race-machine"))
    if s["speedup_decode"] < 1:  # the honest line, as `dflash2 compare` prints it
        assert "slower here" in seen(by_id(browser, "race-notes"))
    # "Run again" sends the record's prompt ids and settings: the same race, greedy, so the same tokens.
    first = record
    browser.execute_script("window.firstRecord = record")  # the page's own `record`, as it holds it
    by_id(browser, "race-rerun").click()
    wait(browser, lambda: browser.execute_script("return record !== window.firstRecord"), timeout=60,
         what="the rerun's record")
    again = json.loads(browser.execute_script("return JSON.stringify(record)"))
    assert again["prompt_token_ids"] == first["prompt_token_ids"] and again["settings"] == first["settings"]
    assert again["runs"]["dflash2"][0]["token_ids"] == first["runs"]["dflash2"][0]["token_ids"]
    wait(browser, lambda: by_id(browser, "race-figures").is_displayed(), timeout=60, what="the rerun's figures")
    browser.set_window_size(1280, 1320)  # the whole race: panes, figures, verdict and honest lines
    browser.save_screenshot(str(shots / "race.png"))
    browser.set_window_size(1280, 900)


def test_the_page_endpoints(server):
    import httpx

    page = httpx.get(server.url + "/", timeout=10)
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    state = httpx.get(server.url + "/v1/dflash/state", timeout=10).json()
    assert state["pair"]["kind"] == "dflash2" and state["race"] is True and state["machine"]["backend"] == "cpu"
    assert state["pair"]["block_size"] == 4 and state["costs"] is None  # a fixed block: no cost table
    assert {"entries", "bytes", "max_bytes", "memory_hits", "disk_hits", "disk"} <= set(state["prompt_cache"])
    assert state["queue"]["max_batch"] >= 2 and state["queue"]["running"] == 0 and state["queue"]["batch_note"] is None
    # Streamed chunks say which token the drafter made (one chunk per token here: each token of
    # this answer carries text); OpenAI's fields are untouched.
    pieces, usage = stream_pieces(server, {"messages": [{"role": "user", "content": "def f(x):"}], "max_tokens": 24})
    assert all(isinstance(d, bool) for _, d in pieces)
    assert 0 < sum(d for _, d in pieces) <= usage["dflash2"]["accepted"]
    assert usage["dflash2"]["block_size"] == 4 and usage["completion_tokens"] == 24
    # A race refuses what it cannot run in one line, before it takes the worker.
    for bad, words in (({"prompt": "x", "max_tokens": 5000}, "over a race's limit"),
                       ({"prompt": "   "}, "the prompt is empty"),
                       ({"prompt_token_ids": [10**7]}, "token ids must be in"),
                       ({}, "'prompt' is required")):
        r = httpx.post(server.url + "/v1/dflash/race", json=bad, timeout=10)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_page_recovers_when_the_server_restarts_with_a_key(browser, server, tmp, shots):
    server.proc.kill()  # a crash, not a drain: the page must notice either way
    server.proc.wait()
    wait(browser, lambda: seen(by_id(browser, "status")).startswith("offline"), what="the badge saying offline")
    again = Server("--max-tokens", "24", "--api-key", KEY, tmp=tmp, port=server.port)
    try:
        import httpx

        assert httpx.get(again.url + "/static/app.js", timeout=10).status_code == 200  # the page loads keyless
        assert httpx.get(again.url + "/v1/dflash/state", timeout=10).status_code == 401  # its data does not
        dialog = wait(browser, lambda: (d := by_id(browser, "key-dialog")).is_displayed() and d,
                      what="the page asking for the key")
        by_id(browser, "key-input").send_keys(KEY)
        browser.find_element("css selector", "#key-form button").click()
        wait(browser, lambda: not dialog.is_displayed(), what="the key dialog closing")
        view(browser, "chat")
        count = len(browser.find_elements("css selector", ".msg.assistant .meta"))
        by_id(browser, "chat-input").send_keys("def add(a, b):")
        by_id(browser, "chat-send").click()
        wait(browser, lambda: (m := browser.find_elements("css selector", ".msg.assistant .meta"))
             and len(m) > count and "tok/s" in seen(m[-1]), what="an answer after the restart")
        assert seen(by_id(browser, "status")) == "online"
        # --block-size auto (the default): the state view shows the cost table auto chooses from.
        view(browser, "server")
        wait(browser, lambda: "block size" in seen(by_id(browser, "state-costs")), what="the cost table")
        state = httpx.get(again.url + "/v1/dflash/state", headers={"x-api-key": KEY}, timeout=10).json()
        tables = state["costs"]["by_context"]

        def cost_rows():
            """The table's rows as text, read in one call (the view redraws as it polls the server)."""
            return browser.execute_script("return [...document.querySelectorAll('#state-costs tbody tr')]"
                                          ".map(r => r.innerText.split(/\\s+/))")

        rows = wait(browser, cost_rows, what="the cost table's rows")
        assert [r[:2] for r in rows] == [[c, B] for c, t in tables.items() for B in t["verify_s"]]
        assert rows[0][2] == f"{1000 * next(iter(tables.values()))['verify_s'][rows[0][1]]:.2f}"
        browser.save_screenshot(str(shots / "server.png"))
    finally:
        again.stop()
