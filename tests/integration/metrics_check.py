#!/usr/bin/env python3
"""metrics_check.py: helpers of test_node_metrics.sh (`starling node
--metrics`, docs/operations.md "Metrics"), standard library only.

    metrics_check.py check STARLING DATA_DIR OUT.txt
                                        reads the node's `status --json` and
                                        then its /metrics (kept in OUT.txt):
                                        every figure of status has its
                                        series, each family its HELP and
                                        TYPE, histograms agree with their
                                        counters; /other is 404
    metrics_check.py listen PID         "127.0.0.1:PORT": where process PID
                                        listens on TCP (from /proc)
    metrics_check.py promql PROM_ADDR QUERY INSTANCE...
                                        exit 0 when the instant query gives a
                                        value > 0 for each instance (prints
                                        them), 1 otherwise
"""
import json
import math
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

# status --json key -> (metric, labels). A key missing here fails the check:
# a figure added to status needs its series in node/daemon/daemon_metrics.c.
SIMPLE = {
    "boot_epoch": ("starling_boot_epoch", {}),
    "uptime_s": ("starling_uptime_seconds", {}),
    "step": ("starling_step", {}),
    "epoch": ("starling_epoch", {}),
    "loss": ("starling_loss", {}),
    "test_loss": ("starling_test_loss", {}),
    "test_accuracy": ("starling_test_accuracy", {}),
    "samples_per_sec": ("starling_samples_per_second", {}),
    "samples": ("starling_samples_total", {}),
    "corrections_applied": ("starling_corrections_applied_total", {}),
    "checkpoints_written": ("starling_checkpoints_total", {}),
    "checkpoint_step": ("starling_checkpoint_step", {}),
    "peers_alive": ("starling_members", {"state": "alive"}),
    "peers_suspect": ("starling_members", {"state": "suspect"}),
    "peers_dead": ("starling_members", {"state": "dead"}),
    "exchanges_ok": ("starling_exchanges_total", {"result": "ok"}),
    "exchanges_failed": ("starling_exchanges_total", {"result": "failed"}),
    "exchanges_busy": ("starling_exchanges_total", {"result": "busy"}),
    "exchanges_dropped": ("starling_exchanges_total", {"result": "dropped"}),
    "exchanges_clipped": ("starling_exchanges_clipped_total", {}),
    "clip_bound": ("starling_clip_bound", {}),
    "suspects": ("starling_suspects", {}),
    "suspicion_set_aside": ("starling_suspicion_set_aside", {}),
    "state_transfers": ("starling_state_transfers_total", {}),
    "state_transfers_refused_step":
        ("starling_state_transfers_refused_step_total", {}),
    "state_transfers_held": ("starling_state_transfers_held_total", {}),
    # The mean is the histogram's _sum / _count.
    "exchange_ms_mean": ("starling_exchange_duration_seconds_sum", {}),
    "exchange_ms_last": ("starling_exchange_last_duration_seconds", {}),
    "ring_rounds_ok": ("starling_ring_rounds_total", {"result": "ok"}),
    "ring_rounds_aborted": ("starling_ring_rounds_total",
                            {"result": "aborted"}),
    "ring_lanes_refused": ("starling_ring_lanes_refused_total", {}),
    "ring_rounds_clipped": ("starling_ring_rounds_clipped_total", {}),
    "ring_rounds_nonfinite": ("starling_ring_rounds_nonfinite_total", {}),
    "ring_proposals_distrusted":
        ("starling_ring_proposals_distrusted_total", {}),
    "ring_progress": ("starling_ring_progress", {}),
    "ring_last_ok": ("starling_ring_last_ok", {}),
    "ring_last_coded": ("starling_ring_last_coded", {}),
    "ring_final_round": ("starling_ring_final_round", {}),
    "ring_last_ms": ("starling_ring_last_duration_seconds", {}),
    "ring_last_members": ("starling_ring_last_members", {}),
    "bytes_in": ("starling_network_receive_bytes_total", {}),
    "bytes_out": ("starling_network_transmit_bytes_total", {}),
    "packets_in": ("starling_network_receive_packets_total", {}),
    "packets_out": ("starling_network_transmit_packets_total", {}),
    "connections": ("starling_connections", {}),
    "connections_preauth": ("starling_connections_preauth", {}),
    "fetches_serving": ("starling_state_transfers_serving", {}),
    "control_clients": ("starling_control_clients", {}),
}
ATTACH = {
    "attached": "starling_attach_program_attached",
    "sessions": "starling_attach_sessions_total",
    "program_boundaries": "starling_attach_program_boundaries_total",
    "program_requests": "starling_attach_program_requests_total",
    "stale_snapshots": "starling_attach_stale_snapshots_total",
    "nonfinite_snapshots": "starling_attach_nonfinite_snapshots_total",
    "refused": "starling_attach_refused_total",
}
COLLECTIVES = {
    "ok": ("starling_collectives_total", {"result": "ok"}),
    "failed": ("starling_collectives_total", {"result": "failed"}),
    "running": ("starling_collectives_running", {}),
    "dropped": ("starling_collectives_dropped_total", {}),
    "kept_bytes": ("starling_collectives_kept_bytes", {}),
    "bytes_in": ("starling_collectives_receive_bytes_total", {}),
    "bytes_out": ("starling_collectives_transmit_bytes_total", {}),
    "sessions": ("starling_collectives_sessions", {}),
    "sessions_refused": ("starling_collectives_sessions_refused_total", {}),
    "shm_ops": ("starling_collectives_shm_operations_total", {}),
    "shm_failed": ("starling_collectives_shm_failed_total", {}),
    "published": ("starling_published_tensors", {}),
    "published_bytes": ("starling_published_bytes", {}),
    "publishes": ("starling_publishes_total", {}),
    "fetches_served": ("starling_fetches_total", {"result": "served"}),
    "fetches_missing": ("starling_fetches_total", {"result": "missing"}),
    "fetches_busy": ("starling_fetches_total", {"result": "busy"}),
}
COMPRESSION = {
    "coded_bytes": ("starling_compression_coded_bytes", {}),
    "anchors": ("starling_compression_anchors_total", {}),
    "exchanges_compressed": ("starling_exchanges_compressed_total", {}),
    "rings_coded": ("starling_rings_coded_total", {}),
}
OUTER = {
    "lr": ("starling_outer_learning_rate", {}),
    "momentum": ("starling_outer_momentum", {}),
    "local_steps": ("starling_ring_local_steps", {}),
    "steps": ("starling_outer_steps_total", {}),
    "starts": ("starling_outer_starts_total", {}),
    "skipped": ("starling_outer_skipped_total", {}),
    "resumed": ("starling_outer_resumed_total", {}),
}
SYNC = {
    "donors": ("starling_sync_donors", {}),
    "ok": ("starling_sync_total", {}),
    "single_donor": ("starling_sync_single_donor_total", {}),
    "manifests": ("starling_sync_manifests_total", {}),
    "chunks_ok": ("starling_sync_chunks_total", {}),
    "chunks_bad": ("starling_sync_chunks_bad_total", {}),
    "donors_bad": ("starling_sync_donors_bad_total", {}),
    "donors_lost": ("starling_sync_donors_lost_total", {}),
    "disagreed": ("starling_sync_disagreed_total", {}),
    "backoffs": ("starling_sync_backoffs_total", {}),
    "served_manifests": ("starling_sync_served_manifests_total", {}),
    "served_chunks": ("starling_sync_served_chunks_total", {}),
    "refused": ("starling_sync_refused_total", {}),
    "serving": ("starling_sync_serving", {}),
}
ADMIN_REQUESTS = ("granted", "already", "refused")
ENUMS = {"state": "starling_node_state", "ring_state": "starling_ring_state"}
INFO = ("id", "address", "model")  # labels of starling_node_info
# Identifiers, not figures: the endpoint's own address, round ids and the
# agreed state's id.
NOT_FIGURES = ("metrics", "ring_round", "ring_last_round", "agreed")

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, labels as sorted tuple): value}, and the families with
    HELP and TYPE."""
    series, helped, typed = {}, set(), {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            typed[line.split()[2]] = line.split()[3]
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if not m:
                sys.exit(f"not an exposition line: {line!r}")
            labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
            series[(m.group(1), labels)] = float(m.group(3))
    return series, helped, typed


def family_of(name, typed):
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and typed.get(base) == "histogram":
            return base
    return name


def need(series, name, labels):
    key = (name, tuple(sorted(labels.items())))
    if key not in series:
        sys.exit(f"no series {name}{labels or ''} in the exposition")
    return series[key]


def check_histogram(series, name, labels, count_of):
    """Cumulative buckets ending in +Inf == _count == the counter."""
    buckets = sorted(
        (float(dict(lb)["le"]), v) for (n, lb), v in series.items()
        if n == name + "_bucket" and set(labels.items()) <= set(lb))
    if not buckets or buckets[-1][0] != math.inf:
        sys.exit(f"{name}{labels}: no le=\"+Inf\" bucket")
    values = [v for _, v in buckets]
    if values != sorted(values):
        sys.exit(f"{name}{labels}: buckets not cumulative: {values}")
    count = need(series, name + "_count", labels)
    if values[-1] != count or count != count_of:
        sys.exit(f"{name}{labels}: +Inf bucket {values[-1]}, _count {count},"
                 f" counter {count_of}: they must agree")
    return count


def get(url):
    """(HTTP status, body)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def check(starling, data_dir, out_path):
    status = json.loads(subprocess.run(
        [starling, "status", "--json", "--data-dir", data_dir],
        check=True, capture_output=True, text=True).stdout)
    code, text = get(f"http://{status['metrics']}/metrics")
    if code != 200:
        sys.exit(f"GET /metrics: HTTP {code}")
    open(out_path, "w").write(text)
    code, _ = get(f"http://{status['metrics']}/other")
    if code != 404:
        sys.exit(f"GET /other: HTTP {code}, want 404")
    series, helped, typed = parse(text)
    for name, _ in series:
        fam = family_of(name, typed)
        if fam not in helped or fam not in typed:
            sys.exit(f"{name}: its family {fam} lacks # HELP or # TYPE")
    checked = 0
    for key, value in status.items():
        if key in SIMPLE:
            need(series, *SIMPLE[key])
        elif key in ENUMS:
            on = [dict(lb)["state"] for (n, lb), v in series.items()
                  if n == ENUMS[key] and v == 1]
            if len(on) != 1 or (key == "state" and on[0] != value):
                sys.exit(f"{ENUMS[key]}: {on} set, status says {value!r}")
        elif key in INFO:
            info = [dict(lb) for (n, lb) in series if n == "starling_node_info"]
            if len(info) != 1 or info[0].get(key) != value:
                sys.exit(f"starling_node_info {info}: {key} is not {value!r}")
        elif key == "rejected":
            for reason in value:
                need(series, "starling_rejected_total", {"reason": reason})
            checked += len(value) - 1
        elif key == "attach":
            for k in value:
                if k not in ATTACH:
                    sys.exit(f"status key attach.{k} has no metric")
                need(series, ATTACH[k], {})
            checked += len(value) - 1
        elif key == "collectives":
            for k in value:
                if k not in COLLECTIVES:
                    sys.exit(f"status key collectives.{k} has no metric")
                need(series, *COLLECTIVES[k])
            checked += len(value) - 1
        elif key == "compression":
            for k, v in value.items():
                if k == "codec":
                    need(series, "starling_compression_info", {"codec": v})
                elif k == "dropped":
                    for reason, n in v.items():
                        if need(series, "starling_codec_dropped_total",
                                {"reason": reason}) != n:
                            sys.exit(f"codec drops {reason}: status {n}")
                elif k in COMPRESSION:
                    need(series, *COMPRESSION[k])
                else:
                    sys.exit(f"status key compression.{k} has no metric")
            checked += len(value) - 1
        elif key == "outer":
            for k, v in value.items():
                if k == "optimizer":
                    need(series, "starling_outer_info", {"optimizer": v})
                elif k in OUTER:
                    got = need(series, *OUTER[k])
                    # The settings must match; the counters may have moved
                    # between the status and the scrape.
                    if k in ("lr", "momentum", "local_steps") and got != v:
                        sys.exit(f"outer.{k}: status {v}, metric {got}")
                else:
                    sys.exit(f"status key outer.{k} has no metric")
            checked += len(value) - 1
        elif key == "sync":
            for k, v in value.items():
                if k not in SYNC:
                    sys.exit(f"status key sync.{k} has no metric")
                got = need(series, *SYNC[k])
                if k == "donors" and got != v:
                    sys.exit(f"sync.donors: status {v}, metric {got}")
            checked += len(value) - 1
        elif key == "cluster_requests":
            for k, v in value.items():
                if k not in ADMIN_REQUESTS:
                    sys.exit(f"status key cluster_requests.{k} has no metric")
                if need(series, "starling_cluster_requests_total",
                        {"result": k}) != v:
                    sys.exit(f"cluster_requests.{k}: status {v}")
            checked += len(value) - 1
        elif key not in NOT_FIGURES:
            sys.exit(f"status --json key {key!r} has no metric: add it to "
                     "node/daemon/daemon_metrics.c and to this table")
        checked += 1
    if need(series, "starling_boot_epoch", {}) != status["boot_epoch"]:
        sys.exit("starling_boot_epoch differs from status")
    ok = check_histogram(series, "starling_exchange_duration_seconds", {},
                         need(series, "starling_exchanges_total",
                              {"result": "ok"}))
    rings = 0
    for result in ("ok", "aborted"):
        rings += check_histogram(
            series, "starling_ring_round_duration_seconds",
            {"result": result},
            need(series, "starling_ring_rounds_total", {"result": result}))
    if ok == 0:
        sys.exit("no exchange in starling_exchange_duration_seconds")
    print(f"{checked} status figures, {len(series)} series; "
          f"{ok:.0f} exchanges and {rings:.0f} ring rounds in the histograms;"
          " /other is 404")


def listen(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            m = re.match(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))
    for line in open(f"/proc/{pid}/net/tcp").readlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:  # TCP_LISTEN
            ip, port = f[1].split(":")
            addr = ".".join(str(int(ip[i:i + 2], 16)) for i in (6, 4, 2, 0))
            print(f"{addr}:{int(port, 16)}")
            return
    sys.exit(1)


def promql(addr, query, instances):
    url = f"http://{addr}/api/v1/query?" + urllib.parse.urlencode(
        {"query": query})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            doc = json.load(r)
    except (urllib.error.URLError, OSError):
        sys.exit(1)
    got = {s["metric"].get("instance"): float(s["value"][1])
           for s in doc["data"]["result"]}
    print(" ".join(f"{i}={v:.0f}" for i, v in sorted(got.items())))
    sys.exit(0 if all(got.get(i, 0) > 0 for i in instances) else 1)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "check":
        check(*args)
    elif cmd == "listen":
        listen(args[0])
    elif cmd == "promql":
        promql(args[0], args[1], args[2:])
    else:
        sys.exit(f"unknown command {cmd}")
