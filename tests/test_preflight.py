"""preflight's judgement of a host's facts; the facts are written out in the shape hicache_host_facts returns
(the module itself runs on the Molecule and fleet hosts)."""

from __future__ import annotations

from helpers import deployment

from hicachectl import preflight


def runtime(facts, **overrides):
    return next(c for c in preflight.judge(facts, deployment("vast", **overrides)) if c.item == "container_runtime")


def test_a_docker_client_without_its_daemon_cannot_run_the_server():
    facts = {"tools": {"docker": "/usr/bin/docker"},
             "runtime_engines": {"docker": {"answers": False, "detail": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"}}}
    check = runtime(facts, strict=True)
    assert check.status == preflight.MISSING and check.blocking
    assert "/usr/bin/docker is there, but its engine does not answer (Cannot connect to the Docker daemon" in check.detail


def test_an_answering_engine_a_missing_client_and_no_runtime():
    answering = {"tools": {"docker": "/usr/bin/docker"}, "runtime_engines": {"docker": {"answers": True, "detail": "27.3.1"}}}
    assert runtime(answering).status == preflight.OK and "engine 27.3.1" in runtime(answering).detail
    assert runtime({"tools": {}}).detail == "docker not found"
    assert runtime({"tools": {}}, container_runtime="none", cache_container_dir=None, model_dir=None).status == preflight.INFO
