"""host_facts driven through main(), with ldconfig's output supplied."""

from ansible.module_utils.basic import AnsibleModule
from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.modules import host_facts

LDCONFIG = "".join(
    "\t%s.so.%d (libc6,x86-64) => /lib/x86_64-linux-gnu/%s.so.%d\n" % (name, major, name, major)
    for name, major in [
        ("libavutil", 57),
        ("libavcodec", 59),
        ("libavformat", 59),
        ("libavdevice", 59),
        ("libavfilter", 8),
        ("libswscale", 6),
    ]
)


def test_reports_incomplete_ffmpeg_and_disk(monkeypatch, capsys, tmp_path):
    calls = []

    def run_command(self, args, **kwargs):
        calls.append(args)
        return 0, LDCONFIG, ""

    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(
        AnsibleModule, "get_bin_path", lambda self, name, required=False, opt_dirs=None: "/sbin/ldconfig"
    )
    code, result = run_module(
        host_facts, {"disk_paths": [str(tmp_path / "sglang")], "_ansible_check_mode": True}, capsys
    )
    assert code == 0 and result["changed"] is False
    assert calls == [["/sbin/ldconfig", "-p"]]
    facts = result["ansible_facts"]["ddtree_host"]
    assert facts["ffmpeg"]["complete"] == []
    assert facts["ffmpeg"]["closest"] == {"release": "5", "missing": ["libswresample.so.4"]}
    assert facts["disk"][0]["path"] == str(tmp_path / "sglang")
    assert facts["disk"][0]["checked_path"] == str(tmp_path)


def test_ldconfig_failure_is_reported(monkeypatch, capsys):
    monkeypatch.setattr(AnsibleModule, "run_command", lambda self, args, **kw: (1, "", "ldconfig: cache unreadable"))
    monkeypatch.setattr(
        AnsibleModule, "get_bin_path", lambda self, name, required=False, opt_dirs=None: "/sbin/ldconfig"
    )
    code, result = run_module(host_facts, {}, capsys)
    assert code == 1
    assert result["msg"] == "/sbin/ldconfig -p exited with 1: ldconfig: cache unreadable"
