"""Where a webhook may be sent. A tenant chooses the URL, and the server POSTs to it from
inside the operator's network, so without a check any service key could reach the store,
the cloud's metadata service or any internal port, and read what came back in
`last_delivery`.

The host is resolved at registration and again at every delivery, and every address it
resolves to must be publicly routable (or inside the operator's allow-list); the delivery then
connects to the address that was checked, with the original `Host` header and TLS name, so a
DNS answer that changes between the check and the connection (rebinding) cannot redirect it.
Redirects are never followed.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import httpx

from turnstile.errors import TurnstileError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host as sent to DNS, port) -> the addresses it resolves to, as strings.
Resolver = Callable[[str, int], list[str]]

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network
# Why an address is refused, first match wins. `is_global` alone is not enough: Python 3.11
# calls multicast, 6to4, NAT64 and IPv4-compatible addresses global.
REFUSED: tuple[tuple[Network, str], ...] = (
    (_V4("0.0.0.0/32"), "unspecified"),
    (_V4("0.0.0.0/8"), "this network"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "shared address space"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "IETF protocol assignment"),
    (_V4("192.0.2.0/24"), "documentation"),
    (_V4("192.88.99.0/24"), "6to4 relay anycast"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation"),
    (_V4("203.0.113.0/24"), "documentation"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("240.0.0.0/4"), "reserved"),
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("64:ff9b:1::/48"), "local-use NAT64"),
    (_V6("100::/64"), "discard-only"),
    (_V6("2001:2::/48"), "benchmarking"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("fc00::/7"), "unique-local"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local"),
    (_V6("ff00::/8"), "multicast"),
)
_COMPATIBLE = _V6("::/96")  # deprecated IPv4-compatible form, ::a.b.c.d
_NAT64 = _V6("64:ff9b::/96")
HOSTNAME = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)(\.(?!-)[a-z0-9_-]{1,63}(?<!-))*\.?$")


class TargetError(TurnstileError):
    """A URL a webhook may not be sent to; `code` is the problem code at registration."""

    code = "invalid_url"

    def __init__(self, reason: str, address: str = "") -> None:
        super().__init__(reason)
        self.reason = reason  # what the tenant is told
        self.address = address  # for the operator's log: DNS answers are not the tenant's


class InvalidTargetError(TargetError):
    code = "invalid_url"


class UnresolvableTargetError(TargetError):
    code = "webhook_target_unresolvable"


class RefusedTargetError(TargetError):
    code = "webhook_target_refused"


def system_resolver(host: str, port: int) -> list[str]:
    """What the operating system answers, as the connection would have used it."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


class HostsFile:
    """Names looked up in a hosts(5)-style file first, then `fallback`. Re-read at every
    lookup, so a changed answer counts at the next check, as a changed DNS record would."""

    def __init__(self, path: Path, fallback: Resolver = system_resolver) -> None:
        self.path, self.fallback = path, fallback

    def __call__(self, host: str, port: int) -> list[str]:
        wanted = host.rstrip(".").lower()
        found: list[str] = []
        for line in self.path.read_text().splitlines():
            fields = line.partition("#")[0].split()
            if fields[1:] and wanted in (n.rstrip(".").lower() for n in fields[1:]):
                found.append(fields[0])
        return found or self.fallback(host, port)


def _embedded_v4(ip: ipaddress.IPv6Address) -> list[tuple[ipaddress.IPv4Address, str]]:
    """The IPv4 addresses an IPv6 address reaches through a translation or tunnel."""
    out: list[tuple[ipaddress.IPv4Address, str]] = []
    if ip in _COMPATIBLE:
        out.append((ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), "IPv4-compatible"))
    if ip in _NAT64:
        out.append((ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), "NAT64"))
    if ip.sixtofour is not None:
        out.append((ip.sixtofour, "6to4"))
    if ip.teredo is not None:
        out.extend((v4, "Teredo") for v4 in ip.teredo)
    return out


@dataclass(frozen=True)
class Policy:
    """Which targets are admitted: public addresses, plus what the operator allows by name
    (any address that name resolves to) or by network."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Policy:
        """From `TURNSTILE_API_WEBHOOK_ALLOW`: comma-separated host names, addresses and CIDRs."""
        hosts: set[str] = set()
        networks: list[Network] = []
        for entry in (e.strip().lower() for e in text.split(",")):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            if not HOSTNAME.match(entry) or "/" in entry:
                raise ValueError(f"webhook allow-list entry {entry!r} is no host name or CIDR")
            hosts.add(entry.rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def refusal(self, ip: Address) -> str | None:
        """Why a webhook may not connect to `ip`, or None when it may."""
        if any(ip in net for net in self.networks):
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            inner = self.refusal(ip.ipv4_mapped)  # the same socket as the IPv4 address
            return None if inner is None else f"IPv4-mapped {inner}"
        for net, why in REFUSED:
            if ip in net:
                return why
        if isinstance(ip, ipaddress.IPv6Address):
            for v4, form in _embedded_v4(ip):
                inner = self.refusal(v4)
                if inner is not None:
                    return f"{form} form of {inner}"
        return None if ip.is_global else "not globally reachable"


@dataclass(frozen=True)
class Target:
    """A checked URL and the address its delivery connects to."""

    url: httpx.URL
    address: Address

    def request(self, content: bytes, headers: Mapping[str, str]) -> httpx.Request:
        """A POST that connects to the checked address, named as the URL names its host."""
        pinned = self.url.copy_with(host=str(self.address), fragment=None)
        host = self.url.raw_host.decode("ascii")
        extensions = {} if _literal(host) is not None else {"sni_hostname": host}
        return httpx.Request(
            "POST", pinned, content=content, extensions=extensions,
            headers={**headers, "Host": self.url.netloc.decode("ascii")},
        )  # fmt: skip


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def parse(text: str, *, https_only: bool) -> httpx.URL:
    """The URL as httpx will send it, or InvalidTargetError naming what is wrong with it."""
    schemes = ("https",) if https_only else ("http", "https")
    if any(ord(c) < 33 or ord(c) == 127 for c in text):
        raise InvalidTargetError("url must not contain spaces or control characters")
    try:
        url = httpx.URL(text)
        host = url.raw_host.decode("ascii")
        port = url.port
    except (httpx.InvalidURL, ValueError) as exc:  # UnicodeError from IDNA is a ValueError
        raise InvalidTargetError(f"url is not valid: {exc}") from None
    if url.scheme not in schemes or not host:
        raise InvalidTargetError(f"url must be an absolute {' or '.join(schemes)} URL")
    if url.userinfo:
        raise InvalidTargetError("url must not carry credentials; deliveries are signed instead")
    if port is not None and not 1 <= port <= 65535:
        raise InvalidTargetError(f"url port {port} is out of range 1-65535")
    if "%" in host or (_literal(host) is None and not HOSTNAME.match(host)):
        raise InvalidTargetError(f"url host {host!r} is not a host name or address")
    return url


def _addresses(host: str, port: int, resolver: Resolver) -> list[Address]:
    literal = _literal(host)
    if literal is not None:
        return [literal]
    try:
        answers = resolver(host, port)
        found = [ipaddress.ip_address(a.partition("%")[0]) for a in answers]
    except (OSError, ValueError):  # gaierror is an OSError; ValueError: not an address
        found = []
    if not found:
        raise UnresolvableTargetError(f"{host} does not resolve")
    return found


def _shown(host: str, ip: Address) -> str:
    """How a refused address is named to the tenant: the address when the URL spelt it (in
    any notation), only its kind when it came from DNS, whose answers are the operator's."""
    try:
        spelt = _literal(host) is not None or bool(socket.inet_aton(host))
    except OSError:
        spelt = False
    return str(ip) if spelt else "a refused address"


@dataclass(frozen=True)
class Checker:
    policy: Policy
    resolver: Resolver
    https_only: bool

    def check(self, text: str) -> Target:
        """The target `text` may be delivered to, pinned to its checked address; or a
        TargetError saying why not."""
        url = parse(text, https_only=self.https_only)
        host = url.raw_host.decode("ascii")
        port = url.port or (443 if url.scheme == "https" else 80)
        found = _addresses(host, port, self.resolver)
        if host.rstrip(".").lower() not in self.policy.hosts:
            for ip in found:
                why = self.policy.refusal(ip)
                if why is not None:
                    shown = f"{host} resolves to {_shown(host, ip)} ({why})"
                    raise RefusedTargetError(shown, str(ip))
        return Target(url, found[0])


@lru_cache(maxsize=8)
def checker(allow: str, hosts_file: Path | None, https_only: bool) -> Checker:
    """The checker for these settings (their allow-list parsed once)."""
    resolver: Resolver = system_resolver if hosts_file is None else HostsFile(hosts_file)
    return Checker(Policy.parse(allow), resolver, https_only)
