"""shmloader: a multiprocess, shared-memory tokenizing data loader for LLM pretraining.

A drop-in for nanochat's loaders (see README.md). Importing the package does nothing but
define names: torch, pyarrow and tiktoken are imported when a loader is made, and worker
processes, which import `shmloader.procs.worker`, never import torch.
"""
__version__ = "0.1.0"

_LOADER_NAMES = (
    "ShmLoader",
    "tokenizing_distributed_data_loader_with_state",
    "tokenizing_distributed_data_loader",
    "tokenizing_distributed_data_loader_with_state_bos_bestfit",
    "tokenizing_distributed_data_loader_bos_bestfit",
)
_ERROR_NAMES = ("DataError", "DeviceError", "WorkerError", "LoaderTimeout", "LoaderClosed", "ShmLoaderError")

__all__ = list(_LOADER_NAMES + _ERROR_NAMES) + ["Mixture", "Source", "cu_seqlens"]


def __getattr__(name):
    if name == "ShmLoader":
        from .loader import ShmLoader
        return ShmLoader
    if name in _LOADER_NAMES:
        from . import nanochat
        return getattr(nanochat, name)
    if name == "cu_seqlens":
        from .attention import cu_seqlens
        return cu_seqlens
    if name == "Mixture":
        from .data.mixture import Mixture
        return Mixture
    if name == "Source":
        from .data.source import Source
        return Source
    if name in _ERROR_NAMES:
        from . import errors
        return getattr(errors, name)
    raise AttributeError(f"module 'shmloader' has no attribute {name!r}")
