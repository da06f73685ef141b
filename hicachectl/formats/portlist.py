"""vastnfs' port list syntax (remoteports=, localports=): addresses and inclusive ranges joined by '~'.

The one parser of the syntax: validation counts the ports with it, the live check compares lists with it."""

from __future__ import annotations

import ipaddress


def port_ranges(spec: str | None) -> list[tuple[int, int]] | None:
    """vastnfs' port list syntax (docs/src/usage/mount-params.md): addresses and inclusive ranges FIRST-LAST, joined by
    '~', as (first, last) integers of one IP version. None: empty, 'dns', names or a malformed list. The one parser of
    the syntax: validate counts the ports with it (rules/storage.py), the live check compares lists with it."""
    if not spec or spec == "dns":
        return None
    ranges: list[tuple[int, int]] = []
    version = None
    for part in spec.split("~"):
        first, dash, last = part.partition("-")
        try:
            low = ipaddress.ip_address(first)
            high = ipaddress.ip_address(last) if dash else low
        except ValueError:
            return None
        if high.version != low.version or (version and low.version != version) or int(high) < int(low):
            return None
        version = low.version
        ranges.append((int(low), int(high)))
    return ranges


def expand_ports(spec: str) -> list[str] | None:
    """The addresses of a vastnfs port list, in order. The driver prints the list back compacted (nfs_show_portgroup: a
    run of succeeding addresses as FIRST-LAST, the rest joined by '~'), so two spellings of one list are compared
    expanded. None where port_ranges says None, or past 4096 addresses (no real list is that long; nothing is expanded
    without bound)."""
    ranges = port_ranges(spec)
    if ranges is None or sum(high - low + 1 for low, high in ranges) > 4096:
        return None
    return [str(ipaddress.ip_address(n)) for low, high in ranges for n in range(low, high + 1)]
