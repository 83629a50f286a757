"""Escape battery, Posture 1-4: identity, capabilities, no_new_privs/seccomp, setuid binaries.

Every attack runs inside the real sandbox (DockerBackend, pinned `tool` image, default
profile) through the `attack` fixture; every red check removes exactly the protection its case
covers with `weakened(...)` and shows the same probe then succeeds. Probes live in probes/.

Red checks run under runc only: each removes an engine or host-kernel protection (a
capability, the seccomp profile, a namespace, a mount flag) that gVisor does not rely on in
the same way (its sentry is the boundary), so under gVisor they would prove nothing about our
settings. The green tests run under both runtimes.
"""

from __future__ import annotations

import os
import shutil

import probes
import pytest
from weaken import without_security_opt

from ringfence_server.sandbox.profile import InputMount

pytestmark = pytest.mark.docker

SANDBOX_UID = 10001
# CAP_NET_RAW, CAP_SETUID, CAP_CHOWN: part of Docker's default set, gone with cap_drop=ALL.
CAP_CHOWN, CAP_SETUID, CAP_NET_RAW = 0, 7, 13



# ---- case 1: uid is not 0 ------------------------------------------------------------------


def test_case_01_not_root(attack, runtime):
    p = probes.report(attack(probes.argv("identity"), runtime=runtime))
    assert (p["uid"], p["euid"], p["gid"], p["egid"]) == (SANDBOX_UID,) * 4
    assert p["groups"] == [SANDBOX_UID]
    assert p["id_u"] == str(SANDBOX_UID)
    assert p["status"]["Uid"].split() == [str(SANDBOX_UID)] * 4


def test_case_01_red_as_root(weakened):
    """With `user` set to 0:0 (the only change), `id -u` says 0."""
    p = probes.report(weakened(lambda s: {**s, "user": "0:0"})(probes.argv("identity")))
    assert (p["uid"], p["euid"], p["id_u"]) == (0, 0, "0")


# ---- case 2: all five capability sets are zero ------------------------------------------------


def test_case_02_no_capabilities(attack, runtime):
    p = probes.report(attack(probes.argv("identity"), runtime=runtime))
    # capget(2) and prctl(2) ask the kernel (or gVisor) directly, whatever /proc shows.
    assert p["capget"] == {"effective": 0, "inheritable": 0, "permitted": 0}
    assert p["bounding"] == []
    assert p["ambient"] == []
    status = p["status"]
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd"):
        assert int(status[field], 16) == 0, field
    if runtime == "runc":
        assert int(status["CapAmb"], 16) == 0
    else:
        # gVisor's /proc/self/status has no CapAmb line; the prctl query above covers it.
        assert status["CapAmb"] is None


def test_case_02_red_without_cap_drop(weakened):
    """Without cap_drop=ALL the bounding set is Docker's default set again (CapEff stays 0 only
    because the uid is not 0: a setuid-root binary could then pick these up)."""
    p = probes.report(weakened(lambda s: {k: v for k, v in s.items() if k != "cap_drop"})(probes.argv("identity")))
    assert {CAP_CHOWN, CAP_SETUID, CAP_NET_RAW} <= set(p["bounding"])
    assert int(p["status"]["CapBnd"], 16) != 0


# ---- case 3: NoNewPrivs 1 and Seccomp 2 -------------------------------------------------------


def test_case_03_no_new_privs(attack, runtime):
    p = probes.report(attack(probes.argv("identity"), runtime=runtime))
    assert p["no_new_privs"] == 1
    if runtime == "runc":
        assert p["status"]["NoNewPrivs"] == "1"


def test_case_03_red_without_no_new_privileges(weakened):
    p = probes.report(weakened(without_security_opt("no-new-privileges"))(probes.argv("identity")))
    assert p["no_new_privs"] == 0
    assert p["status"]["NoNewPrivs"] == "0"


def test_case_03_seccomp_filter(attack, runtime):
    p = probes.report(attack(probes.argv("identity"), runtime=runtime))
    assert p["seccomp_mode"]["ret"] == 2  # SECCOMP_MODE_FILTER
    assert p["status"]["Seccomp"] == "2"


def test_case_03_red_seccomp_unconfined(weakened):
    p = probes.report(weakened(without_security_opt("seccomp"))(probes.argv("identity")))
    assert p["seccomp_mode"]["ret"] == 0
    assert p["status"]["Seccomp"] == "0"


# ---- case 4: setuid binaries do not raise euid ------------------------------------------------


@pytest.fixture
def setuid_input(tmp_path):
    """A declared read-only input holding a setuid+setgid root copy of `id` (it prints the
    effective ids). The image itself ships no setuid file; this one is planted so the test can
    show what running one does. Docker bind mounts are not nosuid, so only no_new_privs stops it."""
    os.chmod(tmp_path, 0o755)
    target = tmp_path / "id"
    shutil.copy2("/usr/bin/id", target)
    os.chown(target, 0, 0)
    os.chmod(target, 0o6755)
    return (InputMount(str(tmp_path), "/inputs"),)


def test_case_04_setuid_does_not_raise_euid(attack, runtime, setuid_input):
    p = probes.report(attack(probes.argv("setuid", "/inputs/id"), runtime=runtime, inputs=setuid_input))
    # The walk finds exactly the planted file: the image itself has no setuid/setgid file.
    assert p["setuid_files"] == ["/inputs/id"]
    ran = p["ran"]["/inputs/id"]
    assert ran["mode"] == "0o6755" and ran["owner"] == [0, 0]
    assert (ran["euid"]["rc"], ran["euid"]["out"].strip()) == (0, str(SANDBOX_UID))
    assert (ran["egid"]["rc"], ran["egid"]["out"].strip()) == (0, str(SANDBOX_UID))


def test_case_04_red_without_no_new_privileges(weakened, setuid_input):
    """Without no-new-privileges the same setuid file runs with euid 0 and egid 0.

    runc only: gVisor does not honour setuid bits on its gofer-backed bind mounts even then,
    so the red check cannot be shown there (the green test still runs under gVisor)."""
    run = weakened(without_security_opt("no-new-privileges"))
    p = probes.report(run(probes.argv("setuid", "/inputs/id"), inputs=setuid_input))
    ran = p["ran"]["/inputs/id"]
    assert (ran["euid"]["out"].strip(), ran["egid"]["out"].strip()) == ("0", "0")
