"""Block-wise random masks over a patch grid (BEiT-style masked image modeling).

`MaskingGenerator(input_size=(h, w), num_masking_patches=n)()` returns an int32 `[h, w]` mask with
exactly `n` ones, grown from random rectangles of random area and aspect ratio.
"""

import math
import random
from typing import Optional

import numpy as np


class MaskingGenerator:
    """Masks random rectangles of a patch grid until a given number of patches is masked."""

    def __init__(
        self,
        *,
        input_size: tuple[int, int],
        num_masking_patches: int,
        num_attempts: int = 10,
        min_mask_patches: int = 16,
        min_aspect: float = 0.3,
        max_mask_patches: Optional[int] = None,
        max_aspect: Optional[float] = None,
    ):
        """Initializes the generator.

        Args:
            input_size: (height, width) of the patch grid.
            num_masking_patches: How many patches each mask holds.
            num_attempts: Rectangles tried per growth step.
            min_mask_patches: The smallest area of one rectangle.
            min_aspect: The smallest height/width ratio of one rectangle.
            max_mask_patches: The largest area of one rectangle (None: num_masking_patches).
            max_aspect: The largest height/width ratio (None: 1 / min_aspect).

        Raises:
            ValueError: If an aspect ratio is not positive or min_aspect > max_aspect.
        """
        self.height, self.width = input_size
        self.num_patches = self.height * self.width
        self.num_masking_patches = num_masking_patches
        self.num_attempts = num_attempts
        self.min_mask_patches = min_mask_patches
        self.max_mask_patches = (
            num_masking_patches if max_mask_patches is None else max_mask_patches
        )
        max_aspect = max_aspect or 1 / min_aspect
        if min_aspect <= 0 or max_aspect <= 0:
            raise ValueError(
                f"MaskingGenerator: min_aspect={min_aspect} and max_aspect={max_aspect} must be "
                "positive."
            )
        if min_aspect > max_aspect:
            raise ValueError(
                f"MaskingGenerator: min_aspect={min_aspect} exceeds max_aspect={max_aspect}; "
                "swap them."
            )
        self.log_aspect_ratio = (math.log(min_aspect), math.log(max_aspect))

    def __repr__(self) -> str:
        return (
            f"MaskingGenerator({self.height}x{self.width}, area {self.min_mask_patches}.."
            f"{self.max_mask_patches}, total {self.num_masking_patches})"
        )

    def get_shape(self) -> tuple[int, int]:
        """Returns the mask's (height, width)."""
        return self.height, self.width

    def _grow(self, mask: np.ndarray, budget: int) -> int:
        """Masks one random rectangle adding at most `budget` patches; returns how many it added."""
        for _ in range(self.num_attempts):
            area = random.uniform(self.min_mask_patches, budget)
            aspect = math.exp(random.uniform(*self.log_aspect_ratio))
            h = int(round(math.sqrt(area * aspect)))
            w = int(round(math.sqrt(area / aspect)))
            if h >= self.height or w >= self.width:
                continue
            top = random.randint(0, self.height - h)
            left = random.randint(0, self.width - w)
            window = mask[top : top + h, left : left + w]
            new = int(h * w - window.sum())
            if 0 < new <= budget:
                window[...] = 1
                return new
        return 0

    def __call__(self) -> np.ndarray:
        """Returns an int32 [height, width] mask with exactly num_masking_patches ones."""
        mask = np.zeros(self.get_shape(), dtype=np.int32)
        count = 0
        while count < self.num_masking_patches:
            budget = min(self.num_masking_patches - count, self.max_mask_patches)
            added = self._grow(mask, budget)
            if added == 0:
                break
            count += added
        # Top up (or trim) at random positions to the exact count.
        if count != self.num_masking_patches:
            value = 0 if count < self.num_masking_patches else 1
            rows, cols = (mask == value).nonzero()
            pick = np.random.choice(rows.shape[0], abs(self.num_masking_patches - count), False)
            mask[rows[pick], cols[pick]] = 1 - value
        return mask
