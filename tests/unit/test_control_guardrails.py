"""Guardrails: the secret scanner (positives and near-misses), redaction, the loop detector."""

from __future__ import annotations

import pytest

from ringfence_server.control.guardrails import Action, check_arguments, check_loop, check_result, scan


@pytest.mark.parametrize("text,kind", [
    ("AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
    ("id ASIAY34FZKBOKMUTVV7A here", "aws_access_key"),
    ("-----BEGIN RSA PRIVATE KEY-----", "private_key"),
    ("-----BEGIN PRIVATE KEY-----", "private_key"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", "private_key"),
    ("Authorization: Bearer abc.def-ghi_jkl~mno+pqr/stu=", "bearer_token"),
    ("token sk_live_4eC39HqLyjWDarjtT1zdp7dc9X", "high_entropy"),
])
def test_secrets_are_found(text, kind):
    assert kind in {f.kind for f in scan({"nested": [{"v": text}]})}


@pytest.mark.parametrize("text", [
    "hello world",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",  # a sha256 digest
    "/input/reports/2024/quarterly_summary_final_version.txt",
    "AKIA-not-a-key",
    "the bearer of bad news",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "-----BEGIN PUBLIC KEY-----",
])
def test_near_misses_pass(text):
    assert scan({"v": text}) == []


def test_keys_of_objects_are_scanned_too():
    assert scan({"AKIAIOSFODNN7EXAMPLE": 1})


def test_private_keys_halt_other_secrets_block():
    assert check_arguments({"k": "-----BEGIN EC PRIVATE KEY-----"}).action is Action.HALT
    assert check_arguments({"k": "AKIAIOSFODNN7EXAMPLE"}).action is Action.BLOCK
    assert check_arguments({"k": "fine"}).action is Action.PASS


def test_results_are_redacted_or_withheld():
    r = check_result({"a": ["x AKIAIOSFODNN7EXAMPLE y"], "b": 3})
    assert r.action is Action.PASS and r.content == {"a": ["x [REDACTED:aws_access_key] y"], "b": 3}
    assert check_result({"k": "-----BEGIN PRIVATE KEY-----\n..."}).action is Action.BLOCK
    clean = {"a": "b"}
    assert check_result(clean).content is clean


def test_the_loop_detector_halts_on_the_threshold():
    assert check_loop(0, 3).action is Action.PASS
    assert check_loop(1, 3).action is Action.PASS
    assert check_loop(2, 3).action is Action.HALT


def test_long_data_blobs_are_not_taken_for_tokens():
    import base64
    import random

    blob = base64.b64encode(random.Random(3).randbytes(3000)).decode()
    assert scan({"content": blob}) == []
    assert check_result({"content": blob}).content == {"content": blob}
    # ...but a key-sized run of the same alphabet is.
    assert [f.kind for f in scan({"v": "x " + blob[:40] + " y"})] == ["high_entropy"]
