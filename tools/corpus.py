"""Byte-level text corpus from the Python standard library (the .py and .txt files that ship with
CPython), deterministic: files in sorted relative-path order; a file is held out for evaluation when
crc32(relative path) % 20 == 0 (about 5 % of the files, never seen in training).

Tokens: bytes 0..255, and BOS (256) before every file. `pack` writes the corpus to one compressed
.npz (so that another machine with another Python trains on the very same text); `load` reads either.
"""

from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

import numpy as np
import torch

BOS = 256
HOLDOUT_MOD = 20


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[str]:
    root = Path(root or stdlib_dir())
    skip = {"site-packages", "dist-packages", "__pycache__"}
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if p.suffix in (".py", ".txt") and p.is_file() and not skip.intersection(rel.parts):
            out.append(rel.as_posix())
    return sorted(out)


def is_heldout(rel: str) -> bool:
    return zlib.crc32(rel.encode()) % HOLDOUT_MOD == 0


def _join(root: Path, files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    blobs = [(root / f).read_bytes() for f in files]
    starts = np.cumsum([0] + [len(b) for b in blobs[:-1]]).astype(np.int64)
    return np.frombuffer(b"".join(blobs), dtype=np.uint8), starts


def pack(path, root: Path | None = None) -> dict:
    root = Path(root or stdlib_dir())
    files = stdlib_files(root)
    train = [f for f in files if not is_heldout(f)]
    held = [f for f in files if is_heldout(f)]
    tr, tr_s = _join(root, train)
    he, he_s = _join(root, held)
    np.savez_compressed(path, train=tr, train_starts=tr_s, heldout=he, heldout_starts=he_s,
                        source=np.frombuffer(str(root).encode(), dtype=np.uint8))
    return {"train_files": len(train), "heldout_files": len(held), "train_bytes": int(tr.size),
            "heldout_bytes": int(he.size)}


def _tokens(data: np.ndarray, starts: np.ndarray) -> torch.Tensor:
    """Insert BOS before each file."""
    out = np.empty(data.size + starts.size, dtype=np.int16)
    pos = starts + np.arange(starts.size)          # where each BOS lands
    mask = np.ones(out.size, dtype=bool)
    mask[pos] = False
    out[pos] = BOS
    out[mask] = data
    return torch.from_numpy(out.astype(np.int64))


def load(path=None, root: Path | None = None) -> dict:
    """{"train": LongTensor, "heldout": LongTensor, "source": str} from a packed .npz, or straight from
    the standard library of the running Python when path is None."""
    if path is not None:
        z = np.load(path)
        return {"train": _tokens(z["train"], z["train_starts"]), "heldout": _tokens(z["heldout"], z["heldout_starts"]),
                "source": f"{path} ({bytes(z['source']).decode()})"}
    root = Path(root or stdlib_dir())
    files = stdlib_files(root)
    tr = _join(root, [f for f in files if not is_heldout(f)])
    he = _join(root, [f for f in files if is_heldout(f)])
    return {"train": _tokens(*tr), "heldout": _tokens(*he), "source": str(root)}


def heldout(root: Path | None = None, max_tokens: int | None = None) -> torch.Tensor:
    """The held-out tokens only (reads just the held-out files of this Python's standard library)."""
    root = Path(root or stdlib_dir())
    toks = _tokens(*_join(root, [f for f in stdlib_files(root) if is_heldout(f)]))
    return toks if max_tokens is None else toks[:max_tokens]
