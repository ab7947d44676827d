"""ddtree.sglang.sglang_guard through main(), against a fake SGLang over real HTTP: it probes, reads
/server_info and /metrics, compares with the host's records and decides; a server it cannot reach changes
nothing."""

import json
import os
from http.server import ThreadingHTTPServer

import pytest
from conftest import run_module
from fake_http import JSONHandler, serving

from ansible_collections.ddtree.sglang.plugins.modules import sglang_guard


class FakeSGLang(ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.algorithm, self.accept, self.metrics = "DDTREE", 4.0, True
        self.generates, self.authorizations = [], []


class Handler(JSONHandler):
    def do_GET(self):
        server = self.server
        if self.path == "/server_info":
            server.authorizations.append(self.headers.get("Authorization"))
            internal = {"avg_spec_accept_length": 4.2}
            self.reply(200, {"speculative_algorithm": server.algorithm, "internal_states": [internal]})
        elif self.path == "/metrics" and server.metrics:
            body = b'sglang:spec_accept_length{tp_rank="0"} 3.5\nsglang:num_running_reqs{tp_rank="0"} 0\n'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.reply(404, {"detail": "Not Found"})

    def do_POST(self):
        body = self.json_body()
        self.server.generates.append(body)
        tokens = body["sampling_params"]["max_new_tokens"]
        steps = round(tokens / self.server.accept)
        self.reply(
            200,
            {
                "text": "x",
                "meta_info": {
                    "completion_tokens": tokens,
                    "spec_verify_ct": steps,
                    "spec_accept_length": tokens / steps,
                },
            },
        )


@pytest.fixture
def server(tmp_path, monkeypatch):
    """The fake SGLang, and a systemctl whose unit runs DDTREE (SGLang's record says DFLASH for it, as the
    overlay resolves it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(
        "#!/bin/sh\n"
        'echo "{ path=/p ; argv[]=/p launch.py sglang.launch_server --speculative-algorithm ${ALGORITHM:-DDTREE} ; }"\n'
    )
    systemctl.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    with serving(FakeSGLang()) as fake:
        fake.algorithm = "DFLASH"
        yield fake


def args(port, state_dir, **guard):
    service = {
        "name": "coder",
        "port": port,
        "api_key": "sk-guard-secret",
        "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8},
        "guard": dict({"window": 0, "probe_requests": 3, "max_tokens": 16}, **guard),
    }
    return dict(service, state_dir=str(state_dir), services_root=str(state_dir / "services"))


def records(tmp_path, accept=4.0):
    (tmp_path / "services" / "coder").mkdir(parents=True)
    (tmp_path / "releases" / "0123456789ab").mkdir(parents=True)
    os.symlink(str(tmp_path / "releases" / "0123456789ab"), str(tmp_path / "services" / "coder" / "current"))
    metrics = {
        "format": 2,
        "records": [{"release_id": "0123456789ab", "tokens_per_second": 50.0, "accept_length": accept}],
    }
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))


def test_a_healthy_service_is_kept_after_a_probe_with_the_key(server, tmp_path, capsys):
    records(tmp_path)
    code, result = run_module(sglang_guard, args(server.server_address[1], tmp_path), capsys)
    assert code == 0, result
    assert (result["watched"], result["action"], result["switch"], result["changed"]) == (True, "keep", False, False)
    assert result["unit_algorithm"] == "DDTREE" and result["live"]["algorithm"] == "DDTREE"
    assert result["release_id"] == "0123456789ab"
    assert result["live"]["accept_length"] == 4.0 and result["live"]["accept_length_source"] == "probe"
    assert result["live"]["metrics_accept_length"] == 3.5 and result["metrics_exposed"] is True
    assert len(server.generates) == 3 and server.generates[0]["sampling_params"]["temperature"] == 0
    assert server.authorizations == ["Bearer sk-guard-secret"]
    assert "sk-guard-secret" not in json.dumps(result)


def test_a_collapsed_acceptance_switches_with_the_state_and_the_record(server, tmp_path, capsys):
    records(tmp_path)
    server.accept = 1.0
    server.metrics = False
    code, result = run_module(sglang_guard, args(server.server_address[1], tmp_path), capsys)
    assert code == 0, result
    assert result["action"] == "switch" and result["switch"] is True
    assert result["metrics_exposed"] is False
    assert "collapsed below 50% of the 4.00 this release's gate recorded" in result["reasons"][0]
    assert result["record"]["event"] == "guard" and result["record"]["from"]["release_id"] == "0123456789ab"
    # The module itself writes nothing: the playbook records after the switch passed its gate.
    assert not (tmp_path / "guard.json").exists()
    # With that state written, the next tick is held down.
    (tmp_path / "guard.json").write_text(json.dumps(result["state"]))
    code, result = run_module(sglang_guard, args(server.server_address[1], tmp_path), capsys)
    assert result["action"] == "hold", result


def test_an_unreachable_service_changes_nothing_and_says_so(tmp_path, capsys):
    records(tmp_path)
    with serving(FakeSGLang()) as gone:
        port = gone.server_address[1]
    code, result = run_module(sglang_guard, args(port, tmp_path), capsys)
    assert code == 0, result
    assert (result["action"], result["switch"], result["changed"]) == ("unknown", False, False)
    assert "could not be read (GET /server_info: " in result["reasons"][0]
    assert "nothing changes" in result["reasons"][0]
    assert "could not be read" in json.dumps(result["warnings"])


def test_a_service_the_guard_does_not_watch_is_not_probed(server, tmp_path, capsys):
    module_args = args(server.server_address[1], tmp_path)
    module_args["speculative"] = {"algorithm": "NEXTN"}
    code, result = run_module(sglang_guard, module_args, capsys)
    assert (code, result["watched"], result["action"]) == (0, False, "keep")
    assert server.generates == []


def test_a_service_whose_unit_runs_its_fallback_is_kept(server, tmp_path, capsys, monkeypatch):
    records(tmp_path)
    server.accept = 1.0
    monkeypatch.setenv("ALGORITHM", "DFLASH")
    code, result = run_module(sglang_guard, args(server.server_address[1], tmp_path), capsys)
    assert (code, result["action"], result["unit_algorithm"]) == (0, "keep", "DFLASH")
    assert "runs DFLASH, not DDTREE" in result["reasons"][0]
