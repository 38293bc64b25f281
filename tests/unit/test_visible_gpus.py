"""A notebook on a shared host selects its own GPUs by UUID, never by index.

The host sees every machine's GPUs: index 0 may be a neighbour's.
"""

from __future__ import annotations

from composespawner.domain.catalog import Stack
from composespawner.domain.hardware import Device
from composespawner.domain.machine import (
    ComposedMachine,
    gpu_selection,
    machine_env,
    nvidia_visible_devices,
)
from composespawner.spawners.notebook_env import compose_env

UUID_A = "0f9a3c1e-8b7d-5e6f-a1b2-c3d4e5f60718"
UUID_B = "7c6b5a49-3827-5160-9f8e-7d6c5b4a3928"


def gpu(block: str, uuid: str | None) -> Device:
    return Device(block, "gpu", "NVIDIA T4", frozenset({"r1"}), "c1", "attached", uuid=uuid)


def machine(*gpus: Device) -> ComposedMachine:
    return ComposedMachine("m-7", "host-03", "r1", gpus, None, ())


def test_cuda_is_given_the_machines_gpus_by_uuid_in_attach_order() -> None:
    env = machine_env(machine(gpu("g2", UUID_B), gpu("g1", UUID_A)))
    assert env["CUDA_VISIBLE_DEVICES"] == f"GPU-{UUID_B},GPU-{UUID_A}"
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the launcher's (a DRA pod has none)


def test_one_helper_names_them_for_cuda_and_the_container_runtime() -> None:
    both = machine(gpu("g1", UUID_A), gpu("g2", UUID_B))
    assert nvidia_visible_devices(both) == gpu_selection(both) == f"GPU-{UUID_A},GPU-{UUID_B}"


def test_no_gpu_is_none_to_cuda_and_none_to_the_runtime() -> None:
    assert machine_env(machine())["CUDA_VISIBLE_DEVICES"] == ""
    assert nvidia_visible_devices(machine()) == "none"


def test_a_fabric_without_uuids_leaves_only_the_indexes() -> None:
    assert gpu_selection(machine(gpu("g1", UUID_A), gpu("g2", None))) == "0,1"


def shared(size: int) -> ComposedMachine:
    return ComposedMachine("m-8", "host-03", "r1", (gpu("g1", UUID_A),), None, (), gpu_share=size)


def test_every_holder_of_a_shared_gpu_is_given_the_same_gpu_and_its_share() -> None:
    one, other = machine_env(shared(4)), machine_env(shared(4))
    assert one["CUDA_VISIBLE_DEVICES"] == other["CUDA_VISIBLE_DEVICES"] == f"GPU-{UUID_A}"
    assert one["COMPOSE_GPU_SHARE"] == "1/4"
    assert one["COMPOSE_GPU_MEMORY_FRACTION"] == one["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    assert one["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert one["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_a_shares_fraction_is_rounded_down_so_the_holders_never_sum_past_the_gpu() -> None:
    assert machine_env(shared(2))["COMPOSE_GPU_MEMORY_FRACTION"] == "0.5"
    fraction = machine_env(shared(6))["COMPOSE_GPU_MEMORY_FRACTION"]
    assert fraction == "0.1666"
    assert 6 * float(fraction) <= 1


def test_whole_gpus_are_told_nothing_of_shares() -> None:
    whole = machine_env(shared(1))
    told = {"COMPOSE_GPU_SHARE", "COMPOSE_GPU_MEMORY_FRACTION", "PYTORCH_CUDA_ALLOC_CONF"}
    assert not told & set(whole)


def test_a_stacks_own_framework_settings_win_over_the_shares() -> None:
    stack = Stack("jax", "JAX", env=(("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.2"),))
    env = compose_env(shared(4), stack, "")
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2"
    assert env["COMPOSE_GPU_MEMORY_FRACTION"] == "0.25"
