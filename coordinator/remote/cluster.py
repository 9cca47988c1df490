"""cluster.txt: one host per line, ``[user@]host[:port] [role…] [key=value…]``, validated before anything runs.

A bare ``localhost`` entry (no user, no port) means "this machine, without SSH".
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from profiler.errors import config_error
from profiler.files.textinput import check_line_lengths, read_text_input

DEFAULT_SSH_PORT = 22
LOCAL_HOST = "localhost"

# Keys a line may carry after the roles. Anything else is a typo we refuse before connecting.
KNOWN_KEYS: Mapping[str, str] = {
    "identity": "private key file for this host (e.g. ~/.ssh/cluster_key)",
    "name": "label of the host in results (default: host, or host_port)",
    "python": "python interpreter on the host (default: /usr/bin/python3, where Debian's bcc lives)",
}

_LABEL_PART = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL_PART}(?:\.{_LABEL_PART})*$")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_ROLE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PYTHON = re.compile(r"^/[A-Za-z0-9_./+-]+( [A-Za-z0-9_./+-]+)?$")


@dataclass(frozen=True)
class HostSpec:
    """One cluster.txt entry. ``label`` keys its results; ``hostname``/``port``/``user`` say how to reach it."""

    label: str
    hostname: str
    port: int = DEFAULT_SSH_PORT
    user: str | None = None  # None: the coordinator's user (or ~/.ssh/config's)
    roles: tuple[str, ...] = ()
    identity: str | None = None
    python: str | None = None  # None: /usr/bin/python3 when the host has it, else `python3` on PATH
    source: str = ""  # "file:line", for messages
    options: Mapping[str, str] = field(default_factory=dict)
    port_given: bool = False

    @property
    def is_local(self) -> bool:
        """Only a bare ``localhost`` runs without SSH; ``root@localhost`` or ``localhost:22`` use SSH."""
        return self.hostname == LOCAL_HOST and self.user is None and not self.port_given and self.identity is None

    @property
    def address(self) -> str:
        if self.is_local:
            return "local"
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        user = f"{self.user}@" if self.user else ""
        return f"{user}{host}:{self.port}"


def local_host() -> HostSpec:
    return HostSpec(label=LOCAL_HOST, hostname=LOCAL_HOST, source="(default)")


def _valid_hostname(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(name)) and not name.replace(".", "").isdigit()


def _split_address(token: str, where: str, line: int) -> tuple[str | None, str, int, bool]:
    """``[user@]host[:port]`` (IPv6 as ``[addr]:port``) → user, host, port, port_given."""
    user: str | None = None
    rest = token
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        if not _USER.match(user):
            raise config_error(where, line, f"bad user name {user!r}", "use letters, digits, '_', '.', '-'")
    port_text: str | None = None
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise config_error(where, line, f"unclosed '[' in {token!r}", "write IPv6 addresses as [addr]:port")
        host, tail = rest[1:end], rest[end + 1 :]
        if tail:
            if not tail.startswith(":"):
                raise config_error(where, line, f"unexpected {tail!r} after ']'", "write [addr]:port")
            port_text = tail[1:]
    elif rest.count(":") == 1:
        host, port_text = rest.split(":")
    elif ":" in rest:
        host = rest  # bare IPv6 address
    else:
        host = rest
    if not host or not _valid_hostname(host):
        raise config_error(where, line, f"bad host name {host!r}", "use a DNS name, an IPv4 address or [IPv6]")
    port = DEFAULT_SSH_PORT
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise config_error(where, line, f"bad port {port_text!r}", "use a number from 1 to 65535")
        port = int(port_text)
    return user, host, port, port_text is not None


def _default_label(host: str, port: int, port_given: bool) -> str:
    # ':' would break Hadoop paths in the pipeline; '_' never appears in a host name, so no clash.
    base = f"ip6-{host.replace(':', '-')}" if ":" in host else host
    return f"{base}_{port}" if port_given else base


def parse_cluster(lines: Iterable[str], where: str) -> list[HostSpec]:
    """Parse cluster.txt text; every problem is a ConfigError naming ``where:line`` and the fix."""
    hosts: list[HostSpec] = []
    seen_labels: dict[str, int] = {}
    seen_targets: dict[tuple[str | None, str, int], int] = {}
    for number, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        tokens = text.split()
        user, host, port, port_given = _split_address(tokens[0], where, number)
        roles: list[str] = []
        options: dict[str, str] = {}
        for token in tokens[1:]:
            if "=" in token:
                key, value = token.split("=", 1)
                if key not in KNOWN_KEYS:
                    known = ", ".join(f"{k}=" for k in KNOWN_KEYS)
                    raise config_error(where, number, f"unknown key {key!r}", f"known keys: {known}")
                if key in options:
                    raise config_error(where, number, f"key {key!r} given twice", "keep one")
                if not value:
                    raise config_error(where, number, f"empty value for {key!r}", f"write {key}=VALUE")
                options[key] = value
            elif not _ROLE.match(token):
                raise config_error(
                    where, number, f"bad role {token!r}", "roles are words of letters, digits, '_', '.', '-'"
                )
            elif token not in roles:
                roles.append(token)
        label = options.get("name") or _default_label(host, port, port_given)
        if not LABEL_PATTERN.match(label) or ".." in label:
            raise config_error(where, number, f"bad host label {label!r}", "name= takes letters, digits, '.', '_', '-'")
        if "python" in options and not _PYTHON.match(options["python"]):
            raise config_error(
                where, number, f"bad python {options['python']!r}", "give an absolute path such as /usr/bin/python3"
            )
        if label in seen_labels:
            raise config_error(
                where,
                number,
                f"duplicate host {label!r} (first on line {seen_labels[label]})",
                "remove the line or give it a distinct name=",
            )
        target = (user, host, port)
        if target in seen_targets:
            raise config_error(
                where, number, f"duplicate host {tokens[0]!r} (first on line {seen_targets[target]})", "remove the line"
            )
        seen_labels[label] = number
        seen_targets[target] = number
        hosts.append(
            HostSpec(
                label=label,
                hostname=host,
                port=port,
                user=user,
                roles=tuple(roles),
                identity=options.get("identity"),
                python=options.get("python"),
                source=f"{where}:{number}",
                options=dict(options),
                port_given=port_given,
            )
        )
    if not hosts:
        raise config_error(where, None, "no hosts", "add one line per host, e.g. `worker1 worker` (or `localhost`)")
    return hosts


MAX_CLUSTER_BYTES = 1024 * 1024
MAX_CLUSTER_LINE = 4096


def default_cluster_file() -> Path:
    """./cluster.txt when present, else the copy installed with the package (it holds ``localhost``)."""
    here = Path("cluster.txt")
    if here.is_file():
        return here
    from profiler.defaults import data_file

    return data_file("cluster.txt")


def load_cluster(path: Path | str) -> list[HostSpec]:
    """Read and validate a cluster file (UTF-8, a BOM dropped, at most MAX_CLUSTER_BYTES)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise config_error(
            str(path), None, "cluster file not found", "create it (one host per line) or pass --cluster"
        )
    text = read_text_input(path, "a cluster file", "pass a text file to --cluster", max_bytes=MAX_CLUSTER_BYTES)
    lines = text.splitlines()
    check_line_lengths(lines, str(path), MAX_CLUSTER_LINE, "one host per line: `[user@]host[:port] [role...]`")
    return parse_cluster(lines, str(path))
