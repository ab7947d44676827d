"""The sglang_stack role installs a lock with the command module_utils/pinset.py builds (the one the pinsets
test stage installs with), offline and from indexes: the role's own task argv, rendered by ansible-playbook
with this checkout's collection (pytest's process cannot load its filters: tests/unit/roles/
test_sglang_service_gate.py says why)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.ddtree.sglang.plugins.module_utils.pinset import install_command

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "roles" / "sglang_stack" / "tasks" / "build.yml"
STACK = "/opt/sglang/stacks/3f2a9c1d0b7e"
WHEELHOUSE = "/opt/sglang/wheelhouse/3f2a9c1d0b7e"
CASES = [
    {
        "sglang_stack_source": "offline",
        "sglang_stack_index_url": "https://ignored/simple",
        "sglang_stack_extra_index_urls": [],
    },
    {"sglang_stack_source": "online", "sglang_stack_index_url": "", "sglang_stack_extra_index_urls": []},
    {
        "sglang_stack_source": "online",
        "sglang_stack_index_url": "https://mirror/simple",
        "sglang_stack_extra_index_urls": ["https://extra/simple"],
    },
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The install task's argv for each case, as ansible-playbook renders it."""
    block = yaml.safe_load(BUILD.read_text())[0]["block"]
    task = next(task for task in block if task["name"].startswith("Install exactly the lock"))
    out = tmp_path_factory.mktemp("render") / "argv.json"
    playbook = out.parent / "render.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    # The running Python, not interpreter discovery: discovery may find a pyenv shim (python3.13)
                    # that fails where pyenv's global version is another one.
                    "vars": {
                        "sglang_stack_path": STACK,
                        "sglang_stack_host_wheelhouse": WHEELHOUSE,
                        "ansible_python_interpreter": sys.executable,
                    },
                    "tasks": [
                        {
                            "name": "Render",
                            "ansible.builtin.set_fact": {"argvs": "{{ argvs | default([]) + [argv] }}"},
                            "vars": {
                                "argv": task["ansible.builtin.command"]["argv"],
                                **{key: "{{ item.%s }}" % key for key in CASES[0]},
                            },
                            "loop": CASES,
                        },
                        {
                            "name": "Write",
                            "ansible.builtin.copy": {
                                "content": "{{ argvs | to_json }}",
                                "dest": str(out),
                                "mode": "0644",
                            },
                        },
                    ],
                }
            ]
        )
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_HOME=str(out.parent))
    bindir = Path(sys.executable).parent
    subprocess.run(
        [str(bindir / "ansible-playbook"), "-i", "localhost,", str(playbook)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.read_text())


def test_offline_installs_from_the_shipped_wheelhouse_only(rendered):
    assert rendered[0] == install_command(STACK + "/bin/python", STACK + "/ddtree-stack.lock", wheelhouse=WHEELHOUSE)
    assert "--index-url" not in rendered[0] and "--no-index" in rendered[0]


def test_online_installs_from_the_indexes_given(rendered):
    assert rendered[1] == install_command(STACK + "/bin/python", STACK + "/ddtree-stack.lock")
    assert rendered[2] == install_command(
        STACK + "/bin/python",
        STACK + "/ddtree-stack.lock",
        index_url="https://mirror/simple",
        extra_index_urls=["https://extra/simple"],
    )
    assert (
        "--no-index" not in rendered[2] and rendered[2][rendered[2].index("--index-url") + 1] == "https://mirror/simple"
    )


def test_a_bad_argument_is_named():
    # Imported here, not when pytest collects this file: ansible.errors imported that early took `warnings`
    # out of the module results that tests/unit/plugins/modules read (as test_sglang_service_gate.py found).
    from ansible.errors import AnsibleFilterError

    from ansible_collections.ddtree.sglang.plugins.filter.pinset_install_command import pinset_install_command

    with pytest.raises(AnsibleFilterError, match="extra_index_urls must be a list of URLs, got 'https://x'"):
        pinset_install_command("/s/bin/python", "/s/lock", extra_index_urls="https://x")
    with pytest.raises(AnsibleFilterError, match="lock must be a path, got None"):
        pinset_install_command("/s/bin/python", None)
