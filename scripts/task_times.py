"""Print where a lab stage spent its time, from lab/callback_plugins/task_times.py's JSON lines.

usage: python3 scripts/task_times.py FILE [N]   (the N costliest tasks by CPU, summed over repeats, default 15)
"""

import collections
import json
import sys


def cpu(row):
    """CPU seconds the task cost: the controller's and the lab hosts' it ran on."""
    return row.get("cpu_controller", 0.0) + sum(row.get("cpu_hosts", {}).values())


def summarize(rows, top, key=cpu):
    by_task = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        name = (row["play"][:40], row["task"][:70])
        by_task[name][0] += row["seconds"]
        by_task[name][1] += cpu(row)
        by_task[name][2] += 1
    order = 1 if key is cpu else 0
    slowest = sorted(by_task.items(), key=lambda item: -item[1][order])[:top]
    lines = ["%8s %8s %5s  %s" % ("wall s", "CPU s", "runs", "play / task")]
    lines += [
        "%8.1f %8.1f %5d  %s / %s" % (wall, used, runs, play, task) for (play, task), (wall, used, runs) in slowest
    ]
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
        print(
            "costliest tasks by CPU (%d task runs over %.0f s, %.0f CPU s; %s):"
            % (len(rows), span, sum(cpu(r) for r in rows), path)
        )
        print("\n".join(summarize(rows, top)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
