"""Who made a resource, and the cluster's SSH key pair: ed25519 made here, private key 0600 under
``$GTRAIN_HOME/keys/``, public key beside it."""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
from pathlib import Path

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


def key_path(cluster_id: str) -> Path:
    """The private key of a cluster's nodes (``.pub`` beside it)."""
    return team_key() or keys_dir() / f"{cluster_id}.ed25519"


def generate_key(path: Path) -> str:
    """A new ed25519 key: private key (OpenSSH format) at ``path`` 0600; returns the public key line."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
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


def ensure_key(cluster_id: str) -> str:
    """The cluster's public key line, making the key pair on first use."""
    path = key_path(cluster_id)
    if not path.exists():
        if team_key() is not None:
            from gtrain.errors import ConfigError

            raise ConfigError(f"GTRAIN_SSH_KEY {str(path)!r} does not exist", field="GTRAIN_SSH_KEY",
                              hint="point it at an OpenSSH private key (ssh-keygen -t ed25519 -N '' -f FILE), "
                                   "or unset it: gtrain makes a key per cluster")
        return generate_key(path)
    return public_key(path)


def drop_key(cluster_id: str) -> None:
    if team_key() is not None:
        return  # the team's key is not ours to delete
    for p in (key_path(cluster_id), key_path(cluster_id).with_suffix(".pub")):
        with contextlib.suppress(OSError):
            p.unlink()
