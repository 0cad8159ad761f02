"""The dev server's UI and the health port's page in a real browser: Debian's chromium, headless, driven by
Playwright (its own browser downloads are never used: executable_path points at the system's)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import wait_until
from support.dev_session import DevSession, end_all

playwright = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HANDLER = '''\
def handle(ctx):
    if ctx.payload.get("fail"):
        raise ValueError("asked to fail")
    return {"doubled": ctx.payload.get("n", 0) * 2}
'''


@pytest.fixture
def dev(tmp_path):
    (tmp_path / "app.py").write_text(HANDLER)
    session = DevSession(tmp_path, "--handler", "app:handle", "--queue", "shop", "--port", "0").start()
    yield session
    end_all()


@pytest.fixture
def page():
    assert CHROMIUM, "chromium is not installed (.ci/run installs Debian's)"
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser.new_page(viewport={"width": 1280, "height": 800})
        browser.close()


@pytest.mark.timeout(60)
def test_ui_shows_jobs_results_tracebacks_markup_as_text_and_retries_a_dead_letter(dev, page):
    done = dev.enqueue('{"n": 21}')
    markup = dev.enqueue('{"n": 1, "note": "<script>window.pwned = 1</script><b>bold</b>"}')
    failed = dev.enqueue('{"fail": true}', "--max-retries", "0")
    for job_id in (done, markup):
        assert dev.settled(job_id)["status"] == "completed"
    assert dev.settled(failed)["status"] == "deadletter"

    page.goto(dev.ui_url)
    page.wait_for_selector("#queues-body tr")
    assert "#key=" not in page.url  # the key leaves the address bar
    assert "shop" in page.inner_text("#queues-body")

    page.click("#tabs button[data-tab=jobs]")
    page.click(f"text={done}")
    page.wait_for_selector("#job-history tr")
    assert '"doubled": 42' in page.inner_text("#job-result")
    history = page.inner_text("#job-history")
    assert "created" in history and "started" in history and "completed" in history

    page.click("#job-back")
    page.click(f"text={markup}")
    expect_text(page, "#job-payload", "script")
    assert "<script>window.pwned = 1</script><b>bold</b>" in page.inner_text("#job-payload")
    assert page.evaluate("window.pwned") is None and page.query_selector("#job-payload b") is None

    page.click("#job-back")
    page.click(f"text={failed}")
    expect_text(page, "#job-error", "Traceback")
    error = page.inner_text("#job-error")
    assert "ValueError: asked to fail" in error and "app.py" in error

    page.click("#tabs button[data-tab=queues]")
    page.wait_for_selector("#queues-body svg.spark")
    page.screenshot(path=str(ROOT / "docs" / "images" / "dev-ui.png"))

    page.click("#tabs button[data-tab=dlq]")
    page.wait_for_selector(f"#dlq-body >> text={failed}")
    page.click("#dlq-body button:has-text('Retry')")
    assert dev.settled(failed, 30)["status"] == "deadletter"  # handler still fails: dead-lettered again ...
    events = dev.api("GET", f"/_dev/jobs/{failed}/history").json()["events"]
    assert [e["event"] for e in events].count("retried") == 1  # ... after the retry the UI asked for


@pytest.mark.timeout(60)
def test_a_dead_letter_retried_from_the_ui_completes(tmp_path, page):
    (tmp_path / "app.py").write_text("import os\n\ndef handle(ctx):\n    if os.path.exists('broken'):\n"
                                     "        raise RuntimeError('broken')\n    return 'ok'\n")
    (tmp_path / "broken").write_text("")
    dev = DevSession(tmp_path, "--handler", "app:handle", "--queue", "q", "--port", "0").start()
    try:
        job_id = dev.enqueue("{}", "--max-retries", "0")
        assert dev.settled(job_id)["status"] == "deadletter"
        (tmp_path / "broken").unlink()
        page.goto(dev.ui_url)
        page.click("#tabs button[data-tab=dlq]")
        page.wait_for_selector(f"#dlq-body >> text={job_id}")
        page.click("#dlq-body button:has-text('Retry')")
        job = dev.settled(job_id)
        assert job["status"] == "completed" and job["result"] == "ok"
    finally:
        end_all()


@pytest.mark.timeout(60)
def test_wrong_key_gets_the_login_page_and_another_host_is_refused(dev, page):
    page.goto(dev.url + "/#key=sp_test_not_a_key")
    page.wait_for_selector("#login:not([hidden])")
    assert "not valid" in page.inner_text("#login-error")
    assert page.is_hidden("#tabs")
    page.fill("#login-key", dev.key)
    page.click("#login-form button")
    page.wait_for_selector("#queues:not([hidden])")
    import requests

    assert requests.get(dev.url + "/", headers={"Host": "rebound.example:80"}, timeout=5).status_code == 403


@pytest.mark.timeout(60)
def test_health_port_page_lists_the_children(dev, page):
    import json

    def health_url():  # written once the daemon says which port the kernel gave it
        return json.loads((dev.folder / ".spooled" / "dev.json").read_text()).get("health_url")

    page.goto(wait_until(health_url, timeout=20, what="the daemon's health URL in dev.json") + "/")
    page.wait_for_selector("#children tr")
    # the page polls /status: a child still starting (or one just busy) shows on a later refresh
    wait_until(lambda: page.inner_text("#children").count("idle") == 2, timeout=20, what="both children idle")
    assert "shop" in page.inner_text("#facts")


def expect_text(page, selector: str, text: str, timeout: float = 10.0) -> None:
    """Poll the element's text from the test (the page's CSP forbids the eval a string predicate needs)."""
    wait_until(lambda: text in (page.text_content(selector) or ""), timeout=timeout,
               what=f"{selector} to show {text!r}")
