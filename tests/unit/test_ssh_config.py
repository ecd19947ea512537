"""SSH config text, ProxyCommand expansion and host key pinning (no network)."""

from __future__ import annotations

import base64
import stat
import subprocess
from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.remote import ssh
from gtrain.remote.ssh import SSHTarget


def _ed25519_line() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pub = Ed25519PrivateKey.generate().public_key()
    return pub.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def test_ssh_config_block_direct() -> None:
    t = SSHTarget("10.0.0.5", 2222, "ubuntu", "/keys/id_ed25519")
    text = ssh.ssh_config_block("gt-c-0", t, "/home/u/.gtrain/ssh/known_hosts")
    lines = [ln.strip() for ln in text.splitlines()]
    assert lines[0] == "Host gt-c-0"
    for want in ("HostName 10.0.0.5", "Port 2222", "User ubuntu", "IdentityFile /keys/id_ed25519",
                 "IdentitiesOnly yes", "UserKnownHostsFile /home/u/.gtrain/ssh/known_hosts",
                 "StrictHostKeyChecking yes", "GlobalKnownHostsFile /dev/null"):
        assert want in lines
    assert not any(ln.startswith(("ProxyJump", "ProxyCommand")) for ln in lines)
    assert text.endswith("\n")


def test_ssh_config_block_proxies_and_spaces() -> None:
    t = SSHTarget("10.0.0.6", user="root", proxy_jump="admin@bastion.example:2200")
    text = ssh.ssh_config_block("n1", t, "/path with space/known_hosts")
    assert "  ProxyJump admin@bastion.example:2200\n" in text
    assert '  UserKnownHostsFile "/path with space/known_hosts"\n' in text
    assert "IdentityFile" not in text
    t2 = SSHTarget("10.0.0.7", proxy_command="nc -X connect -x proxy:3128 %h %p")
    text2 = ssh.ssh_config_block("n2", t2, "/kh")
    # OpenSSH expands the tokens itself: the block keeps them
    assert "  ProxyCommand nc -X connect -x proxy:3128 %h %p\n" in text2


def test_ssh_config_block_parses_with_openssh(tmp_path: Path) -> None:
    t = SSHTarget("10.0.0.5", 2222, "ubuntu", str(tmp_path / "id"), proxy_jump="jump:2201")
    cfg = tmp_path / "config"
    cfg.write_text(ssh.ssh_config_block("gt-node", t, tmp_path / "known_hosts"))
    out = subprocess.run(["ssh", "-G", "-F", str(cfg), "gt-node"], capture_output=True, text=True, check=True).stdout
    got = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert got["hostname"] == "10.0.0.5"
    assert got["port"] == "2222"
    assert got["user"] == "ubuntu"
    assert got["stricthostkeychecking"] in ("true", "yes")
    assert got["userknownhostsfile"] == str(tmp_path / "known_hosts")
    assert got["proxyjump"] == "jump:2201"


def test_expand_proxy_command() -> None:
    cmd = ssh.expand_proxy_command("ssh -W %h:%p -l %r bastion # 100%%", "10.1.2.3", 2222, "alice")
    assert cmd == "ssh -W 10.1.2.3:2222 -l alice bastion # 100%"
    with pytest.raises(ConfigError, match="%x"):
        ssh.expand_proxy_command("connect %x", "h", 22, "u")


@pytest.mark.parametrize(("spec", "want"), [
    ("bastion", ("me", "bastion", 22)),
    ("ops@bastion:2200", ("ops", "bastion", 2200)),
    ("ops@[fd00::1]:2200", ("ops", "fd00::1", 2200)),
    ("fd00::1", ("me", "fd00::1", 22)),
])
def test_parse_jump(spec: str, want: tuple[str, str, int]) -> None:
    assert ssh.parse_jump(spec, "me") == want


@pytest.mark.parametrize("spec", ["a,b", "host:notaport", "host:0", "@host"])
def test_parse_jump_rejects(spec: str) -> None:
    with pytest.raises(ConfigError):
        ssh.parse_jump(spec, "me")


def test_jump_target_inherits_identity() -> None:
    t = SSHTarget("10.0.0.9", 22, "root", "/k", proxy_jump="ops@b:2200")
    assert t.jump_target() == SSHTarget("b", 2200, "ops", "/k")
    assert SSHTarget("x").jump_target() is None


def test_pin_forget_and_file_modes(gtrain_home: Path) -> None:
    k1, k2 = _ed25519_line(), _ed25519_line()
    ssh.pin_host_key("10.0.0.5", 22, k1 + " comment@x")
    ssh.pin_host_key("10.0.0.5", 2222, k2)
    kh = gtrain_home / "ssh" / "known_hosts"
    assert stat.S_IMODE(kh.stat().st_mode) == 0o600
    assert stat.S_IMODE((gtrain_home / "ssh").stat().st_mode) == 0o700
    lines = kh.read_text().splitlines()
    assert lines == [f"10.0.0.5 {k1}", f"[10.0.0.5]:2222 {k2}"]
    assert ssh.pinned_keys("10.0.0.5", 22) == [tuple(k1.split())]
    # re-pinning the same key type replaces the old key; a full known_hosts line is accepted too
    ssh.pin_host_key("10.0.0.5", 22, f"10.0.0.5 {k2}")
    assert ssh.pinned_keys("10.0.0.5", 22) == [tuple(k2.split())]
    assert ssh.forget_host("10.0.0.5", 2222) == 1
    assert ssh.pinned_keys("10.0.0.5", 2222) == []
    assert ssh.pinned_keys("10.0.0.5", 22) == [tuple(k2.split())]
    assert ssh.forget_host("10.9.9.9", 22) == 0
    assert stat.S_IMODE(kh.stat().st_mode) == 0o600


def test_pinned_file_is_read_by_openssh(gtrain_home: Path) -> None:
    k = _ed25519_line()
    ssh.pin_host_key("10.0.0.5", 2222, k)
    kh = str(gtrain_home / "ssh" / "known_hosts")
    r = subprocess.run(["ssh-keygen", "-F", "[10.0.0.5]:2222", "-f", kh], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and k.split()[1] in r.stdout


def test_pin_rejects_garbage() -> None:
    with pytest.raises(ConfigError):
        ssh.pin_host_key("h", 22, "ssh-ed25519 notbase64!!")
    with pytest.raises(ConfigError):
        ssh.pin_host_key("h", 22, "ssh-ed25519 " + base64.b64encode(b"junk").decode())
    with pytest.raises(ConfigError):
        ssh.pin_host_key("h", 22, "")


def test_fingerprint_matches_ssh_keygen(tmp_path: Path) -> None:
    k = _ed25519_line()
    (tmp_path / "k.pub").write_text(k + "\n")
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(tmp_path / "k.pub")], capture_output=True,
                         text=True, check=True).stdout
    assert ssh.fingerprint_sha256(k.split()[1]) == out.split()[1]


def test_policy_tofu_records_and_reports(gtrain_home: Path) -> None:
    from paramiko import PKey

    k = _ed25519_line()
    key = PKey.from_type_string(k.split()[0], base64.b64decode(k.split()[1]))
    seen: list[tuple[str, int, str, str]] = []
    ssh._policy(True, lambda *a: seen.append(a), 2222).missing_host_key(None, "[10.0.0.8]:2222", key)
    assert seen == [("10.0.0.8", 2222, "ssh-ed25519", ssh.fingerprint_sha256(k.split()[1]))]
    assert ssh.pinned_keys("10.0.0.8", 2222) == [tuple(k.split())]
    with pytest.raises(ssh._Refused, match="not known"):
        ssh._policy(False, None, 22).missing_host_key(None, "10.0.0.9", key)
    assert ssh.pinned_keys("10.0.0.9", 22) == []



def test_host_key_keys_split_host_and_port() -> None:
    from gtrain.providers.ssh import split_host_port

    assert split_host_port("10.0.0.5", 22) == ("10.0.0.5", 22)
    assert split_host_port("10.0.0.6:2222", 22) == ("10.0.0.6", 2222)
    assert split_host_port("fd00::7", 22) == ("fd00::7", 22)
    assert split_host_port("[fd00::7]:2200", 22) == ("fd00::7", 2200)
    assert split_host_port("[fd00::7]", 2022) == ("fd00::7", 2022)
    assert split_host_port("gpu3", 2022) == ("gpu3", 2022)
