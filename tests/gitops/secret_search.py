"""Find every place a secret is: files under given roots, processes' argv and environment, the journal.

Stdlib only: tests/gitops/secret_checks.py runs it on the controller (import) and on a lab host
(``python3 -c <this file> <roots...>``, the secret on stdin, so the search itself never puts the secret
in an argv). Prints one JSON object: {"files": [...], "processes": [...], "journal": [...], "units": [...]}.
"""

import json
import os
import stat
import subprocess
import sys

# Pseudo and device file systems (processes are read through /proc/<pid>/cmdline and environ instead),
# and the journal's files (compressed: read through journalctl instead).
SKIP_DIRS = ("/proc", "/sys", "/dev", "/var/log/journal", "/run/log/journal")
CHUNK = 1 << 20


def file_holds(path, needle):
    """Whether the file's bytes contain needle (read in chunks, overlapping by len(needle) - 1)."""
    keep = len(needle) - 1
    tail = b""
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(CHUNK)
            if not chunk:
                return False
            if needle in tail + chunk:
                return True
            tail = (tail + chunk)[-keep:] if keep else b""


def describe(path):
    info = os.lstat(path)
    return {"path": path, "mode": "%04o" % stat.S_IMODE(info.st_mode), "uid": info.st_uid, "gid": info.st_gid}


def search_files(roots, needle, skip=()):
    """Every regular file under roots (symlinks not followed) whose content holds needle."""
    hits = []
    for root in roots:
        for directory, dirs, files in os.walk(root):
            dirs[:] = sorted(
                name for name in dirs if not os.path.join(directory, name).startswith(SKIP_DIRS + tuple(skip))
            )
            for name in sorted(files):
                path = os.path.join(directory, name)
                try:
                    if stat.S_ISREG(os.lstat(path).st_mode) and file_holds(path, needle):
                        hits.append(describe(path))
                except OSError:
                    continue  # gone meanwhile, or a socket/fifo
    return hits


def search_processes(needle):
    """Processes whose argv or environment holds needle (this one excluded: it holds it in memory only)."""
    hits = []
    for pid in sorted((name for name in os.listdir("/proc") if name.isdigit()), key=int):
        if int(pid) == os.getpid():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open("/proc/%s/%s" % (pid, part), "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            if needle in data:
                try:
                    with open("/proc/%s/cmdline" % pid, "rb") as handle:
                        argv = handle.read().replace(needle, b"<SECRET>").replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    argv = "?"
                hits.append({"pid": int(pid), "where": part, "argv": argv.strip()[:300]})
    return hits


def search_journal(needle):
    """Journal entries (every field: MESSAGE, _CMDLINE, ...) that hold needle, with the unit and fields."""
    proc = subprocess.run(
        ["journalctl", "--no-pager", "-o", "export"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False
    )
    hits = []
    for entry in proc.stdout.split(b"\n\n"):
        if needle not in entry:
            continue
        fields, unit = [], "?"
        for line in entry.split(b"\n"):
            name = line.split(b"=", 1)[0]
            if needle in line:
                fields.append(name.decode(errors="replace"))
            if name in (b"_SYSTEMD_UNIT", b"UNIT") and unit == "?":
                unit = line.split(b"=", 1)[1].decode(errors="replace")
        # A field with binary content is exported as NAME\n<length><data>: its name is on the line before.
        hits.append({"unit": unit, "fields": sorted(set(fields)) or ["(binary field)"]})
    return hits


def search_units(needle):
    """Units whose loaded configuration (`systemctl show`: ExecStart, Environment, drop-ins applied) holds needle."""
    proc = subprocess.run(
        ["systemctl", "list-units", "--all", "--plain", "--no-legend", "--type=service"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        check=False,
    )
    hits = []
    for unit in (line.split()[0] for line in proc.stdout.splitlines() if line.strip()):
        shown = subprocess.run(
            ["systemctl", "show", unit], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False
        )
        if needle in shown.stdout:
            hits.append(
                {
                    "unit": unit,
                    "properties": [
                        line.split(b"=", 1)[0].decode() for line in shown.stdout.splitlines() if needle in line
                    ],
                }
            )
    return hits


def search_host(needle, roots, skip=()):
    return {
        "files": search_files(roots, needle, skip),
        "processes": search_processes(needle),
        "journal": search_journal(needle),
        "units": search_units(needle),
    }


if __name__ == "__main__":
    secret = sys.stdin.readline().rstrip("\n").encode()
    if not secret:
        sys.exit("give the secret on stdin")
    print(json.dumps(search_host(secret, sys.argv[1:])))
