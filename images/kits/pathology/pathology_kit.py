"""The digital-pathology kit's tiles, labels and score.

The tissue is the immunohistochemistry image scikit-image ships (human colon,
haematoxylin in blue, DAB-stained antigen in brown; 512x512). It is cut into
32x32 tiles, and a tile is *positive* when at least a fifth of its pixels are
strongly DAB-stained, read off by colour deconvolution (``rgb2hed``): the kind
of label IHC scoring starts from. A model sees only the RGB tile.

The image is split into four vertical strips of 128 pixels so that no tile
crosses from one part to another: the first two to train on, the third held out
for the notebook's own score, the fourth never given to the notebook. The
portal scores a submission on the fourth, each tile flipped or turned and its
brightness changed a little, as drawn from a seed only the portal knows
(``blind``).

The notebook and the portal's scorer both use this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from skimage import color, data

TILE = 32
STRIDE = 16  # tiles overlap by half inside a strip
STRIP = 128
STRONG_DAB = 0.1  # DAB optical density (rgb2hed) of a strongly stained pixel
POSITIVE_SHARE = 0.2  # a tile with this share of such pixels is positive


@dataclass(frozen=True)
class Tiles:
    """RGB tiles (N, 32, 32, 3), values 0-1, and whether each is positive (N,)."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def _strip(index: int) -> Tiles:
    image = data.immunohistochemistry()
    dab = color.rgb2hed(image)[..., 2]
    left = index * STRIP
    images, labels = [], []
    for top in range(0, image.shape[0] - TILE + 1, STRIDE):
        for x in range(left, left + STRIP - TILE + 1, STRIDE):
            images.append(image[top : top + TILE, x : x + TILE])
            share = (dab[top : top + TILE, x : x + TILE] > STRONG_DAB).mean()
            labels.append(int(share >= POSITIVE_SHARE))
    return Tiles(np.stack(images).astype(np.float32) / 255, np.array(labels, dtype=np.int64))


def load(augment: bool = True) -> tuple[Tiles, Tiles]:
    """What the notebook gets: (train, held_out). ``augment`` adds each training
    tile flipped both ways and turned half round."""
    first, second, held_out = _strip(0), _strip(1), _strip(2)
    images = np.concatenate([first.images, second.images])
    labels = np.concatenate([first.labels, second.labels])
    if augment:
        turned = [images[:, ::-1], images[:, :, ::-1], images[:, ::-1, ::-1]]
        images = np.concatenate([images, *turned])
        labels = np.tile(labels, 4)
    return Tiles(np.ascontiguousarray(images), labels), held_out


def blind(secret: int) -> Tiles:
    """The portal's scoring tiles: the fourth strip, each turned, flipped and made
    brighter or darker as drawn from ``secret``."""
    part = _strip(3)
    rng = np.random.default_rng(secret)
    images = np.empty_like(part.images)
    for i, tile in enumerate(part.images):
        turned = np.rot90(tile, k=int(rng.integers(4)))
        if rng.integers(2):
            turned = turned[:, ::-1]
        images[i] = np.clip(turned * rng.uniform(0.9, 1.1), 0, 1)
    return Tiles(images, part.labels)


def balanced_accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """The mean of the share of positive tiles found and of negative tiles found."""
    predicted = np.asarray(predicted)
    if predicted.shape != labels.shape:
        raise ValueError(f"expected {labels.shape[0]} predictions, got shape {predicted.shape}")
    recalls = [float((predicted[labels == c] == c).mean()) for c in (0, 1) if (labels == c).any()]
    return sum(recalls) / len(recalls)


def score(predict: Callable[[np.ndarray], np.ndarray], secret: int) -> float:
    """The portal's score of a submission: its balanced accuracy on the blind strip.
    ``predict`` maps tiles (N, 32, 32, 3), values 0-1, to two scores a tile (N, 2)."""
    part = blind(secret)
    return balanced_accuracy(np.asarray(predict(part.images)).argmax(axis=1), part.labels)
