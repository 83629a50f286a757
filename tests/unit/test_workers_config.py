"""`[workers]` in the control plane's config: every mistake names its key."""

from __future__ import annotations

import hashlib

import pytest

from ringfence.errors import ConfigError
from ringfence_server.control.config import load_config

DIGEST = hashlib.sha256(b"t").hexdigest()


def workers(tmp_path, **table):
    key = tmp_path / "k.pem"
    key.write_text("not read by the config")
    return load_config(overrides={"workers": {"signing_key": str(key), "tokens": {"w1": DIGEST}, **table}}).workers


def test_off_by_default_and_on_with_a_key_and_a_token(tmp_path):
    assert load_config().workers.enabled is False
    w = workers(tmp_path, enabled=True, lease_s=6, heartbeat_s=2, tenant_labels={"acme": {"pool": "a"}})
    assert (w.enabled, w.lease_s, w.heartbeat_s, dict(w.tokens)) == (True, 6.0, 2.0, {"w1": DIGEST})
    assert w.tenant_labels == {"acme": {"pool": "a"}} and w.run_here is False


@pytest.mark.parametrize(("table", "key"), [
    ({"enabled": True, "signing_key": ""}, "workers.signing_key"),
    ({"signing_key": "/nonexistent/key.pem"}, "workers.signing_key"),
    ({"enabled": True, "tokens": {}}, "workers.tokens"),
    ({"tokens": {"w1": "not-a-digest"}}, "workers.tokens.w1"),
    ({"tokens": {"bad id!": DIGEST}}, "workers.tokens.bad id!"),
    ({"lease_s": 0}, "workers.lease_s"),
    ({"lease_s": 3, "heartbeat_s": 2}, "workers.heartbeat_s"),
    ({"place_timeout_s": "soon"}, "workers.place_timeout_s"),
    ({"tenant_labels": {"acme": {"bad label!": "x"}}}, "workers.tenant_labels.acme.bad label!"),
    ({"enabled": "yes"}, "workers.enabled"),
    ({"brokers": 3}, "workers.brokers"),
])
def test_a_mistake_names_its_key(tmp_path, table, key):
    with pytest.raises(ConfigError) as e:
        workers(tmp_path, **table)
    assert e.value.key == key
