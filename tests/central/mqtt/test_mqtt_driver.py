"""The buffered socket under paho's read pattern, and the loop driver against a real broker."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from central.mqtt.driver import BufferedClient, BufferedSocket, MqttLoopDriver
from support.brokers import MosquittoBroker
from support.wait import wait_for


@pytest.fixture
def pair() -> Iterator[tuple[BufferedSocket, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    buffered = BufferedSocket(ours)
    yield buffered, theirs
    buffered.close()
    theirs.close()


def test_small_reads_are_served_from_one_kernel_read(pair: tuple[BufferedSocket, socket.socket]) -> None:
    sock, peer = pair
    peer.sendall(b"\x30\x05hello\x30\x02hi")
    assert sock.recv(1) == b"\x30" and sock.pending() == 10
    assert sock.recv(1) == b"\x05"
    assert sock.recv(5) == b"hello"
    assert [sock.recv(1), sock.recv(1), sock.recv(64)] == [b"\x30", b"\x02", b"hi"]
    assert sock.pending() == 0
    with pytest.raises(BlockingIOError):
        sock.recv(1)


def test_a_packet_split_across_reads_is_returned_in_parts(pair: tuple[BufferedSocket, socket.socket]) -> None:
    sock, peer = pair
    peer.sendall(b"\x30\x06ab")
    assert sock.recv(1) + sock.recv(1) == b"\x30\x06"
    assert sock.recv(6) == b"ab"  # what there is; paho asks again for the rest
    with pytest.raises(BlockingIOError):
        sock.recv(4)
    peer.sendall(b"cdef")
    assert sock.recv(4) == b"cdef"


def test_buffered_bytes_come_before_the_end_of_stream(pair: tuple[BufferedSocket, socket.socket]) -> None:
    sock, peer = pair
    peer.sendall(b"xyz")
    peer.shutdown(socket.SHUT_WR)
    assert sock.recv(2) == b"xy" and sock.recv(2) == b"z"
    assert sock.recv(1) == b""  # then EOF, which paho reads as a lost connection


async def test_the_driver_delivers_messages_and_reconnects_after_a_broker_restart(mosquitto: MosquittoBroker) -> None:
    loop = asyncio.get_running_loop()
    got: asyncio.Queue[bytes] = asyncio.Queue()
    connects: list[int] = []
    client = BufferedClient(CallbackAPIVersion.VERSION2, client_id="driver-test", protocol=mqtt.MQTTv311)

    def on_connect(c: mqtt.Client, *_: object) -> None:
        connects.append(1)
        driver.connack_seen = True
        c.subscribe("t/#")

    client.on_connect = on_connect
    client.on_message = lambda c, u, m: got.put_nowait(bytes(m.payload))
    client.connect_async(mosquitto.host, mosquitto.port, keepalive=5)
    driver = MqttLoopDriver(client, loop, min_delay_s=0.05, max_delay_s=0.2)
    driver.start()
    try:
        for expected_connects in (1, 2):
            while len(connects) < expected_connects:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)  # the SUBACK
            payloads = [b"m%d" % i for i in range(500)]
            for p in payloads:
                client.publish("t/x", p, qos=0)
            assert [await asyncio.wait_for(got.get(), 10) for _ in payloads] == payloads
            if expected_connects == 1:
                await asyncio.to_thread(mosquitto.restart)
    finally:
        await driver.stop()
    assert client.socket() is None


async def test_reconnect_waits_grow_jittered_while_the_broker_is_away_and_start_over_after_a_connack(
    mosquitto: MosquittoBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="central.mqtt.driver")

    def waits() -> list[float]:
        return [float(r.args[0]) for r in caplog.records if "connecting again" in r.msg]  # type: ignore[index,arg-type]

    await asyncio.to_thread(mosquitto.stop)
    loop = asyncio.get_running_loop()
    client = BufferedClient(CallbackAPIVersion.VERSION2, client_id="driver-backoff", protocol=mqtt.MQTTv311)
    client.on_connect = lambda *_: setattr(driver, "connack_seen", True)
    client.connect_async(mosquitto.host, mosquitto.port, keepalive=5)
    driver = MqttLoopDriver(client, loop, min_delay_s=0.02, max_delay_s=0.16)
    driver.start()
    try:
        await wait_for(lambda: len(waits()) >= 5, 30, "five refused connects")
        await asyncio.to_thread(mosquitto.start)
        await wait_for(lambda: driver.connack_seen, 30, "a CONNACK")
        connected_after = len(waits())
        await asyncio.to_thread(mosquitto.kill)
        await wait_for(lambda: len(waits()) > connected_after, 30, "a wait after the lost connection")
    finally:
        await driver.stop()
    refused, after_connack = waits()[:5], waits()[connected_after]
    for n, wait in enumerate(refused):  # windows of 20, 40, 80, 160, 160 ms, each wait in the upper half
        window = min(0.16, 0.02 * 2**n)
        assert window / 2 <= wait <= window, (n, wait)
    assert len(set(refused[3:])) == 2  # at the cap too, not 160 ms each
    assert 0.01 <= after_connack <= 0.02  # the first window again, not the cap's


def test_a_spent_read_budget_reads_as_would_block_until_renewed(pair: tuple[BufferedSocket, socket.socket]) -> None:
    sock, peer = pair
    peer.sendall(b"abcdef")
    sock.allow(1)
    assert sock.recv(3) == b"abc" and not sock.exhausted()
    assert sock.recv(3) == b"def" and sock.exhausted()  # buffer empty, budget spent
    peer.sendall(b"gh")
    with pytest.raises(BlockingIOError):
        sock.recv(1)  # the kernel has bytes, but this wake-up has had its share
    sock.allow(1)
    assert sock.recv(2) == b"gh"
    with pytest.raises(BlockingIOError):
        sock.recv(1)
    assert sock.exhausted()
