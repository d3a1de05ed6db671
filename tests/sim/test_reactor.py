"""The simulated reactor: time, TCP, threads, system events, death."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from twisted.internet import error, interfaces
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.interfaces import IHalfCloseableProtocol, IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import LoopingCall, deferLater
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from zope.interface import implementer
from zope.interface.verify import verifyObject

from tasknet.sim import World
from tasknet.sim.network import WINDOW, SimTransport

# -- time ----------------------------------------------------------------------------


def test_the_reactor_provides_the_interfaces_it_claims() -> None:
    reactor = World(0).add_process("p")
    for interface in (
        interfaces.IReactorTime,
        interfaces.IReactorTCP,
        interfaces.IReactorThreads,
        interfaces.IReactorCore,
        interfaces.IReactorPluggableNameResolver,
    ):
        assert verifyObject(interface, reactor)


def test_delayed_calls_run_on_simulated_time() -> None:
    world = World(0)
    reactor = world.add_process("p")
    ran: list[tuple[str, float]] = []
    reactor.callLater(5, lambda: ran.append(("five", reactor.seconds())))
    later = reactor.callLater(2, lambda: ran.append(("moved", reactor.seconds())))
    cancelled = reactor.callLater(1, lambda: ran.append(("cancelled", 0)))
    sooner = reactor.callLater(9, lambda: ran.append(("sooner", reactor.seconds())))
    cancelled.cancel()
    later.reset(7)  # later: a DelayedCall's delayed_time
    sooner.reset(3)  # sooner: queued again
    assert len(reactor.getDelayedCalls()) == 3
    assert world.run_until(until=world.now + 100)
    start = world.epoch
    assert ran == [("sooner", start + 3), ("five", start + 5), ("moved", start + 7)]
    assert world.now == start + 100  # the clock reached the time asked for
    assert reactor.getDelayedCalls() == []


def test_looping_call_and_defer_later_on_the_simulated_clock() -> None:
    world = World(0)
    reactor = world.add_process("p")
    ticks: list[float] = []
    loop = LoopingCall(lambda: ticks.append(world.elapsed()))
    loop.clock = reactor
    loop.start(10)
    world.wait(deferLater(reactor, 35, lambda: None))
    loop.stop()
    assert ticks == [0, 10, 20, 30]


def _same_instant_order(seed: int, same_instant: str = "shuffle") -> list[int]:
    world = World(seed, same_instant=same_instant)
    reactor = world.add_process("p")
    order: list[int] = []
    for i in range(12):
        reactor.callLater(0, order.append, i)
    world.run_until()
    return order


def test_events_due_together_run_in_an_order_drawn_from_the_seed() -> None:
    assert _same_instant_order(1) == _same_instant_order(1)
    orders = {tuple(_same_instant_order(seed)) for seed in range(6)}
    assert len(orders) > 1
    assert _same_instant_order(1, "fifo") == list(range(12))


def test_wait_raises_what_the_deferred_failed_with() -> None:
    world = World(0)
    reactor = world.add_process("p")
    d: Deferred[None] = Deferred()
    reactor.callLater(1, d.errback, Failure(ValueError("no")))
    with pytest.raises(ValueError):
        world.wait(d)


def test_an_exception_in_an_event_is_recorded_not_lost() -> None:
    world = World(0)
    reactor = world.add_process("p")

    def boom() -> None:
        raise RuntimeError("boom")

    reactor.callLater(1, boom)
    reactor.callLater(2, lambda: None)
    world.run_until()
    assert [f.type for f in world.errors] == [RuntimeError]
    assert world.events == 2


# -- TCP ----------------------------------------------------------------------------------


class Recorder(Protocol):
    def __init__(self) -> None:
        self.received = b""
        self.lost: Failure | None = None
        self.made = False

    def connectionMade(self) -> None:
        self.made = True

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = Failure(error.ConnectionDone())) -> None:
        self.lost = reason


class Server(Factory):
    def __init__(self) -> None:
        self.protocols: list[Recorder] = []

    def buildProtocol(self, addr: Any) -> Recorder:
        protocol = Recorder()
        protocol.factory = self
        self.protocols.append(protocol)
        return protocol


def _pair(world: World, *, interface: str = "127.0.0.1", host: str = "127.0.0.1") -> Any:
    server_reactor = world.processes.get("server") or world.add_process("server")
    client_reactor = world.processes.get("client") or world.add_process("client")
    server = Server()
    world.wait(TCP4ServerEndpoint(server_reactor, 7000, interface=interface).listen(server))
    client = world.wait(
        TCP4ClientEndpoint(client_reactor, host, 7000).connect(Factory.forProtocol(Recorder))
    )
    world.run_until(lambda: server.protocols)
    return client, server.protocols[0]


def test_bytes_cross_in_order_after_a_latency_and_close_cleanly() -> None:
    world = World(3)
    client, server = _pair(world)
    start = world.now
    for i in range(50):
        client.transport.write(b"%d," % i)
    world.run_until(lambda: server.received.count(b",") == 50)
    assert server.received == b"".join(b"%d," % i for i in range(50))
    assert world.now > start  # one-way latency
    client.transport.loseConnection()
    world.run_until(lambda: server.lost is not None)
    assert client.lost is not None and client.lost.check(error.ConnectionDone)
    assert server.lost is not None and server.lost.check(error.ConnectionDone)
    assert world.network.connections == {}
    assert server.transport.getPeer().host == "127.0.0.1"
    assert client.transport.getPeer().port == 7000


def test_a_connection_to_no_listener_is_refused_and_to_nobody_times_out() -> None:
    world = World(0)
    reactor = world.add_process("client")
    refused = TCP4ClientEndpoint(reactor, "127.0.0.1", 9).connect(Factory.forProtocol(Recorder))
    with pytest.raises(error.ConnectionRefusedError):
        world.wait(refused)
    nobody = TCP4ClientEndpoint(reactor, "10.9.9.9", 9, timeout=5).connect(
        Factory.forProtocol(Recorder)
    )
    start = world.now
    with pytest.raises(error.TimeoutError):
        world.wait(nobody)
    assert world.now == pytest.approx(start + 5)


def test_hostname_endpoint_resolves_the_worlds_names() -> None:
    world = World(0)
    server_reactor = world.add_process("server")
    client_reactor = world.add_process("client")
    server = Server()
    world.wait(TCP4ServerEndpoint(server_reactor, 7000).listen(server))  # 0.0.0.0
    world.network.names["site.example"] = server_reactor.ip
    for host in ("site.example", "server", "localhost"):
        endpoint = HostnameEndpoint(client_reactor, host, 7000)
        world.wait(endpoint.connect(Factory.forProtocol(Recorder)))
    assert len(server.protocols) == 3
    with pytest.raises(error.DNSLookupError):
        world.wait(HostnameEndpoint(client_reactor, "nowhere", 7000).connect(Factory()))
    assert world.wait(client_reactor.resolve("site.example")) == server_reactor.ip


def test_listening_twice_on_a_port_is_refused() -> None:
    world = World(0)
    reactor = world.add_process("p")
    reactor.listenTCP(7000, Factory(), interface="127.0.0.1")
    with pytest.raises(error.CannotListenError):
        reactor.listenTCP(7000, Factory())
    assert reactor.listenTCP(0, Factory()).getHost().port >= 30000


def test_a_partition_holds_the_bytes_until_it_heals() -> None:
    world = World(1)
    client, server = _pair(world)
    world.network.partition("client", "server")
    client.transport.write(b"across")
    world.run_for(30)
    assert server.received == b""
    assert client.lost is None  # a cut alone breaks nothing
    world.network.heal()
    world.run_until(lambda: server.received == b"across", within=1)
    # A new connection during a partition: its SYNs are lost, it times out.
    world.network.partition("client", "server")
    attempt = TCP4ClientEndpoint(world.processes["client"], "127.0.0.1", 7000, timeout=10)
    with pytest.raises(error.TimeoutError):
        world.wait(attempt.connect(Factory.forProtocol(Recorder)))
    # A heal within the timeout: a SYN sent again gets through.
    attempt = TCP4ClientEndpoint(world.processes["client"], "127.0.0.1", 7000, timeout=10)
    d = attempt.connect(Factory.forProtocol(Recorder))
    world.call_later(2.5, world.network.heal)
    assert world.wait(d).made


def test_a_reset_ends_both_sides_and_loses_what_was_on_its_way() -> None:
    world = World(2)
    client, server = _pair(world)
    client.transport.write(b"lost")
    (connection,) = world.network.between("client", "server")
    connection.reset()
    world.run_until()
    assert server.received == b""
    assert client.lost is not None and client.lost.check(error.ConnectionLost)
    assert server.lost is not None and server.lost.check(error.ConnectionLost)


def test_abort_sends_an_rst() -> None:
    world = World(2)
    client, server = _pair(world)
    client.transport.abortConnection()
    world.run_until()
    assert client.lost is not None and client.lost.check(error.ConnectionAborted)
    assert server.lost is not None and server.lost.check(error.ConnectionLost)


def test_a_stalled_direction_delivers_part_of_a_frame_then_waits() -> None:
    world = World(4)
    client, server = _pair(world)
    (connection,) = world.network.between("client", "server")
    connection.stall("client", after=3)
    client.transport.write(b"0123456789")
    world.run_for(60)
    assert server.received == b"012"
    server.transport.write(b"other way")  # the other direction is not stalled
    world.run_until(lambda: client.received == b"other way", within=1)
    connection.unstall()
    world.run_until(lambda: server.received == b"0123456789", within=1)


def test_a_slow_link_takes_its_bandwidth() -> None:
    world = World(5)
    client, server = _pair(world)
    world.network.set_link("client", "server", bandwidth=10_000, latency=(0.01, 0.01))
    start = world.now
    client.transport.write(b"x" * 50_000)
    world.run_until(lambda: len(server.received) == 50_000)
    assert world.now - start == pytest.approx(5.01)


@implementer(IHalfCloseableProtocol)
class HalfCloser(Recorder):
    read_closed = False

    def readConnectionLost(self) -> None:
        self.read_closed = True
        assert self.transport is not None
        self.transport.write(b"after your FIN")
        self.transport.loseConnection()

    def writeConnectionLost(self) -> None:
        pass


def test_half_close() -> None:
    world = World(6)
    server_reactor = world.add_process("server")
    client_reactor = world.add_process("client")
    world.wait(TCP4ServerEndpoint(server_reactor, 7000).listen(Factory.forProtocol(HalfCloser)))
    client = world.wait(
        TCP4ClientEndpoint(client_reactor, "127.0.0.1", 7000).connect(
            Factory.forProtocol(HalfCloser)
        )
    )
    client.transport.loseWriteConnection()
    world.run_until(lambda: client.lost is not None)
    assert client.received == b"after your FIN"
    assert client.lost is not None and client.lost.check(error.ConnectionDone)


@implementer(IPushProducer)
class Firehose:
    """A streaming producer writing 16 KiB per turn while not paused."""

    def __init__(self, transport: Any, reactor: Any, total: int) -> None:
        self.transport, self.reactor, self.left = transport, reactor, total
        self.paused = False
        self.pauses = 0

    def pauseProducing(self) -> None:
        self.paused = True
        self.pauses += 1

    def resumeProducing(self) -> None:
        self.paused = False
        self.reactor.callLater(0, self.produce)

    def stopProducing(self) -> None:
        self.left = 0

    def produce(self) -> None:
        while not self.paused and self.left > 0:
            self.left -= 16384
            self.transport.write(b"y" * 16384)
        if self.left <= 0 and not self.paused:
            self.transport.unregisterProducer()


def test_a_streaming_producer_is_paused_while_its_peer_reads_nothing() -> None:
    world = World(7)
    client, server = _pair(world)
    hose = Firehose(client.transport, world.processes["client"], 1024 * 1024)
    client.transport.registerProducer(hose, True)
    server.transport.pauseProducing()  # the server reads nothing
    hose.produce()
    world.run_for(10)
    assert hose.paused and hose.left > 0
    assert client.transport.outbound.unread + server.transport._pending_read <= WINDOW + 16384
    server.transport.resumeProducing()
    world.run_until(lambda: len(server.received) == 1024 * 1024, within=10)
    assert hose.pauses >= 1


def test_kill_and_power_off_end_connections_as_the_kernel_would() -> None:
    world = World(8)
    client, server = _pair(world)
    first_ip = world.processes["server"].ip
    world.crash("server")  # the kernel closes its sockets: FIN
    world.run_until()
    assert client.lost is not None and client.lost.check(error.ConnectionDone)
    assert server.lost is None  # a dead process's objects are never called again
    restarted = world.add_process("server")
    assert restarted.ip == first_ip and restarted.incarnation == 2
    client, server = _pair(world)
    world.crash("server", how="power")
    client.transport.write(b"into the void")
    world.run_for(60)
    assert client.lost is None and server.lost is None


def test_a_dead_process_runs_nothing_more() -> None:
    world = World(9)
    reactor = world.add_process("p")
    ran: list[int] = []
    reactor.callLater(1, ran.append, 1)
    pool = reactor.getThreadPool()
    pool.callInThread(ran.append, 2)
    world.crash("p")
    reactor.callLater(0, ran.append, 3)
    world.run_until()
    assert ran == []
    again = world.add_process("p")
    assert again.incarnation == 2 and again.alive


# -- threads ----------------------------------------------------------------------------


def test_thread_jobs_run_inline_at_a_simulated_duration() -> None:
    world = World(10, thread_time=(0.5, 1.0))
    reactor = world.add_process("p")
    here = threading.get_ident()
    pool = reactor.getThreadPool()
    d = deferToThreadPool(reactor, pool, lambda: threading.get_ident())  # type: ignore[arg-type]
    assert world.wait(d) == here
    assert 0.5 <= world.elapsed() <= 1.0
    assert world.foreign == []


def test_a_one_thread_pool_keeps_its_jobs_in_order() -> None:
    from tasknet.sim.threads import SimThreadPool

    world = World(11)
    reactor = world.add_process("p")
    pool = SimThreadPool(reactor, 0, 1)
    pool.start()
    order: list[int] = []
    for i in range(20):
        pool.callInThread(order.append, i)
    world.run_until()
    assert order == list(range(20))


def test_call_from_thread_is_first_in_first_out() -> None:
    world = World(12)
    reactor = world.add_process("p")
    order: list[int] = []
    for i in range(20):
        reactor.callFromThread(order.append, i)
    world.run_until()
    assert order == list(range(20))


def test_a_real_thread_reaching_the_world_is_caught() -> None:
    world = World(13)
    reactor = world.add_process("p")
    thread = threading.Thread(target=reactor.callFromThread, args=(print,))
    thread.start()
    thread.join()
    world.run_until()
    assert world.foreign and "callFromThread" in world.foreign[0]


# -- system events --------------------------------------------------------------------------


def test_startup_and_shutdown_triggers_then_the_process_exits() -> None:
    world = World(14)
    reactor = world.add_process("p")
    seen: list[str] = []
    reactor.callWhenRunning(seen.append, "running")
    slow: Deferred[None] = Deferred()

    def before() -> Deferred[None]:
        seen.append("before")
        reactor.callLater(5, slow.callback, None)
        return slow

    reactor.addSystemEventTrigger("before", "shutdown", before)
    reactor.addSystemEventTrigger("during", "shutdown", seen.append, "during")
    assert seen == []
    reactor.startRunning()
    assert seen == ["running"]
    reactor.callWhenRunning(seen.append, "at once")
    reactor.stop()
    world.run_until(lambda: not reactor.alive)
    assert seen == ["running", "at once", "before", "during"]
    assert world.elapsed() == pytest.approx(5)


def test_a_transport_is_what_twisted_expects() -> None:
    world = World(15)
    client, _ = _pair(world)
    assert isinstance(client.transport, SimTransport)
    assert verifyObject(interfaces.ITCPTransport, client.transport)
    assert verifyObject(interfaces.IPushProducer, client.transport)


def test_a_pull_producer_is_asked_for_more_until_it_is_done() -> None:
    import io

    from twisted.protocols.basic import FileSender

    world = World(16)
    data = bytes(range(256)) * 4000

    class Send(Protocol):
        def connectionMade(self) -> None:
            sent = FileSender().beginFileTransfer(io.BytesIO(data), self.transport)
            sent.addCallback(lambda _: self.transport.loseConnection())  # type: ignore[union-attr]

    server_reactor = world.add_process("server")
    world.wait(TCP4ServerEndpoint(server_reactor, 7000).listen(Factory.forProtocol(Send)))
    client = world.wait(
        TCP4ClientEndpoint(world.add_process("client"), "127.0.0.1", 7000).connect(
            Factory.forProtocol(Recorder)
        )
    )
    world.run_until(lambda: client.lost is not None, within=60)
    assert client.received == data
    assert client.lost is not None and client.lost.check(error.ConnectionDone)


def test_in_the_simulated_world_a_process_is_dead_here_by_the_worlds_pids() -> None:
    """Every simulated process shares the one real pid: the lease's probe
    is the world's, which knows which of its processes are alive."""
    from tasknet.runtime import IProcesses
    from tasknet.site.storage.instances import Instance
    from tasknet.site.storage.lease import dead_here

    world = World(1)
    first = world.add_process("site")
    beside = world.add_process("site2")
    assert verifyObject(IProcesses, first)
    me = first.this()
    assert me.pid != beside.this().pid and me.pid != os.getpid()
    assert me.host != beside.this().host  # each process name is a machine of its own

    def instance(process: Any) -> Instance:
        who = process.this()
        return Instance(
            1, "a", who.host, who.pid, None, "", "", None, None, None, process_space=who.space
        )

    first.pause(5.0)
    assert not dead_here(instance(first), first)  # paused, not dead
    first.die("kill")
    again = world.add_process("site")  # the restart, on the same machine
    assert dead_here(instance(first), again)
    assert not dead_here(instance(first), beside)  # another machine cannot look it up
    again.die("power")
    booted = world.add_process("site")  # a new kernel: its old pids mean nothing
    assert booted.this().space != again.this().space
    assert not dead_here(instance(again), booted)
