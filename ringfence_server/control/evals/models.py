"""`ringfence eval SUITE --model PROVIDER:URL`: every case of the suite run a second time by a real
language model, beside its ScriptedModel, on the same stack, and the two compared paired by case.

    openai:URL      OpenAIChatModel on URL (OpenAI, vLLM, llama.cpp's server, Ollama, a proxy); the
                    key from OPENAI_API_KEY when it is set, none otherwise (a local server)
    anthropic:URL   AnthropicMessagesModel on URL; the key from ANTHROPIC_API_KEY, which must be set
    --model-name N  the model to ask for; for openai: default, the one model the server lists at
                    URL/models (a local server serves one); for anthropic: required

How a case is run by the real model (directed): everything is the case's own (its loop options,
approver, expectations and effects) but the model and the goal:

- the goal is the case's, followed by the script's turns as directions ("turn 1: call read_file
  with {"path": ...}", "turn 2: answer from the results"): the model is asked to do what the
  scripted agent does, and the comparison says where it did not;
- tool_choice on a turn where the script calls exactly one tool is that tool (the model writes the
  arguments); "auto" on every other turn (a parallel turn, an answer, past the script). A small
  model left to choose tends to answer at once, and then nothing is compared;
- the script is still asked for each turn and its answer discarded: what it does to the world on
  that turn (the kill switch of the `cancelled` case) happens in both runs; temperature 0.

Classification of a case whose two runs differ in behaviour (their semantic records differ, or one
passed and the other failed), from the first run of each; the first rule that holds:

    infrastructure  a run raised instead of ending, or ended `error`: the provider unreachable or
                    its retries spent (ModelUnavailable), a refusal (ModelRequestRefused: its reason
                    names the HTTP status), a server fault
    adapter         the model's run holds what the adapter turned a bad response into: an `invalid`
                    observation (arguments that were not a JSON object: ToolCall.malformed), or a
                    response cut by the length limit (model_truncated)
    policy          one proposal (the same tool and canonical arguments) was proposed in both runs
                    and given a different status: the control plane judged the same call twice
                    and disagreed with itself
    model           anything else: the model proposed other calls (another path, another amount),
                    fewer or more turns, or answered differently
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ringfence.agent import AgentContext, ModelClient, ModelTurn, ScriptedModel, ScriptExhausted, ToolCall
from ringfence.model import ObservationStatus, RunOutcome
from ringfence.turns import canonical_json
from ringfence_server.control.evals.compare import Comparison, compare, summarize
from ringfence_server.control.evals.scoring import Case

if TYPE_CHECKING:
    from ringfence_server.control.evals.runner import CaseRun

__all__ = [
    "ADAPTER",
    "CLASSES",
    "INFRASTRUCTURE",
    "MODEL",
    "POLICY",
    "Directed",
    "ModelComparison",
    "ModelSpec",
    "ModelSpecError",
    "classify",
    "directed",
    "directions",
    "model_comparison",
]

INFRASTRUCTURE, ADAPTER, POLICY, MODEL = "infrastructure", "adapter", "policy", "model"
CLASSES = (INFRASTRUCTURE, ADAPTER, POLICY, MODEL)
PROVIDERS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
MAX_OUTPUT_TOKENS = 1024


class ModelSpecError(ValueError):
    """--model (or --model-name) cannot be used as given: a usage error (exit 2)."""


@dataclass(frozen=True)
class ModelSpec:
    """A real model to run the cases with: provider, base URL, model name, key variable."""

    provider: str
    url: str
    name: str
    key_env: str | None
    """The environment variable the key is read from; None: no key (a local server)."""

    @classmethod
    def parse(cls, spec: str, name: str | None = None, env: dict[str, str] | None = None,
              list_models: Callable[[str], list[str]] | None = None) -> ModelSpec:
        """`spec` is PROVIDER:URL (module docstring). `env` is os.environ; `list_models(url)` asks
        an OpenAI-compatible server for its models (only when `name` is None)."""
        environ = os.environ if env is None else env
        provider, sep, url = spec.partition(":")
        if not sep or provider not in PROVIDERS:
            raise ModelSpecError(f"--model takes PROVIDER:URL with PROVIDER one of {', '.join(PROVIDERS)} "
                                 f"(e.g. openai:http://127.0.0.1:8080/v1); got {spec!r}")
        if not url.startswith(("http://", "https://")):
            raise ModelSpecError(f"--model {provider}:URL needs an http(s) URL; got {url!r}")
        variable = PROVIDERS[provider]
        key_env: str | None = variable
        if provider == "anthropic":
            if not environ.get(variable):
                raise ModelSpecError(f"--model anthropic:URL reads its API key from {variable}, which is not set")
            if not name:
                raise ModelSpecError("--model anthropic:URL needs --model-name (e.g. claude-sonnet-4-5)")
        elif not environ.get(variable):
            key_env = None  # a server that takes no key: a local one
        if not name:
            found = (list_models or served_models)(url)
            if len(found) != 1:
                raise ModelSpecError(f"{url}/models lists {len(found)} model(s) ({', '.join(found[:5]) or 'none'}): "
                                     "name the one to use with --model-name")
            name = found[0]
        return cls(provider, url, name, key_env)

    def label(self) -> str:
        return f"{self.provider}:{self.name}"

    def client(self, tool_choice: str) -> ModelClient:
        """A fresh adapter asking with `tool_choice` ("auto" or a tool's name), temperature 0."""
        if self.provider == "anthropic":
            from ringfence.models.anthropic import AnthropicMessagesModel

            return AnthropicMessagesModel(self.name, base_url=self.url,
                                          api_key_env=self.key_env or PROVIDERS["anthropic"],
                                          max_output_tokens=MAX_OUTPUT_TOKENS, temperature=0.0, tool_choice=tool_choice)
        from ringfence.models.openai import OpenAIChatModel

        return OpenAIChatModel(self.name, base_url=self.url, api_key_env=self.key_env,
                               max_output_tokens=MAX_OUTPUT_TOKENS, temperature=0.0, tool_choice=tool_choice)


def served_models(url: str) -> list[str]:
    """The model ids an OpenAI-compatible server lists at URL/models (no key: a local server)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=30) as answer:
            doc = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ModelSpecError(f"cannot list the models at {url}/models ({e}): name one with --model-name") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m] if isinstance(data, list) else []


# -- a case, directed at a real model ---------------------------------------------------------------


def _step(item: Any) -> tuple[str, str | None]:
    """A script item as (direction, the tool to steer to or None)."""
    if not isinstance(item, ModelTurn):
        return "decide from the results: the next call, or your final answer", None
    if item.final_answer is not None:
        return "give your final answer, from the results", None
    said = " and ".join(f"call {c.name} with {canonical_json(dict(c.arguments))}" for c in item.tool_calls)
    return said, (item.tool_calls[0].name if len(item.tool_calls) == 1 else None)


def directions(script: Sequence[Any]) -> str:
    """The script's turns as what the model is asked to do, one line a turn."""
    lines = [f"turn {n}: {_step(item)[0]}" for n, item in enumerate(script, 1)]
    return "Do this, one turn at a time:\n" + "\n".join(lines)


class Directed:
    """The real model on a scripted case's turns (module docstring): steered by the script's
    tools, with the script asked each turn for what it does to the world."""

    def __init__(self, spec: ModelSpec, script: ScriptedModel) -> None:
        self.spec = spec
        self.script = script
        self.steering = [_step(item)[1] for item in script.turns]
        self._clients: dict[str, ModelClient] = {}

    def next_turn(self, context: AgentContext) -> ModelTurn:
        # Past the script (ScriptExhausted) the model goes on alone.
        with contextlib.suppress(ScriptExhausted):
            self.script.next_turn(context)  # its callables act on the world; its answer is discarded
        index = context.turn - 1
        choice = (self.steering[index] if index < len(self.steering) else None) or "auto"
        if choice not in self._clients:
            self._clients[choice] = self.spec.client(choice)
        return self._clients[choice].next_turn(context)


def directed(case: Case, spec: ModelSpec) -> Case:
    """`case` with the real model in its scripted model's place (module docstring)."""
    made = case.model

    def factory(env: Any) -> ModelClient:
        script = made(env)
        if isinstance(script, ScriptedModel):
            return Directed(spec, script)
        return spec.client("auto")  # not a script: nothing to direct it by

    goal = case.goal
    probe = _script_of(case)
    if probe is not None:
        goal = f"{case.goal}\n\n{directions(probe.turns)}"
    return replace(case, goal=goal, model=factory)


def _script_of(case: Case) -> ScriptedModel | None:
    """The case's script, when its factory makes one without needing the environment."""
    try:
        made = case.model(None)
    except Exception:  # noqa: BLE001 - a factory that needs its environment has no script to read here
        return None
    return made if isinstance(made, ScriptedModel) else None


# -- the comparison ---------------------------------------------------------------------------------


def _judged(run: CaseRun) -> dict[tuple[str, str], str]:
    """{(tool, canonical arguments): the status of its first observation} of a run."""
    result = run.result
    if result is None:
        return {}
    calls: list[ToolCall] = [c for turn in run.proposals for c in turn]
    out: dict[tuple[str, str], str] = {}
    for call, observation in zip(calls, result.trajectory, strict=False):
        out.setdefault(call.signature(), observation.status.value)
    return out


def classify(scripted: CaseRun, model: CaseRun) -> str:
    """Why the two runs of a case differ: one of CLASSES (module docstring)."""
    runs = (scripted.result, model.result)
    if any(r is None or r.outcome is RunOutcome.ERROR for r in runs):
        return INFRASTRUCTURE
    result = model.result
    assert result is not None
    if result.outcome is RunOutcome.MODEL_TRUNCATED or any(
            o.status is ObservationStatus.INVALID for o in result.trajectory):
        return ADAPTER
    a, b = _judged(scripted), _judged(model)
    if any(sig in a and a[sig] != status for sig, status in b.items()):
        return POLICY
    return MODEL


@dataclass(frozen=True)
class ModelComparison:
    """The real model's runs beside the scripted ones: paired by case, each differing case classified."""

    spec: ModelSpec
    comparison: Comparison
    """A = ScriptedModel, B = the real model."""
    classes: dict[str, str]
    """{case: class} of every case whose first runs differ (CLASSES)."""
    rows: list[tuple[str, str, str, str, str]]
    """(case, scripted k/N, model k/N, the model's outcome, what the model proposed)."""

    @property
    def discordant(self) -> tuple[str, ...]:
        return self.comparison.discordant

    def lines(self) -> list[str]:
        out = [f"model {self.spec.label()} at {self.spec.url}, beside ScriptedModel (directed by the script: "
               "ringfence_server/control/evals/models.py)"]
        rows = [("case", "scripted", "model", "model outcome", "class", "the model proposed"),
                *[(c, s, m, o, self.classes.get(c, "-"), p) for c, s, m, o, p in self.rows]]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        out += ["  " + "  ".join(cell.ljust(widths[i]) if i < 5 else cell for i, cell in enumerate(row)).rstrip()
                for row in rows]
        out += [f"  {line}" for line in self.comparison.lines()]
        for name in self.discordant:
            out.append(f"  {name}: {self.classes.get(name, MODEL)}")
        differing = [c for c in self.classes if c not in self.discordant]
        if differing:
            out.append("  behaved differently, same verdict: "
                       + ", ".join(f"{c} ({self.classes[c]})" for c in differing))
        return out

    def as_json(self) -> dict[str, Any]:
        return {"model": self.spec.label(), "url": self.spec.url, "comparison": self.comparison.as_json(),
                "classes": dict(self.classes),
                "cases": [{"case": c, "scripted": s, "model": m, "outcome": o, "proposed": p}
                          for c, s, m, o, p in self.rows]}


def _proposed(run: CaseRun) -> str:
    calls = [c for turn in run.proposals for c in turn]
    if not calls:
        return "answer" if run.result is not None and run.result.final_answer is not None else "-"
    return "; ".join(f"{c.name} {canonical_json(dict(c.arguments))[:60]}" if c.invalid_arguments is None
                     else f"{c.name} <not JSON>" for c in calls[:4]) + (" ..." if len(calls) > 4 else "")


def model_comparison(spec: ModelSpec, scripted: Sequence[CaseRun], model: Sequence[CaseRun]) -> ModelComparison:
    a = {s.case: s for s in summarize(r.as_record() for r in scripted)}
    b = {s.case: s for s in summarize(r.as_record() for r in model)}
    comparison = compare({c: s.passed for c, s in a.items()}, {c: s.passed for c, s in b.items()},
                         "ScriptedModel", spec.label())
    first_a: dict[str, CaseRun] = {}
    first_b: dict[str, CaseRun] = {}
    for r in scripted:
        first_a.setdefault(r.case, r)
    for r in model:
        first_b.setdefault(r.case, r)
    classes: dict[str, str] = {}
    rows: list[tuple[str, str, str, str, str]] = []
    for case, sa in a.items():
        ra, rb = first_a[case], first_b.get(case)
        if rb is None:
            continue
        sb = b[case]
        if ra.semantics != rb.semantics or sa.passed != sb.passed:
            classes[case] = classify(ra, rb)
        rows.append((case, f"{sa.passed_runs}/{sa.runs}", f"{sb.passed_runs}/{sb.runs}",
                     str(rb.semantics.get("outcome", "raised")), _proposed(rb)))
    return ModelComparison(spec, comparison, classes, rows)
