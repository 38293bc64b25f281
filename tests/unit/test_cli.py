"""The ``composespawner`` root application: its subcommands, its help, its usage errors.

What each subcommand does is tested where it lives (the demo's plan and with-hub in
test_supervise, upgrade-db in test_settings, the simulator in tests/fabric_sim, the
reconciler in tests/fabric_client); here, that the root reaches each one and says
what a wrong command line did wrong, with the exit statuses scripts rely on.
"""

from __future__ import annotations

import pytest
from traitlets.config import Application
from traitlets.utils.importstring import import_item

from composespawner.commands import cli
from composespawner.commands.cli import ComposeSpawnerCommand

COMMANDS = [
    "fabric-simulator",
    "reconcile",
    "reclaimer",
    "upgrade-db",
    "build-stacks",
    "portal",
    "demo",
    "notebook-account",
    "with-hub",
]


def test_every_command_names_an_application() -> None:
    assert list(ComposeSpawnerCommand.subcommands) == COMMANDS
    for name, (where, help_text) in ComposeSpawnerCommand.subcommands.items():
        application = import_item(where) if isinstance(where, str) else where
        assert issubclass(application, Application), name
        assert help_text


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])

    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    for name in COMMANDS:
        assert f"\n{name}\n" in shown
    assert "--help-all" not in shown  # the root has no options of its own to list


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "name a command"),
        (["frobnicate"], "no command 'frobnicate'"),
        (["--version"], "no command '--version'"),
    ],
)
def test_a_missing_or_unknown_command_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)

    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert said in error
    assert "with-hub" in error  # the commands there are


@pytest.mark.parametrize("name", ["demo", "notebook-account", "with-hub"])
def test_the_commands_of_their_own_answer_help(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])

    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: composespawner {name} [-h]")


def test_with_hub_without_a_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["with-hub", "--hub-pid=1"])

    assert exit_info.value.code == 2
    assert "give the service's command after --" in capsys.readouterr().err


def test_a_traitlets_command_gets_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["upgrade-db", "-f", "nowhere.py"])

    assert "composespawner upgrade-db: no config file 'nowhere.py'" in str(exit_info.value.code)


def test_the_exit_status_is_the_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    from composespawner.commands import supervise

    monkeypatch.setattr(supervise, "notebook_account_main", lambda: 1)

    assert cli.main(["notebook-account"]) == 1
