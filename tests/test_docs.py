"""The documentation is checked like code: the site builds strictly, the CLI it documents has help text
everywhere, and the examples marked runnable run.

A runnable example is a ```sh block preceded by ``<!-- run: topic=NAME group=NAME table=NAME -->``: each listed
name is replaced by a fresh one, then each line runs in bash against the session stack and must exit 0
(docs/contributing.md, "Runnable blocks").
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import _kdg_env

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUN_MARK = re.compile(r"^<!-- run:(?P<names>[^>]*)-->\n```(?:sh|bash|console)\n(?P<body>.*?)^```", re.M | re.S)


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runnable_blocks() -> list[tuple[str, str, dict[str, str]]]:
    """(page:line, the block's text, {name in the page: kind}) for every block marked runnable."""
    blocks = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for m in RUN_MARK.finditer(text):
            names = dict(reversed(pair.split("=", 1)) for pair in m["names"].split())
            where = f"{page.relative_to(DOCS)}:{text.count(chr(10), 0, m.start()) + 1}"
            blocks.append((where, m["body"], names))
    return blocks


def test_the_site_builds_strictly(tmp_path):
    """A broken link or anchor, a nav entry without its page, or a Python reference that does not resolve fails."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    assert mkdocs.exists(), "mkdocs is missing: make setup installs the docs extra (pip install -e '.[docs]')"
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    index = (tmp_path / "site" / "search" / "search_index.json").read_text()
    assert "exactly-once" in index
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "kdg spark-stream" in cli and "--batch-size" in cli, "the CLI reference was not generated"


def test_every_command_and_option_has_help_text():
    missing = []
    for path, cmd in _hooks().command_tree():
        if not (cmd.help or cmd.short_help):
            missing.append(" ".join(path))
        missing += [f"{' '.join(path)} {p.opts[0] if p.opts else p.name}" for p in cmd.params
                    if not getattr(p, "hidden", False) and not (getattr(p, "help", None) or "").strip()]
    assert not missing, "no help text (the CLI reference is made from it): " + ", ".join(missing)


def test_the_readme_stays_short_and_links_each_section_to_its_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    sections = re.split(r"^## ", readme, flags=re.M)[1:]
    for section in sections:
        assert "](docs/" in section or "](CHANGELOG.md)" in section, f"README section without a link: {section[:40]!r}"
    for target in re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)", readme):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    make = (ROOT / "Makefile").read_text()
    assert "make demo" in readme and "make test" in readme and "\ndemo:" in make and "\ntest:" in make


def test_the_runnable_examples_are_found():
    assert len(runnable_blocks()) >= 2


@pytest.mark.parametrize("where,body,names", runnable_blocks(), ids=[b[0] for b in runnable_blocks()])
def test_runnable_example(where, body, names, session_stack):
    tag = uuid.uuid4().hex[:8]
    for name, kind in names.items():
        fresh = f"{name}_{tag}" if kind == "table" else f"{name}-{tag}"
        body = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", fresh, body)
    env = _kdg_env(session_stack, {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert shutil.which("kdg", path=env["PATH"]), "kdg is not installed next to this Python"
    for line in (raw.strip() for raw in body.splitlines()):
        if not line or line.startswith("#"):
            continue
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", line], capture_output=True, text=True, env=env,
                              timeout=300, cwd=ROOT)
        assert proc.returncode == 0, f"{where}: `{line}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
