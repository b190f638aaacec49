"""The git revision `gpufleet_build_info` reports, read from files only (issue 34): a
host without git still says which build it runs, and "unknown" when nothing says."""

from __future__ import annotations

from pathlib import Path

from procs.build import UNKNOWN, revision

SHA = "3934f6ac3ee336b609c612cdb732112690a3858c"


def test_the_revision_file_written_at_install_names_the_build(tmp_path: Path) -> None:
    (tmp_path / "REVISION").write_text(SHA + "\n")
    assert revision(tmp_path / "REVISION") == SHA


def test_no_record_or_a_garbled_one_is_unknown(tmp_path: Path) -> None:
    # This checkout is an editable install: its direct_url.json has no commit.
    assert revision(tmp_path / "REVISION") == UNKNOWN
    (tmp_path / "REVISION").write_text("not a commit; rm -rf /\n")
    assert revision(tmp_path / "REVISION") == UNKNOWN


def test_bootstrap_writes_the_file_the_coordinator_reads() -> None:
    written = Path(__file__).resolve().parents[3] / "procs" / "REVISION"
    if written.exists():
        assert revision() == written.read_text().strip()
