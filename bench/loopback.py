"""What a proxy adds, read off the loopback wire: each packet's kernel send time (AF_PACKET with
SO_TIMESTAMPNS, root), so neither the load generator's nor the simulator's event loop, both busy
at 64 streams, is in the measure.

- The request's leg: from the client's request reaching the proxy's port to the proxy's request
  reaching the engine's, matched by a marker the load generator puts in each prompt (`#r<n>#`).
- A chunk's leg: from the engine's packet holding a chunk to the proxy's packet holding it for
  the client, matched by the simulator's send stamp (`x_sent_ns`); the first token's leg is the
  first chunk with content of each stream (grouped by `x_arrived_ns`).

`python bench/loopback.py --proxy-port P --engine-port Q --out FILE` captures until SIGTERM,
then writes the legs (seconds) and the socket's drop count as JSON. Used by gateway_peers.py
`--capture`.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SO_TIMESTAMPNS = 35
SO_RCVBUFFORCE = 33
SOL_PACKET = 263
PACKET_STATISTICS = 6
MARKER = re.compile(rb"#r(\d+)#")
STAMPS = re.compile(rb'"x_sent_ns":(\d+),"x_arrived_ns":(\d+)')
CONTENT = re.compile(rb'"content":"[^"]')


@dataclass
class Legs:
    request_in: dict[bytes, int] = field(default_factory=dict)
    request_out: dict[bytes, int] = field(default_factory=dict)
    chunk_in: dict[bytes, int] = field(default_factory=dict)
    chunk_out: dict[bytes, int] = field(default_factory=dict)
    first_token: dict[bytes, bytes] = field(default_factory=dict)
    """Per stream (its arrival stamp), the send stamp of its first chunk with content."""

    def read(self, payload: bytes, at: int, src: int, dst: int, proxy: int, engine: int) -> None:
        if dst == proxy:
            for marker in MARKER.findall(payload):
                self.request_in.setdefault(marker, at)
        elif dst == engine:
            for marker in MARKER.findall(payload):
                self.request_out.setdefault(marker, at)
        elif src == engine:
            for event in payload.split(b"\n\n"):
                stamps = STAMPS.search(event)
                if stamps:
                    self.chunk_in.setdefault(stamps[1], at)
                    if CONTENT.search(event):
                        self.first_token.setdefault(stamps[2], stamps[1])
        elif src == proxy:
            for stamps in STAMPS.finditer(payload):
                self.chunk_out.setdefault(stamps[1], at)

    def summary(self, drops: int) -> dict[str, object]:
        def legs(into: dict[bytes, int], out: dict[bytes, int], keys: list[bytes]) -> list[float]:
            return [(out[k] - into[k]) / 1e9 for k in keys if k in into and k in out]

        return {
            "request_s": legs(self.request_in, self.request_out, list(self.request_in)),
            "chunk_s": legs(self.chunk_in, self.chunk_out, list(self.chunk_in)),
            "first_token_s": legs(self.chunk_in, self.chunk_out, list(self.first_token.values())),
            "drops": drops,
        }


def capture(proxy: int, engine: int, out: Path) -> None:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind(("lo", 0))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 256 << 20)
    sock.settimeout(0.2)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    legs = Legs()
    while not stopping:
        try:
            data, ancillary, _, address = sock.recvmsg(65600, 64)
        except TimeoutError:
            continue
        except InterruptedError:
            break
        if address[2] != PACKET_OUTGOING or len(data) < 54 or data[14] >> 4 != 4:
            continue
        ip = data[14:]
        if ip[9] != socket.IPPROTO_TCP:
            continue
        tcp = ip[(ip[0] & 15) * 4 :]
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if not payload:
            continue
        src, dst = struct.unpack("!HH", tcp[:4])
        seconds, nanoseconds = struct.unpack("qq", ancillary[0][2][:16])
        legs.read(payload, seconds * 1_000_000_000 + nanoseconds, src, dst, proxy, engine)
    _, drops = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    out.write_text(json.dumps(legs.summary(drops)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--proxy-port", type=int, required=True)
    parser.add_argument("--engine-port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    capture(args.proxy_port, args.engine_port, args.out)


if __name__ == "__main__":
    main()
