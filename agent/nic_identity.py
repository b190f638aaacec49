"""A NIC's physical identity: what names the card itself, not the slot it sits in, so
the coordinator can tell the same NIC under two node ids (issue 31). A PCI address or
an interface name repeats on every host of one model; these do not.

In order, the first one readable:

1. `guid:<node GUID>` — the InfiniBand/RoCE device's `node_guid` on the NIC's PCI
   function (`sys/class/infiniband/<dev>/node_guid`), burnt in per function;
2. `mac:<address>` — the netdev's permanent MAC: `address` when `addr_assign_type` is
   0 (NET_ADDR_PERM), six octets, unicast and not zero. A MAC set by hand, by a bond or
   at random is not permanent and is not used; a 20-octet IPoIB address carries a queue
   pair number and is not stable;
3. `vpd:<serial>` — the `SN` keyword of the PCI function's Vital Product Data
   (`sys/bus/pci/devices/<address>/vpd`, its first 4 KiB).

The world-readable ones come first on purpose: the kernel lets only root read `vpd`,
and the agent runs as an unprivileged user, so an identity that depended on who read it
would let a second agent on the same host, started as root, escape the comparison.

None of them: the NIC has no identity, is not compared, and the reason says why (a
malformed VPD, a placeholder serial). Nothing here raises on what a device returns.
"""

from __future__ import annotations

import os
import re

VPD_READ_BYTES = 4096
_SERIAL_MAX = 64  # with its prefix, well inside the wire's 128 (NicInfo.physical_id)
_GUID = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){3}$")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_PRINTABLE = re.compile(r"^[!-~]+$")
_NET_ADDR_PERM = "0"
# Large resource tags (PCI Local Bus 3.0, §6.4): the identifier string, the read-only
# and the read-write keyword lists; small resource tag 0xF is the end tag.
_VPD_ID, _VPD_R, _VPD_W = 0x82, 0x90, 0x91
_VPD_END = 0xF
# What firmware writes where no serial was programmed; many cards of one model share it.
_PLACEHOLDERS = frozenset(
    {"na", "n/a", "none", "null", "unknown", "not_specified", "not_available",
     "to_be_filled_by_o.e.m.", "default_string", "serial", "sn", "0123456789"}
)  # fmt: skip


def nic_identity(netdev: str, function: str, node_guid: str | None) -> tuple[str, str]:
    """(identity, "") for the NIC whose primary netdev is the directory `netdev` and whose
    PCI function is `function`, `node_guid` being its InfiniBand device's if it has one;
    ("", why) when none of the sources names it."""
    why: list[str] = []
    if node_guid is not None:
        guid = node_guid.strip().lower()
        if _GUID.match(guid) and guid.replace(":", "").strip("0"):
            return f"guid:{guid}", ""
        why.append(f"node GUID {node_guid[:40]!r} is not one")
    mac, no_mac = _permanent_mac(netdev)
    if mac:
        return f"mac:{mac}", ""
    why.append(no_mac)
    data = _read_bytes(os.path.join(function, "vpd"), VPD_READ_BYTES)
    if data is None:
        why.append("VPD unreadable")
    else:
        serial, no_serial = vpd_serial(data)
        if serial:
            return f"vpd:{serial}", ""
        why.append(no_serial)
    return "", "; ".join(why)


def _permanent_mac(netdev: str) -> tuple[str, str]:
    kind = _read_text(os.path.join(netdev, "addr_assign_type"))
    if kind != _NET_ADDR_PERM:
        return "", f"MAC not permanent (addr_assign_type {kind or '?'})"
    address = (_read_text(os.path.join(netdev, "address")) or "").lower()
    if not _MAC.match(address):
        return "", f"MAC {address[:64]!r} is not a six-octet address"
    first = int(address[:2], 16)
    if first & 1 or not address.replace(":", "").strip("0"):
        return "", f"MAC {address} is multicast or zero"
    return address, ""


def vpd_serial(data: bytes) -> tuple[str, str]:
    """(serial, "") from the `SN` keyword of the VPD-R resource of `data` (raw VPD), or
    ("", why) when there is none or the VPD is malformed. Never raises: a device that
    does not implement VPD reads as 0xff or zeros, a broken one as anything."""
    i = 0
    while i < len(data):
        tag = data[i]
        if not tag & 0x80:  # small resource: 0b0TTTTLLL
            if tag >> 3 == _VPD_END:
                break
            i += 1 + (tag & 0x07)
            continue
        if i + 3 > len(data):
            return "", "VPD malformed: a resource header runs past the data"
        length = data[i + 1] | data[i + 2] << 8
        body = data[i + 3 : i + 3 + length]
        if len(body) < length:
            return "", f"VPD malformed: resource 0x{tag:02x} runs past the data"
        if tag == _VPD_R:
            return _keyword(body, b"SN")
        if tag not in (_VPD_ID, _VPD_W):
            return "", f"VPD malformed: unknown resource 0x{tag:02x}"
        i += 3 + length
    return "", "VPD has no read-only keywords"


def _keyword(body: bytes, key: bytes) -> tuple[str, str]:
    j = 0
    while j + 3 <= len(body):
        name, length = body[j : j + 2], body[j + 2]
        value = body[j + 3 : j + 3 + length]
        if len(value) < length:
            return "", f"VPD malformed: keyword {name!r} runs past its resource"
        if name == key:
            return _serial(value)
        if name == b"RV":  # the checksum: what follows it is padding
            break
        j += 3 + length
    return "", "VPD has no serial number"


def _serial(raw: bytes) -> tuple[str, str]:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return "", "VPD serial is not ASCII"
    serial = "_".join(text.replace("\x00", " ").split())
    if not serial:
        return "", "VPD serial is empty"
    if len(serial) > _SERIAL_MAX or not _PRINTABLE.match(serial):
        return "", "VPD serial is not a serial (too long or unprintable)"
    if serial.lower() in _PLACEHOLDERS or len(set(serial.lower())) == 1:
        return "", f"VPD serial {serial!r} is a placeholder"
    return serial, ""


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read(256).strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_bytes(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None
