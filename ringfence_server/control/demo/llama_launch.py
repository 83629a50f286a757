"""`python -m ringfence_server.control.demo.llama_launch ARGS`: llama-cpp-python's OpenAI-compatible
server (`python -m llama_cpp.server ARGS`, the same arguments), with three faults of
llama-cpp-python 0.3.36 (pinned by the `local-model` extra) kept from killing it. Each was met
here, each killed the server process with SIGSEGV on the first request that met it:

1. Weights repacked into "extra" buffer types: on a CPU that reports AMX whose tile state the
   kernel (here a VM's) has not enabled, the AMX repack's first `ldtilecfg` faults. The loader's
   use_extra_bufts has no flag, so it is turned off where the loader reads its defaults. (For a
   270M model the repack buys little.)
2. JSON Schema length bounds (minLength / maxLength / minItems / maxItems): the grammar made from
   a tool's schema spells `maxLength: 4096` as 4096 nested optional rules, which llama.cpp
   refuses ("exceeds sane defaults"), or overflows on (65536). The argument grammar is made from
   the schema without them: the types, properties, required fields and enums still bind the
   model, and the control plane checks the bounds of every call it is sent all the same.
   A `pattern` the converter cannot read (not anchored ^...$) is dropped too, rather than losing
   the whole schema to the generic JSON grammar.
3. A grammar llama.cpp still refuses is a NULL sampler the library adds to its chain: here it
   raises instead, so the request fails (HTTP 500) and the server lives.

And one that did not kill it but held it: the `chatml-function-calling` handler asks for its
grammar-bound steps (the tool's name, its arguments) with `max_tokens=None`, which llama.cpp reads
as "until the context is full". A model that never closes what the grammar lets it write (endless
whitespace inside the arguments' JSON) then generated for the whole 8192-token context, minutes on
two busy cores, and the server answers one request at a time: every later request waited behind
it (a demo seen running past ten minutes). So:

4. Every completion is bounded: `max_tokens` None (or not positive) becomes MAX_COMPLETION_TOKENS,
   far more than any tool call of ours needs; a step cut there fails its request, as a truncated
   answer, instead of holding the server.

The patches touch only this process (the server's), never the library on disk.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_COMPLETION_TOKENS", "bound_completions", "grammar_schema", "main"]

MAX_COMPLETION_TOKENS = 1024

LENGTH_KEYWORDS = frozenset({"minLength", "maxLength", "minItems", "maxItems"})
# The keywords whose value maps names to schemas: the names are arguments, never keywords.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def grammar_schema(schema: Any, drop: frozenset[str] = LENGTH_KEYWORDS) -> Any:
    """`schema` without the keywords in `drop`, at every depth (an argument NAMED like one stays)."""
    if isinstance(schema, list):
        return [grammar_schema(s, drop) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in drop:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: grammar_schema(sub, drop) for name, sub in value.items()}
        else:
            out[key] = grammar_schema(value, drop)
    return out


def _patch(llama_cpp: Any, grammar_module: Any, internals: Any) -> None:
    # 1. no extra buffer types (the AMX repack)
    defaults: Callable[[], Any] = llama_cpp.llama_model_default_params

    def without_extra_buffers() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_model_default_params = without_extra_buffers

    # 2. argument grammars without length bounds (and without a pattern the converter refuses)
    grammar_class = grammar_module.LlamaGrammar
    to_gbnf: Callable[[str], str] = grammar_module.json_schema_to_gbnf

    def from_json_schema(cls: Any, json_schema: str, verbose: bool = True) -> Any:
        schema = grammar_schema(json.loads(json_schema))
        try:
            text = to_gbnf(json.dumps(schema))
        except (AssertionError, ValueError, KeyError, TypeError):  # an unreadable pattern, say
            text = to_gbnf(json.dumps(grammar_schema(schema, frozenset({"pattern"}))))
        return cls.from_string(text, verbose=verbose)

    grammar_class.from_json_schema = classmethod(from_json_schema)

    # 3. a refused grammar raises instead of adding NULL to the sampler chain
    lib = internals.llama_cpp

    def add_grammar(self: Any, model: Any, grammar: Any) -> None:
        sampler = lib.llama_sampler_init_grammar(model.vocab, grammar._grammar.encode("utf-8"),
                                                 grammar._root.encode("utf-8"))
        if not sampler:
            raise ValueError("llama.cpp refused the grammar made from the tool's schema")
        lib.llama_sampler_chain_add(self.sampler, sampler)

    internals.LlamaSampler.add_grammar = add_grammar


def bound_completions(llama_class: Any, limit: int = MAX_COMPLETION_TOKENS) -> None:
    """4.: `llama_class.create_completion` with an unbounded `max_tokens` asks for `limit` instead."""
    create: Callable[..., Any] = llama_class.create_completion

    def bounded(self: Any, *args: Any, **kwargs: Any) -> Any:
        tokens = kwargs.get("max_tokens")
        if "max_tokens" in kwargs and (tokens is None or tokens <= 0):
            kwargs["max_tokens"] = limit
        return create(self, *args, **kwargs)

    llama_class.create_completion = bounded


def main(argv: list[str]) -> None:
    # Imported by name: the `local-model` extra is optional, and this module is checked without it.
    llama_cpp = importlib.import_module("llama_cpp.llama_cpp")
    _patch(llama_cpp, importlib.import_module("llama_cpp.llama_grammar"),
           importlib.import_module("llama_cpp._internals"))
    bound_completions(importlib.import_module("llama_cpp.llama").Llama)
    server = importlib.import_module("llama_cpp.server.__main__")
    sys.argv = ["llama_cpp.server", *argv]
    server.main()


if __name__ == "__main__":
    main(sys.argv[1:])
