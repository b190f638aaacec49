"""The web console in a real headless chromium (selenium + Debian's chromium-driver),
against a real coordinator and a simulated agent: sign in by keyboard, walk fleet → pool
→ node, watch an injected XID turn a GPU unhealthy (and the alert arrive), book GPUs and
see them on the timeline, use the calendar; labels, keyboard use and contrast checked.
Screenshots go to tmp/artifacts/console/ (the path is printed)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.e2e.fleet_procs import Fleet, wait_for

try:
    from selenium import webdriver
except ImportError:  # selenium is in the dev extra
    if os.environ.get("GPUFLEET_TEST_TOOLS") == "required":
        raise
    pytest.skip("selenium is not installed (the dev extra)", allow_module_level=True)
from selenium.common.exceptions import (
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tmp" / "artifacts" / "console"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.timeout(240)


def _require_browser() -> None:
    if CHROMIUM and DRIVER:
        return
    message = "chromium and chromium-driver are needed (Debian: apt-get install chromium-driver)"
    if os.environ.get("GPUFLEET_TEST_TOOLS") == "required":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def fleet(tmp_path: Path, nats_url: str) -> Iterator[tuple[Fleet, str, Path]]:
    procs = Fleet(tmp_path, nats_url)
    try:
        procs.start_coordinator()
        op = procs.operator()
        pool = op.call("pools.create", {"tenantId": "operator", "name": "train"})["poolId"]
        faults = tmp_path / "faults.json"
        faults.write_text('{"faults": []}')
        procs.agents["gpu-a"] = procs._spawn(
            "agent-gpu-a",
            [
                sys.executable, "-m", "agent.main", "--pool-id", pool, "--node-id", "gpu-a",
                "--nats-url", nats_url, "--simulate", "h100-sxm-8", "--interval-s", "1",
                "--fault-file", str(faults),
            ],
        )  # fmt: skip

        def ready() -> bool:
            nodes = op.call("nodes.list", {"tenantId": "operator", "poolId": pool})["nodes"]
            return bool(nodes) and nodes[0]["status"] == "ready"

        wait_for(ready, timeout=60, what="agent ready")
        yield procs, pool, faults
    finally:
        procs.close()


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    _require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-gpu", "--lang=en-GB"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(str(DRIVER)))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: WebDriver, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def _wait(driver: WebDriver, css: str, timeout: float = 30) -> Any:
    try:
        return WebDriverWait(driver, timeout).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, css) or False
        )[0]
    except TimeoutException:
        _shot(driver, "failure")
        main = driver.find_element(By.ID, "main").text[-600:]
        raise AssertionError(f"{css} did not appear; the page says: {main}") from None


# Every visible control has an accessible name: a <label for>, aria-label or text.
UNLABELLED = """
return [...document.querySelectorAll('input, select, textarea, button, a[href]')]
  .filter(e => e.offsetParent !== null)
  .filter(e => {
    if (e.labels && e.labels.length) return false;
    if (e.getAttribute('aria-label')) return false;
    return !(e.textContent || '').trim();
  }).map(e => e.outerHTML.slice(0, 80));
"""
# WCAG contrast of every visible text element against its nearest opaque background.
LOW_CONTRAST = """
const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
const lum = ([r, g, b]) => { const f = c => { c /= 255; return c <= 0.03928 ? c / 12.92 :
  Math.pow((c + 0.055) / 1.055, 2.4); }; return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
const bg = e => { for (; e; e = e.parentElement) {
  const c = rgb(getComputedStyle(e).backgroundColor);
  if (c.length === 3 || c[3] > 0.5) return c.slice(0, 3); } return [255, 255, 255]; };
const bad = [];
for (const e of document.querySelectorAll('body *')) {
  if (e.offsetParent === null || e.closest('[aria-hidden=true]')) continue;
  const own = [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
  if (!own) continue;
  const a = lum(rgb(getComputedStyle(e).color)), b = lum(bg(e));
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (ratio < 4.5) bad.push(`${e.tagName}.${e.className} ${ratio.toFixed(2)}`
    + ` ${e.textContent.trim().slice(0, 30)}`);
}
return bad;
"""


def _accessible(driver: WebDriver) -> None:
    assert driver.execute_script(UNLABELLED) == []
    assert driver.execute_script(LOW_CONTRAST) == []
    assert driver.find_element(By.TAG_NAME, "html").get_attribute("lang") == "en"


# Every URL the page has fetched (scripts, styles, images, API calls, the alert feed).
FETCHED = "return performance.getEntriesByType('resource').map(e => e.name);"


def _fetched_only_from(driver: WebDriver, origin: str) -> None:
    fetched = driver.execute_script(FETCHED)
    assert fetched, "the page fetched nothing"
    elsewhere = [url for url in fetched if not url.startswith(origin + "/")]
    assert elsewhere == [], elsewhere


def _retry(action: Callable[[], T]) -> T:
    """Run `action` again when a live redraw replaced the element it held."""
    for _ in range(4):
        try:
            return action()
        except StaleElementReferenceException:
            continue
    return action()


def _follow(driver: WebDriver, link: str, then: str) -> None:
    """Press Enter on `link` until `then` shows (a live redraw may replace the link
    between finding it and pressing the key)."""
    for _ in range(5):
        try:
            _wait(driver, link).send_keys(Keys.ENTER)
            WebDriverWait(driver, 5).until(lambda d: d.find_elements(By.CSS_SELECTOR, then))
            return
        except (StaleElementReferenceException, TimeoutException):
            continue
    _wait(driver, then)


def _tab_to(driver: WebDriver, css: str, most: int = 60) -> None:
    """Press Tab until the element matching `css` has the focus (keyboard-only use)."""
    target = driver.find_element(By.CSS_SELECTOR, css)
    body = driver.switch_to.active_element
    for _ in range(most):
        if driver.switch_to.active_element == target:
            return
        body.send_keys(Keys.TAB)
        body = driver.switch_to.active_element
    raise AssertionError(f"{css} not reachable with Tab")


def test_console_sign_in_node_xid_booking_and_timeline(
    fleet: tuple[Fleet, str, Path], browser: WebDriver
) -> None:
    procs, pool, faults = fleet
    d = browser
    print(f"\nconsole screenshots: {ARTIFACTS}")
    d.get(procs.url + "/")
    _wait(d, "#signin-form")
    _accessible(d)
    _shot(d, "01-sign-in")

    # Sign in with the keyboard only.
    _tab_to(d, "#key")
    d.switch_to.active_element.send_keys(procs.operator_key, Keys.TAB, "operator", Keys.ENTER)
    _wait(d, f"a[href='#/pool/{pool}']")
    assert d.execute_script("return sessionStorage.getItem('gpufleet.key')") == procs.operator_key
    assert d.execute_script("return localStorage.length") == 0
    assert d.get_cookies() == []
    _accessible(d)
    _shot(d, "02-fleet")

    # Fleet → pool → node, by keyboard.
    _tab_to(d, f"a[href='#/pool/{pool}']")
    _follow(d, f"a[href='#/pool/{pool}']", "a[href='#/node/gpu-a']")
    _follow(d, "a[href='#/node/gpu-a']", "#devices article[data-device]")
    classes = _retry(
        lambda: [
            c.get_attribute("class").split()
            for c in d.find_elements(By.CSS_SELECTOR, "#devices article[data-device]")
        ]
    )
    assert len(classes) == 8 and all("healthy" in c for c in classes)
    _accessible(d)
    _shot(d, "03-node")

    # An XID on GPU 3 (the simulated NVML's fault file): the card turns unhealthy.
    faults.write_text(json.dumps({"faults": [{"kind": "xid", "gpu": 3, "xid": 79}]}))
    WebDriverWait(d, 40).until(
        lambda drv: drv.find_elements(By.CSS_SELECTOR, "#devices article.unhealthy")
    )
    bad = _retry(
        lambda: [e.text for e in d.find_elements(By.CSS_SELECTOR, "#devices article.unhealthy")]
    )
    assert len(bad) == 1 and "GPU 3" in bad[0]
    assert "79" in bad[0]  # the reason names the XID
    _wait(d, "#alert-list li[data-kind='device.unhealthy']", timeout=20)
    _accessible(d)
    _shot(d, "04-node-xid")

    # Book two GPUs from the pool page; the booking appears on the timeline.
    _retry(lambda: d.find_element(By.CSS_SELECTOR, f".crumbs a[href='#/pool/{pool}']").click())
    gpus = _wait(d, "#book-gpus")
    gpus.clear()
    gpus.send_keys("2", Keys.ENTER)
    text = _retry(lambda: _wait(d, "#gantt .booking[data-reservation]").text)
    assert "2 GPU" in text and "active" in text
    assert "Booked rsv_" in d.find_element(By.ID, "status").text
    _accessible(d)
    _shot(d, "05-pool-booked")

    # The holder shows on the node page, next to the unhealthy GPU's at-risk mark if hit.
    d.get(procs.url + "/#/node/gpu-a")
    _wait(d, "#devices .badge.held")
    _shot(d, "06-node-held")

    # An XID on a held GPU: its card is marked at risk, and the holder is alerted.
    held = _retry(
        lambda: [
            e.get_attribute("aria-label").split(":")[0]
            for e in d.find_elements(By.CSS_SELECTOR, "#devices article[data-device]")
            if e.find_elements(By.CSS_SELECTOR, ".badge.held")
        ]
    )
    assert len(held) == 2 and "GPU 3" not in held, held
    index = int(held[0].removeprefix("GPU "))
    xids = [{"kind": "xid", "gpu": gpu, "xid": 79} for gpu in (3, index)]
    faults.write_text(json.dumps({"faults": xids}))
    WebDriverWait(d, 40).until(
        lambda drv: drv.find_elements(By.CSS_SELECTOR, "#devices article .badge.risk")
    )
    at_risk = _retry(
        lambda: [
            e.get_attribute("aria-label")
            for e in d.find_elements(By.CSS_SELECTOR, "#devices article[data-device]")
            if e.find_elements(By.CSS_SELECTOR, ".badge.risk")
        ]
    )
    assert at_risk == [f"GPU {index}: unhealthy"]
    _wait(d, "#alert-list li[data-kind='reservation.atRisk']", timeout=20)
    _accessible(d)
    _shot(d, "06b-node-at-risk")

    # Maintenance on and off (an operator's key).
    _retry(lambda: _wait(d, "#maint-reason").send_keys("swap PSU", Keys.ENTER))
    _wait(d, "#maint-form button.secondary")
    assert "maintenance" in _retry(lambda: d.find_element(By.CSS_SELECTOR, "h1 .badge").text)
    _shot(d, "07-maintenance")
    _retry(lambda: d.find_element(By.CSS_SELECTOR, "#maint-form button.secondary").click())
    WebDriverWait(d, 20).until(lambda drv: drv.find_elements(By.ID, "maint-reason"))

    d.get(procs.url + "/#/calendar")
    _wait(d, "#cal-out table tbody tr")
    assert len(d.find_elements(By.CSS_SELECTOR, "#cal-out tbody tr")) == 96
    _accessible(d)
    _fetched_only_from(d, procs.url)  # the console and its API calls, from the console's origin
    _shot(d, "08-calendar")

    # The reference page renders the OpenAPI document from shipped assets.
    d.get(procs.url + "/api/docs")
    _wait(d, "#ops section h2")
    # Each operation shows its answer: described fields, an example and its errors.
    card = d.find_element(By.ID, "op-reservations-create").text
    assert "Response 200" in card and "reservationId (required) " in card, card
    assert "Its state now." in card and '"reservationId": "rsv_' in card, card
    assert "409 Refused" in card and "ErrorEnvelope" in card, card
    # "Try it" calls this coordinator with the key signed in with in this tab.
    d.find_element(By.CSS_SELECTOR, "#op-capacity-summary details summary").click()
    body = d.find_element(By.ID, "op-capacity-summary-body")
    body.clear()
    body.send_keys('{"tenantId": "operator"}')
    d.find_element(By.CSS_SELECTOR, "#op-capacity-summary details button").click()
    WebDriverWait(d, 20).until(
        lambda drv: drv.find_element(By.ID, "op-capacity-summary-out").text.strip()
    )
    answer = d.find_element(By.ID, "op-capacity-summary-out").text
    status, _, text = answer.partition("\n")
    assert status == "200", answer
    assert [p["poolId"] for p in json.loads(text)["pools"]] == [pool], answer
    _fetched_only_from(d, procs.url)
    _shot(d, "09-api-reference")


def test_console_pages_load_nothing_from_elsewhere(fleet: tuple[Fleet, str, Path]) -> None:
    procs, _, _ = fleet
    import urllib.request

    for path in ("/", "/api/docs"):
        with urllib.request.urlopen(procs.url + path, timeout=5) as resp:
            html = resp.read().decode()
            assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        assert "http://" not in html and "https://" not in html
    for asset in ("console.js", "console.css", "reference.js"):
        text = (REPO / "coordinator" / "web" / asset).read_text()
        assert "http://" not in text and "https://" not in text, asset
