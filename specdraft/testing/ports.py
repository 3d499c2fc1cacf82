"""A free loopback TCP port, for the processes tests and benchmark suites start (a server, a rendezvous)."""
import socket


def free_port() -> int:
    """A port nothing listens on now: the OS's pick for a bound-then-closed socket (a race, harmless on loopback)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
