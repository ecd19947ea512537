"""Azure nodes get an RSA key (issue 40). The compute API's model (2024-07-01, ``SshPublicKey.keyData``) says "at
least 2048-bit and in ssh-rsa format"; Azure's Linux docs now also list ED25519, but Azure China's still call it a
preview: RSA is what every region takes (docs/providers/azure.md, "SSH keys"). gtrain makes each azure cluster a
3072-bit RSA key (the other clouds keep ed25519), and a team key (GTRAIN_SSH_KEY) that is not RSA of 2048 bits or
more is exit 2 at the plan, one line naming it, before anything is made."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from gtrain.cli.app import main
from gtrain.providers.cloud import keys
from gtrain.signals import HANDLED


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["gtrain", *argv]
    handlers = {s: signal.getsignal(s) for s in HANDLED}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
        for s, h in handlers.items():
            signal.signal(s, h)
    return code, out.getvalue(), err.getvalue()


def _write_key(path: Path, key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> Path:
    path.write_bytes(key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()))
    return path


def test_an_azure_cluster_gets_a_3072_bit_rsa_key_and_down_drops_it(gtrain_home: Path) -> None:
    pub = keys.ensure_key("azkey01", "rsa")
    assert pub.startswith("ssh-rsa ") and keys.rsa_bits(pub) == keys.RSA_BITS == 3072
    path = keys.key_path("azkey01", "rsa")
    assert path.name == "azkey01.rsa" and oct(path.stat().st_mode & 0o777) == "0o600"
    assert keys.ensure_key("azkey01", "rsa") == pub  # made once
    assert keys.ensure_key("azkey01").startswith("ssh-ed25519 ")  # the other clouds' kind is unchanged
    keys.drop_key("azkey01")
    assert not list((gtrain_home / "keys").glob("azkey01*"))


def test_rsa_bits_reads_the_modulus() -> None:
    for bits in (1024, 2048, 4096):
        k = rsa.generate_private_key(public_exponent=65537, key_size=bits)
        line = k.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()
        assert keys.rsa_bits(line + " me@host") == bits
    assert keys.rsa_bits("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake") == 0
    assert keys.rsa_bits("ssh-rsa !!!") == 0 and keys.rsa_bits("") == 0


@pytest.mark.parametrize(("kind", "code"), [("ed25519", 2), ("rsa1024", 2), ("missing", 2), ("rsa2048", 0)])
def test_a_team_key_azure_does_not_take_is_exit_2_at_the_plan(kind: str, code: int, tmp_path: Path,
                                                               gtrain_home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    key = tmp_path / "team_key"
    if kind == "ed25519":
        _write_key(key, ed25519.Ed25519PrivateKey.generate())
    elif kind.startswith("rsa"):
        _write_key(key, rsa.generate_private_key(public_exponent=65537, key_size=int(kind[3:])))
    monkeypatch.setenv("GTRAIN_SSH_KEY", str(key))
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "demo", "provider": "azure", "resources": {"accelerators": "A100:8"}}))
    t, cpu = time.monotonic(), time.process_time()
    got, _out, err = _cli("up", "--dry-run", str(spec))
    took, cpu = time.monotonic() - t, time.process_time() - cpu
    assert got == code, err
    if code == 2:
        assert err.startswith("Error: GTRAIN_SSH_KEY ") and len(err.splitlines()) <= 2, err
        assert "Traceback" not in err and ("RSA keys of 2048 bits or more" in err or "does not exist" in err), err
    assert cpu < 1.0 and took < 10.0
    assert not gtrain_home.exists() or not any(p for p in gtrain_home.rglob("*") if p.is_file()), \
        sorted(os.listdir(gtrain_home))
