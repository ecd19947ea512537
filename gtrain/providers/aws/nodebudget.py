"""A node's own cost cap (stdlib only, run ON the node: ``python3 nodebudget.py ARGS -- COMMAND...``).

``policies.max_cost_usd`` is held by the nodes themselves, so it holds with no laptop and no gtrain process left.
A fixed lifetime (``max_cost_usd / $/h`` scheduled at boot) is right for a price that does not move; a spot
price does. This watch prices what the node has run so far at the price in effect, interval by interval, and
runs ``COMMAND`` (``shutdown -h now``: on EC2 with InstanceInitiatedShutdownBehavior=terminate, a termination)
at the first check at which the spend so far plus one more interval at the current price would pass the node's
budget, so the node never runs a whole check interval past its share of the cap.

Where the current price comes from, first found wins, every ``--interval`` seconds:

1. ``--aws-zone``: the EC2 API's DescribeSpotPriceHistory for this node's type and zone
   (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html), asked with the
   instance role's credentials, which the node reads from the instance metadata service (IMDSv2:
   https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html; the role needs
   ``ec2:DescribeSpotPriceHistory``); signed with Signature Version 4
   (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html). The
   credentials stay in this process: never logged, never written.
2. ``--price-file``: a price written to the node (``{"usd_per_hour", "source"}``) by whatever has it, for a
   node without an instance role (gtrain itself does not write it today).
3. The price frozen at ``up`` (``--price``), which the node keeps until one of the others answers.

Every check writes ``--state`` (``{"spent_usd", "budget_usd", "usd_per_hour", "source", "at", "stopped"}``) so a
restarted watch goes on from what was spent, and ``status`` can read it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

EC2_API_VERSION = "2016-11-15"
_UTC = dt.timezone.utc  # noqa: UP017 - a node's python3 may be older than 3.11 (no datetime.UTC)
IMDS = "http://169.254.169.254"


# ---- AWS: credentials from the instance role, a SigV4-signed DescribeSpotPriceHistory --------------------------

def imds_credentials(base: str = IMDS, timeout: float = 2.0) -> tuple[str, str, str | None] | None:
    """The instance role's temporary credentials (access key, secret, session token), or None (no role)."""
    try:
        req = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the link-local metadata service
            token = r.read().decode()
        hdr = {"X-aws-ec2-metadata-token": token}
        path = f"{base}/latest/meta-data/iam/security-credentials/"
        with urllib.request.urlopen(urllib.request.Request(path, headers=hdr), timeout=timeout) as r:  # noqa: S310
            role = r.read().decode().split("\n")[0].strip()
        if not role:
            return None
        with urllib.request.urlopen(urllib.request.Request(path + role, headers=hdr), timeout=timeout) as r:  # noqa: S310
            doc = json.loads(r.read().decode())
        return str(doc["AccessKeyId"]), str(doc["SecretAccessKey"]), doc.get("Token")
    except (OSError, ValueError, KeyError):
        return None


def env_credentials() -> tuple[str, str, str | None] | None:
    """Credentials in this process's environment (a node given them some other way; the tests)."""
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    return (key, secret, os.environ.get("AWS_SESSION_TOKEN")) if key and secret else None


def sigv4_headers(method: str, url: str, body: bytes, region: str, service: str,
                  creds: tuple[str, str, str | None], now: dt.datetime | None = None) -> dict[str, str]:
    """Signature Version 4 headers for one request (``Authorization``, ``X-Amz-Date``, the session token)."""
    key, secret, token = creds
    now = now or dt.datetime.now(_UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    parts = urllib.parse.urlsplit(url)
    headers = {"content-type": "application/x-www-form-urlencoded; charset=utf-8", "host": parts.netloc,
               "x-amz-date": amz_date}
    if token:
        headers["x-amz-security-token"] = token
    signed = ";".join(sorted(headers))
    canonical = "\n".join([method, parts.path or "/", parts.query,
                           "".join(f"{k}:{headers[k].strip()}\n" for k in sorted(headers)), signed,
                           hashlib.sha256(body).hexdigest()])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = f"AWS4{secret}".encode()
    for part in (day, region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {"Content-Type": headers["content-type"], "X-Amz-Date": amz_date,
           "Authorization": f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={signed}, "
                            f"Signature={signature}"}
    if token:
        out["X-Amz-Security-Token"] = token
    return out


def aws_spot_price(endpoint: str, region: str, zone: str, instance_type: str,
                   creds: tuple[str, str, str | None], timeout: float = 10.0) -> tuple[float, str]:
    """The spot price in effect now for ``instance_type`` in ``zone`` (Linux/UNIX): (USD/h, its timestamp).
    AWS answers a StartTime of now with the last change before it. Raises OSError/ValueError on failure."""
    now = dt.datetime.now(_UTC)
    body = urllib.parse.urlencode({
        "Action": "DescribeSpotPriceHistory", "Version": EC2_API_VERSION, "InstanceType.1": instance_type,
        "ProductDescription.1": "Linux/UNIX", "AvailabilityZone": zone,
        "StartTime": now.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()
    url = endpoint.rstrip("/") + "/"
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers=sigv4_headers("POST", url, body, region, "ec2", creds, now))
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the EC2 endpoint
        root = ET.fromstring(r.read())
    best: tuple[str, float] | None = None
    for item in root.iter():
        if item.tag.rsplit("}", 1)[-1] != "item":
            continue
        fields = {c.tag.rsplit("}", 1)[-1]: (c.text or "") for c in item}
        if "spotPrice" not in fields or fields.get("availabilityZone", zone) != zone:
            continue
        ts = fields.get("timestamp", "")
        if best is None or ts > best[0]:
            best = (ts, float(fields["spotPrice"]))
    if best is None:
        raise ValueError(f"no spot price for {instance_type} in {zone}")
    return best[1], best[0]


# ---- the watch --------------------------------------------------------------------------------------------

class Budget:
    """The node's spend at the prices in effect; :meth:`check` says whether to stop now."""

    def __init__(self, budget_usd: float, usd_per_hour: float, source: str, interval_s: float,
                 state: dict[str, object] | None = None, now: float | None = None) -> None:
        self.budget_usd = float(budget_usd)
        self.interval_s = float(interval_s)
        st = state or {}
        self.spent_usd = float(st.get("spent_usd") or 0.0)  # type: ignore[arg-type]
        self.usd_per_hour = float(st.get("usd_per_hour") or usd_per_hour)  # type: ignore[arg-type]
        self.source = str(st.get("source") or source)
        self.last = float(st.get("at") or (time.time() if now is None else now))  # type: ignore[arg-type]
        self.stopped = False

    def check(self, now: float, usd_per_hour: float | None, source: str | None) -> bool:
        """Bill the time since the last check at the price then in effect, take the current price, and stop
        when one more interval at it would pass the budget."""
        self.spent_usd += max(0.0, now - self.last) * self.usd_per_hour / 3600.0
        self.last = now
        if usd_per_hour is not None and usd_per_hour > 0:
            self.usd_per_hour, self.source = usd_per_hour, source or self.source
        nxt = self.interval_s * self.usd_per_hour / 3600.0
        self.stopped = self.spent_usd + nxt >= self.budget_usd
        return self.stopped

    def to_dict(self) -> dict[str, object]:
        return {"spent_usd": round(self.spent_usd, 6), "budget_usd": self.budget_usd,
                "usd_per_hour": self.usd_per_hour, "source": self.source, "at": self.last, "stopped": self.stopped}


def pushed_price(path: str | None) -> tuple[float, str] | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        return float(doc["usd_per_hour"]), str(doc.get("source") or "pushed")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: str, doc: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} gtrain budget: {msg}", flush=True)


def main(argv: list[str]) -> int:
    import argparse

    if "--" not in argv:
        print("usage: nodebudget.py --budget-usd USD --price USD_PER_H --interval S --state PATH [--price-file PATH]"
              " [--aws-region R --aws-zone Z --instance-type T [--ec2-endpoint URL]] -- COMMAND...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    command = argv[cut + 1:]
    p = argparse.ArgumentParser(prog="nodebudget.py")
    p.add_argument("--budget-usd", type=float, required=True)
    p.add_argument("--price", type=float, required=True)
    p.add_argument("--source", default="the price frozen at up")
    p.add_argument("--interval", type=float, default=60.0)
    p.add_argument("--state", required=True)
    p.add_argument("--price-file")
    p.add_argument("--aws-region")
    p.add_argument("--aws-zone")
    p.add_argument("--instance-type")
    p.add_argument("--ec2-endpoint")
    a = p.parse_args(argv[:cut])
    if not command:
        print("nodebudget.py: no command after --", file=sys.stderr)
        return 2
    try:
        with open(a.state, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = None
    watch = Budget(a.budget_usd, a.price, a.source, a.interval, state)
    endpoint = a.ec2_endpoint or (f"https://ec2.{a.aws_region}.amazonaws.com" if a.aws_region else None)
    creds = None
    no_role_until = 0.0  # no instance role found: ask the metadata service again only now and then
    said: set[str] = set()
    _log(f"${watch.budget_usd:g} for this node at ${watch.usd_per_hour:g}/h ({watch.source}), checked every "
         f"{a.interval:g} s")
    while True:
        price: tuple[float, str] | None = None
        if a.aws_zone and a.instance_type and a.aws_region and endpoint:
            if creds is None and time.time() >= no_role_until:
                creds = env_credentials() or imds_credentials()
                no_role_until = 0.0 if creds else time.time() + max(600.0, 10 * a.interval)
            if creds is None:
                if "creds" not in said:
                    said.add("creds")
                    _log("no instance role: the spot price is not read here (the pushed or frozen price is used)")
            else:
                try:
                    usd, ts = aws_spot_price(endpoint, a.aws_region, a.aws_zone, a.instance_type, creds)
                    price = (usd, f"aws spot price history, {a.aws_zone}, {ts[:16]}Z")
                except (OSError, ValueError) as e:  # refused (403: the role lacks the permission), throttled, down
                    if type(e).__name__ not in said:
                        said.add(type(e).__name__)
                        _log(f"spot price not read ({type(e).__name__}: {str(e)[:160]}); keeping the last price")
                    creds = None  # temporary credentials expire: fetch them again next time
        price = price or pushed_price(a.price_file)
        before = watch.usd_per_hour
        stop = watch.check(time.time(), *(price or (None, None)))
        if watch.usd_per_hour != before:
            _log(f"price now ${watch.usd_per_hour:g}/h ({watch.source}); ${watch.spent_usd:.4f} of "
                 f"${watch.budget_usd:g} spent")
        _write(a.state, watch.to_dict())
        if stop:
            _log(f"budget reached: ${watch.spent_usd:.4f} spent of ${watch.budget_usd:g} at "
                 f"${watch.usd_per_hour:g}/h (policies.max_cost_usd); running {' '.join(command)}")
            return subprocess.call(command)
        time.sleep(a.interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
