"""Plain http:// to a coordinator off this machine is refused before any connection
(the API key would cross the network in clear) unless `--insecure-http` says so
(issue 32): the CLI, the sync and async clients, and the Slurm bridge's settings."""

from __future__ import annotations

import aiohttp
import pytest

from ops.kit.async_client import AsyncApiClient
from ops.kit.client import ApiClient, InsecureHttp
from ops.main import run
from ops.slurm.bridge.settings import BridgeSettings
from procs.settings import ConfigError

KEY = "gpf_0123456789abcdef_secret"


@pytest.mark.parametrize("url", ["http://10.0.0.1:8080", "http://coordinator.example"])
def test_the_clients_refuse_plain_http_off_loopback(url: str) -> None:
    with pytest.raises(InsecureHttp, match="--insecure-http"):
        ApiClient(url, KEY)
    assert ApiClient(url, KEY, insecure_http=True).base_url == url


@pytest.mark.parametrize(
    "url",
    ["https://10.0.0.1:8443", "http://127.0.0.1:8080", "http://localhost:1", "http://[::1]:8"],
)
def test_tls_or_loopback_needs_no_flag(url: str) -> None:
    ApiClient(url, KEY)


async def test_the_async_client_refuses_it_too() -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(InsecureHttp):
            AsyncApiClient(http, "http://10.0.0.1:8080", KEY)
        AsyncApiClient(http, "http://10.0.0.1:8080", KEY, insecure_http=True)


def test_the_cli_says_so_without_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    """Without the flag: exit 2 and why, at once, no connection tried. With it, the
    call goes out (to TEST-NET-1, where nobody answers within the timeout)."""
    env = {"GPUFLEET_KEY": KEY}
    assert run(["--url", "http://10.0.0.1:8080", "pools"], env) == 2
    err = capsys.readouterr().err
    assert "--insecure-http" in err and "cannot reach" not in err
    argv = ["--url", "http://192.0.2.1:8080", "--insecure-http", "--timeout", "0.3", "pools"]
    assert run(argv, env) == 1
    assert "cannot reach the coordinator at http://192.0.2.1:8080" in capsys.readouterr().err


def test_the_bridge_refuses_to_start_on_plain_http_to_another_host() -> None:
    settings = BridgeSettings(coordinator_url="http://coordinator.example:8080",
                              coordinator_key=KEY)  # fmt: skip
    with pytest.raises(ConfigError, match="coordinator_url"):
        settings.check()
    BridgeSettings(coordinator_url="https://coordinator.example", coordinator_key=KEY).check()
    BridgeSettings(
        coordinator_url="http://coordinator.example:8080", coordinator_key=KEY, insecure_http=True
    ).check()


def test_a_malformed_url_is_one_line_naming_it_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`urlsplit` raises on a broken IPv6 literal: the check lets the call name the URL."""
    assert run(["--url", "http://[::1", "pools"], {"GPUFLEET_KEY": KEY}) == 1
    err = capsys.readouterr().err
    assert "cannot reach the coordinator at http://[::1" in err and "Traceback" not in err
