"""The GPU harness's host-side pieces: the scoreboard's rows and the random shapes' server flags."""

import http.server
import json
import os
import sys
import threading
import time

import pytest

HARNESS = os.path.join(os.path.dirname(__file__), "..", "..", "gpu_sglang")
sys.path.insert(0, HARNESS)

import autotune_real  # noqa: E402
import perf  # noqa: E402
import scenario  # noqa: E402
import scoreboard  # noqa: E402


def perf_doc(dflash, ddtree, gpu=None):
    """A perf.py result with one DDTREE server: tokens/s per round at concurrency 1."""
    runs = []
    for server, values in (("perf-dflash", dflash), ("perf-ddtree", ddtree)):
        for i, value in enumerate(values):
            runs.append({"server": server, "concurrency": 1, "round": i, "tokens_per_s": value, "mean_accept": 1.0})
    doc = {
        "target": "qwen3-30b-a3b",
        "new_tokens": 64,
        "servers": {"perf-ddtree": {"algorithm": "DDTREE", "flags": ["--speculative-ddtree-budget", "15"]}},
        "runs": runs,
    }
    if gpu:
        doc["gpu"] = gpu
    return doc


def test_scoreboard_leaves_the_warm_up_round_out_of_the_medians():
    (row,) = scoreboard.rows_from_perf(perf_doc([50.0, 100.0, 100.0], [90.0, 80.0, 82.0]), "abc", "src.json")
    assert row["per_round"] == [1.8, 0.8, 0.82]
    assert row["ddtree_over_dflash"] == 0.81
    assert row["tokens_per_s"]["DFLASH"] == 100.0
    assert row["tokens_per_s"]["DDTREE"] == 81.0
    assert row["warm_up_round"] == "excluded"
    assert (row["shape"], row["layers"], row["ddtree_setting"]) == ("Qwen3-Coder-30B-A3B (random weights)", 48, "15")


def test_scoreboard_keeps_a_single_round():
    (row,) = scoreboard.rows_from_perf(perf_doc([100.0], [80.0]), "abc", "src.json")
    assert row["ddtree_over_dflash"] == 0.8
    assert row["warm_up_round"] == "none"


def test_decode_graph_counts_leave_the_prefill_lines_out():
    log = "\n".join(
        [
            "Prefill batch, #new-seq: 1, #new-token: 6, cuda graph: False, input throughput (token/s): 5.05",
            "Decode batch, #running-req: 1, accept len: 6.47, cuda graph: True, gen throughput (token/s): 66.55",
            "Decode batch, #running-req: 1, accept len: 6.58, cuda graph: True, gen throughput (token/s): 510.81",
            "Decode batch, #running-req: 49, accept len: 5.1, cuda graph: False, gen throughput (token/s): 900.0",
        ]
    )
    assert scenario.decode_graph_counts(log) == {"graph_decode_batches": 2, "eager_decode_batches": 1}


def autotune_doc(choice):
    """An autotune_real.py result: NONE, DFLASH and DDTREE budgets 15 and 31 (top_k 8) at 1 and 16 requests."""
    tokens = {("NONE", None): [50.0, 50.0], ("DFLASH", None): [100.0, 100.0], ("DDTREE", 15): [110.0, 130.0]}
    tokens[("DDTREE", 31)] = [120.0, 90.0]
    measurements = []
    for (algorithm, budget), values in tokens.items():
        for concurrency in (1, 16):
            rounds = values if concurrency == 1 else [v * 10 for v in values]
            measurements.append(
                {
                    "algorithm": algorithm,
                    "budget": budget,
                    "top_k": 8 if budget else None,
                    "concurrency": concurrency,
                    "tokens_per_second": sorted(rounds)[len(rounds) // 2],
                    "accept_length": None if algorithm == "NONE" else 5.0,
                    "rounds": rounds,
                    "error": None,
                }
            )
    return {
        "plan": "autotune",
        "target": "embedded-qwen3-8b",
        "gpu": "NVIDIA H200",
        "drafter": "upper",
        "max_tokens": 128,
        "measurements": measurements,
        "choice": choice,
    }


def test_autotune_rows_mark_the_budgets_the_chosen_schedule_runs():
    choice = {"algorithm": "DDTREE", "budget": "1:31,16:15", "top_k": 8}
    rows = scoreboard.rows_from_autotune(autotune_doc(choice), "abc", "src.json")
    assert [(r["ddtree_setting"], r["concurrency"], r["chosen"]) for r in rows] == [
        ("15", 1, False),
        ("15", 16, True),
        ("31", 1, True),
        ("31", 16, False),
    ]
    row = rows[0]
    assert row["per_round"] == [1.1, 1.3] and row["ddtree_over_dflash"] == 1.2
    assert row["tokens_per_s"] == {"NONE": 50.0, "DFLASH": 100.0, "DDTREE": 130.0}
    assert (row["shape"], row["layers"], row["gpu"]) == ("Qwen3-8B (tiny pair embedded)", 36, "NVIDIA H200")
    assert row["autotune_choice"] == "DDTREE 1:31,16:15 top_k 8" and row["warm_up_round"] == "none"


def test_autotune_rows_mark_nothing_chosen_when_dflash_is_kept():
    rows = scoreboard.rows_from_autotune(autotune_doc({"algorithm": "DFLASH"}), "abc", "src.json")
    assert len(rows) == 4 and not any(r["chosen"] for r in rows)
    assert {r["autotune_choice"] for r in rows} == {"DFLASH"}


@pytest.mark.parametrize(
    "budget, concurrency, expected",
    [(15, 64, 15), ("1:31,16:15", 1, 31), ("1:31,16:15", 2, 15), ("1:31,16:15", 16, 15), ("1:31,16:15", 64, 15)],
)
def test_budget_at_a_concurrency_is_the_first_schedule_entry_that_covers_it(budget, concurrency, expected):
    assert scoreboard.budget_at(budget, concurrency) == expected


@pytest.mark.parametrize(
    "doc_gpu, option, expected",
    [
        ("NVIDIA H100 80GB HBM3", None, "NVIDIA H100 80GB HBM3"),
        (None, "NVIDIA H200", "NVIDIA H200"),
        (None, None, None),
    ],
)
def test_scoreboard_rows_name_the_gpu(doc_gpu, option, expected):
    (row,) = scoreboard.rows_from_perf(perf_doc([1.0], [1.0], gpu=doc_gpu), "abc", "src.json", gpu=option)
    assert row["gpu"] == expected


@pytest.mark.parametrize("shape", ["qwen3-8b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("algorithm", ["DFLASH", "DDTREE"])
def test_random_shapes_load_the_drafters_own_weights(shape, algorithm):
    """The target loads dummy weights; without its own load format the drafter would too (SGLang's draft load
    format follows --load-format), and its seeded weights would never be read."""
    server = scenario.flags("/models", 30000, shape=shape)
    spec = scenario.spec_flags("/models", algorithm, shape=shape)
    assert server[server.index("--load-format") + 1] == "dummy"
    assert spec[spec.index("--speculative-draft-load-format") + 1] == "safetensors"


@pytest.mark.parametrize("value, eager", [(None, False), ("1", False), ("0", True)])
def test_prefill_graphs_are_captured_unless_the_call_turns_them_off(monkeypatch, value, eager):
    if value is None:
        monkeypatch.delenv("SCENARIO_PREFILL_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("SCENARIO_PREFILL_GRAPHS", value)
    server = scenario.flags("/models", 30000, shape="embedded-qwen3-30b-a3b")
    assert ("--disable-prefill-cuda-graph" in server) is eager
    assert "--disable-cuda-graph" not in server  # the decode and verify graphs stay on


def test_prefill_graphs_knob_refuses_another_value(monkeypatch):
    monkeypatch.setenv("SCENARIO_PREFILL_GRAPHS", "off")
    with pytest.raises(ValueError, match="SCENARIO_PREFILL_GRAPHS is 'off'"):
        scenario.flags("/models", 30000)


def test_the_trained_pair_loads_as_it_is_saved():
    assert "--speculative-draft-load-format" not in scenario.spec_flags("/models", "DFLASH", shape="tiny")
    assert "--load-format" not in scenario.flags("/models", 30000, shape="tiny")


class _StreamingGenerate(http.server.BaseHTTPRequestHandler):
    """/generate as SGLang streams it: `data: {json}` chunks, the last with the whole meta_info, then [DONE]."""

    gap_s = 0.05

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        ids = []
        for step in range(4):
            ids += [step, step]
            meta = {"completion_tokens": len(ids)}
            if step == 3:
                meta.update(spec_accept_length=2.0, spec_verify_ct=3)
            chunk = {"text": "", "output_ids": list(ids), "meta_info": meta}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(self.gap_s)
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def streaming_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StreamingGenerate)
    httpd.bodies = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_a_streamed_request_gives_the_decode_step_without_the_first_chunks_latency(streaming_server, tmp_path):
    server = scenario.Server("s", "DFLASH", None, streaming_server.server_address[1], str(tmp_path), str(tmp_path))
    out = server.generate("a b", {"max_new_tokens": 8}, stream=True)
    assert streaming_server.bodies[0]["stream"] is True
    assert out["ids"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert (out["completion_tokens"], out["accept"], out["verify_ct"], out["chunks"]) == (8, 2.0, 3, 4)
    # Three gaps of 50 ms between four chunks; the first chunk's latency is not part of the step.
    assert 45 <= out["step_ms"] <= 120
    assert out["first_chunk_s"] < out["last_chunk_s"]


def test_stream_timing_of_a_single_chunk_has_no_step():
    assert scenario.stream_timing([0.2]) == {"chunks": 1, "first_chunk_s": 0.2, "last_chunk_s": 0.2, "step_ms": None}
    assert scenario.stream_timing([]) == {"chunks": 0}
    assert scenario.stream_timing([0.1, 0.3, 0.5])["step_ms"] == 200.0


def test_perf_rounds_keep_the_medians_of_streamed_requests():
    outs = [{"first_chunk_s": 0.03, "step_ms": 9.0}, {"first_chunk_s": 0.02, "step_ms": 7.0}, {"step_ms": None}]
    assert perf.stream_summary(outs) == {"first_chunk_s": 0.03, "step_ms": 9.0}


def test_a_server_that_never_started_stops_quietly(tmp_path):
    server = scenario.Server("s", "NONE", None, 1, str(tmp_path), str(tmp_path))
    assert server.stop() is None


def test_scoreboard_rows_of_a_streamed_run_carry_each_servers_decode_step():
    doc = perf_doc([100.0, 100.0, 100.0], [90.0, 95.0, 97.0])
    steps = {"perf-dflash": [12.0, 9.0, 9.2], "perf-ddtree": [14.0, 11.0, 11.4]}
    for run in doc["runs"]:
        run["step_ms"] = steps[run["server"]][run["round"]]
    (row,) = scoreboard.rows_from_perf(doc, "abc", "src.json")
    assert row["step_ms"] == {"NONE": None, "DFLASH": 9.1, "DDTREE": 11.2}


def test_scoreboard_rows_of_a_plain_run_have_no_step():
    (row,) = scoreboard.rows_from_perf(perf_doc([100.0, 100.0], [90.0, 95.0]), "abc", "src.json")
    assert "step_ms" not in row


def test_perf_prints_the_middle_of_each_servers_runs(capsys):
    doc = perf_doc([100.0, 120.0, 110.0], [90.0, 130.0, 99.0])
    doc["servers"]["perf-dflash"] = {"algorithm": "DFLASH"}
    doc["outputs"] = {}
    for run in doc["runs"]:
        run["step_ms"] = 10.0 + run["round"] if run["server"] == "perf-ddtree" else None
    perf.print_table(doc)
    printed = capsys.readouterr().out
    assert "| perf-dflash | 110.0 (100.0, 120.0, 110.0)" in printed
    assert "perf-ddtree c1: decode step 11.00 ms (medians of rounds: [10.0, 11.0, 12.0])" in printed
    assert "perf-dflash c1: decode step" not in printed


@pytest.mark.parametrize(
    "span, deadline, now, fits",
    [
        (0.0, 1000.0, 990.0, True),  # the first server: no pace known yet
        (160.0, 0.0, 990.0, True),  # no deadline known
        (160.0, 1000.0, 800.0, True),
        (160.0, 1000.0, 880.0, False),  # 120 s left, the server before took 160
    ],
)
def test_a_server_starts_only_when_it_can_end_before_the_call_does(span, deadline, now, fits):
    assert scenario.server_fits(span, deadline, now) is fits


def test_the_calls_deadline_comes_from_device_run_or_is_unknown():
    assert scenario.call_deadline({"CALL_DEADLINE": "1765000000"}) == 1765000000.0
    assert scenario.call_deadline({"CALL_DEADLINE": ""}) == 0.0
    assert scenario.call_deadline({}) == 0.0


class TimedServer:
    """A server whose start, readiness and stop advance a fake clock by `takes` seconds in all."""

    def __init__(self, name, takes, clock, events):
        self.name, self.takes, self.clock, self.events, self.info = name, takes, clock, events, {}

    def start(self):
        self.events.append("start " + self.name)

    def wait_ready(self):
        self.clock[0] += self.takes
        return True

    def stop(self):
        self.events.append("stop " + self.name)


def test_one_at_a_time_skips_the_server_that_would_outlast_the_call(capsys):
    clock, events = [0.0], []
    servers = [TimedServer(name, 160.0, clock, events) for name in ("dflash", "ddtree-0", "ddtree-1")]
    scenario.one_at_a_time(
        servers, lambda s: events.append("work " + s.name), deadline=400.0, label="perf", clock=lambda: clock[0]
    )
    assert events == ["start dflash", "work dflash", "stop dflash", "start ddtree-0", "work ddtree-0", "stop ddtree-0"]
    assert servers[2].info["skipped"] == "not started: 80 s left in the call, the server before took 160 s"
    assert "[perf] ddtree-1 not started" in capsys.readouterr().out


def test_one_at_a_time_runs_every_server_without_a_deadline():
    clock, events = [0.0], []
    servers = [TimedServer(name, 160.0, clock, events) for name in ("dflash", "ddtree-0", "ddtree-1")]
    scenario.one_at_a_time(servers, lambda s: None, deadline=0.0, label="profile", clock=lambda: clock[0])
    assert [e for e in events if e.startswith("start")] == ["start dflash", "start ddtree-0", "start ddtree-1"]


def test_one_at_a_time_stops_a_server_whose_work_fails_and_gives_no_work_to_one_that_never_got_ready():
    clock, events = [0.0], []
    servers = [TimedServer(name, 10.0, clock, events) for name in ("dflash", "ddtree")]
    servers[0].wait_ready = lambda: False

    def work(s):
        raise RuntimeError("the profiler failed on " + s.name)

    with pytest.raises(RuntimeError, match="on ddtree"):
        scenario.one_at_a_time(servers, work, deadline=0.0, label="profile", clock=lambda: clock[0])
    assert events == ["start dflash", "stop dflash", "start ddtree", "stop ddtree"]


def test_in_groups_starts_a_group_together_and_skips_the_group_that_would_outlast_the_call(capsys):
    clock, events, worked = [0.0], [], []
    groups = [
        [TimedServer("none", 100.0, clock, events)],
        [TimedServer(name, 120.0, clock, events) for name in ("dflash", "ddtree-15")],
        [TimedServer(name, 120.0, clock, events) for name in ("ddtree-31", "ddtree-63")],
    ]
    scenario.in_groups(
        groups, lambda ready: worked.append([s.name for s in ready]), 500.0, "autotune", clock=lambda: clock[0]
    )
    assert worked == [["none"], ["dflash", "ddtree-15"]]
    assert events[:3] == ["start none", "stop none", "start dflash"]
    assert events[3:] == ["start ddtree-15", "stop dflash", "stop ddtree-15"]
    assert groups[2][1].info["skipped"] == "not started: 160 s left in the call, the group before took 240 s"
    assert "[autotune] ddtree-63 not started" in capsys.readouterr().out


def autotune_runs(setting, rounds, values):
    """autotune_real runs of one setting ((algorithm, budget)) at concurrency 1, `values` by round."""
    algorithm, budget = setting
    return [
        {
            "algorithm": algorithm,
            "budget": budget,
            "top_k": 8 if budget else None,
            "concurrency": 1,
            "tokens_per_second": value,
            "accept_length": 4.0 if algorithm != "NONE" else None,
            "error": None,
            "round": number,
        }
        for number, value in zip(range(rounds), values)
    ]


def cut_off_autotune_doc():
    """An autotune_real result whose call ended in its last group: budget 15 measured in all three rounds,
    31 in one, 63 never started."""
    runs = (
        autotune_runs(("NONE", None), 3, [100, 101, 102])
        + autotune_runs(("DFLASH", None), 3, [200, 210, 205])
        + autotune_runs(("DDTREE", 15), 3, [230, 240, 250])
        + autotune_runs(("DDTREE", 31), 1, [400])
    )
    tuning = autotune_real.autotune.declaration({"autotune": {"budgets": [15, 31, 63], "concurrency": [1]}})
    return {
        "tuning": tuning,
        "rounds": 3,
        "runs": runs,
        "servers": {"autotune-ddtree-budget-63-topk-8": {"skipped": "not started: 90 s left in the call"}},
    }


def test_a_cut_off_autotune_decides_over_the_settings_measured_in_every_round():
    doc = autotune_real.decide(cut_off_autotune_doc())
    by_budget = {m["budget"]: m for m in doc["measurements"] if m["algorithm"] == "DDTREE"}
    assert by_budget[15]["tokens_per_second"] == 240 and by_budget[15]["rounds"] == [230, 240, 250]
    assert by_budget[31]["error"] == "not measured: 1 of 3 rounds before the call ended"
    assert by_budget[63]["error"] == "not measured: not started: 90 s left in the call"
    choice = doc["choice"]
    assert (choice["algorithm"], choice["budget"], choice["status"]) == ("DDTREE", 15, "ddtree")
    assert choice["gain_over_dflash"] == {"1": pytest.approx(240 / 205 - 1, abs=1e-4)}


@pytest.mark.parametrize(
    "info, reason",
    [
        ({"skipped": "not started: 90 s left in the call"}, "not started: 90 s left in the call"),
        ({"error": "exited with 1"}, "the server did not start (exited with 1)"),
        ({"ready_s": 60.0}, "the call ended before it was measured"),
    ],
)
def test_an_unmeasured_setting_says_why_from_its_servers_info(info, reason):
    assert autotune_real.not_started_reason(info) == reason


def test_a_cut_off_autotune_without_dflash_in_every_round_chooses_nothing():
    doc = cut_off_autotune_doc()
    doc["runs"] = [run for run in doc["runs"] if not (run["algorithm"] == "DFLASH" and run["round"] == 2)]
    choice = autotune_real.decide(doc)["choice"]
    assert set(choice) == {"error"} and "DFLASH" in choice["error"]


def test_autotune_choose_decides_a_saved_result_and_says_so(tmp_path, capsys):
    results, out = tmp_path / "results.json", tmp_path / "decided.json"
    results.write_text(json.dumps(cut_off_autotune_doc()))
    autotune_real.choose_from_file(str(results), str(out))
    decided = json.loads(out.read_text())
    assert decided["choice"]["budget"] == 15 and decided["decided"].startswith("after the call")
    assert "choice: {'algorithm': 'DDTREE', 'budget': 15" in capsys.readouterr().out


class FakeServer:
    def __init__(self, algo, events):
        self.algo, self.events = algo, events

    def start(self):
        self.events.append("start " + self.algo)

    def wait_ready(self):
        self.events.append("ready " + self.algo)
        return self.algo != "DDTREE"  # a server that failed to start


@pytest.mark.parametrize(
    "algos, expected",
    [
        (
            ["NONE", "DFLASH", "DDTREE"],
            ["start NONE", "ready NONE", "start DFLASH", "start DDTREE", "ready DFLASH", "ready DDTREE"],
        ),
        (["DFLASH", "DDTREE"], ["start DFLASH", "start DDTREE", "ready DFLASH", "ready DDTREE"]),
    ],
)
def test_perf_starts_none_first_and_the_others_together(algos, expected):
    events = []
    ready = perf.start_servers([FakeServer(algo, events) for algo in algos])
    assert events == expected
    assert [server.algo for server in ready] == [algo for algo in algos if algo != "DDTREE"]


# ---- autotune_real: the default grid on the device ------------------------------------------------


def test_autotune_measures_the_collections_default_grid_unless_a_knob_replaces_a_field():
    assert autotune_real.declaration_from_env({}) == {}
    declared = autotune_real.declaration_from_env({"AUTOTUNE_BUDGETS": "31,63", "AUTOTUNE_CONCURRENCY": "1"})
    assert declared == {"budgets": [31, 63], "concurrency": [1]}
    tuning = autotune_real.autotune.declaration({"autotune": declared})
    assert tuning["budgets"] == [31, 63]
    assert tuning["top_k"] == autotune_real.autotune.DEFAULTS["top_k"]


def test_autotune_refuses_a_knob_that_is_not_a_list_of_integers():
    with pytest.raises(SystemExit, match="AUTOTUNE_TOP_K='eight': give a comma list of integers"):
        autotune_real.declaration_from_env({"AUTOTUNE_TOP_K": "eight"})


@pytest.mark.parametrize(
    "algos, at_once, expected",
    [
        (["NONE", "DFLASH", "DDTREE", "DDTREE", "DDTREE"], 0, [["NONE"], ["DFLASH", "DDTREE", "DDTREE", "DDTREE"]]),
        (["NONE", "DFLASH", "DDTREE", "DDTREE", "DDTREE"], 3, [["NONE"], ["DFLASH", "DDTREE", "DDTREE"], ["DDTREE"]]),
        (["DFLASH", "DDTREE", "DDTREE"], 1, [["DFLASH"], ["DDTREE"], ["DDTREE"]]),
    ],
)
def test_servers_start_none_alone_then_the_rest_in_groups_of_at_once(algos, at_once, expected):
    groups = perf.server_groups([FakeServer(algo, []) for algo in algos], at_once)
    assert [[server.algo for server in group] for group in groups] == expected


def test_autotune_sends_perfs_request_count_at_each_level():
    prompts = ["p%d" % i for i in range(64)]
    assert autotune_real.level_prompts(prompts, 1, 2) == prompts[: perf.CONCURRENCY[1]] * 2
    assert len(autotune_real.level_prompts(prompts, 16, 1)) == perf.CONCURRENCY[16]
    assert len(autotune_real.level_prompts(prompts, 8, 1)) == 32


# ---- synth_lang: the `pairs` language --------------------------------------------------------------


def test_phrases_language_orders_successors_by_the_current_phrase_only():
    import synth_lang as sl

    lang = sl.Language(kind="phrases")
    assert lang.successors(5, prev=9) == lang.successors(5, prev=11) == lang.succ[5]


def test_pairs_language_orders_successors_by_the_phrase_before():
    import synth_lang as sl

    lang = sl.Language(kind="pairs")
    phrases = sl.Language(kind="phrases")
    assert lang.phrases == phrases.phrases and lang.succ == phrases.succ  # same words, other orders
    for p in range(sl.N_PHRASES):
        assert sorted(lang.successors(p, prev=0 if p else 1)) == sorted(lang.succ[p])
        assert lang.successors(p) == lang.succ[p]  # a text's first phrase: no phrase before it
    firsts = {lang.successors(7, prev=a)[0] for a in range(sl.N_PHRASES) if a != 7}
    assert len(firsts) == 3  # the target's greedy choice after phrase 7 depends on the phrase before


def test_pairs_language_texts_follow_the_pair_order():
    import random

    import synth_lang as sl

    lang = sl.Language(kind="pairs")
    _ws, where = lang.sample_words(4000, random.Random(1))
    boundaries = lang.pair_boundaries(where)
    assert len(boundaries) > 400
    for here, prev, cur in boundaries[:3]:  # cur ends just before `here`, prev ends just before cur starts
        assert where[here - 1][0] == cur and where[here][1] == 0
        start = here - len(lang.phrases[cur])
        assert where[start - 1][0] == prev and where[start][1] == 0
    top = sum(where[here][0] == lang.successors(cur, prev)[0] for here, prev, cur in boundaries)
    assert 0.5 < top / len(boundaries) < 0.7  # the 0.6 successor of the pair


def test_language_kind_from_env_refuses_an_unknown_name(monkeypatch):
    import synth_lang as sl

    monkeypatch.setenv("SYNTH_LANG", "triples")
    with pytest.raises(SystemExit, match="SYNTH_LANG=triples.*phrases, pairs"):
        sl.Language()
    monkeypatch.setenv("SYNTH_LANG", "pairs")
    assert sl.Language().kind == "pairs"
