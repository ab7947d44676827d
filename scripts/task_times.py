#!/usr/bin/env python3
"""Print where a lab stage spent its time, from lab/callback_plugins/task_times.py's JSON lines.

usage: scripts/task_times.py FILE [N]   (the N slowest tasks, summed over hosts' repeats, default 15)
"""

import collections
import json
import sys


def summarize(rows, top):
    by_task = collections.defaultdict(lambda: [0.0, 0])
    for row in rows:
        key = (row["play"][:50], row["task"][:70])
        by_task[key][0] += row["seconds"]
        by_task[key][1] += 1
    slowest = sorted(by_task.items(), key=lambda item: -item[1][0])[:top]
    lines = ["%8s %5s  %s" % ("seconds", "runs", "play / task")]
    lines += ["%8.1f %5d  %s / %s" % (total, runs, play, task) for (play, task), (total, runs) in slowest]
    return lines


def main(argv):
    path, top = argv[1], int(argv[2]) if len(argv) > 2 else 15
    try:
        with open(path, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return 0
    if rows:
        span = max(r["started"] + r["seconds"] for r in rows) - min(r["started"] for r in rows)
        print("slowest tasks (%d task runs over %.0f s; %s):" % (len(rows), span, path))
        print("\n".join(summarize(rows, top)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
