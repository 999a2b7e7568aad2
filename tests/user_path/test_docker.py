"""deploy/Dockerfile and .dockerignore (issue 32): the build context leaves out what an image must not carry
(.git, virtual environments, caches, device folders, benchmark results) and keeps what the Dockerfile copies;
the image installs the extras README's Ray cluster section installs, and README's docker commands are the
Dockerfile's own. (`docker build` itself does not run in CI: no Docker daemon there.)"""

import fnmatch
import json
import re
import shlex
import tomllib

from tests.user_path.readme import ROOT, argv, commands, join_lines, pip_extras

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
IGNORE = ROOT / ".dockerignore"


def ignore_patterns() -> list[str]:
    return [ln.strip() for ln in IGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def excluded(path: str, patterns: list[str]) -> bool:
    """Docker's rule for a context path (no `!` exceptions used here): a pattern matches the path or one of
    its parent folders; `**/` matches any number of folders."""
    parts = path.split("/")
    for pat in patterns:
        assert not pat.startswith("!"), "exceptions are not modelled by this test"
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatch(prefix, pat) or (pat.startswith("**/") and fnmatch.fnmatch(parts[i - 1], pat[3:])):
                return True
    return False


def instructions() -> list[tuple[str, str]]:
    lines = join_lines("\n".join(ln for ln in DOCKERFILE.read_text().splitlines() if not ln.startswith("#")))
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def header_commands() -> list[str]:
    """The commands shown in the Dockerfile's header comment (`#   cmd`, continuations joined)."""
    text = "\n".join(ln[1:] for ln in DOCKERFILE.read_text().splitlines() if ln.startswith("#   "))
    return join_lines(text)


def test_dockerignore_keeps_out_what_an_image_must_not_carry():
    pats = ignore_patterns()
    for path in (".git/HEAD", ".venv/bin/python", "sub/.venv/lib/x.py", "sglang_replayssm/__pycache__/launch.cpython-311.pyc",
                 "sglang_replayssm/native/x.pyc", ".pytest_cache/v", ".hypothesis/examples/a", ".h200/src/bench/h200/h200_fleet.sh",
                 ".peer/sglang/kernels/ops.py", ".fi/fi.tar.xz", "bench/results/kernels_b256_s8.json", "docs/history/runs.md",
                 "sglang_replayssm.egg-info/PKG-INFO", "tests/conftest.py"):
        assert excluded(path, pats), path


def test_what_the_dockerfile_copies_is_in_the_context():
    pats = ignore_patterns()
    copies = [shlex.split(arg) for op, arg in instructions() if op == "COPY"]
    assert copies
    sources = [s for c in copies for s in c[:-1] if not s.startswith("--")]
    assert set(sources) == {"pyproject.toml", "README.md", "sglang_replayssm"}, sources
    for src in sources:
        assert (ROOT / src).exists() and not excluded(src, pats), src
    # the package and its data files (the built-in tiny models) reach the image
    for path in ("sglang_replayssm/launch.py", "sglang_replayssm/native/assets/tiny-gdn-hybrid/config.json"):
        assert (ROOT / path).exists() and not excluded(path, pats), path


def test_image_installs_the_readme_extras_and_runs_the_readme_command():
    ins = instructions()
    assert ins[0][0] == "FROM" and ins[0][1].startswith("rayproject/ray:2.60.0-"), ins[0]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ray_pin = [d for d in pyproject["project"]["optional-dependencies"]["ray"] if d.startswith("ray")]
    assert ray_pin == ["ray[serve]==2.60.0"], ray_pin   # the base image's Ray is the pinned one
    run = [arg for op, arg in ins if op == "RUN" and "pip install" in arg]
    assert len(run) == 1
    extras = pip_extras(run[0])
    assert extras == {"sglang", "ray"} and extras <= set(pyproject["project"]["optional-dependencies"])
    # README's Ray cluster section installs the same extras on every node
    readme_installs = [c for c in commands("Ray cluster") if "pip install" in c]
    assert readme_installs and all(pip_extras(c) == extras for c in readme_installs), readme_installs
    # README's docker commands are the ones the Dockerfile's header shows, and the run line starts with its CMD
    cmd = json.loads(dict(ins)["CMD"])
    readme_docker = [c for sec in ("Serve on a GPU", "Ray cluster") for c in commands(sec) if c.startswith("docker ")]
    assert [c for c in readme_docker if c.startswith("docker build")] == \
        [c for c in header_commands() if c.startswith("docker build")]
    runs = [c for c in readme_docker if c.startswith("docker run")]
    assert runs and runs == [c for c in header_commands() if c.startswith("docker run")]
    for line in runs:
        words = argv(line)
        tail = words[words.index("sglang-replayssm") + 1:]
        assert tail[:len(cmd)] == cmd, (tail, cmd)
    build = argv(readme_docker[0])
    assert build[:4] == ["docker", "build", "-f", "deploy/Dockerfile"] and build[-1] == "."
    assert re.search(r"-t sglang-replayssm\b", readme_docker[0])
