"""README.md's shell commands, as a user would copy them: the fenced ```bash blocks of a section, with
backslash continuations joined and comments dropped."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def sections(text: str | None = None) -> dict[str, str]:
    """`## Title` -> the section's text (up to the next `## `)."""
    text = README.read_text() if text is None else text
    out: dict[str, str] = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        out[title.strip()] = body
    return out


def join_lines(block: str) -> list[str]:
    """Logical command lines of a shell text: continuations joined, `#` comments and blank lines dropped."""
    lines, cur = [], ""
    for raw in block.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1].strip() + " "
            continue
        cur += line.strip()
        cur = strip_comment(cur).strip()
        if cur:
            lines.append(" ".join(cur.split()))
        cur = ""
    return lines


def strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a `#` outside quotes, after a space or at the start)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def commands(section: str, text: str | None = None) -> list[str]:
    """The logical command lines of every ```bash block of a README section."""
    body = sections(text)[section]
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S):
        out += join_lines(block)
    return out


def argv(line: str) -> list[str]:
    return shlex.split(line)


def pip_extras(line: str) -> set[str]:
    """The extras of a `pip install ... '.[a,b]'` line ({} for a plain `.`)."""
    m = re.search(r"\.\[([a-z,]+)\]", line)
    return set(m.group(1).split(",")) if m else set()
