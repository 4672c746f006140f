"""A websocket server on loopback for the bench's client tests, in a thread of its own."""

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator

import websockets


@contextlib.contextmanager
def serving(handler: Callable[[websockets.ServerConnection], Awaitable[None]]) -> Iterator[str]:
    """Serve ``handler`` for each connection until the block ends; the block gets the server's ws:// URL."""
    loop = asyncio.new_event_loop()
    started, stop = threading.Event(), asyncio.Event()
    address = {}

    async def serve() -> None:
        async with websockets.serve(handler, "127.0.0.1", 0) as server:
            address["port"] = server.sockets[0].getsockname()[1]
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        yield f"ws://127.0.0.1:{address['port']}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
