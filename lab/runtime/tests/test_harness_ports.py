"""The harness's ports stay the runtime's: no other bind or listener gets one before the runtime listens."""

from __future__ import annotations

import asyncio
import socket

import pytest

from ._harness import free_port


def test_a_handed_out_port_refuses_connections_and_other_binds_until_its_runtime_listens():
    port = free_port()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    other = socket.socket()  # another process's listener on that very port
    with other, pytest.raises(OSError, match="in use"):
        other.bind(("127.0.0.1", port))

    async def serve_and_connect():
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", port)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()

    asyncio.run(serve_and_connect())
