"""ansible-playbook the way the role tests run it: on this controller over the local connection, the collection
from this checkout, an Ansible home of the test's own."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def run_playbook(tmp_path, plays, hosts="localhost", interpreter=None, extra_env=None, timeout=300):
    """Write ``plays`` to ``tmp_path/play.yml`` and run it on ``hosts`` (a comma list, no inventory file) with
    ``interpreter`` as the hosts' Python (default: this one); return (exit code, stdout + stderr)."""
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        ANSIBLE_NOCOLOR="1",
        PYTHONWARNINGS="ignore",
        **(extra_env or {}),
    )
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", hosts + ",", "-c", "local"]
    command += ["-e", "ansible_python_interpreter=" + (interpreter or sys.executable), str(path)]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return run.returncode, run.stdout + run.stderr
