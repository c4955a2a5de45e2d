"""A preprocessing sidecar answering requests: JPEGs in, decoded 224x224 batches out, over a Unix socket.

    python -m examples.hostlab.prep_rpc --name lab-b-prep --socket /run/prep/prep.sock

The shape of a serving pod whose model container hands its preprocessing to a separate container
(an ensemble's Python preprocessing step, a "transformer" container in front of a predictor): the
model container sends a batch of encoded images and waits for the decoded tensors, one request at a
time per connection; nothing is prepared ahead.  Wire format, both ways length-prefixed:
request ``!I`` count, then per image ``!I`` length and the JPEG; reply ``!II`` count and bytes, then
the uint8 ``(count, 224, 224, 3)`` array.  A thread per connection; decoding is PIL's, resized
bilinear.  Prints ``ready`` once it listens.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import struct
import sys
import threading

from .backend import decode, set_comm

COUNT = struct.Struct("!I")
REPLY = struct.Struct("!II")


def recv_exact(s: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = s.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return buf


def recv_images(s: socket.socket) -> list[bytearray]:
    (count,) = COUNT.unpack(recv_exact(s, COUNT.size))
    out = []
    for _ in range(count):
        (n,) = COUNT.unpack(recv_exact(s, COUNT.size))
        out.append(recv_exact(s, n))
    return out


def send_images(s: socket.socket, images: list[bytes]) -> None:
    s.sendall(COUNT.pack(len(images)) + b"".join(COUNT.pack(len(j)) + bytes(j) for j in images))


def serve(conn: socket.socket) -> None:
    import numpy as np

    with conn:
        try:
            while True:
                images = recv_images(conn)
                out = np.stack([decode(bytes(j)) for j in images]) if images else np.empty((0,), np.uint8)
                conn.sendall(REPLY.pack(len(images), out.nbytes))
                conn.sendall(out.data)
        except (ConnectionError, OSError):
            return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--socket", required=True)
    args = ap.parse_args(argv)
    set_comm(args.name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.socket)
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(args.socket)
    lst.listen(8)
    os.chmod(args.socket, 0o666)
    print("ready", flush=True)
    while True:
        conn, _ = lst.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
