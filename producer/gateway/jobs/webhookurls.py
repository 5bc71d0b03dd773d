"""Where a webhook may go: https to a public address, unless the operator allows more (issue #19).

A webhook URL comes from the client, and the gateway POSTs to it from inside the operator's network: left
open, anyone with an API key could make the gateway reach Redis, a cloud metadata service or an admin page
(server-side request forgery). So a URL is refused when

- its scheme is not https (http too with --webhook-allow-http), or it carries credentials (user:pass@);
- its host is, or resolves to, an address that is not public: unspecified, loopback, link-local,
  multicast, private, reserved or otherwise not globally reachable (IPv4 inside IPv6 forms included:
  ::ffff:10.0.0.1, 6to4, NAT64), or an IPv4 address written in a legacy form (127.1, 0x7f000001);

unless --webhook-allow-hosts names its host, or a network holding the address (how tests deliver to a
receiver on loopback). Checked twice: at submit (POST /v1/jobs answers 400 naming `webhook`) and at every
connection (webhooks.py): the host is resolved once, every address it resolves to is checked, and the
connection goes to a checked address, so a name that pointed somewhere public at submit cannot be pointed
inside later (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from dataclasses import dataclass, field

import httpx

from embedfleet.common.errors import ValidationError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_HOSTNAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")  # as sent: IDNA
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the last 32 bits are the IPv4 address
_ALLOWED = ("only public addresses are allowed (an operator can let hosts or networks through with "
            "--webhook-allow-hosts)")
# The first property that holds names the refusal: the ipaddress module also calls unspecified, loopback,
# link-local and reserved (240/4) addresses private, so the narrower words come first.
_KINDS = (("is_unspecified", "an unspecified address"), ("is_loopback", "a loopback address"),
          ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address"),
          ("is_reserved", "a reserved address"), ("is_private", "a private address"))
_ADDRESS_LIKE = re.compile(r"[0-9a-fA-F.:/\[\]]+")


class WebhookRefusedError(ValidationError):
    """A webhook URL the policy does not allow; the message says what was wrong and what is allowed."""

    def __init__(self, message: str):
        super().__init__(message, param="webhook")


def refusal(address: IPAddress) -> str | None:
    """What kind of address `address` is, when a webhook may not go there (None: it is public)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            why = refusal(embedded)
            return None if why is None else f"{why} ({embedded} inside IPv6)"
    for prop, kind in _KINDS:
        if getattr(address, prop):
            return kind
    if not address.is_global:
        return "an address that is not globally reachable"
    return None


@dataclass(frozen=True)
class Target:
    """A webhook URL that passed the checks that need no lookup."""

    url: httpx.URL
    host: str  # lower case, ASCII (IDNA), no trailing dot
    port: int
    literal: IPAddress | None  # the host, when it is an address


@dataclass(frozen=True)
class WebhookPolicy:
    """--webhook-allow-http and --webhook-allow-hosts, built once from the settings."""

    allow_http: bool = False
    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = field(default=())

    @classmethod
    def from_flags(cls, allow_http: bool, allow_hosts: str | None) -> WebhookPolicy:
        """ValueError naming the entry of --webhook-allow-hosts that is neither a host name nor an
        address or network."""
        hosts, networks = set(), []
        for entry in (e.strip() for e in (allow_hosts or "").split(",")):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]")))
                continue
            except ValueError as exc:
                if _ADDRESS_LIKE.fullmatch(entry) and ("/" in entry or ":" in entry
                                                       or entry.replace(".", "").isdigit()):
                    raise ValueError(f"--webhook-allow-hosts: {entry!r} is not an address or network ({exc}); "
                                     "write 10.1.2.3, 10.0.0.0/8, ::1 or fd00::/8") from None
            name = entry.lower().rstrip(".")
            if not _HOSTNAME.fullmatch(name):
                raise ValueError(f"--webhook-allow-hosts: {entry!r} is not a host name, address or network; "
                                 "give exact names (hooks.internal, no wildcards), addresses or CIDR networks, "
                                 "comma-separated")
            hosts.add(name)
        return cls(allow_http, frozenset(hosts), tuple(networks))

    def check_url(self, url: str) -> Target:
        """The checks that need no lookup: scheme, credentials, host, port, and the host's address when
        it is one. WebhookRefusedError otherwise."""
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError, UnicodeError) as exc:
            raise WebhookRefusedError(f"`webhook` is not a valid URL ({exc}); send https://HOST[:PORT]/PATH") from None
        schemes = ("https", "http") if self.allow_http else ("https",)
        if parsed.scheme not in schemes:
            allowed = ("an http or https URL" if self.allow_http else
                       "an https URL (plain http only on a gateway started with --webhook-allow-http)")
            raise WebhookRefusedError(f"`webhook` must be {allowed}, got scheme {parsed.scheme!r}")
        if parsed.userinfo:
            raise WebhookRefusedError("`webhook` must not carry credentials (user:password@): authenticate the "
                                      "gateway's requests by their X-Embedfleet-Signature-256 signature")
        host = parsed.raw_host.decode("ascii").lower().rstrip(".")
        if not host:
            raise WebhookRefusedError("`webhook` names no host; send https://HOST[:PORT]/PATH")
        port = parsed.port if parsed.port is not None else 443 if parsed.scheme == "https" else 80
        if not 0 < port < 65536:
            raise WebhookRefusedError(f"`webhook` port {port} is out of range: 1 to 65535")
        literal = _address(host)
        if literal is None and _legacy_ipv4(host):
            raise WebhookRefusedError(f"`webhook` host {host!r} is an IPv4 address in a legacy form; write it as "
                                      "four decimal numbers (a.b.c.d)")
        if literal is None and not _NAME.fullmatch(host):
            raise WebhookRefusedError(f"`webhook` host {host[:80]!r} is not a host name: letters, digits, '-', "
                                      "'_' and dots, or an address ([::1] for IPv6)")
        target = Target(parsed, host, port, literal)
        if literal is not None:
            self.check_address(target, literal)
        return target

    def check_address(self, target: Target, address: IPAddress) -> None:
        """WebhookRefusedError when `target` may not be reached at `address` (one its host resolved to)."""
        if target.host in self.hosts or self._allowed_network(address):
            return
        why = refusal(address)
        if why is not None:
            where = (f"host {target.host} is" if target.literal is not None
                     else f"host {target.host} resolves to {address},")
            raise WebhookRefusedError(f"`webhook` {where} {why}: {_ALLOWED}")

    def _allowed_network(self, address: IPAddress) -> bool:
        embedded = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return any(a in network for network in self.networks for a in (address, embedded) if a is not None
                   and a.version == network.version)

    async def resolve(self, url: str, timeout: float) -> tuple[Target, list[IPAddress]]:
        """The URL checked, and the addresses its host resolves to now, every one of them checked: connect
        to one of these, never to the name again. WebhookRefusedError for a refused URL or address; OSError
        (socket.gaierror) or TimeoutError when the name cannot be resolved."""
        target = self.check_url(url)
        if target.literal is not None:
            return target, [target.literal]
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP), timeout)
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"{target.host} resolves to no address")
        for address in addresses:  # one refused address refuses the URL: which one a connection picks is chance
            self.check_address(target, address)
        return target, addresses

    async def check_at_submit(self, url: str, timeout: float) -> None:
        """POST /v1/jobs's check: WebhookRefusedError (a 400 naming `webhook`) for anything refused, a
        host that does not resolve included; a host allowed by name is not looked up."""
        target = self.check_url(url)
        if target.literal is not None or target.host in self.hosts:
            return
        try:
            await self.resolve(url, timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise WebhookRefusedError(f"`webhook` host {target.host} cannot be resolved ({_lookup_error(exc)}); "
                                      "send a URL whose host name resolves to a public address") from None


def _address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _legacy_ipv4(host: str) -> bool:
    """127.1, 0x7f.1, 2130706433, 017700000001: forms the system resolver reads as IPv4 addresses."""
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def _lookup_error(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "the lookup timed out"
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def loggable(url: str) -> str:
    """scheme://host[:port] of a webhook URL: its path and query may hold the receiver's tokens (Slack's
    hooks are a secret path), so logs never show them."""
    try:
        parsed = httpx.URL(url)
        return f"{parsed.scheme}://{parsed.netloc.decode('ascii')}"
    except (httpx.InvalidURL, TypeError, UnicodeError):
        return "<unparsable URL>"
