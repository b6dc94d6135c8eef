"""New request ids (tasks_app.middleware.new_request_id): 32 hex digits, never the same twice,
in this process or in a forked one."""

from __future__ import annotations

import os
import re

from tasks_app.middleware import new_request_id


def test_new_request_ids_are_32_hex_digits_and_distinct() -> None:
    ids = [new_request_id() for _ in range(10_000)]

    assert all(re.fullmatch(r"[0-9a-f]{32}", request_id) for request_id in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_process_makes_ids_of_its_own() -> None:
    read, write = os.pipe()
    before = new_request_id()
    pid = os.fork()
    if pid == 0:  # the child: its first id, to the parent
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    after = new_request_id()

    assert child[:16] != before[:16]  # its own prefix: its count cannot meet the parent's
    assert before[:16] == after[:16] and int(after[16:], 16) == int(before[16:], 16) + 1
