"""What this machine (or a CUDA device) has free: read by the real server's KV budget
(:mod:`draftsim.realrun.serving`) and by the model loader's size check (:mod:`draftsim.realrun.models`)
before anything is allocated."""

from __future__ import annotations


def available_memory(device: str) -> int:
    """Bytes free for KV caches on ``device`` (CUDA: free device memory; CPU: MemAvailable)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
