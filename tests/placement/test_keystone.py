"""``[api] auth_strategy = keystone`` against a real Keystone, with Nova's report client
authenticating through keystoneauth as a compute node does.  Slow (Keystone is
bootstrapped from scratch): marked ``keystone``, run alone with ``-m keystone``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.keystone import Keystone, throwaway_keystone
from tests.support.services import served_placement

pytestmark = pytest.mark.keystone
DRIVER = Path(__file__).with_name("nova_keystone_client.py")


@pytest.fixture(scope="module")
def keystone(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("keystone", reason="Keystone is in the test extra: pip install -e '.[test]'")
    with throwaway_keystone(tmp_path_factory.mktemp("keystone")) as server:
        server.user_with_role("placement", "placement-secret", "service")
        server.user_with_role("nova", "nova-secret", "service")
        server.user_with_role("someone", "someone-secret", "member")
        yield server


def devtag_conf(path: Path, keystone: Keystone) -> Path:
    path.write_text(
        "[api]\nauth_strategy = keystone\n"
        "[keystone_authtoken]\n"
        f"www_authenticate_uri = {keystone.url}\nauth_url = {keystone.url}\nauth_type = password\n"
        "username = placement\npassword = placement-secret\nproject_name = admin\n"
        "user_domain_id = default\nproject_domain_id = default\n"
    )
    return path


def nova_conf(path: Path, keystone: Keystone, placement: str, user: str, password: str) -> Path:
    path.write_text(
        "[placement]\nauth_type = password\n"
        f"auth_url = {keystone.url}\nusername = {user}\npassword = {password}\nproject_name = admin\n"
        f"user_domain_id = default\nproject_domain_id = default\nendpoint_override = {placement}\n"
    )
    return path


def nova_client(conf: Path) -> dict:
    done = subprocess.run([sys.executable, str(DRIVER), str(conf)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_tokens_are_checked_by_keystone_and_roles_by_placement(keystone: Keystone, tmp_path: Path) -> None:
    conf = devtag_conf(tmp_path / "devtag.conf", keystone)
    with served_placement(tmp_path / "p.sqlite", "--auth-strategy", "keystone", config=conf) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/").status_code == 200  # the version document needs no token
            assert client.get("/resource_providers", headers={"x-auth-token": "admin"}).status_code == 401
            member = keystone.token("someone", "someone-secret", "admin")
            assert client.get("/resource_providers", headers={"x-auth-token": member}).status_code == 403
            admin = keystone.admin_token()
            assert client.get("/resource_providers", headers={"x-auth-token": admin}).status_code == 200

        # A compute node: Nova's report client, keystoneauth's password plugin, the service role.
        seen = nova_client(nova_conf(tmp_path / "nova.conf", keystone, url, "nova", "nova-secret"))
        assert seen["inventory"]["VCPU"]["total"] == 4
        refused = nova_client(nova_conf(tmp_path / "member.conf", keystone, url, "someone", "someone-secret"))
        assert "error" in refused
    log = (tmp_path / "p.sqlite.serve.log").read_text()
    assert "Keystone tokens (keystonemiddleware)" in log
