"""A real control plane (`plinth up`, fake GPUs) and a real headless Chromium driven by Selenium.

The browser is the system's Chromium and chromedriver (`make test` installs the Debian
packages when they are missing); Selenium is given both paths, so it never downloads one.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from plinth.core.net import free_port

sys.path.insert(0, str(Path(__file__).parents[1] / "control"))
from plinth_platform import reachable  # noqa: E402 -- tenants' jobs must reach its folders

RESULTS = Path(os.environ.get("PLINTH_RESULTS", "results")) / "ui"


class Platform:
    def __init__(self, home: Path) -> None:
        from plinth.cli.quickstart import start_server

        self.home, self.port = home, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = start_server(home, self.port, "--fake-gpus", "4xA100,4xV100", "--grace", "1",
                                 "--min-runtime", "0", "--serve-tick", "1",
                                 "--serve-policy", "aiad")
        self.token = (home / "token").read_text().strip()

    def client(self, token: str | None = None):
        from plinth.client import Client

        return Client(self.url, token or self.token)

    def close(self) -> None:
        from plinth.cli.quickstart import kill_jobs, stop_server

        stop_server(self.proc)
        kill_jobs(self.home)


@pytest.fixture(scope="module")
def platform(tmp_path_factory) -> Iterator[Platform]:
    p = Platform(reachable(tmp_path_factory.mktemp("ui")) / "home")
    yield p
    p.close()


def _binary(*names: str) -> str:
    for name in names:
        if found := shutil.which(name):
            return found
    pytest.fail(f"no {names[0]} on PATH: `make test` installs the chromium and chromium-driver "
                "packages")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = _binary("chromium", "chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts,
                              service=Service(executable_path=_binary("chromedriver")))
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def shots() -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS
