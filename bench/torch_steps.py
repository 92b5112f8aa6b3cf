"""Times training steps of a small transformer whose sequence length changes
every step (the pattern that fragments a caching allocator). Prints one JSON
line: median milliseconds per step, and the peak bytes PyTorch's own
allocator reserved (0 when PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns it off).
Run by bench/gpu_bench.py in three set-ups: PyTorch's allocator; no caching;
no caching under gpupool (whose report gives the reserved peak)."""
import json
import statistics
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=8).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
times = []
for step in range(steps):
    x = torch.randn(8, 256 + (step * 37) % 512, 1024, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = model(x).pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    if step >= 5:  # the first steps load kernels and fill caches
        times.append(time.perf_counter() - start)
assert torch.isfinite(loss).item()
print(json.dumps({"ms_per_step": 1000 * statistics.median(times),
                  "torch_reserved_peak": torch.cuda.max_memory_reserved(),
                  "torch_allocated_peak": torch.cuda.max_memory_allocated()}))
