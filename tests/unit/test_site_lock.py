"""site.yml's deploy play takes the deploy lock again only where the lock the pull play took may have gone stale, so
that another run may have taken it over; elsewhere that lock cannot be stale yet and the host is not asked again. Its
condition is evaluated here by Ansible's own templating, with the variables a run has."""

from __future__ import annotations

import re
import time

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from helpers import load_plugin
from support import ROOT

from hicachectl.cli.change import LOCK_TASK

hicache_lock = load_plugin("plugins/modules/hicache_lock.py")


def _deploy_play_lock() -> dict:
    plays = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    deploy = next(play for play in plays if play.get("name") == "Deploy SGLang HiCache servers")
    return next(task for task in deploy["tasks"] if task.get("name") == LOCK_TASK)


def _taken_again(started_ago: float, **variables) -> bool:
    run = {"id": "run-1", "holder": "me@here", "started": str(time.time() - started_ago)}  # a set_fact's text, as validate.yml sets it
    templar = Templar(loader=DataLoader(), variables={"__hicache_run": run, **variables})
    return templar.evaluate_conditional(trust_as_template(_deploy_play_lock()["when"]))  # trusted: the playbook's own text


PULLED = {"__hicache_lock_pulled": {"changed": False, "msg": "took the deploy lock"}}


def test_a_run_younger_than_half_the_stale_after_keeps_the_pull_plays_lock_without_asking_the_host():
    assert not _taken_again(60, **PULLED)
    assert not _taken_again(hicache_lock.DEFAULT_STALE_AFTER / 2 - 60, **PULLED)


def test_an_older_run_takes_it_again_before_the_stale_after_could_have_passed():
    assert _taken_again(hicache_lock.DEFAULT_STALE_AFTER / 2 + 60, **PULLED)
    assert _taken_again(hicache_lock.DEFAULT_STALE_AFTER + 60, **PULLED)


@pytest.mark.parametrize("serial", [1, 4])
def test_a_rolling_run_takes_it_again_in_every_batch(serial):
    assert _taken_again(1, hicache_serial=serial, **PULLED)
    assert not _taken_again(1, hicache_serial=0, **PULLED)


def test_a_host_whose_lock_the_pull_play_did_not_take_takes_it():
    assert _taken_again(1)


def test_the_age_it_keeps_the_lock_for_is_half_the_lock_modules_stale_after():
    ages = [int(n) for n in re.findall(r"__hicache_run\.started \| float > (\d+)", _deploy_play_lock()["when"])]
    assert ages == [hicache_lock.DEFAULT_STALE_AFTER // 2]
    assert _deploy_play_lock()["hicache.deploy.hicache_lock"] == {"state": "acquired", "run_id": "{{ __hicache_run.id }}",
                                                                 "holder": "{{ __hicache_run.holder }}"}
