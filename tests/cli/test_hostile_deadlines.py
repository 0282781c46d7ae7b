"""One total deadline, for every client of a foreign server: the release API, the Hugging Face Hub,
/metrics and bundle downloads. A loopback server drips its status line, its headers or its body one byte at
a time, or says nothing; whichever phase it stalls in, each client returns (with its own clear error)
within its documented deadline, plus scheduling slack."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.hostile_http import elapsed, hostile_server
from rocmdoctor.provision.bundle.download import Downloader, DownloadError, DownloadOptions, PartFile
from rocmdoctor.provision.bundle.github_release import ApiOptions, ReleaseError, fetch_release
from rocmdoctor.provision.bundle.manifest import Asset
from rocmdoctor.provision.server.hub import HubClient, HubError
from rocmdoctor.provision.verify.memory import MetricsError, read_metrics

SLACK_S = 1.0
TAG = "vllm0.22.1-rocm7.13.0-gfx1151"
BODY = b'{"siblings": [{"rfilename": "config.json"}], "assets": [], "tag_name": "x"}' + b" " * 64


def _release(url: str, deadline: float) -> None:
    fetch_release("o/r", TAG, url, ApiOptions(deadline, deadline, deadline))


def _hub(url: str, deadline: float) -> None:
    HubClient("org/model", endpoint=url, deadline_s=deadline).listing()


def _metrics(url: str, deadline: float) -> None:
    read_metrics(url + "/metrics", deadline)


def _download(url: str, deadline: float, dest: Path) -> None:
    # Documented: response headers within connect + read timeout; the body then stalls out per read
    # (read timeout) or by the minimum-throughput rule over rate_window_s.
    options = DownloadOptions(
        connect_timeout_s=deadline / 2,
        read_timeout_s=deadline / 2,
        retries=0,
        min_rate_bps=1024,
        rate_window_s=deadline,
    )
    asset = Asset(f"{TAG}-x64.tar.gz", len(BODY), "sha256:" + hashlib.sha256(BODY).hexdigest())
    part = PartFile(asset, dest / asset.name)
    Downloader(options).fetch(part, url + "/" + asset.name, dest)


CLIENTS = {
    "release": (_release, ReleaseError),
    "hub": (_hub, HubError),
    "metrics": (_metrics, MetricsError),
    "download": (_download, DownloadError),
}


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    client=st.sampled_from(sorted(CLIENTS)),
    mode=st.sampled_from(["drip-status", "drip-headers", "drip-body", "silent"]),
    gap_s=st.sampled_from([0.05, 0.3, 0.9]),
    deadline=st.sampled_from([1.0, 1.5]),
)
def test_every_client_returns_within_its_deadline_whatever_the_server_drips(
    tmp_path: Path, client: str, mode: str, gap_s: float, deadline: float
):
    fn, error = CLIENTS[client]
    with hostile_server(mode, BODY, gap_s) as server:
        args = (server.url, deadline) + ((tmp_path,) if client == "download" else ())
        took, raised = elapsed(fn, *args)
    # a fast drip of a short body may finish in time: then it must be a normal answer or a clean refusal
    assert raised is None or isinstance(raised, error), repr(raised)
    if mode in ("silent", "drip-status", "drip-headers") and gap_s >= 0.3:
        assert raised is not None
    assert took <= deadline + SLACK_S, (client, mode, gap_s, took)


def test_a_drip_of_headers_one_byte_a_second_is_cut_at_the_hub_deadline():
    with hostile_server("drip-headers", BODY, 1.0) as server:
        took, raised = elapsed(_hub, server.url, 2.0)
    assert isinstance(raised, HubError) and "within 2 s" in str(raised)
    assert took <= 2.0 + SLACK_S
