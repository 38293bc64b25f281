"""The catalog the demo ships, and malformed catalogs refused with a clear message."""

from pathlib import Path

import pytest

from composespawner.domain.catalog import Catalog, CatalogError

HUB_CONFIG = Path(__file__).resolve().parents[2] / "hub_config"


def test_demo_catalog_offers_every_inventory_model() -> None:
    catalog = Catalog.from_file(HUB_CONFIG / "catalog.toml")
    inventory = (HUB_CONFIG / "fabric_inventory.toml").read_text()
    for model in catalog.gpu_models:
        for fabric_model in model.fabric_models:
            assert f'model = "{fabric_model}"' in inventory, fabric_model
    assert {n.speed_gbps for n in catalog.networks} >= {25, 100}
    assert catalog.owner_of_chassis("expansion-1") == "vision-lab"
    assert [s.id for s in catalog.stacks] == ["pytorch", "tensorflow"]  # tests/images checks them


BARE = """
max_gpus_per_machine = 2
[[gpu_models]]
id = "t4"
label = "T4"
fabric_models = ["NVIDIA T4"]
[[networks]]
id = "shared"
label = "Host network"
speed_gbps = 0
"""
STACK = """
[[stacks]]
id = "pytorch"
label = "PyTorch"
cpu = { lock = "locks/cpu.lock", lock_sha256 = "%s" }
"""


def test_stack_locks_are_named_relative_to_the_catalog(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text('stack_common = "common"\n' + BARE + STACK % ("ab" * 32))
    (stack,) = Catalog.from_file(path).stacks
    assert stack.cpu is not None
    assert stack.gpu is None
    assert (stack.cpu.lock, stack.common) == (tmp_path / "locks/cpu.lock", tmp_path / "common")
    assert stack.cpu.digest == ""


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (BARE + STACK % ("ab" * 32), "stacks need stack_common"),
        ('stack_common = "c"\n' + BARE + STACK % "not-a-hash", "cpu.lock_sha256 is not a SHA-256"),
        ('stack_common = "c"\n' + BARE + STACK % ("AB" * 32), "is not a SHA-256"),
    ],
)
def test_malformed_stacks_are_refused(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=words):
        Catalog.from_file(path)


def test_missing_section_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text("max_gpus_per_machine = 2\n")
    with pytest.raises(CatalogError, match=r"catalog\.toml"):
        Catalog.from_file(path)


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(BARE + '[[gpu_models]]\nid = "t4"\nlabel = "again"\nfabric_models = ["x"]\n')
    with pytest.raises(CatalogError, match=r"catalog.toml: duplicate gpu_models ids: \['t4'\]"):
        Catalog.from_file(path)


KIT = """
[[kits]]
id = "digits"
label = "Digits"
stack = "%s"
folder = "kits/digits"
notebook = "digits.ipynb"
module = "digits_kit"
"""


def test_kits_are_named_relative_to_the_catalog_and_run_on_a_listed_stack(tmp_path: Path) -> None:
    (tmp_path / "kits" / "digits").mkdir(parents=True)
    (tmp_path / "kits" / "digits" / "digits.ipynb").write_text("{}")
    (tmp_path / "kits" / "digits" / "digits_kit.py").write_text("")
    path = tmp_path / "catalog.toml"
    head = 'stack_common = "common"\n' + BARE + STACK % ("ab" * 32)
    path.write_text(head + KIT % "pytorch")
    (kit,) = Catalog.from_file(path).kits
    assert (kit.folder, kit.stack) == (tmp_path / "kits" / "digits", "pytorch")
    path.write_text(head + KIT % "jax")
    with pytest.raises(CatalogError, match="kit 'digits' runs on stack 'jax', which is not listed"):
        Catalog.from_file(path)
    (tmp_path / "kits" / "digits" / "digits.ipynb").unlink()
    path.write_text(head + KIT % "pytorch")
    with pytest.raises(CatalogError, match=r"kit 'digits': no 'digits\.ipynb'"):
        Catalog.from_file(path)


def test_the_demo_offers_the_t4_in_halves_and_quarters_and_keeps_the_rest_whole() -> None:
    catalog = Catalog.from_file(HUB_CONFIG / "catalog.toml")
    shares = {m.id: m.shares for m in catalog.gpu_models}
    assert shares.pop("t4") == (2, 4)
    assert set(shares.values()) == {()}


SHARES = 'fabric_models = ["NVIDIA T4"]\nshares = %s'


def test_share_sizes_are_read_in_order(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(BARE.replace('fabric_models = ["NVIDIA T4"]', SHARES % "[8, 2, 4]"))
    (model,) = Catalog.from_file(path).gpu_models
    assert model.shares == (2, 4, 8)


@pytest.mark.parametrize(
    ("shares", "words"),
    [
        ("[1, 4]", "gpu model 't4': shares must list whole numbers from 2 to 16"),
        ("[4, 32]", "from 2 to 16"),
        ("[0.25]", "from 2 to 16"),
        ('["4"]', "from 2 to 16"),
        ("[true]", "from 2 to 16"),
        ("4", r"such as \[2, 4\]; got 4"),
        ("[4, 2, 4]", "gpu model 't4': shares lists a size twice"),
    ],
)
def test_bad_share_sizes_are_refused_naming_the_model(
    tmp_path: Path, shares: str, words: str
) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(BARE.replace('fabric_models = ["NVIDIA T4"]', SHARES % shares))
    with pytest.raises(CatalogError, match=words):
        Catalog.from_file(path)
