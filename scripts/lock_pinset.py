"""Lock a pin set (see scripts/lock-pinset)."""

import hashlib
import json
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collections"))
from ansible_collections.ddtree.sglang.plugins.module_utils.pinset import lock_name, wheel_platforms  # noqa: E402


def resolve(requirements, python, glibc, no_deps, extra_args):
    """pip's resolution of the requirement lines: [(name, version, sha256)]."""
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp, "req.txt")
        req.write_text("\n".join(requirements) + "\n")
        report = Path(tmp, "report.json")
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), "--only-binary=:all:", "--python-version", python,
               "--implementation", "cp", "--target", str(Path(tmp, "target")), "-r", str(req)]
        for platform in wheel_platforms(glibc):
            cmd += ["--platform", platform]
        if no_deps:
            cmd.append("--no-deps")
        subprocess.run(cmd + extra_args, check=True)
        locked = []
        for item in json.loads(report.read_text())["install"]:
            meta, info = item["metadata"], item["download_info"]
            sha = (info.get("archive_info", {}).get("hashes") or {}).get("sha256")
            if sha is None:  # a local file from find-links: hash it ourselves
                path = urllib.parse.unquote(urllib.parse.urlparse(info["url"]).path)
                sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            locked.append((meta["name"], meta["version"], sha))
        return locked


def main(pinset_dir, python):
    pinset_dir = Path(pinset_dir)
    spec = yaml.safe_load((pinset_dir / "pinset.yml").read_text())
    lines = [line.strip() for line in (pinset_dir / "requirements.in").read_text().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    no_deps = set(spec.get("install_without_dependencies", []))
    extra = []
    for url in spec.get("lock_extra_index_urls", []):
        extra += ["--extra-index-url", url]
    with_deps = [line for line in lines if line.split("==")[0].split("[")[0] not in no_deps]
    without_deps = [line for line in lines if line.split("==")[0].split("[")[0] in no_deps]
    locked = {}
    for requirements, flag in ((with_deps, False), (without_deps, True)):
        if requirements:
            for name, version, sha in resolve(requirements, python, spec["glibc"], flag, extra):
                locked[name.lower()] = (name, version, sha)
    out = pinset_dir / lock_name(python)
    header = [
        "# Pin set %s for CPython %s on x86_64 Linux with glibc >= %s, locked by scripts/lock-pinset from requirements.in." % (
            spec["name"], python, spec["glibc"]),
        "# Install with: pip install --require-hashes --no-deps --only-binary=:all: -r %s" % out.name,
        "# %s" % ", ".join(sorted(no_deps)) + " resolved without their dependencies (see pinset.yml)." if no_deps else "#",
    ]
    body = ["%s==%s \\\n    --hash=sha256:%s" % (name, version, sha) for name, version, sha in sorted(locked.values(), key=lambda v: v[0].lower())]
    out.write_text("\n".join(header + body) + "\n")
    print("%s: %d packages" % (out, len(locked)))


if __name__ == "__main__":
    main(*sys.argv[1:])
