"""The wake-up's publish on RabbitMQ configured by its URL alone (what the example project does
for an ``amqp://`` broker: no transport option, no publisher confirms). The message reaches
its queue; and a broker that blocks its publishers (a memory alarm) does not hold the kick: it
returns while the alarm lasts, and the message is in the queue once the alarm ends (a kick's
retry may have queued it twice: the drain is coalesced, a second message finds nothing). Each
test has a virtual host of its own on the machine's RabbitMQ."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from benchmarks._stack import RabbitMQ, rabbitmq_url
from billing_integration import wakeup

# transaction=True: the kick's thread reads the wake-up flag through the database cache.
pytestmark = [pytest.mark.rabbitmq, pytest.mark.django_db(transaction=True)]

QUEUE = "wakeup-probe"


def probe() -> None:
    """The task the kicks send (never run: no worker consumes the probe queue)."""


class Broker:
    """A Celery app on a virtual host of its own, configured by the broker URL alone."""

    def __init__(self) -> None:
        self.rabbit = RabbitMQ(rabbitmq_url(), f"billing-test-{uuid.uuid4().hex[:8]}")
        self.rabbit.create_vhost()
        self.app = Celery("wakeup-rabbitmq", set_as_current=False)
        # The read and write URLs: the environment's CELERY_BROKER_URL (the tests' own broker)
        # would take precedence over broker_url.
        self.app.conf.update(
            broker_read_url=self.rabbit.url,
            broker_write_url=self.rabbit.url,
            task_default_queue=QUEUE,
            task_serializer="json",
        )
        self.task = self.app.task(name="billing_test.wakeup_probe")(probe)

    def waiting(self) -> int:
        """Messages in the probe queue (0 before any was published)."""
        with self.app.connection_for_write() as conn:
            assert conn.transport.driver_type == "amqp", conn.as_uri()
            try:
                return conn.default_channel.queue_declare(QUEUE, passive=True).message_count
            except Exception:  # not declared yet
                return 0

    def close(self) -> None:
        try:
            self.app.close()
        finally:
            self.rabbit.delete_vhost()


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker()
    try:
        yield b
    finally:
        b.close()


def rabbit_eval(rabbit: RabbitMQ, expression: str) -> str:
    return rabbit.ctl("eval", expression).strip()


def alarms(rabbit: RabbitMQ) -> str:
    return rabbit_eval(rabbit, "rabbit_alarm:get_alarms().")


class MemoryAlarm:
    """The broker's memory high watermark set to 0: it raises its memory alarm and blocks every
    connection that publishes, until :meth:`end` puts the watermark back."""

    def __init__(self, rabbit: RabbitMQ) -> None:
        self.rabbit = rabbit
        self.before = rabbit_eval(rabbit, "vm_memory_monitor:get_vm_memory_high_watermark().")
        self.on = False

    def start(self) -> None:
        self.on = True
        rabbit_eval(self.rabbit, "vm_memory_monitor:set_vm_memory_high_watermark(0.0).")
        deadline = time.monotonic() + 30
        while "memory" not in alarms(self.rabbit):
            assert time.monotonic() < deadline, "the memory alarm was not raised"
            time.sleep(0.2)

    def end(self) -> None:
        if self.on:
            rabbit_eval(
                self.rabbit, f"vm_memory_monitor:set_vm_memory_high_watermark({self.before})."
            )
            self.on = False


@pytest.fixture
def memory_alarm(broker: Broker) -> Iterator[MemoryAlarm]:
    alarm = MemoryAlarm(broker.rabbit)
    try:
        yield alarm
    finally:
        alarm.end()  # whatever happened, before the broker fixture closes its connections


def test_a_kick_reaches_its_queue(broker: Broker) -> None:
    assert wakeup.kick(f"rabbit-{uuid.uuid4().hex}", broker.task) is True
    assert broker.waiting() == 1


def test_a_broker_blocking_its_publishers_does_not_hold_the_kick(
    broker: Broker, memory_alarm: MemoryAlarm
) -> None:
    memory_alarm.start()
    results: list[Any] = []
    kick = threading.Thread(
        target=lambda: results.append(wakeup.kick(f"rabbit-{uuid.uuid4().hex}", broker.task)),
        daemon=True,
    )
    kick.start()
    kick.join(timeout=30)
    assert not kick.is_alive(), "the kick waited for the blocked broker"
    assert results == [True]
    assert "memory" in alarms(broker.rabbit)  # the kick returned during the alarm
    memory_alarm.end()
    deadline = time.monotonic() + 30
    while broker.waiting() == 0:
        assert time.monotonic() < deadline, "the message was not queued after the alarm"
        time.sleep(0.2)
