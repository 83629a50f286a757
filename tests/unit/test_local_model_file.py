"""The local model's file is trusted by its SHA256 only (ringfence_server/control/demo/local_model.py):
the pin is the hash the package publishes, and a file with another hash stops everything before a
server is started. The launcher's argument grammars keep every argument, losing only length bounds.
`ringfence demo --model local` without the extra says how to install it."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.resources
import importlib.util

import pytest

from ringfence_server.control.demo.llama_launch import grammar_schema
from ringfence_server.control.demo.local_model import (
    MODEL_PACKAGE,
    MODEL_SHA256,
    LocalModelServer,
    ModelFileMismatch,
    check_sha256,
)


def test_the_pinned_hash_is_the_one_the_model_package_publishes():
    if importlib.util.find_spec(MODEL_PACKAGE) is None:
        pytest.skip("the local-model extra is not installed (make local-model)")
    package = importlib.import_module(MODEL_PACKAGE)
    assert package.EXPECTED_SHA256 == MODEL_SHA256
    sums = (importlib.resources.files(MODEL_PACKAGE) / "data" / "SHA256SUMS").read_text().split()
    assert sums == [MODEL_SHA256, package.MODEL_NAME]


def test_a_file_with_another_hash_is_refused_before_any_server_starts(tmp_path):
    tiny = tmp_path / "model.gguf"
    tiny.write_bytes(b"GGUF not the model")
    digest = hashlib.sha256(tiny.read_bytes()).hexdigest()
    assert check_sha256(tiny, expected=digest) == tiny
    with pytest.raises(ModelFileMismatch) as raised:
        check_sha256(tiny)  # the pinned hash
    assert digest in str(raised.value) and MODEL_SHA256 in str(raised.value)

    server = LocalModelServer(tiny)
    with pytest.raises(ModelFileMismatch):
        server.start()
    assert server.proc is None  # nothing was started for it


def test_the_argument_grammar_drops_length_bounds_never_an_argument():
    schema = {"type": "object", "required": ["maxLength", "path"],
              "properties": {"maxLength": {"type": "integer", "maximum": 9},
                             "path": {"type": "string", "minLength": 1, "maxLength": 4096},
                             "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 8}}}}
    assert grammar_schema(schema) == {
        "type": "object", "required": ["maxLength", "path"],
        "properties": {"maxLength": {"type": "integer", "maximum": 9}, "path": {"type": "string"},
                       "tags": {"type": "array", "items": {"type": "string"}}}}
    assert grammar_schema({"type": "string", "pattern": "^a"}, frozenset({"pattern"})) == {"type": "string"}


def test_without_the_extra_the_demo_says_how_to_install_it(monkeypatch, capsys):
    from ringfence_server.control.demo import cli as demo_cli
    from ringfence_server.control.demo import local_model

    monkeypatch.setattr(local_model, "MODEL_PACKAGE", "ringfence_test_no_such_model_package")
    assert demo_cli._local(None) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the local model needs the `local-model` extra")
    assert "run `make demo-local`, or pip install 'ringfence-server[local-model]'" in err


def test_local_is_the_reference_agents_model_only(capsys):
    from ringfence_server.control.demo import cli as demo_cli

    args = argparse.Namespace(which="showcase", workdir=None, model="local", console=None)
    assert demo_cli.demo_command(args) == 2
    assert "--model local drives the reference agent" in capsys.readouterr().err


def test_the_launcher_bounds_every_completion():
    """llama-cpp-python's function-calling handler asks for its grammar-bound steps with
    max_tokens=None ("until the context is full"): the launcher turns that into a bound."""
    from ringfence_server.control.demo.llama_launch import MAX_COMPLETION_TOKENS, bound_completions

    class Llama:
        def create_completion(self, prompt, max_tokens=16, **kwargs):
            return max_tokens

    bound_completions(Llama)
    assert Llama().create_completion("p", max_tokens=None) == MAX_COMPLETION_TOKENS
    assert Llama().create_completion("p", max_tokens=0) == MAX_COMPLETION_TOKENS
    assert Llama().create_completion("p", max_tokens=256) == 256
    assert Llama().create_completion("p") == 16  # the library's own default, untouched


def test_the_real_llama_takes_max_tokens_by_that_name():
    # The bound rests on the library passing max_tokens by keyword, under that name.
    import inspect

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("the local-model extra is not installed (make local-model)")
    llama = importlib.import_module("llama_cpp.llama").Llama
    assert "max_tokens" in inspect.signature(llama.create_completion).parameters
    handler = inspect.getsource(importlib.import_module("llama_cpp.llama_chat_format").chatml_function_calling)
    assert "max_tokens=None" in handler  # what the bound is for; if this changes, look again
