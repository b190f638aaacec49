"""A NIC's physical identity from sysfs (issue 31): node GUID, else permanent MAC, else
the VPD serial; over fake trees, and malformed VPD is no identity, never a crash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.nic_identity import nic_identity, vpd_serial
from agent.sim.profile import load_profile
from agent.sim.sysfs_tree import build_tree, vpd_image
from agent.sysfs import read_host


def _nic(root: Path, *, mac: str | None = None, kind: str = "0", vpd: bytes | None = None,
         guid: str | None = None) -> Path:  # fmt: skip
    """A one-NIC tree: eth0 on PCI function 0000:17:00.0."""
    fn = root / "sys/bus/pci/devices/0000:17:00.0"
    fn.mkdir(parents=True)
    net = root / "sys/class/net/eth0"
    net.mkdir(parents=True)
    os.symlink(fn, net / "device")
    if mac is not None:
        (net / "address").write_text(mac + "\n")
        (net / "addr_assign_type").write_text(kind + "\n")
    if vpd is not None:
        (fn / "vpd").write_bytes(vpd)
    if guid is not None:
        ib = root / "sys/class/infiniband/mlx5_0"
        ib.mkdir(parents=True)
        (ib / "node_guid").write_text(guid + "\n")
        os.symlink(fn, ib / "device")
    return root


def _identity(root: Path) -> str:
    (nic,) = read_host(root).nics
    return nic.physical_id


def test_simulated_hosts_have_one_identity_per_nic_and_differ_by_host(tmp_path: Path) -> None:
    a = read_host(build_tree(tmp_path / "a", load_profile("h100-sxm-8"), "a"))
    again = read_host(build_tree(tmp_path / "a2", load_profile("h100-sxm-8"), "a"))
    b = read_host(build_tree(tmp_path / "b", load_profile("h100-sxm-8"), "b"))

    ids = {n.name: n.physical_id for n in a.nics}
    assert ids["eno1"].startswith("mac:b8:ce:f6:")  # Ethernet: its permanent MAC
    assert all(ids[f"ibp{i}s0"].startswith("guid:a088:c203:") for i in range(8))  # IB: GUID
    assert len(set(ids.values())) == 9 and a.problems == ()
    assert ids == {n.name: n.physical_id for n in again.nics}  # stable: re-read, rebooted
    assert not set(ids.values()) & {n.physical_id for n in b.nics}


def test_the_order_is_guid_then_permanent_mac_then_vpd_serial(tmp_path: Path) -> None:
    vpd = vpd_image("MT2231X01234")
    every = _nic(tmp_path / "1", mac="B8:CE:F6:01:02:03", vpd=vpd, guid="248a:0703:00b8:1a2c")
    assert _identity(every) == "guid:248a:0703:00b8:1a2c"
    assert _identity(_nic(tmp_path / "2", mac="B8:CE:F6:01:02:03", vpd=vpd)) == (
        "mac:b8:ce:f6:01:02:03"
    )
    # A MAC set by hand (3), at random (1) or stolen (2) is the interface's, not the card's.
    for k, kind in enumerate("123"):
        root = _nic(tmp_path / f"set{k}", mac="02:00:00:00:00:01", kind=kind, vpd=vpd)
        assert _identity(root) == "vpd:MT2231X01234"
    assert _identity(_nic(tmp_path / "3", vpd=vpd)) == "vpd:MT2231X01234"


@pytest.mark.parametrize(
    ("mac", "guid"),
    [
        ("00:00:00:00:00:00", None),  # zero
        ("01:00:5e:00:00:01", None),  # multicast
        ("00:00:10:49:fe:80:00:00:00:00:00:00:b8:ce:f6:01:02:03:00:01", None),  # IPoIB
        ("b8:ce:f6:01:02", "0000:0000:0000:0000"),  # short; a zero GUID
        ("not a mac", "248a:0703:00b8"),
    ],
)
def test_addresses_that_name_no_card_give_no_identity(
    tmp_path: Path, mac: str, guid: str | None
) -> None:
    root = _nic(tmp_path, mac=mac, guid=guid)
    host = read_host(root)
    (nic,) = host.nics
    assert nic.physical_id == ""
    # Said, not raised: the NIC is still listed and offered, only not compared.
    (said,) = [p for p in host.problems if p.startswith("nic eth0")]
    assert "no physical identity" in said and "VPD unreadable" in said


def test_an_unreadable_vpd_is_no_identity(tmp_path: Path) -> None:
    """As for the unprivileged service, where only root may read `vpd` (a directory in
    its place fails the read for root too)."""
    root = _nic(tmp_path)
    (root / "sys/bus/pci/devices/0000:17:00.0/vpd").mkdir()
    host = read_host(root)
    assert host.nics[0].physical_id == ""
    assert any("VPD unreadable" in p for p in host.problems)


def test_vpd_serial_of_a_well_formed_image() -> None:
    assert vpd_serial(vpd_image("MT2231X01234")) == ("MT2231X01234", "")
    # Blanks inside a serial are one underscore, trailing ones and NULs go.
    assert vpd_serial(vpd_image("AB 12  34\x00\x00 "))[0] == "AB_12_34"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "no read-only keywords"),
        (b"\xff" * 4096, "runs past the data"),  # no VPD: the device reads 0xff
        (b"\x00" * 4096, "no read-only keywords"),
        (b"\x82\x05\x00NIC", "runs past the data"),  # cut short
        (b"\x82", "header runs past"),
        (b"\x82\x01\x00N\x90\x08\x00PN\x02ABSN\x09", "runs past its resource"),
        (b"\x82\x01\x00N\x90\x06\x00PN\x03ABC\x78", "no serial number"),
        (b"\x82\x01\x00N\xa5\x00\x00\x78", "unknown resource"),
        (vpd_image("N/A"), "placeholder"),
        (vpd_image("000000000000"), "placeholder"),
        (vpd_image("   "), "empty"),
        (vpd_image("S" * 65), "not a serial"),
        (vpd_image("SN\x07BELL"), "not a serial"),
        (vpd_image("SN").replace(b"SN\x02SN", b"SN\x02\xc3\xa9"), "not ASCII"),
    ],
)
def test_malformed_or_placeholder_vpd_is_no_identity(data: bytes, why: str) -> None:
    serial, said = vpd_serial(data)
    assert serial == "" and why in said, said


def test_vpd_after_rv_is_padding_not_a_serial() -> None:
    image = b"\x82\x01\x00N\x90\x0b\x00RV\x01\x00SN\x04ABCD\x78"
    assert vpd_serial(image)[0] == ""


@given(st.binary(max_size=600))
def test_any_bytes_read_as_vpd_give_a_bounded_serial_or_none(data: bytes) -> None:
    serial, why = vpd_serial(data)
    assert bool(serial) != bool(why)
    assert len(serial) <= 64 and all("!" <= c <= "~" for c in serial)


def test_nic_identity_reads_a_missing_tree_as_none(tmp_path: Path) -> None:
    identity, why = nic_identity(str(tmp_path / "net/eth0"), str(tmp_path / "fn"), None)
    assert identity == "" and "VPD unreadable" in why
