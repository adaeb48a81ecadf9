"""The servers' listening socket: connections it accepts have Nagle's algorithm off.

With Nagle on, a response written in two parts waits ~40 ms for the client's
delayed acknowledgement (measured in reports/cluster/README.md).
"""

from __future__ import annotations

import asyncio
import socket

from engine.server.listener import bind_listener


def test_accepted_connections_have_nodelay() -> None:
    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listener = bind_listener("127.0.0.1", 0)
        server = await asyncio.start_server(on_connect, sock=listener)
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        nodelay = await asyncio.wait_for(accepted, 10)
        writer.close()
        server.close()
        await server.wait_closed()
        return nodelay

    assert asyncio.run(main()) == 1
