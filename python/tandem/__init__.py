"""Tandem: train graph neural networks on a machine's CPU and GPU together.

A thin Python layer over the Rust runtime (``runtime`` crate): datasets from
NumPy, PyTorch Geometric, DGL or an OGB directory without copying the arrays,
a trainer configured as ``tandem train`` is (the same TOML keys, checks and
messages), and ``NeighborLoader``, which feeds a PyTorch model of your own from
Tandem's sampler and gather (``batch.to_pyg()``, ``batch.to_dgl_blocks()``). Importing ``tandem`` imports neither torch nor dgl.

>>> import tandem
>>> ds = tandem.Dataset.generate_sbm(vertices=2000, edges=10000, classes=4, dim=16)
>>> trainer = tandem.Trainer(ds, {"train": {"epochs": 2}, "threads": {"compute": 1}})
>>> len(trainer.fit())
2

``docs/python.md`` covers the API, when arrays are shared or copied, threads and
the GIL, and GPUs.
"""

from ._tandem import (
    CUDA_COMPILED,
    ArgumentError,
    BatchRecord,
    CheckpointError,
    ConfigError,
    Dataset,
    DatasetError,
    DeviceArray,
    DeviceBatch,
    DeviceError,
    DeviceHop,
    EpochRecord,
    Hop,
    LoaderBatch,
    LoaderIter,
    NeighborLoader,
    NonFiniteError,
    TandemError,
    Trainer,
    __version__,
)

__all__ = [
    "CUDA_COMPILED",
    "ArgumentError",
    "BatchRecord",
    "CheckpointError",
    "ConfigError",
    "Dataset",
    "DatasetError",
    "DeviceArray",
    "DeviceBatch",
    "DeviceError",
    "DeviceHop",
    "EpochRecord",
    "Hop",
    "LoaderBatch",
    "LoaderIter",
    "NeighborLoader",
    "NonFiniteError",
    "TandemError",
    "Trainer",
    "__version__",
]
