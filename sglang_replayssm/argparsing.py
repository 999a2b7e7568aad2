"""How the launcher's commands parse their flags (`launch.py`, the Ray scheduler, `local_cluster`).

* Flags are spelled out in full: argparse's prefix matching is off (`allow_abbrev=False`), so
  `--max-running-request 4` is an unknown flag, never `--max-running-requests`, and a flag meant for SGLang or
  for the replicas' engines is never taken for one of ours that happens to start the same way (what the launcher
  hands to SGLang: `launch_flags.sglang_flag_problems`).
* An error is one line, `PROG: error: MESSAGE`, exit status 2 (argparse would print the whole usage
  first); an unknown flag close to a known one adds `(did you mean --x?)`.

Standard library only.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Iterable, NoReturn

LAUNCH_PROG = "python -m sglang_replayssm.launch"


def suggestion(word: str, known: Iterable[str]) -> str | None:
    """The known flag closest to `word` (an unknown `--flag` or `--flag=value`), or None."""
    name = word.split("=", 1)[0]
    if not name.startswith("--"):
        return None
    close = difflib.get_close_matches(name, [k for k in known if k.startswith("--")], n=1, cutoff=0.75)
    return close[0] if close else None


def unknown_flags_message(words: list[str], known: Iterable[str]) -> str:
    """'unrecognized arguments: ...' with a "did you mean" for the first unknown flag that has one."""
    known = list(known)
    hint = next((s for s in (suggestion(w, known) for w in words) if s), None)
    text = f"unrecognized arguments: {' '.join(words)}"
    return f"{text} (did you mean {hint}?)" if hint else text


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations, whose errors are one line."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("prog", LAUNCH_PROG)
        super().__init__(*args, **kwargs)

    def known_flags(self) -> list[str]:
        return [s for action in self._actions for s in action.option_strings]

    def error(self, message: str) -> NoReturn:
        m = re.match(r"unrecognized arguments: (.*)$", message)
        if m:
            message = unknown_flags_message(m.group(1).split(), self.known_flags())
        print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value `flag` takes in `argv` (`--flag VALUE` or `--flag=VALUE`; the last one wins), None if absent."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value
