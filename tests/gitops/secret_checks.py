"""Secrets stay secret (issue 18, docs/services.md "The API key"): what test_gitops.py needs to give
ct200's service a canary API key in the fleet repository (as a vault variable would put it there), to
talk to the service with it, and, after its rollouts at -vvv, to search for the key everywhere a key
could leak: the controller's output of the runs, the reports (JSON, Markdown, history), Ansible's local
temp files, the rollout lock files; on the host every file (unit files and drop-ins, releases, state:
gate results, baselines, history), every process's argv and environment, every journal field, every
unit's loaded configuration. The only place it may be: the service's secret file (0600 root).
"""

import json
from pathlib import Path

import secret_search
import yaml
from conftest import ARTIFACTS, on_lab_host

SERVICE, HOST = "coder", "ct200"
SECRET_FILE = "/etc/sglang/coder.api-key"
GROUP_VARS = "inventories/example/group_vars/blackwell.yml"  # the lab's blackwell group links here
# Where a leak could be written on the host ("/" less pseudo file systems would work too, but takes minutes).
HOST_ROOTS = ["/etc", "/opt/sglang", "/var/lib/sglang", "/var/log", "/var/tmp", "/tmp", "/run", "/root", "/home"]


def plant_key(key):
    """A fleet-repository change giving ct200's service the key."""

    def change(work):
        path = work / GROUP_VARS
        data = yaml.safe_load(path.read_text())
        next(service for service in data["sglang_services"] if service["name"] == SERVICE)["api_key"] = key
        path.unlink()  # the checkout's file may be a link: write a file of the fleet's own
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    return change


def chat_statuses(env, key, keys=(None, "key")):
    """HTTP status and answer of a chat completion to ct200's service, once per entry of keys (None: no
    Authorization header; "key": the key's). The key travels on stdin, never in an argv."""
    code = (
        "import json, sys, urllib.error, urllib.request\n"
        "key = sys.stdin.readline().strip()\n"
        "body = json.dumps({'model': 'any', 'max_tokens': 12, 'temperature': 0,\n"
        "                   'messages': [{'role': 'user', 'content': 'Name three rivers.'}]}).encode()\n"
        "for use in sys.argv[1:]:\n"
        "    headers = {'Content-Type': 'application/json'}\n"
        "    if use == 'key':\n"
        "        headers['Authorization'] = 'Bearer ' + key\n"
        "    try:\n"
        "        answer = json.load(urllib.request.urlopen(urllib.request.Request(\n"
        "            'http://127.0.0.1:30000/v1/chat/completions', body, headers), timeout=60))\n"
        "        print(json.dumps([200, answer['choices'][0]['message']['content']]))\n"
        "    except urllib.error.HTTPError as error:\n"
        "        print(json.dumps([error.code, None]))\n"
    )
    argv = [("key" if use else "none") for use in keys]
    out = on_lab_host(env, HOST, "python3", "-c", code, *argv, stdin=key + "\n")
    return [tuple(json.loads(line)) for line in out.splitlines()]


def search_controller(env, key, outputs, report_dirs):
    """The key in the runs' output, the reports, and what the runs left on the controller."""
    needle = key.encode()
    found = {"output": [name for name, text in outputs.items() if needle in text.encode()]}
    workdir = Path(env["DDTREE_ROLLOUT_WORKDIR"])
    # The fleet repository's mirror and checkouts hold the key by design (the inventory, as a vault would).
    roots = [str(path) for path in report_dirs] + [env["ANSIBLE_LOCAL_TEMP"], env["DDTREE_LOCK_DIR"], str(workdir)]
    found["files"] = [
        hit["path"]
        for hit in secret_search.search_files(
            [root for root in roots if Path(root).exists()],
            needle,
            skip=[str(workdir / "mirror.git"), str(workdir / "trees")],
        )
    ]
    return found


def search_host(env, key):
    script = Path(secret_search.__file__).read_text()
    return json.loads(on_lab_host(env, HOST, "python3", "-c", script, *HOST_ROOTS, stdin=key + "\n"))


def assert_the_key_is_only_in_its_file(env, key, outputs, report_dirs):
    """Search everywhere (the controller: outputs, report_dirs, what the runs left; the host) and fail
    listing every place but the service's secret file where the key is. The search's result is kept in
    the artifacts (secrets-search.json)."""
    found = {"controller": search_controller(env, key, outputs, report_dirs), HOST: search_host(env, key)}
    allowed = [hit for hit in found[HOST]["files"] if hit["path"] == SECRET_FILE]
    found[HOST]["files"] = [hit for hit in found[HOST]["files"] if hit not in allowed]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "secrets-search.json").write_text(json.dumps({"found": found, "allowed": allowed}, indent=2) + "\n")
    leaks = {where: {kind: hits for kind, hits in places.items() if hits} for where, places in found.items()}
    assert leaks == {"controller": {}, HOST: {}}, "the API key leaked:\n" + json.dumps(leaks, indent=2)
    # Its one place: the secret file, root's alone.
    assert allowed == [{"path": SECRET_FILE, "mode": "0600", "uid": 0, "gid": 0}], allowed
