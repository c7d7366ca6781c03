"""Where a webhook may be sent, decided without a network: the address ranges refused and
why, the spellings and translations of a refused address, every answer of a lookup checked,
the operator's allow-list, URLs httpx could not send, and the request pinned to the address
that was checked. Lookups go through the checker's resolver seam (a table here)."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from turnstile.worker.http import targets
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.http.targets import (
    Checker,
    HostsFile,
    InvalidTargetError,
    Policy,
    RefusedTargetError,
    UnresolvableTargetError,
)

PUBLIC_V4, PUBLIC_V6 = "93.184.215.14", "2606:4700:4700::1111"


def table(answers: dict[str, list[str]]) -> targets.Resolver:
    """A resolver answering from `answers`, and as DNS does for any other name: not found."""

    def resolve(host: str, port: int) -> list[str]:
        if host.rstrip(".") in answers:  # a fully qualified name is the same name
            return answers[host.rstrip(".")]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    return resolve


def checker(
    allow: str = "", answers: dict[str, list[str]] | None = None, *, https_only: bool = False
) -> Checker:
    return Checker(Policy.parse(allow), table(answers or {}), https_only)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("10.1.2.3", "private"),
        ("172.16.0.1", "private"), ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"), ("100.64.0.1", "shared address space"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 - an address refused, not bound
        ("0.1.2.3", "this network"), ("224.0.1.1", "multicast"),
        ("239.255.255.250", "multicast"), ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"), ("198.18.0.1", "benchmarking"),
        ("192.0.2.1", "documentation"), ("192.0.0.9", "IETF protocol assignment"),
        ("::1", "loopback"), ("::", "unspecified"), ("fd00::1", "unique-local"),
        ("fc00::1", "unique-local"), ("fe80::1", "link-local"), ("fec0::1", "site-local"),
        ("ff02::1", "multicast"), ("2001:db8::1", "documentation"),
        ("::ffff:127.0.0.1", "IPv4-mapped loopback"),
        ("::ffff:169.254.169.254", "IPv4-mapped link-local"),
        ("::127.0.0.1", "IPv4-compatible form of loopback"),
        ("::10.0.0.1", "IPv4-compatible form of private"),
        ("2002:7f00:1::1", "6to4 form of loopback"),
        ("2002:a9fe:a9fe::", "6to4 form of link-local"),
        ("64:ff9b::7f00:1", "NAT64 form of loopback"), ("64:ff9b::a00:1", "NAT64 form of private"),
        ("64:ff9b:1::1", "local-use NAT64"),
    ],
)  # fmt: skip
def test_a_non_public_address_is_refused_with_its_kind(address: str, why: str) -> None:
    """Each loopback, private, link-local, shared, special-purpose, multicast or unique-local
    address, and each IPv6 form that reaches a refused IPv4 address, is refused naming its
    kind, and the detail shows the address the URL spelt."""
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(RefusedTargetError) as refused:
        checker().check(f"http://{host}:8080/hook")
    assert refused.value.reason.endswith(f"({why})")
    assert refused.value.code == "webhook_target_refused"


@pytest.mark.parametrize(
    "spelt", ["2130706433", "0x7f000001", "017700000001", "127.1", "0x7f.1", "0x7f.0.0.1"]
)
def test_a_loopback_address_in_another_notation_is_refused(spelt: str) -> None:
    """Decimal, hex, octal and short spellings of 127.0.0.1 are looked up as the system
    would connect to them (getaddrinfo) and refused as loopback, naming the address; a dotted
    quad with octal parts is not even a URL httpx sends."""
    check = Checker(Policy(), targets.system_resolver, https_only=False)
    with pytest.raises(RefusedTargetError) as refused:
        check.check(f"http://{spelt}/hook")
    assert refused.value.reason == f"{spelt} resolves to 127.0.0.1 (loopback)"
    with pytest.raises(InvalidTargetError, match="Invalid IPv4 address"):
        check.check("http://0177.0.0.1/hook")


def test_public_addresses_are_admitted_and_the_first_answer_is_pinned() -> None:
    """Public IPv4 and IPv6 literals are admitted; a name whose answers are all public is
    pinned to its first answer."""
    answers = {"hooks.example.com": [PUBLIC_V6, PUBLIC_V4]}
    assert str(checker().check(f"https://{PUBLIC_V4}/h").address) == PUBLIC_V4
    assert str(checker().check(f"https://[{PUBLIC_V6}]/h").address) == PUBLIC_V6
    assert str(checker(answers=answers).check("https://hooks.example.com/h").address) == PUBLIC_V6


def test_every_answer_of_a_lookup_is_checked_and_dns_answers_are_not_shown() -> None:
    """A name with one public and one private answer is refused; the tenant is told the kind
    of address, not which one DNS gave (that stays in the operator's log)."""
    with pytest.raises(RefusedTargetError) as refused:
        checker(answers={"mixed.example": [PUBLIC_V4, "10.9.8.7"]}).check("http://mixed.example/")
    assert refused.value.reason == "mixed.example resolves to a refused address (private)"
    assert refused.value.address == "10.9.8.7"


def test_a_name_that_does_not_resolve_is_its_own_refusal() -> None:
    """A name with no answer (or an answer that is no address) is `webhook_target_unresolvable`."""
    tables: list[dict[str, list[str]]] = [
        {},
        {"nowhere.example": []},
        {"nowhere.example": ["not-an-ip"]},
    ]
    for answers in tables:
        with pytest.raises(UnresolvableTargetError) as refused:
            checker(answers=answers).check("https://nowhere.example/h")
        assert refused.value.reason == "nowhere.example does not resolve"


def test_the_allow_list_admits_named_hosts_and_networks_only() -> None:
    """A CIDR admits the addresses inside it (also IPv4-mapped), a bare address itself, a
    host name any address it resolves to; the neighbours stay refused."""
    answers = {"hooks.internal": ["10.0.0.5"], "other.internal": ["10.0.0.5"]}
    allowed = checker("10.1.0.0/16, 127.0.0.2 ,HOOKS.internal.", answers)
    for url in ("http://10.1.2.3/", "http://[::ffff:10.1.2.3]/", "http://127.0.0.2:9/",
                "http://hooks.internal/", "http://Hooks.Internal./"):  # fmt: skip
        allowed.check(url)
    for url in ("http://10.2.0.1/", "http://127.0.0.1/", "http://other.internal/"):
        with pytest.raises(RefusedTargetError):
            allowed.check(url)


@pytest.mark.parametrize("entry", ["a b", "10.0.0.0/33", "http://x", "-bad.example", "x/y"])
def test_a_bad_allow_list_entry_stops_the_settings(entry: str) -> None:
    """An allow-list entry that is neither a host name nor a CIDR is a settings error (the
    server does not start), naming the entry."""
    with pytest.raises(ValueError, match="allow-list entry"):
        ApiSettings(webhook_allow=f"10.0.0.0/8,{entry}")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://hook.example/\r\nX-Injected: 1", "control characters"),
        ("http://hook.example\r\n/", "control characters"),
        ("http://hook.example/a b", "control characters"),
        ("http://hook.example/\x00", "control characters"),
        ("http://8.8.8.8:99999/", "port 99999 is out of range"),
        ("http://8.8.8.8:0/", "port 0 is out of range"),
        ("http://8.8.8.8:x/", "not valid"),
        ("http://user:pw@8.8.8.8/", "credentials"),
        ("http://8.8.8.8@hook.example/", "credentials"),
        ("ftp://8.8.8.8/", "absolute http or https URL"),
        ("file:///etc/passwd", "absolute http or https URL"),
        ("http:/8.8.8.8/", "absolute http or https URL"),
        ("//8.8.8.8/", "absolute http or https URL"),
        ("http://hook%2eexample/", "not a host name"),
        ("http://[fe80::1%25eth0]/", "not a host name"),
    ],
)
def test_a_url_httpx_could_not_send_is_invalid(url: str, why: str) -> None:
    """Control characters, a port out of range, credentials, another scheme, no host, or a
    host that is no name or address: each `invalid_url`, naming what is wrong."""
    with pytest.raises(InvalidTargetError) as refused:
        checker(answers={"hook.example": [PUBLIC_V4]}).check(url)
    assert why in refused.value.reason and refused.value.code == "invalid_url"


def test_https_only_refuses_plain_http() -> None:
    """With `webhook_https_only`, an http URL is refused even to a public address."""
    with pytest.raises(InvalidTargetError, match="absolute https URL"):
        checker(https_only=True).check(f"http://{PUBLIC_V4}/")


def test_the_request_goes_to_the_checked_address_named_as_the_url_names_it() -> None:
    """The delivery's URL carries the checked address, while `Host` and the TLS server name
    (SNI and certificate check) are the URL's own host; a fragment is not sent."""
    answers = {"hooks.example.com": [PUBLIC_V4], "v6.example.com": [PUBLIC_V6]}
    target = checker(answers=answers).check("https://hooks.example.com:8443/in?a=1#frag")
    request = target.request(b"{}", {"Turnstile-Event": "run.finished"})
    assert str(request.url) == f"https://{PUBLIC_V4}:8443/in?a=1"
    assert request.headers["host"] == "hooks.example.com:8443"
    assert request.extensions["sni_hostname"] == "hooks.example.com"
    assert request.headers["turnstile-event"] == "run.finished" and request.content == b"{}"
    v6 = checker(answers=answers).check("http://v6.example.com/").request(b"", {})
    assert v6.url.host == PUBLIC_V6 and v6.headers["host"] == "v6.example.com"
    literal = checker().check(f"https://{PUBLIC_V4}/").request(b"", {})
    assert "sni_hostname" not in literal.extensions


def test_the_hosts_file_answers_first_and_is_read_at_every_lookup(tmp_path: Path) -> None:
    """A name in the hosts file gets the file's addresses (checked like DNS's), a changed
    file counts at the next lookup, and any other name goes to the fallback resolver."""
    path = tmp_path / "hosts"
    path.write_text(f"# comment\n{PUBLIC_V4} hooks.example.com Alias.Example\n\n")
    hosts = HostsFile(path, table({"other.example": [PUBLIC_V6]}))
    check = Checker(Policy(), hosts, https_only=False)
    assert str(check.check("http://alias.example./").address) == PUBLIC_V4
    assert str(check.check("http://other.example/").address) == PUBLIC_V6
    path.write_text("127.0.0.1 hooks.example.com\n")
    with pytest.raises(RefusedTargetError, match=r"\(loopback\)"):
        check.check("http://hooks.example.com/")


def test_an_idn_host_is_looked_up_and_sent_in_its_ascii_form() -> None:
    """A host name in Unicode is looked up, sent in `Host` and used as the TLS name in its
    IDNA (xn--) form, the form that was checked."""
    ascii_name = "xn--bcher-kva.example"
    target = checker(answers={ascii_name: [PUBLIC_V4]}).check("https://bücher.example/")
    request = target.request(b"", {})
    assert request.headers["host"] == ascii_name
    assert request.extensions["sni_hostname"] == ascii_name
    assert isinstance(request.url, httpx.URL) and request.url.host == PUBLIC_V4
