"""The app's tasks go where Celery's routing sends them: every one is named
``billing_integration.*``, so ``CELERY_TASK_ROUTES = {"billing_integration.*": {"queue": ...}}``
covers them all (the removed ``BILLING['QUEUE']``)."""

from __future__ import annotations

import uuid

import pytest
from celery import current_app

from billing_integration.schedule import BEAT_SCHEDULE


def app_tasks() -> dict[str, object]:
    """Every task the app registers with the host's Celery app, by name."""
    current_app.loader.import_default_modules()  # the autodiscovered ``tasks`` modules
    return {
        name: task
        for name, task in current_app.tasks.items()
        if type(task).__module__.startswith("billing_integration")
    }


def test_every_task_of_the_app_is_named_billing_integration_dot():
    tasks = app_tasks()
    beat = {entry["task"] for entry in BEAT_SCHEDULE.values()}
    # The ones beat runs, those sent on a change, an event and a notice: all registered.
    sent = {"billing_integration.push_entry", "billing_integration.process_webhook_event"}
    sent |= {"billing_integration.send_notice", "billing_integration.send_trial_notice"}
    sent |= {"billing_integration.send_pulled_notice"}
    assert beat | sent <= set(tasks)
    assert [name for name in tasks if not name.startswith("billing_integration.")] == []


@pytest.fixture
def routed():
    """The host's ``CELERY_TASK_ROUTES`` to a queue of this test (set the public way: Celery
    rebuilds its router), tasks published to the configured broker; restored after the test."""
    conf = current_app.conf
    previous = (conf.task_routes, conf.task_always_eager)
    queue = f"billing-test-{uuid.uuid4().hex[:8]}"
    conf.update(task_routes={"billing_integration.*": {"queue": queue}}, task_always_eager=False)
    try:
        yield queue
    finally:
        conf.update(task_routes=previous[0], task_always_eager=previous[1])


def test_one_route_sends_every_task_of_the_app_to_its_queue(routed):
    router = current_app.amqp.router
    assert {router.route({}, name)["queue"].name for name in app_tasks()} == {routed}
    assert router.route({}, "proj.tasks.other")["queue"].name == current_app.conf.task_default_queue


def test_what_the_app_sends_lands_on_the_routed_queue(routed):
    """The app sends with no queue of its own: the route decides (a real publish, read back)."""
    from billing_integration.outbox.tasks import enqueue
    from billing_integration.webhooks.tasks import send

    assert enqueue(123) is True
    send(456)
    with current_app.connection_for_write() as connection:
        queue = connection.SimpleQueue(routed)
        received = [queue.get(timeout=10) for _ in range(2)]
        for message in received:
            message.ack()
        queue.close()
    assert sorted((m.headers["task"], m.headers["argsrepr"]) for m in received) == [
        ("billing_integration.process_webhook_event", "(456,)"),
        ("billing_integration.push_entry", "(123,)"),
    ]
