"""Tensor types: the static shape and dtype every IR value carries."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DTYPES = ("float32", "int64", "int32", "int8", "bool")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if not all(isinstance(d, int) and d >= 0 for d in self.shape):
            raise ValueError(f"shape {self.shape!r} must be non-negative integers")

    @classmethod
    def of(cls, array: np.ndarray) -> TensorType:
        return cls(tuple(int(d) for d in array.shape), str(array.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        if len(self.shape) == 1:
            dims += ","
        return f"Tensor[({dims}), {self.dtype}]"
