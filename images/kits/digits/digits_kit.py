"""The handwritten-digits kit's data, split and score (scikit-learn's ``load_digits``).

The notebook and the portal's scorer both use this module, so a model is scored
on the same terms in both places. The 1,797 8x8 images are split once, by a
fixed permutation that no run's seed changes: three fifths to train on, one
fifth held out for the notebook's own score, and one fifth the notebook never
gets. The portal scores a submission on that last fifth, with a little noise
drawn from a seed only the portal knows (``blind``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.datasets import load_digits

SPLIT_SEED = 20_260_101  # fixed: the split is the kit's, not the run's
CLASSES = 10


@dataclass(frozen=True)
class Split:
    """Images (N, 8, 8), values 0-16, and their labels (N,)."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def _parts() -> tuple[Split, Split, Split]:
    digits = load_digits()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(digits.target))
    images = digits.images.astype(np.float32)[order]
    labels = digits.target.astype(np.int64)[order]
    fifth = len(labels) // 5
    cuts = [(0, 3 * fifth), (3 * fifth, 4 * fifth), (4 * fifth, len(labels))]
    train, held_out, blind = (Split(images[a:b], labels[a:b]) for a, b in cuts)
    return train, held_out, blind


def load() -> tuple[Split, Split]:
    """What the notebook gets: the training images and the held-out ones."""
    train, held_out, _ = _parts()
    return train, held_out


def blind(secret: int) -> Split:
    """The portal's scoring set: the fifth no notebook gets, each pixel given a little
    noise drawn from ``secret`` (so the scored images are in no public copy)."""
    _, _, part = _parts()
    noise = np.random.default_rng(secret).normal(0, 1.0, size=part.images.shape)
    noisy = np.clip(np.round(part.images + noise), 0, 16).astype(np.float32)
    return Split(noisy, part.labels)


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """The share of images whose digit was predicted right."""
    predicted = np.asarray(predicted)
    if predicted.shape != labels.shape:
        raise ValueError(f"expected {labels.shape[0]} predictions, got shape {predicted.shape}")
    return float((predicted == labels).mean())


def score(predict: Callable[[np.ndarray], np.ndarray], secret: int) -> float:
    """The portal's score of a submission: its accuracy on the blind fifth.
    ``predict`` maps images (N, 8, 8), values 0-16, to one score a digit (N, 10)."""
    part = blind(secret)
    return accuracy(np.asarray(predict(part.images)).argmax(axis=1), part.labels)
