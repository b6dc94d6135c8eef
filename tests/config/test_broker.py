"""The embedded broker under concurrent producers and consumers: every message arrives whole,
exactly once."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import uuid
from pathlib import Path

import pytest
from kombu import Connection, Exchange, Queue

import config.celery  # noqa: F401 - registers the "filesystem" alias
from tests import services


def _connection(folder: Path) -> Connection:
    return Connection(
        "filesystem://",
        transport_options={
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "control_folder": str(folder / "control"),
        },
    )


def _produce(folder: str, start: int, count: int) -> None:
    with _connection(Path(folder)) as conn:
        producer = conn.Producer(serializer="json")
        for n in range(start, start + count):
            producer.publish({"n": n, "pad": "x" * 2000}, routing_key="jobs", exchange="")


def _consume(folder: str, out: multiprocessing.Queue, expected: int) -> None:  # type: ignore[type-arg]
    with _connection(Path(folder)) as conn:
        queue = conn.SimpleQueue("jobs", no_ack=True)
        seen = 0
        while seen < expected:
            try:
                message = queue.get(timeout=10)
            except queue.Empty:
                break
            out.put(message.payload["n"])
            seen += 1
        queue.close()


def _bind(folder: str, queue: str, start: multiprocessing.synchronize.Barrier) -> None:
    with _connection(Path(folder)) as conn:
        start.wait(10)
        Queue(queue, Exchange("jobs", type="direct"), routing_key=queue)(
            conn.default_channel
        ).declare()


def test_processes_binding_queues_to_a_new_exchange_at_once_all_stay_bound(
    tmp_path: Path,
) -> None:
    """The leg worker and the control worker bind their queues as they start: on a new
    folder, both write the exchange's table at once, and it must stay readable with every
    queue in it."""
    (tmp_path / "queue").mkdir()
    for attempt in range(5):
        names = [f"q{attempt}-{n}-{'x' * n}" for n in range(6)]  # lists of different lengths
        start = multiprocessing.Barrier(len(names))
        binders = [
            multiprocessing.Process(target=_bind, args=(str(tmp_path), name, start))
            for name in names
        ]
        for binder in binders:
            binder.start()
        for binder in binders:
            binder.join(30)
        assert [binder.exitcode for binder in binders] == [0] * len(names)
        with _connection(tmp_path) as conn:
            table = conn.default_channel.get_table("jobs")
        assert set(names) <= {entry.queue for entry in table}
        (tmp_path / "control" / "jobs.exchange").unlink()  # a new exchange again


def test_it_is_the_atomic_transport(tmp_path: Path) -> None:
    from config.broker import Transport

    (tmp_path / "queue").mkdir()
    with _connection(tmp_path) as conn:
        assert isinstance(conn.transport, Transport)


def test_the_worker_polls_it_from_its_event_loop(tmp_path: Path) -> None:
    # Celery runs a prefork worker with per-process job pipes only on an evented transport.
    import time

    from kombu.asynchronous import Hub

    (tmp_path / "queue").mkdir()
    received: list[int] = []

    def on_message(body, message) -> None:  # type: ignore[no-untyped-def]
        received.append(body["n"])
        message.ack()

    hub = Hub()
    try:
        with _connection(tmp_path) as conn:
            assert conn.transport.implements.asynchronous
            queue = Queue("jobs", Exchange(""), routing_key="jobs")
            with conn.Consumer(queue, callbacks=[on_message]):
                conn.transport.register_with_event_loop(conn.connection, hub)
                producer = conn.Producer(serializer="json")
                for n in range(3):
                    producer.publish({"n": n}, routing_key="jobs", exchange="")
                loop = hub.create_loop()
                deadline = time.monotonic() + 10
                while len(received) < 3 and time.monotonic() < deadline:
                    next(loop)
    finally:
        hub.close()
    assert sorted(received) == [0, 1, 2]


def test_concurrent_producers_and_consumers_see_every_message_once(tmp_path: Path) -> None:
    (tmp_path / "queue").mkdir()
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    producers = [ctx.Process(target=_produce, args=(str(tmp_path), i * 300, 300)) for i in range(3)]
    consumers = [ctx.Process(target=_consume, args=(str(tmp_path), results, 450)) for _ in range(2)]
    for proc in consumers + producers:
        proc.start()
    for proc in producers + consumers:
        proc.join(60)
        assert proc.exitcode == 0
    got = [results.get(timeout=5) for _ in range(results.qsize())]
    assert sorted(got) == list(range(900))
    assert not list((tmp_path / "queue").iterdir())


def test_a_half_written_message_is_not_picked_up(tmp_path: Path) -> None:
    queue_dir = tmp_path / "queue"
    queue_dir.mkdir()
    with _connection(tmp_path) as conn:
        channel = conn.default_channel
        Queue("jobs", Exchange(""), routing_key="jobs")(channel).declare()
        (queue_dir / "incoming-partial").write_bytes(b'{"body": "tru')
        import queue as stdlib_queue

        import pytest

        with pytest.raises(stdlib_queue.Empty):
            channel._get("jobs")


def _claim_and_die(folder: str) -> None:
    """Take one message with late acknowledgement and die (SIGKILL) before acknowledging."""
    import os
    import signal

    with _connection(Path(folder)) as conn:
        queue = conn.SimpleQueue("jobs")  # acknowledged by hand
        queue.get(timeout=10)
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_message_claimed_by_a_process_that_died_unacknowledged_is_delivered_again(
    tmp_path: Path,
) -> None:
    (tmp_path / "queue").mkdir()
    _produce(str(tmp_path), 0, 2)
    ctx = multiprocessing.get_context("spawn")
    dead = ctx.Process(target=_claim_and_die, args=(str(tmp_path),))
    dead.start()
    dead.join(30)
    assert dead.exitcode == -9
    claimed = list((tmp_path / "claimed").iterdir())
    assert len(claimed) == 1  # kept until acknowledged, named after its claimer

    # The next process that opens the folder puts it back; a message this process claims
    # and acknowledges is gone for good, one it has not acknowledged yet stays claimed.
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue("jobs")
        first, second = queue.get(timeout=10), queue.get(timeout=10)
        assert sorted([first.payload["n"], second.payload["n"]]) == [0, 1]
        assert len(list((tmp_path / "claimed").iterdir())) == 2
        first.ack()
        assert len(list((tmp_path / "claimed").iterdir())) == 1
        with _connection(tmp_path) as other:  # this process is alive: nothing is restored
            other.default_channel  # noqa: B018 - opening the channel restores orphans
        assert len(list((tmp_path / "claimed").iterdir())) == 1
        second.ack()
        queue.close()
    assert not list((tmp_path / "claimed").iterdir())
    assert not list((tmp_path / "queue").iterdir())


@pytest.mark.redis
def test_the_redis_channel_keeps_one_client_and_delivers() -> None:
    from config.broker import RedisTransport

    url = services.redis_url()
    assert url is not None
    with Connection(url, transport=RedisTransport) as conn:
        channel = conn.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second  # kombu builds a new client for every command
        queue = conn.SimpleQueue(f"taskdesk-test-{uuid.uuid4().hex}")
        try:
            for n in range(3):
                queue.put({"n": n})
            received = [queue.get(timeout=5) for _ in range(3)]
            for message in received:
                message.ack()
            assert [m.payload["n"] for m in received] == [0, 1, 2]
        finally:
            queue.clear()
            queue.close()


def test_celery_uses_it_for_redis() -> None:
    from django.conf import settings

    if not settings.CELERY_BROKER_URL.startswith("redis"):
        pytest.skip("this run's broker is not Redis")
    from config.celery import app

    with app.connection_for_write() as conn:
        assert type(conn.transport).__name__ == "RedisTransport"
