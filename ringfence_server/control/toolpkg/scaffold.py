"""`ringfence tools new NAME`: a tool package that works, with a passing test, and its image.

Writes, relative to the current folder (or the folders given):

    <tools-dir>/NAME/manifest.json       a schema ({"text": string}), risk metadata (a read-only,
                                         reversible tool, cost 0.01), small limits, "image": IMAGE
    <tools-dir>/NAME/NAME.py             run(arguments, context): counts the text's words
    <tools-dir>/NAME/test_NAME.py        its unittest tests (one success, one ToolError)
    <images-dir>/IMAGE/image.json        a child of the built-in `tool` image whose "tools" names
                                         the package (its code laid at /opt/ringfence/tools/NAME.py)

IMAGE is NAME with "_" as "-" (image names take no underscore) unless --image says otherwise.
Refused, with nothing written: a NAME the runner would not load ([a-z][a-z0-9_]{0,63}), a
NAME a built-in tool has, a package folder that exists, an IMAGE that is not an image name or
names an existing spec (the user's, or a built-in one it would shadow). Then it prints what to
do next: edit, build the image, check, serve.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ringfence_server.imagebuild.spec import NAME as IMAGE_NAME
from ringfence_server.imagebuild.spec import TOOL_NAME
from ringfence_server.sandbox.pinned_images import IMAGES_DIR


class ScaffoldError(Exception):
    """Why nothing was written."""


@dataclass(frozen=True)
class Scaffold:
    name: str
    image: str
    package: Path
    spec: Path

    @property
    def files(self) -> list[Path]:
        return [self.package / "manifest.json", self.package / f"{self.name}.py",
                self.package / f"test_{self.name}.py", self.spec / "image.json"]


def manifest(name: str, image: str) -> dict[str, object]:
    return {
        "name": name,
        "description": (f"Count the words of a text ({name}, scaffolded by `ringfence tools new`: say here what it "
                        "does, for the model that proposes its calls)."),
        "schema": {
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 10000}},
            "required": ["text"],
            "additionalProperties": False,
        },
        "mutates": False,
        "reversible": True,
        "cost": 0.01,
        "image": image,
        "limits": {"memory_bytes": 67108864, "cpus": 0.5, "pids": 32, "timeout_s": 10, "stdout_limit": 65536},
    }


CODE = '''"""{name}: counts the words of a text (a scaffold: make it yours).

It runs in a fresh sandbox per call, in the image {image} (laid there as
/opt/ringfence/tools/{name}.py by images/{image}/image.json). The tool API (docs/TOOLS.md):
`run(arguments, context)` gets the arguments the manifest's schema admitted and a context,
{{"call_id": ..., "idempotency_key": ... (None unless the tool mutates)}}; it returns JSON-able
content, or raises ToolError(class, message) with class "invalid", "transient", "rate_limited"
or "fatal". Any other exception is reported as "fatal" (never retried).
"""

from ringfence_tool import ToolError


def run(arguments, context):
    text = arguments["text"]
    if not text.strip():
        raise ToolError("invalid", "the text is blank")
    return {{"words": len(text.split()), "call_id": context["call_id"]}}
'''

TEST = '''"""{name}'s own tests. `ringfence tools check` runs them in the sandbox, in the image
{image}: python3 with /opt/ringfence on the path (ringfence_tool, and the image's wheels), this
folder mounted read-only, no network."""

import unittest

import {name}
from ringfence_tool import ToolError

CONTEXT = {{"call_id": "c1", "idempotency_key": None}}


class {cls}Test(unittest.TestCase):
    def test_counts_the_words(self):
        self.assertEqual({name}.run({{"text": "hello from the sandbox"}}, CONTEXT), {{"words": 4, "call_id": "c1"}})

    def test_a_blank_text_is_invalid(self):
        with self.assertRaises(ToolError) as caught:
            {name}.run({{"text": "   "}}, CONTEXT)
        self.assertEqual(caught.exception.cls, "invalid")


if __name__ == "__main__":
    unittest.main()
'''


def image_spec(name: str, image: str, package: Path, spec_dir: Path) -> dict[str, object]:
    rel = os.path.relpath(package.resolve(), spec_dir.resolve())
    return {
        "description": f"The {name} tool: the built-in tool image plus its code (and what it needs: add "
                       "\"packages\" and \"wheels\" here).",
        "parent": "tool",
        "tools": [Path(rel).as_posix()],
        "labels": {"ringfence.image": image},
    }


def plan(name: str, *, tools_dir: Path, images_dir: Path, image: str | None = None,
         builtin_tools: Path | None = None) -> Scaffold:
    """Where the files go, or ScaffoldError naming why not (nothing is written)."""
    if not TOOL_NAME.fullmatch(name):
        raise ScaffoldError(f"{name!r} is not a tool name: [a-z][a-z0-9_]{{0,63}} (what the runner loads)")
    from ringfence_server.control.config import BUILTIN_TOOLS_DIR
    from ringfence_server.control.tools import manifest_files

    for path in manifest_files(builtin_tools or BUILTIN_TOOLS_DIR):
        if path.stem == name:
            raise ScaffoldError(f"{name} is a built-in tool ({path}); the server refuses a name defined twice")
    image = image or name.replace("_", "-")
    if not IMAGE_NAME.fullmatch(image):
        raise ScaffoldError(f"{image!r} is not an image name: [a-z][a-z0-9-]{{0,62}} (--image)")
    package = Path(tools_dir) / name
    if package.exists():
        raise ScaffoldError(f"{package} exists: a tool of that name is there already")
    spec = Path(images_dir) / image
    if spec.exists():
        raise ScaffoldError(f"{spec} exists: choose another image name (--image)")
    if (IMAGES_DIR / image / "image.json").is_file():
        raise ScaffoldError(f"{image} is a built-in image, which a spec of that name would shadow: "
                            "choose another image name (--image)")
    return Scaffold(name, image, package, spec)


def write(s: Scaffold) -> Scaffold:
    cls = "".join(part.capitalize() for part in s.name.split("_"))
    s.package.mkdir(parents=True)
    s.spec.mkdir(parents=True)
    (s.package / "manifest.json").write_text(json.dumps(manifest(s.name, s.image), indent=2) + "\n")
    (s.package / f"{s.name}.py").write_text(CODE.format(name=s.name, image=s.image))
    (s.package / f"test_{s.name}.py").write_text(TEST.format(name=s.name, image=s.image, cls=cls))
    (s.spec / "image.json").write_text(json.dumps(image_spec(s.name, s.image, s.package, s.spec), indent=2) + "\n")
    return s


def next_steps(s: Scaffold, *, tools_dir: Path, images_dir: Path) -> str:
    images = str(images_dir)
    steps = [
        (f"ringfence images fetch --images-dir {images}", "only when it pins packages or wheels"),
        (f"ringfence images build --images-dir {images} --update-lock",
         f"pins {s.image} in {Path(images_dir) / 'images.lock'}"),
        (f"ringfence tools check {s.package} --images-dir {images}", "the manifest; the code and tests in the sandbox"),
    ]
    width = max(len(cmd) for cmd, _ in steps)
    return "\n".join([
        *(f"created {p}" for p in s.files),
        "",
        "next:",
        f"  1. make it yours: the schema, risk and limits in {s.package / 'manifest.json'}, the code in "
        f"{s.package / (s.name + '.py')} and its tests; pin the Debian packages and wheels it needs in "
        f"{s.spec / 'image.json'} (docs/TOOLS.md)",
        *(f"  {i}. {cmd.ljust(width)}   # {why}" for i, (cmd, why) in enumerate(steps, start=2)),
        "  5. serve it: in ringfence.toml",
        f"         [tools]\n         packages = [\"{tools_dir}\"]\n         [images]\n         dir = \"{images}\"",
        f"     and a [[policy.rules]] entry for {s.name} (no rule means deny), then "
        "`ringfence serve --config ringfence.toml`",
    ])
