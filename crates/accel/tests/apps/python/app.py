"""The accelerator's tests' second app, in Python's asyncio (epoll, read
until it would block): POST /echo sends the body back, GET /bytes?n=N
sends N bytes of the tests' pattern, GET / answers the app's id. HTTP/1.1
keep-alive, Content-Length bodies only: what qproxy sends it."""

import argparse
import asyncio
from urllib.parse import parse_qs, urlsplit

# The pattern repeats every 256 * 251 bytes: one period, computed once,
# is sliced for any range (byte by byte, 16 MiB take seconds, minutes in an
# emulated machine).
PERIOD = 256 * 251
TABLE = bytes(((i * 7 + i // 251) % 256) for i in range(PERIOD))


def pattern(off, n):
    out = bytearray()
    start = off % PERIOD
    while n > 0:
        k = min(n, PERIOD - start)
        out += TABLE[start : start + k]
        n -= k
        start = 0
    return bytes(out)


async def serve(reader, writer, app_id):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length", "0"))
            url = urlsplit(target)
            if url.path == "/echo":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length)
                left = length
                while left:
                    chunk = await reader.read(min(left, 1 << 16))
                    if not chunk:
                        return
                    writer.write(chunk)
                    await writer.drain()
                    left -= len(chunk)
            else:
                if length:
                    await reader.readexactly(length)
                if url.path == "/bytes":
                    n = int(parse_qs(url.query).get("n", ["0"])[0])
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n)
                    off = 0
                    while off < n:
                        k = min(n - off, 1 << 16)
                        writer.write(pattern(off, k))
                        await writer.drain()
                        off += k
                else:
                    body = (app_id + "\n").encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-addr", default="127.0.0.1:8080")
    parser.add_argument("-id", default="python")
    args = parser.parse_args()
    host, port = args.addr.rsplit(":", 1)
    server = await asyncio.start_server(lambda r, w: serve(r, w, args.id), host, int(port))
    async with server:
        await server.serve_forever()


asyncio.run(main())
