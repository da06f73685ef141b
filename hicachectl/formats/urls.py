"""HTTP URLs as the router holds its workers: a host in a URL (an IPv6 address in brackets) and the normal form the
router compares (plans/router.py writes it, rules/fleet.py compares servers by it)."""

from __future__ import annotations

import ipaddress
import re
import urllib.parse


def url_host(host: str) -> str:
    """A host for a URL: an IPv6 address in brackets."""
    host = str(host).strip()
    if host.startswith("[") and host.endswith("]"):
        return host
    try:
        if isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address):
            return f"[{host}]"
    except ValueError:
        pass
    return host


def normalize(url: str) -> str:
    """The URL as the router holds it and as the hicache_router_worker module compares it: no trailing slash,
    scheme and host in lower case. Refuses what is not http(s)://host[:port] (the router keeps URLs verbatim)."""
    text = str(url).strip()
    parts = urllib.parse.urlsplit(text)
    if (parts.scheme.lower() not in ("http", "https") or not parts.netloc or parts.query or parts.fragment
            or parts.path.strip("/") or any(c.isspace() or c in "\"'\\$%" for c in text)):
        raise ValueError(f"{text!r} is not a worker URL: http(s)://host[:port] without a path")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def worker_url(explicit: str | None, address: str, port: int) -> str:
    """Where a router reaches a server, normalized: `explicit` (hicache_worker_url) when given, else
    http://<address>:<port> (an IPv6 address in brackets). ValueError when no worker URL can be made of it."""
    return normalize(explicit if explicit else f"http://{url_host(address)}:{int(port)}")


def is_loopback(host: str, unspecified: bool = False) -> bool:
    """Whether a URL's or an address's host is this machine only (127.0.0.0/8, ::1, localhost). With `unspecified`,
    0.0.0.0 and :: too: as a destination (a URL's host) they mean this machine; as a bind address, every interface."""
    host = str(host).strip().strip("[]").lower().rstrip(".")
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or (unspecified and address.is_unspecified)


_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"^(?=.{{1,253}}\.?$){_LABEL}(?:\.{_LABEL})*\.?$")


def has_blank_or_control(text: str) -> bool:
    """Whether `text` holds a blank or a control character: never in a host address or a user name for SSH."""
    return any(c.isspace() or not c.isprintable() for c in text)


def is_host_address(text: str) -> bool:
    """Whether `text` can be where SSH reaches a machine (ansible_host): an IPv4 or IPv6 address (an IPv6 one may carry
    a %zone) or a DNS name (RFC 1123 labels; '_' allowed, as resolvers take it)."""
    text = str(text)
    if not text or has_blank_or_control(text):
        return False
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    return bool(_HOST_NAME.match(text)) and not text.replace(".", "").isdigit()
