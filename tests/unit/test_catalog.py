"""The instance catalog: shipped data is complete and sane, queries and resolve() pick the right offer, errors
say which field is wrong and how to fix it, a user copy in $GTRAIN_HOME overrides, and importing is cheap."""

from __future__ import annotations

import csv
import dataclasses
import re
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest

import gtrain.catalog as catalog
from gtrain.errors import ConfigError

AWS_COLUMNS = [
    "instance_type", "vcpus", "memory_gib", "gpu_name", "gpu_count", "gpu_memory_gib", "efa", "region",
    "price_ondemand", "price_spot",
]  # fmt: skip
GCP_COLUMNS = [
    "instance_type", "accelerator_type", "vcpus", "memory_gib", "gpu_name", "gpu_count", "gpu_memory_gib", "region",
    "price_ondemand", "price_spot",
]  # fmt: skip
GPU_NAMES = {"T4", "A10G", "L4", "L40S", "V100", "A100", "A100-80GB", "H100", "H200"}
GCP_ACCEL = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100": "nvidia-h100-80gb",
    "L4": "nvidia-l4",
}

# Every GPU size of every required AWS family, with its GPU and count.
AWS_TYPES: dict[str, tuple[str, int]] = {
    **{f"g4dn.{s}": ("T4", n) for s, n in [("xlarge", 1), ("2xlarge", 1), ("4xlarge", 1), ("8xlarge", 1),
                                            ("12xlarge", 4), ("16xlarge", 1), ("metal", 8)]},
    **{f"{fam}.{s}": (gpu, n) for fam, gpu in [("g5", "A10G"), ("g6", "L4"), ("g6e", "L40S")]
       for s, n in [("xlarge", 1), ("2xlarge", 1), ("4xlarge", 1), ("8xlarge", 1), ("12xlarge", 4), ("16xlarge", 1),
                    ("24xlarge", 4), ("48xlarge", 8)]},
    "p3.2xlarge": ("V100", 1), "p3.8xlarge": ("V100", 4), "p3.16xlarge": ("V100", 8), "p3dn.24xlarge": ("V100", 8),
    "p4d.24xlarge": ("A100", 8), "p4de.24xlarge": ("A100-80GB", 8),
    "p5.4xlarge": ("H100", 1), "p5.48xlarge": ("H100", 8),
    "p5e.48xlarge": ("H200", 8), "p5en.48xlarge": ("H200", 8),
}  # fmt: skip


def _raw(provider: str) -> list[dict[str, str]]:
    text = (files("gtrain.catalog") / f"{provider}.csv").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return list(csv.DictReader(lines))


# ------------------------------------------------------------------------------------------------ data


@pytest.mark.parametrize(("provider", "columns"), [("aws", AWS_COLUMNS), ("gcp", GCP_COLUMNS)])
def test_header_and_every_row_is_sane(provider: str, columns: list[str]) -> None:
    text = (files("gtrain.catalog") / f"{provider}.csv").read_text(encoding="utf-8")
    header = next(ln for ln in text.splitlines() if not ln.startswith("#"))
    assert header.split(",") == columns
    rows = _raw(provider)
    assert len(rows) > 50
    keys = set()
    for r in rows:
        where = f"{provider} {r['instance_type']} {r['region']}"
        assert int(r["vcpus"]) > 0, where
        assert float(r["memory_gib"]) > 0, where
        assert int(r["gpu_count"]) >= 1, where
        assert float(r["gpu_memory_gib"]) >= 16, where
        assert r["gpu_name"] in GPU_NAMES, where
        od, spot = float(r["price_ondemand"]), float(r["price_spot"])
        assert 0 < spot < od, where
        # a sane band: no GPU box below $0.10/GPU-h or above $20/GPU-h on demand
        assert 0.10 < od / int(r["gpu_count"]) < 20, where
        assert re.fullmatch(r"[a-z]+-[a-z]+-\d" if provider == "aws" else r"[a-z]+-[a-z]+\d+", r["region"]), where
        if provider == "aws":
            assert r["efa"] in ("true", "false"), where
            key: tuple[str, ...] = (r["instance_type"], r["region"])
        else:
            assert r["accelerator_type"] == GCP_ACCEL[r["gpu_name"]], where
            key = (r["instance_type"], r["accelerator_type"], r["gpu_count"], r["region"])
        assert key not in keys, f"duplicate row {key}"
        keys.add(key)
    # the loader reads exactly these rows
    assert len(catalog.offers(provider)) == len(rows)


def test_aws_every_required_type_and_size_present_with_its_gpus() -> None:
    by_type: dict[str, set[tuple[str, int]]] = {}
    for o in catalog.offers("aws"):
        by_type.setdefault(o.instance_type, set()).add((o.gpu_name, o.gpu_count))
    missing = set(AWS_TYPES) - set(by_type)
    assert not missing, f"missing AWS types: {sorted(missing)}"
    for t, (gpu, n) in AWS_TYPES.items():
        assert by_type[t] == {(gpu, n)}, t
    families = {t.split(".")[0] for t in by_type}
    assert {"g4dn", "g5", "g6", "g6e", "p3", "p4d", "p4de", "p5", "p5e"} <= families


def test_aws_regions() -> None:
    assert {"us-east-1", "us-west-2", "eu-west-1"} <= set(catalog.regions("aws"))
    # types offered in eu-west-1 appear there; types not offered there are left out
    eu = {o.instance_type for o in catalog.offers("aws", region="eu-west-1")}
    assert {"g4dn.xlarge", "g5.xlarge", "p3.2xlarge", "p4d.24xlarge"} <= eu
    assert not {"p4de.24xlarge", "p5.48xlarge", "g6e.xlarge"} & eu
    for t in AWS_TYPES:
        assert any(o.region == "us-east-1" or o.region == "us-east-2" for o in catalog.lookup("aws", t)), t


def test_p4d_is_8_a100_40gb_with_efa() -> None:
    found = catalog.lookup("aws", "p4d.24xlarge")
    assert {o.region for o in found} >= {"us-east-1", "us-west-2", "eu-west-1"}
    for o in found:
        assert (o.gpu_name, o.gpu_count, o.gpu_memory_gib, o.vcpus, o.efa) == ("A100", 8, 40, 96, True)
        assert o.accelerator_type is None and o.provider == "aws"
    p4de = catalog.lookup("aws", "p4de.24xlarge")[0]
    assert (p4de.gpu_name, p4de.gpu_memory_gib, p4de.efa) == ("A100-80GB", 80, True)
    assert all(o.efa for o in catalog.lookup("aws", "p5.48xlarge"))
    assert not any(o.efa for o in catalog.lookup("aws", "g5.xlarge"))
    assert not any(o.efa for o in catalog.offers("gcp"))


def test_gcp_families_and_counts_encoded_in_names() -> None:
    types = {o.instance_type for o in catalog.offers("gcp")}
    assert {f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)} | {"a2-megagpu-16g"} <= types
    assert {f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)} | {"a3-highgpu-8g"} <= types
    assert {f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96)} <= types
    for o in catalog.offers("gcp"):
        m = re.fullmatch(r"a[23]-\w+gpu-(\d+)g", o.instance_type)
        if m:
            assert o.gpu_count == int(m.group(1)), o
        if o.instance_type.startswith("a2-ultragpu"):
            assert o.gpu_name == "A100-80GB" and o.accelerator_type == "nvidia-a100-80gb"
        elif o.instance_type.startswith(("a2-highgpu", "a2-megagpu")):
            assert o.gpu_name == "A100" and o.accelerator_type == "nvidia-tesla-a100"
        elif o.instance_type.startswith("a3-highgpu"):
            assert o.gpu_name == "H100" and o.accelerator_type == "nvidia-h100-80gb"
        elif o.instance_type.startswith("g2-"):
            assert o.gpu_name == "L4"
        else:
            assert o.instance_type.startswith("n1-") and o.gpu_name in ("T4", "V100")
    n1 = {(o.gpu_name, o.gpu_count) for o in catalog.lookup("gcp", "n1-standard-8")}
    assert n1 == {("T4", 1), ("T4", 2), ("T4", 4), ("V100", 1), ("V100", 2), ("V100", 4), ("V100", 8)}
    assert {"us-central1", "europe-west4", "asia-east1"} <= set(catalog.regions("gcp"))
    assert {"us-east1", "us-east4"} & set(catalog.regions("gcp"))


def test_gcp_n1_price_is_vm_plus_gpus() -> None:
    one = catalog.resolve("gcp", "T4:1", "n1-standard-8", "us-central1", spot=False)
    two = catalog.resolve("gcp", "T4:2", "n1-standard-8", "us-central1", spot=False)
    v100 = catalog.resolve("gcp", "V100:1", "n1-standard-8", "us-central1", spot=False)
    gpu = two.price_ondemand - one.price_ondemand  # one more T4
    assert 0.2 < gpu < 0.6
    assert 0 < one.price_ondemand - gpu < 0.6  # what is left is the VM alone
    assert v100.price_ondemand > one.price_ondemand + 1


# ------------------------------------------------------------------------------------------------ queries


def test_offers_filters_and_sorting() -> None:
    everything = catalog.offers()
    assert {o.provider for o in everything} == {"aws", "gcp", "azure"}
    prices = [o.price_ondemand for o in everything]
    assert prices == sorted(prices)
    spot = catalog.offers("aws", spot=True)
    assert [o.price_spot for o in spot] == sorted(o.price_spot for o in spot)
    a100 = catalog.offers(gpu="a100")  # case-insensitive, exact: never the 80 GB part
    assert a100 and {o.gpu_name for o in a100} == {"A100"}
    assert {o.gpu_name for o in catalog.offers(gpu="A100-80gb")} == {"A100-80GB"}
    eight = catalog.offers("gcp", gpu="A100", gpu_count=8)
    assert {o.instance_type for o in eight} == {"a2-highgpu-8g"}
    assert {o.region for o in catalog.offers("gcp", region="EUROPE-WEST4")} == {"europe-west4"}
    assert catalog.offers("aws", gpu="nope") == []
    assert catalog.gpu_names("aws") == sorted(["A100", "A100-80GB", "A10G", "H100", "H200", "L4", "L40S", "T4", "V100"])
    assert set(catalog.gpu_names("gcp")) == set(GCP_ACCEL)
    assert set(catalog.gpu_names()) == GPU_NAMES | {"H100-NVL"}  # azure's NC H100 v5
    assert catalog.regions("aws") == sorted(catalog.regions("aws"))
    with pytest.raises(ConfigError) as e:
        catalog.offers("lambda-labs")
    assert e.value.field == "resources.provider" and "lambda-labs" in e.value.message


def test_lookup_and_offer() -> None:
    assert catalog.lookup("aws", "nope.xlarge") == []
    one = catalog.lookup("aws", "G5.XLARGE", region="us-west-2")
    assert len(one) == 1 and one[0].region == "us-west-2"
    o = one[0]
    assert o.price(spot=True) == o.price_spot < o.price(spot=False) == o.price_ondemand
    assert o.accelerators == "A10G:1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.region = "x"  # type: ignore[misc]


def test_resolve_picks_cheapest_fit() -> None:
    o = catalog.resolve("aws", "A100:8", None, None, spot=False)
    assert (o.instance_type, o.gpu_name, o.gpu_count, o.efa) == ("p4d.24xlarge", "A100", 8, True)
    assert o.price_ondemand == min(x.price_ondemand for x in catalog.lookup("aws", "p4d.24xlarge"))
    assert catalog.resolve("aws", "a100:8", None, None, spot=False).instance_type == "p4d.24xlarge"
    assert catalog.resolve("aws", "A100-80GB:8", None, None, spot=False).instance_type == "p4de.24xlarge"
    assert catalog.resolve("aws", "H100:8", None, None, spot=False).instance_type == "p5.48xlarge"
    assert catalog.resolve("aws", "H100", None, None, spot=False).instance_type == "p5.4xlarge"  # bare name = 1
    assert catalog.resolve("aws", "T4:1", None, None, spot=False).instance_type == "g4dn.xlarge"
    g = catalog.resolve("gcp", "H100:8", None, None, spot=False)
    assert (g.instance_type, g.accelerator_type, g.gpu_count) == ("a3-highgpu-8g", "nvidia-h100-80gb", 8)
    assert catalog.resolve("gcp", "A100:16", None, None, spot=False).instance_type == "a2-megagpu-16g"
    assert catalog.resolve("gcp", "A100-80GB:8", None, None, spot=False).instance_type == "a2-ultragpu-8g"
    # instance type alone; both given and agreeing
    only = catalog.resolve("aws", None, "p4d.24xlarge", None, spot=False)
    assert only.gpu_name == "A100" and only.gpu_count == 8
    both = catalog.resolve("gcp", "V100:4", "n1-standard-32", "europe-west4", spot=False)
    assert (both.accelerator_type, both.gpu_count, both.region) == ("nvidia-tesla-v100", 4, "europe-west4")


def test_resolve_spot_picks_by_spot_price() -> None:
    for provider, accel in [("aws", "A100:8"), ("aws", "A10G:1"), ("gcp", "T4:1"), ("gcp", "H100:8")]:
        name, count = catalog.parse_accelerators(accel)
        fits = catalog.offers(provider, gpu=name, gpu_count=count)
        on_spot = catalog.resolve(provider, accel, None, None, spot=True)
        on_demand = catalog.resolve(provider, accel, None, None, spot=False)
        assert on_spot.price_spot == min(o.price_spot for o in fits)
        assert on_demand.price_ondemand == min(o.price_ondemand for o in fits)
    # spot moves the pick: on demand the three US regions tie and the first by name wins; on spot Ohio is cheapest
    assert catalog.resolve("aws", "A100:8", None, None, spot=False).region == "us-east-1"
    assert catalog.resolve("aws", "A100:8", None, None, spot=True).region == "us-east-2"


def test_resolve_region_filter() -> None:
    o = catalog.resolve("aws", "A100:8", None, "eu-west-1", spot=False)
    assert (o.instance_type, o.region) == ("p4d.24xlarge", "eu-west-1")
    assert o.price_ondemand > catalog.resolve("aws", "A100:8", None, None, spot=False).price_ondemand
    g = catalog.resolve("gcp", "L4:1", None, "asia-east1", spot=True)
    assert g.region == "asia-east1" and g.gpu_name == "L4"
    assert g.price_spot == min(x.price_spot for x in catalog.offers("gcp", gpu="L4", gpu_count=1, region="asia-east1"))


# ------------------------------------------------------------------------------------------------ errors


def _err(*args: object) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        catalog.resolve(*args)  # type: ignore[arg-type]
    assert e.value.exit_code == 2
    return e.value


def test_error_unknown_gpu() -> None:
    e = _err("aws", "A1000:8", None, None, False)
    assert e.field == "resources.accelerators"
    assert e.message.startswith("resources.accelerators:") and "'A1000'" in e.message
    assert e.hint and "did you mean A100" in e.hint and "H100" in e.hint
    e = _err("gcp", "A10G:1", None, None, False)  # an AWS-only GPU
    assert "no gcp GPU named 'A10G'" in e.message and "L4" in (e.hint or "")


def test_error_impossible_count() -> None:
    e = _err("aws", "A100:3", None, None, False)
    assert e.field == "resources.accelerators"
    assert e.message == "resources.accelerators: no aws offer with A100:3 — A100 comes in counts 8 (p4d.24xlarge)"
    assert "A100:8" in (e.hint or "")
    e = _err("gcp", "A100:3", None, None, False)
    counts = "1 (a2-highgpu-1g), 2 (a2-highgpu-2g), 4 (a2-highgpu-4g), 8 (a2-highgpu-8g), 16 (a2-megagpu-16g)"
    assert counts in e.message
    assert e.hint is not None and "A100:2 or A100:4" in e.hint


def test_error_bad_syntax() -> None:
    for bad in ("A100:x", "A100:0", ":8", "A100:8:1"):
        e = _err("aws", bad, None, None, False)
        assert e.field == "resources.accelerators" and repr(bad) in e.message


def test_error_mismatched_instance_type_and_accelerators() -> None:
    e = _err("aws", "H100:8", "p4d.24xlarge", None, False)
    assert e.field == "resources.accelerators"
    assert "H100:8" in e.message and "p4d.24xlarge" in e.message and "A100:8" in e.message
    assert e.hint and "p5.48xlarge" in e.hint
    e = _err("gcp", "A100:8", "n1-standard-8", None, False)
    assert "T4:1" in e.message and "V100:8" in e.message and "a2-highgpu-8g" in (e.hint or "")


def test_error_unknown_instance_type() -> None:
    e = _err("aws", None, "p4d.24xlarg", None, False)
    assert e.field == "resources.instance_type" and "'p4d.24xlarg'" in e.message
    assert e.hint and "did you mean p4d.24xlarge" in e.hint


def test_error_region() -> None:
    e = _err("aws", "A100:8", None, "us-est-1", False)
    assert e.field == "resources.region" and "'us-est-1'" in e.message
    assert e.hint and "us-east-1" in e.hint
    e = _err("aws", "A100-80GB:8", None, "eu-west-1", False)  # a real region, but no p4de there
    assert e.field == "resources.region"
    assert "A100-80GB:8" in e.message and "us-east-1" in e.message and "us-west-2" in e.message
    e = _err("gcp", None, "a3-highgpu-8g", "asia-east1", False)
    assert e.field == "resources.region" and "a3-highgpu-8g" in e.message


def test_error_nothing_to_resolve_and_bad_provider() -> None:
    e = _err("aws", None, None, None, False)
    assert e.field == "resources.accelerators" and "resources.instance_type" in e.message
    e = _err("lambda", "A100:8", None, None, False)
    assert e.field == "resources.provider"


# ------------------------------------------------------------------------------------------------ override


def test_user_override_wins_and_falls_back(gtrain_home: Path) -> None:
    shipped = len(catalog.offers("aws"))
    assert catalog.override_path("aws") == gtrain_home / "catalog" / "aws.csv"
    user = gtrain_home / "catalog" / "aws.csv"
    user.parent.mkdir(parents=True)
    user.write_text(
        ",".join(AWS_COLUMNS) + "\n" + "p4d.24xlarge,96,1152,A100,8,40,true,us-east-1,1.5,0.5\n", encoding="utf-8"
    )
    got = catalog.offers("aws")
    assert len(got) == 1 and got[0].price_ondemand == 1.5
    assert catalog.resolve("aws", "A100:8", None, None, spot=False).price_ondemand == 1.5
    e = _err("aws", "T4:1", None, None, False)  # the user copy replaces the shipped file whole
    assert "no aws GPU named 'T4'" in e.message
    assert len(catalog.offers("gcp")) > 50  # other providers keep the shipped data
    user.unlink()
    assert len(catalog.offers("aws")) == shipped


def test_bad_override_says_which_file(gtrain_home: Path) -> None:
    user = gtrain_home / "catalog" / "gcp.csv"
    user.parent.mkdir(parents=True)
    user.write_text(",".join(GCP_COLUMNS) + "\na3-highgpu-8g,nvidia-h100-80gb,lots,1872,H100,8,80,x,1,1\n")
    with pytest.raises(ConfigError) as e:
        catalog.offers("gcp")
    assert e.value.field == "catalog" and str(user) in e.value.message and "row 2" in e.value.message


# ------------------------------------------------------------------------------------------------ import cost


def test_import_is_lazy(repo_root: Path) -> None:
    """Importing the catalog parses nothing and pulls in nothing heavy (how fast it is: bench/, not here)."""
    code = (
        "import sys\n"
        "import gtrain.catalog\n"
        "heavy = [m for m in ('pandas', 'numpy', 'csv', 'difflib', 'importlib.resources') if m in sys.modules]\n"
        "print('HEAVY:' + ','.join(heavy), len(gtrain.catalog._cache))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "HEAVY:", f"importing gtrain.catalog pulled in {out[0][6:]}"
    assert out[1] == "0", "the catalog was parsed at import time"
