"""hicachectl.plans.sglang_image: references made fully qualified, and RepoDigests judged as Docker and Podman spell them."""

from __future__ import annotations

import importlib.util
import json

import pytest
from support import ROOT

from hicachectl.config.deployment import build
from hicachectl.plans import sglang_image

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def deployment(**variables):
    raw = {"hicache_image": "lmsysorg/sglang:v0.5.20-cu130", "hicache_model_path": "/models/m", "hicache_container_runtime": "podman"}
    return build("h", {**raw, **{f"hicache_{k}": v for k, v in variables.items()}})


def inspect_output(*repo_digests):
    return json.dumps([{"Id": "0" * 64, "RepoTags": [], "RepoDigests": list(repo_digests)}])


@pytest.mark.parametrize("reference, qualified", [
    ("ubuntu", "docker.io/library/ubuntu"),
    ("ubuntu:24.04", "docker.io/library/ubuntu:24.04"),
    ("ubuntu@" + DIGEST, "docker.io/library/ubuntu@" + DIGEST),
    ("library/ubuntu:24.04", "docker.io/library/ubuntu:24.04"),
    ("docker.io/ubuntu:24.04", "docker.io/library/ubuntu:24.04"),
    ("index.docker.io/library/ubuntu:24.04", "docker.io/library/ubuntu:24.04"),
    ("registry-1.docker.io/lmsysorg/sglang:v0.5.20", "docker.io/lmsysorg/sglang:v0.5.20"),
    ("lmsysorg/sglang:v0.5.20-cu130", "docker.io/lmsysorg/sglang:v0.5.20-cu130"),
    ("lmsysorg/sglang:v0.5.20-cu130@" + DIGEST, "docker.io/lmsysorg/sglang:v0.5.20-cu130@" + DIGEST),
    ("Docker.IO/lmsysorg/sglang", "docker.io/lmsysorg/sglang"),
    ("localhost/tiny", "localhost/tiny"),
    ("localhost:5000/tiny:1", "localhost:5000/tiny:1"),
    ("127.0.0.1:5000/hicache-test/tiny:v0.5.21", "127.0.0.1:5000/hicache-test/tiny:v0.5.21"),
    ("Nexus.Awide.IO/awide-docker-hosted/x:v1", "nexus.awide.io/awide-docker-hosted/x:v1"),
    ("ghcr.io/org/team/img:1.2", "ghcr.io/org/team/img:1.2"),
    ("quay.io/org/img", "quay.io/org/img"),
])
def test_qualify(reference, qualified):
    assert sglang_image.qualify(reference) == qualified
    assert sglang_image.qualify(qualified) == qualified  # idempotent


def test_parse_keeps_tag_and_digest_apart():
    ref = sglang_image.parse("reg.example:5000/a/b:v1@" + DIGEST)
    assert (ref.registry, ref.path, ref.tag, ref.digest, ref.repository) == ("reg.example:5000", "a/b", "v1", DIGEST, "reg.example:5000/a/b")
    assert sglang_image.parse("reg.example:5000/a/b").tag is None  # the port is not a tag


@pytest.mark.parametrize("variables, pull", [
    ({}, "lmsysorg/sglang:v0.5.20-cu130"),  # as written: the runtime resolves it, and no tag step is needed
    ({"image_digest": DIGEST}, "lmsysorg/sglang@" + DIGEST),
    ({"image_mirror": "mirror.local:5000"}, "mirror.local:5000/lmsysorg/sglang:v0.5.20-cu130"),
    ({"image_mirror": "mirror.local:5000", "image_digest": DIGEST}, "mirror.local:5000/lmsysorg/sglang@" + DIGEST),
    ({"image": "ubuntu:24.04", "image_mirror": "mirror.local:5000"}, "mirror.local:5000/library/ubuntu:24.04"),
    ({"image": "nexus.awide.io/hosted/x:v0.5.21", "image_mirror": "m:5000"}, "m:5000/hosted/x:v0.5.21"),
    ({"image": "lmsysorg/sglang:v0.5.20@" + DIGEST}, "lmsysorg/sglang@" + DIGEST),  # a digest in the name is a pin too
])
def test_pull_reference(variables, pull):
    assert sglang_image.pull_reference(deployment(**variables)) == pull


# What each runtime lists in RepoDigests after pulling the pinned image (checked against Podman on this machine
# by tests/test_image_registry.py; Docker's spelling from its `image inspect`: no docker.io, no library/).
DOCKER_HUB_CASES = [
    ("lmsysorg/sglang:v0.5.20-cu130", {}, ["lmsysorg/sglang@" + DIGEST]),  # docker
    ("lmsysorg/sglang:v0.5.20-cu130", {}, ["docker.io/lmsysorg/sglang@" + DIGEST]),  # podman
    ("ubuntu:24.04", {}, ["ubuntu@" + DIGEST]),  # docker
    ("ubuntu:24.04", {}, ["docker.io/library/ubuntu@" + DIGEST]),  # podman
    ("docker.io/library/ubuntu:24.04", {}, ["ubuntu@" + DIGEST]),  # fully qualified in the inventory, docker's spelling
    # a mirror: docker lists where it pulled from; podman every name the image has (the mirror's and the tag's)
    ("lmsysorg/sglang:v0.5.20-cu130", {"image_mirror": "mirror.local:5000"}, ["mirror.local:5000/lmsysorg/sglang@" + DIGEST]),
    ("ubuntu:24.04", {"image_mirror": "mirror.local:5000"}, ["mirror.local:5000/library/ubuntu@" + DIGEST, "docker.io/library/ubuntu@" + DIGEST]),
    ("127.0.0.1:5000/hicache-test/tiny:v0.5.21", {}, ["127.0.0.1:5000/hicache-test/tiny@" + DIGEST]),
]


@pytest.mark.parametrize("name, variables, repo_digests", DOCKER_HUB_CASES)
def test_the_pinned_image_is_recognised_in_either_spelling(name, variables, repo_digests):
    d = deployment(image=name, image_digest=DIGEST, **variables)
    assert sglang_image.has_pinned_digest(d, repo_digests)
    state = sglang_image.local_state(d, inspect_output(*repo_digests))
    assert state["present"] and state["current"] and state["reason"] == ""


@pytest.mark.parametrize("name, variables, repo_digests", DOCKER_HUB_CASES)
def test_another_digest_is_not_the_pinned_image(name, variables, repo_digests):
    d = deployment(image=name, image_digest=OTHER, **variables)
    assert not sglang_image.has_pinned_digest(d, repo_digests)
    state = sglang_image.local_state(d, inspect_output(*repo_digests))
    assert state["present"] and not state["current"] and OTHER in state["reason"] and repo_digests[0] in state["reason"]


def test_the_pinned_digest_in_another_repository_does_not_count():
    d = deployment(image="lmsysorg/sglang:v0.5.20-cu130", image_digest=DIGEST)
    assert not sglang_image.has_pinned_digest(d, ["someone/sglang@" + DIGEST, "docker.io/library/sglang@" + DIGEST])


def test_accepted_digests_are_fully_qualified():
    d = deployment(image="ubuntu:24.04", image_digest=DIGEST, image_mirror="Mirror.Local:5000")
    assert sglang_image.accepted_digests(d) == ["mirror.local:5000/library/ubuntu@" + DIGEST, "docker.io/library/ubuntu@" + DIGEST]
    assert sglang_image.repository_digest(d) == "mirror.local:5000/library/ubuntu@" + DIGEST
    assert sglang_image.accepted_digests(deployment()) == [] and sglang_image.repository_digest(deployment()) is None


@pytest.mark.parametrize("output", [None, "", "[]", "not json", "Error: no such image"])
def test_missing_image(output):
    state = sglang_image.local_state(deployment(), output)
    assert not state["present"] and not state["current"] and "is not on this host" in state["reason"]


def test_unpinned_image_present_is_current_whatever_its_digests():
    assert sglang_image.local_state(deployment(), inspect_output())["current"]
    assert sglang_image.local_state(deployment(), json.dumps([{"Id": "x", "RepoDigests": None}]))["current"]


def test_pinned_image_without_repo_digests_is_pulled():
    state = sglang_image.local_state(deployment(image_digest=DIGEST), inspect_output())
    assert state["present"] and not state["current"] and "none" in state["reason"]


def test_pull_argv():
    assert sglang_image.pull_argv(deployment(image_tls_verify=False)) == ["podman", "pull", "--tls-verify=false", "lmsysorg/sglang:v0.5.20-cu130"]
    assert sglang_image.pull_argv(deployment(container_runtime="docker", image_tls_verify=False)) == ["docker", "pull", "lmsysorg/sglang:v0.5.20-cu130"]


def test_the_filter_judges_the_inspect_output():
    spec = importlib.util.spec_from_file_location("hicache_filter_under_test", ROOT / "plugins/filter/hicache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hicache_image = module.hicache_image
    variables = {"hicache_image": "ubuntu:24.04", "hicache_sglang_version": "0.5.21", "hicache_model_path": "/models/m", "hicache_container_runtime": "podman",
                 "hicache_image_digest": DIGEST}
    plan = hicache_image(variables, "h")
    assert "local" not in plan and plan["strict"] is True and plan["digest"] == DIGEST
    assert hicache_image(variables, "h", inspect_output("docker.io/library/ubuntu@" + DIGEST))["local"]["current"]
    assert not hicache_image(variables, "h", "")["local"]["present"]
    assert hicache_image({**variables, "hicache_strict": False}, "h")["strict"] is False
