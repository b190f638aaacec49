"""Names for the PCI ids of common datacenter NICs, so a NIC atom says `ConnectX-7`
rather than `15b3:1021`. Unknown ids are reported as the raw `vendor:device` pair."""

from __future__ import annotations

NIC_MODELS: dict[str, str] = {
    "15b3:1017": "ConnectX-5",
    "15b3:1019": "ConnectX-5 Ex",
    "15b3:101b": "ConnectX-6",
    "15b3:101d": "ConnectX-6 Dx",
    "15b3:101f": "ConnectX-6 Lx",
    "15b3:1021": "ConnectX-7",
    "15b3:1023": "ConnectX-8",
    "15b3:a2dc": "BlueField-3",
    "8086:1592": "E810-C",
    "8086:1593": "E810-C",
    "8086:159b": "E810-XXV",
    "14e4:1750": "BCM57508",
}


def nic_model(vendor: str | None, device: str | None) -> str | None:
    if not vendor or not device:
        return None
    key = f"{_hex(vendor)}:{_hex(device)}"
    return NIC_MODELS.get(key, key)


def pci_id_for(model: str) -> str:
    """The inverse, for building fake sysfs trees from a profile's model name."""
    for key, name in NIC_MODELS.items():
        if name == model:
            return key
    return "ffff:ffff"


def _hex(text: str) -> str:
    return text.strip().lower().removeprefix("0x")
