"""SandboxProfile refuses every setting that would weaken the sandbox or is out of range."""

import dataclasses

import pytest

from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.errors import ProfileError
from ringfence_server.sandbox.profile import GiB, InputMount, MiB, SandboxProfile


def test_defaults_are_valid_and_non_root():
    profile = SandboxProfile()
    assert profile.uid == 10001 and profile.gid == 10001
    assert profile.user == "10001:10001"


@pytest.mark.parametrize(
    "field, value",
    [
        ("uid", 0),
        ("gid", 0),
        ("uid", -1),
        ("memory_bytes", 1),
        ("memory_bytes", 64 * GiB),
        ("cpus", 0),
        ("cpus", 64),
        ("pids", 0),
        ("pids", 1_000_000),
        ("timeout_s", 0),
        ("timeout_s", 86400),
        ("stdout_limit", 0),
        ("tmpfs_bytes", 10 * GiB),
        ("nofile", 1),
        ("fsize_bytes", 0),
        ("runtime", "runc-unconfined"),
        ("runtime", "host"),
        ("image", "../etc"),
        ("image", "sha256:abc"),
        ("uid", True),
    ],
)
def test_out_of_range_or_weakening_values_are_refused(field, value):
    with pytest.raises(ProfileError) as info:
        SandboxProfile(**{field: value})
    assert info.value.field == field


@pytest.mark.parametrize(
    "workdir",
    ["/proc/self/fd/7", "/proc", "/sys/fs/cgroup", "/dev/shm", "relative", "/tmp/../proc/1"],
)
def test_workdir_under_proc_sys_dev_or_not_normal_is_refused(workdir):
    # CVE-2024-21626: a workdir under /proc/self/fd leaks a host directory fd into the container.
    with pytest.raises(ProfileError) as info:
        SandboxProfile(workdir=workdir)
    assert info.value.field == "workdir"


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "1BAD", "A=B"])
def test_env_refuses_loader_variables_and_bad_names(name):
    with pytest.raises(ProfileError):
        SandboxProfile(env={name: "x"})


def test_env_is_copied_so_the_caller_cannot_mutate_a_validated_profile():
    env = {"A": "1"}
    profile = SandboxProfile(env=env)
    env["LD_PRELOAD"] = "/tmp/evil.so"
    assert "LD_PRELOAD" not in profile.env


def test_profile_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SandboxProfile().uid = 0  # type: ignore[misc]


def test_there_is_no_field_to_switch_hardening_off():
    names = {f.name for f in dataclasses.fields(SandboxProfile)}
    for forbidden in ("privileged", "read_only", "cap_add", "network_mode", "seccomp", "user", "security_opt"):
        assert forbidden not in names


@pytest.mark.parametrize("target", ["/tmp", "/proc/x", "relative", "/"])
def test_input_mounts_cannot_shadow_reserved_paths(target):
    with pytest.raises(ProfileError):
        InputMount("/srv/in", target)


def test_input_mount_host_path_must_be_absolute():
    with pytest.raises(ProfileError):
        InputMount("srv/in", "/input")


def test_request_validates_ids_argv_and_stdin_cap():
    with pytest.raises(ProfileError):
        SandboxRequest(argv=("a\0b",))
    with pytest.raises(ProfileError):
        SandboxRequest(run_id="../../etc")
    with pytest.raises(ProfileError):
        SandboxRequest(stdin=b"x" * (4 * MiB + 1))
    assert SandboxRequest(argv=["id"]).argv == ("id",)
