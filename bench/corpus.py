"""The benchmark corpus: 4,849 real English texts, the docstrings of the running Python's standard library.

Made here, from the interpreter's own source files, so that a fresh clone measures with nothing beside it: each
module's, class's and function's docstring in file order (files sorted, the test suites and IDLE left out), up to
its first two paragraphs, its whitespace collapsed to single spaces, 20 to 1,700 characters long, each text once.
The lengths spread as short search documents do (median ~100 characters, mean ~140, a tail of a few hundred
tokens that the model cuts at 256). The standard
library is the Python Software Foundation's, under the PSF License Agreement, which permits this use.

Another Python version gives a slightly different corpus: ratios measured side by side in one run use the same
texts, which is all a bench row compares. `--corpus FILE` (a JSON list of strings) measures on texts of your own.

    python bench/corpus.py [--out corpus.json]    # print the count and lengths, or write the texts as JSON
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sysconfig
import warnings
from functools import lru_cache
from pathlib import Path

SIZE = 4849
MIN_CHARS, MAX_CHARS = 20, 1700
SKIPPED = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo", "__phello__"}


def _files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*.py")
                  if not SKIPPED & set(path.relative_to(root).parts[:-1]) and not path.name.startswith("test_"))


def _docstrings(path: Path):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in old sources
            tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    defined = [node for node in ast.walk(tree) if isinstance(node, kinds)]
    for node in [tree, *sorted(defined, key=lambda n: n.lineno)]:
        text = ast.get_docstring(node, clean=True)
        if text:
            yield " ".join(" ".join(text.split("\n\n")[:2]).split())


@lru_cache(maxsize=1)
def stdlib_docstrings(size: int = SIZE) -> tuple[str, ...]:
    """The first `size` docstrings of the standard library that qualify (see the module's docstring)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    seen: dict[str, None] = {}
    for path in _files(root):
        for text in _docstrings(path):
            if MIN_CHARS <= len(text) <= MAX_CHARS:
                seen.setdefault(text)
                if len(seen) == size:
                    return tuple(seen)
    if len(seen) < size // 2:
        raise SystemExit(f"the standard library at {root} gave {len(seen)} docstrings, fewer than half of {size}: "
                         "pass --corpus FILE (a JSON list of strings)")
    return tuple(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="write the texts here as a JSON list")
    args = parser.parse_args()
    texts = stdlib_docstrings()
    lengths = sorted(map(len, texts))
    print(f"{len(texts)} texts, {sum(lengths):,} characters; length median {statistics.median(lengths):g}, "
          f"deciles {lengths[len(lengths) // 10::len(lengths) // 10][:9]}")
    if args.out:
        args.out.write_text(json.dumps(list(texts)))
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
