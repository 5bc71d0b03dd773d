"""/dashboard in a real headless Chromium (Debian's chromium + chromedriver, driven by selenium) against a real
gateway and worker; /v1/fleet, the data it polls, behind the API key."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests import gatewayserver
from tests.hashed import MODEL
from tests.systemtools import need

KEY = "dashboard-test-key"


@pytest.fixture
def gateway(redis_url):
    server = gatewayserver.Server(gatewayserver.settings(redis_url, api_key=KEY))
    yield server
    server.stop()


def test_fleet_data_is_behind_the_key_and_the_page_loads_nothing_from_elsewhere(gateway, hashed_worker):
    worker = hashed_worker()
    assert httpx.get(f"{gateway.url}/v1/fleet").status_code == 401
    answer = httpx.get(f"{gateway.url}/v1/fleet", headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200
    assert [w["name"] for w in answer.json()["workers"]] == [worker.name]
    assert answer.json()["models"][0]["name"] == MODEL
    page = httpx.get(f"{gateway.url}/dashboard")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    assert KEY not in page.text and worker.name not in page.text  # the page holds no data
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert assets and all(a.startswith("/dashboard/assets/") or a.startswith("data:") for a in assets), assets
    for asset in assets:
        if not asset.startswith("data:"):
            assert httpx.get(f"{gateway.url}{asset}").status_code == 200, asset
    assert httpx.get(f"{gateway.url}/dashboard/config.json").json() == {"api_key_required": True}


def test_without_a_key_the_page_does_not_ask_and_the_data_is_open(redis_url, hashed_worker):
    hashed_worker()
    server = gatewayserver.Server(gatewayserver.settings(redis_url))
    try:
        assert httpx.get(f"{server.url}/dashboard/config.json").json() == {"api_key_required": False}
        assert httpx.get(f"{server.url}/v1/fleet").json()["models"][0]["live_workers"] == 1
    finally:
        server.stop()


def test_keys_from_api_keys_make_the_page_ask_too(redis_url):
    """--api-keys without --api-key: /v1/fleet needs a key, so the page must ask for one."""
    server = gatewayserver.Server(gatewayserver.settings(redis_url, api_keys=json.dumps({KEY: {"name": "ops"}})))
    try:
        assert httpx.get(f"{server.url}/dashboard/config.json").json() == {"api_key_required": True}
        assert httpx.get(f"{server.url}/v1/fleet").status_code == 401
    finally:
        server.stop()


def chromium():
    """A headless Chromium session, or a skip that says what is missing."""
    browser = need("chromium", "chromium-browser", untested="/dashboard in a browser")
    driver = need("chromedriver", untested="/dashboard in a browser")
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver), options=options)


def test_the_dashboard_shows_a_running_worker_in_a_real_browser(gateway, hashed_worker, redis_url, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from embedfleet import Producer

    worker = hashed_worker(heartbeat_interval=0.3)
    with Producer(redis_url) as producer:
        producer.embed([f"text {i}" for i in range(20)], MODEL)  # something for texts/s to show
    browser = chromium()
    try:
        browser.get(f"{gateway.url}/dashboard")
        WebDriverWait(browser, 10).until(lambda b: b.find_element(By.ID, "login").is_displayed())
        browser.find_element(By.ID, "key").send_keys(KEY)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        row = f'#workers tr[data-worker="{worker.name}"]'
        WebDriverWait(browser, 15).until(lambda b: b.find_elements(By.CSS_SELECTOR, row))
        assert not browser.find_element(By.ID, "login").is_displayed()
        cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, f"{row} td")]
        assert cells[:2] == [worker.name, MODEL] and "64 tok / 64 rows" in cells
        models = browser.find_element(By.ID, "models").text
        assert MODEL in models and "interactive" in models and "bulk" in models
        # texts/s comes from the worker's advert, refreshed every 0.3 s here; the page polls every 2 s
        WebDriverWait(browser, 15).until(
            lambda b: float(b.find_elements(By.CSS_SELECTOR, f"{row} td")[8].text) > 0)
        assert browser.find_element(By.CSS_SELECTOR, "#chart polyline") is not None
        browser.save_screenshot(str(tmp_path / "dashboard.png"))
        errors = [entry for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
        assert browser.execute_script("return sessionStorage.getItem('embedfleet-api-key')") == KEY
    finally:
        browser.quit()
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
