"""A training job whose input pipeline is too slow for its model, to try `gpubox doctor loader` on:

    gpubox doctor loader examples/doctor/slow_loader.py:make
    gpubox doctor loader examples/doctor/slow_loader.py:make --full --python /path/to/venv/bin/python

Each image is stored compressed and decoded, cropped, flipped and resized on every read, as a
folder of JPEGs would be; the factory's DataLoader decodes in the training process itself
(num_workers=0), so the small model waits. The doctor should find the job input-bound and more
workers faster.
"""

from __future__ import annotations

import io
import zlib
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SIDE = 224  # stored images are SIDE x SIDE RGB
OUT = 112  # what the model sees


class CompressedImages(Dataset[tuple[torch.Tensor, int]]):
    """Images kept as zlib-compressed bytes, decoded and augmented on every read."""

    def __init__(self, n: int = 50_000, distinct: int = 32) -> None:
        generator = torch.Generator().manual_seed(0)
        self.n = n
        self.blobs: list[bytes] = []
        for _ in range(distinct):  # a few distinct images keep the start-up short
            smooth = torch.rand(1, 3, SIDE // 8, SIDE // 8, generator=generator)
            image = (F.interpolate(smooth, size=(SIDE, SIDE), mode="bilinear")[0] * 255).to(torch.uint8)
            buffer = io.BytesIO()
            torch.save(image, buffer)
            self.blobs.append(zlib.compress(buffer.getvalue(), 6))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        raw = zlib.decompress(self.blobs[i % len(self.blobs)])
        image = torch.load(io.BytesIO(raw), weights_only=True).float() / 255
        top, left = (i * 7) % 32, (i * 13) % 32  # a crop that moves, as random crops do
        image = image[:, top : top + SIDE - 32, left : left + SIDE - 32]
        if i % 2:
            image = image.flip(-1)
        image = F.interpolate(image[None], size=(OUT, OUT), mode="bilinear", antialias=True)[0]
        return image, i % 10


class Step:
    """One training step of a small model: far quicker than decoding its batch."""

    def __init__(self) -> None:
        self.model = torch.nn.Sequential(
            torch.nn.AvgPool2d(4),
            torch.nn.Conv2d(3, 16, 3),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, 10),
        )
        self.optimizer: torch.optim.Optimizer | None = None

    def __call__(self, batch: Any) -> None:
        images, labels = batch
        if self.optimizer is None:  # the model goes where the batches are: a GPU, or the CPU
            self.model.to(images.device)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        loss = F.cross_entropy(self.model(images), labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def make() -> tuple[DataLoader[tuple[torch.Tensor, int]], Step]:
    loader = DataLoader(CompressedImages(), batch_size=64, shuffle=True, num_workers=0)
    return loader, Step()
