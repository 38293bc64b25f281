"""The EEG seizure-detection kit's recordings, windows and event score.

The recordings are synthetic, so the kit needs no download and no patient data:
eight scalp channels at 128 Hz of background activity (1/f noise with an
occipital alpha rhythm), eye blinks on the frontal channels, short rhythmic
artifacts on a channel or two, and seizure-like events: 3 Hz spike-and-wave
bursts of 6 to 40 s that start on a few channels and spread. Each is written to
EDF with its events as annotations, and the notebook reads them back through
pyedflib, as it would a clinical recording.

A detector is scored on events, not samples, as seizure-detection studies do: a
seizure counts as found when a detection overlaps it, and a detection that
overlaps none is a false alarm. The score is the F1 of the two.

The notebook and the portal's scorer both use this module. The portal scores a
submission on recordings generated from a seed only it knows (``blind``).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyedflib
from pyedflib import highlevel

CHANNELS = ("Fp1", "Fp2", "C3", "C4", "T3", "T4", "O1", "O2")
RATE = 128  # samples a second
WINDOW = 2 * RATE  # what a detector sees: 2 s
STEP = RATE  # windows start every second
MINUTES = 10  # each recording's length
TRAIN_SEEDS = tuple(range(100, 108))  # fixed: the recordings are the kit's, not the run's
HELD_OUT_SEEDS = (200, 201, 202)
SEIZURE = "seizure"
# EDF stores 16-bit samples between these: the signals never come near them.
PHYSICAL_RANGE = 2000.0  # µV


@dataclass(frozen=True)
class Recording:
    """Signals (channels, samples) in µV and the seizures in it, (start, end) in seconds."""

    name: str
    signals: np.ndarray
    seizures: tuple[tuple[float, float], ...]

    @property
    def seconds(self) -> float:
        return self.signals.shape[1] / RATE


def synthesize(seed: int, minutes: int = MINUTES) -> Recording:
    """One recording, the same for the same seed."""
    rng = np.random.default_rng(seed)
    samples = minutes * 60 * RATE
    t = np.arange(samples) / RATE
    signals = np.stack([_background(rng, samples, t, channel) for channel in CHANNELS])
    for blink in rng.uniform(0, t[-1] - 1, size=rng.integers(10, 30)):
        shape = 150 * np.exp(-(((t - blink - 0.2) / 0.08) ** 2))
        signals[:2] += shape  # Fp1, Fp2
    for start in rng.uniform(0, t[-1] - 10, size=rng.integers(4, 10)):
        _add_artifact(rng, signals, t, float(start))
    seizures = []
    for start in _seizure_starts(rng, t[-1]):
        length = float(rng.uniform(6, 40))
        _add_seizure(rng, signals, t, start, length)
        seizures.append((round(start, 3), round(start + length, 3)))
    return Recording(f"synthetic-{seed}", signals, tuple(seizures))


def _background(rng: np.random.Generator, samples: int, t: np.ndarray, channel: str) -> np.ndarray:
    spectrum = np.fft.rfft(rng.standard_normal(samples))
    frequencies = np.fft.rfftfreq(samples, 1 / RATE)
    spectrum[1:] /= np.sqrt(frequencies[1:])  # 1/f
    spectrum[0] = 0
    noise = np.fft.irfft(spectrum, samples)
    signal = 20 * noise / noise.std()
    if channel.startswith("O"):
        alpha = 10 + rng.uniform(-0.5, 0.5)
        signal += 15 * np.sin(2 * np.pi * alpha * t + rng.uniform(0, 2 * np.pi))
    return signal


def _add_artifact(
    rng: np.random.Generator, signals: np.ndarray, t: np.ndarray, start: float
) -> None:
    """What a detector must not call a seizure: a few seconds of rhythmic activity on
    one or two channels (chewing, a loose electrode, drowsy theta), no spikes."""
    length = float(rng.uniform(2, 8))
    inside = (t >= start) & (t < start + length)
    frequency = rng.uniform(4, 7)
    burst = np.sin(2 * np.pi * frequency * (t[inside] - start)) * np.hanning(int(inside.sum()))
    for channel in rng.choice(len(CHANNELS), size=int(rng.integers(1, 3)), replace=False):
        signals[channel, inside] += rng.uniform(40, 90) * burst


def _seizure_starts(rng: np.random.Generator, seconds: float) -> list[float]:
    """Two to four seizures, at least a minute apart."""
    starts: list[float] = []
    for _ in range(rng.integers(2, 5)):
        start = float(rng.uniform(30, seconds - 60))
        if all(abs(start - other) > 60 for other in starts):
            starts.append(start)
    return sorted(starts)


def _add_seizure(
    rng: np.random.Generator, signals: np.ndarray, t: np.ndarray, start: float, length: float
) -> None:
    """3 Hz spike-and-wave, slowing as it goes, starting on a few channels and spreading."""
    inside = (t >= start) & (t < start + length)
    local = t[inside] - start
    frequency = 3.5 - 1.0 * local / length
    phase = 2 * np.pi * np.cumsum(frequency) / RATE
    wave = np.sin(phase) + 1.5 * np.maximum(np.sin(phase + 1.2), 0) ** 8  # the spike
    onset = rng.choice(len(CHANNELS), size=3, replace=False)
    for channel in range(len(CHANNELS)):
        delay = 0.0 if channel in onset else rng.uniform(2, length / 2)
        envelope = np.clip((local - delay) / 2, 0, 1) * np.clip((length - local) / 2, 0, 1)
        signals[channel, inside] += rng.uniform(12, 35) * envelope * wave


# -- EDF, through pyedflib ----------------------------------------------------------


def write_edf(path: Path, recording: Recording) -> None:
    headers = highlevel.make_signal_headers(
        list(CHANNELS),
        sample_frequency=RATE,
        physical_min=-PHYSICAL_RANGE,
        physical_max=PHYSICAL_RANGE,
    )
    header = highlevel.make_header(patientname="synthetic", startdate=datetime.datetime(2026, 1, 1))
    header["annotations"] = [[start, end - start, SEIZURE] for start, end in recording.seizures]
    highlevel.write_edf(
        str(path), recording.signals, headers, header, file_type=pyedflib.FILETYPE_EDFPLUS
    )


def read_edf(path: Path) -> Recording:
    signals, headers, header = highlevel.read_edf(str(path))
    channels = tuple(h["label"] for h in headers)
    if channels != CHANNELS or any(h["sample_frequency"] != RATE for h in headers):
        raise ValueError(f"{path}: expected {CHANNELS} at {RATE} Hz, got {channels}")
    seizures = tuple(
        (float(onset), float(onset) + float(duration))
        for onset, duration, text in header["annotations"]
        if text == SEIZURE
    )
    return Recording(path.stem, np.asarray(signals), seizures)


def prepare(folder: Path | str = "data") -> tuple[list[Recording], list[Recording]]:
    """The training and held-out recordings, written to EDF in ``folder`` on the first
    run and read back from there: (train, held_out)."""
    folder = Path(folder)
    folder.mkdir(exist_ok=True)

    def recordings(seeds: tuple[int, ...]) -> list[Recording]:
        read = []
        for seed in seeds:
            path = folder / f"synthetic-{seed}.edf"
            if not path.exists():
                write_edf(path, synthesize(seed))
            read.append(read_edf(path))
        return read

    return recordings(TRAIN_SEEDS), recordings(HELD_OUT_SEEDS)


def blind(secret: int, count: int = 3) -> list[Recording]:
    """The portal's scoring recordings, from a seed no notebook knows."""
    rng = np.random.default_rng(secret)
    return [synthesize(int(seed)) for seed in rng.integers(10_000, 2**31, size=count)]


# -- windows and the event score -----------------------------------------------------


def windows(recording: Recording) -> tuple[np.ndarray, np.ndarray]:
    """2 s windows every second, (N, channels, 256) float32, and whether each is
    mostly seizure (N,) int64."""
    starts = np.arange(0, recording.signals.shape[1] - WINDOW + 1, STEP)
    cut = np.stack([recording.signals[:, s : s + WINDOW] for s in starts]).astype(np.float32)
    middle = (starts + WINDOW / 2) / RATE
    labels = np.array([_inside(m, recording.seizures) for m in middle], dtype=np.int64)
    return cut, labels


def _inside(second: float, seizures: tuple[tuple[float, float], ...]) -> bool:
    return any(start <= second < end for start, end in seizures)


def detections(window_flags: np.ndarray, min_windows: int = 3) -> list[tuple[float, float]]:
    """Detected events, (start, end) in seconds: runs of at least ``min_windows``
    flagged windows in a row."""
    events, run = [], 0
    flags = [*np.asarray(window_flags).astype(bool).tolist(), False]
    for i, flagged in enumerate(flags):
        if flagged:
            run += 1
            continue
        if run >= min_windows:
            first = i - run
            events.append((first * STEP / RATE, ((i - 1) * STEP + WINDOW) / RATE))
        run = 0
    return events


@dataclass(frozen=True)
class EventScore:
    seizures: int
    found: int
    detections: int
    false_alarms: int

    @property
    def sensitivity(self) -> float:
        return self.found / self.seizures if self.seizures else 1.0

    @property
    def precision(self) -> float:
        return 1 - self.false_alarms / self.detections if self.detections else 1.0

    @property
    def f1(self) -> float:
        total = self.sensitivity + self.precision
        return 2 * self.sensitivity * self.precision / total if total else 0.0


def event_score(
    detected: list[list[tuple[float, float]]], recordings: list[Recording]
) -> EventScore:
    """Seizures found and false alarms over recordings, detections given per recording."""
    if len(detected) != len(recordings):
        raise ValueError(
            f"expected detections for {len(recordings)} recordings, got {len(detected)}"
        )
    seizures = found = count = false_alarms = 0
    for events, recording in zip(detected, recordings, strict=True):
        seizures += len(recording.seizures)
        found += sum(any(_overlap(s, e) for e in events) for s in recording.seizures)
        count += len(events)
        false_alarms += sum(not any(_overlap(s, e) for s in recording.seizures) for e in events)
    return EventScore(seizures, found, count, false_alarms)


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def score(predict: Callable[[np.ndarray], np.ndarray], secret: int) -> float:
    """The portal's score of a submission: its event F1 on the blind recordings.
    ``predict`` maps windows (N, 8, 256) in µV to two scores a window (N, 2)."""
    recordings = blind(secret)
    flags = [np.asarray(predict(windows(r)[0])).argmax(axis=1) for r in recordings]
    return event_score([detections(f) for f in flags], recordings).f1
