"""``async def`` tools: the coroutine runs on the worker process's event loop, and its context
calls run on the leg's own thread.

The leg's thread (a Celery pool process's main thread, or a web worker's request thread)
owns the database connection, the lease, the time-limit alarm and the transaction of each
journaled call. So ``await ctx.ask(...)`` and the other ``AsyncToolContext`` calls hand the
matching ``ToolContext`` call to that thread and wait for its outcome, while the event loop
(one per process, on a thread of its own) goes on running the tool's other coroutines. Every
call is therefore the same cancellation checkpoint, with the same journal and the same
exceptions, as in a plain tool; the time limit interrupts the leg's thread, which then
cancels the coroutine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from tasks_app.tools.context import Answer, EffectHandle, Question, Retry, ToolContext

T = TypeVar("T")

# How long a coroutine cancelled by an interrupted leg may take to unwind.
CANCEL_GRACE_SECONDS = 5.0

_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_loop_lock = threading.Lock()


def worker_loop() -> asyncio.AbstractEventLoop:
    """The event loop of this process, on a daemon thread (started on first use, and again
    in a forked child, where the parent's thread does not exist)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def forever() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=forever, name="taskdesk-tool-loop", daemon=True).start()
            started.wait(10)
            _loop, _loop_pid = loop, os.getpid()
        return _loop


class _Done:
    pass


_DONE = _Done()


class _Bridge:
    """Carries context calls from the event loop to the leg's thread and their outcomes back."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.closed = False
        self.busy = False  # the leg's thread waits for a coroutine of a step's function

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.closed:
            raise RuntimeError("the leg of this tool has ended: no further context calls")
        if self.busy:
            raise RuntimeError("context calls are not allowed inside a step's function")
        reply: asyncio.Future[T] = self.loop.create_future()
        self.calls.put((fn, args, kwargs, reply))
        return await reply

    def serve(self, running: concurrent.futures.Future[Any], ended: threading.Event) -> Any:
        """On the leg's thread: run the context calls the coroutine sends until it ends;
        return its value or raise its exception. ENDED is set once the coroutine has
        finished on the loop (its own cancellation handlers included)."""
        running.add_done_callback(lambda _: self.calls.put(_DONE))
        try:
            while True:
                item = self.calls.get()
                if item is _DONE:
                    break
                fn, args, kwargs, reply = item
                try:
                    value = fn(*args, **kwargs)
                except BaseException as exc:
                    self.loop.call_soon_threadsafe(_settle, reply, None, exc)
                else:
                    self.loop.call_soon_threadsafe(_settle, reply, value, None)
        except BaseException:
            # The leg's thread was interrupted (its time limit): stop the coroutine, refuse
            # what it still asks, and let the interruption end the leg.
            self.closed = True
            running.cancel()
            # The future is cancelled at once; the coroutine's handlers run later on the loop.
            ended.wait(CANCEL_GRACE_SECONDS)
            raise
        finally:
            self.closed = True
            while not self.calls.empty():
                item = self.calls.get_nowait()
                if item is not _DONE:
                    error = RuntimeError("the leg of this tool has ended")
                    self.loop.call_soon_threadsafe(_settle, item[3], None, error)
        return running.result()

    def wait_here(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """On the leg's thread: run COROUTINE on the loop and wait for it (a step's async
        function, whose value the leg's thread then journals)."""
        self.busy = True
        try:
            return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()
        finally:
            self.busy = False


def _settle(reply: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if reply.done():
        return
    if error is not None:
        reply.set_exception(error)
    else:
        reply.set_result(value)


class AsyncEffect:
    """``async with ctx.effect(...) as fx``: the effect's scope, entered and left on the leg's
    thread (intended before the body, confirmed or failed after it)."""

    def __init__(self, bridge: _Bridge, make: Callable[[], Any]) -> None:
        self._bridge = bridge
        self._make = make
        self._scope: Any = None

    async def __aenter__(self) -> EffectHandle:
        self._scope = await self._bridge.call(self._make)
        handle: EffectHandle = await self._bridge.call(self._scope.__enter__)
        return handle

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._bridge.call(self._scope.__exit__, exc_type, exc, tb)
        return result


class AsyncToolContext:
    """What an ``async def`` tool gets: the ``ToolContext`` API, awaited.

    ``await ctx.ask(...)``, ``await ctx.ask_many(...)``, ``await ctx.step(name, fn)`` (FN may
    be a plain function, run on the leg's thread, so it may use Django's ORM, or an ``async
    def``), ``async with ctx.effect(...) as fx``, ``await ctx.progress(...)``, ``await
    ctx.log(...)``, ``await ctx.check_cancelled()``, ``await ctx.sleep(seconds)``, ``await
    ctx.escalate()``. ``task_id``, ``client_name`` and ``tenant`` are plain attributes."""

    def __init__(self, sync: ToolContext, bridge: _Bridge) -> None:
        self.sync = sync
        self._bridge = bridge
        self.task_id = sync.task_id
        # Read on the leg's thread, before the coroutine starts: they may need the database.
        self.client_name = sync.client_name
        self.tenant = sync.tenant

    async def ask(self, key: str, **question: Any) -> Answer:
        return (await self.ask_many({key: Question(**question)}))[key]

    async def ask_many(self, questions: dict[str, Question]) -> dict[str, Answer]:
        return await self._bridge.call(self.sync.ask_many, questions)

    async def step(
        self,
        name: str,
        fn: Callable[[], T] | Callable[[], Awaitable[T]],
        *,
        retry: Retry | None = None,
    ) -> T:
        bridge = self._bridge
        if inspect.iscoroutinefunction(fn):
            run_async = fn

            def on_the_leg_thread() -> Any:
                return bridge.wait_here(run_async())

            return await bridge.call(self.sync.step, name, on_the_leg_thread, retry=retry)
        return await bridge.call(self.sync.step, name, fn, retry=retry)

    def effect(
        self,
        name: str,
        *,
        target: str = "",
        verify: Callable[[str], bool] | Callable[[str], Awaitable[bool]] | None = None,
        compensate: Callable[[str], None] | Callable[[str], Awaitable[None]] | None = None,
        retry: Retry | None = None,
    ) -> AsyncEffect:
        bridge = self._bridge

        def on_the_leg_thread(hook: Callable[[str], Any] | None) -> Any:
            # An async verify or compensate hook runs on the loop; the leg's thread waits.
            if hook is None or not inspect.iscoroutinefunction(hook):
                return hook
            run_async = hook
            return lambda key: bridge.wait_here(run_async(key))

        def make() -> Any:
            return self.sync.effect(
                name,
                target=target,
                verify=on_the_leg_thread(verify),
                compensate=on_the_leg_thread(compensate),
                retry=retry,
            )

        return AsyncEffect(self._bridge, make)

    async def progress(
        self, done: float, total: float | None = None, message: str | None = None
    ) -> None:
        await self._bridge.call(self.sync.progress, done, total, message)

    async def log(self, level: str, message: str, **data: Any) -> None:
        await self._bridge.call(self.sync.log, level, message, **data)

    async def check_cancelled(self) -> None:
        await self._bridge.call(self.sync.check_cancelled)

    async def sleep(self, seconds: float, *, every: float = 0.2) -> None:
        """Sleep SECONDS on the loop, checking for cancellation at least every EVERY seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            await self.check_cancelled()
            left = deadline - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(every, left))

    async def escalate(self) -> None:
        await self._bridge.call(self.sync.escalate)


def run_async_tool(
    func: Callable[..., Coroutine[Any, Any, Any]],
    ctx: ToolContext,
    kwargs: dict[str, Any],
    *,
    wrap: Callable[[AsyncToolContext], AsyncToolContext] | None = None,
) -> Any:
    """Run the coroutine function FUNC with an AsyncToolContext over CTX on this process's
    event loop, serving its context calls on this thread; return its value."""
    bridge = _Bridge(worker_loop())
    actx = AsyncToolContext(ctx, bridge)
    if wrap is not None:
        actx = wrap(actx)
    ended = threading.Event()

    async def guarded() -> Any:
        try:
            return await func(actx, **kwargs)
        finally:
            ended.set()

    running = asyncio.run_coroutine_threadsafe(guarded(), bridge.loop)
    return bridge.serve(running, ended)
