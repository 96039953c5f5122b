"""Two runs of a replay's metrics (`philly_replay.py --json`, `plinth sim --json`), policy by
policy: which metrics differ. Timing fields (wall and CPU seconds) are left out; every other
field must be equal for "identical".

    python bench/replay_diff.py BEFORE.json AFTER.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TIMING = ("wall", "sim_s", "seconds", "cpu", "policy_s", "load")


def timing(key: str) -> bool:
    return any(t in key for t in TIMING)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    args = ap.parse_args(argv)
    before, after = ({r["policy"]: r for r in json.loads(Path(p).read_text())}
                     for p in (args.before, args.after))
    print(f"{'policy':<10} {'metrics compared':>16}  result")
    same_all = True
    for policy, row in before.items():
        if policy not in after:
            print(f"{policy:<10} {'-':>16}  missing after")
            same_all = False
            continue
        keys = [k for k in row if not timing(k)]
        diff = [k for k in keys if row[k] != after[policy].get(k)]
        same_all &= not diff
        print(f"{policy:<10} {len(keys):>16}  "
              f"{'identical' if not diff else 'differs: ' + ', '.join(diff)}")
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
