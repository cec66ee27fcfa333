#!/usr/bin/env python3
"""A userspace stand-in for `tc qdisc ... netem loss L% delay D J reorder R%`, for kernels built
without sch_netem (the lab machine's is one).

Reads the packets an NFQUEUE rule queues (e.g. `iptables -t raw -A PREROUTING -p tcp --dport 3306
-j NFQUEUE --queue-num 7` in the test host's namespace) and gives each a verdict the way netem
would treat it: dropped with probability LOSS; otherwise R% of them accepted at once (netem's
reorder: they overtake the delayed ones) and the rest accepted after DELAY +- JITTER ms (uniform,
so they also reorder among themselves). Verdicts for single packet ids may come in any order.

It never modifies a packet; it only delays, reorders or drops. It prints "nfq-netem ready" once
bound, and counters on SIGTERM/SIGINT, then exits (the kernel then drops what is still queued,
as a qdisc being removed would).

usage: nfq_netem.py QUEUE LOSS_PERCENT DELAY_MS JITTER_MS REORDER_PERCENT
"""

import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NF_DROP = 0
NF_ACCEPT = 1
AF_INET = 2


def attr(kind, payload):
    length = 4 + len(payload)
    pad = (4 - length % 4) % 4
    return struct.pack("=HH", length, kind) + payload + b"\0" * pad


def message(msg, flags, seq, queue, attrs):
    body = struct.pack("=BBH", 0, 0, socket.htons(queue)) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def main():
    queue, loss, delay, jitter, reorder = (
        int(sys.argv[1]),
        float(sys.argv[2]) / 100,
        float(sys.argv[3]) / 1000,
        float(sys.argv[4]) / 1000,
        float(sys.argv[5]) / 100,
    )
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    seq = 1
    cmd = struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, socket.htons(AF_INET))
    params = struct.pack(">IB", 0, NFQNL_COPY_META)
    sock.send(
        message(
            NFQNL_MSG_CONFIG,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            queue,
            [attr(NFQA_CFG_CMD, cmd), attr(NFQA_CFG_PARAMS, params), attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", 16384))],
        )
    )
    ack = sock.recv(65536)
    if len(ack) >= 20 and struct.unpack_from("=H", ack, 4)[0] == NLMSG_ERROR:
        err = struct.unpack_from("=i", ack, 16)[0]
        if err != 0:
            sys.exit(f"nfq-netem: binding queue {queue} failed: {os.strerror(-err)}")
    sock.setblocking(False)
    print("nfq-netem ready", flush=True)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    held = []  # (due, id)
    counts = {"packets": 0, "dropped": 0, "overtook": 0, "delayed": 0}
    rnd = random.Random(8)

    def verdict(pid, v):
        nonlocal seq
        seq += 1
        try:
            sock.send(message(NFQNL_MSG_VERDICT, NLM_F_REQUEST, seq, queue, [attr(NFQA_VERDICT_HDR, struct.pack(">II", v, pid))]))
        except BlockingIOError:
            pass

    while not stop:
        now = time.monotonic()
        while held and held[0][0] <= now:
            verdict(heapq.heappop(held)[1], NF_ACCEPT)
        timeout = max(0.0, held[0][0] - now) if held else 0.5
        try:
            select.select([sock], [], [], timeout)
        except InterruptedError:
            continue
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            off = 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if length < 16:
                    break
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    a = off + 20
                    end = off + length
                    while a + 4 <= end:
                        alen, akind = struct.unpack_from("=HH", data, a)
                        if alen < 4:
                            break
                        if akind & 0x7FFF == NFQA_PACKET_HDR:
                            pid = struct.unpack_from(">I", data, a + 4)[0]
                            counts["packets"] += 1
                            r = rnd.random()
                            if r < loss:
                                counts["dropped"] += 1
                                verdict(pid, NF_DROP)
                            elif rnd.random() < reorder:
                                counts["overtook"] += 1
                                verdict(pid, NF_ACCEPT)
                            else:
                                counts["delayed"] += 1
                                due = time.monotonic() + max(0.0, delay + rnd.uniform(-jitter, jitter))
                                heapq.heappush(held, (due, pid))
                            break
                        a += (alen + 3) & ~3
                off += (length + 3) & ~3
    for _, pid in held:
        verdict(pid, NF_ACCEPT)
    print("nfq-netem " + " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)


if __name__ == "__main__":
    main()
