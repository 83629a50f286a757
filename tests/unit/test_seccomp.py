"""Our seccomp profile is Docker's default with io_uring, ptrace and memfd_create removed,
AF_VSOCK refused and mknod limited to files, fifos and sockets."""

import json

import pytest

from ringfence_server.sandbox import seccomp
from ringfence_server.sandbox.errors import EngineError


def allowed_names(profile):
    return {n for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args") for n in r["names"]}


def test_derived_profile_keeps_docker_default_but_removes_io_uring_and_vsock():
    with open(seccomp.source_path()) as f:
        base = json.load(f)
    derived = json.loads(seccomp.profile_json())
    assert derived["defaultAction"] == base["defaultAction"] == "SCMP_ACT_ERRNO"
    removed = allowed_names(base) - allowed_names(derived)
    assert removed == {"io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace", "socket",
                       "memfd_create", "mknod", "mknodat", *seccomp.MQ_SYSCALLS}
    socket_rules = [r for r in derived["syscalls"] if "socket" in r["names"]]
    assert socket_rules == [
        {
            "names": ["socket"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": seccomp.AF_VSOCK, "op": "SCMP_CMP_NE"}],
            "comment": "ringfence: every address family but AF_VSOCK",
        }
    ]
    assert not any("io_uring" in n for r in derived["syscalls"] for n in r["names"])


def test_a_profile_without_the_expected_socket_rule_is_refused():
    with pytest.raises(EngineError):
        seccomp.derive({"defaultAction": "SCMP_ACT_ERRNO",
                        "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]})


def test_missing_source_gives_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(seccomp.SOURCE_ENV, str(tmp_path / "nope.json"))
    seccomp.profile_json.cache_clear()
    try:
        with pytest.raises(EngineError, match=r"nope\.json"):
            seccomp.profile_json()
    finally:
        monkeypatch.delenv(seccomp.SOURCE_ENV)
        seccomp.profile_json.cache_clear()


def test_gvisor_variant_lets_clone3_reach_the_sentry_and_changes_nothing_else():
    runc = json.loads(seccomp.profile_json("runc"))
    gvisor = json.loads(seccomp.profile_json("gvisor"))
    assert [r for r in runc["syscalls"] if r["names"] == ["clone3"] and r["action"] == "SCMP_ACT_ERRNO"]
    assert not [r for r in gvisor["syscalls"] if "clone3" in r["names"] and r["action"] != "SCMP_ACT_ALLOW"]
    unconditional = [r for r in gvisor["syscalls"] if r["names"] == ["clone3"] and not r.get("includes")]
    assert unconditional == [{"names": ["clone3"], "action": "SCMP_ACT_ALLOW", "comment": unconditional[0]["comment"]}]
    assert len(gvisor["syscalls"]) == len(runc["syscalls"]) - 1  # two ERRNO rules (x86, mips) become one ALLOW
    assert not any(n in allowed_names(gvisor) for n in ("ptrace", "io_uring_setup", "socket", "memfd_create"))


def test_mknod_only_for_files_fifos_and_sockets():
    """One conditional rule per allowed type; a char (0o020000) or block (0o060000) device
    matches none of them, so the default action (EPERM) answers."""
    derived = json.loads(seccomp.profile_json())
    for name, index in (("mknod", 1), ("mknodat", 2)):
        rules = [r for r in derived["syscalls"] if name in r["names"]]
        assert all(r["names"] == [name] and r["action"] == "SCMP_ACT_ALLOW" for r in rules)
        allowed = sorted(r["args"][0]["valueTwo"] for r in rules)
        assert allowed == [0, 0o010000, 0o100000, 0o140000]
        assert all(r["args"] == [{"index": index, "value": 0o170000, "valueTwo": r["args"][0]["valueTwo"],
                                  "op": "SCMP_CMP_MASKED_EQ"}] for r in rules)
        for device in (0o020000, 0o060000):
            assert not any(device & r["args"][0]["value"] == r["args"][0]["valueTwo"] for r in rules)


@pytest.fixture
def real_profile() -> bytes:
    """Docker's default profile as this host has it (read before `sources` moves the paths)."""
    return seccomp.source_path().read_bytes()


@pytest.fixture
def sources(monkeypatch, tmp_path, real_profile):
    """The three candidate paths pointed at tmp (absent until a test writes them), no override
    (after real_profile has read the real file)."""
    monkeypatch.delenv(seccomp.SOURCE_ENV, raising=False)
    paths = {name: tmp_path / name / "default.json" for name in ("SYSTEM_SOURCE", "SHIPPED_SOURCE", "CHECKOUT_SOURCE")}
    for name, path in paths.items():
        monkeypatch.setattr(seccomp, name, path)
    seccomp.profile_json.cache_clear()
    yield paths
    seccomp.profile_json.cache_clear()


def _place(path, real):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(real)


def test_an_install_without_the_debian_package_or_a_checkout_derives_from_the_shipped_copy(real_profile, sources):
    """What an installed server has: only the copy its wheel carries next to seccomp.py."""
    _place(sources["SHIPPED_SOURCE"], real_profile)
    assert seccomp.source_path() == sources["SHIPPED_SOURCE"]
    assert json.loads(seccomp.profile_json())["defaultAction"] == "SCMP_ACT_ERRNO"
    # The Debian package's file wins when it is installed (it follows Debian's updates); the
    # shipped copy wins over a checkout's build/ copy.
    _place(sources["CHECKOUT_SOURCE"], real_profile)
    assert seccomp.source_path() == sources["SHIPPED_SOURCE"]
    _place(sources["SYSTEM_SOURCE"], real_profile)
    assert seccomp.source_path() == sources["SYSTEM_SOURCE"]


def test_a_checkout_without_build_seccomp_is_told_where_the_profile_comes_from(sources):
    with pytest.raises(EngineError) as raised:
        seccomp.source_path()
    message = str(raised.value)
    for path in sources.values():
        assert str(path) in message
    assert seccomp.DEBIAN_PACKAGE in message and seccomp.SOURCE_ENV in message
    assert "bash scripts/ensure-packages.sh" in message and "ringfence-server wheel" in message
