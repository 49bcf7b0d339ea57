"""A shard's answered groups (make_data.py's group-NNNNNNN.jsonl.xz) as one JSONL file for training.

    python recipes/smollm2_drafters/groups.py ANSWERS_DIR OUT.jsonl [--expect N]

Exits 1 without writing when fewer than N rows are there (the shard is not done yet);
more than N (a longer earlier run) keeps the first N.
"""

import argparse
import lzma
import sys
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--expect", type=int, default=0, help="rows the shard must hold (0: whatever is there)")
    args = ap.parse_args()
    lines = [line for f in sorted(args.folder.glob("group-*.jsonl.xz"))
             for line in lzma.decompress(f.read_bytes()).decode().splitlines() if line.strip()]
    if len(lines) < args.expect or not lines:
        print(f"{args.folder}: {len(lines)} of {args.expect or 'some'} rows answered", file=sys.stderr)
        sys.exit(1)
    lines = lines[: args.expect] if args.expect else lines
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
