"""runtime/wire/taskgroup.py: background tasks have an owner (no processes, one event loop)."""

from __future__ import annotations

import asyncio
import gc
import logging

from ddlf_actors.runtime.wire.taskgroup import TaskGroup


def test_holds_tasks_until_they_end():
    async def scenario():
        group = TaskGroup(asyncio.get_running_loop(), "test")
        fut = asyncio.get_running_loop().create_future()

        async def waits():
            return await fut

        task = group.spawn(waits())
        del task
        gc.collect()   # the loop's own reference to a waiting task is weak
        assert len(group) == 1
        fut.set_result(5)
        for _ in range(3):
            await asyncio.sleep(0)
        return len(group)

    assert asyncio.run(scenario()) == 0


def test_logs_a_failed_task(caplog):
    async def scenario():
        group = TaskGroup(asyncio.get_running_loop(), "the-owner")

        async def fails():
            raise KeyError("lost")

        group.spawn(fails())
        for _ in range(3):
            await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="ddlf.tasks"):
        asyncio.run(scenario())
    (rec,) = [r for r in caplog.records if r.name == "ddlf.tasks"]
    assert "the-owner" in rec.getMessage() and "fails" in rec.getMessage()
    assert rec.exc_info[0] is KeyError


def test_log_errors_false_leaves_the_outcome_to_the_caller(caplog):
    async def scenario():
        group = TaskGroup(asyncio.get_running_loop(), "rpc")

        async def fails():
            raise ValueError("answered to the peer")

        task = group.spawn(fails(), log_errors=False)
        seen = []
        task.add_done_callback(lambda t: seen.append(t.exception()))
        for _ in range(3):
            await asyncio.sleep(0)
        return seen, len(group)

    with caplog.at_level(logging.ERROR, logger="ddlf.tasks"):
        (seen, left) = asyncio.run(scenario())
    assert isinstance(seen[0], ValueError) and left == 0
    assert not [r for r in caplog.records if r.name == "ddlf.tasks"]


def test_close_cancels_the_rest_but_not_the_caller_and_refuses_new_tasks():
    async def scenario():
        group = TaskGroup(asyncio.get_running_loop(), "test")
        forever = group.spawn(asyncio.sleep(3600))

        async def closer():
            group.close()
            await asyncio.sleep(0)
            return "finished"

        me = group.spawn(closer())
        result = await me
        await asyncio.sleep(0)
        late = asyncio.sleep(1)
        return forever.cancelled(), result, group.spawn(late), group.closed

    cancelled, result, late, closed = asyncio.run(scenario())
    assert cancelled and result == "finished" and late is None and closed
