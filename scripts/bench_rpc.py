#!/usr/bin/env python3
"""Serving over llama.cpp's RPC backend, measured: tokens/s with and without the drafter on
this machine alone and over two RPC workers on loopback, and what one request moves over
the wire per target pass and per draft step (`make bench-rpc`).

Each worker is `gguf-exact rpc-server` (the CPU build) behind a counting TCP proxy in this
process: the head (`llama-server --rpc`) talks to the proxies. The proxy reads the
protocol's requests (a command byte, a u64 size, the payload) and forwards every byte
unchanged; it counts each command's bytes, and a GET_TENSOR's answer from the size it
asks for. Each GRAPH_COMPUTE (or GRAPH_RECOMPUTE, the same graph again) ends one worker's
share of a pass: the SET_TENSORs before it (inputs: activations, positions, masks) and
the GET_TENSORs after it (outputs) are counted to it, by graph (its node count tells the
target's layers from the drafter's). Two requests per arm, of N1 and N2 tokens from the
same prompt, are taken apart, so the prompt's pass drops out.

Loopback shows the protocol's cost, not a speed-up: both workers share this machine's
cores with the head, and what crosses the wire crosses memory. On a real network add
(bytes per pass / bandwidth + round trips x latency) per target pass and per draft step.

    .venv/bin/python scripts/bench_rpc.py --shape e2b             # full-size E2B pair (made once under --work)
    .venv/bin/python scripts/bench_rpc.py --tiny --n2 48          # the tiny pair, in seconds
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.rpc_worker import plan_worker, start_worker
from gguf_exact.engines.serve import plan_serve
from gguf_exact.engines.shared.http import post_json
from gguf_exact.engines.shared.process import free_port, scratch_run_root
from gguf_exact.engines.shared.settings import ServeSettings, WorkerSettings
from gguf_exact.engines.shared.status import stop_server

GRAPH_COMPUTE, GET_TENSOR, SET_TENSOR, GRAPH_RECOMPUTE = 10, 8, 6, 16  # enum rpc_cmd at the pinned commit
PROMPT = "The quick brown fox"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Wire:
    """One worker's traffic: bytes each way, per command, and per graph (node count)."""

    to_worker: int = 0
    from_worker: int = 0
    commands: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # cmd: [count, bytes]
    graphs: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # n_nodes: [passes, bytes]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> dict:
        with self.lock:
            return {"graphs": {k: list(v) for k, v in self.graphs.items()}, "to": self.to_worker, "from": self.from_worker}


def hang_up(sock: socket.socket) -> None:
    """Close both ways: shutdown wakes the thread reading the socket and sends the FIN (a
    plain close would not while that thread is in recv, and a worker serves one client at a
    time: it would wait for this one forever)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


KEEP = 16 << 20  # payloads up to this size are kept to be read (graphs are a few MiB at most)


class Tally:
    """One connection's requests, counted into its worker's :class:`Wire`: each command, and
    each graph's share (the inputs set before it, the outputs got after it)."""

    def __init__(self, wire: Wire):
        self.wire, self.graph, self.pending = wire, None, 0

    def command(self, cmd: int, payload: bytes, nbytes: int) -> None:
        if cmd == GET_TENSOR:
            nbytes += 8 + struct.unpack("<Q", payload[-8:])[0]  # its answer: the bytes it asks for
        with self.wire.lock:
            c = self.wire.commands[cmd]
            c[0], c[1] = c[0] + 1, c[1] + nbytes
            if cmd in (GRAPH_COMPUTE, GRAPH_RECOMPUTE):
                if cmd == GRAPH_COMPUTE:
                    self.graph = struct.unpack("<I", payload[4:8])[0]  # its node count
                g = self.wire.graphs[self.graph]
                g[0], g[1], self.pending = g[0] + 1, g[1] + self.pending + nbytes, 0
            elif cmd == GET_TENSOR and self.graph is not None and self.pending == 0:
                self.wire.graphs[self.graph][1] += nbytes  # an output of the graph just run
            else:
                self.pending += nbytes  # inputs of the next graph (or loading: weights)


class CountingProxy:
    """A loopback TCP proxy in front of one worker that counts the RPC protocol's bytes."""

    def __init__(self, worker_host: str, worker_port: int):
        self.worker, self.wire = (worker_host, worker_port), Wire()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.worker)
            for sock in (client, upstream):  # as ggml-rpc's own sockets: no Nagle delay on small messages
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._answers, args=(upstream, client), daemon=True).start()

    def _answers(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 20):
                with self.wire.lock:
                    self.wire.from_worker += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            hang_up(dst)

    def _requests(self, src: socket.socket, dst: socket.socket) -> None:
        """Forward the head's requests and parse them as they pass: a 9-byte header, then the
        payload (kept when small: graphs and GET_TENSOR requests; large SET_TENSORs only counted)."""
        tally = Tally(self.wire)
        header, cmd, size, remaining, kept = b"", None, 0, 0, None
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
                view, i = memoryview(data), 0
                with self.wire.lock:
                    self.wire.to_worker += len(data)
                while i < len(view):
                    if cmd is None:
                        take = min(9 - len(header), len(view) - i)
                        header, i = header + bytes(view[i : i + take]), i + take
                        if len(header) < 9:
                            continue
                        cmd, size = header[0], struct.unpack("<Q", header[1:])[0]
                        header, remaining, kept = b"", size, bytearray() if size <= KEEP else None
                    take = min(remaining, len(view) - i)
                    if kept is not None:
                        kept += view[i : i + take]
                    remaining, i = remaining - take, i + take
                    if remaining == 0:
                        tally.command(cmd, bytes(kept) if kept is not None else b"", 9 + size)
                        cmd = None
        except OSError:
            pass
        finally:
            hang_up(dst)

    def close(self) -> None:
        self.server.close()


def request(url: str, n: int) -> dict:
    body = {"prompt": PROMPT, "n_predict": n, "temperature": 0, "cache_prompt": False, "ignore_eos": True}
    return post_json(url + "/completion", body, timeout=1800)


def delta(a: dict, b: dict) -> dict:
    graphs = {k: [b["graphs"][k][0] - a["graphs"].get(k, [0, 0])[0], b["graphs"][k][1] - a["graphs"].get(k, [0, 0])[1]]
              for k in b["graphs"]}  # fmt: skip
    return {"graphs": {k: v for k, v in graphs.items() if v[0]}, "to": b["to"] - a["to"], "from": b["from"] - a["from"]}


def arm(
    name: str, target: Path, drafter: Path | None, sets: list[str], rpc: tuple[str, ...], proxies, runs, args, placed=False
) -> dict:
    """One server: a warm-up, then requests of N1 and N2 tokens; their figures and, over RPC, the wire's."""
    settings = ServeSettings(target, drafter, args.profile, tuple(sets), port=free_port(), rpc=rpc, runs=runs)
    # placed: as `serve --rpc` plans it (the drafter on the device with the caches it reads);
    # else llama.cpp's default (the drafter's layers follow the target's devices)
    launch = plan_serve(settings).launch if placed else plan_launch(settings)
    t0 = time.monotonic()
    start_server(launch, detach=True, timeout=1800)
    load = time.monotonic() - t0
    try:
        request(launch.url, 4)
        snaps, answers = [], []
        for n in (args.n1, args.n2):
            before = [p.wire.snapshot() for p in proxies]
            answers.append(request(launch.url, n))
            snaps.append([delta(b, p.wire.snapshot()) for b, p in zip(before, proxies)])
    finally:
        stop_server(launch.port, runs)
    t1, t2 = answers[0]["timings"], answers[1]["timings"]
    out = {
        "arm": name,
        "load_seconds": round(load, 1),
        "tokens_per_second": t2["predicted_per_second"],
        "draft_n": t2.get("draft_n", 0),
        "draft_accepted": t2.get("draft_n_accepted", 0),
        "tokens": answers[1]["tokens"] if "tokens" in answers[1] else None,
        "content": answers[1]["content"],
    }
    if proxies:
        tokens = t2["predicted_n"] - t1["predicted_n"]
        drafts = t2.get("draft_n", 0) - t1.get("draft_n", 0)
        accepted = t2.get("draft_n_accepted", 0) - t1.get("draft_n_accepted", 0)
        workers = []
        for d1, d2 in zip(*snaps):
            graphs = {}
            for k, (count, nbytes) in d2["graphs"].items():
                c1, b1 = d1["graphs"].get(k, [0, 0])
                graphs[str(k)] = {"passes": count - c1, "bytes": nbytes - b1}
            workers.append({"graphs": graphs, "to_worker": d2["to"] - d1["to"], "from_worker": d2["from"] - d1["from"]})
        out["wire"] = {"tokens": tokens, "draft_steps": drafts, "target_passes": tokens - accepted, "workers": workers}
        out["command"] = launch.command
    log(f"{name}: {out['tokens_per_second']:.2f} tokens/s, drafts {out['draft_accepted']}/{out['draft_n']}, load {load:.0f} s")
    return out


def split_wire(alone: dict, drafted: dict) -> dict:
    """Bytes per target pass and per draft step from the arms' wire counts. Each worker runs
    one target graph per target pass (tokens - accepted drafts of them with the drafter); its
    other graphs are the drafter's, one per draft step, on every worker that holds a drafter
    layer."""
    per_pass_alone = sum(g["bytes"] for w in alone["wire"]["workers"] for g in w["graphs"].values())
    per_pass_alone /= alone["wire"]["target_passes"]
    passes, steps = drafted["wire"]["target_passes"], drafted["wire"]["draft_steps"]
    verify = draft = 0
    for w in drafted["wire"]["workers"]:
        for g in w["graphs"].values():
            if g["passes"] == passes:
                verify += g["bytes"]
            else:
                draft += g["bytes"]
    total = lambda a: sum(w["to_worker"] + w["from_worker"] for w in a["wire"]["workers"])  # noqa: E731
    return {
        "bytes_per_target_pass_alone": round(per_pass_alone),
        "bytes_per_verify_pass": round(verify / passes),
        "bytes_per_draft_step": round(draft / steps) if steps else None,
        "target_passes": passes,
        "draft_steps": steps,
        "wire_bytes_per_token_alone": round(total(alone) / alone["wire"]["tokens"]),
        "wire_bytes_per_token_drafted": round(total(drafted) / drafted["wire"]["tokens"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="e2b", help="e2b or e4b: the full-size pair made under --work")
    ap.add_argument("--tiny", action="store_true", help="the tiny hidden-state pair instead (seconds, for a smoke run)")
    ap.add_argument("--work", type=Path, default=Path("build/rpc-bench"))
    ap.add_argument("--kind", default="mixed", help="the drafter kind make-pair writes (mixed: right part of the time)")
    ap.add_argument("--n1", type=int, default=8)
    ap.add_argument("--n2", type=int, default=40)
    ap.add_argument("--n-max", type=int, default=2, help="a fixed draft length (the drafter arm)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--profile", default="cpu", help="the head's serving profile (a GPU one: its card joins the split)")
    ap.add_argument("--workers", default=None, metavar="HOST:PORT[,...]",
                    help="RPC workers already running (`gguf-exact rpc-server` on other machines) instead of two on loopback")
    ap.add_argument("--split", default="1,1", help="tensor-split over the devices (the workers', then the head's GPU)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = ap.parse_args()

    if args.tiny:
        from gguf_exact.tiny.pairs import write_runner_pairs

        target, drafter = write_runner_pairs(args.work / "tiny")["hidden"]
    else:
        folder = args.work / args.shape
        target, drafter = folder / "target.gguf", folder / "drafter.gguf"
        if not target.is_file() or not drafter.is_file():
            from gguf_exact.tiny.full_pair import write_pair

            log(f"{args.shape}: make-pair --kind {args.kind}")
            write_pair(folder, args.shape, args.kind)
    sets = [f"threads={args.threads}", f"threads-batch={args.threads}", f"ctx-size={args.ctx}", "no-warmup=true",
            "spec-draft-adaptive=false", f"spec-draft-n-max={args.n_max}"]  # fmt: skip
    results = {"target": str(target), "drafter": str(drafter), "n1": args.n1, "n2": args.n2, "n_max": args.n_max}
    with scratch_run_root("bench-rpc") as runs:
        arms = [arm("one machine, target alone", target, None, sets, (), [], runs, args)]
        arms.append(arm("one machine, drafter", target, drafter, sets, (), [], runs, args))
        workers = []
        if args.workers:
            from gguf_exact.engines.shared.rpc_probe import parse_endpoints

            ports = [(h, int(p)) for h, _, p in (e.rpartition(":") for e in parse_endpoints(args.workers))]
        else:
            for _ in range(2):
                wl = plan_worker(WorkerSettings(profile="cpu", port=free_port(), threads=args.threads, runs=runs))
                start_worker(wl, detach=True)
                workers.append(wl)
            ports = [("127.0.0.1", w.settings.port) for w in workers]
        proxies = [CountingProxy(host, port) for host, port in ports]
        rpc = tuple(f"127.0.0.1:{p.port}" for p in proxies)
        where = "remote workers" if args.workers else "two loopback workers"
        try:
            split = [*sets, f"tensor-split={args.split}"]
            arms.append(arm(f"{where}, target alone", target, None, split, rpc, proxies, runs, args))
            arms.append(arm(f"{where}, drafter where llama.cpp puts it", target, drafter, split, rpc, proxies, runs, args))
            arms.append(arm(f"{where}, drafter placed by serve --rpc", target, drafter, split, rpc, proxies, runs, args, True))
        finally:
            for p in proxies:
                p.close()
            for w in workers:
                stop_server(w.settings.port, runs)
    results["arms"] = arms
    results["wire"] = {"default": split_wire(arms[2], arms[3]), "placed": split_wire(arms[2], arms[4])}
    results["same_text"] = len({a["content"] for a in arms}) == 1
    print("| arm | tokens/s | vs one machine, target alone | drafts accepted | load s |")
    print("|---|---|---|---|---|")
    base = arms[0]["tokens_per_second"]
    for a in arms:
        print(f"| {a['arm']} | {a['tokens_per_second']:.2f} | {a['tokens_per_second'] / base:.2f}x | "
              f"{a['draft_accepted']}/{a['draft_n']} | {a['load_seconds']:.0f} |")  # fmt: skip
    print()
    print("| bytes over the wire | drafter where llama.cpp puts it | drafter placed by serve --rpc |")
    print("|---|---|---|")
    for k in results["wire"]["default"]:
        print(f"| {k.replace('_', ' ')} | {results['wire']['default'][k]:,} | {results['wire']['placed'][k]:,} |")
    print(f"{'same text in every arm':<30} {results['same_text']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
