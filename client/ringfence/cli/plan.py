"""The plan file of `ringfence submit`: YAML (or JSON) read strictly into a Plan, every problem
reported at once, then checked against the tools a server publishes (precheck).

yaml is imported where a plan is read, so that `ringfence --help` and the commands that read no
plan start without it. jsonschema is optional (the client does not depend on it; the server's
distribution brings it): with it, a step's arguments are checked before anything is sent; without
it, only the tool names are, and the server's own check answers (INVALID_ARGUMENT, every violation).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringfence.cli.errors import UsageError
from ringfence.cli.output import jsonable
from ringfence.model import PlanStep, ToolView

if TYPE_CHECKING:
    import yaml


PLAN_KEYS = ("goal", "run_id", "max_steps", "steps")
STEP_KEYS = ("key", "tool", "arguments")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")  # as the server's run ids and step keys


class PlanError(UsageError):
    """The plan file cannot be read, or is not a valid plan (`details`: every problem, one a line)."""


@dataclass(frozen=True)
class Plan:
    """A plan file as read: what the run is for and its steps (the server's PlanStep)."""

    goal: str
    steps: tuple[PlanStep, ...]
    run_id: str | None = None  # start or reuse this run (`--run-id` overrides it)
    max_steps: int | None = None  # the plan's step cap, checked here and by the server


def _yaml_loader() -> type[yaml.SafeLoader]:
    """A safe YAML loader with the YAML 1.2 core schema's scalars and no duplicate keys.

    PyYAML's default (YAML 1.1) would turn `no` into False, `010` into 8, `1:20` into 80 and
    `2024-01-01` into a date: an approver would see a call other than the one the author wrote.
    Here only true/false are booleans, integers are decimal (or 0o / 0x), dates stay strings,
    merge keys are not special, and a key given twice is an error (two readers could disagree
    on which value counts). JSON is valid input too.
    """
    import yaml

    class PlanLoader(yaml.SafeLoader):
        yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012 - PyYAML declares it an instance variable (mypy)

    resolvers = [
        ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
        ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
        ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
        ("tag:yaml.org,2002:float",
         r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
         list("-+.0123456789")),
    ]
    for tag, pattern, first in resolvers:
        PlanLoader.add_implicit_resolver(tag, re.compile(pattern), first)

    def construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
        text = loader.construct_scalar(node)
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        if digits.startswith("0o"):
            return sign * int(digits[2:], 8)
        if digits.startswith("0x"):
            return sign * int(digits[2:], 16)
        return sign * int(digits, 10)

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _value in node.value:
                key = loader.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, "a mapping key must be a plain value", key_node.start_mark) from None
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    PlanLoader.add_constructor("tag:yaml.org,2002:int", construct_int)
    def construct_map(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
        return _mapping_from(loader, node, construct_mapping)

    PlanLoader.add_constructor("tag:yaml.org,2002:map", construct_map)
    return PlanLoader


def _mapping_from(loader: yaml.SafeLoader, node: yaml.MappingNode,
                  construct_mapping: Callable[[yaml.SafeLoader, yaml.MappingNode], dict[Any, Any]],
                  ) -> Iterator[dict[Any, Any]]:
    # As SafeConstructor.construct_yaml_map, with the duplicate check (a generator: anchors work).
    data: dict[Any, Any] = {}
    yield data
    data.update(construct_mapping(loader, node))


def _json_problems(value: Any, at: str) -> list[str]:
    """Why `value` is not plain JSON (what the server and the approver see), one line each."""
    problems: list[str] = []
    stack = [(value, at)]
    while stack:
        item, where = stack.pop()
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                problems.append(f"{where}: {item} is not a JSON number")
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    problems.append(f"{where}: the key {key!r} must be a string (quote it)")
                stack.append((child, f"{where}.{key}"))
            continue
        if isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
            continue
        problems.append(f"{where}: a {type(item).__name__} is not JSON (quote it to send text)")
    return sorted(problems)


def load_plan(text: str, source: str = "the plan") -> Plan:
    """A plan from YAML (or JSON) text; PlanError lists every problem at once."""
    doc = _plan_document(text, source)
    # One list for the whole plan, in the order the checks run: a step is kept only when no
    # problem so far names it (see _read_step), and the problems are reported in this order.
    problems = _plan_field_problems(doc)
    steps = _read_steps(doc, problems)
    goal, run_id, max_steps = doc.get("goal"), doc.get("run_id"), doc.get("max_steps")
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and len(steps) > max_steps > 0:
        problems.append(f"steps: {len(steps)} steps is over max_steps {max_steps}")
    if problems:
        raise PlanError(f"{source} is not a valid plan", problems)
    assert isinstance(goal, str)  # checked above: a plan without problems has a text goal
    return Plan(goal=goal, steps=tuple(steps), run_id=run_id, max_steps=max_steps)


def _plan_document(text: str, source: str) -> dict[Any, Any]:
    """The plan text parsed into a mapping; PlanError when it is not YAML or not a mapping."""
    import yaml

    try:
        doc = yaml.load(text, Loader=_yaml_loader())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise PlanError(f"{source} is not valid YAML{where}: {e.problem or e.context}") from None
    except (yaml.YAMLError, ValueError) as e:
        raise PlanError(f"{source} is not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        kind = "empty" if doc is None else f"a {type(doc).__name__}"
        raise PlanError(f"{source} is not a plan",
                        [f"the file is {kind}; a plan is a mapping with goal and steps (and optionally "
                         "run_id, max_steps)"])
    return doc


def _plan_field_problems(doc: dict[Any, Any]) -> list[str]:
    """The problems of the plan's own keys (unknown keys, goal, run_id, max_steps), in that order."""
    problems: list[str] = []
    for key in doc:
        if key not in PLAN_KEYS:
            problems.append(f"{key}: unknown key (a plan has: {', '.join(PLAN_KEYS)})")
    goal = doc.get("goal")
    if "goal" not in doc:
        problems.append("goal: missing (what the run is for, in a sentence)")
    elif not isinstance(goal, str) or not goal.strip():
        problems.append("goal: must be non-empty text")
    run_id = doc.get("run_id")
    if run_id is not None and (not isinstance(run_id, str) or not _ID.fullmatch(run_id)):
        problems.append("run_id: 1-100 characters of [A-Za-z0-9_.:-], starting with a letter or digit")
    max_steps = doc.get("max_steps")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        problems.append("max_steps: must be a positive integer")
    return problems


def _read_steps(doc: dict[Any, Any], problems: list[str]) -> list[PlanStep]:
    """The plan's valid steps, in order; the problems of `steps` and of each step are appended
    to `problems` (which holds the plan's earlier problems: _read_step looks at them)."""
    steps: list[PlanStep] = []
    raw_steps = doc.get("steps")
    if "steps" not in doc or raw_steps is None:
        problems.append("steps: missing (a plan needs at least one step: {key, tool, arguments})")
    elif not isinstance(raw_steps, list):
        problems.append(f"steps: must be a list of steps, not a {type(raw_steps).__name__}")
    elif not raw_steps:
        problems.append("steps: empty (a plan needs at least one step)")
    else:
        seen: set[str] = set()  # the step keys so far: a key given twice is a problem
        for i, step in enumerate(raw_steps):
            read = _read_step(step, f"steps[{i}]", seen, problems)
            if read is not None:
                steps.append(read)
    return steps


def _read_step(step: Any, at: str, seen: set[str], problems: list[str]) -> PlanStep | None:
    """One step (`at`: where it is, as `steps[0]`), or None when it has a problem; its problems
    are appended to `problems` and a new key is added to `seen`."""
    if not isinstance(step, dict):
        problems.append(f"{at}: must be a mapping with key, tool and arguments")
        return None
    for key in step:
        if key not in STEP_KEYS:
            problems.append(f"{at}: unknown key {key!r} (a step has: {', '.join(STEP_KEYS)})")
    key, tool, arguments = step.get("key"), step.get("tool"), step.get("arguments", {})
    _check_step_key(step, key, at, seen, problems)
    if "tool" not in step:
        problems.append(f"{at}.tool: missing (a tool name: see `ringfence tools`)")
    elif not isinstance(tool, str) or not tool:
        problems.append(f"{at}.tool: must be a tool name")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        problems.append(f"{at}.arguments: must be a mapping, not a {type(arguments).__name__}")
    else:
        problems.extend(_json_problems(arguments, f"{at}.arguments"))
    # No problem at this step means key and tool were checked to be text. The whole list is
    # searched, as it always was: a plan-level problem that names this step drops it too.
    if not any(p.startswith(at) for p in problems) and isinstance(key, str) and isinstance(tool, str):
        return PlanStep(key, tool, arguments)
    return None


def _check_step_key(step: dict[Any, Any], key: Any, at: str, seen: set[str], problems: list[str]) -> None:
    """The step's `key` (its name and call id): present, an id, and not a key an earlier step
    has; a new one is added to `seen`."""
    if "key" not in step:
        problems.append(f"{at}.key: missing (the step's name; it becomes the call id)")
    elif not isinstance(key, str) or not _ID.fullmatch(key):
        problems.append(f"{at}.key: 1-100 characters of [A-Za-z0-9_.:-]")
    elif key in seen:
        problems.append(f"{at}.key: duplicate key {key!r}")
    else:
        seen.add(key)


def read_plan(path: str) -> Plan:
    """The plan in the file `path` ('-': stdin); PlanError when it cannot be read or is not valid."""
    if path == "-":
        text, source = sys.stdin.read(), "the plan on stdin"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PlanError(f"there is no plan file {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise PlanError(f"cannot read the plan file {path}: {e}") from None
        source = path
    return load_plan(text, source)


def precheck(plan: Plan, tools: Sequence[ToolView]) -> list[str]:
    """Unknown tools and, where jsonschema is installed, arguments that break a tool's JSON Schema,
    validated as the server does (Draft 2020-12 with format checks), one line per problem."""
    by_name = {t.name: t for t in tools}
    problems: list[str] = []
    for i, step in enumerate(plan.steps):
        tool = by_name.get(step.tool)
        if tool is None:
            problems.append(f"steps[{i}].tool: unknown tool {step.tool!r} (`ringfence tools` lists them: "
                            f"{', '.join(sorted(by_name))})")
            continue
        problems.extend(_argument_problems(i, tool, step))
    return problems


def _argument_problems(i: int, tool: ToolView, step: PlanStep) -> list[str]:
    try:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError
    except ImportError:  # a client-only install: the server checks the arguments itself
        return []
    try:
        validator = Draft202012Validator(jsonable(tool.schema), format_checker=Draft202012Validator.FORMAT_CHECKER)
        errors = sorted(validator.iter_errors(jsonable(step.arguments)),
                        key=lambda e: (list(map(str, e.absolute_path)), e.message))
    except SchemaError:
        return []  # the server's to judge
    problems = []
    for e in errors:
        where = f"steps[{i}].arguments" + "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in e.absolute_path)
        problems.append(f"{where}: {e.message[:500]}")
    return problems
