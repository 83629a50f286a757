"""Shared fixtures: the real Docker engine, the pinned images, and cleanup by label.

Every Docker object a test run creates carries `ringfence.test-session=<uuid>` (see
ringfence_server.sandbox.labels); the session fixture removes whatever still carries it at the end, and fails
the run if a test left something behind, so leaks are found rather than hidden.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import NoReturn

import docker.errors
import pytest
from engine_farm_fixtures import engine_farm  # noqa: F401 - the engine farm's fixture
from pg_support import own_pg_cluster, pg_cluster, pg_url  # noqa: F401 - the PostgreSQL fixtures
from store_targets import target  # noqa: F401 - a store test's `target`: each real store in turn

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox import listing

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
SESSION = os.environ.setdefault(L.TEST_SESSION_ENV, uuid.uuid4().hex[:12])
REQUIRE_DOCKER = os.environ.get("RINGFENCE_REQUIRE_DOCKER") == "1"


def _unavailable(reason: str) -> NoReturn:
    # In CI a missing engine is a failure, never a silent skip.
    if REQUIRE_DOCKER:
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skipped test is a failed one: a test CI skips is a test nobody runs, so what it
    needs (a package, a file) must be installed or shipped, not missed. A strict xfail is no
    skip: it is a known gap that turns red the day it closes."""
    report = yield
    if REQUIRE_DOCKER and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {reason}"
    return report


@pytest.fixture(scope="session")
def docker_client():
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means "no engine"
        _unavailable(f"no Docker engine answers: {e}")
    yield client
    leftovers = remove_session_objects(client)
    client.close()
    if leftovers:
        pytest.fail(f"tests left Docker objects behind (removed now): {leftovers}", pytrace=False)


def remove_session_objects(client) -> list[str]:
    """Remove every container, network and volume labelled with this test session (volumes last:
    a workspace's keeper holds its volume); return their names."""
    selector = {"label": f"{L.TEST_SESSION_LABEL}={SESSION}"}
    removed = []
    # An object gone between the listing and its removal (a test's own finalizer, a reaper) was
    # still left behind when listed: it is reported, and its absence is no error.
    for container in listing.containers(client, selector):
        removed.append(f"container {container.name}")
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
    for network in listing.networks(client, selector):
        removed.append(f"network {network.name}")
        with contextlib.suppress(docker.errors.NotFound):
            network.remove()
    for volume in listing.volumes(client, selector):
        removed.append(f"volume {volume.name}")
        with contextlib.suppress(docker.errors.NotFound):
            volume.remove(force=True)
    return removed


@pytest.fixture(scope="session")
def pinned_images(docker_client):
    """The images of images/images.lock, present with their locked IDs (`make images`)."""
    from ringfence_server.imagebuild import verify
    from ringfence_server.sandbox.pinned_images import load_lock

    lock = load_lock()
    problems = verify(docker_client, lock)
    if problems:
        _unavailable("pinned images are missing or drifted (run `make images`): " + "; ".join(map(str, problems)))
    return lock


def _verified_lock(docker_client, images_dir, what: str):
    """The lock of a user's images dir (over the built-in one), its images present with their
    locked IDs; otherwise unavailable, saying to run `make mcp-images`."""
    from ringfence_server.imagebuild import verify
    from ringfence_server.sandbox.pinned_images import lock_for

    lock = lock_for(images_dir)
    problems = verify(docker_client, lock, images_dir=images_dir)
    if problems:
        _unavailable(f"{what} are missing or drifted (run `make mcp-images`): " + "; ".join(map(str, problems)))
    return lock


@pytest.fixture(scope="session")
def mcp_images(docker_client, pinned_images):
    """The MCP servers' test images (tests/mcp_servers/images: the rogue server, over the
    built-in images)."""
    from mcp_sandbox_support import MCP_TEST_IMAGES

    return _verified_lock(docker_client, MCP_TEST_IMAGES, "the MCP test images")


@pytest.fixture(scope="session")
def example_mcp_images(docker_client, pinned_images):
    """The example servers' images (examples/mcp/images: mcp-time, mcp-fetch, mcp-git)."""
    from mcp_sandbox_support import EXAMPLE_IMAGES

    return _verified_lock(docker_client, EXAMPLE_IMAGES, "the example MCP servers' images")


@pytest.fixture(scope="session")
def backend(docker_client, pinned_images):
    from ringfence_server.sandbox.docker_backend import DockerBackend

    b = DockerBackend(docker_client, lock=pinned_images)
    yield b


@pytest.fixture(scope="session")
def gvisor_available(docker_client) -> bool:
    return "runsc" in (docker_client.info().get("Runtimes") or {})


@pytest.fixture(params=["runc", "gvisor"])
def runtime(request, gvisor_available) -> str:
    """Parametrizes a test over both runtimes; gVisor must be there in CI (`make gvisor`)."""
    if request.param == "gvisor" and not gvisor_available:
        _unavailable("the engine has no runsc runtime (run `make gvisor`)")
    return request.param


# The egress decoys and proxy: one set per test module (scope="module"), built the same way for
# every module that asks (tests/escape/test_egress.py, tests/integration/test_egress_lifecycle.py).
@pytest.fixture(scope="module")
def testbed(docker_client, pinned_images, tmp_path_factory):
    """Decoy servers on the test's own internal networks (egress_support.EgressTestbed)."""
    from egress_support import EgressTestbed

    tb = EgressTestbed(docker_client, pinned_images, str(tmp_path_factory.mktemp("egress")))
    yield tb
    tb.close()


@pytest.fixture(scope="module")
def proxy(testbed):
    """An egress proxy whose test resolver maps the testbed's decoy names."""
    return testbed.proxy()


@pytest.fixture
def ledger_backend(docker_client, pinned_images):
    """(ledger, backend): the ledger service on its own network, and a DockerBackend whose egress
    proxy may reach it as ledger.ringfence.internal (policy must still grant it to the tool)."""
    from ringfence_server.demo_services.ledger.container import Ledger
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.egress.proxy import EgressProxy, ProxySettings

    with Ledger(docker_client, lock=pinned_images) as ledger:
        settings = ProxySettings(services=ledger.services(), service_networks=(ledger.network,))
        with EgressProxy(docker_client, lock=pinned_images, settings=settings) as proxy:
            yield ledger, DockerBackend(docker_client, lock=pinned_images, egress_proxy=proxy)


@pytest.fixture
def spans():
    """The spans of the global tracer provider (the orchestration's and the API's), kept in
    memory for one test: an SDK provider is installed once per session if none is."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()
