"""A settings group nested in a model (`procs.settings.SettingsGroup`): declared once,
flat outside the model. The flags, env vars and docs keep the flat names deployments
use (`--link-url`, `GPUFLEET_LINK_URL`); a file gives the group as a table (`[link]`)
or by the flat names; a bad value is refused naming the setting as the user wrote it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import pytest
from msgspec import Meta

from procs.settings import (
    ConfigError,
    Option,
    SettingsGroup,
    SettingsModel,
    flag_specs,
    load,
    markdown_table,
    outer_fields,
)


def _no_spaces(value: str) -> None:
    if " " in value:
        raise ValueError("has a space")


class Link(SettingsGroup, frozen=True):
    url: Annotated[str, Meta(description="where"), Option(check=_no_spaces)] = "x://default"
    retries: Annotated[int, Meta(ge=0, description="how often")] = 3
    verbose: Annotated[bool, Meta(description="say more")] = False
    creds: Annotated[str | None, Meta(description="who"), Option(deprecated=("link_password",))] = (
        None
    )
    topic: Annotated[str, Meta(description="prefix"), Option(outer="topic")] = "t"

    def check(self) -> None:
        if self.verbose and self.retries == 0:
            raise ConfigError("link_verbose", "needs retries")


class Daemon(SettingsModel, frozen=True):
    prog = "daemon"
    toml_table = "daemon"

    name: Annotated[str, Meta(description="its name")] = "d"
    link: Link = msgspec.field(default_factory=Link)


def test_a_group_is_flat_outside_the_model() -> None:
    outside = {f.name: f.where for f in outer_fields(Daemon)}
    assert outside == {
        "name": ("name",),
        "link_url": ("link", "url"),
        "link_retries": ("link", "retries"),
        "link_verbose": ("link", "verbose"),
        "link_creds": ("link", "creds"),
        "topic": ("link", "topic"),
    }
    names = {s.dest: s.names for s in flag_specs(Daemon)}
    assert names["link_url"] == ("--link-url",)
    assert names["link_creds"] == ("--link-creds", "--link-password")
    assert names["topic"] == ("--topic",)
    assert (
        "(env GPUFLEET_LINK_RETRIES)"
        in {s.dest: s.help for s in flag_specs(Daemon)}["link_retries"]
    )


def test_flags_and_env_set_the_group_by_the_flat_names() -> None:
    s = load(Daemon, ["--link-url", "y://f", "--link-verbose", "--topic", "a"], {})
    assert s.link == Link(url="y://f", verbose=True, topic="a")
    env = {"GPUFLEET_LINK_URL": "y://e", "GPUFLEET_LINK_RETRIES": "5", "GPUFLEET_TOPIC": "b"}
    assert load(Daemon, [], env).link == Link(url="y://e", retries=5, topic="b")
    # Flags over env, key by key: the rest of the group keeps its lower source.
    assert load(Daemon, ["--link-url", "y://f"], env).link == Link(
        url="y://f", retries=5, topic="b"
    )
    # The old names still work.
    assert load(Daemon, [], {"GPUFLEET_LINK_PASSWORD": "p"}).link.creds == "p"
    assert load(Daemon, ["--link-password", "q"], {}).link.creds == "q"


def test_a_file_gives_the_group_as_a_table_or_by_the_flat_names(tmp_path: Path) -> None:
    table = tmp_path / "table.toml"
    table.write_text('[daemon]\nname = "n"\n[daemon.link]\nurl = "y://t"\nretries = 1\n')
    flat = tmp_path / "flat.toml"
    flat.write_text('link_url = "y://t"\nlink-retries = 1\nlink_password = "p"\ntopic = "z"\n')
    assert load(Daemon, ["--config", str(table)], {}).link == Link(url="y://t", retries=1)
    assert load(Daemon, ["--config", str(flat)], {}).link == Link(
        url="y://t", retries=1, creds="p", topic="z"
    )
    # The file is below env and flags, key by key.
    s = load(Daemon, ["--config", str(table), "--link-retries", "7"], {"GPUFLEET_LINK_URL": "e"})
    assert s.link == Link(url="e", retries=7) and s.name == "n"


def test_one_setting_given_both_ways_in_a_file_is_refused(tmp_path: Path) -> None:
    both = tmp_path / "both.toml"
    both.write_text('link_url = "a"\n[link]\nurl = "b"\n')
    with pytest.raises(ConfigError, match=r"both\.toml: given twice: as link_url and as link\.url"):
        load(Daemon, ["--config", str(both)], {})
    scalar = tmp_path / "scalar.toml"
    scalar.write_text('link = "a"\nlink_url = "b"\n')
    with pytest.raises(ConfigError) as refused:
        load(Daemon, ["--config", str(scalar)], {})
    assert refused.value.field == "link"


@pytest.mark.parametrize(
    ("argv", "env", "text", "field"),
    [
        (["--link-retries", "-1"], {}, "", "link_retries"),
        ([], {"GPUFLEET_LINK_RETRIES": "many"}, "", "link_retries"),
        (["--link-url", "a b"], {}, "", "link_url"),
        (["--link-verbose", "--link-retries", "0"], {}, "", "link_verbose"),
        ([], {}, "[link]\nretries = -2\n", "link_retries"),
        ([], {}, "[link]\nbogus = 1\n", "link.bogus"),
        ([], {}, "link = 3\n", "link"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(
    tmp_path: Path, argv: list[str], env: dict[str, str], text: str, field: str
) -> None:
    if text:
        config = tmp_path / "d.toml"
        config.write_text(text)
        argv = [*argv, "--config", str(config)]
    with pytest.raises(ConfigError) as refused:
        load(Daemon, argv, env)
    assert refused.value.field == field


def test_the_docs_table_lists_the_group_with_its_flags_and_env() -> None:
    table = markdown_table(Daemon)
    assert "| `link.url` | `--link-url` | `GPUFLEET_LINK_URL` | `x://default` | where |" in table
    assert "| `link.topic` | `--topic` | `GPUFLEET_TOPIC` | `t` | prefix |" in table
    assert "the old name `link_password` is still accepted" in table


def test_a_model_built_in_code_takes_the_group_as_given() -> None:
    s = Daemon(link=Link(url="c"))
    assert s.link.url == "c" and s.link.retries == 3
    with pytest.raises(AttributeError):
        s.link.url = "d"  # type: ignore[misc]
