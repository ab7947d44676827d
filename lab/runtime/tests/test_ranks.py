"""One server on several nodes: the rank handshake (ranks.py) in-process, and two lab runtimes as rank 0 and
rank 1 of one server: the head serves only once the worker joined, a dead rank takes the other down, a
rank stopped on purpose ends the other cleanly, and a crash_rank fault kills its rank after the join."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest
from ddtree_lab_runtime.faults import LabConfigError, parse_faults
from ddtree_lab_runtime.ranks import RankError, RankGroup, parse_dist_init_addr

from ._harness import Runtime, free_port


def start_join(group: RankGroup) -> dict:
    outcome = {}

    def run():
        try:
            group.join()
            outcome["joined"] = True
        except RankError as err:
            outcome["error"] = str(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    outcome["thread"] = thread
    return outcome


def test_dist_init_addr_parses_hosts_and_bracketed_ipv6():
    assert parse_dist_init_addr("10.88.0.2:20000") == ("10.88.0.2", 20000)
    assert parse_dist_init_addr("[fd00::2]:20000") == ("fd00::2", 20000)
    with pytest.raises(RankError, match="is not HOST:PORT"):
        parse_dist_init_addr("10.88.0.2")


def test_the_head_waits_for_every_rank_and_a_worker_retries_until_the_head_is_up():
    port = free_port()
    worker = RankGroup(2, 1, f"127.0.0.1:{port}", join_seconds=10)
    worker_outcome = start_join(worker)  # the worker first: the head is not listening yet
    time.sleep(1.0)
    assert "joined" not in worker_outcome
    head = RankGroup(2, 0, f"127.0.0.1:{port}", join_seconds=10)
    head.join()
    worker_outcome["thread"].join(10)
    assert worker_outcome.get("joined") is True
    assert sorted(head.peers) == [1] and sorted(worker.peers) == [0]
    head.close()
    worker.close()


def test_a_head_whose_worker_never_comes_fails_naming_the_missing_rank():
    head = RankGroup(3, 0, f"127.0.0.1:{free_port()}", join_seconds=1)
    with pytest.raises(RankError, match=r"rank handshake timed out after 1 s: rank\(s\) \[1, 2\] did not join"):
        head.join()


def test_a_worker_whose_head_never_comes_fails_naming_the_head():
    port = free_port()
    worker = RankGroup(2, 1, f"127.0.0.1:{port}", join_seconds=1)
    with pytest.raises(RankError, match=f"the head at 127.0.0.1:{port} did not answer"):
        worker.join()


def test_a_rank_with_another_nnodes_is_refused_by_both():
    port = free_port()
    head = RankGroup(2, 0, f"127.0.0.1:{port}", join_seconds=5)
    head_outcome = start_join(head)
    time.sleep(0.3)
    worker = RankGroup(3, 1, f"127.0.0.1:{port}", join_seconds=5)
    with pytest.raises(RankError, match="the head refused rank 1: rank 1 says --nnodes 3, the head 2"):
        worker.join()
    head_outcome["thread"].join(5)
    assert "says --nnodes 3" in head_outcome.get("error", "")


def test_a_rank_out_of_range_is_refused_before_joining():
    with pytest.raises(RankError, match=r"--node-rank 2 is not in 0..1"):
        RankGroup(2, 2, "127.0.0.1:1")


def test_a_peer_gone_without_goodbye_is_lost_and_one_that_says_goodbye_left():
    port = free_port()
    events = []
    head = RankGroup(
        3,
        0,
        f"127.0.0.1:{port}",
        join_seconds=10,
        on_peer_lost=lambda message: events.append(("lost", message)),
        on_peer_left=lambda message: events.append(("left", message)),
    )
    head_outcome = start_join(head)
    workers = [RankGroup(3, rank, f"127.0.0.1:{port}", join_seconds=10) for rank in (1, 2)]
    outcomes = [start_join(worker) for worker in workers]
    for outcome in [head_outcome, *outcomes]:
        outcome["thread"].join(10)
        assert outcome.get("joined") is True, outcome
    # Rank 1 dies: its connection closes with no goodbye (as the kernel closes a dead process's sockets).
    workers[0].closing = True
    workers[0].peers[0].shutdown(socket.SHUT_RDWR)
    workers[1].close()  # rank 2 leaves on purpose
    deadline = time.time() + 5
    while len(events) < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert sorted(events) == [
        ("left", "rank 2 left the group"),
        ("lost", "rank 1 is gone: its connection closed without a goodbye"),
    ]
    head.close()


def test_the_crash_rank_fault_parses_and_a_bad_one_is_named():
    faults = parse_faults("crash_rank:1:0.5")
    assert (faults.crash_rank, faults.crash_rank_seconds) == (1, 0.5)
    assert parse_faults("crash_rank:1").crash_rank_seconds == 3.0
    assert faults.describe() == "crash_rank:1:0.5"
    with pytest.raises(LabConfigError, match="bad switch 'crash_rank:x'"):
        parse_faults("crash_rank:x")


# ---- two lab runtimes as the ranks of one server ----


def pair(tmp_path, name, env_head=None, env_worker=None, start_worker=True):
    dist = f"127.0.0.1:{free_port()}"
    flags = ["--nnodes", "2", "--dist-init-addr", dist, "--tp-size", "2"]
    env = {"LAB_RUNTIME_JOIN_SECONDS": "60"}
    head = Runtime(f"{name}-head", tmp_path, flags + ["--node-rank", "0"], env=dict(env, **(env_head or {})))
    worker = None
    if start_worker:
        worker = Runtime(f"{name}-worker", tmp_path, flags + ["--node-rank", "1"], env=dict(env, **(env_worker or {})))
    return head, worker


def test_two_ranks_serve_one_server_and_a_dead_worker_takes_the_head_down(tmp_path):
    head, worker = pair(tmp_path, "dies")
    try:
        assert head.wait_for("The server is fired up and ready to roll!", 240), head.log()[-3000:]
        assert "Rank 1 joined from 127.0.0.1" in head.log()
        assert worker.wait_for("Rank 1 is ready: rank 0 serves HTTP, this rank serves none", 60), worker.log()[-3000:]
        assert "Uvicorn running" not in worker.log()
        assert head.get("/health").status == 200
        worker.kill()  # SIGKILL: no goodbye
        assert head.wait_exit(30) == -signal.SIGKILL, head.log()[-3000:]
        assert "the group lost a rank: rank 1 is gone" in head.log()
        assert "Received sigquit from a child process" in head.log()
    finally:
        head.kill()
        if worker:
            worker.kill()


def test_a_rank_stopped_on_purpose_ends_the_other_cleanly(tmp_path):
    head, worker = pair(tmp_path, "stop")
    try:
        assert head.wait_for("The server is fired up and ready to roll!", 240), head.log()[-3000:]
        assert worker.wait_for("Rank 1 is ready", 60), worker.log()[-3000:]
        head.terminate()
        assert head.wait_exit(30) == 0, head.log()[-3000:]
        assert worker.wait_exit(30) == 0, worker.log()[-3000:]
        assert "rank 0 left the group: this rank shuts down too" in worker.log()
        assert "Scheduler hit an exception" not in head.log() + worker.log()
    finally:
        head.kill()
        worker.kill()


def test_the_head_does_not_serve_before_the_worker_joined(tmp_path):
    head, _ = pair(tmp_path, "alone", env_head={"LAB_RUNTIME_JOIN_SECONDS": "4"}, start_worker=False)
    try:
        assert head.wait_for("Rank 0 waits for 1 rank(s)", 240), head.log()[-3000:]
        assert head.wait_exit(60) == -signal.SIGKILL, head.log()[-3000:]
        log = head.log()
        assert "rank handshake timed out after 4 s: rank(s) [1] did not join" in log
        assert "Uvicorn running" not in log and "Load weight begin" not in log
    finally:
        head.kill()


def test_a_crash_rank_fault_kills_its_rank_after_the_join_and_the_head_follows(tmp_path):
    fault = {"LAB_RUNTIME_FAULT": "crash_rank:1:2"}
    head, worker = pair(tmp_path, "crash", env_head=fault, env_worker=fault)
    try:
        assert worker.wait_exit(240) == -signal.SIGKILL, worker.log()[-3000:]
        assert "RuntimeError: lab fault crash_rank: rank 1 failed" in worker.log()
        assert head.wait_exit(60) == -signal.SIGKILL, head.log()[-3000:]
        assert "the group lost a rank: rank 1 is gone" in head.log()
    finally:
        head.kill()
        worker.kill()
