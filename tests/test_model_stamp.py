"""plugins/modules/hicache_model_stamp.py: a hub download counts as done only when its stamp names the wanted
repo and revision and every file it lists is there at its size; a partial or failed download has no stamp."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from support import ROOT

MODULE_PATH = ROOT / "plugins/modules/hicache_model_stamp.py"
_spec = importlib.util.spec_from_file_location("hicache_model_stamp_under_test", MODULE_PATH)
stamp_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stamp_module)

REPO = "Qwen/Qwen2.5-0.5B-Instruct"


def run(directory, state, repo=REPO, revision=None, check_mode=False) -> dict:
    """The module as Ansible runs it: a fresh Python process given its arguments."""
    args = {"dir": str(directory), "repo": repo, "state": state, "_ansible_check_mode": check_mode}
    if revision:
        args["revision"] = revision
    args_file = directory.parent.parent / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run([sys.executable, str(MODULE_PATH), str(args_file)], capture_output=True, text=True, timeout=60)
    return json.loads(proc.stdout)


def fake_download(directory, files):
    """What `hf download --local-dir` leaves: the files and its own .cache bookkeeping."""
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (directory / ".cache/huggingface/download").mkdir(parents=True, exist_ok=True)
    (directory / ".cache/huggingface/download/config.json.metadata").write_text("etag\n")


@pytest.fixture
def model_dir(tmp_path):
    return tmp_path / "models" / "qwen"


def test_download_then_current_then_each_change_detected(model_dir):
    first = run(model_dir, "inspect")
    assert first["current"] is False and first["action"] == "resume" and "has not been downloaded" in first["reason"] and first["changed"] is False
    assert not model_dir.exists()  # inspect changes nothing

    begun = run(model_dir, "begin")
    assert begun["changed"] and model_dir.is_dir() and (model_dir / ".hicache-downloading").exists() and not (model_dir / ".hicache-downloaded").exists()
    fake_download(model_dir, {"config.json": '{"a": 1}', "model-00001.safetensors": "x" * 100, "sub/tokenizer.json": "{}"})
    unfinished = run(model_dir, "inspect")
    assert unfinished["current"] is False and unfinished["action"] == "resume" and "did not finish" in unfinished["reason"]

    finished = run(model_dir, "finish")
    assert finished["changed"] and finished["files"] == 3 and finished["bytes"] == 8 + 100 + 2
    stamp = json.loads((model_dir / ".hicache-downloaded").read_text())
    assert stamp["repo"] == REPO and stamp["revision"] is None
    assert stamp["files"] == {"config.json": 8, "model-00001.safetensors": 100, "sub/tokenizer.json": 2}  # no .cache, no marker
    assert not (model_dir / ".hicache-downloading").exists()
    assert oct((model_dir / ".hicache-downloaded").stat().st_mode & 0o777) == "0o600"

    again = run(model_dir, "inspect")
    assert again["current"] is True and again["action"] == "none" and again["changed"] is False
    assert run(model_dir, "begin")["changed"] is False  # nothing to do when current

    (model_dir / "model-00001.safetensors").write_text("x" * 50)  # truncated
    truncated = run(model_dir, "inspect")
    assert truncated["current"] is False and truncated["action"] == "resume" and "model-00001.safetensors: 50 bytes, the download had 100" in truncated["reason"]

    (model_dir / "sub/tokenizer.json").unlink()
    gone = run(model_dir, "inspect")
    assert "sub/tokenizer.json: missing" in gone["reason"]

    resumed = run(model_dir, "begin")  # same repo and revision: the files stay, hf fetches what changed
    assert resumed["changed"] and (model_dir / "config.json").exists() and not (model_dir / ".hicache-downloaded").exists()


def test_another_repo_or_revision_downloads_into_an_emptied_directory(model_dir):
    run(model_dir, "begin")
    fake_download(model_dir, {"config.json": "{}", "old.safetensors": "old"})
    run(model_dir, "finish")

    other_revision = run(model_dir, "inspect", revision="v2")
    assert other_revision["current"] is False and other_revision["action"] == "clean"
    assert f"holds {REPO} (default branch), the inventory wants {REPO}@v2" in other_revision["reason"]
    other_repo = run(model_dir, "inspect", repo="other/model")
    assert other_repo["action"] == "clean" and "the inventory wants other/model (default branch)" in other_repo["reason"]

    run(model_dir, "begin", repo="other/model")
    assert sorted(os.listdir(model_dir)) == [".hicache-downloading"]  # old weights, hf's .cache and the stamp gone; the directory kept
    fake_download(model_dir, {"config.json": '{"b": 2}'})
    run(model_dir, "finish", repo="other/model")
    assert run(model_dir, "inspect", repo="other/model")["current"] is True
    assert run(model_dir, "inspect")["action"] == "clean"


def test_an_unfinished_download_of_another_repo_is_not_resumed(model_dir):
    run(model_dir, "begin", repo="other/model")
    fake_download(model_dir, {"partial.safetensors": "p"})  # hf failed here: no finish, no stamp
    state = run(model_dir, "inspect")
    assert state["action"] == "clean" and "unfinished download of other/model" in state["reason"]
    run(model_dir, "begin")
    assert not (model_dir / "partial.safetensors").exists()


def test_check_mode_changes_nothing(model_dir):
    assert run(model_dir, "begin", check_mode=True)["changed"] is True and not model_dir.exists()
    model_dir.mkdir(parents=True)
    assert run(model_dir, "finish", check_mode=True)["changed"] is True and not (model_dir / ".hicache-downloaded").exists()


def test_judge_and_read_stamp(tmp_path):
    judge, read_json = stamp_module.judge, stamp_module.read_json
    legacy = tmp_path / "legacy"
    legacy.write_text(REPO + "\n")  # what the first version of the role wrote
    assert read_json(legacy) == {"repo": REPO, "legacy": True}
    assert judge(read_json(legacy), None, REPO, None, "/m")[:2] == (False, "resume")
    assert judge(read_json(legacy), None, "other/model", None, "/m")[:2] == (False, "clean")
    broken = tmp_path / "broken"
    for text in ('{"repo": ', "a\nb\n", "[1]", ""):
        broken.write_text(text)
        assert read_json(broken) == {"invalid": True}, text
    assert judge({"invalid": True}, None, REPO, None, "/m")[:2] == (False, "clean")
    assert read_json(tmp_path / "absent") is None
    assert judge(None, None, REPO, "main", "/m") == (False, "resume", f"{REPO}@main has not been downloaded into /m")
    # revision None and "" are the same (the hub's default branch)
    assert judge({"repo": REPO, "revision": "", "files": {}}, None, REPO, None, "/m")[0] is True


def test_missing_files_stats_only():
    sizes = {"/m/a": 1, "/m/b": 2}

    def stat(path):
        if path not in sizes:
            raise FileNotFoundError(path)
        return type("S", (), {"st_size": sizes[path]})()

    assert stamp_module.missing_files({"a": 1, "b": 3, "c": 1}, "/m", stat) == ["b: 2 bytes, the download had 3", "c: missing"]


def test_empty_directory_refuses_root():
    with pytest.raises(ValueError):
        stamp_module.empty_directory("/")


def test_the_lock_of_a_shared_directory_survives_a_clean_and_is_no_file_of_the_model(model_dir):
    """roles/model/tasks/weights.yml holds hicache_lock's file (and its guard) in a shared model directory while the
    download's begin empties it for another repository: both stay, and finish does not record them as the model's."""
    from hicachectl.ops import rolling

    assert stamp_module.DOWNLOAD_LOCK == rolling.DOWNLOAD_LOCK  # the role's lock path and the module agree
    run(model_dir, "begin")
    fake_download(model_dir, {"config.json": "{}"})
    run(model_dir, "finish")
    held = {stamp_module.DOWNLOAD_LOCK: '{"run_id": "r/gpu-01"}', f"{stamp_module.DOWNLOAD_LOCK}.guard": ""}
    for name, text in held.items():
        (model_dir / name).write_text(text)
    run(model_dir, "begin", repo="other/model")  # another repository: the directory is emptied
    assert sorted(os.listdir(model_dir)) == sorted([".hicache-downloading", *held])
    fake_download(model_dir, {"config.json": '{"b": 2}'})
    finished = run(model_dir, "finish", repo="other/model")
    assert sorted(finished["stamp"]["files"]) == ["config.json"]
