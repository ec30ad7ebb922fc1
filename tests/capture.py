"""A packet capture for the tests (root): every TCP payload seen on one interface (``AF_PACKET``,
no capture library), kept for the ports asked for. Used to count what a tfos job leaves readable
on the wire."""

from __future__ import annotations

import socket
import struct
import threading

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


class Capture:
    """Capture TCP payloads to or from ``ports`` on ``interface`` until :meth:`stop`. Each segment
    is kept once (a looped-back packet shows on ``lo`` as sent and as received: the sent copy is
    skipped)."""

    def __init__(self, interface: str = "lo"):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        self.sock.bind((interface, 0))
        self.sock.settimeout(0.2)
        self.segments: list[tuple[int, int, bytes]] = []  # (source port, destination port, payload)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame, address = self.sock.recvfrom(1 << 17)
            except socket.timeout:
                continue
            if address[2] == PACKET_OUTGOING:
                continue
            parsed = tcp_payload(frame)
            if parsed is not None and parsed[2]:
                self.segments.append(parsed)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def payload(self, ports) -> bytes:
        """Every kept payload to or from one of ``ports``, joined per direction of each connection
        so that a marker cut by a segment boundary is still found."""
        ports = set(ports)
        streams: dict[tuple[int, int], bytearray] = {}
        for src, dst, data in self.segments:
            if src in ports or dst in ports:
                streams.setdefault((src, dst), bytearray()).extend(data)
        return b"\0".join(bytes(s) for s in streams.values())


def tcp_payload(frame: bytes) -> tuple[int, int, bytes] | None:
    """``(source port, destination port, payload)`` of an Ethernet + IPv4 + TCP frame, else None."""
    if len(frame) < 14 + 20 or struct.unpack("!H", frame[12:14])[0] != 0x0800:
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    if ip[9] != socket.IPPROTO_TCP or len(ip) < ihl + 20:
        return None
    total = struct.unpack("!H", ip[2:4])[0]
    tcp = ip[ihl:total]
    src, dst = struct.unpack("!HH", tcp[:4])
    offset = (tcp[12] >> 4) * 4
    return src, dst, bytes(tcp[offset:])
