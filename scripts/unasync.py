"""Generate the sync face (``redisbus/_sync``) from the async one (``redisbus/_async``).

The async code is the one source; this rewrites it token by token, as httpcore's
``scripts/unasync.py`` does: ``async``/``await`` go, ``Async``-prefixed names lose the prefix,
and the per-face modules (``_tasks_async``, ``_transport_async``) become their hand-written
sync twins. A line marked ``# unasync: remove`` exists only on the async face. The output is
run through ``ruff format`` so that it reads (and lints) like hand-written code. A rule of
``WORDS`` that no longer matches anything in the source fails both commands: remove it.

    python scripts/unasync.py           # regenerate
    python scripts/unasync.py --check   # exit 1 when a generated file is stale (make lint, tests)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "redisbus" / "_async"
TARGET = ROOT / "redisbus" / "_sync"

# whole-word replacements, applied in one pass
WORDS = {
    "AsyncBus": "Bus",
    "AsyncChannel": "Channel",
    "AsyncAgent": "Agent",
    "aclose": "close",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "async_client": "sync_client",
    "_tasks_async": "_tasks_sync",
    "_transport_async": "_transport_sync",
}
_WORD = re.compile(r"\b(" + "|".join(re.escape(w) for w in WORDS) + r")\b")
_KEYWORDS = [
    (re.compile(r"\basync def\b"), "def"),
    (re.compile(r"\basync (with|for)\b"), r"\1"),
    (re.compile(r"\bawait "), ""),
]
_REMOVE = "# unasync: remove"


def header(path: Path) -> str:
    rel = path.relative_to(ROOT).as_posix()
    return f"# Generated from {rel} by scripts/unasync.py: do not edit.\n"


def unasync_text(text: str, used: set[str] | None = None) -> str:
    """The sync twin of ``text``; the ``WORDS`` it rewrote are added to ``used``."""
    seen = used if used is not None else set()

    def word(m: re.Match[str]) -> str:
        seen.add(m.group(1))
        return WORDS[m.group(1)]

    out = []
    for line in text.splitlines(keepends=True):
        if line.rstrip().endswith(_REMOVE):
            continue
        for pattern, repl in _KEYWORDS:
            line = pattern.sub(repl, line)
        out.append(_WORD.sub(word, line))
    return "".join(out)


def ruff_format(text: str, name: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", name, "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout


def generated() -> dict[Path, str]:
    """Every file of the sync face, as it should be."""
    files = {}
    for src in sorted(SOURCE.glob("*.py")):
        dest = TARGET / src.name
        text = header(src) + unasync_text(src.read_text())
        files[dest] = ruff_format(text, str(dest.relative_to(ROOT)))
    return files


def unused_words(sources: list[str]) -> list[str]:
    """The rules of ``WORDS`` that rewrite nothing in ``sources`` (each a file's text)."""
    used: set[str] = set()
    for text in sources:
        unasync_text(text, used)
    return [w for w in WORDS if w not in used]


def stale() -> list[Path]:
    """Generated files that differ from their source (or are missing, or left over)."""
    want = generated()
    out = [p for p, text in want.items() if not p.exists() or p.read_text() != text]
    out += [p for p in sorted(TARGET.glob("*.py")) if p not in want]
    return out


def _say_unused() -> bool:
    unused = unused_words([src.read_text() for src in sorted(SOURCE.glob("*.py"))])
    for w in unused:
        print(f"unused rule: {w!r} -> {WORDS[w]!r} matches nothing in {SOURCE.relative_to(ROOT)}")
    return bool(unused)


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        bad = stale()
        for p in bad:
            print(f"stale: {p.relative_to(ROOT)} (run: python scripts/unasync.py)")
        return 1 if _say_unused() or bad else 0
    if argv[1:]:
        print(__doc__)
        return 2
    TARGET.mkdir(exist_ok=True)
    for p, text in generated().items():
        p.write_text(text)
    for p in sorted(TARGET.glob("*.py")):
        if not (SOURCE / p.name).exists():
            p.unlink()
    return 1 if _say_unused() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
