"""GPU activity from each bare compute host's own agent, over the hub's SSH links.

The agent (``composespawner-host``, the hub key's forced command) reads NVML on its
host and names the Jupyter kernel behind each process holding a GPU: it runs as root in
the host's own PID namespace, where the notebooks are. So on bare hosts a reclaim shuts
down only the kernels holding the GPU it takes, as on a one-host site, which a DCGM
exporter (it names no processes) cannot give.

The hosts, key and known_hosts are the SSH launcher's (``c.SSHLauncher.*``): the
reclaimer reaches the same agents the hub starts notebooks through. A host the table
does not list, one that cannot be reached, an agent that fails to read NVML or that
answers anything but the protocol: :class:`ActivityUnreadable`, never an idle reading.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from traitlets.config import Config

from composespawner.activity import ActivityUnreadable
from composespawner.domain.activity import ActivityReading
from composespawner.launchers.agent_protocol import ReadActivity, parse_activity
from composespawner.launchers.ssh import UNREACHABLE
from composespawner.launchers.ssh_links import AgentFailed, AgentRefused, HostLinks, describe
from composespawner.launchers.ssh_settings import SSHSettings

log = logging.getLogger(__name__)

# Where the launcher's settings are in a hub's config, the later winning (as the hub
# reads them: the spawner class's own section over its launcher's).
SSH_SECTIONS = ("SSHLauncher", "ComposeSSHSpawner")


def ssh_settings(config: Config, log: logging.Logger | None = None) -> SSHSettings:
    """The SSH launcher's settings in a hub's ``config``, for a process that is not one."""
    values: dict[str, Any] = {}
    for section in SSH_SECTIONS:
        if section in config:
            values.update(config[section])
    names = set(SSHSettings.class_trait_names(config=True))
    known = {name: value for name, value in values.items() if name in names}
    return SSHSettings(config=Config({"SSHSettings": known}), **({"log": log} if log else {}))


class AgentActivity:
    """Reads a host's GPUs through its agent (an :class:`ActivitySource`).

    One SSH connection per host, kept between passes (a channel per read); its links
    watch no exits, that is the hub's business. :meth:`close` closes them.
    """

    def __init__(
        self,
        settings: SSHSettings,
        timeout: float,
        *,
        clock: Callable[[], float] = time.time,
        log: logging.Logger = log,
    ) -> None:
        self.settings = settings
        self.timeout = timeout
        self._clock = clock
        self._log = log
        self._links = HostLinks()

    @property
    def hosts(self) -> Mapping[str, str]:
        return self.settings.hosts

    async def read(self, host_id: str) -> ActivityReading:
        where = self.hosts.get(host_id)
        if where is None:
            raise ActivityUnreadable(
                host_id,
                "its agent",
                "the host is not in c.SSHLauncher.hosts (the hub's host table), so its"
                " agent cannot be reached",
            )
        link = self._links.link(self.settings.link_settings(where), None, self._log)
        try:
            fields = await link.request(ReadActivity(), self.timeout)
            gpus = parse_activity(fields)
        except TimeoutError as e:
            why = f"no answer within {self.timeout:g}s"
            raise ActivityUnreadable(host_id, f"its agent at {where}", why) from e
        except AgentRefused as e:
            why = f"the agent refused ({e}): update composespawner on the host"
            raise ActivityUnreadable(host_id, f"its agent at {where}", why) from e
        except (AgentFailed, ValueError, *UNREACHABLE) as e:
            raise ActivityUnreadable(host_id, f"its agent at {where}", describe(e)) from e
        return ActivityReading(host_id, self._clock(), gpus)

    async def close(self) -> None:
        await self._links.close()
