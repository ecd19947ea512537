"""The account's EC2 vCPU quota for an instance family, read before anything is made (``Provider.quota_check``:
a ``resources.any_of`` candidate whose quota cannot hold the request is skipped).

EC2 limits running instances per family in vCPUs, one Service Quotas code per family and market
(https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html; the codes are those
``aws service-quotas list-service-quotas --service-code ec2`` lists;
https://docs.aws.amazon.com/servicequotas/2019-06-24/apireference/API_GetServiceQuota.html). The check reads
the quota's value only: a value below what the request needs can never hold it; what other instances use of
it is not subtracted (that needs CloudWatch usage metrics), so a candidate is never skipped wrongly."""

from __future__ import annotations

import re
from typing import Any

#: instance family (the type's leading letters) -> (on-demand code, spot code); "standard" covers the rest
CODES: dict[str, tuple[str, str]] = {
    "p": ("L-417A185B", "L-7212CCBC"),  # Running On-Demand P instances / All P Spot Instance Requests
    "g": ("L-DB2E81BA", "L-3819A6DF"),  # G and VT
    "vt": ("L-DB2E81BA", "L-3819A6DF"),
    "inf": ("L-1945791B", "L-B5D1601B"),  # Inf
    "trn": ("L-2C3B7624", "L-6B0D517C"),  # Trn
    "f": ("L-74FC7D96", "L-88CF9481"),  # F
    "standard": ("L-1216C47A", "L-34B43A08"),  # A, C, D, H, I, M, R, T, Z
}
STANDARD = set("acdhimrtz")


def quota_code(instance_type: str, spot: bool) -> str | None:
    """The Service Quotas code that limits ``instance_type`` (``p5.48xlarge`` -> ``L-417A185B``), or None for a
    family this table does not know (no check)."""
    m = re.match(r"([a-z]+)", instance_type)
    if not m:
        return None
    fam = m.group(1)
    codes = CODES.get(fam) or (CODES["standard"] if fam[0] in STANDARD and fam not in ("inf", "trn") else None)
    return None if codes is None else codes[1 if spot else 0]


def shortfall(session: Any, region: str, instance_type: str, vcpus: int, spot: bool) -> str | None:
    """Why the account's quota in ``region`` cannot hold ``vcpus`` vCPUs of ``instance_type``, or None."""
    from gtrain.providers.aws.api import call

    code = quota_code(instance_type, spot)
    if code is None:
        return None
    client = session.client("service-quotas", region_name=region)
    with call(f"service-quotas GetServiceQuota {code} in {region}"):
        q = client.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
    value = float(q.get("Value") or 0)
    if value < vcpus:
        return (f"EC2 quota {code} ({q.get('QuotaName') or 'vCPUs'}) in {region} is {value:g} vCPUs; "
                f"{vcpus} asked")
    return None
