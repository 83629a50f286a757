"""Second attack review, finding 5: a tool whose result holds NaN or Infinity (Python's json
writes them; they are not JSON, and the event store refuses them) fails its call `fatal`, as
docs/TOOLS.md says of a result that is not JSON-able; the run goes on.

Real parts: a tool package (`[tools] packages`) whose code returns such a number, in an image
built FROM the pinned tool image with that code laid in /opt/ringfence/tools and pinned by
`images adopt` in the test's own images dir; the real server on a loopback port, the
Orchestrator, a SQLite file, the Docker backend. The image carries this session's labels and
is removed at the end.
"""

from __future__ import annotations

import json

import pytest
from image_support import TEST_LABELS, remove_image
from review2_support import AGENT, served

from ringfence import Client
from ringfence.model import ObservationStatus as S
from ringfence.model import RunOutcome
from ringfence_server.imagebuild.adopt import adopt
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.pinned_images import lock_for

pytestmark = pytest.mark.docker

TOOL = "odd_number"
IMAGE = "odd-number"
CODE = '''"""odd_number: returns the float its argument names ("nan", "inf", "-inf", "1e999" or "2.5")."""


def run(arguments, context):
    return {"value": float(arguments["value"])}
'''
MANIFEST = {
    "name": TOOL, "description": "Return a float named by its argument.", "image": IMAGE,
    "schema": {"type": "object", "properties": {"value": {"type": "string", "maxLength": 8}},
               "required": ["value"], "additionalProperties": False},
    "mutates": False, "reversible": True, "cost": 0.01,
}
RULES = [{"tool": TOOL, "verdict": "allow"}, {"tool": "echo", "verdict": "allow"}]


@pytest.fixture(scope="module")
def odd_tool(docker_client, pinned_images, tmp_path_factory):
    """(images dir, tools dir): the tool's package and its image, adopted under IMAGE."""
    root = tmp_path_factory.mktemp("odd-tool")
    package = root / "tools" / TOOL
    package.mkdir(parents=True)
    (package / "manifest.json").write_text(json.dumps(MANIFEST))
    (package / f"{TOOL}.py").write_text(CODE)
    context = root / "context"
    context.mkdir()
    (context / f"{TOOL}.py").write_text(CODE)
    (context / "Dockerfile").write_text(
        f"FROM {pinned_images.image_id('tool')}\nCOPY {TOOL}.py /opt/ringfence/tools/{TOOL}.py\n")
    image, _logs = docker_client.images.build(path=str(context), labels=TEST_LABELS, rm=True, forcerm=True)
    try:
        images = root / "images"
        images.mkdir()
        inspection, written = adopt(docker_client, IMAGE, image.id, tool=True, images_dir=images)
        assert written is not None, inspection
        yield images, root / "tools"
    finally:
        remove_image(docker_client, image.id)


def test_a_result_holding_nan_or_infinity_fails_its_call_fatal_and_the_run_goes_on(
        tmp_path, docker_client, odd_tool):
    images, tools = odd_tool
    backend = DockerBackend(docker_client, lock=lock_for(images))
    with served(tmp_path, backend, rules=RULES, tools={"packages": [str(tools)]},
                images={"dir": str(images)}) as stack, Client(stack.address, AGENT) as agent:
        run = agent.start_run("read numbers the tool cannot write as JSON", "odd-numbers")
        observed = agent.submit_batch(run.run_id, [
            {"call_id": f"c-{v}", "tool": TOOL, "arguments": {"value": v}} for v in ("nan", "inf", "-inf", "2.5")])
        by_id = {o.call_id: o for o in observed}
        for value, constant in (("nan", "NaN"), ("inf", "Infinity"), ("-inf", "-Infinity")):
            obs = by_id[f"c-{value}"]
            assert (obs.status, obs.executed, obs.error_class, obs.attempts) == (S.EXECUTED, True, "fatal", 1), obs
            assert obs.content is None
            assert obs.error == (f"tool output is not the runner protocol: {constant} is not a JSON number (the "
                                 "runner's document must hold finite numbers only)"), obs.error
        assert by_id["c-2.5"].content == {"value": 2.5} and by_id["c-2.5"].error is None

        # The run goes on: its next batch runs, and it finishes completed.
        [echo] = agent.submit_batch(run.run_id, [{"call_id": "next", "tool": "echo", "arguments": {"text": "on"}}])
        assert (echo.status, echo.content) == (S.EXECUTED, {"text": "on"})
        assert agent.finish_run(run.run_id).outcome is RunOutcome.COMPLETED

        calls = stack.of_call("odd-numbers", "c-nan")
        assert [t for t, _ in calls] == ["call_decided", "dispatch_started", "attempt", "call_completed",
                                         "observation"]
        [attempt] = [d for t, d in calls if t == "attempt"]
        assert (attempt["failure_class"], attempt["outcome"]) == ("fatal", "ok")
        [completed] = [d for t, d in calls if t == "call_completed"]
        assert (completed["ok"], completed["content"], completed["error_class"]) == (False, None, "fatal")
        log = stack.events("odd-numbers")
        assert [e.type for e in log][-2:] == ["observation", "run_finished"]
        assert log[-1].data["outcome"] == "completed"
