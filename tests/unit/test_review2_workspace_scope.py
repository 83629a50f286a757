"""A workspace's names belong to one deployment (second attack review, finding 2), fast checks
beside the real-engine test (tests/integration/test_review2_deployment_workspaces.py).

The names of a run's volume, view and keeper differ between deployment scopes and are the same
within one; the unscoped names are what they always were; the scope `ringfence serve` derives is
the same for every instance on one store (a PostgreSQL URL, whatever its password) and differs
between two state directories.
"""

from __future__ import annotations

import hashlib

from ringfence_server.control.api.serve import deployment_scope
from ringfence_server.sandbox.workspace import KEEPER_PREFIX, WORKSPACE_VIEW_SUFFIX, keeper_name, view_name, volume_name


def test_names_differ_between_scopes_and_agree_within_one():
    key = "acme:run-x"
    names = {scope: (volume_name(key, scope), view_name(key, scope), keeper_name(key, scope))
             for scope in (None, "one", "two")}
    assert len({n for triple in names.values() for n in triple}) == 9
    assert volume_name(key, "one") == names["one"][0] != volume_name("acme:run-y", "one")
    volume, view, keeper = names["one"]
    assert view == volume + WORKSPACE_VIEW_SUFFIX
    assert keeper == KEEPER_PREFIX + volume.removeprefix("rf-ws-")


def test_a_scope_cannot_be_forged_by_the_run_key():
    # Were scope and key joined by a separator, ("a", "b:c") and ("a:b", "c") would share names.
    assert volume_name("b:c", "a") != volume_name("c", "a:b")
    assert volume_name("b\x00c", "a") != volume_name("c", "a\x00b")


def test_unscoped_names_are_those_of_earlier_versions():
    key = "acme:run-x"
    assert volume_name(key) == "rf-ws-" + hashlib.sha256(key.encode()).hexdigest()[:32]
    assert keeper_name(key) == KEEPER_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:32]


def test_the_served_scope_is_one_per_store():
    assert deployment_scope("/srv/a/state/events.sqlite3") != deployment_scope("/srv/b/state/events.sqlite3")
    assert deployment_scope("postgresql://rf:one@db:5432/ringfence") == deployment_scope(
        "postgresql://rf:two@db:5432/ringfence")
    assert deployment_scope("postgresql://rf@db:5432/ringfence") != deployment_scope(
        "postgresql://rf@db:5432/other")
