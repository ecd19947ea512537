"""`gtrain catalog --refresh` against a local http.server replaying recorded price-list responses
(tests/fixtures/pricing/: AWS bulk-API region index + per-region offer CSVs, GCP Cloud Billing Catalog SKU pages),
and the catalog's snapshot date. The CLI runs as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pricing"
API_KEY = "test-key-not-real"


class _Handler(BaseHTTPRequestHandler):
    hits: list[str] = []
    fail_gcp_page2 = False

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        type(self).hits.append(self.path)
        if url.path.startswith("/offers/"):
            f = FIXTURES / "aws" / url.path.lstrip("/")
            if f.is_file():
                return self._send(200, f.read_bytes(), "application/octet-stream")
            return self._send(404, b"<Error><Code>NoSuchKey</Code></Error>", "application/xml")
        if url.path in ("/v1/services/6F81-5844-456A/skus", "/v1/services/E000-3F24-B8AA/skus"):
            q = parse_qs(url.query)
            if self.headers.get("X-Goog-Api-Key") != API_KEY and self.headers.get("Authorization") != "Bearer tok":
                err = {"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.",
                                 "status": "INVALID_ARGUMENT"}}
                return self._send(400, json.dumps(err).encode(), "application/json")
            if "E000" in url.path:  # the Cloud TPU service: one page of TPU v2-v4 SKUs
                return self._send(200, (FIXTURES / "gcp" / "tpu-skus.json").read_bytes(), "application/json")
            page = 2 if q.get("pageToken") else 1
            if page == 2 and type(self).fail_gcp_page2:
                return self._send(503, b'{"error": {"code": 503, "message": "The service is unavailable."}}',
                                  "application/json")
            return self._send(200, (FIXTURES / "gcp" / f"skus-page{page}.json").read_bytes(), "application/json")
        if url.path == "/api/retail/prices":  # the Azure Retail Prices API: page 2 is the $skip link of page 1
            page = 2 if "$skip=" in url.query or "%24skip=" in url.query else 1
            body = (FIXTURES / "azure" / f"retail-prices-page{page}.json").read_text()
            if page == 1:  # NextPageLink points back at this server, as the real one points at prices.azure.com
                body = body.replace("https://prices.azure.com", f"http://127.0.0.1:{self.server.server_address[1]}")
            return self._send(200, body.encode(), "application/json")
        self._send(404, b"not found", "text/plain")


@pytest.fixture
def price_server() -> Iterator[str]:
    _Handler.hits = []
    _Handler.fail_gcp_page2 = False
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def env(price_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GTRAIN_AWS_PRICING_URL", price_server)
    monkeypatch.setenv("GTRAIN_GCP_BILLING_URL", price_server)
    monkeypatch.setenv("GTRAIN_AZURE_PRICES_URL", price_server)
    monkeypatch.setenv("GTRAIN_GCP_API_KEY", API_KEY)
    monkeypatch.delenv("GTRAIN_GCP_ACCESS_TOKEN", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no gcloud to fall back on
    return price_server


def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _offers(provider: str) -> dict[tuple[str, str, str], tuple[float, float]]:
    from gtrain import catalog  # in process: the same $GTRAIN_HOME, re-read when the file changes

    return {(o.instance_type, str(o.accelerator_type), o.region): (o.price_ondemand, o.price_spot)
            for o in catalog.offers(provider)}


def test_shipped_catalog_says_its_date(gtrain_home: Path) -> None:
    from gtrain import catalog

    assert catalog.snapshot_date() == "2025-12"
    assert catalog.source("aws").user_copy is False
    r = gtrain("catalog", "--gpu", "H100")
    assert r.returncode == 0, r.stderr
    assert "catalog snapshot 2025-12" in r.stdout
    doc = json.loads(gtrain("catalog", "--gpu", "H100", "--json").stdout)
    assert doc["snapshot"] == "2025-12"


def test_refresh_reprices_known_rows_and_dates_the_user_copy(env: str, gtrain_home: Path) -> None:
    before_aws, before_gcp = _offers("aws"), _offers("gcp")
    t0 = time.perf_counter()
    r = gtrain("catalog", "--refresh", "--json")
    took = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    done = {d["provider"]: d for d in json.loads(r.stdout)["refreshed"]}
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert done["aws"]["snapshot"] == day and done["gcp"]["snapshot"] == day
    assert Path(done["aws"]["path"]) == gtrain_home / "catalog" / "aws.csv"
    print(f"refresh against the fixture server: {took:.2f}s wall (CLI), "
          f"aws {done['aws']['seconds']}s, gcp {done['gcp']['seconds']}s")

    aws = _offers("aws")
    assert set(aws) == set(before_aws)  # the same rows: only prices change
    # us-east-1: the Linux / Shared / Used / no-software OnDemand row wins over Windows, RHEL, Dedicated,
    # capacity-reservation, SQL and Reserved rows
    assert aws[("g4dn.xlarge", "None", "us-east-1")][0] == pytest.approx(0.551)
    assert aws[("g4dn.2xlarge", "None", "us-east-1")][0] == pytest.approx(0.788)
    # spot: the shipped estimate scaled by the on-demand change
    old_od, old_spot = before_aws[("g4dn.xlarge", "None", "us-east-1")]
    assert aws[("g4dn.xlarge", "None", "us-east-1")][1] == pytest.approx(old_spot * 0.551 / old_od, rel=1e-4)
    assert aws[("g4dn.xlarge", "None", "us-west-2")][0] == pytest.approx(0.551)
    # a $0 row and regions with no offer file keep the shipped price, and are listed
    assert aws[("g4dn.2xlarge", "None", "us-west-2")] == before_aws[("g4dn.2xlarge", "None", "us-west-2")]
    assert aws[("p5.48xlarge", "None", "us-east-2")] == before_aws[("p5.48xlarge", "None", "us-east-2")]
    assert done["aws"]["repriced"] == 3 and "g4dn.2xlarge us-west-2" in done["aws"]["kept"]
    assert not any(k[0] == "m5.large" for k in aws)  # types the shipped catalog does not know stay out

    gcp = _offers("gcp")
    assert set(gcp) == set(before_gcp)
    # VM (vCPUs x core + GiB x RAM) + GPU, on demand and Spot, from two pages of SKUs
    od, spot = gcp[("g2-standard-4", "nvidia-l4", "us-central1")]
    assert od == pytest.approx(4 * 0.02 + 16 * 0.0025 + 0.6) and spot == pytest.approx(4 * 0.008 + 16 * 0.001 + 0.22)
    od8, _ = gcp[("g2-standard-8", "nvidia-l4", "us-central1")]
    assert od8 == pytest.approx(8 * 0.02 + 32 * 0.0025 + 0.6)  # not the Virtual Workstation / custom / commit SKUs
    # europe-west4 has on-demand SKUs but no Spot ones: spot is the scaled estimate
    od_eu, spot_eu = gcp[("g2-standard-4", "nvidia-l4", "europe-west4")]
    b_od, b_spot = before_gcp[("g2-standard-4", "nvidia-l4", "europe-west4")]
    assert od_eu == pytest.approx(4 * 0.022 + 16 * 0.00275 + 0.66) and spot_eu == pytest.approx(b_spot * od_eu / b_od,
                                                                                                 rel=1e-4)
    assert gcp[("a3-highgpu-8g", "nvidia-h100-80gb", "us-central1")] == \
        before_gcp[("a3-highgpu-8g", "nvidia-h100-80gb", "us-central1")]

    text = (gtrain_home / "catalog" / "aws.csv").read_text()
    assert f"# snapshot: {day}" in text and "kept the shipped (2025-12) price" in text
    from gtrain import catalog

    assert catalog.snapshot_date("aws") == day and catalog.source("aws").user_copy
    both = gtrain("catalog", "--gpu", "T4")
    assert f"catalog snapshot {day}" in both.stdout  # both refreshed: one date
    assert any("region_index.json" in h for h in _Handler.hits)
    assert any("pageToken=" in h for h in _Handler.hits)  # paged
    assert not [h for h in _Handler.hits if "key=" in h]  # the API key went in a header, never the URL


def test_refresh_one_provider_leaves_the_other_shipped(env: str, gtrain_home: Path) -> None:
    r = gtrain("catalog", "--refresh", "--provider", "aws")
    assert r.returncode == 0, r.stderr
    assert "aws: 3 of " in r.stdout and "re-priced" in r.stdout
    assert not (gtrain_home / "catalog" / "gcp.csv").exists()
    listing = gtrain("catalog", "--gpu", "T4")
    assert "aws " in listing.stdout and "gcp 2025-12" in listing.stdout
    assert not any("/v1/services" in h for h in _Handler.hits)


def test_failed_refresh_keeps_the_old_user_copy(env: str, gtrain_home: Path) -> None:
    assert gtrain("catalog", "--refresh").returncode == 0
    old = {p: (gtrain_home / "catalog" / f"{p}.csv").read_bytes() for p in ("aws", "gcp")}
    _Handler.fail_gcp_page2 = True
    r = gtrain("catalog", "--refresh")
    assert r.returncode == 1, r
    assert "HTTP 503" in r.stderr and "unchanged" in r.stderr and "Traceback" not in r.stderr
    for p in ("aws", "gcp"):  # aws downloaded fine, but nothing is written unless everything is
        assert (gtrain_home / "catalog" / f"{p}.csv").read_bytes() == old[p]
    # no temp files
    assert sorted(f.name for f in (gtrain_home / "catalog").iterdir()) == ["aws.csv", "azure.csv", "gcp.csv", "tpu.csv"]


def test_unreachable_price_list_is_exit_1_naming_the_url(env: str, gtrain_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.services import free_port

    monkeypatch.setenv("GTRAIN_AWS_PRICING_URL", f"http://127.0.0.1:{free_port()}")
    r = gtrain("catalog", "--refresh", "--provider", "aws")
    assert r.returncode == 1, r
    assert "could not reach http://127.0.0.1:" in r.stderr and "Traceback" not in r.stderr
    assert not (gtrain_home / "catalog").exists()


@pytest.mark.parametrize(("var", "value", "needle"), [
    ("GTRAIN_GCP_API_KEY", "wrong-key", "GTRAIN_GCP_API_KEY"),
    ("GTRAIN_GCP_BILLING_URL", "ftp://example", "GTRAIN_GCP_BILLING_URL"),
    ("GTRAIN_GCP_API_KEY", "", "GTRAIN_GCP_API_KEY"),
])
def test_bad_input_is_exit_2_and_writes_nothing(env: str, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                var: str, value: str, needle: str) -> None:
    monkeypatch.setenv(var, value)
    r = gtrain("catalog", "--refresh", "--json")
    assert r.returncode == 2, r
    doc = json.loads(r.stdout)
    assert needle in doc["message"] and doc["field"] == needle
    assert "wrong-key" not in r.stdout + r.stderr  # the key is never echoed
    assert not (gtrain_home / "catalog").exists()


def test_oauth_token_instead_of_a_key(env: str, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GTRAIN_GCP_API_KEY")
    monkeypatch.setenv("GTRAIN_GCP_ACCESS_TOKEN", "tok")
    r = gtrain("catalog", "--refresh", "--provider", "gcp")
    assert r.returncode == 0, r.stderr
    assert all("key=" not in h for h in _Handler.hits)


def test_refresh_reprices_the_tpu_types_from_their_skus(env: str, gtrain_home: Path) -> None:
    """The Cloud TPU types ride on gcp's refresh: $/chip-hour from the TPU SKUs of the Cloud TPU service (v4) and
    of Compute Engine (v5p, v5e), spot from the Preemptible SKUs (none for v4: its estimate scaled), commitments
    and non-hourly SKUs left out, v6e (no SKU) kept as shipped and listed; `catalog --tpu` and a plan use it."""
    from gtrain.registry import accelerator_shape

    before = {n: accelerator_shape(n) for n in ("tpu-v4-8", "tpu-v6e-8")}
    r = gtrain("catalog", "--refresh", "--provider", "gcp", "--json")
    assert r.returncode == 0, r.stderr
    done = {d["provider"]: d for d in json.loads(r.stdout)["refreshed"]}
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert Path(done["tpu"]["path"]) == gtrain_home / "catalog" / "tpu.csv" and done["tpu"]["snapshot"] == day
    assert done["tpu"]["kept"] == [f"tpu-v6e-{n}" for n in (1, 4, 8, 16, 32, 64)]
    assert any("/services/E000-3F24-B8AA/skus" in h for h in _Handler.hits)
    v5p, v5e, v4, v6e = (accelerator_shape(n) for n in ("tpu-v5p-32", "tpu-v5litepod-16", "tpu-v4-8", "tpu-v6e-8"))
    assert (v5p.price_chip_h, v5p.price_spot_chip_h, v5p.snapshot) == (4.0, 1.5, day)
    assert v5p.price_per_hour(True) == pytest.approx(16 * 1.5)  # per chip-hour x chips
    assert (v5e.price_chip_h, v5e.price_spot_chip_h) == (1.1, 0.5)
    assert v4.price_chip_h == 3.0 and v4.price_spot_chip_h == pytest.approx(
        before["tpu-v4-8"].price_spot_chip_h * 3.0 / before["tpu-v4-8"].price_chip_h, rel=1e-4)
    assert (v6e.price_chip_h, v6e.price_spot_chip_h) == (before["tpu-v6e-8"].price_chip_h,
                                                         before["tpu-v6e-8"].price_spot_chip_h)
    listed = json.loads(gtrain("catalog", "--tpu", "--json").stdout)
    assert listed["snapshot"] == day
    assert {t["name"]: t["price_spot_per_hour"] for t in listed["tpu_types"]}["tpu-v5p-32"] == pytest.approx(24.0)


def test_no_tpu_sku_recognised_keeps_the_types_and_writes_nothing(gtrain_home: Path) -> None:
    """Should Google rename its TPU SKUs, the TPU types in use stay (no dated copy of unchanged prices), every
    type is listed as kept, and nothing fails: gcp's GPU prices are refreshed all the same."""
    from gtrain.providers.gcp.tpu.prices import generation, refresh_catalog

    result, path, text = refresh_catalog(lambda service: [{"description": "Unrelated SKU", "category": {
        "usageType": "OnDemand", "resourceGroup": "TPU"}}], "2026-12-03")
    assert text is None and result.repriced == 0 and "tpu-v5p-32" in result.kept and "unchanged" in result.source
    assert not Path(path).exists()
    assert [generation(d) for d in ("TPU v5p chip-hour", "Tpu-v4 Pod", "TPU v5 Lite PodSlice", "TpuV6e",
                                    "Trillium chip-hour", "N1 Predefined Instance Core")] == \
        ["v5p", "v4", "v5e", "v6e", "v6e", None]
