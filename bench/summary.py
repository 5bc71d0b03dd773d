"""One table from the --json files of bench/throughput.py and bench/nullmodel.py (what bench/device.sh prints).

    python bench/summary.py [--gpu NAME] throughput.json nullmodel.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ratio, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="")
    parser.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args()
    rows, device = [], "?"
    for path in args.files:
        if not path.exists():
            rows.append([f"({path.name} missing: its step failed)", "", "", "", "", ""])
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "rows" in data:  # throughput.py
            device = data["device"]
            for dtype in dict.fromkeys(r["dtype"] for r in data["rows"]):
                by = {r["path"]: r for r in data["rows"] if r["dtype"] == dtype}
                bare, st = by["bare"]["texts_s"], by["sentence-transformers"]["texts_s"]
                rows.append([f"embedfleet end to end ({data['chunk']} texts/request)", dtype,
                             by["embedfleet"]["texts_s"], "", ratio(by["embedfleet"]["texts_s"], bare),
                             ratio(by["embedfleet"]["texts_s"], st)])
                rows.append([f"bare transformers loop, best bs {by['bare']['batch']}", dtype, bare, "", 1.0,
                             ratio(bare, st)])
                rows.append([f"sentence-transformers, best bs {by['sentence-transformers']['batch']}", dtype, st,
                             "", ratio(st, bare), 1.0])
        else:  # nullmodel.py
            for r in data:
                rows.append([f"{r['path']}, {r['texts_per_request']} text(s)/request", "-",
                             r["requests_s"] * r["texts_per_request"], r["requests_s"], "", ""])
    print(table(["path", "dtype", "texts/s", "requests/s", "x bare best", "x ST best"], rows,
                f"{args.gpu or device}: throughput and null-model rows"))


if __name__ == "__main__":
    main()
