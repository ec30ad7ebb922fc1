"""Runs in the outsider pod (the test image, another uid, no secret): everything it can try on a
running tfos job's executor pods and driver. Prints one JSON object.

    python pod_outsider.py TARGETS_JSON
TARGETS_JSON: {"pods": [{"ip", "job", "tf_port", "tunnel_port", "private"}], "control": ["host", port]}
("job": the node's TF job name, which a remote eager client names its target task by; task 0 of each)
"""

import json
import socket
import sys

import outsider  # tests/outsider.py: the test sends its code to the pod as this module


def eager(pool, address, job):
    """TF's remote eager client at ``address`` (tests/outsider.py's probe, 20 s once it connects)."""
    return pool.submit(lambda: outsider.run_all([outsider.eager(address, job)], window=20.0)[0])


def connect(host, port, timeout=3.0):
    """'open', 'refused' or 'timeout'."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "timeout"


def junk(host, port, data=b"\x16\x03\x01\x00\xffGET / HTTP/1.1\r\n\r\n" * 4, timeout=15.0):
    """Send bytes that are no handshake: what comes back before the peer closes (b'' = closed at once)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(data)
            got = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    return {"closed": True, "reply": got[:200].hex()}
                got += chunk
    except socket.timeout:
        return {"closed": False, "reply": ""}
    except OSError as e:
        return {"closed": True, "reply": "", "error": str(e)}


def scan(host, timeout=0.3):
    """Every TCP port of ``host`` that accepts a connection."""
    found = []
    for port in range(1, 65536):
        s = socket.socket()
        s.settimeout(timeout)
        try:
            if s.connect_ex((host, port)) == 0:
                found.append(port)
        finally:
            s.close()
    return found


def main():
    from concurrent.futures import ThreadPoolExecutor

    targets = json.loads(sys.argv[1])
    host, port = targets["control"]
    with ThreadPoolExecutor(16) as pool:  # all at once: TF's client never gives up, each probe has its window
        pods = [{"ip": p["ip"],
                 "eager_tf_port": eager(pool, f"{p['ip']}:{p['tf_port']}", p["job"]),
                 "eager_tunnel": eager(pool, f"{p['ip']}:{p['tunnel_port']}", p["job"]),
                 "eager_private": eager(pool, p["private"], p["job"]),  # the node's private address, from here
                 "tunnel_junk": pool.submit(junk, p["ip"], p["tunnel_port"]),
                 "tf_port": pool.submit(connect, p["ip"], p["tf_port"]),
                 "open_ports": pool.submit(scan, p["ip"])} for p in targets["pods"]]
        control = {"junk": pool.submit(junk, host, port), "eager": eager(pool, f"{host}:{port}", "worker")}
        out = {"pods": [{k: (v.result() if hasattr(v, "result") else v) for k, v in p.items()} for p in pods],
               "control": {k: v.result() for k, v in control.items()}}
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
