"""The starter kits run headless in their stack and reproduce.

Each kit runs four times, each in its own papermill process and kernel, with
no network: twice with the same seed (the same final weights, bit for bit),
once with another seed (other weights), and once with the same seed but the
training data in another order (a metric within the kit's stated tolerance of
the first). The digits kit is the two-minute introduction: it must finish in
under a minute; every kit in under five.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.images.test_repro import repro
from tests.support.kits import CATALOG, KITS, run_kit


@pytest.mark.parametrize(
    ("kit", "notebook", "tolerance", "seconds"),
    [
        ("digits", "digits.ipynb", 0.03, 60),
        ("eeg-seizures", "eeg_seizures.ipynb", 0.2, 300),
        ("pathology", "pathology.ipynb", 0.08, 300),
    ],
)
@pytest.mark.timeout(1500)
def test_a_kit_reproduces_bit_for_bit_and_only_then(
    kit: str, notebook: str, tolerance: float, seconds: float, tmp_path: Path
) -> None:
    stack = CATALOG.stack("pytorch")

    def run(name: str, **parameters: int) -> object:
        return run_kit(kit, notebook, tmp_path / name, stack, timeout=seconds, **parameters)

    first, again = run("first", seed=0), run("again", seed=0)
    assert first.weights == again.weights
    assert first.record["weights"] == first.weights  # the record has the hash the cell printed
    assert first.record["data_order"] == again.record["data_order"]
    assert max(first.seconds, again.seconds) < seconds

    other_seed = run("other-seed", seed=1)
    assert other_seed.weights != first.weights

    reordered = run("reordered", seed=0, order_seed=1)
    assert reordered.weights != first.weights
    assert abs(reordered.metric - first.metric) <= tolerance, (reordered.metric, first.metric)
    differences = repro.compare(
        repro.Record(**first.record), repro.Record(**reordered.record), metric_tolerance=tolerance
    )
    assert differences[0] == "data order: the data was seen in another order"
    print(
        f"{kit}: {first.seconds:.1f} s, {again.seconds:.1f} s; weights-sha256 {first.weights}"
        f" (seed 1: {other_seed.weights});"
        f" metric {first.metric:.4f}, reordered {reordered.metric:.4f}"
    )


@pytest.mark.parametrize("notebook", sorted(KITS.glob("*/*.ipynb")), ids=lambda p: p.parent.name)
def test_a_kit_marks_the_users_cells_and_ends_on_its_weights_hash(notebook: Path) -> None:
    import nbformat

    cells = nbformat.read(notebook, as_version=4).cells
    tags = [tag for cell in cells for tag in cell.metadata.get("tags", [])]
    for tag in ("parameters", "your-preprocessing", "your-model", "score"):
        assert tags.count(tag) == 1, f"{notebook.name}: {tag!r} tags {tags.count(tag)} cells"
    assert all(not cell.get("outputs") for cell in cells if cell.cell_type == "code")
    assert 'print(f"weights-sha256: {repro.weights_hash(model)}")' in cells[-1].source
