"""``gtrain catalog --refresh``: re-price the shipped catalog from the clouds' public price lists into the user's
copy (``$GTRAIN_HOME/catalog/<provider>.csv``, which then replaces the shipped file, dated by its own
``# snapshot:`` line).

* AWS: the Price List **bulk API** (public, no credentials): ``region_index.json`` names each region's current
  offer file; each region's file is read in its CSV form (the same offer file as ``index.json``, hundreds of MB
  for the big regions, so it is streamed row by row instead of loaded whole). On-demand = the ``OnDemand`` term
  of Linux / Shared tenancy / no pre-installed software / ``CapacityStatus=Used``. AWS publishes no spot price
  there: ``price_spot`` stays the shipped estimate, scaled by the new on-demand price.
* GCP: the **Cloud Billing Catalog API** (``services/6F81-5844-456A/skus``, paged; an API key in
  ``GTRAIN_GCP_API_KEY``, or an OAuth token in ``GTRAIN_GCP_ACCESS_TOKEN`` or from ``gcloud``). A machine's price is
  vCPUs x "<family> Instance Core" + GiB x "<family> Instance Ram" + GPUs x "<GPU> GPU" for the region, on demand
  (``OnDemand``) and Spot (``Preemptible``).

Only rows of the shipped catalog are re-priced (its instance types, regions and GPU facts stay); a row whose
price is not found keeps its shipped price and is listed in the file's comments. Nothing is written unless every
provider asked for was fetched and parsed; each file is written to a temporary file and renamed over the old one.
Base URLs can be overridden (``GTRAIN_AWS_PRICING_URL``, ``GTRAIN_GCP_BILLING_URL``), e.g. for tests.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from gtrain.catalog import (
    PROVIDERS,
    SNAPSHOT_PREFIX,
    _check_provider,
    _parse,
    _snapshot,
    override_path,
    shipped_text,
)
from gtrain.errors import ConfigError, GtrainError, ProviderError
from gtrain.registry import CATALOG_REFRESH, CATALOG_RIDERS, price_list

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

AWS_URL = "https://pricing.us-east-1.amazonaws.com"
AWS_REGION_INDEX = "/offers/v1.0/aws/AmazonEC2/current/region_index.json"
GCP_URL = "https://cloudbilling.googleapis.com"
GCP_COMPUTE_SERVICE = "6F81-5844-456A"  # Compute Engine in the Cloud Billing Catalog
AZURE_URL = "https://prices.azure.com"  # the Azure Retail Prices API (public, no login)
URL_ENV = {"aws": "GTRAIN_AWS_PRICING_URL", "gcp": "GTRAIN_GCP_BILLING_URL", "azure": "GTRAIN_AZURE_PRICES_URL"}
KEY_ENV, TOKEN_ENV = "GTRAIN_GCP_API_KEY", "GTRAIN_GCP_ACCESS_TOKEN"
TIMEOUT_S = 60.0
MAX_PAGES = 500

#: Cloud Billing SKU description (lower case, "running in ..." cut off) -> GCE accelerator type
GCP_GPU_SKUS = {
    "nvidia tesla t4 gpu": "nvidia-tesla-t4",
    "nvidia tesla v100 gpu": "nvidia-tesla-v100",
    "nvidia tesla a100 gpu": "nvidia-tesla-a100",
    "nvidia tesla a100 80gb gpu": "nvidia-a100-80gb",
    "nvidia a100 80gb gpu": "nvidia-a100-80gb",
    "nvidia h100 80gb gpu": "nvidia-h100-80gb",
    "nvidia l4 gpu": "nvidia-l4",
}
_GCP_DESC = re.compile(r"^((?:spot )?preemptible )?(.+?) running in .+$")
_GCP_VM = re.compile(r"^([a-z][a-z0-9]*)(?: predefined)? instance (core|ram)$")


@dataclass
class RefreshResult:
    provider: str
    path: str
    snapshot: str
    rows: int
    repriced: int
    kept: list[str] = field(default_factory=list)  # "type region" rows that kept the shipped price
    source: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "path": self.path, "snapshot": self.snapshot, "rows": self.rows,
                "repriced": self.repriced, "kept": self.kept, "source": self.source,
                "seconds": round(self.seconds, 3)}

    def summary(self) -> str:
        kept = f"; {len(self.kept)} kept the shipped price ({', '.join(self.kept[:4])}" \
               + (", ..." if len(self.kept) > 4 else "") + ")" if self.kept else ""
        return (f"{self.provider}: {self.repriced} of {self.rows} offers re-priced from {self.source}{kept} -> "
                f"{self.path} (snapshot {self.snapshot}, {self.seconds:.1f}s)")


# ---------------------------------------------------------------------------------------------- entry point


def refresh(providers: Iterable[str] | None = None, *, today: str | None = None,
            timeout: float = TIMEOUT_S) -> list[RefreshResult]:
    """Re-price each provider's shipped catalog and write the user copies. Raises ConfigError (exit 2) for a bad
    base URL or missing GCP credentials, before any download; ProviderError (exit 1) when a download or a
    response fails, and then writes nothing."""
    names = [_check_provider(p) for p in (providers or PROVIDERS)]
    day = today or time.strftime("%Y-%m-%d", time.gmtime())
    bases = {p: _base_url(p) for p in names}
    auth = _gcp_auth() if "gcp" in names else None
    texts: list[tuple[RefreshResult, str]] = []
    riders: list[tuple[RefreshResult, str, str | None]] = []
    for p in names:
        t0 = time.perf_counter()
        if p == "aws":
            result, text = _refresh_aws(bases[p], day, timeout)
        elif p in CATALOG_REFRESH:  # the provider's own price list, read by its module (registry's hook)
            result, text = price_list(p)(bases[p], day, timeout)
        else:
            assert auth is not None
            skus = _Skus(bases[p], auth, timeout)
            result, text = _refresh_gcp(skus, day)
            for hook in CATALOG_RIDERS.get(p, ()):  # the Cloud TPU types, from the same Cloud Billing Catalog
                t1 = time.perf_counter()
                rider, path, rtext = price_list(hook)(skus, day)
                rider.seconds = time.perf_counter() - t1
                riders.append((rider, path, rtext))
        result.seconds = time.perf_counter() - t0
        texts.append((result, text))
    for result, text in texts:
        _write_atomic(result.provider, text)
    for rider, path, rtext in riders:
        if rtext is not None:  # None: nothing of that list was found; what is in use stays
            _write_atomic(rider.provider, rtext, path)
    return [r for r, _ in texts] + [r for r, _, _ in riders]


def _base_url(provider: str) -> str:
    env = URL_ENV[provider]
    url = os.environ.get(env) or {"aws": AWS_URL, "azure": AZURE_URL}.get(provider, GCP_URL)
    if not re.match(r"^https?://[^/\s]+", url):
        raise ConfigError(f"{env}: {url!r} is not an http(s) URL", hint=f"unset {env} to use the public price list",
                          field=env)
    return url.rstrip("/")


# ---------------------------------------------------------------------------------------------- http


def _open(url: str, timeout: float, headers: dict[str, str] | None = None, what: str = "") -> IO[bytes]:
    import urllib.error
    import urllib.request

    shown = re.sub(r"([?&]key=)[^&]+", r"\1***", url)
    req = urllib.request.Request(url, headers={"User-Agent": "gtrain-catalog-refresh", **(headers or {})})
    try:
        resp: IO[bytes] = urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 (http(s) checked above)
        return resp
    except urllib.error.HTTPError as e:
        body = e.read(2000).decode("utf-8", "replace")
        detail = _error_detail(body)
        if what == "gcp" and e.code in (400, 401, 403):
            raise ConfigError(f"{KEY_ENV}: the Cloud Billing Catalog API refused the credentials "
                              f"(HTTP {e.code}{': ' + detail if detail else ''})",
                              hint=f"set {KEY_ENV} to an API key of a project with the Cloud Billing API enabled "
                                   f"(or {TOKEN_ENV} to an OAuth token), or refresh only aws: --provider aws",
                              field=KEY_ENV) from None
        raise ProviderError(f"catalog refresh: GET {shown} failed: HTTP {e.code}{': ' + detail if detail else ''}",
                            hint="try again later; the catalog in use is unchanged") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ProviderError(f"catalog refresh: could not reach {shown}: {reason}",
                            hint="check the network (or the GTRAIN_*_URL override); the catalog in use is "
                                 "unchanged") from None


def _error_detail(body: str) -> str:
    try:
        return str(json.loads(body)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return body.strip().splitlines()[0][:200] if body.strip() else ""


def _get_json(url: str, timeout: float, headers: dict[str, str] | None = None, what: str = "") -> Any:
    with _open(url, timeout, headers, what) as resp:
        raw = resp.read()
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ProviderError(f"catalog refresh: {url.split('?')[0]} did not return JSON ({e})") from None


def _bad(provider: str, what: str) -> ProviderError:
    return ProviderError(f"catalog refresh: unexpected {provider} price list format: {what}",
                         hint="the catalog in use is unchanged; report this with the gtrain version")


# ---------------------------------------------------------------------------------------------- shipped rows


def _shipped(provider: str) -> tuple[list[str], list[dict[str, str]]]:
    lines = [ln for ln in shipped_text(provider).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    return list(reader.fieldnames or []), list(reader)


def _money(x: float) -> str:
    return f"{round(x, 6):.10g}"


def _render(provider: str, fields: list[str], rows: list[dict[str, str]], day: str, about: list[str],
            kept: list[str]) -> str:
    buf = io.StringIO()
    buf.write(f"# gtrain {provider.upper()} GPU catalog, re-priced by `gtrain catalog --refresh` on {day}. "
              "Delete this file to go back to the catalog shipped with gtrain.\n")
    buf.write(f"{SNAPSHOT_PREFIX} {day}\n")
    for line in about:
        buf.write(f"# {line}\n")
    if kept:
        buf.write(f"# kept the shipped ({_snapshot(shipped_text(provider))}) price, none found: "
                  + ", ".join(kept) + "\n")
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _reprice(row: dict[str, str], od: float, spot: float | None) -> None:
    old_od, old_spot = float(row["price_ondemand"]), float(row["price_spot"])
    row["price_ondemand"] = _money(od)
    row["price_spot"] = _money(spot if spot is not None else old_spot * od / old_od if old_od else old_spot)


# ---------------------------------------------------------------------------------------------- aws


def _refresh_aws(base: str, day: str, timeout: float) -> tuple[RefreshResult, str]:
    fields, rows = _shipped("aws")
    types = {r["instance_type"] for r in rows}
    index = _get_json(base + AWS_REGION_INDEX, timeout)
    try:
        listed: dict[str, Any] = index["regions"]
    except (KeyError, TypeError):
        raise _bad("aws", "region_index.json has no 'regions'") from None
    prices: dict[tuple[str, str], float] = {}
    published = str(index.get("publicationDate") or "")
    for region in sorted({r["region"] for r in rows}):
        entry = listed.get(region)
        if not isinstance(entry, dict) or not entry.get("currentVersionUrl"):
            continue  # that region's rows keep their shipped price
        url = str(entry["currentVersionUrl"])
        url = (url if url.startswith("http") else base + url).removesuffix(".json") + ".csv"
        with _open(url, timeout) as resp:
            for itype, price in _aws_ondemand(io.TextIOWrapper(resp, encoding="utf-8", newline=""), types):
                prices[(itype, region)] = price
    kept: list[str] = []
    for r in rows:
        got = prices.get((r["instance_type"], r["region"]))
        if got is None:
            kept.append(f"{r['instance_type']} {r['region']}")
        else:
            _reprice(r, got, None)
    index_of = f", index of {published}" if published else ""
    about = [f"price_ondemand: the AWS Price List bulk API (EC2 offer files{index_of}), Linux, shared tenancy; "
             "price_spot: an ESTIMATE (the shipped spot estimate scaled by the new on-demand price; AWS's price list "
             "has no spot prices)."]
    text = _render("aws", fields, rows, day, about, kept)
    return RefreshResult("aws", str(override_path("aws")), day, len(rows), len(rows) - len(kept), kept,
                         "the AWS Price List"), text


def _aws_ondemand(stream: IO[str], types: set[str]) -> Iterator[tuple[str, float]]:
    """(instance type, on-demand $/h) from an EC2 offer file in CSV form: a few metadata lines, then a header
    row starting with "SKU", then one row per (product, term, price dimension)."""
    header: list[str] | None = None
    reader = csv.reader(stream)
    for row in reader:
        if row and row[0] == "SKU":
            header = row
            break
    if header is None:
        raise _bad("aws", "offer file CSV has no header row starting with SKU")
    col = {name: i for i, name in enumerate(header)}
    need = ("TermType", "Instance Type", "Operating System", "Tenancy", "PricePerUnit", "Unit")
    if any(n not in col for n in need):
        raise _bad("aws", f"offer file CSV lacks columns {[n for n in need if n not in col]}")
    want = {"TermType": "OnDemand", "Operating System": "Linux", "Tenancy": "Shared", "Unit": "Hrs",
            "Pre Installed S/W": "NA", "CapacityStatus": "Used", "License Model": "No License required",
            "Currency": "USD"}
    checks = [(col[k], v) for k, v in want.items() if k in col]
    i_type, i_price, width = col["Instance Type"], col["PricePerUnit"], len(header)
    for row in reader:
        if len(row) < width or row[i_type] not in types:
            continue
        if all(row[i] == v for i, v in checks):
            try:
                price = float(row[i_price])
            except ValueError:
                continue
            if price > 0:
                yield row[i_type], price


# ---------------------------------------------------------------------------------------------- gcp


def _gcp_auth() -> dict[str, str]:
    """{"key": ...} or {"Authorization": "Bearer ..."}; ConfigError when there is neither."""
    key = os.environ.get(KEY_ENV, "").strip()
    if key:
        return {"key": key}
    token = os.environ.get(TOKEN_ENV, "").strip() or _gcloud_token()
    if token:
        return {"Authorization": f"Bearer {token}"}
    raise ConfigError(f"{KEY_ENV}: refreshing the gcp catalog needs the Cloud Billing Catalog API, which needs an "
                      "API key or an OAuth token, and none was found",
                      hint=f"set {KEY_ENV} (an API key; enable the Cloud Billing API on its project) or {TOKEN_ENV} "
                           "(e.g. $(gcloud auth print-access-token)), or refresh only aws: --provider aws",
                      field=KEY_ENV)


def _gcloud_token() -> str:
    import shutil
    import subprocess

    gcloud = shutil.which("gcloud")
    if not gcloud:
        return ""
    try:
        r = subprocess.run([gcloud, "auth", "print-access-token"], capture_output=True, text=True, timeout=30,
                           check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


class _Skus:
    """One Cloud Billing service's SKUs (all pages), fetched once each: ``skus(service_id)``."""

    def __init__(self, base: str, auth: dict[str, str], timeout: float) -> None:
        self.base, self.auth, self.timeout = base, auth, timeout
        self._got: dict[str, list[dict[str, Any]]] = {}

    def __call__(self, service: str = GCP_COMPUTE_SERVICE) -> list[dict[str, Any]]:
        if service not in self._got:
            self._got[service] = list(_gcp_skus(self.base, self.auth, self.timeout, service))
        return self._got[service]


def _gcp_skus(base: str, auth: dict[str, str], timeout: float,
              service: str = GCP_COMPUTE_SERVICE) -> Iterator[dict[str, Any]]:
    from urllib.parse import urlencode

    # an API key goes in Google's X-Goog-Api-Key header, never the URL (a URL reaches logs and proxies):
    # https://cloud.google.com/docs/authentication/api-keys-use#using-with-rest
    headers = {("X-Goog-Api-Key" if k == "key" else k): v for k, v in auth.items()}
    token = ""
    for _ in range(MAX_PAGES):
        params = {"currencyCode": "USD", "pageSize": "5000"}
        if token:
            params["pageToken"] = token
        page = _get_json(f"{base}/v1/services/{service}/skus?{urlencode(params)}", timeout, headers,
                         what="gcp")
        if not isinstance(page, dict) or not isinstance(page.get("skus", []), list):
            raise _bad("gcp", "a skus page is not {'skus': [...]}")
        yield from page.get("skus", [])
        token = str(page.get("nextPageToken") or "")
        if not token:
            return
    raise _bad("gcp", f"more than {MAX_PAGES} pages of SKUs")


def _gcp_rates(skus: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str, str], float]:
    """(kind, what, market, region) -> USD per unit. kind "core"/"ram" (what: the machine family, e.g. "a2") or
    "gpu" (what: the accelerator type); market "OnDemand" or "Preemptible"."""
    rates: dict[tuple[str, str, str, str], float] = {}
    for sku in skus:
        try:
            usage = sku["category"]["usageType"]
            if usage not in ("OnDemand", "Preemptible"):
                continue
            m = _GCP_DESC.match(str(sku["description"]).strip().lower())
            if not m or bool(m.group(1)) != (usage == "Preemptible"):
                continue
            what = m.group(2)
            vm = _GCP_VM.match(what)
            if vm:
                kind, name = vm.group(2), vm.group(1)
                unit = {"core": "h", "ram": "GiBy.h"}[kind]
            elif what in GCP_GPU_SKUS:
                kind, name, unit = "gpu", GCP_GPU_SKUS[what], "h"
            else:
                continue
            expr = sku["pricingInfo"][-1]["pricingExpression"]
            if expr["usageUnit"] != unit:
                continue
            price = expr["tieredRates"][-1]["unitPrice"]
            usd = int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9
            for region in sku.get("serviceRegions") or []:
                rates[(kind, name, usage, str(region))] = usd
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            continue  # a SKU of another shape: not one we price with
    return rates


def gcp_compute_rates(timeout: float = 20.0) -> dict[tuple[str, str, str, str], float]:
    """The Compute Engine rates of the live Cloud Billing Catalog (:func:`_gcp_rates`), for the $/h ``up``
    freezes (gtrain/providers/gcp/pricing.py): the same URL, credentials and parsing as the refresh.
    :class:`~gtrain.errors.ConfigError` without credentials, :class:`~gtrain.errors.ProviderError` when the
    API does not answer."""
    return _gcp_rates(_gcp_skus(_base_url("gcp"), _gcp_auth(), timeout))


def gcp_machine_price(rates: dict[tuple[str, str, str, str], float], instance_type: str, vcpus: float,
                      memory_gib: float, accelerator_type: str | None, gpu_count: int, region: str,
                      market: str) -> float | None:
    """vCPUs x "<family> Instance Core" + GiB x "<family> Instance Ram" + GPUs x "<GPU> GPU" in ``region`` for
    ``market`` ("OnDemand" / "Preemptible"); None when a part has no SKU there."""
    fam = instance_type.split("-")[0].lower()
    parts = [(("core", fam), float(vcpus)), (("ram", fam), float(memory_gib))]
    if accelerator_type and gpu_count:
        parts.append((("gpu", accelerator_type), float(gpu_count)))
    total = 0.0
    for (kind, name), qty in parts:
        rate = rates.get((kind, name, market, region))
        if rate is None:
            return None
        total += rate * qty
    return total


def _refresh_gcp(skus: _Skus, day: str) -> tuple[RefreshResult, str]:
    fields, rows = _shipped("gcp")
    rates = _gcp_rates(skus())

    def machine(r: dict[str, str], market: str) -> float | None:
        return gcp_machine_price(rates, r["instance_type"], float(r["vcpus"]), float(r["memory_gib"]),
                                 r["accelerator_type"], int(float(r["gpu_count"])), r["region"], market)

    kept: list[str] = []
    spot_est = 0
    for r in rows:
        od = machine(r, "OnDemand")
        if od is None or od <= 0:
            kept.append(f"{r['instance_type']}+{r['gpu_count']}x{r['accelerator_type']} {r['region']}")
            continue
        spot = machine(r, "Preemptible")
        spot_est += spot is None
        _reprice(r, od, spot)
    about = ["price_ondemand = vCPUs x '<family> Instance Core' + GiB x '<family> Instance Ram' + GPUs x '<GPU> GPU' "
             "from the Cloud Billing Catalog API (Compute Engine SKUs), per region; price_spot: the same with the "
             "Spot Preemptible SKUs (GCE may change Spot prices up to once a month)"
             + (f"; {spot_est} rows with no Spot SKU keep a scaled estimate" if spot_est else "") + "."]
    text = _render("gcp", fields, rows, day, about, kept)
    return RefreshResult("gcp", str(override_path("gcp")), day, len(rows), len(rows) - len(kept), kept,
                         "the Cloud Billing Catalog"), text


# ---------------------------------------------------------------------------------------------- writing


def _write_atomic(provider: str, text: str, to: str | None = None) -> None:
    """Check the new text parses as a catalog (a rider's hook checked its own), then temp file + rename: a reader
    sees the old or the new file."""
    import tempfile
    from pathlib import Path

    path = Path(to) if to else override_path(provider)
    if to is None:
        _parse(provider, text, str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{provider}.", suffix=".csv.tmp", dir=path.parent)
    except (NotADirectoryError, FileExistsError) as e:
        raise ConfigError(f"GTRAIN_HOME: cannot make {path.parent}: {e.strerror}",
                          hint="point GTRAIN_HOME at a directory", field="GTRAIN_HOME") from None
    except OSError as e:
        raise GtrainError(f"catalog refresh: cannot write {path.parent}: {e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
