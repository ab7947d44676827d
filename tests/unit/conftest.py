"""Shared helpers for the collection's unit tests."""

import json
import stat
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "nvidia-smi"


@pytest.fixture
def fake_nvidia_smi(tmp_path):
    """Make an executable that answers nvidia-smi's queries from capture files.

    make(captures_dir, gpu="query_gpu.csv", apps="query_apps.csv", version="nvidia_smi_version.txt",
         rc=0, stdout=None) -> path. With stdout set, it prints that for every query and exits rc.
    """

    def make(
        captures=None, gpu="query_gpu.csv", apps="query_apps.csv", version="nvidia_smi_version.txt", rc=0, stdout=None
    ):
        script = tmp_path / "nvidia-smi"
        if stdout is not None:
            body = "cat <<'OUT'\n%s\nOUT\nexit %d\n" % (stdout, rc)
        else:
            body = (
                'case "$1" in\n'
                '  --query-gpu=*) cat "%s" ;;\n'
                '  --query-compute-apps=*) cat "%s" ;;\n'
                '  --version) cat "%s" ;;\n'
                '  *) echo "unexpected arguments: $*" >&2; exit 2 ;;\n'
                "esac\n"
            ) % (captures / gpu, captures / apps, captures / version)
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        return str(script)

    return make


def run_module(module, args, capsys):
    """Run a module's main() with args; return (exit code, result dict)."""
    from ansible.module_utils.testing import patch_module_args

    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            module.main()
    return exit_info.value.code, json.loads(capsys.readouterr().out)
