"""A stand-in for systemd-logind on a private bus, for tests of the shutdown stage's logind path
(these machines have no systemd). Run with the system Python (dbus-python, GLib):
``DBUS_SYSTEM_BUS_ADDRESS=... /usr/bin/python3 tests/fake_logind.py RECORD``.

org.freedesktop.login1.Manager.Inhibit(what, who, why, mode) records its arguments in RECORD
and returns a pipe's read end as the lock (its write end is kept: a write failing with EPIPE
means the holder let go; ``released`` is then recorded). A line ``true`` / ``false`` on stdin
emits PrepareForShutdown(true|false)."""

from __future__ import annotations

import os
import sys

import dbus
import dbus.mainloop.glib
import dbus.service
from gi.repository import GLib

IFACE = "org.freedesktop.login1.Manager"


class Manager(dbus.service.Object):  # type: ignore[misc]
    def __init__(self, bus: dbus.bus.BusConnection, record: str) -> None:
        super().__init__(bus, "/org/freedesktop/login1")
        self.record = record
        self.locks: list[int] = []

    def note(self, line: str) -> None:
        with open(self.record, "a") as f:
            f.write(line + "\n")

    @dbus.service.method(IFACE, in_signature="ssss", out_signature="h")
    def Inhibit(self, what: str, who: str, why: str, mode: str) -> dbus.types.UnixFd:
        read, write = os.pipe()
        self.locks.append(write)
        self.note(f"inhibit|{what}|{who}|{why}|{mode}")
        fd = dbus.types.UnixFd(read)
        os.close(read)
        return fd

    @dbus.service.signal(IFACE, signature="b")
    def PrepareForShutdown(self, active: bool) -> None:
        self.note(f"signal|{active}")

    def check_locks(self) -> bool:
        for write in list(self.locks):
            try:
                os.write(write, b"x")
            except (BrokenPipeError, OSError):
                self.locks.remove(write)
                os.close(write)
                self.note("released")
        return True


def main() -> None:
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.bus.BusConnection(os.environ["DBUS_SYSTEM_BUS_ADDRESS"])
    name = dbus.service.BusName("org.freedesktop.login1", bus)
    manager = Manager(bus, sys.argv[1])

    def command(source: object, condition: object) -> bool:
        line = sys.stdin.readline().strip()
        if line in ("true", "false"):
            manager.PrepareForShutdown(line == "true")
        return bool(line)

    GLib.io_add_watch(sys.stdin, GLib.IO_IN, command)
    GLib.timeout_add(200, manager.check_locks)
    manager.note("ready")
    _ = name
    GLib.MainLoop().run()


if __name__ == "__main__":
    main()
