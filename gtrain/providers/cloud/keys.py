"""Who made a resource, and the cluster's SSH key pair: made here, private key 0600 under ``$GTRAIN_HOME/keys/``,
public key beside it. ed25519 by default; RSA (3072 bits) where a cloud takes only RSA in every region (Azure:
its compute API's ``SshPublicKey.keyData`` is "at least 2048-bit and in ssh-rsa format", docs/providers/azure.md)."""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
from pathlib import Path
from typing import Literal

from gtrain.state import gtrain_home


def owner() -> str:
    """``user@host`` of whoever runs gtrain, put on every resource it makes."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"[:255]


def keys_dir() -> Path:
    d = gtrain_home() / "keys"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(OSError):
        os.chmod(d, 0o700)
    return d


def team_key() -> Path | None:
    """``GTRAIN_SSH_KEY``: one private key (the team's, a CI secret) for every cluster's nodes instead of a key
    made per cluster in this home, so that another machine (shared state, ``gtrain attach``) reaches them."""
    raw = os.environ.get("GTRAIN_SSH_KEY")
    return Path(raw).expanduser() if raw else None


KeyKind = Literal["ed25519", "rsa"]
RSA_BITS = 3072  # ssh-keygen's default; Azure asks for at least 2048


def key_path(cluster_id: str, kind: KeyKind = "ed25519") -> Path:
    """The private key of a cluster's nodes (``.pub`` beside it)."""
    return team_key() or keys_dir() / f"{cluster_id}.{kind}"


def generate_key(path: Path, kind: KeyKind = "ed25519") -> str:
    """A new key: private key (OpenSSH format) at ``path`` 0600; returns the public key line."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS) if kind == "rsa" \
        else Ed25519PrivateKey.generate()
    priv = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    pub = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(priv)
    os.replace(tmp, path)
    path.with_suffix(".pub").write_text(pub + "\n")
    return pub


def public_key(path: Path) -> str:
    pub = path.with_suffix(".pub")
    if pub.exists():
        return pub.read_text().strip()
    from cryptography.hazmat.primitives import serialization as ser

    key = ser.load_ssh_private_key(path.read_bytes(), password=None)
    return key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()


def rsa_bits(pub: str) -> int:
    """The modulus size of an ``ssh-rsa`` public key line (0 for any other key type or a malformed line)."""
    import base64
    import binascii

    parts = pub.split()
    if len(parts) < 2 or parts[0] != "ssh-rsa":
        return 0
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return 0
    fields: list[bytes] = []
    i = 0
    while i + 4 <= len(blob) and len(fields) < 3:  # string "ssh-rsa", mpint e, mpint n
        n = int.from_bytes(blob[i:i + 4], "big")
        fields.append(blob[i + 4:i + 4 + n])
        i += 4 + n
    return int.from_bytes(fields[2], "big").bit_length() if len(fields) == 3 else 0


def check_team_key(kind: KeyKind = "ed25519") -> str | None:
    """``GTRAIN_SSH_KEY``'s public key line (None when unset), refused (ConfigError naming it) when the file is
    missing or, for ``kind="rsa"`` (a cloud that takes only RSA of 2048 bits or more), of another type or size.
    Cheap: a plan (`up --dry-run`) calls it, so a wrong key is exit 2 before anything is made."""
    from gtrain.errors import ConfigError

    path = team_key()
    if path is None:
        return None
    keygen = "ssh-keygen -t rsa -b 3072" if kind == "rsa" else "ssh-keygen -t ed25519"
    if not path.exists():
        raise ConfigError(f"GTRAIN_SSH_KEY {str(path)!r} does not exist", field="GTRAIN_SSH_KEY",
                          hint=f"point it at an OpenSSH private key ({keygen} -N '' -f FILE), "
                               "or unset it: gtrain makes a key per cluster")
    try:
        pub = public_key(path)
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"GTRAIN_SSH_KEY {str(path)!r} is not an OpenSSH private key ({e})",
                          field="GTRAIN_SSH_KEY", hint=f"make one with `{keygen} -N '' -f FILE`") from None
    if kind == "rsa" and rsa_bits(pub) < 2048:
        raise ConfigError(f"GTRAIN_SSH_KEY {str(path)!r} is a {pub.split()[0] if pub.split() else 'malformed'} "
                          "key; this cloud takes only RSA keys of 2048 bits or more in every region",
                          field="GTRAIN_SSH_KEY", hint=f"make one with `{keygen} -N '' -f FILE`, or unset "
                          "GTRAIN_SSH_KEY: gtrain makes an RSA key per cluster here")
    return pub


def ensure_key(cluster_id: str, kind: KeyKind = "ed25519") -> str:
    """The cluster's public key line, making the key pair on first use. ``kind="rsa"``: the cloud takes only RSA
    of 2048 bits or more (a team key of another type is refused, naming GTRAIN_SSH_KEY)."""
    team = check_team_key(kind)
    if team is not None:
        return team
    path = key_path(cluster_id, kind)
    return public_key(path) if path.exists() else generate_key(path, kind)


def drop_key(cluster_id: str) -> None:
    if team_key() is not None:
        return  # the team's key is not ours to delete
    kinds: tuple[KeyKind, ...] = ("ed25519", "rsa")
    for kind in kinds:
        for p in (key_path(cluster_id, kind), key_path(cluster_id, kind).with_suffix(".pub")):
            with contextlib.suppress(OSError):
                p.unlink()


def key_note(kind: str = "ed25519") -> tuple[str, str | None]:
    """``gtrain check``: the SSH key gtrain gives a cloud's nodes (``kind``: the key it makes per cluster), and the
    fix when it cannot (None: it can). Read-only: nothing is made."""
    team = team_key()
    if team is None:
        return f"a new {kind} key per cluster, under {gtrain_home() / 'keys'}", None
    if not team.is_file():
        return (f"GTRAIN_SSH_KEY {str(team)!r} does not exist",
                f"ssh-keygen -t {kind} -N '' -f {team}  (or unset GTRAIN_SSH_KEY)")
    return f"GTRAIN_SSH_KEY {team}", None
