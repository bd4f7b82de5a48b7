"""Lists blocks of six or more lines of the same shape that occur in two places of ``engine/`` and ``demo/``.

    python tools/duplicates.py            # every duplicated block: where, and its first line
    python tools/duplicates.py --lines 8  # longer blocks only

"Same shape": the lines are compared after names, numbers and strings are replaced by placeholders, so a block
copied and renamed is found. Blank lines, comments, docstrings, imports and decorators are skipped, and so are
function signatures, argparse option lines and declarations (dataclass fields, table entries, a name set
to a literal, continuation lines ending in a comma: arguments, parameters, table rows) are data, not logic. Standard library
only. Exit status 1 when anything is found.
"""
from __future__ import annotations

import io
import keyword
import sys
import tokenize
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
SKIP_PREFIXES = ("import ", "from ", "@", "def ", "async def ", "class ", "return ", "raise ", "else:", "try:",
                 "finally:", "except", "p.add_argument(", "ap.add_argument(", "sp.add_argument(", "parser.add_argument(")


DATA_TOKENS = {"S", "0", ",", "(", ")", "[", "]", "{", "}", ":", "N", "=", "-", "+", "."}


def _shape(line: str) -> str:
    """The line with every name, number and string replaced by a placeholder (keywords kept)."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if tok.type == tokenize.NAME:
                out.append(tok.string if keyword.iskeyword(tok.string) else "N")
            elif tok.type == tokenize.NUMBER:
                out.append("0")
            elif tok.type == tokenize.STRING:
                out.append("S")
            elif tok.type in (tokenize.OP,):
                out.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return line.strip()
    return " ".join(out)


def _code_lines(path: Path) -> List[Tuple[int, str]]:
    """(line number, shape) of the lines that count, docstrings and skipped kinds left out."""
    lines, in_doc = [], None
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        s = raw.strip()
        if in_doc:
            if in_doc in s:
                in_doc = None
            continue
        if s.startswith(('"""', "'''")):
            quote = s[:3]
            if not (len(s) > 3 and s.endswith(quote)):
                in_doc = quote
            continue
        if not s or s.startswith("#") or s.startswith(SKIP_PREFIXES) or len(s) < 12 or s.endswith(","):
            continue
        shape = _shape(s)
        if shape.startswith(("N :", "S :")) or shape.split().count("N") <= 1 and not set(shape.split()) - DATA_TOKENS:
            continue  # declarations (dataclass fields, dict/list entries) are data, not logic
        lines.append((n, shape))
    return lines


def find(root: Path = ROOT, window: int = 6) -> List[List[Tuple[str, int]]]:
    """Groups of places [(file, first line)] whose next ``window`` counted lines have the same shape."""
    seen: Dict[Tuple[str, ...], List[Tuple[str, int]]] = {}
    for path in sorted((root / "engine").rglob("*.py")) + sorted((root / "demo").rglob("*.py")):
        lines = _code_lines(path)
        rel = path.relative_to(root).as_posix()
        for i in range(len(lines) - window + 1):
            key = tuple(shape for _, shape in lines[i:i + window])
            seen.setdefault(key, []).append((rel, lines[i][0]))
    groups = []
    for places in seen.values():
        distinct = []
        for f, n in places:  # overlapping windows of the same run count once
            if not any(f == g and abs(n - m) < window for g, m in distinct):
                distinct.append((f, n))
        if len(distinct) > 1:
            groups.append(distinct)
    # a longer duplicated run shows up as several consecutive windows: keep the first of each run
    groups.sort()
    kept, last = [], None
    for g in groups:
        if last is not None and len(g) == len(last) and all(a[0] == b[0] and 0 < a[1] - b[1] <= window
                                                             for a, b in zip(g, last)):
            last = g
            continue
        kept.append(g)
        last = g
    return kept


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    window = int(argv[argv.index("--lines") + 1]) if "--lines" in argv else 6
    groups = find(window=window)
    for g in groups:
        print("duplicated block: " + ", ".join(f"{f}:{n}" for f, n in g))
    print(f"{len(groups)} duplicated block(s) of {window}+ lines of the same shape")
    return 1 if groups else 0


if __name__ == "__main__":
    raise SystemExit(main())
