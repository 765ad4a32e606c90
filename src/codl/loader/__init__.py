"""A drop-in for ``torch.utils.data.DataLoader`` whose workers hand batches over through one
shared ring of slots: no pickling, no per-batch shared-memory mapping, no pin-memory thread in
the training process (pytorch/pytorch#77139). See docs/loader.md.

    from codl.loader import DataLoader
    loader = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=12,
                        pin_memory=True, device="cuda")
    for x, y in loader:  # already on the GPU, copied while the previous step computed
        ...

Importing it imports neither ``codl.harness`` nor ``snakemake``.
"""

from codl.errors import DataSetError
from codl.loader._dataloader import DataLoader
from codl.loader._ring import BatchLayoutError, LoaderWorkerError

__all__ = ["BatchLayoutError", "DataLoader", "DataSetError", "LoaderWorkerError"]
