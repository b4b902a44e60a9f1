"""torch_compare.py --link's bookkeeping (benchmarks/emulation/link_hosts.py): link counters, bytes
per step and per exchange, the wire-time bound, torchrun's per-host command, the table's
link columns; and, as root only, that the two emulated hosts and every process of a run
are gone after a run, after Ctrl-C and after SIGTERM.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, ROOT)
from benchmarks.emulation import link_hosts  # noqa: E402
from benchmarks.peers import torch_compare, torch_report  # noqa: E402

sys.path.remove(ROOT)

RUN = {"tx": 6_000_000, "rx": 2_000_000, "steps": 40, "exchanges": 4}


def test_link_figures_count_both_directions_per_step_and_per_exchange():
    got = link_hosts.link_figures(RUN, "100mbit")
    assert got["mb_per_step"] == pytest.approx(8.0 / 40)
    assert got["mb_per_exchange"] == pytest.approx(8.0 / 4)
    # The busier direction bounds the time: 150 kB per step at 12.5 MB/s.
    assert got["wire_s_per_step"] == pytest.approx(150_000 * 8 / 100e6)
    assert link_hosts.link_figures(RUN, "1gbit")["wire_s_per_step"] == pytest.approx(
        got["wire_s_per_step"] / 10)
    assert link_hosts.link_figures(None, "100mbit") == {}
    assert link_hosts.link_figures({**RUN, "steps": 0}, "100mbit") == {}
    assert "wire_s_per_step" not in link_hosts.link_figures(RUN, None)


def test_the_paper_cnns_gradients_need_a_sixth_of_a_second_each_way_at_100mbit():
    grads = 515_146 * 4   # models.paper_cnn_torch's parameters, float32
    assert link_hosts.wire_seconds(grads, "100mbit") == pytest.approx(0.165, abs=0.001)
    assert link_hosts.wire_seconds(grads, "1gbit") == pytest.approx(0.0165, abs=0.0001)


def test_an_unknown_rate_names_the_known_ones():
    with pytest.raises(ValueError, match="100mbit, 1gbit"):
        link_hosts.rate_bits("10mbit")


def test_torchrun_runs_one_process_per_host_on_a_static_rendezvous_at_host_a():
    cmd = link_hosts.torchrun_node_cmd(1, "10.213.0.1", ["script.py", "--ddp-rank"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    flags = dict(zip(cmd[3:-2:2], cmd[4:-2:2]))
    assert flags == {"--nnodes": "2", "--node-rank": "1", "--nproc-per-node": "1",
                     "--master-addr": "10.213.0.1", "--master-port": "29500",
                     "--max-restarts": "0"}
    assert cmd[-2:] == ["script.py", "--ddp-rank"]


def test_the_meter_counts_what_crossed_an_interface_between_start_and_stop():
    meter = link_hosts.LinkMeter("lo")
    if meter.read() is None:
        pytest.skip("no /sys/class/net/lo/statistics here")
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    meter.start()
    client.sendall(b"x" * 1_000_000)
    got = 0
    while got < 1_000_000:
        got += len(peer.recv(1 << 20))
    meter.stop()
    for s in (client, peer, server):
        s.close()
    record = meter.record(steps=10, exchanges=2)
    assert record["ifname"] == "lo"
    assert record["tx"] >= 1_000_000 and record["rx"] >= 1_000_000   # lo: both ways
    assert (record["steps"], record["exchanges"]) == (10, 2)


def test_the_meter_records_nothing_without_an_interface(monkeypatch):
    monkeypatch.delenv(link_hosts.LINK_IF_ENV, raising=False)
    meter = link_hosts.LinkMeter()
    meter.start()
    meter.stop()
    assert meter.record(10, 1) is None
    missing = link_hosts.LinkMeter("no-such-if0")
    missing.start()
    missing.stop()
    assert missing.record(10, 1) is None


def test_a_ddlf_run_of_one_round_has_its_link_record(monkeypatch):
    """The meter starts when training does, so Algorithm 6 for one epoch (one round, one
    row) is measured too; a step is a trainer's batch, an exchange a round."""
    monkeypatch.setenv(link_hosts.LINK_IF_ENV, "lo")
    if link_hosts.LinkMeter().read() is None:
        pytest.skip("no /sys/class/net/lo/statistics here")
    rows = torch_compare.link_rows(workers=2)
    rows.on_train_begin(None)
    rows.on_row({"round": 1, "samples": 3200}, None)
    record = rows.record()
    assert record is not None and record["ifname"] == "lo"
    assert (record["steps"], record["exchanges"]) == (50, 1)


def _run(column, link, s_per_epoch, record=None, totals=None):
    timeline = [{"epoch": 0.5, "train_s": s_per_epoch / 2, "test_loss": 1.0,
                 "test_accuracy": 0.80, "eval_s": 0.1},
                {"epoch": 1.0, "train_s": s_per_epoch, "test_loss": 0.5,
                 "test_accuracy": 0.86, "eval_s": 0.1}]
    return {"column": column, "lr": 0.03, "seed": 0, "loadavg": 1.0, "link_rate": link,
            "startup_s": 2.0, "train_s": s_per_epoch, "timeline": timeline, "link": record,
            "link_total": totals}


def test_the_table_has_link_columns_only_with_link_runs():
    plain = torch_report.report_table([_run("torch-ddp", None, 30.0)], 0.85, "t")
    assert "MB/step" not in plain
    table = torch_report.report_table(
        [_run("torch-1p", None, 20.0),
         _run("torch-ddp", "100mbit", 30.0, RUN, [{"tx": 7_000_000, "rx": 2_500_000},
                                                  {"tx": 2_500_000, "rx": 7_000_000}])],
        0.85, "t")
    head, _, single, ddp = table.splitlines()[2:6]
    assert "| link | link MB (run) | MB/step | MB/exchange | wire s/step |" in head
    assert "| - | - | - | - | - |" in single   # a single process: no link
    cells = [c.strip() for c in ddp.split("|")]
    # The run's total is host A's link, both ways, start-up included (B's is the same).
    assert cells[cells.index("100mbit") + 1:cells.index("100mbit") + 5] == [
        "9.5", "0.200", "2.00", "0.012"]
    assert len(cells) == len([c.strip() for c in head.split("|")])


# -- root only: the hosts and every process of a run go away ----------------------------------

_why = link_hosts.link_unavailable(1.0)
root_only = pytest.mark.skipif(_why is not None, reason=f"cannot emulate hosts: {_why}")


def _gone(hosts) -> list:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [ns for ns in hosts.hosts.ns if ns in listed.split()]
    if subprocess.run(["ip", "link", "show", "dev", hosts.hosts.bridge],
                      capture_output=True).returncode == 0:
        left.append(hosts.hosts.bridge)
    if hosts.groups is not None and os.path.exists(hosts.groups.run.path):
        left.append(hosts.groups.run.path)
    return left


@root_only
@pytest.mark.timeout(90)
def test_a_run_ends_every_process_it_started_and_close_removes_the_hosts(no_leaks):
    hosts = link_hosts.LinkHosts("100mbit", host_cpus=1.0, priority=0.02).up()
    try:
        # A session leader that leaves a child behind: the cgroup still finds the child.
        procs = [hosts.popen(i, ["sh", "-c", "sleep 300 & exec sleep 300"]) for i in (0, 1)]
        time.sleep(0.5)
        members = [g.pids() for g in hosts.host_groups]
        assert all(len(m) >= 2 for m in members), members
        hosts.end_run(grace_s=2.0)
        assert all(p.poll() is not None for p in procs)
        assert [g.pids() for g in hosts.host_groups] == [[], []]
        before = hosts.counters()
        assert len(before) == 2 and all(c["tx"] >= 0 for c in before)
    finally:
        left = hosts.close()
    assert left == [] and _gone(hosts) == []


@root_only
@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torchrun's ranks need PyTorch: pip install -e '.[torch]'")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_signal_mid_run_removes_the_hosts_and_the_runs_processes(no_leaks, how):
    """torch_compare.py --link interrupted while torchrun's two ranks train."""
    # A user's Ctrl-C reaches a script whose SIGINT is at its default. A suite started in
    # the background of a non-interactive shell (`nohup pytest ... &`) has SIGINT ignored,
    # children inherit that, and Python then installs no KeyboardInterrupt: the script
    # ignored the Ctrl-C until SIGTERM (two full-suite runs on 2026-11-29). A handler, unlike
    # SIG_IGN, is reset to the default across exec, so the child starts as from a terminal.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, os.path.join(BENCH, "peers", "torch_compare.py"), "--link",
             "100mbit", "--priority", "0.02", "--columns", "torch-ddp", "--seeds", "0",
             "--epochs", "50", "--limit", "640", "--eval-limit", "100", "--evals-per-epoch",
             "1", "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, inherited)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True).start()
    seen: list = []
    try:
        ns, bridge, cgroup, pids = _wait_for_both_ranks(proc, lines, seen)
    except BaseException:
        # Whatever failed, the script must still tear its hosts down: SIGTERM is its
        # ordinary way out (a SIGKILL, or leaving it running, would leave them behind).
        proc.terminate()
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        raise
    time.sleep(3)   # rendezvous, gloo's connections across the link, training
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.terminate()
    t0 = time.monotonic()
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        # Say where the run was, then end it as a user would (SIGTERM, then SIGKILL), so
        # the teardown checks still run (seen when SIGINT reached the script ignored; see
        # the start of this test).
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        while not lines.empty():
            seen.append(lines.get())
        raise AssertionError(f"still running 90 s after {how}; its last output:\n"
                             + "".join(seen)[-3000:]) from None
    assert time.monotonic() - t0 < 60   # bounded
    time.sleep(0.5)
    while True:
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            break
    assert any("nothing left" in ln for ln in seen), "".join(seen)[-3000:]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [n for n in ns if n in listed.split()]
    assert subprocess.run(["ip", "link", "show", "dev", bridge],
                          capture_output=True).returncode != 0
    assert not os.path.exists(cgroup)
    alive = [p for p in pids if _cmdline(p) is not None]
    assert not alive, alive


def _cmdline(pid: int) -> list | None:
    """A live process's command line; None once it is gone (or a zombie)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return None if p.status() == psutil.STATUS_ZOMBIE else p.cmdline()
    except psutil.Error:
        return None


def _wait_for_both_ranks(proc, lines: queue.Queue, seen: list):
    """Read torch_compare's log until its torch-ddp run starts, then watch the hosts'
    cgroups until both ranks run; the namespaces, the bridge, the run's cgroup and the
    processes in it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:   # until the run starts
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            assert proc.poll() is None, "".join(seen)[-3000:]
            continue
        if seen[-1].startswith("torch-ddp seed 0"):
            break
    else:
        pytest.fail("the run did not start within 60 s: " + "".join(seen)[-3000:])
    words = next(ln for ln in seen if ln.startswith("link: namespaces")).replace(",", "")
    _, _, ns_a, ns_b, _, bridge, _, cgroup = words.split()

    def members() -> list:
        found = []
        for dirpath, _dirs, files in os.walk(cgroup):
            if "cgroup.procs" in files:
                with open(os.path.join(dirpath, "cgroup.procs")) as f:
                    found += [int(p) for p in f.read().split()]
        return found

    # The agents' command lines carry the script's flags too (--ddp-rank among them):
    # a rank is a process with them that is not an agent.
    ranks: list = []
    while time.monotonic() < deadline + 60 and len(ranks) < 2:   # both ranks started
        time.sleep(0.5)
        ranks = [p for p in members() if "--ddp-rank" in (_cmdline(p) or [])
                 and "torch.distributed.run" not in _cmdline(p)]
    pids = members()
    assert len(ranks) == 2 and len(pids) >= 4, pids   # two torchrun agents and their ranks
    return [ns_a, ns_b], bridge, cgroup, pids
