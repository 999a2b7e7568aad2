"""Give result JSONs the `meta` that bench/README.md promises (command, device, time, commit) before they are
committed to bench/results/ (tests/bench/test_results_meta.py checks every committed file).

    python bench/stamp_meta.py bench/results/NEW.json [...]              # commit = git rev-parse HEAD
    python bench/stamp_meta.py --commit <hash> bench/results/NEW.json

Device runs get a working tree without .git, so the commit of the code that ran is added here: commit the code
first, then stamp and commit the results. A file without `meta` gets one from its own top-level `command`,
`device` (or `device_name`) and `time`; a field that is nowhere is an error naming it (fill it by hand, and mark
hand-filled fields with `"reconstructed": true` and `reconstructed_from`). A `meta` that has a commit is left as is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

FIELDS = ("command", "device", "time")


def stamp(data: dict, commit: str) -> dict:
    """`data` with a complete meta; ValueError naming a field that cannot be found."""
    meta = dict(data["meta"]) if isinstance(data.get("meta"), dict) else {}
    for key in FIELDS:
        if key in meta or (key in ("command", "time") and meta.get("calls")):
            continue
        value = data.get(key)
        if value is None and key == "device":
            value = data.get("device_name")
        if value is None:
            raise ValueError(f"no {key}: add meta.{key} by hand")
        meta[key] = value
    meta.setdefault("commit", commit)
    return {"meta": meta, **{k: v for k, v in data.items() if k != "meta"}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--commit", default=None, help="the commit of the code that ran (default: git rev-parse HEAD)")
    args = ap.parse_args(argv)
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                           check=True).stdout.strip()
    failed = 0
    for path in args.files:
        text = path.read_text()
        try:
            out = stamp(json.loads(text), commit)
        except ValueError as e:
            print(f"{path}: {e}", file=sys.stderr)
            failed += 1
            continue
        lines = text.splitlines()
        indent = (len(lines[1]) - len(lines[1].lstrip())) if len(lines) > 1 else 0
        path.write_text(json.dumps(out, indent=indent or None) + "\n")
        print(f"{path}: meta.commit {out['meta']['commit']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
