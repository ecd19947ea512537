"""httpconn.proxy_for: the environment's proxy as urllib reads it (any case of ``*_proxy``, ``NO_PROXY``), and
with none set, direct without consulting urllib.request at all (a sync's start-up does not import it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gtrain.sync.httpconn import proxy_for


def _clear(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.lower().endswith("_proxy"):
            monkeypatch.delenv(k)


@pytest.mark.parametrize("name", ["HTTPS_PROXY", "https_proxy", "Https_Proxy"])
def test_a_proxy_in_any_case_is_used(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    monkeypatch.setenv(name, "http://u:p%40ss@proxy.example:3128")
    host, auth = proxy_for("https", "s3.example.com")
    assert host == "proxy.example:3128" and auth == "Basic dTpwQHNz"  # base64 of "u:p@ss"
    assert proxy_for("http", "s3.example.com") == (None, None)  # only https named
    monkeypatch.setenv("NO_PROXY", "s3.example.com")
    assert proxy_for("https", "s3.example.com") == (None, None)


def test_no_proxy_in_the_environment_is_direct_without_urllib_request() -> None:
    code = ("import os, sys\n"
            "for k in list(os.environ):\n"
            "    if k.lower().endswith('_proxy'): del os.environ[k]\n"
            "from gtrain.sync.httpconn import proxy_for\n"
            "print(proxy_for('https', 's3.example.com'), 'urllib.request' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "(None, None) False", r.stderr
