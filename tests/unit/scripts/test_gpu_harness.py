"""The GPU harness's host-side pieces: the scoreboard's rows and the random shapes' server flags."""

import http.server
import json
import math
import os
import random
import sys
import threading
import time

import pytest

HARNESS = os.path.join(os.path.dirname(__file__), "..", "..", "gpu_sglang")
sys.path.insert(0, HARNESS)

import autotune_real  # noqa: E402
import perf  # noqa: E402
import plant_bench  # noqa: E402
import scenario  # noqa: E402
import scoreboard  # noqa: E402
import traffic  # noqa: E402


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


# ---- the real-text languages (corpus_lang.py, make_corpus.py, corpora/) ------------------------------


def _corpus(kind):
    import corpus_lang

    return corpus_lang.CorpusLanguage(kind)


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_corpus_bundle_is_small_and_names_its_sources(kind):
    import corpus_lang

    path = corpus_lang.bundle_path(kind)
    assert os.path.getsize(path) < 1_500_000  # the tracked tree and the carry share 64 MiB per device call
    manifest = corpus_lang.read_bundle(path)
    assert sorted(manifest) == ["held-out.u16", "manifest.json", "tokenizer.json", "train.u16"]
    doc = json.loads(manifest["manifest.json"])
    assert doc["language"] == kind and all(doc["source"]["packages"].values())
    assert doc["tokenizer"]["vocab"] == 4096 and doc["tokenizer"]["mask_id"] == 3
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in doc["files"])
    assert sum(f["bytes"] for f in doc["files"]) <= 3_000_000


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_corpus_held_out_and_training_files_are_disjoint(kind):
    import make_corpus

    lang = _corpus(kind)
    files = lang.manifest["files"]
    paths = [f["path"] for f in files]
    train, held = make_corpus.split_files(paths)
    assert not set(train) & set(held) and sorted(train + held) == sorted(paths)
    assert held == [f["path"] for f in files if f["split"] == "held-out"]  # the bundle was split so
    assert 0.02 < len(held) / len(paths) < 0.12
    # the held-out token ids are exactly the held-out files', one <|endoftext|> between two files
    spans = [f["span"] for f in files if f["split"] == "held-out"]
    assert spans[0][0] == 0 and spans[-1][1] == len(lang.held_ids)
    assert all(a[1] + 1 == b[0] and lang.held_ids[a[1]] == 0 for a, b in zip(spans, spans[1:]))
    assert len(lang.train_ids) == lang.manifest["tokens"]["train"]


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_corpus_prompts_are_stable_for_a_seed_and_come_from_held_out_files(kind):
    import corpus_lang

    lang = _corpus(kind)
    prompts = lang.greedy_prompts()
    corpus_lang._load.cache_clear()
    again = _corpus(kind)
    assert again.greedy_prompts() == prompts and again.branch_prompts() == lang.branch_prompts()
    assert lang.greedy_prompts(seed=8) != prompts
    assert len(prompts) == 64 and len(lang.branch_prompts()) == 8
    assert all(p.endswith("\n") for p in lang.branch_prompts())
    held, train = lang.decode(lang.held_ids), lang.decode(lang.train_ids)
    assert all(p in held for p in prompts)
    # held out by file: a prompt is in training text only where files share a passage (prose: 1 of 64)
    assert sum(p in train for p in prompts) <= 2
    long = lang.long_prompts(2, lo=1000, hi=1200)
    assert len(long) == 2 and all(len(p) > 2000 for p in long) and long == lang.long_prompts(2, lo=1000, hi=1200)


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_corpus_encode_and_decode_round_trip(kind):
    pytest.importorskip("tokenizers")
    import random

    lang = _corpus(kind)
    for f in [f for f in lang.manifest["files"] if f["split"] == "held-out"][:3]:
        ids = lang.held_ids[f["span"][0] : f["span"][1]].tolist()
        assert lang.encode(lang.decode(ids)) == ids  # a file's ids are its text's encoding
    for p in lang.greedy_prompts()[:16]:
        assert lang.decode(lang.encode(p)) == p and 8 <= len(lang.encode(p)) <= 48
    window = lang.sample_ids(64, random.Random(1))
    assert lang.tokenizer().decode(window, skip_special_tokens=False) == lang.decode(window)
    assert lang.encode("<|MASK|>") == [3] and lang.decode([0, 1, 2, 3]) == "".join(lang.specials)


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_corpus_bundle_is_deterministic(kind):
    import corpus_lang
    import make_corpus

    path = corpus_lang.bundle_path(kind)
    with open(path, "rb") as fh:
        on_disk = fh.read()
    members = corpus_lang.read_bundle(path)
    assert make_corpus.pack(members) == make_corpus.pack(dict(members)) == on_disk
    pytest.importorskip("tokenizers")
    manifest = json.loads(members["manifest.json"])
    if make_corpus.package_versions(manifest["source"]["packages"]) != manifest["source"]["packages"]:
        pytest.skip("this machine has other %s sources than the bundle's" % kind)
    import tokenizers

    if tokenizers.__version__ != manifest["tokenizers_version"]:
        pytest.skip("tokenizers %s, the bundle's %s" % (tokenizers.__version__, manifest["tokenizers_version"]))
    assert make_corpus.build(kind) == on_disk


def test_language_is_the_one_entry_point_for_every_kind(monkeypatch):
    import synth_lang as sl

    monkeypatch.setenv("SYNTH_LANG", "code")
    lang = sl.Language()
    assert (lang.kind, lang.vocab_size, lang.mask_id, lang.specials) == ("code", 4096, 3, sl.SPECIALS)
    monkeypatch.setenv("SYNTH_LANG", "Code")
    with pytest.raises(SystemExit, match="SYNTH_LANG=Code.*phrases, pairs, code, prose"):
        sl.Language()
    with pytest.raises(SystemExit, match="SYNTH_LANG=words.*phrases, pairs, code, prose"):
        sl.Language(kind="words")
    phrases = sl.Language(kind="phrases")  # the synthetic kinds: the module's prompts and word ids, unchanged
    assert phrases.greedy_prompts() == sl.greedy_prompts(phrases)
    assert phrases.branch_prompts() == sl.branch_prompts(phrases)
    p = phrases.greedy_prompts()[0]
    assert phrases.encode(p) == [sl.token_id(w) for w in p.split()] and phrases.decode(phrases.encode(p)) == p
    assert phrases.vocab_size == sl.VOCAB == 512
    code = sl.Language(kind="code")  # the module's prompt functions hand a real-text language its own prompts
    assert sl.greedy_prompts(code) == code.greedy_prompts() and sl.branch_prompts(code) == code.branch_prompts()


@pytest.mark.parametrize(
    "doc_language, drafter, expected",
    [("code", None, "code"), (None, "tiny-pairs-dflash-low", "pairs"), (None, None, "phrases")],
)
def test_scoreboard_rows_name_the_language(doc_language, drafter, expected):
    doc = perf_doc([100.0], [80.0])
    if doc_language:
        doc["language"] = doc_language
    (row,) = scoreboard.rows_from_perf(doc, "abc", "src.json", drafter=drafter)
    assert row["language"] == expected


# traffic.py: the real-traffic check (radix cache, chunked prefill, mixed sampling, streaming, aborts)


def test_radix_opt_in_drops_only_the_disable_flag_and_picks_the_python_tree_core(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", raising=False)
    plain = scenario.flags("/models", 30000)
    assert scenario.flags("/models", 30000, radix=False) == plain and "--disable-radix-cache" in plain
    radix = scenario.flags("/models", 30000, radix=True)
    assert "--disable-radix-cache" not in radix
    assert [f for f in plain if f != "--disable-radix-cache"] == radix
    default = scenario.Server("s", "DDTREE", None, 1, str(tmp_path), "/models")
    assert "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND" not in default.env and "radix_env" not in default.info
    assert default.args[3:] == scenario.flags("/models", 1) + scenario.spec_flags("/models", "DDTREE")
    # every existing caller's flags, byte for byte as before the opt-in
    assert " ".join(plain[4:13]) == (
        "--port 30000 --attention-backend triton --sampling-backend pytorch --grammar-backend none --disable-radix-cache"
    )
    extra = ["--chunked-prefill-size", "2048"]
    on = scenario.Server(
        "s", "DDTREE", None, 1, str(tmp_path), "/models", radix=True, extra_flags=extra, budget="1:31,16:15"
    )
    assert on.env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"
    assert on.args[-2:] == extra and "--disable-radix-cache" not in on.args
    assert on.args[on.args.index("--speculative-ddtree-budget") + 1] == "1:31,16:15"


def test_traffic_servers_run_long_contexts_with_the_radix_cache(tmp_path):
    servers = traffic.make_servers(str(tmp_path), "/models")
    assert [s.algo for s in servers] == ["NONE", "DDTREE", "DDTREE", "DDTREE"]
    assert servers[-1].env["PYTHONPATH"].startswith(scenario.CONTROL) and servers[1].env["PYTHONPATH"].startswith(
        scenario.RELEASE
    )
    assert len({s.info["seed"] for s in servers}) == 4  # independent sampling streams for the two-sample tests
    for s in servers:
        assert s.env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"
        assert s.env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"
        assert "--disable-radix-cache" not in s.args
        assert s.args[s.args.index("--chunked-prefill-size") + 1] == "2048"
        context = int(s.args[s.args.index("--context-length") + 1])
        pool = int(s.args[s.args.index("--max-total-tokens") + 1])
        assert max(traffic.CHUNK_LENGTHS) + traffic.GREEDY_NEW < context <= pool
        assert 40 + traffic.VICTIM_NEW < context  # a victim's prompt and length fit
        assert sum(traffic.CHUNK_LENGTHS) + 6 * traffic.GREEDY_NEW < pool  # the chunked prompts at once


@pytest.mark.parametrize(
    "stat, dof, p", [(3.841459, 1, 0.05), (10.827566, 1, 0.001), (18.307038, 10, 0.05), (1.0, 2, math.exp(-0.5))]
)
def test_traffic_chi2_sf_matches_the_known_quantiles(stat, dof, p):
    assert traffic.chi2_sf(stat, dof) == pytest.approx(p, rel=1e-5)


def test_traffic_chi2_sf_keeps_tiny_p_values():
    assert 0 < traffic.chi2_sf(770.0, 48) < 1e-100
    assert traffic.chi2_sf(0.0, 5) == 1.0


def _branch_logits(probs, vocab=16):
    """Logits of a next-token distribution with these leading probabilities and the rest tiny."""
    rest = (1.0 - sum(probs)) / (vocab - len(probs))
    return [math.log(p) for p in probs] + [math.log(rest)] * (vocab - len(probs))


def test_traffic_sampling_distribution_cuts_as_sglangs_sampler_does():
    lg = [math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]
    assert traffic.sampling_distribution(lg, 1.0) == pytest.approx({0: 0.5, 1: 0.3, 2: 0.15, 3: 0.05})
    # top-p: a token stays while the mass before it is at most top_p (SGLang masks probs_sum - p > top_p)
    assert traffic.sampling_distribution(lg, 1.0, top_p=0.85) == pytest.approx(
        {0: 0.5 / 0.95, 1: 0.3 / 0.95, 2: 0.15 / 0.95}
    )
    assert traffic.sampling_distribution(lg, 1.0, top_p=0.7) == pytest.approx({0: 0.625, 1: 0.375})
    assert traffic.sampling_distribution(lg, 1.0, top_k=1) == {0: 1.0}
    cold = traffic.sampling_distribution(lg, 0.5)
    assert cold[0] == pytest.approx(0.25 / (0.25 + 0.09 + 0.0225 + 0.0025))
    assert traffic.filter_margin(lg, 1.0) == float("inf")
    assert traffic.filter_margin(lg, 1.0, top_k=2) == pytest.approx(0.15)
    assert traffic.filter_margin(lg, 1.0, top_p=0.79) == pytest.approx(0.01)
    light = [math.log(p) for p in (0.97, 0.015, 0.015)]  # the cut between two tokens too light to matter
    assert traffic.filter_margin(light, 1.0, top_k=2) == float("inf")
    assert traffic.filter_margin(light, 1.0, top_p=0.98) == pytest.approx(0.98)  # only the heavy token counts


def _draw(dist, n, rng):
    tokens, weights = zip(*sorted(dist.items()))
    return rng.choices(tokens, weights, k=n)


def test_traffic_sampled_plan_rejects_the_argmax_walk_and_passes_a_faithful_one():
    """The plan's counts against the language's branch (0.6 / 0.3 / 0.1 at t2, t1 certain), per setting: a
    faithful sampler passes both tests, the planted walk (t2 always the argmax) is rejected by both at < 1e-3."""
    rng = random.Random(3)
    lg = _branch_logits([0.595, 0.3, 0.1])  # the trained target leaks a little mass to other words
    n_prompts, per = 8, traffic.SHORT_SAMPLES
    for setting in traffic.SETTINGS:
        args = (setting["temperature"], setting["top_p"], setting["top_k"])
        dist = traffic.sampling_distribution(lg, *args)
        exact = {"7|%d" % t: p for t, p in dist.items()}
        faithful_a, faithful_b, argmax, groups_ok, groups_bad = {}, {}, {}, [], []
        for prompt in range(n_prompts):
            obs_ok, obs_bad = {}, {}
            for counts, draws in (
                (faithful_a, _draw(dist, per, rng)),
                (faithful_b, _draw(dist, per, rng)),
                (argmax, [0] * per),
            ):
                for t in draws:
                    key = "%d|7|%d" % (prompt, t)
                    counts[key] = counts.get(key, 0) + 1
            for t in _draw(dist, per, rng):
                obs_ok["7|%d" % t] = obs_ok.get("7|%d" % t, 0) + 1
            obs_bad["7|0"] = per
            groups_ok.append((obs_ok, exact))
            groups_bad.append((obs_bad, exact))
        assert not traffic.homogeneity(faithful_a, faithful_b)["rejected"], setting
        assert traffic.homogeneity(faithful_a, argmax)["p_value"] < 1e-3, setting
        assert not traffic.goodness_of_fit(groups_ok)["rejected"], setting
        assert traffic.goodness_of_fit(groups_bad)["p_value"] < 1e-3, setting


def test_traffic_goodness_of_fit_pools_the_rare_cells_and_counts_unknown_tokens():
    exact = {"a": 0.5, "b": 0.49, "c": 0.01}
    r = traffic.goodness_of_fit([({"a": 50, "b": 49, "c": 1}, exact)])
    assert (r["dof"], r["samples"]) == (2, 100) and r["chi2"] == pytest.approx(0.0, abs=1e-9)
    assert traffic.goodness_of_fit([({"a": 50, "z": 50}, exact)])["rejected"]  # a token the target never gives


def test_traffic_greedy_differences_name_the_prompt_position_and_tokens():
    assert traffic.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert traffic.first_divergence([1, 2, 3], [1, 5, 3]) == (1, 2, 5)
    assert traffic.first_divergence([1, 2], [1, 2, 9]) == (2, None, 9)
    diffs = traffic.compare_outputs(["p0", "p1", "p2"], [[1, 2], [3, 4], [5]], [[1, 2], [3, 7], None], "x")
    assert [(d["prompt"], d["position"], d["tokens"]) for d in diffs] == [("p1", 1, [4, 7]), ("p2", None, [None, None])]
    assert diffs[0]["prefix"] == [3]


def test_traffic_near_tie_needs_both_tokens_close_to_the_best():
    lp = [math.log(p) for p in (0.4, 0.38, 0.22)]
    assert traffic.near_tie(lp, 0, 1)
    assert not traffic.near_tie(lp, 0, 2)
    assert not traffic.near_tie(lp, 1, None)


def test_traffic_cache_hits_and_streams():
    outs = [{"cached_tokens": 0}, {"cached_tokens": traffic.PREFIX_LEN + 3}, {"cached_tokens": 100}, None]
    assert traffic.cache_misses(outs, traffic.PREFIX_LEN) == [2, 3]
    assert traffic.cache_misses(outs, traffic.PREFIX_LEN, skip_first=False) == [0, 2, 3]
    assert traffic.stream_is_cumulative([[1], [1, 2, 3], [1, 2, 3, 4]])
    assert not traffic.stream_is_cumulative([[1], [2, 3]])  # incremental chunks: the last is not the output
    log = (
        "Prefill batch, #new-seq: 1, #new-token: 2048, x\nPrefill batch, #new-seq: 2, #new-token: 512, x\nDecode batch"
    )
    assert traffic.max_prefill_tokens(log) == 2048 and traffic.max_prefill_tokens("") == 0


def test_traffic_workload_is_seeded_and_of_the_planned_lengths():
    lang = traffic.sl.Language(kind="phrases")
    w = traffic.build_workload(lang)
    assert w == traffic.build_workload(traffic.sl.Language(kind="phrases"))
    assert [len(ids) for ids in w["chunked"]] == list(traffic.CHUNK_LENGTHS)
    for kind in ("radix_seq", "radix_conc", "witness"):
        assert all(ids[: traffic.PREFIX_LEN] == w["prefix"] for ids in w[kind])
    suffixes = [tuple(ids[traffic.PREFIX_LEN :]) for kind in ("radix_seq", "radix_conc", "witness") for ids in w[kind]]
    assert len(set(suffixes)) == len(suffixes)  # distinct suffixes
    assert all(0 < t < lang.vocab_size for ids in w["chunked"] for t in ids)
    jobs = traffic.sampled_jobs(w)
    assert sum(j[0] == "greedy" for j in jobs) == 16
    greedy_at = [i for i, j in enumerate(jobs) if j[0] == "greedy"]
    assert greedy_at[0] > 0 and greedy_at[-1] < len(jobs) - 1  # sampled requests before and after them
    per = {}
    for kind, key, setting, _ids, params in jobs:
        if kind == "sampled":
            per[(key, setting)] = per.get((key, setting), 0) + 1
            assert params["temperature"] > 0
    assert set(per.values()) == {traffic.SHORT_SAMPLES, traffic.LONG_SAMPLES}


class _FakeTarget:
    """The target's log-probabilities: token 1 after everything, token 2 close behind it."""

    def logprobs(self, ids):
        lp = [math.log(1e-3)] * 8
        lp[1], lp[2] = math.log(0.5), math.log(0.47)
        return lp


def _traffic_doc(ddtree_tokens, control_t2=None):
    """Raw results of four servers: NONE's greedy outputs are [1] * n; the DDTREE servers' as given."""
    w = traffic.build_workload(traffic.sl.Language(kind="phrases"))
    rng = random.Random(1)
    dist = {10: 0.6, 11: 0.3, 12: 0.1}

    def samples(argmax):
        out = []
        for key in w["sampled"]:
            for s in traffic.SETTINGS:
                for _i in range(traffic.SHORT_SAMPLES):
                    out.append([key, s["name"], [7, 10 if argmax else _draw(dist, 1, rng)[0]]])
        return out

    def server(tokens, argmax=False):
        def g(n):
            return [
                {"ids": list(tokens), "cached_tokens": traffic.PREFIX_LEN, "prompt_tokens": None} for _i in range(n)
            ]

        chunked = [{"ids": list(tokens), "prompt_tokens": n} for n in traffic.CHUNK_LENGTHS]
        stream = [dict(o, chunks=3, cumulative=True) for o in g(8) + chunked[:2]]
        abort = {k: g(8) for k in ("base", "during", "after")}
        abort.update(idle_after_s=0.5, health=200, flush_cache=200, health_end=200)
        abort.update({k: {"num_used_tokens": 0} for k in ("load_idle", "load_after", "load_flushed")})
        abort["victims"] = [{"cut": "close", "finish": None}] * 4 + [{"cut": "abort", "finish": "abort"}] * 4
        return {
            "radix": {"seq": g(8), "conc": g(16)},
            "chunked": {"seq": chunked, "conc": chunked},
            "mixed": {"greedy": g(16), "samples": samples(argmax), "errors": 0},
            "stream": {"outputs": stream},
            "abort": abort,
        }

    doc = {"servers": {"none": server([1] * 4)}}
    for name in traffic.DDTREES:
        doc["servers"][name] = server(ddtree_tokens)
    doc["servers"]["ddtree-control"] = {"mixed": server([1] * 4, argmax=True)["mixed"]}
    return doc, w


def _no_exact_fit(monkeypatch):
    """The exact fit needs the model; the stand-in target gives no logits, so the fit is replaced by a pass
    for lossless servers and a rejection for the control (the fit itself is tested above)."""

    def fit(samples, workload, target, setting):
        argmax = all(ids[1] == 10 for _k, _s, ids in samples)
        return {"p_value": 0.0 if argmax else 0.5, "rejected": argmax}

    monkeypatch.setattr(traffic, "fit_server", fit)


def test_traffic_checks_pass_a_lossless_run(monkeypatch):
    _no_exact_fit(monkeypatch)
    doc, w = _traffic_doc([1] * 4)
    unchunked = "Prefill batch, #new-seq: 1, #new-token: 4096, cuda graph: False"
    logs = {"none": "Prefill batch, #new-token: 2048, x", "ddtree-schedule": unchunked}
    checks = traffic.evaluate(doc, w, _FakeTarget(), logs=logs)
    assert {k: c["problems"] for k, c in checks.items() if not c["pass"]} == {
        "chunked": [
            "ddtree: no server log to read the prefill batches from",
            "ddtree-schedule: a prefill batch of 4096 new tokens (chunk 2048)",
        ]
    }
    logs = {n: "Prefill batch, #new-token: 2048, x" for n in ("none",) + traffic.DDTREES}
    checks = traffic.evaluate(doc, w, _FakeTarget(), logs=logs)
    assert all(c["pass"] for c in checks.values()), {k: c["problems"] for k, c in checks.items()}
    assert checks["mixed"]["tests"]["T1"]["ddtree-control"]["vs_none"]["rejected"]
    assert not checks["mixed"]["tests"]["T1"]["ddtree"]["vs_none"]["rejected"]


def test_traffic_checks_explain_a_near_tie_and_fail_a_wrong_token(monkeypatch):
    _no_exact_fit(monkeypatch)
    doc, w = _traffic_doc([1, 2, 1, 1])  # token 2 at position 1: within 0.1 nats of token 1
    checks = traffic.evaluate(doc, w, _FakeTarget())
    assert checks["radix"]["pass"] and checks["radix"]["differences"][0]["near_tie"]
    d = checks["radix"]["differences"][0]
    assert (d["prompt"], d["position"], d["tokens"]) == ("radix_seq[0]", 1, [1, 2])
    doc, w = _traffic_doc([1, 5, 1, 1])  # token 5: far below the target's best
    checks = traffic.evaluate(doc, w, _FakeTarget())
    for name in ("radix", "chunked", "mixed", "stream", "abort"):
        assert not checks[name]["pass"], name
        assert not checks[name]["differences"][0]["near_tie"]
    assert not traffic.evaluate(doc, w, None)["radix"]["pass"]  # no model: a difference stays unexplained


def test_traffic_checks_fail_a_lost_cache_a_held_kv_and_an_unrejected_control(monkeypatch):
    _no_exact_fit(monkeypatch)
    doc, w = _traffic_doc([1] * 4)
    doc["servers"]["ddtree"]["radix"]["conc"][3]["cached_tokens"] = 0
    doc["servers"]["ddtree"]["abort"]["load_idle"] = {"num_used_tokens": 37}
    doc["servers"]["ddtree"]["abort"]["victims"][5] = {"cut": "abort", "finish": "length"}
    doc["servers"]["ddtree-schedule"]["abort"]["idle_after_s"] = 25.0  # a closed victim ran on to its end
    doc["servers"]["ddtree-control"] = {"mixed": doc["servers"]["none"]["mixed"]}  # a lossless "control"
    checks = traffic.evaluate(doc, w, _FakeTarget())
    assert checks["radix"]["problems"] == ["ddtree: 1 request(s) missed the cached prefix: [11]"]
    assert "ddtree: load_idle num_used_tokens 37" in checks["abort"]["problems"]
    assert any("/abort_request victims finished with" in p for p in checks["abort"]["problems"])
    assert any(p.startswith("ddtree-schedule: busy 25.0 s after the witnesses") for p in checks["abort"]["problems"])
    assert any("control not rejected" in p for p in checks["mixed"]["problems"])


class _AbortableGenerate(http.server.BaseHTTPRequestHandler):
    """/generate streaming until /abort_request names its rid (then a last chunk with finish_reason abort)."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append((self.path, body))
        if self.path == "/abort_request":
            self.server.aborted.add(body["rid"])
            self.send_response(200)  # SGLang's answer: 200 and no body
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        ids = []
        for step in range(50):
            ids.append(step)
            done = body.get("rid") in self.server.aborted
            meta = {"completion_tokens": len(ids), "cached_tokens": 5, "prompt_tokens": len(body["input_ids"])}
            meta["finish_reason"] = {"type": "abort"} if done else None
            try:
                self.wfile.write(
                    b"data: " + json.dumps({"output_ids": list(ids), "meta_info": meta}).encode() + b"\n\n"
                )
                self.wfile.flush()
            except OSError:
                return
            if done:
                break
            time.sleep(0.01)
        try:
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            pass

    def log_message(self, *args):
        pass


def test_traffic_generate_streams_closes_and_aborts_by_rid(tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AbortableGenerate)
    httpd.bodies, httpd.aborted = [], set()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = scenario.Server("s", "DDTREE", None, httpd.server_address[1], str(tmp_path), str(tmp_path))
        out = traffic.generate(
            server, [4, 5, 6], {"max_new_tokens": 9}, stream=True, rid="r1", cut_after=3, cut="abort"
        )
        assert httpd.bodies[0][1]["input_ids"] == [4, 5, 6] and httpd.bodies[0][1]["rid"] == "r1"
        assert ("/abort_request", {"rid": "r1"}) in httpd.bodies
        assert out["finish"] == "abort" and out["cumulative"] and 3 <= out["chunks"] < 50 and out["prompt_tokens"] == 3
        out = traffic.generate(server, [4], {}, stream=True, rid="r2", cut_after=2, cut="close")
        assert out["chunks"] == 2 and out["finish"] is None and "r2" not in httpd.aborted
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_kv_pool_flags_replace_the_shapes_pool_only_when_asked():
    shaped = ["--load-format", "dummy", "--max-total-tokens", "32768"]
    assert scenario.kv_pool_flags(shaped, {}) == shaped
    assert scenario.kv_pool_flags(shaped, {"SCENARIO_KV_TOKENS": "16384"}) == [
        "--load-format",
        "dummy",
        "--max-total-tokens",
        "16384",
    ]
    assert scenario.kv_pool_flags([], {"SCENARIO_KV_TOKENS": "4096"}) == ["--max-total-tokens", "4096"]
    assert shaped[-1] == "32768"  # the shape's own list is never changed
    for bad in ("16k", "512"):
        with pytest.raises(ValueError, match="SCENARIO_KV_TOKENS"):
            scenario.kv_pool_flags(shaped, {"SCENARIO_KV_TOKENS": bad})


def test_plant_bench_reads_budget_concurrencies_with_schedules():
    got = plant_bench.budget_concs("31@1; 1:31,16:15,64:15@1,16")
    assert got == {"31": {1}, "1:31,16:15,64:15": {1, 16}}
    assert plant_bench.budget_concs("") == {}
    with pytest.raises(ValueError, match="BUDGET@C1,C2"):
        plant_bench.budget_concs("31:1")


def test_plant_bench_asks_enough_tokens_for_its_steps_and_long_prompts_hold_their_words():
    # a planted path of depth 15 emits up to 16 tokens a step: the wave must outlast the profiled steps
    assert plant_bench.new_tokens_for("last 15") >= 16 * plant_bench.STEPS
    assert plant_bench.new_tokens_for("none") >= plant_bench.STEPS
    prompts = ["a b c", "d e", "f g h i"]
    long = plant_bench.long_prompts(prompts, 10)
    assert [len(p.split()) for p in long] == [10, 10, 10]
    assert long[1].startswith("d e f g h i a b c")
