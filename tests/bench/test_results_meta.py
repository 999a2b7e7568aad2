"""Every committed result JSON in bench/results/ says how it was made (bench/README.md claims it): a `meta`
object with the command, the device, the time and the git commit of the numbers. A merged file may give
command and time per call (`meta.calls`). Values filled in after the run say so (`reconstructed: true`
and `reconstructed_from`)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "bench" / "results").glob("*.json"))
HOW = ("give it a `meta` with command, device, time and commit: python bench/stamp_meta.py FILE "
       "(bench/README.md, 'Result files')")


def nonempty(value) -> bool:
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, str) and v.strip() for v in value)
    return isinstance(value, str) and bool(value.strip())


def test_there_are_results():
    assert len(RESULTS) >= 20, RESULTS


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_result_has_meta(path):
    data = json.loads(path.read_text())
    assert isinstance(data, dict) and isinstance(data.get("meta"), dict), f"{path.name}: no meta; {HOW}"
    meta = data["meta"]
    assert nonempty(meta.get("device")), f"{path.name}: meta.device missing; {HOW}"
    assert re.fullmatch(r"[0-9a-f]{40}", str(meta.get("commit", ""))), f"{path.name}: meta.commit is not a full hash; {HOW}"
    calls = meta.get("calls")
    if calls is not None and not ("command" in meta and "time" in meta):
        assert calls and all(nonempty(c.get("command")) and nonempty(c.get("time")) for c in calls), path.name
    else:
        assert nonempty(meta.get("command")), f"{path.name}: meta.command missing; {HOW}"
        assert nonempty(meta.get("time")), f"{path.name}: meta.time missing; {HOW}"
        assert re.search(r"20\d\d-\d\d-\d\d", json.dumps(meta["time"])), f"{path.name}: meta.time has no date"
    if meta.get("reconstructed"):
        assert nonempty(meta.get("reconstructed_from")), f"{path.name}: reconstructed without saying from what"


def test_meta_commits_exist_in_history():
    """A reconstructed commit names a real commit of this repository (where the clone has its history)."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git history here")
    commits = {json.loads(p.read_text())["meta"]["commit"] for p in RESULTS}
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch-check"], input="\n".join(sorted(commits)) + "\n",
                       capture_output=True, text=True, timeout=30)
    missing = [ln for ln in r.stdout.splitlines() if ln.endswith(" missing")]
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True, timeout=30).stdout.strip() == "true"
    if missing and shallow:
        pytest.skip("a shallow clone lacks the history")
    assert not missing, missing


def test_stamp_meta_completes_a_new_result(tmp_path):
    """bench/stamp_meta.py (what a new result gets before it is committed) gives the meta this file checks."""
    import subprocess
    import sys

    new = tmp_path / "new.json"
    new.write_text(json.dumps({"command": "python bench/x.py", "device_name": "NVIDIA H200",
                               "time": "2026-12-03 10:00:00 UTC", "rows": [1]}, indent=1))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"rows": []}))
    commit = "0123456789abcdef0123456789abcdef01234567"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "stamp_meta.py"), "--commit", commit, str(new), str(bare)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "bare.json: no command" in r.stderr, (r.stdout, r.stderr)
    test_result_has_meta(new)
    data = json.loads(new.read_text())
    assert data["meta"] == {"command": "python bench/x.py", "device": "NVIDIA H200", "time": "2026-12-03 10:00:00 UTC",
                            "commit": commit} and data["rows"] == [1]
    assert json.loads(bare.read_text()) == {"rows": []}   # left untouched
